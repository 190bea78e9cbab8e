//! The served tables' Arrow schemas, and the builders that turn records into record batches.
//!
//! Schemas follow DuckLake's catalog DDL exactly (BIGINT → Int64, VARCHAR → Utf8, BOOLEAN →
//! Boolean; every column nullable but the data-file primary key). The builders append only the
//! projected columns: a projection is applied while a batch is built, never after.

use std::sync::{Arc, LazyLock};

use datafusion::arrow::array::{ArrayRef, BooleanBuilder, Int64Builder, StringBuilder};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};

use crate::model::{CatalogTable, ColumnMapping, DataFile};

const COLUMN_MAPPING: &[(&str, DataType)] = &[
    ("mapping_id", DataType::Int64),
    ("table_id", DataType::Int64),
    ("type", DataType::Utf8),
];

const NAME_MAPPING: &[(&str, DataType)] = &[
    ("mapping_id", DataType::Int64),
    ("column_id", DataType::Int64),
    ("source_name", DataType::Utf8),
    ("target_field_id", DataType::Int64),
    ("parent_column", DataType::Int64),
    ("is_partition", DataType::Boolean),
];

const DATA_FILE: &[(&str, DataType)] = &[
    ("data_file_id", DataType::Int64),
    ("table_id", DataType::Int64),
    ("begin_snapshot", DataType::Int64),
    ("end_snapshot", DataType::Int64),
    ("file_order", DataType::Int64),
    ("path", DataType::Utf8),
    ("path_is_relative", DataType::Boolean),
    ("file_format", DataType::Utf8),
    ("record_count", DataType::Int64),
    ("file_size_bytes", DataType::Int64),
    ("footer_size", DataType::Int64),
    ("row_id_start", DataType::Int64),
    ("partition_id", DataType::Int64),
    ("encryption_key", DataType::Utf8),
    ("partial_file_info", DataType::Utf8),
    ("mapping_id", DataType::Int64),
];

fn schema_of(columns: &[(&str, DataType)], not_null: Option<&str>) -> SchemaRef {
    Arc::new(Schema::new(
        columns
            .iter()
            .map(|(name, ty)| Field::new(*name, ty.clone(), Some(*name) != not_null))
            .collect::<Vec<_>>(),
    ))
}

static SCHEMAS: LazyLock<[SchemaRef; 3]> = LazyLock::new(|| {
    [
        schema_of(COLUMN_MAPPING, None),
        schema_of(NAME_MAPPING, None),
        schema_of(DATA_FILE, Some("data_file_id")),
    ]
});

/// The Arrow schema of `table`, as DuckLake defines the table.
#[must_use]
pub fn table_schema(table: CatalogTable) -> SchemaRef {
    let [column_mapping, name_mapping, data_file] = &*SCHEMAS;
    Arc::clone(match table {
        CatalogTable::ColumnMapping => column_mapping,
        CatalogTable::NameMapping => name_mapping,
        CatalogTable::DataFile => data_file,
    })
}

enum Column {
    Int(Int64Builder),
    Text(StringBuilder),
    Bool(BooleanBuilder),
}

impl Column {
    fn new(ty: &DataType, capacity: usize) -> Self {
        match ty {
            DataType::Utf8 => Column::Text(StringBuilder::with_capacity(capacity, capacity * 16)),
            DataType::Boolean => Column::Bool(BooleanBuilder::with_capacity(capacity)),
            _ => Column::Int(Int64Builder::with_capacity(capacity)),
        }
    }

    fn int(&mut self, value: Option<i64>) {
        if let Column::Int(b) = self {
            b.append_option(value);
        }
    }

    fn text(&mut self, value: Option<&str>) {
        if let Column::Text(b) = self {
            b.append_option(value);
        }
    }

    fn bool(&mut self, value: Option<bool>) {
        if let Column::Bool(b) = self {
            b.append_option(value);
        }
    }

    fn finish(&mut self) -> ArrayRef {
        match self {
            Column::Int(b) => Arc::new(b.finish()),
            Column::Text(b) => Arc::new(b.finish()),
            Column::Bool(b) => Arc::new(b.finish()),
        }
    }
}

/// What a builder builds rows of.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Table(CatalogTable),
    /// The join of the two mapping tables ([`super::load`]).
    MappingLoad,
}

/// Builds record batches of one table, with only the projected columns.
pub struct BatchBuilder {
    shape: Shape,
    schema: SchemaRef,
    /// Index into the table's columns of each output column.
    projection: Vec<usize>,
    columns: Vec<Column>,
    rows: usize,
}

impl BatchBuilder {
    /// A builder of `table`'s batches with the columns `projection` (all when `None`).
    ///
    /// # Errors
    /// When a projected index is not a column of the table.
    pub fn new(
        table: CatalogTable,
        projection: Option<&[usize]>,
        capacity: usize,
    ) -> Result<Self, ArrowError> {
        Self::build(Shape::Table(table), projection, capacity)
    }

    /// A builder of the mapping load join's batches ([`super::load`]).
    ///
    /// # Errors
    /// When a projected index is not a column of the join.
    pub fn mapping_load(projection: Option<&[usize]>, capacity: usize) -> Result<Self, ArrowError> {
        Self::build(Shape::MappingLoad, projection, capacity)
    }

