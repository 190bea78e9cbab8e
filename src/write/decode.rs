//! Arrow record batches into staged changes: what ingest, `INSERT` and the one-stream `DoPut`
//! carry, checked column by column against DuckLake's tables and turned into canonical rows
//! (`batch`) once, batch by batch, as the stream is read.
//!
//! Columns are matched by name against the column table of the target ([`RowShape`]). Integer
//! columns of any width are widened to BIGINT (a value that does not fit is an error), string
//! columns of any Arrow string type become VARCHAR, a column of Arrow type `Null` is all NULL;
//! any other type is refused with an error naming the column.

use std::collections::HashMap;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, BooleanArray, UInt32Array, new_null_array};
use datafusion::arrow::compute::{CastOptions, cast_with_options, filter_record_batch, take};
use datafusion::arrow::datatypes::{DataType, Schema};
use datafusion::arrow::record_batch::RecordBatch;

use super::{Insert, Op};
use crate::batch::{Columns, arrow_type, nullable_schema};
use crate::error::{Error, Result};
use crate::kv::NearIds;
use crate::model::{
    CatalogTable, Column, DataFileRow, DuckLakeVersion, SqlType, commit_upload_columns,
    mapping_load_columns,
};

/// What a stream of rows is in: one of the catalog tables, rows in the shape of DuckLake's
/// mapping load query (one per name row, the mapping's columns repeated on each), or a whole
/// commit (load rows and data-file rows in one stream).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowShape {
    /// A catalog table's own columns.
    Table(CatalogTable),
    /// `mapping_id, table_id, type, column_id, source_name, target_field_id, parent_column,
    /// is_partition`.
    MappingLoad,
    /// The mapping load's columns and the data file's: a row with a `data_file_id` is a data
    /// file, any other a name row of the load.
    Commit,
}

/// How columns of the target that the stream lacks are treated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MissingColumns {
    /// Refused, naming the column (ingest: the stream must carry the whole table).
    Refuse,
    /// NULL (`INSERT INTO t (a, b) ...`, and the columns of the other kind of row in a commit
    /// upload).
    Null,
}

impl RowShape {
    /// The shape's columns, in order.
    #[must_use]
    pub fn columns(self) -> &'static [Column] {
        match self {
            RowShape::Table(table) => table.columns(),
            RowShape::MappingLoad => mapping_load_columns(),
            RowShape::Commit => commit_upload_columns(),
        }
    }

    /// The shape's column names, in DuckLake's order.
    pub fn column_names(self) -> impl Iterator<Item = &'static str> {
        self.columns().iter().map(|c| c.name)
    }

    /// Whether a stream of this shape in DuckLake `version` may carry column `column` (one
    /// of [`columns`](Self::columns)): every column but the data file's of other versions.
    #[must_use]
    pub fn serves(self, version: DuckLakeVersion, column: &Column) -> bool {
        match self {
            RowShape::Table(CatalogTable::DataFile) | RowShape::Commit => {
                version.has_data_file_column(column.name)
            }
            RowShape::Table(_) | RowShape::MappingLoad => true,
        }
    }

    /// The names of the columns a stream of this shape carries in DuckLake `version`.
    fn served_names(self, version: DuckLakeVersion) -> String {
        let columns: Vec<&str> = match self {
            RowShape::Table(table) => version.columns(table).iter().map(|c| c.name).collect(),
            _ => self
                .columns()
                .iter()
                .filter(|c| self.serves(version, c))
                .map(|c| c.name)
                .collect(),
        };
        columns.join(", ")
    }

    fn describe(self) -> String {
        match self {
            RowShape::Table(table) => table.name().to_owned(),
            RowShape::MappingLoad => "the mapping load shape".to_owned(),
            RowShape::Commit => "the commit upload shape".to_owned(),
        }
    }
}

/// Decodes the batches of one stream, whose schema it has checked, into changes.
#[derive(Debug)]
pub struct RowDecoder {
    shape: RowShape,
    /// Per column of the shape: its position in the stream, if the stream has it.
    sources: Vec<Option<usize>>,
    /// The mappings of a load or commit stream seen in earlier rows: their `table_id` and
    /// `type`, which every later row of the mapping must repeat.
    seen: HashMap<i64, (Option<i64>, Option<String>), NearIds>,
    rows: usize,
}

