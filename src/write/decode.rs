//! Arrow record batches into staged rows: what ingest, `INSERT` and the one-stream `DoPut`
//! carry, checked column by column against DuckLake's tables.
//!
//! Columns are matched by name. Integer columns of any width are widened to BIGINT (a value
//! that does not fit is an error), string columns of any Arrow string type become VARCHAR, a
//! column of Arrow type `Null` is all NULL; any other type is refused with an error naming the
//! column.

use std::collections::BTreeMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, AsArray as _};
use datafusion::arrow::compute::{CastOptions, cast_with_options};
use datafusion::arrow::datatypes::{DataType, Int64Type, Schema};
use datafusion::arrow::record_batch::RecordBatch;

use super::{Insert, Op};
use crate::error::{Error, Result};
use crate::model::{CatalogTable, ColumnMappingRow, DataFileRow, NameMappingRow};

/// What a stream of rows is in: one of the catalog tables, or rows in the shape of DuckLake's
/// mapping load query (one per name row, the mapping's columns repeated on each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowShape {
    /// A catalog table's own columns.
    Table(CatalogTable),
    /// `mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column,
    /// is_partition`.
    MappingLoad,
}

/// How columns of the target that the stream lacks are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingColumns {
    /// Refused, naming the column (ingest: the stream must carry the whole table).
    Refuse,
    /// NULL (`INSERT INTO t (a, b) ...`).
    Null,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ty {
    Int,
    Text,
    Bool,
}

const COLUMN_MAPPING: &[(&str, Ty)] = &[
    ("mapping_id", Ty::Int),
    ("table_id", Ty::Int),
    ("type", Ty::Text),
];
const NAME_MAPPING: &[(&str, Ty)] = &[
    ("mapping_id", Ty::Int),
    ("column_id", Ty::Int),
    ("source_name", Ty::Text),
    ("target_field_id", Ty::Int),
    ("parent_column", Ty::Int),
    ("is_partition", Ty::Bool),
];
const MAPPING_LOAD: &[(&str, Ty)] = &[
    ("mapping_id", Ty::Int),
    ("table_id", Ty::Int),
    ("type", Ty::Text),
    ("column_id", Ty::Int),
    ("source_name", Ty::Text),
    ("target_field_id", Ty::Int),
    ("parent_column", Ty::Int),
    ("is_partition", Ty::Bool),
];
const DATA_FILE: &[(&str, Ty)] = &[
    ("data_file_id", Ty::Int),
    ("table_id", Ty::Int),
    ("begin_snapshot", Ty::Int),
    ("end_snapshot", Ty::Int),
    ("file_order", Ty::Int),
    ("path", Ty::Text),
    ("path_is_relative", Ty::Bool),
    ("file_format", Ty::Text),
    ("record_count", Ty::Int),
    ("file_size_bytes", Ty::Int),
    ("footer_size", Ty::Int),
    ("row_id_start", Ty::Int),
    ("partition_id", Ty::Int),
    ("encryption_key", Ty::Text),
    ("partial_file_info", Ty::Text),
    ("mapping_id", Ty::Int),
];

impl RowShape {
    fn columns(self) -> &'static [(&'static str, Ty)] {
        match self {
            RowShape::Table(CatalogTable::ColumnMapping) => COLUMN_MAPPING,
            RowShape::Table(CatalogTable::NameMapping) => NAME_MAPPING,
            RowShape::Table(CatalogTable::DataFile) => DATA_FILE,
            RowShape::MappingLoad => MAPPING_LOAD,
        }
    }

    /// The shape's column names, in DuckLake's order.
    pub fn column_names(self) -> impl Iterator<Item = &'static str> {
        self.columns().iter().map(|(name, _)| *name)
    }

    fn describe(self) -> String {
        match self {
            RowShape::Table(table) => table.name().to_owned(),
            RowShape::MappingLoad => "the mapping load shape".to_owned(),
        }
    }
}

/// Decodes the batches of one stream, whose schema it has checked, into rows.
#[derive(Debug)]
pub struct RowDecoder {
    shape: RowShape,
    /// Per column of the shape: its position in the stream, if the stream has it.
    sources: Vec<Option<usize>>,
    rows: DecodedRows,
}

