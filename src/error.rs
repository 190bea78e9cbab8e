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
    #[error("write conflict: {on}; nothing was written, retry the transaction")]
    CommitConflict {
        /// What the conflict was on.
        on: ConflictOn,
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
        what: Named,
    },
    /// A write that was deliberately not committed (an upload without its commit marker).
    #[error("{reason}")]
    NotCommitted {
        /// Why, and what was discarded.
        reason: String,
    },
    /// Something the request would create already exists.
    #[error("{what} already exists; {remedy}")]
    AlreadyExists {
        /// What exists.
        what: Named,
        /// What the client can do instead.
        remedy: &'static str,
    },
    /// A client request that cannot be carried out as sent, in a way no variant above names:
    /// a bad user or token name or role, a path or upload of the wrong shape, a dump that
    /// does not parse.
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
    #[error(
        "the statement ran longer than {} s, the server's statement timeout (serve \
         --statement-timeout)",
        after.as_secs()
    )]
    Timeout {
        /// The timeout.
        after: std::time::Duration,
    },
    /// A ticket of a whole-table read whose snapshot is no longer held.
    #[error(
        "the snapshot this read belongs to is no longer held: it expired (snapshots are held \
         {}s after GetFlightInfo; see --snapshot-ttl), every endpoint of it has been read, or \
         the server restarted; call GetFlightInfo again",
        lifetime.as_secs()
    )]
    SnapshotGone {
        /// How long snapshots are held.
        lifetime: std::time::Duration,
    },
    /// A part of a request that does not decode as what it must be.
    #[error("{part} {problem}")]
    Malformed {
        /// Which part.
        part: Part,
        /// What is wrong with it, as the decoder tells it.
        problem: String,
    },
    /// A call that does not fit what it names: a query sent as an update, a write statement
    /// executed as a query.
    #[error("{0}")]
    WrongCall(&'static str),
    /// A statement bound with the wrong number of parameters.
    #[error("statement takes {takes} parameters, {bound} were bound")]
    ParameterCount {
        /// How many the statement takes.
        takes: usize,
        /// How many were bound.
        bound: usize,
    },
    /// A query bound with more than one row of parameters.
    #[error("a query binds one row of parameters, got {rows}")]
    ParameterRows {
        /// Rows bound.
        rows: usize,
    },
    /// Rows that are not in a catalog table's canonical form.
    #[error("rows for {table}: {problem}")]
    BadRows {
        /// The table.
        table: crate::model::CatalogTable,
        /// What does not fit.
        problem: String,
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
    /// A server refused a call of one of moraine's client commands (`moraine export`,
    /// `moraine import --from`), or could not be reached. Never sent by the server.
    #[error("{call}: {code}: {message}{advice}")]
    Remote {
        /// The call, with what it named (`GetFlightInfo [ducklake_data_file]`).
        call: String,
        /// The gRPC status code's canonical name (`FAILED_PRECONDITION`), or `transport`
        /// for a connection that failed below gRPC.
        code: &'static str,
        /// The server's message.
        message: String,
        /// What the operator can do about it, as a sentence starting with `; `, or empty.
        advice: &'static str,
    },
    /// A file of an export (written by `moraine export`, read by `moraine import --from`)
    /// that cannot be written or read, or does not match its manifest.
    #[error("{}: {problem}", path.display())]
    ExportFile {
        /// The file.
        path: std::path::PathBuf,
        /// What is wrong.
        problem: String,
    },
    /// An import through a server stopped at a batch the server refused, or that could not
    /// be read; what was committed before it stays committed.
    #[error(
        "import stopped at {what}: {cause}. {outcome}. {}",
        resume_phrase(*landed, *skip_mappings, *skip_files)
    )]
    ImportStopped {
        /// What the batch held (`batch 3: mappings 9 to 12 (…)`).
        what: String,
        /// Whether anything of the batch was written, as a sentence.
        outcome: &'static str,
        /// The refusal.
        cause: Box<Error>,
        /// Batches this run committed before it.
        landed: usize,
        /// Mappings committed before it, in the export's order (this run's and those it
        /// skipped): what `--skip-mappings` resumes after.
        skip_mappings: u64,
        /// Data files committed before it, likewise: what `--skip-files` resumes after.
        skip_files: u64,
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

/// What [`Error::ImportStopped`] says of what was committed before the batch that stopped it.
fn resume_phrase(landed: usize, skip_mappings: u64, skip_files: u64) -> String {
    if skip_mappings == 0 && skip_files == 0 {
        return "Nothing was committed before it".to_owned();
    }
    let batches = match landed {
        1 => "1 batch of this run".to_owned(),
        n => format!("{n} batches of this run"),
    };
    let resume = if skip_files == 0 {
        format!("--skip-mappings {skip_mappings}")
    } else {
        format!("--skip-mappings {skip_mappings} --skip-files {skip_files}")
    };
    format!(
        "The {skip_mappings} mappings and {skip_files} data files before it stay committed \
         ({batches}): re-run with {resume} to go on after them"
    )
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
    /// Snapshots held for the endpoints of whole-table reads.
    HeldSnapshots,
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
            Limit::HeldSnapshots => "--max-held-snapshots",
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
            Limit::HeldSnapshots => "held snapshots",
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
            Limit::HeldSnapshots => {
                "the server's limit of snapshots held for whole-table reads (each is held until its endpoints are read or it expires)"
            }
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
            Limit::HeldSnapshots => {
                "read the endpoints of earlier whole-table reads to their end, or wait for them to expire"
            }
        }
    }
}

