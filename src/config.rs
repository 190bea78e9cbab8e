//! Typed settings, parsed from flags and environment variables and validated once at startup.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Parser, Subcommand};

/// The `moraine` command line.
#[derive(Debug, Parser)]
#[command(
    name = "moraine",
    version,
    about = "Arrow Flight SQL server for DuckLake's mapping catalog"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// A `moraine` subcommand.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Serve the catalog over Arrow Flight SQL.
    Serve(Box<ServeConfig>),
    /// Replay a JSON dump of DuckLake commits into the embedded store (while no server holds
    /// it), or, with `--server` and `--from`, stage an export back through a server.
    Import(ImportConfig),
    /// Write the catalog's tables, read from a server, to Parquet or Arrow IPC files with a
    /// manifest of their checksums.
    Export(ExportConfig),
    /// Manage the users of a credentials file (a running server rereads it on SIGHUP).
    #[command(subcommand)]
    User(UserCommand),
    /// Manage the bearer tokens of a credentials file (a running server rereads it on SIGHUP).
    #[command(subcommand)]
    Token(TokenCommand),
}

/// `moraine user …`.
#[derive(Debug, Subcommand)]
pub enum UserCommand {
    /// Add a user, or replace one's role and password. The password comes from
    /// `MORAINE_PASSWORD`, else from the first line of standard input.
    Add {
        /// The user's name.
        name: String,
        /// reader, writer or admin.
        #[arg(long)]
        role: String,
        /// The credentials file.
        #[arg(long, env = "MORAINE_AUTH_FILE")]
        auth_file: PathBuf,
    },
    /// Remove a user; the user's sessions end at the server's next reload.
    Remove {
        /// The user's name.
        name: String,
        /// The credentials file.
        #[arg(long, env = "MORAINE_AUTH_FILE")]
        auth_file: PathBuf,
    },
}

/// `moraine token …`.
#[derive(Debug, Subcommand)]
pub enum TokenCommand {
    /// Create a token and print it, this once (the file keeps only its hash).
    Create {
        /// A name to list and revoke it by.
        name: String,
        /// reader, writer or admin.
        #[arg(long)]
        role: String,
        /// Seconds until it expires; it never does without.
        #[arg(long)]
        ttl: Option<u64>,
        /// The credentials file.
        #[arg(long, env = "MORAINE_AUTH_FILE")]
        auth_file: PathBuf,
    },
    /// List tokens: name, role, expiry.
    List {
        /// The credentials file.
        #[arg(long, env = "MORAINE_AUTH_FILE")]
        auth_file: PathBuf,
    },
    /// Revoke a token; its sessions end at the server's next reload.
    Revoke {
        /// Its name.
        name: String,
        /// The credentials file.
        #[arg(long, env = "MORAINE_AUTH_FILE")]
        auth_file: PathBuf,
    },
}

