//! The pure domain: DuckLake's catalog rows as moraine holds them. No I/O, no bytes.
//!
//! Each catalog table is defined once: its [`Column`]s and a row type. A
//! [`ColumnMapping`] is one `ducklake_column_mapping` row with its `ducklake_name_mapping` rows
//! embedded (RFC 0018's embed rule), the record moraine stores.

mod ids;
mod mapping;
mod rows;
mod version;
mod violation;

pub use ids::{ColumnId, DataFileId, FieldId, MappingId, TableId};
pub use mapping::{ColumnMapping, NameMapping};
pub use rows::{
    CatalogTable, Cell, CellValue, Column, ColumnMappingRow, DataFileRow, NameMappingRow, SqlType,
    commit_upload_columns, mapping_load_columns,
};
pub use version::DuckLakeVersion;
pub use violation::{ValidationError, Violation};
