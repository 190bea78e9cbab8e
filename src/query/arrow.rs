//! Stored records straight into Arrow: pages of records decoded in place, their values
//! appended to builders of the projected columns only. No record is materialized, and
//! nothing is allocated per row.
//!
//! The served tables' schemas come from the column tables (`batch`). A projection is
//! applied while a batch is built, never after.

use std::sync::Arc;

use datafusion::arrow::array::ArrayRef;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::error::ArrowError;
use datafusion::arrow::record_batch::{RecordBatch, RecordBatchOptions};

use super::pushdown::IdSet;
use crate::batch::name_mapping::{
    COLUMN_ID, IS_PARTITION, MAPPING_ID, PARENT_COLUMN, SOURCE_NAME, TARGET_FIELD_ID,
};
use crate::batch::{ColumnBuilder, mapping_load_schema, table_schema};
use crate::catalog::{check_data_file, check_mapping, check_mapping_raw};
use crate::codec::{Keyspace, MappingHead, RawName};
use crate::error::Result;
use crate::kv::Page;
use crate::model::{CatalogTable, Cell, mapping_load_columns};

/// What rows are built from the records.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// A catalog table's rows: one per mapping record, one per embedded name row, or one per
    /// data-file record.
    Table(CatalogTable),
    /// DuckLake's mapping load: the join of the two mapping tables on `mapping_id`, each
    /// mapping's rows parents first (`parent_column NULLS FIRST`), then by `column_id`.
    MappingLoad,
}

impl Shape {
    /// The full schema of the shape.
    #[must_use]
    pub fn schema(self) -> SchemaRef {
        match self {
            Shape::Table(table) => table_schema(table),
            Shape::MappingLoad => mapping_load_schema(),
        }
    }

    /// Whether rows come from mapping records.
    #[must_use]
    pub fn reads_mappings(self) -> bool {
        !matches!(self, Shape::Table(CatalogTable::DataFile))
    }
}

/// Which records a scan keeps: by row id, and by table. A mapping load keeps the name rows of
/// every record of a kept `mapping_id`, whatever its table, as the SQL join does; only the
/// mapping's own columns come from records of the kept tables.
#[derive(Debug, Clone, Default)]
pub struct Keep {
    /// Row ids to keep; all when `None`.
    pub ids: Option<IdSet>,
    /// Tables to keep; all when `None`.
    pub tables: Option<IdSet>,
}

impl Keep {
    fn id(&self, id: i64) -> bool {
        self.ids.as_ref().is_none_or(|ids| ids.contains(id))
    }

    fn table(&self, table_id: i64) -> bool {
        self.tables
            .as_ref()
            .is_none_or(|tables| tables.contains(table_id))
    }
}

/// Columns of the mapping load that come from the mapping rather than its name rows; the rest
/// are the name table's columns after `mapping_id`, in its order.
const LOAD_HEAD_COLUMNS: usize = 3;

/// The builders of the projected columns and the rows they hold.
#[derive(Debug)]
struct Out {
    /// Per output column, the shape's column it holds.
    projection: Vec<usize>,
    builders: Vec<ColumnBuilder>,
    rows: usize,
}

impl Out {
    /// Appends one row whose column `i` of the shape is `cell(i)`.
    #[inline]
    fn row<'a>(&mut self, cell: impl Fn(usize) -> Cell<'a>) {
        for (builder, &i) in self.builders.iter_mut().zip(&self.projection) {
            builder.cell(cell(i));
        }
        self.rows += 1;
    }

    /// Appends one row per name of `names`, every one of mapping `head`: the columns of
    /// `ducklake_name_mapping`, or of the mapping load when `load`. Column by column, so each
    /// column's values go to its builder in one tight loop.
    fn names(&mut self, head: &MappingHead<'_>, names: &[RawName<'_>], load: bool) {
        let n = names.len();
        for (builder, &column) in self.builders.iter_mut().zip(&self.projection) {
            let column = if load {
                match column {
                    0 => {
                        builder.int_n(head.mapping_id, n);
                        continue;
                    }
                    1 => {
                        builder.int_n(head.table_id, n);
                        continue;
                    }
                    2 => {
                        builder.text_n(head.map_type.map(str::as_bytes), n);
                        continue;
                    }
                    // The name row's columns, `column_id` first, as in the name table.
                    other => other + 1 - LOAD_HEAD_COLUMNS,
                }
            } else {
                column
            };
            match column {
                MAPPING_ID => builder.int_n(head.mapping_id, n),
                COLUMN_ID => builder.ints(names.iter().map(|m| m.column_id)),
                SOURCE_NAME => builder.texts(names.iter().map(|m| m.source_name)),
                TARGET_FIELD_ID => builder.ints(names.iter().map(|m| m.target_field_id)),
                PARENT_COLUMN => builder.int_options(names.iter().map(|m| m.parent_column)),
                IS_PARTITION => builder.booleans(names.iter().map(|m| m.is_partition)),
                _ => {}
            }
        }
        self.rows += n;
    }
}