/// Rows decoded so far.
#[derive(Debug)]
enum DecodedRows {
    ColumnMappings(Vec<ColumnMappingRow>),
    NameMappings(Vec<NameMappingRow>),
    DataFiles(Vec<DataFileRow>),
    MappingLoad {
        mappings: BTreeMap<i64, ColumnMappingRow>,
        order: Vec<i64>,
        names: Vec<NameMappingRow>,
    },
}

fn bad(reason: String) -> Error {
    Error::InvalidRequest { reason }
}

impl RowDecoder {
    /// A decoder of streams with `schema` into `shape`.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the column, for a column the shape does not have, a
    /// column of a type that does not convert, a column twice, or (with
    /// [`MissingColumns::Refuse`]) a column the stream lacks.
    pub fn new(shape: RowShape, schema: &Schema, missing: MissingColumns) -> Result<Self> {
        let what = shape.describe();
        let columns = shape.columns();
        let mut sources = vec![None; columns.len()];
        for (position, field) in schema.fields().iter().enumerate() {
            let Some(index) = columns.iter().position(|(name, _)| *name == field.name()) else {
                let hint = columns
                    .iter()
                    .find(|(name, _)| name.eq_ignore_ascii_case(field.name()))
                    .map(|(name, _)| format!(" (did you mean {name}?)"))
                    .unwrap_or_default();
                return Err(bad(format!(
                    "column {} is not a column of {what}{hint}; its columns are {}",
                    field.name(),
                    shape.column_names().collect::<Vec<_>>().join(", ")
                )));
            };
            let Some(slot) = sources.get_mut(index) else {
                continue;
            };
            if slot.is_some() {
                return Err(bad(format!(
                    "column {} appears twice in the stream",
                    field.name()
                )));
            }
            let (name, ty) = columns.get(index).copied().unwrap_or(("", Ty::Int));
            if !accepts(ty, field.data_type()) {
                return Err(bad(format!(
                    "column {name} of {what} is {}, got {} (accepted: {})",
                    sql_type(ty),
                    field.data_type(),
                    accepted(ty)
                )));
            }
            *slot = Some(position);
        }
        if missing == MissingColumns::Refuse {
            let absent: Vec<&str> = columns
                .iter()
                .zip(&sources)
                .filter(|(_, source)| source.is_none())
                .map(|((name, _), _)| *name)
                .collect();
            if !absent.is_empty() {
                return Err(bad(format!(
                    "the stream lacks column{} {} of {what}",
                    if absent.len() == 1 { "" } else { "s" },
                    absent.join(", ")
                )));
            }
        }
        let rows = match shape {
            RowShape::Table(CatalogTable::ColumnMapping) => DecodedRows::ColumnMappings(Vec::new()),
            RowShape::Table(CatalogTable::NameMapping) => DecodedRows::NameMappings(Vec::new()),
            RowShape::Table(CatalogTable::DataFile) => DecodedRows::DataFiles(Vec::new()),
            RowShape::MappingLoad => DecodedRows::MappingLoad {
                mappings: BTreeMap::new(),
                order: Vec::new(),
                names: Vec::new(),
            },
        };
        Ok(Self {
            shape,
            sources,
            rows,
        })
    }

    /// Rows decoded so far.
    #[must_use]
    pub fn rows(&self) -> usize {
        match &self.rows {
            DecodedRows::ColumnMappings(rows) => rows.len(),
            DecodedRows::NameMappings(rows) => rows.len(),
            DecodedRows::DataFiles(rows) => rows.len(),
            DecodedRows::MappingLoad { names, .. } => names.len(),
        }
    }

