//! DuckLake's catalog rows exactly as clients send and read them: every column, in DuckLake's
//! order, each nullable as in DuckLake's SQL catalogs.
//!
//! These are the staged write path's input and the read path's output. The stored records
//! ([`ColumnMapping`], [`DataFile`]) are what remains after the fold has validated them.

use std::fmt;

use super::{ColumnMapping, DataFile, MappingId};

/// One of the catalog tables moraine serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum CatalogTable {
    /// `ducklake_column_mapping`.
    ColumnMapping,
    /// `ducklake_name_mapping`.
    NameMapping,
    /// `ducklake_data_file`.
    DataFile,
}

impl CatalogTable {
    /// Every served table.
    pub const ALL: [CatalogTable; 3] = [
        CatalogTable::ColumnMapping,
        CatalogTable::NameMapping,
        CatalogTable::DataFile,
    ];

    /// DuckLake's name of the table.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            CatalogTable::ColumnMapping => "ducklake_column_mapping",
            CatalogTable::NameMapping => "ducklake_name_mapping",
            CatalogTable::DataFile => "ducklake_data_file",
        }
    }

    /// The table named `name` (DuckLake's spelling, case-insensitive).
    #[must_use]
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL
            .into_iter()
            .find(|table| table.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for CatalogTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A `ducklake_column_mapping` row: `(mapping_id, table_id, type)`.
#[allow(
    missing_docs,
    reason = "each field is the DuckLake column of the same name"
)]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ColumnMappingRow {
    pub mapping_id: Option<i64>,
    pub table_id: Option<i64>,
    pub map_type: Option<String>,
}

/// A `ducklake_name_mapping` row:
/// `(mapping_id, column_id, source_name, target_field_id, parent_column, is_partition)`.
#[allow(
    missing_docs,
    reason = "each field is the DuckLake column of the same name"
)]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NameMappingRow {
    pub mapping_id: Option<i64>,
    pub column_id: Option<i64>,
    pub source_name: Option<String>,
    pub target_field_id: Option<i64>,
    pub parent_column: Option<i64>,
    pub is_partition: Option<bool>,
}

/// A `ducklake_data_file` row, all 16 columns.
#[allow(
    missing_docs,
    reason = "each field is the DuckLake column of the same name"
)]
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DataFileRow {
    pub data_file_id: Option<i64>,
    pub table_id: Option<i64>,
    pub begin_snapshot: Option<i64>,
    pub end_snapshot: Option<i64>,
    pub file_order: Option<i64>,
    pub path: Option<String>,
    pub path_is_relative: Option<bool>,
    pub file_format: Option<String>,
    pub record_count: Option<i64>,
    pub file_size_bytes: Option<i64>,
    pub footer_size: Option<i64>,
    pub row_id_start: Option<i64>,
    pub partition_id: Option<i64>,
    pub encryption_key: Option<String>,
    pub partial_file_info: Option<String>,
    pub mapping_id: Option<i64>,
}

impl ColumnMapping {
    /// The record's `ducklake_column_mapping` row.
    #[must_use]
    pub fn column_row(&self) -> ColumnMappingRow {
        ColumnMappingRow {
            mapping_id: Some(self.mapping_id.0),
            table_id: Some(self.table_id.0),
            map_type: self.map_type.clone(),
        }
    }

    /// The record's `ducklake_name_mapping` rows, flat-mapped from the embedded names.
    pub fn name_rows(&self) -> impl Iterator<Item = NameMappingRow> + '_ {
        self.names.iter().map(|name| NameMappingRow {
            mapping_id: Some(self.mapping_id.0),
            column_id: Some(name.column_id.0),
            source_name: Some(name.source_name.clone()),
            target_field_id: Some(name.target_field_id.0),
            parent_column: name.parent_column.map(|c| c.0),
            is_partition: Some(name.is_partition),
        })
    }
}

impl DataFile {
    /// The record as its `ducklake_data_file` row.
    #[must_use]
    pub fn to_row(&self) -> DataFileRow {
        DataFileRow {
            data_file_id: Some(self.data_file_id.0),
            table_id: Some(self.table_id.0),
            begin_snapshot: self.begin_snapshot,
            end_snapshot: self.end_snapshot,
            file_order: self.file_order,
            path: self.path.clone(),
            path_is_relative: self.path_is_relative,
            file_format: self.file_format.clone(),
            record_count: self.record_count,
            file_size_bytes: self.file_size_bytes,
            footer_size: self.footer_size,
            row_id_start: self.row_id_start,
            partition_id: self.partition_id,
            encryption_key: self.encryption_key.clone(),
            partial_file_info: self.partial_file_info.clone(),
            mapping_id: self.mapping_id.map(|m| m.0),
        }
    }

    /// The record of a row whose key columns are known to be present.
    #[must_use]
    pub fn from_row(row: DataFileRow, data_file_id: i64, table_id: i64) -> Self {
        DataFile {
            data_file_id: data_file_id.into(),
            table_id: table_id.into(),
            begin_snapshot: row.begin_snapshot,
            end_snapshot: row.end_snapshot,
            file_order: row.file_order,
            path: row.path,
            path_is_relative: row.path_is_relative,
            file_format: row.file_format,
            record_count: row.record_count,
            file_size_bytes: row.file_size_bytes,
            footer_size: row.footer_size,
            row_id_start: row.row_id_start,
            partition_id: row.partition_id,
            encryption_key: row.encryption_key,
            partial_file_info: row.partial_file_info,
            mapping_id: row.mapping_id.map(MappingId),
        }
    }
}
