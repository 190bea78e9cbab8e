//! Wiring: open the store, build the query engine and the Flight service, serve until told to
//! stop.

use std::net::SocketAddr;
use std::sync::Arc;

use futures::TryStreamExt as _;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::server::TcpIncoming;

use crate::auth::Authenticator;
use crate::catalog::Catalog;
use crate::clock::Clock;
use crate::coalesce::Coalescing;
use crate::codec::{KeyPrefix, Keyspace};
use crate::config::{ImportConfig, ImportMode, ServeConfig};
use crate::error::{Error, Result};
use crate::flight::gate::Gate;
use crate::flight::held::HeldSnapshots;
pub use crate::flight::held::PartLimits;
use crate::flight::prepared::PreparedLimits;
pub use crate::flight::tickets::TicketKey;
use crate::flight::wire::{self, DirectGet};
use crate::flight::{MoraineFlightService, MoraineSqlService};
use crate::kv::{Store, StoreLimits};
use crate::query::{FastPaths, QueryEngine, QueryLimits};
use crate::tls::{Tls, TlsIncoming};
use crate::txn::{Transactions, TxnConfig};

/// Largest message accepted: ADBC sends ingest batches over tonic's 4 MiB default.
const MAX_DECODING_MESSAGE: usize = 64 << 20;
/// Largest message sent: clients accept 16 MiB; batches are encoded far below this.
const MAX_ENCODING_MESSAGE: usize = 16 << 20;

/// Opens the embedded store in `dir`, tallying the rows of `keyspace` by table
/// ([`row_tally`]) and marking the mapping ids more than one table holds
/// ([`mapping_twins`]).
///
/// # Errors
/// [`Error::Kv`] when the store cannot be opened.
pub async fn open_embedded(
    dir: &std::path::Path,
    options: crate::kv::redb::RedbOptions,
    keyspace: &Keyspace,
) -> Result<Store> {
    let options = crate::kv::redb::RedbOptions {
        tally: Some(row_tally(keyspace)),
        twins: Some(mapping_twins(keyspace)),
        ..options
    };
    let backend = crate::kv::redb::RedbBackend::open_with(dir, options).await?;
    tracing::info!(path = %backend.path().display(), "opened embedded store");
    Ok(Store::new(Arc::new(backend), StoreLimits::embedded()))
}

/// What the embedded store tallies for `keyspace`: the key and value bytes of each table's
/// rows of each kind, so that a whole-table read divides into endpoints by reading one
/// tally per table instead of walking every row.
#[must_use]
pub fn row_tally(keyspace: &Keyspace) -> crate::kv::redb::Tally {
    crate::kv::redb::Tally {
        range: keyspace.rows_range(),
        unit: keyspace.table_head_len(),
    }
}

/// What the embedded store marks for `keyspace`: the mapping ids that more than one table
/// holds, so that a table-scoped mapping load asks for the marks of its ids' span instead of
/// looking every id up in the id index.
#[must_use]
pub fn mapping_twins(keyspace: &Keyspace) -> crate::kv::redb::Twins {
    crate::kv::redb::Twins {
        range: keyspace.kind_range(crate::codec::key::Kind::MappingById),
        prefix: keyspace.id_head_len(),
    }
}

/// A server running on a tokio task.
pub struct RunningServer {
    addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<()>>,
    health: JoinHandle<()>,
    auth: Arc<Authenticator>,
    tls: Option<Arc<Tls>>,
}

