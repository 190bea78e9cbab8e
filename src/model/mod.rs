//! The pure domain: DuckLake's catalog rows as moraine holds them. No I/O, no bytes.
//!
//! A [`ColumnMapping`] is one `ducklake_column_mapping` row with its `ducklake_name_mapping`
//! rows embedded (RFC 0018's embed rule); a [`DataFile`] is one `ducklake_data_file` row.

mod data_file;
mod ids;
mod mapping;
mod rows;

pub use data_file::DataFile;
pub use ids::{ColumnId, DataFileId, FieldId, MappingId, TableId};
pub use mapping::{ColumnMapping, NameMapping};
pub use rows::{CatalogTable, ColumnMappingRow, DataFileRow, NameMappingRow};
