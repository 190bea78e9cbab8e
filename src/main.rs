//! The `moraine` binary: parse the command line, run it. No logic lives here.

use std::io::IsTerminal as _;
use std::process::ExitCode;

use clap::Parser as _;
use moraine::config::{Cli, Command};

/// jemalloc, as TiKV and `InfluxDB` run it: glibc's allocator keeps the many small blocks of a
/// large transaction's staged rows after they are freed (measured: 430 MiB still resident
/// after a 300k-mapping load had committed, 90 MiB once trimmed by hand). jemalloc's
/// background thread hands freed pages back to the OS within about a quarter of a second
/// ([`MALLOC_CONF`]), even while the server is idle. A quarter rather than a whole second:
/// a full scan at 1M mappings peaked 25 MiB lower, and the comparison harness's writes ran
/// as fast (the pages freed in one round are reused by the next before they are returned).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read once at start-up, as the NUL-terminated `const char *` jemalloc
/// looks up by this symbol name (a reference to a byte array is a plain pointer).
// The one unsafe item of the crate: exporting a symbol for the allocator to read. It is
// immutable, NUL-terminated and lives for the whole program.
#[allow(unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 59] = b"background_thread:true,dirty_decay_ms:250,muzzy_decay_ms:0\0";

/// Stack of each runtime thread. Parts of the query engine walk expression trees recursively;
/// the depth of client expressions is bounded (`query::limits`), and this leaves that bound a
/// wide margin, also in debug builds. Only the pages a thread touches are ever resident.
const THREAD_STACK_BYTES: usize = 8 << 20;

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .init();
    let cli = Cli::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(THREAD_STACK_BYTES)
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!("cannot start the async runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        match cli.command {
            Command::Serve(config) => moraine::server::serve(*config).await,
            Command::Import(config) => moraine::server::import(config).await,
            Command::Export(config) => moraine::export::export(config).await.map(drop),
            Command::User(command) => moraine::auth::cli::user(command),
            Command::Token(command) => moraine::auth::cli::token(command),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!("{err}");
            ExitCode::FAILURE
        }
    }
}