/// Settings of `moraine serve`.
#[derive(Debug, Clone, clap::Args)]
pub struct ServeConfig {
    /// Address to listen on (port 0 picks a free port; the log says which). Without
    /// --auth-file only a loopback address is accepted, unless --insecure-no-auth.
    #[arg(long, env = "MORAINE_LISTEN", default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Credentials file (users and tokens with roles; see `moraine user`, `moraine token`):
    /// every call then needs credentials. Reread on SIGHUP.
    #[arg(long, env = "MORAINE_AUTH_FILE")]
    pub auth_file: Option<PathBuf>,
    /// Serve without credentials on a non-loopback address.
    #[arg(long, env = "MORAINE_INSECURE_NO_AUTH")]
    pub insecure_no_auth: bool,
    /// PEM certificate chain: serve TLS (clients connect with grpc+tls://). Reread on SIGHUP.
    #[arg(long, env = "MORAINE_TLS_CERT", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, env = "MORAINE_TLS_KEY", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// PEM CA certificates: clients must present a certificate signed by one (mutual TLS).
    #[arg(long, env = "MORAINE_TLS_CLIENT_CA", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Secret that ticket signatures derive from; servers sharing clients behind one address
    /// must share it. Random per process when unset.
    #[arg(long, env = "MORAINE_TICKET_KEY", hide_env_values = true)]
    pub ticket_key: Option<String>,
    /// Most sessions (logins and tokens in use) open at once, with --auth-file.
    #[arg(long, env = "MORAINE_MAX_SESSIONS", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_sessions: u64,
    /// Seconds a session may sit idle before its token stops working.
    #[arg(long, env = "MORAINE_SESSION_IDLE_TIMEOUT", default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=30 * 86_400))]
    pub session_idle_timeout: u64,
    /// Seconds a session lasts at most, however busy.
    #[arg(long, env = "MORAINE_SESSION_LIFETIME", default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..=365 * 86_400))]
    pub session_lifetime: u64,
    /// Directory of the embedded store, created if missing.
    #[arg(long, env = "MORAINE_DATA", default_value = "./moraine-data")]
    pub data: PathBuf,
    /// PD endpoints of a TiKV cluster, comma-separated: selects the TiKV backend instead of
    /// the embedded store (needs a build with the `tikv` feature).
    #[arg(long, env = "MORAINE_PD", value_delimiter = ',')]
    pub pd: Vec<String>,
    /// Key prefix of this deployment, so several lakes can share one cluster
    /// (`[A-Za-z0-9._-]`, at most 64 bytes; empty on the embedded default).
    #[arg(long, env = "MORAINE_KEY_PREFIX", default_value = "")]
    pub key_prefix: String,
    /// DuckLake catalog version whose `ducklake_data_file` columns the deployment serves and
    /// accepts: 0.3 (DuckDB 1.4), 1.0 (DuckDB 1.5) or 1.1. Recorded at the first start (0.3
    /// when unset); later starts serve the recorded one and refuse another.
    #[arg(long, env = "MORAINE_DUCKLAKE_VERSION", value_parser = parse_ducklake_version)]
    pub ducklake_version: Option<crate::model::DuckLakeVersion>,
    /// Seconds a transaction may sit idle before it is rolled back (clients that close
    /// without ending their transaction leave it to this).
    #[arg(long, env = "MORAINE_TXN_IDLE_TIMEOUT", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub txn_idle_timeout: u64,
    /// Most rows one transaction may stage before commit.
    #[arg(long, env = "MORAINE_TXN_MAX_ROWS", default_value_t = 2_000_000)]
    pub txn_max_rows: u64,
    /// Most bytes (estimated) one transaction may stage before commit.
    #[arg(long, env = "MORAINE_TXN_MAX_BYTES", default_value_t = 512 << 20)]
    pub txn_max_bytes: u64,
    /// Most transactions open at once on the server.
    #[arg(long, env = "MORAINE_MAX_OPEN_TRANSACTIONS", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_open_transactions: u64,
    /// Most transactions one session may have open at once.
    #[arg(long, env = "MORAINE_MAX_SESSION_TRANSACTIONS", default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_session_transactions: u64,
    /// Most prepared statements open at once on the server.
    #[arg(long, env = "MORAINE_MAX_PREPARED_STATEMENTS", default_value_t = 4096, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_prepared_statements: u64,
    /// Most prepared statements one session may hold open.
    #[arg(long, env = "MORAINE_MAX_SESSION_PREPARED_STATEMENTS", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub max_session_prepared_statements: u64,
    /// Memory, in MiB, that the operators of all running queries (sorts, joins, aggregates)
    /// may hold together; a query needing more is refused. Nothing spills to disk.
    #[arg(long, env = "MORAINE_QUERY_MEMORY_MB", default_value_t = 1024, value_parser = clap::value_parser!(u64).range(16..=1 << 24))]
    pub query_memory_mb: u64,
    /// Seconds a statement may run, from its start to its last row.
    #[arg(long, env = "MORAINE_STATEMENT_TIMEOUT", default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub statement_timeout: u64,
    /// Serve Prometheus metrics as text over HTTP on this address (port 0 picks a free
    /// port; the log says which).
    #[arg(long, env = "MORAINE_METRICS")]
    pub metrics: Option<SocketAddr>,
    /// Seconds the snapshot of a whole-table read is held for its endpoints, from the
    /// `GetFlightInfo` that took it (it goes sooner once every endpoint has been read).
    #[arg(long, env = "MORAINE_SNAPSHOT_TTL", default_value_t = 300, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub snapshot_ttl: u64,
    /// Most snapshots held at once for whole-table reads.
    #[arg(long, env = "MORAINE_MAX_HELD_SNAPSHOTS", default_value_t = 256, value_parser = clap::value_parser!(u64).range(1..=1 << 16))]
    pub max_held_snapshots: u64,
    /// Bytes of stored rows each endpoint of a whole-table read aims for (on TiKV the
    /// endpoints follow region boundaries instead).
    #[arg(long, env = "MORAINE_ENDPOINT_BYTES", default_value_t = 16 << 20, value_parser = clap::value_parser!(u64).range(64..))]
    pub endpoint_bytes: u64,
    /// Most endpoints of one whole-table read.
    #[arg(long, env = "MORAINE_MAX_ENDPOINTS", default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_endpoints: u64,
    /// Embedded store: MiB of memory redb may use to cache pages and buffer writes.
    #[arg(long, env = "MORAINE_REDB_CACHE_MB", default_value_t = 16, value_parser = clap::value_parser!(u64).range(1..=1 << 20))]
    pub redb_cache_mb: u64,
    /// Embedded store: milliseconds at most between a commit and the checkpoint that makes
    /// the redb file hold it (until then the commit log does; a crash replays it on start).
    #[arg(long, env = "MORAINE_REDB_CHECKPOINT_MS", default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..=86_400_000))]
    pub redb_checkpoint_ms: u64,
}

