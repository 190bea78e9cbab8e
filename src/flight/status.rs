//! The one mapping from domain errors to gRPC status codes, and the one place errors are
//! logged: client-caused at `debug`, server-caused at `error`.

use tonic::{Code, Status};

use crate::error::{Error, QueryErrorKind};
use crate::kv::KvError;

/// Longest message sent to a client, in bytes (cut at a character boundary).
const MAX_MESSAGE: usize = 4096;

/// The gRPC status for `err`.
#[must_use]
pub fn to_status(err: &Error) -> Status {
    crate::metrics::get().refused(err);
    let code = code_of(err);
    let server_fault = matches!(
        code,
        Code::Internal | Code::DataLoss | Code::Unknown | Code::Unavailable
    );
    if server_fault {
        tracing::error!(error = %err, ?code, "request failed");
    } else {
        tracing::debug!(error = %err, ?code, "request refused");
    }
    let message = if code == Code::Internal {
        "internal error; see the server log".to_owned()
    } else {
        crate::text::shortened(&err.to_string(), MAX_MESSAGE).into_owned()
    };
    Status::new(code, message)
}

fn code_of(err: &Error) -> Code {
    match err {
        Error::Codec(_) => Code::DataLoss,
        Error::Kv(kv) => match kv {
            KvError::KeyTooLarge { .. }
            | KvError::ValueTooLarge { .. }
            | KvError::WriteSetTooLarge { .. } => Code::ResourceExhausted,
            KvError::ContradictoryWriteSet { .. } => Code::InvalidArgument,
            KvError::Unavailable { .. } => Code::Unavailable,
            KvError::Backend { .. } => Code::Internal,
        },
        Error::Validation(validation) => {
            if !validation.violations.is_empty()
                && validation
                    .violations
                    .iter()
                    .all(crate::model::Violation::is_already_exists)
            {
                Code::AlreadyExists
            } else {
                Code::InvalidArgument
            }
        }
        Error::CommitConflict { .. } => Code::Aborted,
        // The store may or may not have applied it: retrying later, after a read, is the
        // client's way on.
        Error::CommitUnknown { .. } => Code::Unavailable,
        Error::Query { kind, .. } => match kind {
            // A query that fails while running failed on its own terms (a cast, a division
            // by zero): the client's to fix.
            QueryErrorKind::Invalid | QueryErrorKind::Execution => Code::InvalidArgument,
            QueryErrorKind::ResourcesExhausted => Code::ResourceExhausted,
            QueryErrorKind::Internal => Code::Internal,
        },
        Error::Unsupported { .. } => Code::Unimplemented,
        Error::TransactionNotOpen { .. }
        | Error::NotCommitted { .. }
        | Error::SnapshotGone { .. } => Code::FailedPrecondition,
        Error::LimitExceeded { .. } => Code::ResourceExhausted,
        Error::NotFound { .. } => Code::NotFound,
        Error::AlreadyExists { .. } => Code::AlreadyExists,
        Error::InvalidRequest { .. }
        | Error::Malformed { .. }
        | Error::WrongCall(_)
        | Error::ParameterCount { .. }
        | Error::ParameterRows { .. }
        | Error::BadRows { .. }
        | Error::Config { .. } => Code::InvalidArgument,
        // Errors of the client commands: a server that produced one has a bug.
        Error::Internal { .. }
        | Error::Remote { .. }
        | Error::ExportFile { .. }
        | Error::ImportStopped { .. } => Code::Internal,
        Error::Timeout { .. } => Code::DeadlineExceeded,
        Error::Unauthenticated { .. } => Code::Unauthenticated,
        Error::PermissionDenied { .. } => Code::PermissionDenied,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_are_cut_to_the_bound() {
        let status = to_status(&Error::InvalidRequest {
            reason: "é".repeat(3000),
        });
        assert!(status.message().len() <= MAX_MESSAGE);
        assert!(status.message().ends_with('…'), "{}", status.message());
    }

    #[test]
    fn internal_errors_hide_their_detail() {
        let status = to_status(&Error::Kv(KvError::Backend {
            backend: "redb",
            reason: "secret path /x".into(),
        }));
        assert_eq!(status.code(), Code::Internal);
        assert!(!status.message().contains("secret"));
    }
}
