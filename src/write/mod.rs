//! The staged write path: the row-level changes of one DuckLake commit, folded, validated and
//! committed atomically (RFC 0018, "Staged write: the child-row fold").
//!
//! - [`StagedBatch`]: the changes, in the order the client made them, independent of Flight.
//! - [`fold`]: name-mapping inserts grouped under their column-mapping insert.
//! - [`plan`](mod@plan): the batch evaluated against a snapshot; every violation collected; the
//!   result is one [`WriteSet`](crate::kv::WriteSet).
//! - [`commit`](mod@commit): that write set committed in one store transaction.

pub mod commit;
pub mod decode;
pub mod fold;
pub mod plan;
pub mod validate;

use std::ops::RangeInclusive;

pub use commit::{CommitReport, commit_batch};
pub use plan::{CommitPlan, Evaluation, evaluate, plan_batch};
pub use validate::{ValidationError, Violation};

use crate::model::{
    CatalogTable, ColumnMappingRow, DataFileId, DataFileRow, MappingId, NameMappingRow, TableId,
};

/// The row-level changes of one DuckLake commit, in the order they were made.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StagedBatch {
    ops: Vec<Op>,
}

impl StagedBatch {
    /// An empty batch.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends one change.
    pub fn push(&mut self, op: Op) -> &mut Self {
        self.ops.push(op);
        self
    }

    /// The changes, in order.
    #[must_use]
    pub fn ops(&self) -> &[Op] {
        &self.ops
    }

    /// Removes the last change (a statement that was refused after it was staged).
    pub fn pop(&mut self) -> Option<Op> {
        self.ops.pop()
    }

    /// Whether the batch changes nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

impl Op {
    /// Rows the change stages and an estimate of the bytes it holds, for per-transaction
    /// limits. A delete or update counts as one row.
    #[must_use]
    pub fn staged_size(&self) -> (u64, u64) {
        fn text(value: Option<&String>) -> u64 {
            value.map_or(0, |s| s.len() as u64)
        }
        match self {
            Op::Insert(Insert::ColumnMappings(rows)) => (
                rows.len() as u64,
                rows.iter().map(|r| 24 + text(r.map_type.as_ref())).sum(),
            ),
            Op::Insert(Insert::NameMappings(rows)) => (
                rows.len() as u64,
                rows.iter().map(|r| 48 + text(r.source_name.as_ref())).sum(),
            ),
            Op::Insert(Insert::DataFiles(rows)) => (
                rows.len() as u64,
                rows.iter()
                    .map(|r| {
                        128 + text(r.path.as_ref())
                            + text(r.file_format.as_ref())
                            + text(r.encryption_key.as_ref())
                            + text(r.partial_file_info.as_ref())
                    })
                    .sum(),
            ),
            Op::Delete(delete) => (1, 16 + 8 * delete.ids_len()),
            Op::Update(_) => (1, 64),
        }
    }
}

impl Delete {
    fn ids_len(&self) -> u64 {
        match self {
            Delete::ColumnMappingsOfTables(ids) | Delete::DataFilesOfTables(ids) => {
                ids.len() as u64
            }
            Delete::ColumnMappings(ids) | Delete::NameMappings(ids) => ids.len() as u64,
            Delete::DataFiles(ids) => ids.len() as u64,
            Delete::OrphanNameMappings | Delete::DataFileIdRange(_) => 0,
        }
    }
}

/// One change of a [`StagedBatch`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Rows inserted into one table.
    Insert(Insert),
    /// Rows deleted, by a key set or a predicate resolved against the batch's view.
    Delete(Delete),
    /// Rows updated.
    Update(Update),
}

/// Rows inserted into one catalog table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Insert {
    /// `INSERT INTO ducklake_column_mapping`.
    ColumnMappings(Vec<ColumnMappingRow>),
    /// `INSERT INTO ducklake_name_mapping`.
    NameMappings(Vec<NameMappingRow>),
    /// `INSERT INTO ducklake_data_file`.
    DataFiles(Vec<DataFileRow>),
}

/// The deletes DuckLake issues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Delete {
    /// `DELETE FROM ducklake_column_mapping WHERE table_id IN (...)`: snapshot expiry of dropped
    /// tables. One range operation per table.
    ColumnMappingsOfTables(Vec<TableId>),
    /// `DELETE FROM ducklake_column_mapping WHERE mapping_id IN (...)`.
    ColumnMappings(Vec<MappingId>),
    /// `DELETE FROM ducklake_name_mapping tbl WHERE NOT EXISTS (SELECT 1 FROM
    /// ducklake_column_mapping m WHERE m.mapping_id = tbl.mapping_id)`: the orphan sweep.
    /// Name rows live inside their mapping's record, so there is never an orphan: a no-op.
    OrphanNameMappings,
    /// `DELETE FROM ducklake_name_mapping WHERE mapping_id IN (...)`: accepted only when every
    /// named mapping is gone.
    NameMappings(Vec<MappingId>),
    /// `DELETE FROM ducklake_data_file WHERE data_file_id IN (...)`.
    DataFiles(Vec<DataFileId>),
    /// `DELETE FROM ducklake_data_file WHERE data_file_id BETWEEN lo AND hi` (or `>=`/`<=`).
    DataFileIdRange(RangeInclusive<i64>),
    /// `DELETE FROM ducklake_data_file WHERE table_id IN (...)`.
    DataFilesOfTables(Vec<TableId>),
}

/// The updates a client may ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Update {
    /// DuckLake's end transition: `UPDATE ducklake_data_file SET end_snapshot = S WHERE
    /// end_snapshot IS NULL AND (data_file_id IN (...) | table_id IN (...))`.
    EndDataFiles {
        /// `S`.
        end_snapshot: i64,
        /// Which files.
        target: EndTarget,
    },
    /// An update of a mapping table. Always rejected: mappings are immutable.
    MappingTable(CatalogTable),
    /// Any other update of `ducklake_data_file`. Always rejected.
    OtherDataFileUpdate {
        /// What was asked, for the error.
        description: String,
    },
}

/// The files an end transition applies to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EndTarget {
    /// `AND data_file_id IN (...)`.
    DataFiles(Vec<DataFileId>),
    /// `AND table_id IN (...)` (DROP TABLE).
    Tables(Vec<TableId>),
}
