//! The staged write path: the row-level changes of one DuckLake commit, folded, validated and
//! committed atomically (RFC 0018, "Staged write: the child-row fold").
//!
//! - [`Op`]: one change (rows inserted into a table as a canonical Arrow batch, a delete, an
//!   update), independent of Flight; [`StagedBatch`] a list of them.
//! - [`decode`]: what clients send (any Arrow types, any column order) into canonical rows.
//! - [`stage`]: [`Staging`], the changes applied one at a time to a transaction's staged
//!   writes: the fold, every validation, the records encoded straight from the rows. A change
//!   costs in proportion to itself, and one that breaks a rule no later change can mend is
//!   taken back whole.
//! - [`commit`](mod@commit): the rules a later change could have mended checked, and the
//!   staged writes committed in one store transaction.

pub mod commit;
pub mod decode;
mod fold;
pub mod stage;

use std::ops::RangeInclusive;

use datafusion::arrow::record_batch::RecordBatch;

pub use crate::model::{ValidationError, Violation};
pub use commit::{CommitReport, PlanSummary, commit_batch, commit_batch_at};
pub use stage::Staging;

use crate::batch::batch_of;
use crate::error::{Error, Result};
use crate::model::{
    CatalogTable, ColumnMappingRow, DataFileId, DataFileRow, MappingId, NameMappingRow, TableId,
};

/// The row-level changes of one DuckLake commit, in the order they were made.
#[derive(Debug, Clone, Default, PartialEq)]
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

    /// Whether the batch changes nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.ops.is_empty()
    }
}

/// One change of a [`StagedBatch`].
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    /// Rows inserted into one table.
    Insert(Insert),
    /// Rows deleted, by a key set or a predicate resolved against the batch's view.
    Delete(Delete),
    /// Rows updated.
    Update(Update),
    /// What a statement read to find its rows, held until the commit: a concurrent change
    /// there then conflicts with it. Changes nothing itself.
    Hold(Hold),
}

/// What a statement read to find the rows it deletes or updates.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hold {
    /// Whole tables of a row kind: each table's range must be unchanged at the commit, and
    /// its guard moves on, so an insert into one of them conflicts whichever commits first.
    Tables {
        /// [`Kind::Mapping`](crate::codec::Kind::Mapping) or
        /// [`Kind::DataFile`](crate::codec::Kind::DataFile).
        kind: crate::codec::Kind,
        /// The tables.
        tables: Vec<TableId>,
    },
    /// Data files by id: each as read, and the ids not found still absent.
    DataFileIds(Vec<DataFileId>),
    /// Key ranges of rows of a row kind, or of its index, read whole: each must be unchanged
    /// at the commit, and every guard of the kind's tables in their span moves on with the
    /// kind's table set, so an insert into the ranges from any table conflicts whichever
    /// commits first (on TiKV too, where only keys two transactions both write collide).
    Ranges {
        /// [`Kind::Mapping`](crate::codec::Kind::Mapping) or
        /// [`Kind::DataFile`](crate::codec::Kind::DataFile).
        kind: crate::codec::Kind,
        /// The ranges, of rows of `kind` or entries of its index.
        ranges: Vec<crate::kv::KeyRange>,
    },
}

/// Rows inserted into one catalog table: a batch in the table's canonical form (every column,
/// in DuckLake's order, with its Arrow type).
#[derive(Debug, Clone, PartialEq)]
pub struct Insert {
    table: CatalogTable,
    rows: RecordBatch,
}

impl Insert {
    /// Rows of `table`, which must be canonical for it.
    ///
    /// # Errors
    /// [`Error::BadRows`] when they are not.
    pub fn new(table: CatalogTable, rows: RecordBatch) -> Result<Self> {
        crate::batch::Columns::new(&rows, table.columns()).map_err(|err| Error::BadRows {
            table,
            problem: err.to_string(),
        })?;
        Ok(Self { table, rows })
    }

    fn of<'a>(
        table: CatalogTable,
        rows: impl IntoIterator<Item = Vec<crate::model::Cell<'a>>>,
    ) -> Self {
        let rows = batch_of(table.columns(), rows)
            .unwrap_or_else(|_| RecordBatch::new_empty(crate::batch::table_schema(table)));
        Self { table, rows }
    }

    /// `INSERT INTO ducklake_column_mapping` of `rows`.
    #[must_use]
    pub fn column_mappings(rows: &[ColumnMappingRow]) -> Self {
        Self::of(
            CatalogTable::ColumnMapping,
            rows.iter().map(ColumnMappingRow::cells),
        )
    }

    /// `INSERT INTO ducklake_name_mapping` of `rows`.
    #[must_use]
    pub fn name_mappings(rows: &[NameMappingRow]) -> Self {
        Self::of(
            CatalogTable::NameMapping,
            rows.iter().map(NameMappingRow::cells),
        )
    }

    /// `INSERT INTO ducklake_data_file` of `rows`.
    #[must_use]
    pub fn data_files(rows: &[DataFileRow]) -> Self {
        Self::of(CatalogTable::DataFile, rows.iter().map(DataFileRow::cells))
    }

    /// The table inserted into.
    #[must_use]
    pub fn table(&self) -> CatalogTable {
        self.table
    }

    /// The rows, canonical for the table.
    #[must_use]
    pub fn rows(&self) -> &RecordBatch {
        &self.rows
    }

    /// How many rows.
    #[must_use]
    pub fn len(&self) -> usize {
        self.rows.num_rows()
    }

    /// Whether there are none.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.rows.num_rows() == 0
    }
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
