//! Token management by an admin over Flight: create, list and revoke the bearer tokens of the
//! server's credentials file. The file stays the one source: each change is written to it
//! (as `moraine token` does) and then reread, so a revoked token's sessions end at once.

use std::sync::Arc;
use std::time::Duration;

use super::{Authenticator, Credentials, Role, TokenEntry};
use crate::error::{Error, Result};

/// A token as listed: never its secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedToken {
    /// Its name.
    pub name: String,
    /// What it may do.
    pub role: Role,
    /// Seconds since the Unix epoch after which it is refused, if it expires.
    pub expires: Option<u64>,
}

impl Authenticator {
    fn managed_file(&self) -> Result<std::path::PathBuf> {
        self.credentials_file()
            .map(std::path::Path::to_path_buf)
            .ok_or_else(|| Error::Unsupported {
                what: "token management needs a credentials file (serve --auth-file); this \
                       server runs without authentication"
                    .into(),
            })
    }

    /// Creates token `name` with `role`, expiring after `ttl` if given, in the credentials
    /// file, and puts it in force. Returns the token, which is kept only as its hash.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a server without a credentials file; [`Error::AlreadyExists`]
    /// for a taken name; [`Error::InvalidRequest`] for a bad name; [`Error::Internal`] when
    /// the file cannot be written.
    pub async fn create_token(
        self: &Arc<Self>,
        name: String,
        role: Role,
        ttl: Option<Duration>,
    ) -> Result<String> {
        let file = self.managed_file()?;
        self.edit(move || super::create_token(&file, &name, role, ttl))
            .await
    }

    /// Revokes token `name`: it is removed from the credentials file, and its sessions end.
    /// Returns how many sessions ended.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a token that is not listed; otherwise as
    /// [`create_token`](Self::create_token).
    pub async fn revoke_token(self: &Arc<Self>, name: String) -> Result<usize> {
        let file = self.managed_file()?;
        let shown = crate::error::excerpt(&name).into_owned();
        let (removed, ended) = self
            .edit_counting(move || super::remove(&file, &name, true))
            .await?;
        if removed {
            Ok(ended)
        } else {
            Err(Error::NotFound {
                what: crate::error::Named::Token(shown),
            })
        }
    }

    /// The tokens of the credentials file, as in force.
    ///
    /// # Errors
    /// [`Error::Unsupported`] on a server without a credentials file.
    pub fn list_tokens(&self) -> Result<Vec<ListedToken>> {
        self.managed_file()?;
        let credentials: Arc<Credentials> = self.credentials().unwrap_or_default();
        Ok(credentials
            .tokens
            .iter()
            .map(|(name, TokenEntry { role, expires, .. })| ListedToken {
                name: name.clone(),
                role: *role,
                expires: *expires,
            })
            .collect())
    }

    async fn edit<T: Send + 'static>(
        self: &Arc<Self>,
        change: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<T> {
        self.edit_counting(change).await.map(|(value, _)| value)
    }

    /// Runs `change` on the file off the runtime, one edit at a time, then rereads it; what
    /// `change` returned and how many sessions the reread ended.
    async fn edit_counting<T: Send + 'static>(
        self: &Arc<Self>,
        change: impl FnOnce() -> Result<T> + Send + 'static,
    ) -> Result<(T, usize)> {
        let _editing = self.editing.lock().await;
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let value = change().map_err(runtime_fault)?;
            let ended = this.reload().map_err(runtime_fault)?;
            Ok((value, ended))
        })
        .await
        .map_err(|err| Error::Internal {
            context: "editing the credentials file",
            reason: err.to_string(),
        })?
    }
}

/// A file that cannot be read or written while serving is the server's fault, not the
/// caller's; the caller's own mistakes (a bad or taken name) stay as they are.
fn runtime_fault(err: Error) -> Error {
    match err {
        Error::Config { reason, .. } => Error::Internal {
            context: "editing the credentials file",
            reason,
        },
        other => other,
    }
}
