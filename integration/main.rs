//! moraine's integration tests: one test binary, so the crate and its dependencies link once.
//!
//! - [`conformance`]: the storage conformance suite, run against every backend.
//! - [`redb_store`]: what only the embedded backend promises (durability across reopen).
//! - `fake_tikv`, `tikv_faults` (feature `tikv`): an in-process fake PD/TiKV cluster the real
//!   `tikv-client` runs against, and the TiKV backend under injected faults.
//! - [`write_path`]: the staged write path (fold, validation, deletes, commit) on every backend.
//! - [`flight_sql`], [`flight_writes`]: the Flight SQL server over real gRPC, reads and writes.
//! - [`auth`]: logins, tokens, roles, per-session isolation and TLS over real gRPC.
//! - [`ducklake_versions`]: DuckLake 0.3, 1.0 and 1.1 deployments, their data-file shapes.
//! - [`export`]: `moraine export` and `moraine import --from`, the binary against servers
//!   over real gRPC.

#![allow(
    clippy::indexing_slicing,
    reason = "test code: a panic is a failed test"
)]

mod auth;
mod conformance;
mod ducklake_fixture;
mod ducklake_versions;
mod endpoints;
mod export;
#[cfg(feature = "tikv")]
mod fake_tikv;
mod flight_sql;
mod flight_writes;
mod harness;
mod observability;
mod query_paths;
mod redb_store;
mod serve;
#[cfg(feature = "tikv")]
mod tikv_faults;
mod write_path;