    fn build(
        shape: Shape,
        projection: Option<&[usize]>,
        capacity: usize,
    ) -> Result<Self, ArrowError> {
        let full = match shape {
            Shape::Table(table) => table_schema(table),
            Shape::MappingLoad => super::load::mapping_load_schema(),
        };
        let projection: Vec<usize> = match projection {
            Some(p) => p.to_vec(),
            None => (0..full.fields().len()).collect(),
        };
        let schema = Arc::new(full.project(&projection)?);
        let columns = schema
            .fields()
            .iter()
            .map(|f| Column::new(f.data_type(), capacity))
            .collect();
        Ok(Self {
            shape,
            schema,
            projection,
            columns,
            rows: 0,
        })
    }

    /// The schema of the batches built.
    #[must_use]
    pub fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }

    /// Rows appended since the last [`finish`](Self::finish).
    #[must_use]
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Appends the rows of a mapping record: one for `ducklake_column_mapping`, one per
    /// embedded name for `ducklake_name_mapping`.
    pub fn append_mapping(&mut self, mapping: &ColumnMapping) {
        let Shape::Table(table) = self.shape else {
            self.append_load_group(std::slice::from_ref(mapping));
            return;
        };
        match table {
            CatalogTable::ColumnMapping => {
                for (column, &index) in self.columns.iter_mut().zip(&self.projection) {
                    match index {
                        0 => column.int(Some(mapping.mapping_id.0)),
                        1 => column.int(Some(mapping.table_id.0)),
                        _ => column.text(mapping.map_type.as_deref()),
                    }
                }
                self.rows += 1;
            }
            CatalogTable::NameMapping => {
                for name in &mapping.names {
                    for (column, &index) in self.columns.iter_mut().zip(&self.projection) {
                        match index {
                            0 => column.int(Some(mapping.mapping_id.0)),
                            1 => column.int(Some(name.column_id.0)),
                            2 => column.text(Some(&name.source_name)),
                            3 => column.int(Some(name.target_field_id.0)),
                            4 => column.int(name.parent_column.map(|c| c.0)),
                            _ => column.bool(Some(name.is_partition)),
                        }
                    }
                }
                self.rows += mapping.names.len();
            }
            CatalogTable::DataFile => {}
        }
    }

    /// Appends the mapping load rows of `group`, the records of one `mapping_id`, parents
    /// first (`parent_column NULLS FIRST`), then by `column_id`. As in a SQL catalog, whose
    /// name rows carry no `table_id`, every record of the group joins every name row of the
    /// group (one record: its own rows).
    pub fn append_load_group(&mut self, group: &[ColumnMapping]) {
        let mut rows: Vec<(&ColumnMapping, &crate::model::NameMapping)> = group
            .iter()
            .flat_map(|mapping| {
                group
                    .iter()
                    .flat_map(|owner| owner.names.iter())
                    .map(move |name| (mapping, name))
            })
            .collect();
        rows.sort_by_key(|(_, name)| (name.parent_column.map(|c| c.0), name.column_id.0));
        for (mapping, name) in &rows {
            for (column, &index) in self.columns.iter_mut().zip(&self.projection) {
                match index {
                    0 => column.int(Some(mapping.mapping_id.0)),
                    1 => column.int(Some(mapping.table_id.0)),
                    2 => column.text(mapping.map_type.as_deref()),
                    3 => column.int(Some(name.column_id.0)),
                    4 => column.text(Some(&name.source_name)),
                    5 => column.int(Some(name.target_field_id.0)),
                    6 => column.int(name.parent_column.map(|c| c.0)),
                    _ => column.bool(Some(name.is_partition)),
                }
            }
        }
        self.rows += rows.len();
    }

    /// Appends the row of a data file.
    pub fn append_data_file(&mut self, file: &DataFile) {
        for (column, &index) in self.columns.iter_mut().zip(&self.projection) {
            match index {
                0 => column.int(Some(file.data_file_id.0)),
                1 => column.int(Some(file.table_id.0)),
                2 => column.int(file.begin_snapshot),
                3 => column.int(file.end_snapshot),
                4 => column.int(file.file_order),
                5 => column.text(file.path.as_deref()),
                6 => column.bool(file.path_is_relative),
                7 => column.text(file.file_format.as_deref()),
                8 => column.int(file.record_count),
                9 => column.int(file.file_size_bytes),
                10 => column.int(file.footer_size),
                11 => column.int(file.row_id_start),
                12 => column.int(file.partition_id),
                13 => column.text(file.encryption_key.as_deref()),
                14 => column.text(file.partial_file_info.as_deref()),
                _ => column.int(file.mapping_id.map(|m| m.0)),
            }
        }
        self.rows += 1;
    }

    /// The rows appended so far as one batch; the builder starts over empty.
    ///
    /// # Errors
    /// Only on an internal inconsistency of the builders.
    pub fn finish(&mut self) -> Result<RecordBatch, ArrowError> {
        let arrays: Vec<ArrayRef> = self.columns.iter_mut().map(Column::finish).collect();
        let options = RecordBatchOptions::new().with_row_count(Some(self.rows));
        self.rows = 0;
        RecordBatch::try_new_with_options(self.schema(), arrays, &options)
    }
}
