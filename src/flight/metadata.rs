//! Flight SQL metadata results, built with arrow-flight's builders (clients compare their
//! schemas strictly, field metadata included).

use std::sync::{Arc, LazyLock};

use arrow_flight::sql::metadata::{
    SqlInfoData, SqlInfoDataBuilder, XdbcTypeInfo, XdbcTypeInfoData, XdbcTypeInfoDataBuilder,
};
use arrow_flight::sql::{
    CommandGetCatalogs, CommandGetDbSchemas, CommandGetPrimaryKeys, CommandGetTableTypes,
    CommandGetTables, Nullable, Searchable, SqlInfo, SqlSupportedTransaction, XdbcDataType,
};
use datafusion::arrow::array::{Int32Array, StringArray};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::record_batch::RecordBatch;

use crate::batch::served_schema;
use crate::error::{Error, Result};
use crate::model::CatalogTable;
use crate::model::DuckLakeVersion;
use crate::query::{CATALOG_NAME, SCHEMA_NAME};

/// How long an unused prepared statement handle lives, in milliseconds (`SqlInfo` 100).
pub const PREPARED_STATEMENT_TTL_MS: i32 = 10 * 60 * 1000;

fn arrow_error(err: &dyn std::fmt::Display) -> Error {
    Error::Query {
        kind: crate::error::QueryErrorKind::Internal,
        message: format!("metadata result does not build: {err}"),
    }
}

/// The server's `SqlInfo`: what it is and what it supports. `txn_timeout_ms` is how long an
/// idle transaction lives (`SqlInfo` 101).
///
/// # Errors
/// Only if arrow-flight's builder refuses the values, which is a bug.
pub fn sql_info(txn_timeout_ms: i32) -> Result<SqlInfoData> {
    let mut info = SqlInfoDataBuilder::new();
    info.append(SqlInfo::FlightSqlServerName, "moraine");
    info.append(SqlInfo::FlightSqlServerVersion, env!("CARGO_PKG_VERSION"));
    info.append(SqlInfo::FlightSqlServerArrowVersion, "59");
    info.append(SqlInfo::FlightSqlServerReadOnly, false);
    info.append(SqlInfo::FlightSqlServerSql, true);
    info.append(SqlInfo::FlightSqlServerSubstrait, false);
    info.append(
        SqlInfo::FlightSqlServerTransaction,
        SqlSupportedTransaction::Transaction as i32,
    );
    info.append(SqlInfo::FlightSqlServerCancel, false);
    info.append(SqlInfo::FlightSqlServerBulkIngestion, true);
    info.append(SqlInfo::FlightSqlServerIngestTransactionsSupported, true);
    info.append(
        SqlInfo::FlightSqlServerStatementTimeout,
        PREPARED_STATEMENT_TTL_MS,
    );
    info.append(SqlInfo::FlightSqlServerTransactionTimeout, txn_timeout_ms);
    info.append(SqlInfo::SqlIdentifierQuoteChar, "\"");
    info.append(SqlInfo::SqlDdlCatalog, false);
    info.append(SqlInfo::SqlDdlSchema, false);
    info.append(SqlInfo::SqlDdlTable, false);
    info.append(SqlInfo::SqlTransactionsSupported, true);
    info.build().map_err(|err| arrow_error(&err))
}

/// The types the served tables use.
pub static XDBC_TYPES: LazyLock<XdbcTypeInfoData> = LazyLock::new(|| {
    let mut types = XdbcTypeInfoDataBuilder::new();
    for (name, data_type, sql_type) in [
        ("BIGINT", XdbcDataType::XdbcBigint, "BIGINT"),
        ("VARCHAR", XdbcDataType::XdbcVarchar, "VARCHAR"),
        ("BOOLEAN", XdbcDataType::XdbcBit, "BOOLEAN"),
    ] {
        types.append(XdbcTypeInfo {
            type_name: name.into(),
            data_type,
            column_size: None,
            literal_prefix: (name == "VARCHAR").then(|| "'".into()),
            literal_suffix: (name == "VARCHAR").then(|| "'".into()),
            create_params: None,
            nullable: Nullable::NullabilityNullable,
            case_sensitive: name == "VARCHAR",
            searchable: Searchable::Full,
            unsigned_attribute: (name == "BIGINT").then_some(false),
            fixed_prec_scale: false,
            auto_increment: (name == "BIGINT").then_some(false),
            local_type_name: Some(sql_type.into()),
            minimum_scale: None,
            maximum_scale: None,
            sql_data_type: data_type,
            datetime_subcode: None,
            num_prec_radix: (name == "BIGINT").then_some(10),
            interval_precision: None,
        });
    }
    types
        .build()
        .unwrap_or_else(|err| panic!("static type info is valid: {err}"))
});