/// A run of records to build from: a page and the stretch of it not used yet.
#[derive(Debug, Default)]
struct Segment {
    page: Page,
    at: usize,
    end: usize,
}

/// Builds record batches of one shape, with only the projected columns, from pages of
/// records: [`set_page`](Self::set_page), then [`fill`](Self::fill) up to a batch's rows and
/// [`finish`](Self::finish), until the page is used up.
#[derive(Debug)]
pub struct RecordBuilder {
    shape: Shape,
    schema: SchemaRef,
    out: Out,
    /// The records being built from, in order: a mapping load group carried over from the
    /// previous page first, then the current page.
    segments: [Segment; 2],
    /// The mapping load's last group of one `mapping_id` of the current page, which may go
    /// on in the next page.
    carry: Page,
}

impl RecordBuilder {
    /// A builder of `shape`'s batches with the columns `projection` (all when `None`), with
    /// room for `capacity` rows.
    ///
    /// # Errors
    /// When a projected index is not a column of the shape.
    pub fn new(
        shape: Shape,
        projection: Option<&[usize]>,
        capacity: usize,
    ) -> Result<Self, ArrowError> {
        let full = shape.schema();
        let projection: Vec<usize> = match projection {
            Some(p) => p.to_vec(),
            None => (0..full.fields().len()).collect(),
        };
        let schema = Arc::new(full.project(&projection)?);
        let columns = match shape {
            Shape::Table(table) => table.columns(),
            Shape::MappingLoad => mapping_load_columns(),
        };
        let builders = projection
            .iter()
            .filter_map(|&i| columns.get(i))
            .map(|c| ColumnBuilder::new(c.ty, capacity))
            .collect();
        Ok(Self {
            shape,
            schema,
            out: Out {
                projection,
                builders,
                rows: 0,
            },
            segments: [Segment::default(), Segment::default()],
            carry: Page::default(),
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
        self.out.rows
    }

    /// Whether every record of the current page has been used.
    #[must_use]
    pub fn page_done(&self) -> bool {
        self.segments.iter().all(|s| s.at >= s.end)
    }

    /// Takes the next page of records (of this shape's kind) to build from; `last` says it
    /// ends the scan. The previous page must be used up.
    pub fn set_page(&mut self, page: Page, last: bool) {
        let id_of = |value: &[u8]| {
            crate::codec::read_mapping(value)
                .ok()
                .map(|record| record.head().mapping_id)
        };
        // A group carried over from the last page, with the page's records of the same id.
        let mut prefix = std::mem::take(&mut self.carry);
        let mut lead = 0;
        if let Some((_, value)) = prefix.get(0) {
            let carried = id_of(value);
            for (key, value) in page.iter() {
                if id_of(value) != carried {
                    break;
                }
                prefix.push(key, value);
                lead += 1;
            }
        }
        let mut end = page.len();
        if self.shape == Shape::MappingLoad && !last {
            // The last group of one `mapping_id` may go on in the next page: keep it for then.
            let last_id = page.iter().next_back().and_then(|(_, value)| id_of(value));
            if let Some(last_id) = last_id {
                let tail = page
                    .iter()
                    .skip(lead)
                    .rev()
                    .take_while(|(_, value)| id_of(value) == Some(last_id))
                    .count();
                end -= tail;
                if lead == 0 || end > lead {
                    for (key, value) in page.iter().skip(end) {
                        self.carry.push(key, value);
                    }
                } else {
                    // The whole page continues the carried group: carry it all on.
                    for (key, value) in prefix.iter() {
                        self.carry.push(key, value);
                    }
                    prefix = Page::default();
                    end = lead;
                }
            }
        }
        let prefix_len = prefix.len();
        self.segments = [
            Segment {
                page: prefix,
                at: 0,
                end: prefix_len,
            },
            Segment {
                page,
                at: lead,
                end: end.max(lead),
            },
        ];
    }

    /// Appends the rows of the current page's records, checked against their keys, until the
    /// builder holds `limit` rows or the page is used up; a record's rows (and a mapping load
    /// group's) always go into one batch. `keep` says which records to keep.
    ///
    /// # Errors
    /// [`Error::Codec`](crate::Error::Codec) for a record that does not decode or does not
    /// belong under its key.
    pub fn fill(&mut self, keyspace: &Keyspace, limit: usize, keep: &Keep) -> Result<()> {
        let Self {
            shape,
            out,
            segments,
            ..
        } = self;
        for segment in segments.iter_mut() {
            let mut names: Vec<RawName<'_>> = Vec::new();
            while out.rows < limit && segment.at < segment.end {
                let Some((key, value)) = segment.page.get(segment.at) else {
                    break;
                };
                match *shape {
                    Shape::Table(CatalogTable::DataFile) => {
                        let record = check_data_file(keyspace, key, value)?;
                        if keep.id(record.data_file_id()) && keep.table(record.table_id()) {
                            out.row(|i| record.cell(i));
                        }
                    }
                    Shape::Table(CatalogTable::ColumnMapping) => {
                        let head = check_mapping(keyspace, key, value)?.head();
                        if keep.id(head.mapping_id) && keep.table(head.table_id) {
                            out.row(|i| head_cell(&head, i));
                        }
                    }
                    Shape::Table(CatalogTable::NameMapping) => {
                        names.clear();
                        let row = keyspace.decode(key)?;
                        let head = check_mapping_raw(row, key, value, &mut names)?;
                        if keep.id(head.mapping_id) && keep.table(head.table_id) {
                            out.names(&head, &names, false);
                        }
                    }
                    Shape::MappingLoad => {
                        segment.at += append_load_group(
                            out,
                            keyspace,
                            &segment.page,
                            segment.at,
                            segment.end,
                            keep,
                        )?;
                        continue;
                    }
                }
                segment.at += 1;
            }
        }
        Ok(())
    }

    /// The rows appended so far as one batch; the builder starts over empty.
    ///
    /// # Errors
    /// When a name is not UTF-8 (a stored value written wrong), or on an internal
    /// inconsistency of the builders.
    pub fn finish(&mut self) -> Result<RecordBatch, ArrowError> {
        let arrays = self
            .out
            .builders
            .iter_mut()
            .map(ColumnBuilder::finish_for_more)
            .collect::<Result<Vec<ArrayRef>, _>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(self.out.rows));
        self.out.rows = 0;
        RecordBatch::try_new_with_options(self.schema(), arrays, &options)
    }
}

/// Appends the mapping load's rows of the group of records of one `mapping_id` that starts
/// at record `at` of `records` (one record, unless two tables use the same id; the group
/// ends by `end`); returns how many records the group holds. As in a SQL catalog, whose name
/// rows carry no `table_id`, every kept record of the group joins every name row of the
/// group, kept or not; the rows leave parents first (`parent_column NULLS FIRST`), then by
/// `column_id`.
fn append_load_group(
    out: &mut Out,
    keyspace: &Keyspace,
    records: &Page,
    at: usize,
    end: usize,
    keep: &Keep,
) -> Result<usize> {
    let mut heads: Vec<MappingHead<'_>> = Vec::with_capacity(1);
    let mut names: Vec<RawName<'_>> = Vec::with_capacity(32);
    let mut id = None;
    let mut taken = 0;
    while at + taken < end {
        let Some((key, value)) = records.get(at + taken) else {
            break;
        };
        // The key says where the group ends: the record after it is left undecoded.
        let row = keyspace.decode(key)?;
        if id.is_some_and(|id| id != row.id) {
            break;
        }
        let head = check_mapping_raw(row, key, value, &mut names)?;
        id = Some(head.mapping_id);
        if keep.table(head.table_id) {
            heads.push(head);
        }
        taken += 1;
    }
    if id.is_some_and(|id| keep.id(id)) {
        if !names.windows(2).all(|w| {
            matches!(w, [a, b] if (a.parent_column, a.column_id) <= (b.parent_column, b.column_id))
        }) {
            names.sort_by_key(|name| (name.parent_column, name.column_id));
        }
        match heads.as_slice() {
            [] => {}
            [head] => out.names(head, &names, true),
            _ => {
                for name in &names {
                    for head in &heads {
                        out.row(|i| load_cell(head, name, i));
                    }
                }
            }
        }
    }
    Ok(taken.max(1))
}

/// Column `i` of `ducklake_column_mapping` for a record's head.
fn head_cell<'a>(head: &MappingHead<'a>, i: usize) -> Cell<'a> {
    match i {
        0 => Cell::BigInt(head.mapping_id),
        1 => Cell::BigInt(head.table_id),
        _ => head.map_type.map_or(Cell::Null, Cell::Varchar),
    }
}

/// Column `i` of the mapping load for one row of a group of several records (two tables
/// sharing an id): the mapping's three columns, then the name row's.
fn load_cell<'a>(head: &MappingHead<'a>, name: &RawName<'a>, i: usize) -> Cell<'a> {
    match i {
        0..LOAD_HEAD_COLUMNS => head_cell(head, i),
        3 => Cell::BigInt(name.column_id),
        4 => std::str::from_utf8(name.source_name).map_or(Cell::Null, Cell::Varchar),
        5 => Cell::BigInt(name.target_field_id),
        6 => name.parent_column.map_or(Cell::Null, Cell::BigInt),
        _ => Cell::Boolean(name.is_partition),
    }
}
