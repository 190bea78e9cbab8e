//! The catalog tables as Arrow: schemas derived from the column tables of [`crate::model`],
//! builders that take [`Cell`]s, and typed access to the columns of canonical batches.
//!
//! A batch is *canonical* for a list of columns when it has exactly those columns, in order,
//! with their Arrow types (BIGINT → Int64, VARCHAR → Utf8, BOOLEAN → Boolean). The write path
//! turns whatever clients send into canonical batches once (`write::decode`); the
//! read path builds canonical batches of the projected columns.

use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use datafusion::arrow::array::builder::NullBufferBuilder;
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray as _, BooleanArray, BooleanBufferBuilder, Int64Array, StringArray,
};
use datafusion::arrow::buffer::{Buffer, OffsetBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};

use crate::model::{CatalogTable, Cell, Column, DuckLakeVersion, SqlType, mapping_load_columns};

/// Positions of `ducklake_column_mapping`'s columns in its canonical batches.
pub(crate) mod column_mapping {
    pub(crate) const MAPPING_ID: usize = 0;
    pub(crate) const TABLE_ID: usize = 1;
    pub(crate) const TYPE: usize = 2;
}

/// Positions of `ducklake_name_mapping`'s columns in its canonical batches.
pub(crate) mod name_mapping {
    pub(crate) const MAPPING_ID: usize = 0;
    pub(crate) const COLUMN_ID: usize = 1;
    pub(crate) const SOURCE_NAME: usize = 2;
    pub(crate) const TARGET_FIELD_ID: usize = 3;
    pub(crate) const PARENT_COLUMN: usize = 4;
    pub(crate) const IS_PARTITION: usize = 5;
}

/// Positions of `ducklake_data_file`'s columns in its canonical batches.
pub(crate) mod data_file {
    pub(crate) const DATA_FILE_ID: usize = 0;
    pub(crate) const TABLE_ID: usize = 1;
    pub(crate) const END_SNAPSHOT: usize = 3;
    pub(crate) const MAPPING_ID: usize = 15;
}

/// The Arrow type of a SQL type.
#[must_use]
pub fn arrow_type(ty: SqlType) -> DataType {
    match ty {
        SqlType::BigInt => DataType::Int64,
        SqlType::Varchar => DataType::Utf8,
        SqlType::Boolean => DataType::Boolean,
    }
}

/// The Arrow schema of `columns`.
#[must_use]
pub fn schema_of(columns: &[Column]) -> SchemaRef {
    Arc::new(Schema::new(
        columns
            .iter()
            .map(|c| Field::new(c.name, arrow_type(c.ty), c.nullable))
            .collect::<Vec<_>>(),
    ))
}

/// The Arrow schema of `columns` with every column nullable: rows as received, before
/// validation has refused NULL keys.
#[must_use]
pub fn nullable_schema_of(columns: &[Column]) -> SchemaRef {
    Arc::new(Schema::new(
        columns
            .iter()
            .map(|c| Field::new(c.name, arrow_type(c.ty), true))
            .collect::<Vec<_>>(),
    ))
}

/// [`nullable_schema_of`] a static list of columns, built once per list: the write path asks
/// for it for every batch it decodes, and building one allocates each field and its name.
#[must_use]
pub fn nullable_schema(columns: &'static [Column]) -> SchemaRef {
    // A static list never moves: where it is and how long it is name it. The lists are the
    // model's few column tables, so this holds a handful of schemas.
    static BUILT: Mutex<Vec<((usize, usize), SchemaRef)>> = Mutex::new(Vec::new());
    let key = (columns.as_ptr().addr(), columns.len());
    let mut built = BUILT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some((_, schema)) = built.iter().find(|(at, _)| *at == key) {
        return Arc::clone(schema);
    }
    let schema = nullable_schema_of(columns);
    built.push((key, Arc::clone(&schema)));
    schema
}

