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
///
/// One arena (`narenas:1`) rather than jemalloc's four per CPU. The server's large blocks are
/// allocated on one thread and freed on another: a scan's pages are filled on the blocking
/// threads that read the store and freed by the runtime's workers once their rows are in
/// Arrow; a transaction's staged writes are built on a worker and freed by the applier. A
/// freed block goes back to the arena of the thread that allocated it, and each new blocking
/// thread is handed the next arena, so with eight arenas a block was seldom reused before it
/// was returned to the OS, and the next one was fresh memory, faulted in again. With one
/// arena, measured at 100k mappings on the profiling build (five rounds each, medians, the
/// two settings alternated): the id-order full load (W2) took 3.3k-5.9k page faults a query
/// instead of 6.7k-7.9k, a 100k-mapping transaction (W5b) 32k instead of 44k-48k and peaked
/// 228-229 MiB instead of 242-249 MiB, the one-transaction load 173-177 MiB instead of
/// 189-196 MiB; CPU the same within noise. Small blocks stay in per-thread caches; only
/// large ones take the arena's lock. On a machine with many cores and many concurrent scans
/// that lock could be contended: `_RJEM_MALLOC_CONF=narenas:N` overrides it at start-up.
///
/// No separate arena for blocks of 8 MiB and more (`oversize_threshold:0`). jemalloc gives
/// such blocks an arena of its own that keeps nothing freed: their pages go back to the OS the
/// moment they are freed, and the next such block is fresh memory, faulted in page by page. A
/// large transaction's biggest blocks are that size (its hash table, the seal's key order and
/// sort buffers, vectors of staged rows as they double), so each was faulted in anew, also
/// within one commit, where a block one step freed could have served the next. In the one
/// arena they are kept for the same quarter of a second as any other block. Measured on the
/// profiling build at 100k mappings: a 100k-mapping transaction (W5b, 1.6 s apart) took
/// 22k-24k page faults instead of 24k-26k and peaked at 165-171 MiB instead of 174-178 MiB;
/// the one-transaction load into a fresh server 26k-27k instead of 27k-34k. The comparison
/// harness's runs with and without are in the README.
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// jemalloc's settings, read once at start-up, as the NUL-terminated `const char *` jemalloc
/// looks up by this symbol name (a reference to a byte array is a plain pointer).
// The one unsafe item of the crate: exporting a symbol for the allocator to read. It is
// immutable, NUL-terminated and lives for the whole program.
#[allow(unsafe_code)]
#[unsafe(export_name = "_rjem_malloc_conf")]
static MALLOC_CONF: &[u8; 90] =
    b"background_thread:true,dirty_decay_ms:250,muzzy_decay_ms:0,narenas:1,oversize_threshold:0\0";

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
