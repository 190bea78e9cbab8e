//! `ducklake_data_file`.

use super::{DataFileId, MappingId, TableId};

/// One `ducklake_data_file` row, all 16 columns in DuckLake's order.
///
/// `data_file_id` and `table_id` form the key and are never NULL; every other column is
/// nullable, as in DuckLake's catalog schema.
#[allow(
    missing_docs,
    reason = "each field is the DuckLake column of the same name"
)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DataFile {
    pub data_file_id: DataFileId,
    pub table_id: TableId,
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
    /// `NULL` for files DuckLake wrote itself; the mapping of a registered foreign file.
    pub mapping_id: Option<MappingId>,
}