static TABLE_SCHEMAS: LazyLock<[SchemaRef; 3]> =
    LazyLock::new(|| CatalogTable::ALL.map(|table| schema_of(table.columns())));

/// The Arrow schema of `table`, as DuckLake defines the table.
#[must_use]
pub fn table_schema(table: CatalogTable) -> SchemaRef {
    let [column_mapping, name_mapping, data_file] = &*TABLE_SCHEMAS;
    Arc::clone(match table {
        CatalogTable::ColumnMapping => column_mapping,
        CatalogTable::NameMapping => name_mapping,
        CatalogTable::DataFile => data_file,
    })
}

/// The Arrow schema of `table` as DuckLake `version` defines it: what the deployment serves
/// and accepts (only `ducklake_data_file` differs between versions).
#[must_use]
pub fn served_schema(version: DuckLakeVersion, table: CatalogTable) -> SchemaRef {
    static DATA_FILE: LazyLock<[SchemaRef; 3]> = LazyLock::new(|| {
        DuckLakeVersion::ALL.map(|v| schema_of(v.columns(CatalogTable::DataFile)))
    });
    match (table, DATA_FILE.get(version as usize)) {
        (CatalogTable::DataFile, Some(schema)) => Arc::clone(schema),
        _ => table_schema(table),
    }
}

/// The Arrow schema of DuckLake's mapping load (the join of the two mapping tables).
#[must_use]
pub fn mapping_load_schema() -> SchemaRef {
    static SCHEMA: LazyLock<SchemaRef> = LazyLock::new(|| schema_of(mapping_load_columns()));
    Arc::clone(&SCHEMA)
}

/// A VARCHAR column built from bytes; their UTF-8 is checked once, for the whole column,
/// when it is finished (checking each short string on its own costs more than reading it).
#[derive(Debug)]
pub struct TextBuilder {
    /// Arrow's offsets, as they will be handed over.
    offsets: Vec<i32>,
    values: Vec<u8>,
    nulls: NullBufferBuilder,
    /// Whether the values outgrew what `i32` offsets address.
    overflow: bool,
}

impl TextBuilder {
    /// A builder with room for `rows` values of `bytes` bytes in all.
    #[must_use]
    pub fn with_capacity(rows: usize, bytes: usize) -> Self {
        let mut offsets = Vec::with_capacity(rows + 1);
        offsets.push(0);
        Self {
            offsets,
            values: Vec::with_capacity(bytes),
            nulls: NullBufferBuilder::new(rows),
            overflow: false,
        }
    }

    /// The offset of the end of the values, as Arrow holds it.
    #[inline]
    fn end(&mut self) -> i32 {
        i32::try_from(self.values.len()).unwrap_or_else(|_| {
            self.overflow = true;
            i32::MAX
        })
    }

    /// A value's bytes and offset; its validity is the caller's to mark.
    #[inline]
    fn push_bytes(&mut self, value: &[u8]) {
        self.values.extend_from_slice(value);
        let end = self.end();
        self.offsets.push(end);
    }

    /// Appends a value.
    #[inline]
    pub fn append(&mut self, value: &[u8]) {
        self.push_bytes(value);
        self.nulls.append_non_null();
    }

