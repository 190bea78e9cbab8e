//! The domain error: what went wrong, in moraine's terms. No transport types.

use crate::codec::CodecError;
use crate::kv::KvError;
use crate::write::ValidationError;

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
    /// A per-transaction or per-request limit was reached; nothing of the request was applied.
    #[error("{what}")]
    LimitExceeded {
        /// Which limit, its value, and how to raise it.
        what: String,
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

/// Longest piece of client input a message repeats.
pub const MAX_EXCERPT: usize = 64;

/// `text` as a message repeats client input: whole when short, else its first
/// [`MAX_EXCERPT`] bytes (cut at a character boundary) and how long it was, so a huge or
/// hostile input never comes back whole.
#[must_use]
pub fn excerpt(text: &str) -> std::borrow::Cow<'_, str> {
    if text.len() <= MAX_EXCERPT {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut cut = MAX_EXCERPT;
    while !text.is_char_boundary(cut) {
        cut -= 1;
    }
    std::borrow::Cow::Owned(format!(
        "{}… ({} bytes)",
        text.get(..cut).unwrap_or_default(),
        text.len()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_input_is_repeated_only_in_part() {
        assert_eq!(excerpt("short"), "short");
        let long = "é".repeat(1 << 19);
        let shown = excerpt(&long);
        assert!(shown.len() < MAX_EXCERPT + 32, "{shown}");
        assert!(shown.ends_with("… (1048576 bytes)"), "{shown}");
        let err = Error::TransactionNotOpen {
            id: "x".repeat(1 << 20),
            state: "is not open".into(),
        };
        assert!(err.to_string().len() < 200, "{err}");
    }
}