impl std::fmt::Debug for RunningServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RunningServer")
            .field("addr", &self.addr)
            .field("authenticated", &self.auth.requires_credentials())
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl RunningServer {
    /// Rereads the credentials file and the TLS files (what SIGHUP does). Sessions of removed
    /// users and tokens end. On an error, what is in force stays.
    ///
    /// # Errors
    /// [`Error::Config`] naming the file that cannot be read or used.
    pub fn reload(&self) -> Result<()> {
        let ended = self.auth.reload()?;
        if let Some(tls) = &self.tls {
            tls.reload()?;
        }
        tracing::info!(
            sessions_ended = ended,
            "reloaded credentials and certificates"
        );
        Ok(())
    }

    /// Where it listens.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops accepting, lets running calls finish, and waits for the server to end.
    ///
    /// # Errors
    /// [`Error::Internal`] when the server failed while running.
    pub async fn shutdown(mut self) -> Result<()> {
        self.health.abort();
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        (&mut self.task).await.map_err(|err| Error::Internal {
            context: "running the server task",
            reason: err.to_string(),
        })?
    }

    /// Resolves when the server ends on its own, which it does only when it fails.
    async fn failed(&mut self) -> Result<()> {
        (&mut self.task).await.map_err(|err| Error::Internal {
            context: "running the server task",
            reason: err.to_string(),
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

/// How the server lets clients in: who may call (an unauthenticated server lets everyone),
/// and TLS.
#[derive(Clone)]
pub struct Access {
    /// Who may call, and their sessions.
    pub auth: Arc<Authenticator>,
    /// TLS, if the endpoint uses it.
    pub tls: Option<Arc<Tls>>,
    /// The key tickets are signed with; random when `None`.
    pub ticket_key: Option<TicketKey>,
}

impl Access {
    /// Who may call, over what, from the settings of `moraine serve`: the credentials
    /// file, TLS, the ticket key.
    ///
    /// # Errors
    /// [`Error::Config`] when a file cannot be read or used.
    fn of_config(config: &ServeConfig) -> Result<Self> {
        let auth = match &config.auth_file {
            Some(file) => crate::auth::Authenticator::from_file(
                file.clone(),
                crate::auth::SessionLimits {
                    idle_timeout: std::time::Duration::from_secs(config.session_idle_timeout),
                    lifetime: std::time::Duration::from_secs(config.session_lifetime),
                    max_sessions: usize::try_from(config.max_sessions).unwrap_or(usize::MAX),
                },
            )?,
            None => crate::auth::Authenticator::open(),
        };
        let tls = match (&config.tls_cert, &config.tls_key) {
            (Some(cert), Some(key)) => Some(std::sync::Arc::new(crate::tls::Tls::load(
                crate::tls::TlsFiles {
                    cert: cert.clone(),
                    key: key.clone(),
                    client_ca: config.tls_client_ca.clone(),
                },
            )?)),
            _ => None,
        };
        Ok(Self {
            auth: std::sync::Arc::new(auth),
            tls,
            ticket_key: config
                .ticket_key
                .as_deref()
                .map(crate::flight::tickets::TicketKey::from_secret),
        })
    }
}

impl Default for Access {
    fn default() -> Self {
        Self {
            auth: Arc::new(Authenticator::open()),
            tls: None,
            ticket_key: None,
        }
    }
}

/// What the server lets its clients use: transactions, queries and prepared statements; and
/// the clock their timeouts read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Limits {
    /// Transactions: how many, how long idle, how much staged.
    pub txn: TxnConfig,
    /// Queries: memory, time, and what an `INSERT … SELECT` may produce.
    pub query: QueryLimits,
    /// Prepared statements: how many, and how much SQL they keep.
    pub prepared: PreparedLimits,
    /// Whole-table reads: how they divide into endpoints, and how long and how many of
    /// their snapshots are held.
    pub parts: PartLimits,
    /// What transaction timeouts are read on: the system clock, or a manual one in tests.
    pub clock: Clock,
}

impl Limits {
    /// Everything the server lets its clients use, from the settings of `moraine serve`.
    fn of_config(config: &ServeConfig) -> Self {
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        let mut limits = Self::of_transactions(config.txn_config());
        limits.query.memory_bytes = count(config.query_memory_mb << 20);
        limits.query.statement_timeout = std::time::Duration::from_secs(config.statement_timeout);
        limits.prepared.max_total = count(config.max_prepared_statements);
        limits.prepared.max_per_session = count(config.max_session_prepared_statements);
        limits.parts = config.part_limits();
        limits
    }

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
            parts: PartLimits::default(),
            clock: Clock::system(),
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
    start_secured(catalog, addr, limits, Access::default()).await
}

/// Binds `addr` and serves `catalog` within `limits` to the callers `access` lets in, until
/// [`RunningServer::shutdown`].
///
/// # Errors
/// [`Error::Config`] when the address cannot be bound; [`Error::Internal`] without OS
/// randomness for the ticket key.
pub async fn start_secured(
    catalog: Catalog,
    addr: SocketAddr,
    limits: Limits,
    access: Access,
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
    let txns = Arc::new(Transactions::with_clock(
        catalog.clone(),
        txn_config,
        limits.clock.clone(),
    ));
    txns.spawn_reaper();
    {
        // A session that ends because its user or token was removed takes its open
        // transaction with it.
        let txns = Arc::downgrade(&txns);
        access.auth.on_session_end(move |session| {
            if let Some(txns) = txns.upgrade() {
                txns.close_session(session);
            }
        });
    }
    let ticket_key = match access.ticket_key {
        Some(key) => key,
        None => TicketKey::random()?,
    };
    let store_probe = catalog.clone();
    let engine = QueryEngine::with_limits(catalog, FastPaths::ALL, limits.query);
    let held = HeldSnapshots::new(limits.parts, limits.clock.clone());
    held.spawn_reaper();
    let flight = MoraineFlightService::new(MoraineSqlService::new(
        engine,
        txns,
        limits.prepared,
        Arc::clone(&access.auth),
        ticket_key,
        held,
    )?);
    let service = DirectGet::new(
        flight,
        wire::Limits {
            decoding: MAX_DECODING_MESSAGE,
            encoding: MAX_ENCODING_MESSAGE,
        },
    );
    let service = Gate::new(service, Arc::clone(&access.auth));
    let (reporter, health_service) = tonic_health::server::health_reporter();
    let first = check_health(&store_probe, &reporter, None).await;
    let health = tokio::spawn(probe_health(store_probe, reporter, first));
    let (tx, rx) = oneshot::channel::<()>();
    let tls = access.tls.clone();
    let task = tokio::spawn(async move {
        // The health service answers without credentials, as load balancers ask.
        let router = tonic::transport::Server::builder()
            .add_service(health_service)
            .add_service(service);
        let stop = async {
            let _ = rx.await;
        };
        let served = match tls {
            Some(tls) => {
                router
                    .serve_with_incoming_shutdown(
                        TlsIncoming::new(listener, tls).map_ok(Coalescing::new),
                        stop,
                    )
                    .await
            }
            // Without TCP_NODELAY every small reply waits out delayed ACKs (about 40 ms a
            // call).
            None => {
                router
                    .serve_with_incoming_shutdown(
                        TcpIncoming::from(listener)
                            .with_nodelay(Some(true))
                            .map_ok(Coalescing::new),
                        stop,
                    )
                    .await
            }
        };
        served.map_err(|err| Error::Internal {
            context: "serving",
            reason: err.to_string(),
        })
    });
    Ok(RunningServer {
        addr,
        shutdown: Some(tx),
        task,
        health,
        auth: access.auth,
        tls: access.tls,
    })
}

impl Drop for RunningServer {
    fn drop(&mut self) {
        self.health.abort();
    }
}

/// How often the health service's status is checked against the store.
const HEALTH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);
/// How long a health check's read of the store may take before the store counts as
/// unavailable.
const HEALTH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// Keeps the standard gRPC health service (`grpc.health.v1.Health`) saying whether the store
/// answers: SERVING while a snapshot read succeeds within [`HEALTH_TIMEOUT`], `NOT_SERVING`
/// otherwise, for the server as a whole (`""`) and for the Flight service. `last` is the
/// status the check before this task set.
async fn probe_health(
    catalog: Catalog,
    reporter: tonic_health::server::HealthReporter,
    mut last: tonic_health::ServingStatus,
) {
    let mut every =
        tokio::time::interval_at(tokio::time::Instant::now() + HEALTH_EVERY, HEALTH_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        every.tick().await;
        last = check_health(&catalog, &reporter, Some(last)).await;
    }
}

/// Reads the store once and sets both services' status from the answer (logging a change
/// from `last`); returns the status set. The server runs the first check before it answers
/// any call, so that the Flight service's status is known from the first health call on.
async fn check_health(
    catalog: &Catalog,
    reporter: &tonic_health::server::HealthReporter,
    last: Option<tonic_health::ServingStatus>,
) -> tonic_health::ServingStatus {
    use tonic::server::NamedService as _;
    let flight =
        <arrow_flight::flight_service_server::FlightServiceServer<MoraineFlightService>>::NAME;
    let key = catalog
        .keyspace()
        .kind_range(crate::codec::Kind::Mapping)
        .start;
    let read = tokio::time::timeout(HEALTH_TIMEOUT, async {
        catalog.snapshot().await?.kv().get(&key).await?;
        Ok::<_, Error>(())
    })
    .await;
    let (status, why) = match read {
        Ok(Ok(())) => (tonic_health::ServingStatus::Serving, String::new()),
        Ok(Err(err)) => (tonic_health::ServingStatus::NotServing, err.to_string()),
        Err(_) => (
            tonic_health::ServingStatus::NotServing,
            format!("no answer within {HEALTH_TIMEOUT:?}"),
        ),
    };
    if last != Some(status) {
        if status == tonic_health::ServingStatus::Serving {
            tracing::info!("the store answers: serving");
        } else {
            tracing::warn!("the store does not answer, not serving: {why}");
        }
    }
    for service in ["", flight] {
        reporter.set_service_status(service, status).await;
    }
    status
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
    let access = Access::of_config(&config)?;
    if access.auth.requires_credentials() {
        tracing::info!("calls need credentials (--auth-file)");
    } else if config.listen.ip().is_loopback() {
        tracing::warn!(
            "no --auth-file: the server is unauthenticated, and listens on loopback only"
        );
    } else if config.insecure_no_auth {
        tracing::warn!(
            "no --auth-file and --insecure-no-auth: anyone who reaches {} may read and \
             change the catalog",
            config.listen
        );
    } else {
        return Err(Error::Config {
            setting: "listen",
            reason: format!(
                "{} is not a loopback address and no --auth-file is set: anyone reaching it \
                 could read and change the catalog. Set --auth-file (see `moraine user add`), \
                 or pass --insecure-no-auth to serve unauthenticated anyway",
                config.listen
            ),
        });
    }
    let keyspace = Keyspace::new(KeyPrefix::new(&config.key_prefix)?);
    let (store, _gc) = if config.pd.is_empty() {
        (
            open_embedded(&config.data, config.redb_options(), &keyspace).await?,
            None,
        )
    } else {
        open_tikv(&config.pd, &config.key_prefix).await?
    };
    let catalog = Catalog::new(store, keyspace);
    upgrade(&catalog).await?;
    let ducklake = catalog.settle_ducklake(config.ducklake_version).await?;
    tracing::info!("serving DuckLake {ducklake}'s catalog tables");
    let catalog = catalog.with_ducklake(ducklake);
    let _metrics = match config.metrics {
        Some(addr) => {
            let (listener, bound) = crate::metrics::bind(addr).await?;
            tracing::info!("metrics on http://{bound}/metrics");
            Some(AbortOnDrop(tokio::spawn(crate::metrics::serve(listener))))
        }
        None => None,
    };
    let mut server =
        start_secured(catalog, config.listen, Limits::of_config(&config), access).await?;
    tracing::info!(
        tls = server.tls.is_some(),
        "moraine listening on {}",
        server.addr()
    );
    let mut hangup = Hangup::new()?;
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    let signal = loop {
        tokio::select! {
            signal = &mut shutdown => break signal,
            () = hangup.next() => {
                if let Err(err) = server.reload() {
                    tracing::error!("reload failed, keeping what is in force: {err}");
                }
            }
            ended = server.failed() => return ended,
        }
    };
    signal?;
    tracing::info!("shutting down");
    server.shutdown().await
}

/// A task that ends when this is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
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

/// SIGHUP, which rereads credentials and certificates.
struct Hangup {
    #[cfg(unix)]
    signal: tokio::signal::unix::Signal,
}

impl Hangup {
    fn new() -> Result<Self> {
        Ok(Self {
            #[cfg(unix)]
            signal: tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup())
                .map_err(|err| Error::Config {
                    setting: "signals",
                    reason: err.to_string(),
                })?,
        })
    }

    /// Resolves at the next SIGHUP (never, where there is none).
    async fn next(&mut self) {
        #[cfg(unix)]
        if self.signal.recv().await.is_some() {
            return;
        }
        std::future::pending::<()>().await;
    }
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

/// Runs `moraine import`: replays a dump of DuckLake commits into the store, or stages an
/// export through a server ([`crate::import::flight`]).
///
/// # Errors
/// When the arguments mix the two imports; when the file cannot be read or parsed, or a
/// commit is refused (its error names the commit; the commits before it stay committed).
pub async fn import(config: ImportConfig) -> Result<()> {
    match config.mode()? {
        ImportMode::Dump { data, file } => import_dump(&data, &file).await,
        ImportMode::Flight(import) => crate::import::flight::import(import).await.map(drop),
    }
}

/// Replays the dump `file` into the embedded store in `data`.
async fn import_dump(data: &std::path::Path, file: &std::path::Path) -> Result<()> {
    let text = std::fs::read_to_string(file).map_err(|err| Error::Config {
        setting: "file",
        reason: format!("{}: {err}", file.display()),
    })?;
    let dump = crate::import::ducklake_steps(&text)?;
    let keyspace = Keyspace::default();
    let store = open_embedded(data, crate::kv::redb::RedbOptions::default(), &keyspace).await?;
    let catalog = Catalog::new(store, keyspace);
    upgrade(&catalog).await?;
    // A fresh store takes the dump's version; a store of another one refuses it, naming both.
    catalog.settle_ducklake(Some(dump.version)).await?;
    for commit in &dump.commits {
        let report = crate::write::commit_batch(&catalog, &commit.batch)
            .await
            .inspect_err(|err| tracing::error!(commit = %commit.name, "import refused: {err}"))?;
        tracing::info!(commit = %commit.name, summary = ?report.summary, "imported");
    }
    tracing::info!(commits = dump.commits.len(), "import finished");
    Ok(())
}