    /// Appends values, none of them NULL.
    #[inline]
    pub fn extend<'a>(&mut self, values: impl ExactSizeIterator<Item = &'a [u8]>) {
        let n = values.len();
        self.offsets.reserve(n);
        values.for_each(|value| self.push_bytes(value));
        self.nulls.append_n_non_nulls(n);
    }

    /// Appends `value` (or NULL) `n` times.
    #[inline]
    pub fn append_n(&mut self, value: Option<&[u8]>, n: usize) {
        let Some(value) = value else {
            let end = self.end();
            self.offsets.extend(std::iter::repeat_n(end, n));
            self.nulls.append_n_nulls(n);
            return;
        };
        self.values.reserve(value.len().saturating_mul(n));
        self.offsets.reserve(n);
        for _ in 0..n {
            self.push_bytes(value);
        }
        self.nulls.append_n_non_nulls(n);
    }

    /// Appends NULL.
    #[inline]
    pub fn append_null(&mut self) {
        let end = self.end();
        self.offsets.push(end);
        self.nulls.append_null();
    }

    /// The values appended so far; the builder starts over empty, with room for the values
    /// and bytes it just held and [a little more](with_slack) when `keep_room` (another
    /// batch, most likely of the same size, follows).
    fn finish_with_room(&mut self, keep_room: bool) -> Result<ArrayRef, ArrowError> {
        let next = Self::with_capacity(
            next_room(self.offsets.len() - 1, keep_room),
            next_room(self.values.len(), keep_room),
        );
        let Self {
            offsets,
            values,
            mut nulls,
            overflow,
        } = std::mem::replace(self, next);
        if overflow {
            return Err(ArrowError::ComputeError(
                "a string column over 2 GiB".into(),
            ));
        }
        let nulls = nulls.finish();
        Ok(Arc::new(StringArray::try_new(
            OffsetBuffer::new(ScalarBuffer::from(offsets)),
            Buffer::from(values),
            nulls,
        )?))
    }
}

/// A BIGINT column: the values in a plain vector, so that a run of them is appended in one
/// pass (Arrow's `Int64Builder` takes them one call at a time).
#[derive(Debug)]
pub struct IntBuilder {
    values: Vec<i64>,
    nulls: NullBufferBuilder,
}

impl IntBuilder {
    /// A builder with room for `rows` values.
    #[must_use]
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            values: Vec::with_capacity(rows),
            nulls: NullBufferBuilder::new(rows),
        }
    }

    /// Appends a value, or NULL.
    #[inline]
    pub fn append(&mut self, value: Option<i64>) {
        self.values.push(value.unwrap_or_default());
        self.nulls.append(value.is_some());
    }

    /// Appends `value` `n` times.
    #[inline]
    pub fn append_n(&mut self, value: i64, n: usize) {
        self.values.extend(std::iter::repeat_n(value, n));
        self.nulls.append_n_non_nulls(n);
    }

    /// Appends values, none of them NULL.
    #[inline]
    pub fn extend(&mut self, values: impl ExactSizeIterator<Item = i64>) {
        let n = values.len();
        self.values.extend(values);
        self.nulls.append_n_non_nulls(n);
    }

    /// Appends values and NULLs; each run of values, or of NULLs, marks its validity at once.
    #[inline]
    pub fn extend_options(&mut self, values: impl Iterator<Item = Option<i64>>) {
        let mut run = (true, 0);
        for value in values {
            self.values.push(value.unwrap_or_default());
            if value.is_some() != run.0 {
                self.mark(run);
                run = (value.is_some(), 0);
            }
            run.1 += 1;
        }
        self.mark(run);
    }

    fn mark(&mut self, (valid, n): (bool, usize)) {
        if valid {
            self.nulls.append_n_non_nulls(n);
        } else {
            self.nulls.append_n_nulls(n);
        }
    }

    fn finish_with_room(&mut self, keep_room: bool) -> ArrayRef {
        let rows = next_room(self.values.len(), keep_room);
        let Self { values, mut nulls } = std::mem::replace(self, Self::with_capacity(rows));
        Arc::new(Int64Array::new(ScalarBuffer::from(values), nulls.finish()))
    }
}

/// A BOOLEAN column.
#[derive(Debug)]
pub struct BoolBuilder {
    values: BooleanBufferBuilder,
    nulls: NullBufferBuilder,
}

impl BoolBuilder {
    /// A builder with room for `rows` values.
    #[must_use]
    pub fn with_capacity(rows: usize) -> Self {
        Self {
            values: BooleanBufferBuilder::new(rows),
            nulls: NullBufferBuilder::new(rows),
        }
    }

    /// Appends a value, or NULL.
    #[inline]
    pub fn append(&mut self, value: Option<bool>) {
        self.values.append(value.unwrap_or_default());
        self.nulls.append(value.is_some());
    }