    /// Decodes one batch of the stream.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the column and row, for a value that does not fit, or
    /// for mapping load rows that disagree on a mapping's `table_id` or `type`.
    pub fn push(&mut self, batch: &RecordBatch) -> Result<()> {
        let columns = self.columns_of(batch)?;
        let n = batch.num_rows();
        match &mut self.rows {
            DecodedRows::ColumnMappings(rows) => rows.extend((0..n).map(|i| ColumnMappingRow {
                mapping_id: columns.int(0, i),
                table_id: columns.int(1, i),
                map_type: columns.text(2, i),
            })),
            DecodedRows::NameMappings(rows) => {
                rows.extend((0..n).map(|i| name_row(&columns, 0, 1, i)));
            }
            DecodedRows::DataFiles(rows) => rows.extend((0..n).map(|i| DataFileRow {
                data_file_id: columns.int(0, i),
                table_id: columns.int(1, i),
                begin_snapshot: columns.int(2, i),
                end_snapshot: columns.int(3, i),
                file_order: columns.int(4, i),
                path: columns.text(5, i),
                path_is_relative: columns.boolean(6, i),
                file_format: columns.text(7, i),
                record_count: columns.int(8, i),
                file_size_bytes: columns.int(9, i),
                footer_size: columns.int(10, i),
                row_id_start: columns.int(11, i),
                partition_id: columns.int(12, i),
                encryption_key: columns.text(13, i),
                partial_file_info: columns.text(14, i),
                mapping_id: columns.int(15, i),
            })),
            DecodedRows::MappingLoad {
                mappings,
                order,
                names,
            } => {
                for i in 0..n {
                    let mapping = ColumnMappingRow {
                        mapping_id: columns.int(0, i),
                        table_id: columns.int(1, i),
                        map_type: columns.text(2, i),
                    };
                    let Some(mapping_id) = mapping.mapping_id else {
                        return Err(bad(format!(
                            "mapping_id is NULL in row {} of the mapping stream",
                            names.len()
                        )));
                    };
                    match mappings.get(&mapping_id) {
                        Some(seen) if *seen != mapping => {
                            return Err(bad(format!(
                                "mapping {mapping_id}: rows disagree on table_id or type ({:?}/{:?} and {:?}/{:?})",
                                seen.table_id, seen.map_type, mapping.table_id, mapping.map_type
                            )));
                        }
                        Some(_) => {}
                        None => {
                            order.push(mapping_id);
                            mappings.insert(mapping_id, mapping);
                        }
                    }
                    names.push(name_row(&columns, 0, 3, i));
                }
            }
        }
        Ok(())
    }

    fn columns_of(&self, batch: &RecordBatch) -> Result<Columns> {
        let options = CastOptions {
            safe: false,
            ..CastOptions::default()
        };
        let mut arrays = Vec::with_capacity(self.sources.len());
        for ((name, ty), source) in self.shape.columns().iter().zip(&self.sources) {
            let Some(array) = source.and_then(|i| batch.columns().get(i)) else {
                arrays.push(None);
                continue;
            };
            if array.data_type() == &DataType::Null {
                arrays.push(None);
                continue;
            }
            let target = match ty {
                Ty::Int => DataType::Int64,
                Ty::Text => DataType::Utf8,
                Ty::Bool => DataType::Boolean,
            };
            let cast: ArrayRef = if array.data_type() == &target {
                Arc::clone(array)
            } else {
                cast_with_options(array, &target, &options).map_err(|err| {
                    bad(format!(
                        "column {name}: a {} value does not fit BIGINT: {err}",
                        array.data_type()
                    ))
                })?
            };
            arrays.push(Some(cast));
        }
        Ok(Columns(arrays))
    }

    /// The staged changes: one insert per table (the mapping load shape gives two, mappings
    /// first).
    #[must_use]
    pub fn into_ops(self) -> Vec<Op> {
        match self.rows {
            DecodedRows::ColumnMappings(rows) => vec![Op::Insert(Insert::ColumnMappings(rows))],
            DecodedRows::NameMappings(rows) => vec![Op::Insert(Insert::NameMappings(rows))],
            DecodedRows::DataFiles(rows) => vec![Op::Insert(Insert::DataFiles(rows))],
            DecodedRows::MappingLoad {
                mut mappings,
                order,
                names,
            } => {
                let mappings = order
                    .into_iter()
                    .filter_map(|id| mappings.remove(&id))
                    .collect();
                vec![
                    Op::Insert(Insert::ColumnMappings(mappings)),
                    Op::Insert(Insert::NameMappings(names)),
                ]
            }
        }
    }
}

/// A name row from `columns`, whose `mapping_id` is column `mapping` and whose other five
/// columns start at `first`.
fn name_row(columns: &Columns, mapping: usize, first: usize, i: usize) -> NameMappingRow {
    NameMappingRow {
        mapping_id: columns.int(mapping, i),
        column_id: columns.int(first, i),
        source_name: columns.text(first + 1, i),
        target_field_id: columns.int(first + 2, i),
        parent_column: columns.int(first + 3, i),
        is_partition: columns.boolean(first + 4, i),
    }
}