/// `GetCatalogs`.
///
/// # Errors
/// Only if arrow-flight's builder fails.
pub fn catalogs(cmd: CommandGetCatalogs) -> Result<RecordBatch> {
    let mut builder = cmd.into_builder();
    builder.append(CATALOG_NAME);
    builder.build().map_err(|e| arrow_error(&e))
}

/// `GetDbSchemas`, honouring the catalog and schema filters.
///
/// # Errors
/// Only if arrow-flight's builder fails.
pub fn db_schemas(cmd: CommandGetDbSchemas) -> Result<RecordBatch> {
    let mut builder = cmd.into_builder();
    builder.append(CATALOG_NAME, SCHEMA_NAME);
    builder.build().map_err(|e| arrow_error(&e))
}

/// `GetTables`, honouring the filters and `include_schema` (the tables as DuckLake `version`
/// defines them).
///
/// # Errors
/// Only if arrow-flight's builder fails.
pub fn tables(cmd: CommandGetTables, version: DuckLakeVersion) -> Result<RecordBatch> {
    let mut builder = cmd.into_builder();
    for table in CatalogTable::ALL {
        builder
            .append(
                CATALOG_NAME,
                SCHEMA_NAME,
                table.name(),
                "TABLE",
                &served_schema(version, table),
            )
            .map_err(|e| arrow_error(&e))?;
    }
    builder.build().map_err(|e| arrow_error(&e))
}

/// The schema of a `GetTables` result.
#[must_use]
pub fn tables_schema(cmd: CommandGetTables) -> SchemaRef {
    cmd.into_builder().schema()
}

/// `GetTableTypes`.
///
/// # Errors
/// Only if arrow-flight's builder fails.
pub fn table_types(cmd: CommandGetTableTypes) -> Result<RecordBatch> {
    let mut builder = cmd.into_builder();
    builder.append("TABLE");
    builder.build().map_err(|e| arrow_error(&e))
}

/// The schema of a `GetPrimaryKeys` result (Flight SQL's definition).
pub static PRIMARY_KEYS_SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| {
    Arc::new(Schema::new(vec![
        Field::new("catalog_name", DataType::Utf8, true),
        Field::new("db_schema_name", DataType::Utf8, true),
        Field::new("table_name", DataType::Utf8, false),
        Field::new("column_name", DataType::Utf8, false),
        Field::new("key_name", DataType::Utf8, true),
        Field::new("key_sequence", DataType::Int32, false),
    ]))
});

/// `GetPrimaryKeys`: `ducklake_data_file` has `data_file_id`; the mapping tables have none.
///
/// # Errors
/// Only if the batch fails to build.
pub fn primary_keys(cmd: &CommandGetPrimaryKeys) -> Result<RecordBatch> {
    let matches = cmd.catalog.as_deref().is_none_or(|c| c == CATALOG_NAME)
        && cmd.db_schema.as_deref().is_none_or(|s| s == SCHEMA_NAME)
        && cmd.table == CatalogTable::DataFile.name();
    let rows = usize::from(matches);
    let text = |value: &str| Arc::new(StringArray::from(vec![value; rows]));
    RecordBatch::try_new(
        Arc::clone(&PRIMARY_KEYS_SCHEMA),
        vec![
            text(CATALOG_NAME),
            text(SCHEMA_NAME),
            text(CatalogTable::DataFile.name()),
            text("data_file_id"),
            Arc::new(StringArray::from(vec![None::<&str>; rows])),
            Arc::new(Int32Array::from(vec![1; rows])),
        ],
    )
    .map_err(|e| arrow_error(&e))
}