    /// Appends values, none of them NULL.
    #[inline]
    pub fn extend(&mut self, values: impl ExactSizeIterator<Item = bool>) {
        let n = values.len();
        values.for_each(|value| self.values.append(value));
        self.nulls.append_n_non_nulls(n);
    }

    fn finish_with_room(&mut self, keep_room: bool) -> ArrayRef {
        let rows = next_room(self.values.len(), keep_room);
        let Self {
            mut values,
            mut nulls,
        } = std::mem::replace(self, Self::with_capacity(rows));
        Arc::new(BooleanArray::new(values.finish(), nulls.finish()))
    }
}

/// Room for a next batch after one of `n` values: an eighth more, since a scan's batches
/// run past their row target by up to one record's rows, and growing a column copies it.
fn with_slack(n: usize) -> usize {
    n.saturating_add(n / 8)
}

/// Room a finished builder keeps for the next batch after one of `n` values: none unless
/// `keep_room`.
fn next_room(n: usize, keep_room: bool) -> usize {
    if keep_room { with_slack(n) } else { 0 }
}

/// A builder of one column.
#[derive(Debug)]
pub enum ColumnBuilder {
    /// A BIGINT column.
    BigInt(IntBuilder),
    /// A VARCHAR column.
    Varchar(TextBuilder),
    /// A BOOLEAN column.
    Boolean(BoolBuilder),
}

impl ColumnBuilder {
    /// A builder for `ty` with room for `rows` values and [a little more](with_slack).
    #[must_use]
    pub fn new(ty: SqlType, rows: usize) -> Self {
        let rows = with_slack(rows);
        match ty {
            SqlType::BigInt => Self::BigInt(IntBuilder::with_capacity(rows)),
            SqlType::Varchar => Self::Varchar(TextBuilder::with_capacity(rows, rows * 16)),
            SqlType::Boolean => Self::Boolean(BoolBuilder::with_capacity(rows)),
        }
    }

    /// Appends the BIGINT `value` `n` times; ignored by a builder of another type.
    #[inline]
    pub fn int_n(&mut self, value: i64, n: usize) {
        if let Self::BigInt(b) = self {
            b.append_n(value, n);
        }
    }

    /// Appends BIGINTs, none NULL; ignored by a builder of another type.
    #[inline]
    pub fn ints(&mut self, values: impl ExactSizeIterator<Item = i64>) {
        if let Self::BigInt(b) = self {
            b.extend(values);
        }
    }

    /// Appends BIGINTs and NULLs; ignored by a builder of another type.
    #[inline]
    pub fn int_options(&mut self, values: impl Iterator<Item = Option<i64>>) {
        if let Self::BigInt(b) = self {
            b.extend_options(values);
        }
    }

