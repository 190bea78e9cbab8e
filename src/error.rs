//! The domain error: what went wrong, in moraine's terms. No transport types.

use crate::codec::CodecError;
use crate::kv::KvError;

/// The result type of moraine's domain operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything a domain operation can fail with.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Stored bytes that do not decode.
    #[error(transparent)]
    Codec(#[from] CodecError),
    /// The store refused or failed an operation.
    #[error(transparent)]
    Kv(#[from] KvError),
    /// A setting that cannot work, found at startup.
    #[error("invalid setting {setting}: {reason}")]
    Config {
        /// The setting's name.
        setting: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A feature this build does not have yet.
    #[error("{what} is not yet implemented")]
    NotImplemented {
        /// What is missing.
        what: &'static str,
    },
}