fn bad(reason: String) -> Error {
    Error::InvalidRequest { reason }
}

impl RowDecoder {
    /// A decoder of streams with `schema` into `shape`, as DuckLake `version` shapes it.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the column, for a column the shape does not have
    /// (naming the DuckLake version that has it, for a data file column of another version),
    /// a column of a type that does not convert, a column twice, or (with
    /// [`MissingColumns::Refuse`]) a column the stream lacks.
    pub fn new(
        shape: RowShape,
        version: DuckLakeVersion,
        schema: &Schema,
        missing: MissingColumns,
    ) -> Result<Self> {
        let what = shape.describe();
        let columns = shape.columns();
        let mut sources = vec![None; columns.len()];
        for (position, field) in schema.fields().iter().enumerate() {
            let found = columns.iter().position(|c| c.name == field.name());
            if let Some(column) = found.and_then(|i| columns.get(i))
                && !shape.serves(version, column)
            {
                let other = version
                    .other_with_data_file_column(column.name)
                    .map_or_else(String::new, |v| format!("DuckLake {v}'s "));
                return Err(bad(format!(
                    "column {} is a column of {other}ducklake_data_file, not of DuckLake \
                     {version}'s, the version this deployment serves; the columns of {what} \
                     in DuckLake {version} are {}",
                    column.name,
                    shape.served_names(version)
                )));
            }
            let Some(index) = found else {
                let hint = columns
                    .iter()
                    .filter(|c| shape.serves(version, c))
                    .find(|c| c.name.eq_ignore_ascii_case(field.name()))
                    .map(|c| format!(" (did you mean {}?)", c.name))
                    .unwrap_or_default();
                return Err(bad(format!(
                    "column {} is not a column of {what}{hint}; its columns are {}",
                    field.name(),
                    shape.served_names(version)
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
            let Some(column) = columns.get(index) else {
                continue;
            };
            if !accepts(column.ty, field.data_type()) {
                return Err(bad(format!(
                    "column {} of {what} is {}, got {} (accepted: {})",
                    column.name,
                    column.ty,
                    field.data_type(),
                    accepted(column.ty)
                )));
            }
            *slot = Some(position);
        }
        if missing == MissingColumns::Refuse && shape != RowShape::Commit {
            let absent: Vec<&str> = columns
                .iter()
                .zip(&sources)
                .filter(|(c, source)| source.is_none() && shape.serves(version, c))
                .map(|(c, _)| c.name)
                .collect();
            if !absent.is_empty() {
                let served = if shape == RowShape::Table(CatalogTable::DataFile) {
                    format!(" in DuckLake {version}, the version this deployment serves")
                } else {
                    String::new()
                };
                return Err(bad(format!(
                    "the stream lacks column{} {} of {what}{served}",
                    if absent.len() == 1 { "" } else { "s" },
                    absent.join(", ")
                )));
            }
        }
        Ok(Self {
            shape,
            sources,
            seen: HashMap::default(),
            rows: 0,
        })
    }

    /// Rows decoded so far.
    #[must_use]
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// The changes one batch of the stream makes: one insert per table it holds rows of,
    /// mappings before name rows before data files.
    ///
    /// # Errors
    /// [`Error::InvalidRequest`] naming the column and row, for a value that does not fit, or
    /// for mapping load rows that disagree on a mapping's `table_id` or `type`.
    pub fn decode(&mut self, batch: &RecordBatch) -> Result<Vec<Op>> {
        let rows = self.canonical(batch)?;
        self.rows += rows.num_rows();
        if rows.num_rows() == 0 {
            return Ok(Vec::new());
        }
        match self.shape {
            RowShape::Table(table) => Ok(vec![Op::Insert(Insert::new(table, rows)?)]),
            RowShape::MappingLoad => self.load_ops(&rows),
            RowShape::Commit => {
                let (loads, file_rows) = split_commit(&rows)?;
                let mut ops = self.load_ops(&loads)?;
                if file_rows.num_rows() > 0 {
                    ops.push(Op::Insert(Insert::new(
                        CatalogTable::DataFile,
                        project(&file_rows, self.shape, DataFileRow::COLUMNS)?,
                    )?));
                }
                Ok(ops)
            }
        }
    }

    /// The batch's columns in the shape's order, converted; absent columns all NULL.
    fn canonical(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        let options = CastOptions {
            safe: false,
            ..CastOptions::default()
        };
        let columns = self.shape.columns();
        let mut arrays: Vec<ArrayRef> = Vec::with_capacity(columns.len());
        for (column, source) in columns.iter().zip(&self.sources) {
            let target = arrow_type(column.ty);
            let array = match source.and_then(|i| batch.columns().get(i)) {
                None => new_null_array(&target, batch.num_rows()),
                Some(array) if array.data_type() == &DataType::Null => {
                    new_null_array(&target, batch.num_rows())
                }
                Some(array) if array.data_type() == &target => Arc::clone(array),
                Some(array) => cast_with_options(array, &target, &options).map_err(|err| {
                    bad(format!(
                        "column {}: a {} value does not fit {}: {err}",
                        column.name,
                        array.data_type(),
                        column.ty
                    ))
                })?,
            };
            arrays.push(array);
        }
        RecordBatch::try_new(nullable_schema(columns), arrays).map_err(arrow_error)
    }

    /// The inserts of canonical rows of the load shape (or of a commit upload's load rows):
    /// the mappings not seen before, then every name row.
    fn load_ops(&mut self, rows: &RecordBatch) -> Result<Vec<Op>> {
        if rows.num_rows() == 0 {
            return Ok(Vec::new());
        }
        let shape = self.shape;
        let load = project(rows, shape, mapping_load_columns())?;
        let view = Columns::new(&load, mapping_load_columns()).map_err(arrow_error)?;
        let mut first_rows: Vec<u32> = Vec::new();
        for row in 0..view.len() {
            let Some(mapping_id) = view.int(0, row) else {
                return Err(bad(format!(
                    "mapping_id is NULL in row {} of the mapping stream",
                    self.rows - rows.num_rows() + row
                )));
            };
            let here = (view.int(1, row), view.text(2, row));
            match self.seen.get(&mapping_id) {
                Some((table_id, map_type)) if (*table_id, map_type.as_deref()) != here => {
                    return Err(bad(format!(
                        "mapping {mapping_id}: rows disagree on table_id or type ({table_id:?}/{map_type:?} and {:?}/{:?})",
                        here.0, here.1
                    )));
                }
                Some(_) => {}
                None => {
                    self.seen
                        .insert(mapping_id, (here.0, here.1.map(str::to_owned)));
                    first_rows.push(
                        u32::try_from(row)
                            .map_err(|_| bad("a batch of more than 2^32 rows".into()))?,
                    );
                }
            }
        }
        let mut ops = Vec::with_capacity(2);
        if !first_rows.is_empty() {
            let indices = UInt32Array::from(first_rows);
            let mappings = project(
                &load,
                RowShape::MappingLoad,
                CatalogTable::ColumnMapping.columns(),
            )?;
            let arrays = mappings
                .columns()
                .iter()
                .map(|array| take(array, &indices, None))
                .collect::<Result<Vec<_>, _>>()
                .map_err(arrow_error)?;
            let mappings = RecordBatch::try_new(mappings.schema(), arrays).map_err(arrow_error)?;
            ops.push(Op::Insert(Insert::new(
                CatalogTable::ColumnMapping,
                mappings,
            )?));
        }
        ops.push(Op::Insert(Insert::new(
            CatalogTable::NameMapping,
            project(
                &load,
                RowShape::MappingLoad,
                CatalogTable::NameMapping.columns(),
            )?,
        )?));
        Ok(ops)
    }
}

/// A commit upload's canonical rows split into its mapping load rows and its data file rows
/// (those with a `data_file_id`), each in order: slices of `rows` when the rows of each kind
/// are one run (as a client sends them, a batch per kind, or loads then files), else
/// filtered copies.
fn split_commit(rows: &RecordBatch) -> Result<(RecordBatch, RecordBatch)> {
    let data_file_id = rows
        .columns()
        .get(column_of(RowShape::Commit, "data_file_id"))
        .ok_or_else(|| bad("the commit shape has no data_file_id".into()))?;
    let len = rows.num_rows();
    let Some(nulls) = data_file_id.logical_nulls() else {
        return Ok((rows.slice(0, 0), rows.clone()));
    };
    // Set where a row is a data file's.
    let files = nulls.inner();
    let mut runs = files.set_slices();
    match (runs.next(), runs.next()) {
        (None, _) => return Ok((rows.clone(), rows.slice(0, 0))),
        (Some((0, end)), None) => return Ok((rows.slice(end, len - end), rows.slice(0, end))),
        (Some((start, end)), None) if end == len => {
            return Ok((rows.slice(0, start), rows.slice(start, end - start)));
        }
        _ => {}
    }
    let files = BooleanArray::new(files.clone(), None);
    let loads = datafusion::arrow::compute::not(&files).map_err(arrow_error)?;
    Ok((
        filter_record_batch(rows, &loads).map_err(arrow_error)?,
        filter_record_batch(rows, &files).map_err(arrow_error)?,
    ))
}

/// The position of column `name` in `shape`.
fn column_of(shape: RowShape, name: &str) -> usize {
    shape
        .columns()
        .iter()
        .position(|c| c.name == name)
        .unwrap_or_default()
}

/// `columns` of a canonical batch of `shape`, by name, as a canonical batch of `columns`.
fn project(rows: &RecordBatch, shape: RowShape, columns: &'static [Column]) -> Result<RecordBatch> {
    let arrays = columns
        .iter()
        .map(|c| {
            rows.columns()
                .get(column_of(shape, c.name))
                .cloned()
                .ok_or_else(|| bad(format!("{} has no column {}", shape.describe(), c.name)))
        })
        .collect::<Result<Vec<_>>>()?;
    RecordBatch::try_new(nullable_schema(columns), arrays).map_err(arrow_error)
}

#[expect(
    clippy::needless_pass_by_value,
    reason = "shaped for `map_err`; the error ends here"
)]
fn arrow_error(err: datafusion::arrow::error::ArrowError) -> Error {
    bad(format!("the rows do not convert: {err}"))
}

fn accepts(ty: SqlType, data_type: &DataType) -> bool {
    match data_type {
        DataType::Null => true,
        DataType::Dictionary(_, values) => accepts(ty, values),
        _ => match ty {
            SqlType::BigInt => data_type.is_integer(),
            SqlType::Varchar => matches!(
                data_type,
                DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View
            ),
            SqlType::Boolean => data_type == &DataType::Boolean,
        },
    }
}

fn accepted(ty: SqlType) -> &'static str {
    match ty {
        SqlType::BigInt => "any Arrow integer type, or null",
        SqlType::Varchar => "utf8, large_utf8 or utf8_view, or null",
        SqlType::Boolean => "bool, or null",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{ColumnMappingRow, NameMappingRow};
    use datafusion::arrow::array::{Int32Array, Int64Array, NullArray, StringArray, UInt64Array};
    use datafusion::arrow::datatypes::Field;

    const V03: DuckLakeVersion = DuckLakeVersion::V0_3;

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
            V03,
            &b.schema(),
            MissingColumns::Refuse,
        )
        .expect("schema accepted");
        assert_eq!(
            decoder.decode(&b).expect("decoded"),
            vec![Op::Insert(Insert::column_mappings(&[
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
        let err = RowDecoder::new(shape, V03, &wrong, MissingColumns::Refuse).expect_err("float");
        assert!(err.to_string().contains("column mapping_id"), "{err}");
        assert!(err.to_string().contains("Float64"), "{err}");

        let unknown = Schema::new(vec![Field::new("Mapping_ID", DataType::Int64, true)]);
        let err = RowDecoder::new(shape, V03, &unknown, MissingColumns::Null).expect_err("unknown");
        assert!(err.to_string().contains("did you mean mapping_id"), "{err}");

        let partial = Schema::new(vec![Field::new("mapping_id", DataType::Int64, true)]);
        let err =
            RowDecoder::new(shape, V03, &partial, MissingColumns::Refuse).expect_err("missing");
        assert!(err.to_string().contains("table_id, type"), "{err}");
        assert!(RowDecoder::new(shape, V03, &partial, MissingColumns::Null).is_ok());
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
            V03,
            &b.schema(),
            MissingColumns::Refuse,
        )
        .expect("schema accepted");
        let err = decoder.decode(&b).expect_err("overflow");
        assert!(err.to_string().contains("column mapping_id"), "{err}");
    }

    #[test]
    #[expect(clippy::too_many_lines, reason = "the expected rows, spelled out")]
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
        let mut decoder = RowDecoder::new(
            RowShape::MappingLoad,
            V03,
            &b.schema(),
            MissingColumns::Refuse,
        )
        .expect("schema accepted");
        let ops = decoder.decode(&b).expect("decoded");
        assert_eq!(
            ops,
            vec![
                Op::Insert(Insert::column_mappings(&[
                    ColumnMappingRow {
                        mapping_id: Some(5),
                        table_id: Some(1),
                        map_type: Some("map_by_name".into()),
                    },
                    ColumnMappingRow {
                        mapping_id: Some(9),
                        table_id: Some(2),
                        map_type: Some("map_by_name".into()),
                    },
                ])),
                Op::Insert(Insert::name_mappings(&[
                    NameMappingRow {
                        mapping_id: Some(5),
                        column_id: Some(0),
                        source_name: Some("s".into()),
                        target_field_id: Some(1),
                        parent_column: None,
                        is_partition: Some(false),
                    },
                    NameMappingRow {
                        mapping_id: Some(5),
                        column_id: Some(1),
                        source_name: Some("a".into()),
                        target_field_id: Some(2),
                        parent_column: Some(0),
                        is_partition: Some(false),
                    },
                    NameMappingRow {
                        mapping_id: Some(9),
                        column_id: Some(0),
                        source_name: Some("id".into()),
                        target_field_id: Some(1),
                        parent_column: None,
                        is_partition: Some(false),
                    },
                ])),
            ]
        );
        // The same mappings in a later batch of the stream are not inserted again.
        let again = decoder.decode(&b).expect("decoded");
        assert!(
            matches!(again.as_slice(), [Op::Insert(names)] if names.table() == CatalogTable::NameMapping),
            "{again:?}"
        );

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
            V03,
            &clash.schema(),
            MissingColumns::Refuse,
        )
        .expect("schema accepted");
        let err = decoder.decode(&clash).expect_err("disagreeing rows");
        assert!(err.to_string().contains("mapping 5"), "{err}");
    }

    /// The ops of a commit upload of `rows`, each `(is a file, id)`: a load row of mapping
    /// 5's column `id`, or file `id` of mapping 5.
    fn commit_upload(rows: &[(bool, i64)]) -> Vec<Op> {
        let load = |f: fn(i64) -> Option<i64>| {
            Arc::new(Int64Array::from(
                rows.iter()
                    .map(|&(file, id)| if file { None } else { f(id) })
                    .collect::<Vec<_>>(),
            )) as ArrayRef
        };
        let text = |f: fn(i64) -> String| {
            Arc::new(StringArray::from(
                rows.iter()
                    .map(|&(file, id)| (!file).then(|| f(id)))
                    .collect::<Vec<_>>(),
            )) as ArrayRef
        };
        let b = batch(vec![
            (
                "mapping_id",
                Arc::new(Int64Array::from(vec![5; rows.len()])),
            ),
            ("table_id", Arc::new(Int64Array::from(vec![1; rows.len()]))),
            ("type", text(|_| "map_by_name".into())),
            ("column_id", load(Some)),
            ("source_name", text(|id| format!("c{id}"))),
            ("target_field_id", load(|id| Some(id + 1))),
            ("parent_column", load(|_| None)),
            (
                "is_partition",
                Arc::new(datafusion::arrow::array::BooleanArray::from(
                    rows.iter()
                        .map(|&(file, _)| (!file).then_some(false))
                        .collect::<Vec<_>>(),
                )),
            ),
            (
                "data_file_id",
                Arc::new(Int64Array::from(
                    rows.iter()
                        .map(|&(file, id)| file.then_some(id))
                        .collect::<Vec<_>>(),
                )),
            ),
        ]);
        let mut decoder = RowDecoder::new(RowShape::Commit, V03, &b.schema(), MissingColumns::Null)
            .expect("schema accepted");
        decoder.decode(&b).expect("decoded")
    }

    /// The ops [`commit_upload`] should give: mapping 5 with the name rows of columns
    /// `loads`, then the files `files`, each in that order.
    fn commit_ops(loads: &[i64], files: &[i64]) -> Vec<Op> {
        let mut ops = Vec::new();
        if !loads.is_empty() {
            ops.push(Op::Insert(Insert::column_mappings(&[ColumnMappingRow {
                mapping_id: Some(5),
                table_id: Some(1),
                map_type: Some("map_by_name".into()),
            }])));
            let names: Vec<NameMappingRow> = loads
                .iter()
                .map(|&id| NameMappingRow {
                    mapping_id: Some(5),
                    column_id: Some(id),
                    source_name: Some(format!("c{id}")),
                    target_field_id: Some(id + 1),
                    parent_column: None,
                    is_partition: Some(false),
                })
                .collect();
            ops.push(Op::Insert(Insert::name_mappings(&names)));
        }
        if !files.is_empty() {
            let files: Vec<DataFileRow> = files
                .iter()
                .map(|&id| DataFileRow {
                    data_file_id: Some(id),
                    table_id: Some(1),
                    mapping_id: Some(5),
                    ..DataFileRow::default()
                })
                .collect();
            ops.push(Op::Insert(Insert::data_files(&files)));
        }
        ops
    }

    /// A commit upload's rows, loads and data files, in one run each (either first), mixed,
    /// or of one kind only: each arrangement decodes to its load rows' inserts, then its
    /// files', in the order the rows came.
    #[test]
    fn a_commit_upload_splits_into_its_loads_and_files_however_they_are_arranged() {
        let (l0, l1, f7, f8) = ((false, 0), (false, 1), (true, 7), (true, 8));
        for (rows, loads, files) in [
            (vec![l0, l1, f7, f8], &[0, 1][..], &[7, 8][..]),
            (vec![f7, f8, l0, l1], &[0, 1], &[7, 8]),
            (vec![l0, f7, l1, f8], &[0, 1], &[7, 8]),
            (vec![f8, l1, l0, f7], &[1, 0], &[8, 7]),
            (vec![l1, l0], &[1, 0], &[]),
            (vec![f8, f7], &[], &[8, 7]),
        ] {
            assert_eq!(commit_upload(&rows), commit_ops(loads, files), "{rows:?}");
        }
    }

    #[test]
    fn commit_uploads_carry_the_data_file_columns_of_the_served_version() {
        let b = batch(vec![
            (
                "data_file_id",
                Arc::new(Int64Array::from(vec![3])) as ArrayRef,
            ),
            ("table_id", Arc::new(Int64Array::from(vec![1]))),
            ("partial_max", Arc::new(Int64Array::from(vec![17]))),
            ("row_group_count", Arc::new(Int32Array::from(vec![2]))),
        ]);
        let mut decoder = RowDecoder::new(
            RowShape::Commit,
            DuckLakeVersion::V1_1,
            &b.schema(),
            MissingColumns::Null,
        )
        .expect("1.1's columns");
        assert_eq!(
            decoder.decode(&b).expect("decoded"),
            vec![Op::Insert(Insert::data_files(&[DataFileRow {
                data_file_id: Some(3),
                table_id: Some(1),
                partial_max: Some(17),
                row_group_count: Some(2),
                ..DataFileRow::default()
            }]))]
        );
        for version in [DuckLakeVersion::V0_3, DuckLakeVersion::V1_0] {
            let err = RowDecoder::new(RowShape::Commit, version, &b.schema(), MissingColumns::Null)
                .expect_err("a later version's column");
            let message = err.to_string();
            let named = if version == DuckLakeVersion::V0_3 {
                "column partial_max is a column of DuckLake 1.0's"
            } else {
                "column row_group_count is a column of DuckLake 1.1's"
            };
            assert!(message.contains(named), "{version}: {message}");
            assert!(
                message.contains(&format!("DuckLake {version}")),
                "{message}"
            );
        }
    }
}