/// A named thing a request refers to. Client-given names are shown in part only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// A table of the catalog, as a query, path or ingest named it.
    Table(String),
    /// A table of the catalog, by what it is.
    CatalogTable(crate::model::CatalogTable),
    /// An upload path of the one-stream `DoPut`.
    UploadPath(String),
    /// A transaction, by the id the client sent.
    Transaction(String),
    /// The snapshot of a whole-table read in another session's transaction, by its id.
    HeldSnapshot(String),
    /// A prepared statement, by its handle, and why it is not there.
    PreparedStatement {
        /// The handle as the client sent it.
        handle: String,
        /// "unknown or closed", "expired".
        why: &'static str,
    },
    /// A token of the credentials file.
    Token(String),
    /// A user of a credentials file.
    User {
        /// The user's name.
        name: String,
        /// The file.
        file: std::path::PathBuf,
    },
    /// A token of a credentials file, named from the command line.
    TokenIn {
        /// The token's name.
        name: String,
        /// The file.
        file: std::path::PathBuf,
    },
}

impl std::fmt::Display for Named {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tables = || {
            crate::model::CatalogTable::ALL
                .map(crate::model::CatalogTable::name)
                .join(", ")
        };
        match self {
            Named::Table(name) => write!(f, "table {:?} (served: {})", excerpt(name), tables()),
            Named::CatalogTable(table) => write!(f, "table {table}"),
            Named::UploadPath(path) => write!(
                f,
                "upload path {:?} (accepted: [\"ducklake_mapping\"] with rows in the shape of \
                 DuckLake's mapping load query, [\"ducklake_data_file\"] with data-file rows, \
                 [\"ducklake_commit\"] with both)",
                excerpt(path)
            ),
            Named::Transaction(id) => write!(f, "transaction {}", excerpt(id)),
            Named::HeldSnapshot(id) => write!(f, "snapshot {} of this session", excerpt(id)),
            Named::PreparedStatement { handle, why } => {
                write!(f, "prepared statement {} ({why})", excerpt(handle))
            }
            Named::Token(name) => write!(f, "token {}", excerpt(name)),
            Named::User { name, file } => write!(f, "user {name} in {}", file.display()),
            Named::TokenIn { name, file } => write!(f, "token {name} in {}", file.display()),
        }
    }
}

/// A part of a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Part {
    /// A Flight ticket.
    Ticket,
    /// A Flight descriptor's command.
    Descriptor,
    /// A Flight action's body.
    ActionBody,
    /// The body of the admin action of this name.
    AdminBody(String),
    /// A batch of bound parameters.
    Parameters,
    /// The Arrow IPC stream of an upload.
    Upload,
}

impl std::fmt::Display for Part {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Part::Ticket => f.write_str("the ticket"),
            Part::Descriptor => f.write_str("the descriptor's command"),
            Part::ActionBody => f.write_str("the action's body"),
            Part::AdminBody(action) => write!(f, "{}: the body", excerpt(action)),
            Part::Parameters => f.write_str("parameter batch"),
            Part::Upload => f.write_str("the upload"),
        }
    }
}