/// One batch's columns in the shape's order, converted; `None` for an absent or all-NULL one.
struct Columns(Vec<Option<ArrayRef>>);

impl Columns {
    fn array(&self, column: usize, row: usize) -> Option<&ArrayRef> {
        self.0
            .get(column)
            .and_then(Option::as_ref)
            .filter(|array| array.is_valid(row))
    }

    fn int(&self, column: usize, row: usize) -> Option<i64> {
        self.array(column, row)
            .and_then(|a| a.as_primitive_opt::<Int64Type>())
            .map(|a| a.value(row))
    }

    fn text(&self, column: usize, row: usize) -> Option<String> {
        self.array(column, row)
            .and_then(|a| a.as_string_opt::<i32>())
            .map(|a| a.value(row).to_owned())
    }

    fn boolean(&self, column: usize, row: usize) -> Option<bool> {
        self.array(column, row)
            .and_then(|a| a.as_boolean_opt())
            .map(|a| a.value(row))
    }
}

fn accepts(ty: Ty, data_type: &DataType) -> bool {
    match data_type {
        DataType::Null => true,
        DataType::Dictionary(_, values) => accepts(ty, values),
        _ => match ty {
            Ty::Int => data_type.is_integer(),
            Ty::Text => matches!(
                data_type,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            ),
            Ty::Bool => data_type == &DataType::Boolean,
        },
    }
}

fn sql_type(ty: Ty) -> &'static str {
    match ty {
        Ty::Int => "BIGINT",
        Ty::Text => "VARCHAR",
        Ty::Bool => "BOOLEAN",
    }
}