    /// Appends VARCHARs from their bytes, none NULL; ignored by a builder of another type.
    #[inline]
    pub fn texts<'a>(&mut self, values: impl ExactSizeIterator<Item = &'a [u8]>) {
        if let Self::Varchar(b) = self {
            b.extend(values);
        }
    }

    /// Appends BOOLEANs, none NULL; ignored by a builder of another type.
    #[inline]
    pub fn booleans(&mut self, values: impl ExactSizeIterator<Item = bool>) {
        if let Self::Boolean(b) = self {
            b.extend(values);
        }
    }

    /// Appends the VARCHAR (or NULL) `value` `n` times; ignored by a builder of another type.
    #[inline]
    pub fn text_n(&mut self, value: Option<&[u8]>, n: usize) {
        if let Self::Varchar(b) = self {
            b.append_n(value, n);
        }
    }

    /// Appends a cell; a cell of another type than the builder's is NULL.
    #[inline]
    pub fn cell(&mut self, cell: Cell<'_>) {
        match (self, cell) {
            (Self::BigInt(b), Cell::BigInt(v)) => b.append(Some(v)),
            (Self::Varchar(b), Cell::Varchar(v)) => b.append(v.as_bytes()),
            (Self::Boolean(b), Cell::Boolean(v)) => b.append(Some(v)),
            (Self::BigInt(b), _) => b.append(None),
            (Self::Varchar(b), _) => b.append_null(),
            (Self::Boolean(b), _) => b.append(None),
        }
    }

    /// The values appended so far; the builder starts over empty.
    ///
    /// # Errors
    /// When a VARCHAR value is not UTF-8.
    pub fn finish(&mut self) -> Result<ArrayRef, ArrowError> {
        self.finish_with_room(false)
    }

    /// The values appended so far, for a builder that goes on to build another batch: it
    /// starts over empty with room for the values it just held and [a little
    /// more](with_slack), so that a scan's batches after the first grow nothing. (A builder
    /// finished once, or replaced after, takes [`finish`](Self::finish), which allocates
    /// nothing for a next batch.)
    ///
    /// # Errors
    /// When a VARCHAR value is not UTF-8.
    pub fn finish_for_more(&mut self) -> Result<ArrayRef, ArrowError> {
        self.finish_with_room(true)
    }

    fn finish_with_room(&mut self, keep_room: bool) -> Result<ArrayRef, ArrowError> {
        Ok(match self {
            Self::BigInt(b) => b.finish_with_room(keep_room),
            Self::Varchar(b) => b.finish_with_room(keep_room)?,
            Self::Boolean(b) => b.finish_with_room(keep_room),
        })
    }
}

/// A canonical batch of `columns` holding `rows`, every column nullable.
///
/// # Errors
/// Only on an internal inconsistency of the builders.
pub fn batch_of<'a>(
    columns: &[Column],
    rows: impl IntoIterator<Item = Vec<Cell<'a>>>,
) -> Result<RecordBatch, ArrowError> {
    let mut builders: Vec<ColumnBuilder> = columns
        .iter()
        .map(|c| ColumnBuilder::new(c.ty, 0))
        .collect();
    let mut count = 0;
    for row in rows {
        for (builder, cell) in builders.iter_mut().zip(row) {
            builder.cell(cell);
        }
        count += 1;
    }
    let arrays = builders
        .iter_mut()
        .map(ColumnBuilder::finish)
        .collect::<Result<Vec<ArrayRef>, _>>()?;
    RecordBatch::try_new_with_options(
        nullable_schema_of(columns),
        arrays,
        &RecordBatchOptions::new().with_row_count(Some(count)),
    )
}

