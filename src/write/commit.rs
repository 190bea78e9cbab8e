//! Commits staged changes as one store transaction and says what became of them.

use super::StagedBatch;
pub use super::stage::PlanSummary;
use super::stage::Staging;
use crate::catalog::{Catalog, CatalogSnapshot};
use crate::codec::Kind;
use crate::error::{Change, ConflictOn, Error, Result, Rows};
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
    let outcome = match catalog.store().commit_staged(writes).await? {
        CommitOutcome::Committed => Ok(CommitReport { affected, summary }),
        CommitOutcome::Conflict(conflict) => Err(Error::CommitConflict {
            on: describe(catalog, &conflict),
        }),
        CommitOutcome::Unknown { reason } => Err(Error::CommitUnknown { reason }),
    };
    crate::metrics::get().commit_outcome(&outcome);
    outcome
}

/// The conflict in the catalog's terms: which mapping, data file or table changed underneath.
fn describe(catalog: &Catalog, conflict: &Conflict) -> ConflictOn {
    let (key, change) = match conflict {
        Conflict::AlreadyExists { key } => (key, Change::Created),
        Conflict::Missing { key } => (key, Change::Deleted),
        Conflict::Changed { key } | Conflict::RangeChanged { start: key, .. } => {
            (key, Change::Changed)
        }
        Conflict::WriteConflict { key: Some(key) } => (key, Change::Written),
        Conflict::WriteConflict { key: None } => return ConflictOn::Store(conflict.to_string()),
    };
    let keyspace = catalog.keyspace();
    let Ok((kind, first)) = keyspace.decode_head(key) else {
        return ConflictOn::Store(conflict.to_string());
    };
    let row = keyspace.decode(key).ok();
    let rows = match kind {
        Kind::Mapping
        | Kind::MappingById
        | Kind::MappingGuard
        | Kind::MappingTable
        | Kind::MappingTableSet => Rows::Mappings,
        _ => Rows::DataFiles,
    };
    match (kind, conflict, row) {
        (Kind::DataFileById, Conflict::RangeChanged { .. }, _) => {
            ConflictOn::DataFileIds { from: first }
        }
        // The table set moves when a table gets its mark and when a statement acts on a
        // key range across tables: the two raced.
        (
            Kind::MappingTable
            | Kind::DataFileTable
            | Kind::MappingTableSet
            | Kind::DataFileTableSet,
            ..,
        ) => ConflictOn::Tables { rows },
        // A guard changes when a statement acts on its table whole; whatever the backend's
        // account, the table's rows changed under the transaction.
        (_, Conflict::RangeChanged { .. }, _) | (Kind::MappingGuard | Kind::DataFileGuard, ..) => {
            ConflictOn::TableRows {
                rows,
                table_id: first,
            }
        }
        (Kind::Mapping | Kind::MappingById, _, Some(row)) => ConflictOn::Mapping {
            table_id: row.table_id.0,
            mapping_id: row.id,
            change,
        },
        (_, _, row) => ConflictOn::DataFile {
            table_id: row.map(|row| row.table_id.0),
            data_file_id: row.map_or(first, |row| row.id),
            change,
        },
    }
}