impl ServeConfig {
    /// The embedded store's settings.
    #[must_use]
    pub fn redb_options(&self) -> crate::kv::redb::RedbOptions {
        crate::kv::redb::RedbOptions {
            cache_bytes: usize::try_from(self.redb_cache_mb << 20).unwrap_or(usize::MAX),
            checkpoint_every: std::time::Duration::from_millis(self.redb_checkpoint_ms),
            ..crate::kv::redb::RedbOptions::default()
        }
    }

    /// How whole-table reads divide and hold their snapshots.
    #[must_use]
    pub fn part_limits(&self) -> crate::flight::held::PartLimits {
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        crate::flight::held::PartLimits {
            lifetime: std::time::Duration::from_secs(self.snapshot_ttl),
            max_held: count(self.max_held_snapshots),
            division: crate::kv::Division {
                span_bytes: self.endpoint_bytes,
                max_spans: count(self.max_endpoints),
            },
        }
    }

    /// The transaction settings.
    #[must_use]
    pub fn txn_config(&self) -> crate::txn::TxnConfig {
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        crate::txn::TxnConfig {
            idle_timeout: std::time::Duration::from_secs(self.txn_idle_timeout),
            max_rows: self.txn_max_rows,
            max_bytes: self.txn_max_bytes,
            max_open: count(self.max_open_transactions),
            max_open_per_session: count(self.max_session_transactions),
        }
    }
}

/// `--ducklake-version`: a version as [`DuckLakeVersion::parse`](crate::model::DuckLakeVersion::parse) reads it.
fn parse_ducklake_version(name: &str) -> Result<crate::model::DuckLakeVersion, String> {
    crate::model::DuckLakeVersion::parse(name).ok_or_else(|| {
        format!(
            "DuckLake {name} is not a version this moraine serves (it serves {})",
            crate::model::DuckLakeVersion::ALL
                .map(crate::model::DuckLakeVersion::name)
                .join(", ")
        )
    })
}

/// Settings of `moraine import`: a dump `FILE` replayed into `--data` offline, or an export
/// `--from DIR` staged through `--server`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["file", "from"])))]
pub struct ImportConfig {
    /// Directory of the embedded store, created if missing (for a `FILE` import).
    #[arg(long, env = "MORAINE_DATA", default_value = "./moraine-data")]
    pub data: PathBuf,
    /// The dump: `{"steps": {"<commit>": {"<table>": {"columns": [...], "added": [...], "removed": [...]}}}}`.
    #[arg(conflicts_with_all = ["from", "server"])]
    pub file: Option<PathBuf>,
    /// The server to stage the export through (`grpc://HOST:PORT`, `grpc+tls://HOST:PORT`).
    #[arg(long, requires = "from")]
    pub server: Option<String>,
    /// An export directory (`moraine export --out`): its manifest's checksums are verified
    /// before anything is staged.
    #[arg(long, requires = "server")]
    pub from: Option<PathBuf>,
    /// Mappings per transaction (with their name rows), and data files per transaction
    /// [default: 10000].
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=1 << 24))]
    pub batch: Option<u64>,
    /// Mappings to skip (with their name rows), in the export's order: those an earlier,
    /// stopped import already committed (its message says how many).
    #[arg(long)]
    pub skip_mappings: Option<u64>,
    /// Data files to skip, in the export's order: those an earlier, stopped import already
    /// committed (its message says how many).
    #[arg(long)]
    pub skip_files: Option<u64>,
    /// Credentials and TLS.
    #[command(flatten)]
    pub client: ClientConfig,
}

/// Mappings (or data files) per transaction of `moraine import --from`, unless `--batch`.
pub const DEFAULT_IMPORT_BATCH: usize = 10_000;

/// What `moraine import` was asked to do, once its arguments are checked.
#[derive(Debug, Clone)]
pub enum ImportMode {
    /// Replay a dump of DuckLake commits into the embedded store in `data`.
    Dump {
        /// The store's directory.
        data: PathBuf,
        /// The dump.
        file: PathBuf,
    },
    /// Stage an export through a server.
    Flight(FlightImport),
}