fn accepted(ty: Ty) -> &'static str {
    match ty {
        Ty::Int => "any Arrow integer type, or null",
        Ty::Text => "utf8, large_utf8 or utf8_view, or null",
        Ty::Bool => "bool, or null",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{
        Float64Array, Int32Array, Int64Array, NullArray, StringArray, UInt64Array,
    };
    use datafusion::arrow::datatypes::Field;

    fn batch(columns: Vec<(&str, ArrayRef)>) -> RecordBatch {
        RecordBatch::try_from_iter(columns).expect("batch")
    }

    #[test]
    fn widens_integers_and_reads_null_columns() {
        let b = batch(vec![
            (
                "table_id",
                Arc::new(Int32Array::from(vec![7, 8])) as ArrayRef,
            ),
            (
                "mapping_id",
                Arc::new(Int64Array::from(vec![Some(1), None])),
            ),
            ("type", Arc::new(NullArray::new(2))),
        ]);
        let mut decoder = RowDecoder::new(
            RowShape::Table(CatalogTable::ColumnMapping),
            &b.schema(),
            MissingColumns::Refuse,
        )
        .expect("schema accepted");
        decoder.push(&b).expect("decoded");
        assert_eq!(
            decoder.into_ops(),
            vec![Op::Insert(Insert::ColumnMappings(vec![
                ColumnMappingRow {
                    mapping_id: Some(1),
                    table_id: Some(7),
                    map_type: None
                },
                ColumnMappingRow {
                    mapping_id: None,
                    table_id: Some(8),
                    map_type: None
                },
            ]))]
        );
    }

    #[test]
    fn refuses_wrong_types_unknown_and_missing_columns_naming_them() {
        let shape = RowShape::Table(CatalogTable::ColumnMapping);
        let wrong = Schema::new(vec![
            Field::new("mapping_id", DataType::Float64, true),
            Field::new("table_id", DataType::Int64, true),
            Field::new("type", DataType::Utf8, true),
        ]);
        let err = RowDecoder::new(shape, &wrong, MissingColumns::Refuse).expect_err("float");
        assert!(err.to_string().contains("column mapping_id"), "{err}");
        assert!(err.to_string().contains("Float64"), "{err}");

        let unknown = Schema::new(vec![Field::new("Mapping_ID", DataType::Int64, true)]);
        let err = RowDecoder::new(shape, &unknown, MissingColumns::Null).expect_err("unknown");
        assert!(err.to_string().contains("did you mean mapping_id"), "{err}");

        let partial = Schema::new(vec![Field::new("mapping_id", DataType::Int64, true)]);
        let err = RowDecoder::new(shape, &partial, MissingColumns::Refuse).expect_err("missing");
        assert!(err.to_string().contains("table_id, type"), "{err}");
        assert!(RowDecoder::new(shape, &partial, MissingColumns::Null).is_ok());
        let _ = Float64Array::from(vec![1.0]);
    }

    #[test]
    fn an_unsigned_value_past_bigint_is_an_error_naming_the_column() {
        let b = batch(vec![
            (
                "mapping_id",
                Arc::new(UInt64Array::from(vec![u64::MAX])) as ArrayRef,
            ),
            ("table_id", Arc::new(Int64Array::from(vec![1]))),
            ("type", Arc::new(StringArray::from(vec!["map_by_name"]))),
        ]);
        let mut decoder = RowDecoder::new(
            RowShape::Table(CatalogTable::ColumnMapping),
            &b.schema(),
            MissingColumns::Refuse,
        )
        .expect("schema accepted");
        let err = decoder.push(&b).expect_err("overflow");
        assert!(err.to_string().contains("column mapping_id"), "{err}");
    }

    #[test]
    fn mapping_load_rows_split_into_mappings_and_name_rows() {
        let b = batch(vec![
            (
                "mapping_id",
                Arc::new(Int64Array::from(vec![5, 5, 9])) as ArrayRef,
            ),
            ("table_id", Arc::new(Int64Array::from(vec![1, 1, 2]))),
            ("type", Arc::new(StringArray::from(vec!["map_by_name"; 3]))),
            ("column_id", Arc::new(Int64Array::from(vec![0, 1, 0]))),
            (
                "source_name",
                Arc::new(StringArray::from(vec!["s", "a", "id"])),
            ),
            ("target_field_id", Arc::new(Int64Array::from(vec![1, 2, 1]))),
            (
                "parent_column",
                Arc::new(Int64Array::from(vec![None, Some(0), None])),
            ),
            (
                "is_partition",
                Arc::new(datafusion::arrow::array::BooleanArray::from(vec![false; 3])),
            ),
        ]);
        let mut decoder =
            RowDecoder::new(RowShape::MappingLoad, &b.schema(), MissingColumns::Refuse)
                .expect("schema accepted");
        decoder.push(&b).expect("decoded");
        let ops = decoder.into_ops();
        let [
            Op::Insert(Insert::ColumnMappings(maps)),
            Op::Insert(Insert::NameMappings(names)),
        ] = ops.as_slice()
        else {
            panic!("two inserts expected, got {ops:?}");
        };
        assert_eq!(
            maps.iter()
                .map(|m| (m.mapping_id, m.table_id))
                .collect::<Vec<_>>(),
            vec![(Some(5), Some(1)), (Some(9), Some(2))]
        );
        assert_eq!(names.len(), 3);
        assert_eq!(names.get(1).and_then(|n| n.parent_column), Some(0));

        let clash = batch(vec![
            (
                "mapping_id",
                Arc::new(Int64Array::from(vec![5, 5])) as ArrayRef,
            ),
            ("table_id", Arc::new(Int64Array::from(vec![1, 2]))),
            ("type", Arc::new(StringArray::from(vec!["map_by_name"; 2]))),
            ("column_id", Arc::new(Int64Array::from(vec![0, 1]))),
            ("source_name", Arc::new(StringArray::from(vec!["s", "a"]))),
            ("target_field_id", Arc::new(Int64Array::from(vec![1, 2]))),
            (
                "parent_column",
                Arc::new(Int64Array::from(vec![None, None])),
            ),
            (
                "is_partition",
                Arc::new(datafusion::arrow::array::BooleanArray::from(vec![false; 2])),
            ),
        ]);
        let mut decoder = RowDecoder::new(
            RowShape::MappingLoad,
            &clash.schema(),
            MissingColumns::Refuse,
        )
        .expect("schema accepted");
        let err = decoder.push(&clash).expect_err("disagreeing rows");
        assert!(err.to_string().contains("mapping 5"), "{err}");
    }
}
