//! The domain error: what went wrong, in moraine's terms. No transport types.

use crate::codec::CodecError;
use crate::kv::KvError;
use crate::model::ValidationError;

/// The result type of moraine's domain operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a domain operation can fail with.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// Stored bytes that do not decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The store refused or failed an operation.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A staged batch broke constraints; nothing was written.
    #[error(transparent)]
    Validation(#[from] ValidationError),
    /// A commit lost to a concurrent one; nothing was written, and a retry may succeed.
    #[error("write conflict: {detail}; nothing was written, retry the transaction")]
    CommitConflict {
        /// What the conflict was on.
        detail: String,
    },
    /// The store failed while committing: the batch may or may not have been applied.
    #[error("commit outcome unknown: {reason}; re-read before retrying")]
    CommitUnknown {
        /// The store's account.
        reason: String,
    },
    /// A query that could not be planned or run.
    #[error("{message}")]
    Query {
        /// Whose fault, and how bad.
        kind: QueryErrorKind,
        /// The query engine's account.
        message: String,
    },
    /// A request for something this server does not serve.
    #[error("{what}")]
    Unsupported {
        /// What was asked for.
        what: String,
    },
    /// A named thing (table, prepared statement, transaction) that does not exist.
    #[error("{what} not found")]
    NotFound {
        /// What was looked up.
        what: String,
    },
    /// A write that was deliberately not committed (an upload without its commit marker).
    #[error("{reason}")]
    NotCommitted {
        /// Why, and what was discarded.
        reason: String,
    },
    /// Something the request would create already exists.
    #[error("{what}")]
    AlreadyExists {
        /// What exists.
        what: String,
    },
    /// A client request that cannot be carried out as sent.
    #[error("{reason}")]
    InvalidRequest {
        /// What is wrong with it.
        reason: String,
    },
    /// A transaction that is not open (expired, finished, or never known here).
    #[error("transaction {} {state}", excerpt(id))]
    TransactionNotOpen {
        /// The transaction id as the client sent it.
        id: String,
        /// What became of it, as a phrase: "expired after 300 s idle; nothing of it was written".
        state: String,
    },
    /// A limit of the server was reached; nothing of the request was applied.
    #[error(
        "{} reached: at most {max} {} (serve {}); {}; nothing of this request was applied",
        limit.what(),
        limit.unit(),
        limit.flag(),
        limit.remedy()
    )]
    LimitExceeded {
        /// Which limit.
        limit: Limit,
        /// Its value.
        max: u64,
    },
    /// A call without valid credentials.
    #[error("unauthenticated: {reason}")]
    Unauthenticated {
        /// What was missing or wrong, without echoing a secret.
        reason: &'static str,
    },
    /// A caller whose role does not allow the call; nothing was done.
    #[error("permission denied: {principal} has role {role}, and {what} needs role {needs}")]
    PermissionDenied {
        /// Who called.
        principal: String,
        /// Its role's name.
        role: &'static str,
        /// The name of the role the call needs.
        needs: &'static str,
        /// What was refused.
        what: &'static str,
    },
    /// A statement ran past the server's statement timeout; what it would have written was
    /// not staged.
    #[error("{what}")]
    Timeout {
        /// Which limit, and how to raise it.
        what: String,
    },
    /// A fault of the server itself, not of the request: logged with its account, and told
    /// to the client only as an internal error.
    #[error("internal error while {context}: {reason}")]
    Internal {
        /// What the server was doing.
        context: &'static str,
        /// What failed.
        reason: String,
    },
    /// A setting that cannot work, found at startup.
    #[error("invalid setting {setting}: {reason}")]
    Config {
        /// The setting's name.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
}

/// A limit of the server, each set by a flag of `moraine serve`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Transactions open on the server.
    OpenTransactions,
    /// Transactions open in one session.
    SessionTransactions,
    /// Rows one transaction stages.
    TransactionRows,
    /// Bytes one transaction holds staged.
    TransactionBytes,
    /// Prepared statements open on the server.
    PreparedStatements,
    /// Prepared statements open in one session.
    SessionPreparedStatements,
    /// Bytes of SQL the open prepared statements hold.
    PreparedSqlBytes,
    /// Sessions open on the server.
    Sessions,
}

impl Limit {
    /// The flag of `moraine serve` that sets it.
    #[must_use]
    pub fn flag(self) -> &'static str {
        match self {
            Limit::OpenTransactions => "--max-open-transactions",
            Limit::SessionTransactions => "--max-session-transactions",
            Limit::TransactionRows => "--txn-max-rows",
            Limit::TransactionBytes => "--txn-max-bytes",
            Limit::PreparedStatements => "--max-prepared-statements",
            Limit::SessionPreparedStatements => "--max-session-prepared-statements",
            Limit::PreparedSqlBytes => "--max-prepared-sql-bytes",
            Limit::Sessions => "--max-sessions",
        }
    }

    /// What it counts, plural.
    #[must_use]
    pub fn unit(self) -> &'static str {
        match self {
            Limit::OpenTransactions | Limit::SessionTransactions => "transactions",
            Limit::TransactionRows => "rows",
            Limit::TransactionBytes | Limit::PreparedSqlBytes => "bytes",
            Limit::PreparedStatements | Limit::SessionPreparedStatements => "prepared statements",
            Limit::Sessions => "sessions",
        }
    }

    /// What it bounds, as a phrase.
    #[must_use]
    pub fn what(self) -> &'static str {
        match self {
            Limit::OpenTransactions => "the server's limit of open transactions",
            Limit::SessionTransactions => "this session's limit of open transactions",
            Limit::TransactionRows => "the limit of rows one transaction stages",
            Limit::TransactionBytes => "the limit of bytes one transaction holds staged",
            Limit::PreparedStatements => "the server's limit of open prepared statements",
            Limit::SessionPreparedStatements => "this session's limit of open prepared statements",
            Limit::PreparedSqlBytes => "the limit of SQL bytes open prepared statements hold",
            Limit::Sessions => "the server's limit of open sessions",
        }
    }

    /// What the client can do about it.
    #[must_use]
    pub fn remedy(self) -> &'static str {
        match self {
            Limit::OpenTransactions | Limit::SessionTransactions => {
                "commit or roll back a transaction first"
            }
            Limit::TransactionRows | Limit::TransactionBytes => "commit in smaller transactions",
            Limit::PreparedStatements
            | Limit::SessionPreparedStatements
            | Limit::PreparedSqlBytes => "close prepared statements you no longer use",
            Limit::Sessions => "close sessions you no longer use, or wait for idle ones to end",
        }
    }
}

/// How a query failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueryErrorKind {
    /// The SQL does not parse, plan or type-check, or is not allowed (DDL, DML).
    Invalid,
    /// The query ran out of memory or another resource.
    ResourcesExhausted,
    /// The query failed while running.
    Execution,
    /// A bug in the engine.
    Internal,
}

pub use crate::text::{MAX_EXCERPT, excerpt};

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_input_in_messages_is_repeated_only_in_part() {
        let err = Error::TransactionNotOpen {
            id: "x".repeat(1 << 20),
            state: "is not open".into(),
        };
        assert!(err.to_string().len() < 200, "{err}");
    }
}