/// Settings of `moraine import --server … --from …`.
#[derive(Debug, Clone)]
pub struct FlightImport {
    /// The server.
    pub server: String,
    /// The export directory.
    pub from: PathBuf,
    /// Mappings (or data files) per transaction.
    pub batch: usize,
    /// Mappings an earlier import already committed.
    pub skip_mappings: u64,
    /// Data files an earlier import already committed.
    pub skip_files: u64,
    /// Credentials and TLS.
    pub client: ClientConfig,
}

impl ImportConfig {
    /// Which import this is.
    ///
    /// # Errors
    /// [`crate::Error::Config`] naming what is missing or mixed (clap already refuses most of
    /// it; this holds for configs built otherwise).
    pub fn mode(self) -> crate::Result<ImportMode> {
        let count = |n: u64| usize::try_from(n).unwrap_or(usize::MAX);
        match (self.file, self.server, self.from) {
            (Some(_), None, None)
                if self.batch.is_some()
                    || self.skip_mappings.is_some()
                    || self.skip_files.is_some() =>
            {
                Err(crate::Error::Config {
                    setting: "batch",
                    reason: "--batch, --skip-mappings and --skip-files are for an import --from \
                             an export; a dump FILE is replayed one commit at a time"
                        .into(),
                })
            }
            (Some(file), None, None) => Ok(ImportMode::Dump {
                data: self.data,
                file,
            }),
            (None, Some(server), Some(from)) => Ok(ImportMode::Flight(FlightImport {
                server,
                from,
                batch: self.batch.map_or(DEFAULT_IMPORT_BATCH, count).max(1),
                skip_mappings: self.skip_mappings.unwrap_or(0),
                skip_files: self.skip_files.unwrap_or(0),
                client: self.client,
            })),
            (Some(_), _, _) => Err(crate::Error::Config {
                setting: "file",
                reason: "a dump FILE is imported into --data offline; --server and --from \
                         import an export through a server: give one or the other"
                    .into(),
            }),
            (None, None, _) => Err(crate::Error::Config {
                setting: "server",
                reason: "import --from DIR needs --server URI to stage through (or give a \
                         dump FILE to import into --data offline)"
                    .into(),
            }),
            (None, Some(_), None) => Err(crate::Error::Config {
                setting: "from",
                reason: "import --server URI needs --from DIR, the export to stage".into(),
            }),
        }
    }
}

/// The file format of an export.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ExportFormat {
    /// Parquet, zstd-compressed.
    Parquet,
    /// Arrow IPC files.
    Arrow,
}

/// Settings of `moraine export`.
#[derive(Debug, Clone, clap::Args)]
pub struct ExportConfig {
    /// The server to read from (`grpc://HOST:PORT`, `grpc+tls://HOST:PORT`).
    #[arg(long, env = "MORAINE_SERVER")]
    pub server: String,
    /// Directory to write the files and `manifest.json` to, created if missing; one that
    /// holds an export already is refused.
    #[arg(long)]
    pub out: PathBuf,
    /// Tables to export, comma-separated (default: all three).
    #[arg(long, value_delimiter = ',')]
    pub tables: Vec<String>,
    /// File format.
    #[arg(long, value_enum, default_value_t = ExportFormat::Parquet)]
    pub format: ExportFormat,
    /// Endpoints read at once. Each holds at most a few batches in memory while the files
    /// are written in endpoint order.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub parallel: u64,
    /// Credentials and TLS.
    #[command(flatten)]
    pub client: ClientConfig,
}

/// How a client command (`export`, `import --from`) reaches a server: credentials and TLS.
#[derive(Debug, Clone, Default, clap::Args)]
pub struct ClientConfig {
    /// Log in as this user (a Handshake with Basic credentials); the password comes from
    /// `MORAINE_PASSWORD`, else from the first line of standard input. Takes precedence over
    /// a token.
    #[arg(long)]
    pub username: Option<String>,
    /// A bearer token (`moraine token create`), sent as `authorization: Bearer …`.
    #[arg(long, env = "MORAINE_TOKEN", hide_env_values = true)]
    pub token: Option<String>,
    /// PEM CA certificates to trust for a `grpc+tls://` server.
    #[arg(long)]
    pub tls_ca: Option<PathBuf>,
    /// PEM client certificate chain, for a server that requires mutual TLS.
    #[arg(long, requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// PEM private key of --tls-cert.
    #[arg(long, requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}
