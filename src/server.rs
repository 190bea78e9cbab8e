//! Wiring: open the store, build the query engine and the Flight service, serve until told to
//! stop.

use std::net::SocketAddr;
use std::sync::Arc;

use arrow_flight::flight_service_server::FlightServiceServer;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;

use crate::catalog::Catalog;
use crate::codec::{KeyPrefix, Keyspace};
use crate::config::{ImportConfig, ServeConfig};
use crate::error::{Error, Result};
use crate::flight::prepared::PreparedLimits;
use crate::flight::{MoraineFlightService, MoraineSqlService};
use crate::kv::{Store, StoreLimits};
use crate::query::{FastPaths, QueryEngine, QueryLimits};
use crate::txn::{Transactions, TxnConfig};

/// Largest message accepted: ADBC sends ingest batches over tonic's 4 MiB default.
const MAX_DECODING_MESSAGE: usize = 64 << 20;
/// Largest message sent: clients accept 16 MiB; batches are encoded far below this.
const MAX_ENCODING_MESSAGE: usize = 16 << 20;

/// Opens the embedded store in `dir`.
///
/// # Errors
/// [`Error::Kv`] when the store cannot be opened.
pub async fn open_embedded(
    dir: &std::path::Path,
    options: crate::kv::redb::RedbOptions,
) -> Result<Store> {
    let backend = crate::kv::redb::RedbBackend::open_with(dir, options).await?;
    tracing::info!(path = %backend.path().display(), "opened embedded store");
    Ok(Store::new(Arc::new(backend), StoreLimits::embedded()))
}

/// A server running on a tokio task.
#[derive(Debug)]
pub struct RunningServer {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<()>>,
}

impl RunningServer {
    /// Where it listens.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets running calls finish, and waits for the server to end.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] when the server failed while running.
    pub async fn shutdown(mut self) -> Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        (&mut self.task)
            .await
            .map_err(|err| Error::InvalidRequest {
                reason: format!("server task failed: {err}"),
            })?
    }

    /// Resolves when the server ends on its own, which it does only when it fails.
    async fn failed(&mut self) -> Result<()> {
        (&mut self.task)
            .await
            .map_err(|err| Error::InvalidRequest {
                reason: format!("server task failed: {err}"),
            })?
    }
}

/// Binds `addr` and serves `catalog` until [`RunningServer::shutdown`], with the default
/// transaction settings.
///
/// # Errors
/// [`Error::Config`] when the address cannot be bound.
pub async fn start(catalog: Catalog, addr: SocketAddr) -> Result<RunningServer> {
    start_with(catalog, addr, TxnConfig::default()).await
}

/// Binds `addr` and serves `catalog` until [`RunningServer::shutdown`].
///
/// # Errors
/// [`Error::Config`] when the address cannot be bound.
pub async fn start_with(
    catalog: Catalog,
    addr: SocketAddr,
    txn_config: TxnConfig,
) -> Result<RunningServer> {
    start_limited(catalog, addr, Limits::of_transactions(txn_config)).await
}

/// What the server lets its clients use: transactions, queries and prepared statements.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// Transactions: how many, how long idle, how much staged.
    pub txn: TxnConfig,
    /// Queries: memory, time, and what an `INSERT … SELECT` may produce.
    pub query: QueryLimits,
    /// Prepared statements: how many, and how much SQL they keep.
    pub prepared: PreparedLimits,
}

impl Limits {
    /// The defaults, with the transaction settings `txn` (which also bound what one
    /// `INSERT … SELECT` may produce).
    #[must_use]
    pub fn of_transactions(txn: TxnConfig) -> Self {
        Self {
            txn,
            query: QueryLimits {
                write_rows: txn.max_rows,
                write_bytes: txn.max_bytes,
                ..QueryLimits::default()
            },
            prepared: PreparedLimits::default(),
        }
    }
}

/// Binds `addr` and serves `catalog` within `limits` until [`RunningServer::shutdown`].
///
/// # Errors
/// [`Error::Config`] when the address cannot be bound.
pub async fn start_limited(
    catalog: Catalog,
    addr: SocketAddr,
    limits: Limits,
) -> Result<RunningServer> {
    let txn_config = limits.txn;
    let listener = TcpListener::bind(addr).await.map_err(|err| Error::Config {
        setting: "listen",
        reason: format!("cannot bind {addr}: {err}"),
    })?;
    let addr = listener.local_addr().map_err(|err| Error::Config {
        setting: "listen",
        reason: err.to_string(),
    })?;
    let txns = Arc::new(Transactions::new(catalog.clone(), txn_config));
    txns.spawn_reaper();
    let engine = QueryEngine::with_limits(catalog, FastPaths::ALL, limits.query);
    let service = MoraineFlightService::new(MoraineSqlService::new(engine, txns, limits.prepared)?);
    let service = FlightServiceServer::new(service)
        .max_decoding_message_size(MAX_DECODING_MESSAGE)
        .max_encoding_message_size(MAX_ENCODING_MESSAGE);
    let (tx, rx) = oneshot::channel::<()>();
    let task = tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(service)
            // Without TCP_NODELAY every small reply waits out delayed ACKs (about 40 ms a call).
            .serve_with_incoming_shutdown(
                TcpIncoming::from(listener).with_nodelay(Some(true)),
                async {
                    let _ = rx.await;
                },
            )
            .await
            .map_err(|err| Error::InvalidRequest {
                reason: format!("server failed: {err}"),
            })
    });
    Ok(RunningServer {
        addr,
        shutdown: Some(tx),
        task,
    })
}

