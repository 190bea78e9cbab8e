//! moraine's integration tests: one test binary, so the crate and its dependencies link once.
//!
//! - [`conformance`]: the storage conformance suite, run against every backend.
//! - [`redb_store`]: what only the embedded backend promises (durability across reopen).

#![allow(
    clippy::indexing_slicing,
    reason = "test code: a panic is a failed test"
)]

mod conformance;
mod harness;
mod redb_store;
