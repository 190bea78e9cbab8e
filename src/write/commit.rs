//! Commits staged changes as one store transaction and says what became of them.

use super::StagedBatch;
pub use super::stage::PlanSummary;
use super::stage::Staging;
use crate::catalog::{Catalog, CatalogSnapshot};
use crate::codec::Kind;
use crate::error::{Error, Result};
use crate::kv::{CommitOutcome, Conflict};
use crate::model::ValidationError;

/// What a committed batch did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommitReport {
    /// Rows each of the batch's changes affected, in the batch's order.
    pub affected: Vec<u64>,
    /// The net effect on stored records.
    pub summary: PlanSummary,
}

/// Folds, validates and commits `batch` atomically: all of it, or nothing.
///
/// After `Ok`, every change is durable. After [`Error::Validation`] or
/// [`Error::CommitConflict`] nothing was written; a conflict may be retried. After
/// [`Error::CommitUnknown`] the batch may or may not have landed: re-read before retrying.
///
/// # Errors
/// As above, and [`Error::Kv`] / [`Error::Codec`] for store failures before the commit.
pub async fn commit_batch(catalog: &Catalog, batch: &StagedBatch) -> Result<CommitReport> {
    commit_batch_at(catalog, &catalog.snapshot().await?, batch).await
}

/// As [`commit_batch`], validating against `snapshot` (the one a statement read), not a
/// fresh one.
///
/// # Errors
/// As [`commit_batch`].
pub async fn commit_batch_at(
    catalog: &Catalog,
    snapshot: &CatalogSnapshot,
    batch: &StagedBatch,
) -> Result<CommitReport> {
    let mut staging = Staging::new(snapshot.clone());
    let mut violations = Vec::new();
    for op in batch.ops() {
        staging.apply(op, &mut violations).await?;
    }
    if !violations.is_empty() {
        violations.extend(staging.pending());
        return Err(Error::Validation(ValidationError { violations }));
    }
    commit(catalog, staging).await
}

/// Commits the changes staged against some snapshot of `catalog`. Every key they create is
/// insert-if-absent and every stored key they change or rely on must still be present, so a
/// commit that happened since that snapshot and touched the same records makes this one a
/// conflict.
///
/// # Errors
/// As [`commit_batch`].
pub async fn commit(catalog: &Catalog, staging: Staging) -> Result<CommitReport> {
    let (writes, affected, summary) = staging.into_writes()?;
    match catalog.store().commit_staged(writes).await? {
        CommitOutcome::Committed => Ok(CommitReport { affected, summary }),
        CommitOutcome::Conflict(conflict) => Err(Error::CommitConflict {
            detail: describe(catalog, &conflict),
        }),
        CommitOutcome::Unknown { reason } => Err(Error::CommitUnknown { reason }),
    }
}

/// The conflict in the catalog's terms: which mapping, data file or table changed underneath.
fn describe(catalog: &Catalog, conflict: &Conflict) -> String {
    let (key, what) = match conflict {
        Conflict::AlreadyExists { key } => (key, "was created concurrently"),
        Conflict::Missing { key } => (key, "was deleted concurrently"),
        Conflict::Changed { key } => (key, "was changed concurrently"),
        Conflict::RangeChanged { start, .. } => (start, "changed concurrently"),
        Conflict::WriteConflict { key: Some(key) } => (key, "was written concurrently"),
        Conflict::WriteConflict { key: None } => return conflict.to_string(),
    };
    let keyspace = catalog.keyspace();
    let Ok((kind, first)) = keyspace.decode_head(key) else {
        return conflict.to_string();
    };
    let row = keyspace.decode(key).ok();
    let (table, id) = match row {
        Some(row) => (Some(row.table_id), row.id),
        None => (None, first),
    };
    match (kind, conflict, table) {
        (Kind::DataFileById, Conflict::RangeChanged { .. }, _) => {
            format!("the data files with ids from {first} on {what}")
        }
        (Kind::MappingTables | Kind::DataFileTables, ..) => {
            // The table set moves when a table gets its guard and when a statement acts on
            // a key range across tables: the two raced.
            format!(
                "the {} of the catalog's tables changed concurrently",
                rows_of(kind)
            )
        }
        (_, Conflict::RangeChanged { .. }, _) | (Kind::MappingGuard | Kind::DataFileGuard, ..) => {
            // A guard changes when a statement acts on its table whole; whatever the
            // backend's account, the table's rows changed under the transaction.
            format!("the {} of table {first} changed concurrently", rows_of(kind))
        }
        (Kind::Mapping | Kind::MappingById, _, Some(table)) => {
            format!("mapping {id} of table {table} {what}")
        }
        (_, _, Some(table)) => format!("data file {id} of table {table} {what}"),
        (_, _, None) => format!("data file {id} {what}"),
    }
}

/// What the rows of a kind, or those an index, guard or table set is about, are called.
fn rows_of(kind: Kind) -> &'static str {
    match kind {
        Kind::Mapping | Kind::MappingById | Kind::MappingGuard | Kind::MappingTables => "mappings",
        _ => "data files",
    }
}