/// Brings the store up to the current layout before anything reads it.
async fn upgrade(catalog: &Catalog) -> Result<()> {
    let moved = catalog.upgrade().await?;
    if moved > 0 {
        tracing::info!(
            entries = moved,
            "moved the data-file index to its unique layout"
        );
    }
    Ok(())
}

/// Runs `moraine serve` until SIGINT or SIGTERM.
///
/// # Errors
/// When the store cannot be opened or the address bound.
pub async fn serve(config: ServeConfig) -> Result<()> {
    let keyspace = Keyspace::new(KeyPrefix::new(&config.key_prefix)?);
    let (store, _gc) = if config.pd.is_empty() {
        (
            open_embedded(&config.data, config.redb_options()).await?,
            None,
        )
    } else {
        open_tikv(&config.pd, &config.key_prefix).await?
    };
    let catalog = Catalog::new(store, keyspace);
    upgrade(&catalog).await?;
    let mut server = start_limited(catalog, config.listen, config.limits()).await?;
    tracing::info!("moraine listening on {}", server.addr());
    let signal = tokio::select! {
        signal = shutdown_signal() => signal,
        ended = server.failed() => return ended,
    };
    signal?;
    tracing::info!("shutting down");
    server.shutdown().await
}

/// How long `serve` waits for PD before giving up.
#[cfg(feature = "tikv")]
const PD_CONNECT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);
/// How often the GC safe point advances, and how much history it keeps behind now (it never
/// passes a snapshot this process still reads).
#[cfg(feature = "tikv")]
const GC_EVERY: std::time::Duration = std::time::Duration::from_mins(1);
#[cfg(feature = "tikv")]
const GC_KEEP: std::time::Duration = std::time::Duration::from_mins(10);

/// The background work a store needs while it serves (the TiKV GC task).
type Housekeeping = Option<Box<dyn std::any::Any + Send>>;

/// Connects to the TiKV cluster whose PD endpoints are `pd`, and starts its GC task.
#[cfg(feature = "tikv")]
async fn open_tikv(pd: &[String], key_prefix: &str) -> Result<(Store, Housekeeping)> {
    let backend = crate::kv::tikv::TikvBackend::connect(pd.to_vec(), PD_CONNECT_TIMEOUT)
        .await?
        .with_gc_service(&format!("moraine-{key_prefix}"));
    tracing::info!(pd = ?pd, "connected to TiKV");
    let gc = backend.spawn_gc(GC_EVERY, GC_KEEP);
    Ok((
        Store::new(Arc::new(backend), StoreLimits::replicated()),
        Some(Box::new(gc)),
    ))
}

#[cfg(not(feature = "tikv"))]
#[allow(
    clippy::unused_async,
    reason = "the same signature as with the feature"
)]
async fn open_tikv(_pd: &[String], _key_prefix: &str) -> Result<(Store, Housekeeping)> {
    Err(Error::Config {
        setting: "pd",
        reason: "this moraine was built without TiKV support; build it with `--features tikv`"
            .into(),
    })
}

async fn shutdown_signal() -> Result<()> {
    let io = |err: std::io::Error| Error::Config {
        setting: "signals",
        reason: err.to_string(),
    };
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(io)?;
        tokio::select! {
            result = tokio::signal::ctrl_c() => result.map_err(io),
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c().await.map_err(io)
    }
}

/// Runs `moraine import`: replays a dump of DuckLake commits into the store.
///
/// # Errors
/// When the file cannot be read or parsed, or a commit is refused (its error names the
/// commit; the commits before it stay committed).
pub async fn import(config: ImportConfig) -> Result<()> {
    let text = std::fs::read_to_string(&config.file).map_err(|err| Error::Config {
        setting: "file",
        reason: format!("{}: {err}", config.file.display()),
    })?;
    let commits = crate::import::ducklake_steps(&text)?;
    let store = open_embedded(&config.data, crate::kv::redb::RedbOptions::default()).await?;
    let catalog = Catalog::new(store, Keyspace::default());
    upgrade(&catalog).await?;
    for commit in &commits {
        let report = crate::write::commit_batch(&catalog, &commit.batch)
            .await
            .map_err(|err| Error::InvalidRequest {
                reason: format!("commit {}: {err}", commit.name),
            })?;
        tracing::info!(commit = %commit.name, summary = ?report.summary, "imported");
    }
    tracing::info!(commits = commits.len(), "import finished");
    Ok(())
}
