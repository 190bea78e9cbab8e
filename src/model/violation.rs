//! Constraint violations of a staged batch, as facts of the domain: what the write path's
//! validation finds. It collects every violation of a batch, not just the first, so a client
//! fixes its batch in one round.

use std::fmt;

use super::CatalogTable;

/// One broken constraint, naming the mapping (and column) or data file concerned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Violation {
    /// A column the table's rows never leave NULL is NULL.
    #[error("{table}.{column} is NULL in inserted row {row}{}", describe_row(*row_id))]
    NullColumn {
        /// The table inserted into.
        table: CatalogTable,
        /// The NULL column.
        column: &'static str,
        /// 0-based position of the row among this batch's inserts into `table`.
        row: usize,
        /// The row's own id (`mapping_id` or `data_file_id`), when that is not the NULL one.
        row_id: Option<i64>,
    },
    /// A `ducklake_column_mapping` insert with no `ducklake_name_mapping` rows: invisible to
    /// DuckLake's inner join.
    #[error("mapping {mapping_id} of table {table_id} has no ducklake_name_mapping rows")]
    EmptyMapping {
        /// `table_id`.
        table_id: i64,
        /// `mapping_id`.
        mapping_id: i64,
    },
    /// `ducklake_name_mapping` rows whose `mapping_id` no `ducklake_column_mapping` insert of
    /// the batch consumed.
    #[error(
        "{rows} ducklake_name_mapping rows of mapping {mapping_id} have no ducklake_column_mapping row in this batch"
    )]
    OrphanNameMappings {
        /// Their `mapping_id`.
        mapping_id: i64,
        /// How many rows.
        rows: usize,
    },
    /// Two name rows of one mapping share a `column_id`.
    #[error("mapping {mapping_id} has column_id {column_id} more than once")]
    DuplicateColumnId {
        /// `mapping_id`.
        mapping_id: i64,
        /// The repeated `column_id`.
        column_id: i64,
    },
    /// A name row whose parent does not come before it: DuckLake rebuilds the tree in one
    /// pass, parents first.
    #[error(
        "mapping {mapping_id} column {column_id} has parent_column {parent_column}, which is not before it"
    )]
    ParentNotBeforeChild {
        /// `mapping_id`.
        mapping_id: i64,
        /// `column_id`.
        column_id: i64,
        /// `parent_column`.
        parent_column: i64,
    },
    /// A name row whose `parent_column` is no column of its mapping.
    #[error(
        "mapping {mapping_id} column {column_id} has parent_column {parent_column}, which is not a column of the mapping"
    )]
    ParentMissing {
        /// `mapping_id`.
        mapping_id: i64,
        /// `column_id`.
        column_id: i64,
        /// `parent_column`.
        parent_column: i64,
    },
    /// The mapping's key is already in the store (unique constraint).
    #[error(
        "mapping {mapping_id} of table {table_id} already exists (unique key (table_id, mapping_id) conflict)"
    )]
    MappingExists {
        /// `table_id`.
        table_id: i64,
        /// `mapping_id`.
        mapping_id: i64,
    },
    /// The batch inserts the same mapping twice.
    #[error(
        "mapping {mapping_id} of table {table_id} is inserted twice in this batch (unique key (table_id, mapping_id) conflict)"
    )]
    DuplicateMappingInBatch {
        /// `table_id`.
        table_id: i64,
        /// `mapping_id`.
        mapping_id: i64,
    },
    /// The data file's id is already in the store (primary key).
    #[error("data file {data_file_id} already exists (primary key data_file_id conflict)")]
    DataFileExists {
        /// `data_file_id`.
        data_file_id: i64,
    },
    /// The batch inserts the same data file twice.
    #[error(
        "data file {data_file_id} is inserted twice in this batch (primary key data_file_id conflict)"
    )]
    DuplicateDataFileInBatch {
        /// `data_file_id`.
        data_file_id: i64,
    },
    /// A data file referencing a mapping its table does not have after the batch.
    #[error(
        "data file {data_file_id} of table {table_id} references mapping {mapping_id}, which table {table_id} does not have"
    )]
    UnknownMapping {
        /// `data_file_id`.
        data_file_id: i64,
        /// `table_id`.
        table_id: i64,
        /// The referenced `mapping_id`.
        mapping_id: i64,
    },
    /// An UPDATE of a mapping table: mappings are immutable.
    #[error("{table} is immutable: UPDATE is not allowed (mappings are create-only)")]
    MappingUpdate {
        /// The table.
        table: CatalogTable,
    },
    /// An UPDATE of `ducklake_data_file` other than DuckLake's end transition.
    #[error(
        "unsupported UPDATE of ducklake_data_file: {reason}; only SET end_snapshot = <n> WHERE end_snapshot IS NULL AND (data_file_id IN (...) | table_id IN (...)) is accepted"
    )]
    UnsupportedDataFileUpdate {
        /// What was asked.
        reason: String,
    },
    /// A `ducklake_name_mapping` delete that would remove rows of a live mapping.
    #[error(
        "DELETE from ducklake_name_mapping would remove rows of live mapping {mapping_id} of table {table_id}; delete its ducklake_column_mapping row instead"
    )]
    LiveNameMappingDelete {
        /// `table_id`.
        table_id: i64,
        /// `mapping_id`.
        mapping_id: i64,
    },
}

fn describe_row(row_id: Option<i64>) -> String {
    row_id.map(|id| format!(" (id {id})")).unwrap_or_default()
}

impl Violation {
    /// Whether a later change of the same transaction can still mend the violation: a mapping
    /// whose name rows, a name row whose mapping or parent, or a file whose mapping have not
    /// been staged yet. Everything else is final when it is staged.
    #[must_use]
    pub fn is_pending(&self) -> bool {
        matches!(
            self,
            Violation::EmptyMapping { .. }
                | Violation::OrphanNameMappings { .. }
                | Violation::ParentMissing { .. }
                | Violation::UnknownMapping { .. }
        )
    }

    /// Whether the violation is a key that already exists (as opposed to a malformed batch).
    #[must_use]
    pub fn is_already_exists(&self) -> bool {
        matches!(
            self,
            Violation::MappingExists { .. } | Violation::DataFileExists { .. }
        )
    }
}

/// Every violation of one batch. Nothing of the batch was written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidationError {
    /// The violations, in the order the batch's rows were checked.
    pub violations: Vec<Violation>,
}

/// At most this many violations are spelled out in the message; all are in `violations`.
const MESSAGE_VIOLATIONS: usize = 20;

impl fmt::Display for ValidationError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let count = self.violations.len();
        write!(
            f,
            "batch rejected, nothing written: {count} constraint violation{}",
            if count == 1 { "" } else { "s" }
        )?;
        for (i, violation) in self.violations.iter().take(MESSAGE_VIOLATIONS).enumerate() {
            write!(f, "{} {violation}", if i == 0 { ":" } else { ";" })?;
        }
        if count > MESSAGE_VIOLATIONS {
            write!(f, "; and {} more", count - MESSAGE_VIOLATIONS)?;
        }
        Ok(())
    }
}

impl std::error::Error for ValidationError {}
