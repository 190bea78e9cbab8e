//! `ducklake_column_mapping` and its embedded `ducklake_name_mapping` rows.

use super::{ColumnId, FieldId, MappingId, TableId};

/// One `ducklake_column_mapping` row and, embedded, every `ducklake_name_mapping` row of it.
///
/// Immutable once stored: created by the staged write path, removed only by expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ColumnMapping {
    /// `mapping_id`.
    pub mapping_id: MappingId,
    /// `table_id`.
    pub table_id: TableId,
    /// `type`, verbatim (DuckLake writes `'map_by_name'`); `None` is SQL NULL.
    pub map_type: Option<String>,
    /// The name-mapping rows, in `column_id` order.
    pub names: Vec<NameMapping>,
}

/// One `ducklake_name_mapping` row, without its `mapping_id` (the parent's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NameMapping {
    /// `column_id`: ordinal of this column in the mapping's pre-order walk.
    pub column_id: ColumnId,
    /// `source_name`: the column's name as the Parquet file spells it.
    pub source_name: String,
    /// `target_field_id`: the table field this column resolves to.
    pub target_field_id: FieldId,
    /// `parent_column`: `None` for a root column, else the parent's `column_id`.
    pub parent_column: Option<ColumnId>,
    /// `is_partition`: the value comes from the file's hive path, not its body.
    pub is_partition: bool,
}

impl ColumnMapping {
    /// The record's `ducklake_column_mapping` row.
    #[must_use]
    pub fn column_row(&self) -> super::ColumnMappingRow {
        super::ColumnMappingRow {
            mapping_id: Some(self.mapping_id.0),
            table_id: Some(self.table_id.0),
            map_type: self.map_type.clone(),
        }
    }

    /// The record's `ducklake_name_mapping` rows, flat-mapped from the embedded names.
    pub fn name_rows(&self) -> impl Iterator<Item = super::NameMappingRow> + '_ {
        self.names.iter().map(|name| super::NameMappingRow {
            mapping_id: Some(self.mapping_id.0),
            column_id: Some(name.column_id.0),
            source_name: Some(name.source_name.clone()),
            target_field_id: Some(name.target_field_id.0),
            parent_column: name.parent_column.map(|c| c.0),
            is_partition: Some(name.is_partition),
        })
    }
}