/// What a commit conflicted on, in the catalog's terms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConflictOn {
    /// A mapping, and what happened to it concurrently.
    Mapping {
        /// Its table.
        table_id: i64,
        /// Its id.
        mapping_id: i64,
        /// What happened to it.
        change: Change,
    },
    /// A data file, and what happened to it concurrently.
    DataFile {
        /// Its table, when the key says it.
        table_id: Option<i64>,
        /// Its id.
        data_file_id: i64,
        /// What happened to it.
        change: Change,
    },
    /// The rows of one table were acted on, or changed, concurrently.
    TableRows {
        /// Mapping or data-file rows.
        rows: Rows,
        /// The table.
        table_id: i64,
    },
    /// Data files with ids from this one on changed concurrently.
    DataFileIds {
        /// The first id of the range.
        from: i64,
    },
    /// The set of tables with rows of this kind changed concurrently.
    Tables {
        /// Mapping or data-file rows.
        rows: Rows,
    },
    /// The store's own account, for a conflict on no key the catalog names.
    Store(String),
}

/// What happened to a row concurrently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// It was created.
    Created,
    /// It was deleted.
    Deleted,
    /// It was changed.
    Changed,
    /// It was written (the store does not say how).
    Written,
}

/// The rows of a catalog table kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rows {
    /// Column mappings with their name rows.
    Mappings,
    /// Data files.
    DataFiles,
}

impl std::fmt::Display for ConflictOn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ConflictOn::Mapping {
                table_id,
                mapping_id,
                change,
            } => write!(f, "mapping {mapping_id} of table {table_id} {change}"),
            ConflictOn::DataFile {
                table_id: Some(table_id),
                data_file_id,
                change,
            } => write!(f, "data file {data_file_id} of table {table_id} {change}"),
            ConflictOn::DataFile {
                table_id: None,
                data_file_id,
                change,
            } => write!(f, "data file {data_file_id} {change}"),
            ConflictOn::TableRows { rows, table_id } => {
                write!(f, "the {rows} of table {table_id} changed concurrently")
            }
            ConflictOn::DataFileIds { from } => {
                write!(
                    f,
                    "the data files with ids from {from} on changed concurrently"
                )
            }
            ConflictOn::Tables { rows } => {
                write!(f, "the {rows} of the catalog's tables changed concurrently")
            }
            ConflictOn::Store(detail) => f.write_str(detail),
        }
    }
}

impl std::fmt::Display for Change {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Change::Created => "was created concurrently",
            Change::Deleted => "was deleted concurrently",
            Change::Changed => "was changed concurrently",
            Change::Written => "was written concurrently",
        })
    }
}

impl std::fmt::Display for Rows {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Rows::Mappings => "mappings",
            Rows::DataFiles => "data files",
        })
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
        // Names a client sent are cut where the message is made, whatever the call site.
        for what in [
            Named::Table("t".repeat(1 << 20)),
            Named::Transaction("x".repeat(1 << 20)),
            Named::Token("k".repeat(1 << 20)),
            Named::UploadPath("p/".repeat(1 << 19)),
        ] {
            let err = Error::NotFound { what };
            assert!(err.to_string().len() < 600, "{err}");
        }
        let err = Error::Malformed {
            part: Part::AdminBody("a".repeat(1 << 20)),
            problem: "is not JSON".into(),
        };
        assert!(err.to_string().len() < 200, "{err}");
    }

    #[test]
    fn conflicts_name_the_row_and_what_happened_to_it() {
        let err = Error::CommitConflict {
            on: ConflictOn::Mapping {
                table_id: 4,
                mapping_id: 17,
                change: Change::Deleted,
            },
        };
        assert_eq!(
            err.to_string(),
            "write conflict: mapping 17 of table 4 was deleted concurrently; nothing was \
             written, retry the transaction"
        );
        let on = ConflictOn::TableRows {
            rows: Rows::Mappings,
            table_id: 9,
        };
        assert_eq!(
            on.to_string(),
            "the mappings of table 9 changed concurrently"
        );
    }
}