/// One column of a canonical batch, typed.
#[derive(Debug, Clone, Copy)]
enum Typed<'a> {
    BigInt(&'a Int64Array),
    Varchar(&'a StringArray),
    Boolean(&'a BooleanArray),
}

/// Whether `array` has a row `row` and holds a value (not NULL) there.
#[inline]
pub(crate) fn holds(array: &impl Array, row: usize) -> bool {
    row < array.len() && array.is_valid(row)
}

/// Typed, borrowed access to the columns of a canonical batch: each column is downcast once,
/// when the batch is taken, not once per value.
#[derive(Debug, Clone)]
pub struct Columns<'a> {
    rows: usize,
    columns: Vec<Typed<'a>>,
}

impl<'a> Columns<'a> {
    /// The columns of `batch`, which must be canonical for `columns`.
    ///
    /// # Errors
    /// When it is not.
    pub fn new(batch: &'a RecordBatch, columns: &'a [Column]) -> Result<Self, ArrowError> {
        let not_canonical = || {
            ArrowError::SchemaError(format!(
                "a batch of {:?} is not in the canonical form of {:?}",
                batch.schema(),
                columns.iter().map(|c| c.name).collect::<Vec<_>>()
            ))
        };
        if batch.num_columns() != columns.len() {
            return Err(not_canonical());
        }
        let typed = batch
            .columns()
            .iter()
            .zip(columns)
            .map(|(array, column)| {
                Some(match column.ty {
                    SqlType::BigInt => Typed::BigInt(array.as_primitive_opt::<Int64Type>()?),
                    SqlType::Varchar => Typed::Varchar(array.as_string_opt::<i32>()?),
                    SqlType::Boolean => Typed::Boolean(array.as_boolean_opt()?),
                })
            })
            .collect::<Option<Vec<_>>>()
            .ok_or_else(not_canonical)?;
        Ok(Self {
            rows: batch.num_rows(),
            columns: typed,
        })
    }

    /// Rows in the batch.
    #[must_use]
    pub fn len(&self) -> usize {
        self.rows
    }

    /// BIGINT column `i` as its array, when it is one: for a caller that reads many rows of
    /// it without a type check per value.
    #[must_use]
    pub fn int_array(&self, i: usize) -> Option<&'a Int64Array> {
        match self.columns.get(i)? {
            Typed::BigInt(a) => Some(a),
            _ => None,
        }
    }

    /// VARCHAR column `i` as its array, when it is one.
    #[must_use]
    pub fn text_array(&self, i: usize) -> Option<&'a StringArray> {
        match self.columns.get(i)? {
            Typed::Varchar(a) => Some(a),
            _ => None,
        }
    }

    /// BOOLEAN column `i` as its array, when it is one.
    #[must_use]
    pub fn boolean_array(&self, i: usize) -> Option<&'a BooleanArray> {
        match self.columns.get(i)? {
            Typed::Boolean(a) => Some(a),
            _ => None,
        }
    }

    /// BIGINT column `i` of row `row`.
    #[must_use]
    #[inline]
    pub fn int(&self, i: usize, row: usize) -> Option<i64> {
        match self.columns.get(i)? {
            Typed::BigInt(a) if holds(*a, row) => Some(a.value(row)),
            _ => None,
        }
    }

    /// Whether column `i` holds a NULL (or is not there): when it does not, every row has a
    /// value in it, and a check per row can be skipped.
    #[must_use]
    pub fn has_nulls(&self, i: usize) -> bool {
        match self.columns.get(i) {
            Some(Typed::BigInt(a)) => a.null_count() > 0,
            Some(Typed::Varchar(a)) => a.null_count() > 0,
            Some(Typed::Boolean(a)) => a.null_count() > 0,
            None => true,
        }
    }

    /// VARCHAR column `i` of row `row`.
    #[must_use]
    #[inline]
    pub fn text(&self, i: usize, row: usize) -> Option<&'a str> {
        match self.columns.get(i)? {
            Typed::Varchar(a) if holds(*a, row) => Some(a.value(row)),
            _ => None,
        }
    }

    /// BOOLEAN column `i` of row `row`.
    #[must_use]
    #[inline]
    pub fn boolean(&self, i: usize, row: usize) -> Option<bool> {
        match self.columns.get(i)? {
            Typed::Boolean(a) if holds(*a, row) => Some(a.value(row)),
            _ => None,
        }
    }

    /// Column `i` of row `row` as a cell.
    #[must_use]
    #[inline]
    pub fn cell(&self, i: usize, row: usize) -> Cell<'a> {
        match self.columns.get(i) {
            Some(Typed::BigInt(a)) if holds(*a, row) => Cell::BigInt(a.value(row)),
            Some(Typed::Varchar(a)) if holds(*a, row) => Cell::Varchar(a.value(row)),
            Some(Typed::Boolean(a)) if holds(*a, row) => Cell::Boolean(a.value(row)),
            _ => Cell::Null,
        }
    }
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Array as _, AsArray as _};

    use super::{ColumnBuilder, TextBuilder};
    use crate::model::{ColumnMappingRow, DataFileRow, NameMappingRow, SqlType};

    /// Each static list of columns has one nullable schema, built once: the same for the same
    /// list, another for another, each what `nullable_schema_of` builds.
    #[test]
    fn a_static_column_list_builds_its_nullable_schema_once() {
        use crate::model::{CatalogTable, mapping_load_columns};
        let lists = [
            CatalogTable::ColumnMapping.columns(),
            CatalogTable::NameMapping.columns(),
            mapping_load_columns(),
        ];
        for list in lists {
            let first = super::nullable_schema(list);
            assert!(std::sync::Arc::ptr_eq(
                &first,
                &super::nullable_schema(list)
            ));
            assert_eq!(first, super::nullable_schema_of(list));
            assert!(first.fields().iter().all(|field| field.is_nullable()));
        }
        assert_ne!(
            super::nullable_schema(lists[0]),
            super::nullable_schema(lists[1])
        );
    }

    /// A finished text column holds what was appended, and the builder starts the next batch
    /// with room for as many values and bytes, so that a scan's later batches grow nothing.
    #[test]
    fn a_finished_text_builder_keeps_room_for_the_next_batch() {
        let mut builder = TextBuilder::with_capacity(0, 0);
        for batch in 0..2 {
            builder.append(b"id");
            builder.append_null();
            builder.append("größe".as_bytes());
            let array = builder.finish_with_room(true).expect("UTF-8 values");
            let strings = array.as_string::<i32>();
            assert_eq!(strings.len(), 3, "batch {batch}");
            assert_eq!(strings.value(0), "id");
            assert!(strings.is_null(1));
            assert_eq!(strings.value(2), "größe");
            assert!(builder.offsets.capacity() >= 4, "batch {batch}");
            assert!(
                builder.values.capacity() >= "idgröße".len(),
                "batch {batch}"
            );
            assert_eq!(builder.offsets, [0]);
            assert!(builder.values.is_empty());
        }
        builder.append(&[0xff]);
        assert!(
            builder.finish_with_room(false).is_err(),
            "not UTF-8 is refused"
        );
    }

    /// BIGINT and BOOLEAN builders keep their room across a finish too.
    #[test]
    fn finished_column_builders_keep_room_for_the_next_batch() {
        for ty in [SqlType::BigInt, SqlType::Boolean] {
            let mut builder = ColumnBuilder::new(ty, 0);
            let append = |builder: &mut ColumnBuilder| {
                builder.int_options(std::iter::once(Some(7)));
                builder.booleans(std::iter::once(true));
            };
            for _ in 0..1000 {
                append(&mut builder);
            }
            assert_eq!(builder.finish_for_more().expect("finished").len(), 1000);
            let room = match &builder {
                ColumnBuilder::BigInt(b) => b.values.capacity(),
                ColumnBuilder::Boolean(b) => b.values.capacity(),
                ColumnBuilder::Varchar(_) => 0,
            };
            assert!(room >= 1000 + 1000 / 8, "{ty:?}: room for {room} values");
            append(&mut builder);
            // A builder finished for good keeps no room.
            assert_eq!(builder.finish().expect("finished").len(), 1);
            let room = match &builder {
                ColumnBuilder::BigInt(b) => b.values.capacity(),
                ColumnBuilder::Boolean(b) => b.values.capacity(),
                ColumnBuilder::Varchar(_) => usize::MAX,
            };
            assert_eq!(room, 0, "{ty:?}");
        }
    }

    /// Runs of values (a record's name rows, a mapping's columns repeated over them) build
    /// the same column as the values appended one by one, NULLs included.
    #[test]
    fn runs_of_values_build_what_single_values_do() {
        use crate::model::Cell;

        let mut ints = ColumnBuilder::new(SqlType::BigInt, 0);
        ints.ints([1, 2, 3].into_iter());
        ints.int_n(7, 2);
        ints.int_options(std::iter::once(None));
        ints.ints(std::iter::empty());
        ints.int_n(9, 0);
        ints.cell(Cell::BigInt(4));
        ints.int_options([None, None, Some(5), None, Some(6), Some(8)].into_iter());
        ints.int_options(std::iter::empty());
        ints.int_options([Some(9)].into_iter());
        let ints = ints.finish_for_more().expect("finished");
        let ints = ints.as_primitive::<datafusion::arrow::datatypes::Int64Type>();
        assert_eq!(
            ints.iter().collect::<Vec<_>>(),
            [
                Some(1),
                Some(2),
                Some(3),
                Some(7),
                Some(7),
                None,
                Some(4),
                None,
                None,
                Some(5),
                None,
                Some(6),
                Some(8),
                Some(9)
            ]
        );

        let mut texts = ColumnBuilder::new(SqlType::Varchar, 0);
        texts.texts([&b"a"[..], b"bc"].into_iter());
        texts.text_n(Some(b"x"), 3);
        texts.text_n(None, 2);
        texts.cell(Cell::Varchar("é"));
        texts.text_n(Some(b""), 1);
        let texts = texts.finish_for_more().expect("UTF-8");
        assert_eq!(
            texts.as_string::<i32>().iter().collect::<Vec<_>>(),
            [
                Some("a"),
                Some("bc"),
                Some("x"),
                Some("x"),
                Some("x"),
                None,
                None,
                Some("é"),
                Some("")
            ]
        );

        let mut booleans = ColumnBuilder::new(SqlType::Boolean, 0);
        booleans.booleans([true, false].into_iter());
        booleans.cell(Cell::Null);
        booleans.booleans(std::iter::once(true));
        let booleans = booleans.finish().expect("finished");
        assert_eq!(
            booleans.as_boolean().iter().collect::<Vec<_>>(),
            [Some(true), Some(false), None, Some(true)]
        );

        // A run on a builder of another type is ignored, as a single value is.
        let mut ints = ColumnBuilder::new(SqlType::BigInt, 0);
        ints.texts(std::iter::once(&b"x"[..]));
        ints.text_n(Some(b"x"), 2);
        ints.booleans(std::iter::once(true));
        assert_eq!(ints.finish().expect("finished").len(), 0);
        let mut texts = ColumnBuilder::new(SqlType::Varchar, 0);
        texts.int_options(std::iter::once(Some(1)));
        assert_eq!(texts.finish().expect("finished").len(), 0);
    }

    /// Each named position is where its column stands in the model's column table.
    #[test]
    fn column_positions_match_the_column_tables() {
        let at = |columns: &[crate::model::Column], i: usize| columns.get(i).map(|c| c.name);
        let cm = ColumnMappingRow::COLUMNS;
        assert_eq!(
            at(cm, super::column_mapping::MAPPING_ID),
            Some("mapping_id")
        );
        assert_eq!(at(cm, super::column_mapping::TABLE_ID), Some("table_id"));
        assert_eq!(at(cm, super::column_mapping::TYPE), Some("type"));
        let nm = NameMappingRow::COLUMNS;
        assert_eq!(at(nm, super::name_mapping::MAPPING_ID), Some("mapping_id"));
        assert_eq!(at(nm, super::name_mapping::COLUMN_ID), Some("column_id"));
        assert_eq!(
            at(nm, super::name_mapping::SOURCE_NAME),
            Some("source_name")
        );
        assert_eq!(
            at(nm, super::name_mapping::TARGET_FIELD_ID),
            Some("target_field_id")
        );
        assert_eq!(
            at(nm, super::name_mapping::PARENT_COLUMN),
            Some("parent_column")
        );
        assert_eq!(
            at(nm, super::name_mapping::IS_PARTITION),
            Some("is_partition")
        );
        let df = DataFileRow::COLUMNS;
        assert_eq!(at(df, super::data_file::DATA_FILE_ID), Some("data_file_id"));
        assert_eq!(at(df, super::data_file::TABLE_ID), Some("table_id"));
        assert_eq!(at(df, super::data_file::END_SNAPSHOT), Some("end_snapshot"));
        assert_eq!(at(df, super::data_file::MAPPING_ID), Some("mapping_id"));
    }
}
