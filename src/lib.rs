//! moraine: an Arrow Flight SQL server for DuckLake's foreign-file mapping catalog.
//!
//! # Architecture
//!
//! ```text
//!   Flight SQL clients (ADBC, pyarrow.flight)
//!        │ gRPC (TLS: tls)                        tls       rustls acceptor, reloadable
//!        │ auth::gate: credentials → Session      auth/     users, tokens, roles, sessions
//!        │                                        flight/   protocol glue, tickets, status map
//!   ┌────┴──────────────┐                         txn       transactions, sessions, expiry
//!   query/ (DataFusion)  write/ (stage, fold,     query/    providers, pushdown, scans
//!   streams projections  validate, commit)        write/    the staged write path
//!   └────┬──────────────┘                         import    DuckLake commit dumps, offline;
//!        │                                                  exports staged through a server
//!        │                                        catalog/  snapshot reads of records
//!        │ model::{ColumnMapping, DataFile}       model/    pure domain, column tables
//!        │ batch: the tables as Arrow             batch     schemas, builders, typed columns
//!        │ codec: keys and values as bytes        codec/    the only code that knows bytes
//!        │ kv::Store: snapshots, atomic commits   kv/       backend-neutral; limits enforced here
//!   memory │ redb (embedded default, commit log, group commit) │ TiKV
//! ```
//!
//! The embedded store acknowledges a commit once its group is in the commit log and synced;
//! redb's file is synced at checkpoints, and the log is replayed on open (see [`kv::redb`]).
//!
//! # Key layout
//!
//! `[deployment prefix] [subspace] [kind] [ids]`, ids big-endian with the sign bit flipped.
//! Rows (the current subspace) are keyed `table_id` first, so everything of one table in one
//! kind is one contiguous range and a table-scoped read or delete is a range operation. The
//! index subspace finds a row by its id alone (DuckLake's `mapping_id >= cursor`, its
//! `data_file_id IN (…)`) with one range read and keeps `data_file_id` unique across tables;
//! the guard subspace holds one key per table that whole-table writes move on and inserts
//! check. Each row and its index entry are written in the same commit. The kinds, their
//! components and values are tabled once, in [`codec::key`].
//!
//! Values are a format version byte, a protobuf body and a checksum (see [`codec::value`]).
//!
//! # Client commands
//!
//! `moraine export` and `moraine import --from` talk to a server as any Flight client does:
//! [`client`] connects and logs in, [`export`] reads the tables into Parquet or Arrow IPC
//! files with a manifest, [`import::flight`] stages such an export back in atomic batches,
//! and [`progress`] reports on both. They use the server's Arrow shapes ([`model`]) and
//! nothing of its storage.

pub mod auth;
pub(crate) mod batch;
pub mod catalog;
pub mod client;
pub mod clock;
pub(crate) mod coalesce;
pub mod codec;
pub mod config;
pub mod error;
pub mod export;
pub(crate) mod flight;
#[doc(hidden)]
pub mod fuzz;
pub mod import;
mod key_range;
pub mod kv;
pub mod metrics;
pub mod model;
pub mod progress;
pub mod query;
pub(crate) mod read_ahead;
pub mod server;
mod text;
pub mod tls;
pub mod txn;
pub mod write;

pub use error::{Error, Result};
