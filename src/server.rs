//! Wiring: open the store, and (once the Flight SQL service exists) serve it.

use std::sync::Arc;

use crate::config::ServeConfig;
use crate::error::{Error, Result};
use crate::kv::{Store, StoreLimits};

/// Opens the store of `config`.
///
/// # Errors
/// [`Error::Kv`] when the store cannot be opened.
pub async fn open_store(config: &ServeConfig) -> Result<Store> {
    let backend = crate::kv::redb::RedbBackend::open(&config.data).await?;
    tracing::info!(path = %backend.path().display(), "opened embedded store");
    Ok(Store::new(Arc::new(backend), StoreLimits::default()))
}

/// Runs `moraine serve`.
///
/// The Flight SQL service is not built yet: this opens (or creates) the store, reports that,
/// and returns an error naming what is missing.
///
/// # Errors
/// [`Error::Kv`] when the store cannot be opened; [`Error::NotImplemented`] afterwards.
pub async fn serve(config: ServeConfig) -> Result<()> {
    let store = open_store(&config).await?;
    drop(store);
    Err(Error::NotImplemented {
        what: "the Flight SQL service",
    })
}
