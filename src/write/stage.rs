//! Staging: the changes of one transaction applied one at a time to its staged writes.
//!
//! Each change is validated against the snapshot the transaction reads and the changes staged
//! before it, and turned into store writes at once: records are encoded straight from the
//! rows' Arrow columns, and the reads a change needs (does this key exist, which rows does
//! this delete match) are batched per change, as index spans, multi-range reads or sorted
//! multi-gets. A change therefore costs in proportion to itself, not to what was staged
//! before it.
//!
//! Violations come in two kinds ([`Violation::is_pending`]): a final one (a repeated key, a
//! malformed tree) is reported with the change that made it, and the caller takes the change
//! back ([`Staging::begin_request`], [`Staging::end_request`]); a pending one (a mapping whose
//! name rows have not arrived, a file whose mapping has not) is kept as state and checked when
//! the transaction commits ([`Staging::pending`]).

use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::mem;
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt as _;

use super::fold::{self, NameColumns, OwnedName};
use super::{Delete, EndTarget, Hold, Insert, Op, Update};
use crate::batch::Columns;
use crate::batch::{column_mapping, data_file, name_mapping};
use crate::catalog::{CatalogSnapshot, check_data_file};
use crate::codec::{
    DataFileRecord, Keyspace, Kind, MappingHead, NameRef, encode_data_file_into,
    encode_mapping_into, read_mapping,
};
use crate::error::{Error, Result};
use crate::kv::{
    Digest, Digester, KeyRange, NearIds, PageSize, Prior, Requirement, StagedWrites, Undo,
};
use crate::model::Violation;
use crate::model::{CatalogTable, Cell, TableId};

/// Bytes per unsealed staged key that the staged writes do not hold yet but will: its sort
/// head in the seal that puts it in key order (32) while a commit or a view sorts it, and its
/// position in the order (8).
const SEAL_BYTES_PER_KEY: usize = 40;
/// Bytes of bookkeeping per inserted data file (its mapping reference) and per inserted
/// mapping (the id map).
const BYTES_PER_REFERENCE: usize = 48;

/// The net effect of a transaction on the stored records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PlanSummary {
    /// Mapping records created.
    pub mappings_created: u64,
    /// Mapping records deleted.
    pub mappings_deleted: u64,
    /// Data files created.
    pub files_created: u64,
    /// Data files changed (end transitions).
    pub files_updated: u64,
    /// Data files deleted.
    pub files_deleted: u64,
}

/// A data file inserted by the transaction, and the mapping it references.
#[derive(Debug, Clone, Copy)]
struct Reference {
    data_file_id: i64,
    table_id: i64,
    mapping_id: i64,
    /// Where the mapping was when the file was staged.
    found: Found,
}

/// Where a referenced mapping was found when the reference was staged.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Found {
    /// Staged by the transaction: the reference holds unless the mapping is deleted later.
    Staged,
    /// In the snapshot the transaction reads: it must still be there at the commit.
    InBase,
    /// Nowhere (yet): a later change may stage it.
    Missing,
}

/// A mapping the transaction inserted, as its later name rows find it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Inserted {
    table_id: i64,
    /// Whether it has a name row yet.
    named: bool,
    /// Where its record is among the staged keys ([`StagedWrites::rewrite_at`]): its name
    /// rows reach the record there, without building its key and probing for it.
    at: usize,
}

/// A change to the staging's own bookkeeping, so that it can be taken back.
#[derive(Debug)]
enum Change {
    InsertedId {
        id: i64,
        previous: Option<Inserted>,
    },
    Unnamed {
        key: (i64, i64),
        was: bool,
    },
    MissingParents {
        key: (i64, i64),
        previous: Option<Vec<Violation>>,
    },
    Waiting {
        id: i64,
        previous: Option<Vec<OwnedName>>,
    },
    Refused {
        id: i64,
    },
}

/// What a request changed, to take it back (with the undo log of the staged writes).
#[derive(Debug)]
struct Journal {
    changes: Vec<Change>,
    references: usize,
    inserted_rows: [usize; 3],
    summary: PlanSummary,
    affected: usize,
}

/// The buffer a value is built in before the staged writes copy it: one allocation for the
/// whole transaction, not one per record.
#[derive(Debug, Default)]
struct ValueBuffer {
    scratch: Vec<u8>,
}

impl ValueBuffer {
    /// What `build` writes, in the scratch buffer until the next build: a value the staged
    /// writes copy at once.
    fn value(&mut self, build: impl FnOnce(&mut Vec<u8>)) -> &[u8] {
        self.scratch.clear();
        build(&mut self.scratch);
        &self.scratch
    }
}

/// The staged changes of one transaction.
#[derive(Debug)]
pub struct Staging {
    base: CatalogSnapshot,
    writes: Arc<StagedWrites>,
    value_buf: ValueBuffer,
    /// Per `mapping_id`, the mapping the transaction inserted that its later name rows join:
    /// its table, whether it has a name row yet, and where its record is staged. Holding a
    /// mapping here means the transaction writes its record: a delete takes it out. Placed
    /// by id ([`NearIds`]): a bulk load inserts and then names its mappings in id order, and
    /// at a million mappings a look-up placed at random took a cache miss and a page walk.
    inserted_ids: HashMap<i64, Inserted, NearIds>,
    /// Mappings inserted with no name row yet, `(table_id, mapping_id)`, that
    /// `inserted_ids` does not hold (their id was inserted into another table first).
    unnamed: HashSet<(i64, i64), NearIds>,
    /// Mappings with a `parent_column` that is none of their columns (yet).
    missing_parents: HashMap<(i64, i64), Vec<Violation>, NearIds>,
    /// Name rows whose mapping the transaction has not inserted (yet), by `mapping_id`.
    waiting: BTreeMap<i64, Vec<OwnedName>>,
    /// Mappings whose insert was refused: their name rows are part of that refusal, not
    /// orphans of their own.
    refused: BTreeSet<i64>,
    waiting_bytes: usize,
    references: Vec<Reference>,
    /// Whether the transaction deleted a mapping: references found staged must then be
    /// checked again at the commit.
    mappings_deleted: bool,
    /// Rows inserted so far into each table, for positions in messages.
    inserted_rows: [usize; 3],
    summary: PlanSummary,
    affected: Vec<u64>,
    /// The open request, if any.
    journal: Option<Journal>,
    /// What the open request's writes replaced; records nothing outside a request.
    undo: Undo,
}

/// The key of a mapping, as the staging tracks it.
type MappingKey = (i64, i64);

fn table_slot(table: CatalogTable) -> usize {
    match table {
        CatalogTable::ColumnMapping => 0,
        CatalogTable::NameMapping => 1,
        CatalogTable::DataFile => 2,
    }
}

impl Staging {
    /// Nothing staged yet, over `base`.
    #[must_use]
    pub fn new(base: CatalogSnapshot) -> Self {
        // Every requirement the staging makes states what `base` held (as read, or as found
        // absent), so the commit may rely on the store's version of it.
        let writes = Arc::new(StagedWrites::read_at(base.kv().version()));
        Self {
            base,
            writes,
            value_buf: ValueBuffer::default(),
            inserted_ids: HashMap::default(),
            unnamed: HashSet::default(),
            missing_parents: HashMap::default(),
            waiting: BTreeMap::new(),
            refused: BTreeSet::new(),
            waiting_bytes: 0,
            references: Vec::new(),
            mappings_deleted: false,
            inserted_rows: [0; 3],
            summary: PlanSummary::default(),
            affected: Vec::new(),
            journal: None,
            undo: Undo::off(),
        }
    }

    /// The snapshot the transaction reads.
    #[must_use]
    pub fn base(&self) -> &CatalogSnapshot {
        &self.base
    }

    /// What the transaction reads: its snapshot with its staged writes over it. Shares the
    /// staged writes (put in key order first, for the view's range reads); a later change
    /// copies them only while such a view is still held.
    #[must_use]
    pub fn view(&mut self) -> CatalogSnapshot {
        self.seal();
        self.base.overlaid(Arc::clone(&self.writes))
    }

    /// Puts the keys staged since the last time in key order ([`StagedWrites::seal`]).
    fn seal(&mut self) {
        StagedWrites::seal_shared(&mut self.writes);
    }

    /// The staged writes.
    #[must_use]
    pub fn writes(&self) -> &StagedWrites {
        &self.writes
    }

    /// Rows each change affected, in order.
    #[must_use]
    pub fn affected(&self) -> &[u64] {
        &self.affected
    }

    /// The net effect so far.
    #[must_use]
    pub fn summary(&self) -> PlanSummary {
        self.summary
    }

    /// Memory the staged state holds, in bytes: keys and values, their bookkeeping, rows
    /// waiting for their mapping, and what the open request would need to be taken back.
    #[must_use]
    pub fn memory(&self) -> u64 {
        let changes = self
            .journal
            .as_ref()
            .map_or(0, |journal| journal.changes.capacity());
        let bytes = self.writes.memory()
            + self.writes.unsealed() * SEAL_BYTES_PER_KEY
            + self.undo.memory()
            + changes * size_of::<Change>()
            + (self.references.len() + self.inserted_ids.len()) * BYTES_PER_REFERENCE
            + self.waiting_bytes
            + self.value_buf.scratch.capacity();
        u64::try_from(bytes).unwrap_or(u64::MAX)
    }

    /// Starts a request: its changes can be taken back whole by
    /// [`end_request(false)`](Self::end_request).
    pub fn begin_request(&mut self) {
        self.undo = Undo::new();
        self.journal = Some(Journal {
            changes: Vec::new(),
            references: self.references.len(),
            inserted_rows: self.inserted_rows,
            summary: self.summary,
            affected: self.affected.len(),
        });
    }

    /// Ends the request begun last: keeps its changes, or takes them all back.
    pub fn end_request(&mut self, keep: bool) {
        let undo = mem::replace(&mut self.undo, Undo::off());
        let Some(journal) = self.journal.take() else {
            return;
        };
        if keep {
            return;
        }
        Arc::make_mut(&mut self.writes).undo(undo);
        for change in journal.changes.into_iter().rev() {
            match change {
                Change::InsertedId { id, previous } => match previous {
                    Some(inserted) => {
                        self.inserted_ids.insert(id, inserted);
                    }
                    None => {
                        self.inserted_ids.remove(&id);
                    }
                },
                Change::Unnamed { key, was } => {
                    self.mark_unnamed(key, was);
                }
                Change::MissingParents { key, previous } => match previous {
                    Some(previous) => {
                        self.missing_parents.insert(key, previous);
                    }
                    None => {
                        self.missing_parents.remove(&key);
                    }
                },
                Change::Refused { id } => {
                    self.refused.remove(&id);
                }
                Change::Waiting { id, previous } => {
                    let now = match previous {
                        Some(previous) => self.waiting.insert(id, previous),
                        None => self.waiting.remove(&id),
                    };
                    self.waiting_bytes -= now.iter().flatten().map(OwnedName::size).sum::<usize>();
                    self.waiting_bytes += self
                        .waiting
                        .get(&id)
                        .iter()
                        .copied()
                        .flatten()
                        .map(OwnedName::size)
                        .sum::<usize>();
                }
            }
        }
        self.references.truncate(journal.references);
        self.inserted_rows = journal.inserted_rows;
        self.summary = journal.summary;
        self.affected.truncate(journal.affected);
    }

    fn record(&mut self, change: Change) {
        if let Some(journal) = self.journal.as_mut() {
            journal.changes.push(change);
        }
    }

    /// The staged writes to change, the undo log, the value buffer and the keyspace, borrowed
    /// together.
    fn parts(&mut self) -> (&mut StagedWrites, &mut Undo, &mut ValueBuffer, &Keyspace) {
        (
            Arc::make_mut(&mut self.writes),
            &mut self.undo,
            &mut self.value_buf,
            self.base.keyspace(),
        )
    }
}

/// A row's key, and its index entry's key and value: what inserting or deleting the row
/// writes. Built into buffers that a loop over rows reuses; the staged writes copy them.
#[derive(Debug, Default)]
struct RowKeys {
    key: Vec<u8>,
    index_key: Vec<u8>,
    index_value: Vec<u8>,
}

impl RowKeys {
    /// Holds the keys of row `(kind, table_id, id)` and of its index entry.
    fn set(&mut self, keyspace: &Keyspace, kind: Kind, table_id: TableId, id: i64) {
        key_into(&mut self.key, keyspace, kind, table_id.0, id);
        self.index_key.clear();
        self.index_value.clear();
        if let Some(table) = keyspace.put_index_entry(&mut self.index_key, kind, table_id, id) {
            self.index_value.extend_from_slice(&table);
        }
    }
}

/// `key` of `kind` for `(table_id, id)` into `out`, replacing what it held.
fn key_into(out: &mut Vec<u8>, keyspace: &Keyspace, kind: Kind, table_id: i64, id: i64) {
    out.clear();
    keyspace.put_row_key(out, kind, TableId(table_id), id);
}

/// The tables whose rows of row kind `kind` a range of those rows, or of their index, may
/// hold: every table for a range of the index, else those from the range's start to its end.
fn tables_spanned(
    keyspace: &Keyspace,
    kind: Kind,
    range: &KeyRange,
) -> std::ops::RangeInclusive<i64> {
    let table = |bound: &[u8]| match keyspace.decode_head(bound) {
        Ok((found, table)) if found == kind => Some(table),
        _ => None,
    };
    table(&range.start).unwrap_or(i64::MIN)..=table(&range.end).unwrap_or(i64::MAX)
}

/// What a commit must find at a key for the snapshot's `value` there to still hold.
fn as_read(value: Option<&[u8]>) -> Requirement {
    value.map_or(Requirement::Absent, |value| {
        Requirement::Unchanged(Digest::of_value(value))
    })
}

fn canonical(insert: &Insert) -> Result<Columns<'_>> {
    Columns::new(insert.rows(), insert.table().columns()).map_err(|err| Error::BadRows {
        table: insert.table(),
        problem: err.to_string(),
    })
}

impl Staging {
    /// Makes the commit depend on the guards of the tables of row kind `kind` that `tables`
    /// inserts into: a concurrent commit that acted on a whole table (and so changed its
    /// guard) then conflicts with this one. A table without its mark gets it here, and the
    /// kind's table set changes with it: a concurrent statement on a key range moves on the
    /// guards of the tables marked in its view and depends on the table set, so it conflicts
    /// with an insert into any table. Each table's guard is read once per transaction.
    async fn guard_inserts(&mut self, kind: Kind, tables: impl Iterator<Item = i64>) -> Result<()> {
        let keyspace = self.base.keyspace().clone();
        let mut tables: Vec<i64> = tables.collect();
        tables.sort_unstable();
        tables.dedup();
        // A table's guard and mark are decided together, the first time the transaction
        // inserts into the table.
        let keys: Vec<Vec<u8>> = tables
            .into_iter()
            .map(|table| (TableId(table), keyspace.guard_key(kind, TableId(table))))
            .filter(|(_, guard)| self.writes.get(guard).is_none())
            .flat_map(|(table, guard)| [guard, keyspace.table_mark_key(kind, table)])
            .collect();
        if keys.is_empty() {
            return Ok(());
        }
        let values = self.base.values(&keys).await?;
        let mut marked = false;
        let (writes, undo, _, _) = self.parts();
        for (keys, values) in keys.chunks_exact(2).zip(values.chunks_exact(2)) {
            let ([guard, mark], [guard_value, mark_value]) = (keys, values) else {
                continue;
            };
            writes.require(guard, as_read(guard_value.as_deref()), undo)?;
            if mark_value.is_none() && writes.read(mark).is_none() {
                writes.put(mark, [], undo)?;
                marked = true;
            }
        }
        if marked {
            self.marked_tables(kind).await?;
        }
        Ok(())
    }

    /// Records that the transaction marks tables of row kind `kind`: the kind's table set
    /// changes, to a value never written before (so two transactions doing this do not
    /// conflict), and the commit depends on the kind's range holds being as read, so a
    /// concurrent statement holding a key range across tables, which could not see the new
    /// marks, conflicts with it whichever commits first.
    async fn marked_tables(&mut self, kind: Kind) -> Result<()> {
        let keyspace = self.base.keyspace().clone();
        self.depend_on(keyspace.range_holds_key(kind)).await?;
        let fresh = crate::auth::random_bytes::<16>()?;
        let (writes, undo, _, _) = self.parts();
        writes.put(keyspace.table_set_key(kind), fresh, undo)?;
        Ok(())
    }

    /// Makes the commit depend on `key` being as the transaction read it, unless the
    /// transaction already decided it.
    async fn depend_on(&mut self, key: Vec<u8>) -> Result<()> {
        if self.writes.get(&key).is_none() {
            let stored = self.base.values(std::slice::from_ref(&key)).await?;
            let stored = stored.into_iter().next().flatten();
            let (writes, undo, _, _) = self.parts();
            writes.require(key, as_read(stored.as_deref()), undo)?;
        }
        Ok(())
    }

    /// Moves each of `keys` (guards, range holds) on: the commit requires it as the
    /// transaction read it and writes the next count, so that a concurrent commit depending
    /// on it or moving it conflicts with this one whichever commits first.
    async fn move_on(&mut self, keys: Vec<Vec<u8>>) -> Result<()> {
        let unread: Vec<Vec<u8>> = keys
            .iter()
            .filter(|key| self.writes.read(key).is_none())
            .cloned()
            .collect();
        let values = self.base.values(&unread).await?;
        let mut stored: HashMap<Vec<u8>, Option<Vec<u8>>> =
            unread.into_iter().zip(values).collect();
        let (writes, undo, _, _) = self.parts();
        for key in keys {
            let now = if let Some(staged) = writes.read(&key) {
                staged.map(<[u8]>::to_vec)
            } else {
                let stored = stored.remove(&key).flatten();
                writes.require(&key, as_read(stored.as_deref()), undo)?;
                stored
            };
            let count = now
                .as_deref()
                .and_then(|value| <[u8; 8]>::try_from(value).ok())
                .map_or(0, u64::from_be_bytes);
            writes.put(key, count.wrapping_add(1).to_be_bytes(), undo)?;
        }
        Ok(())
    }

    /// The rows of row kind `kind` in `tables`, as the transaction sees them, for a change
    /// that acts on those tables whole (a delete of every row, the end of every file). The
    /// commit then requires each table's range to hold what the snapshot held, and moves each
    /// table's guard on, so that a concurrent insert, change or delete there conflicts with
    /// it, whichever commits first.
    async fn hold_tables(
        &mut self,
        kind: Kind,
        tables: &[TableId],
    ) -> Result<Vec<crate::codec::RowKey>> {
        let keyspace = self.base.keyspace().clone();
        let mut rows = Vec::new();
        for range in keyspace.tables_ranges(kind, tables.iter().copied()) {
            let (digest, keys) = self.read_range(&range, true).await?;
            for key in keys {
                rows.push(keyspace.decode(&key)?);
            }
            let (writes, undo, _, _) = self.parts();
            writes.require_range(range, digest, undo);
        }
        let guards = tables
            .iter()
            .map(|table| keyspace.guard_key(kind, *table))
            .collect();
        self.move_on(guards).await?;
        Ok(rows)
    }

    /// Holds key ranges of rows of row kind `kind`, or of its index, read whole by a
    /// statement that does not act on whole tables (a range of ids, a filter on other
    /// columns). Each range must hold at the commit what the snapshot held. On TiKV only keys
    /// two transactions both write or lock collide, so the statement also moves on the guard
    /// of every table marked in the span of the ranges (every table, for a range of the
    /// index) and the kind's range holds, and depends on the kind's table set: an insert into
    /// a marked table depends on that table's guard, and one marking a table changes the
    /// table set and depends on the range holds, so either conflicts with the statement
    /// whichever commits first.
    async fn hold_ranges(&mut self, kind: Kind, ranges: &[KeyRange]) -> Result<()> {
        let keyspace = self.base.keyspace().clone();
        let mut guards = BTreeSet::new();
        for range in ranges {
            let (digest, _) = self.read_range(range, false).await?;
            let (writes, undo, _, _) = self.parts();
            writes.require_range(range.clone(), digest, undo);
            let marks = keyspace.table_mark_span(kind, tables_spanned(&keyspace, kind, range));
            for mark in self.read_range(&marks, true).await?.1 {
                let (_, table) = keyspace.decode_head(&mark)?;
                guards.insert(keyspace.guard_key(kind, TableId(table)));
            }
        }
        self.depend_on(keyspace.table_set_key(kind)).await?;
        let mut keys: Vec<Vec<u8>> = guards.into_iter().collect();
        keys.push(keyspace.range_holds_key(kind));
        self.move_on(keys).await
    }

    /// What the transaction sees in `range`: the digest of what the snapshot holds there
    /// (what a commit requires it to hold still) and, with `keys`, the keys of its view (the
    /// stored ones less those the transaction deleted, with those it wrote) in key order.
    async fn read_range(
        &mut self,
        range: &KeyRange,
        keys: bool,
    ) -> Result<(Digest, BTreeSet<Bytes>)> {
        if keys {
            self.seal();
        }
        let mut digester = Digester::new();
        let mut view = BTreeSet::new();
        let mut pages = self.base.pages(vec![range.clone()], PageSize::default());
        while let Some(page) = pages.next().await {
            for (key, value) in page?.iter() {
                digester.pair(key, value);
                if keys {
                    view.insert(Bytes::copy_from_slice(key));
                }
            }
        }
        if keys {
            for (key, value) in self.writes.written_in(range) {
                if value.is_some() {
                    view.insert(Bytes::copy_from_slice(key));
                } else {
                    view.remove(key);
                }
            }
        }
        Ok((digester.finish(), view))
    }

    /// Makes the commit depend on the stored values of the rows `rows` of row kind `kind` that
    /// the transaction has not written: a delete or update of them then conflicts with a
    /// concurrent change. The ids `asked` for that the view does not hold must stay absent
    /// (for data files, whose ids are unique), so that a concurrent insert of one conflicts
    /// too.
    async fn hold_rows(
        &mut self,
        kind: Kind,
        rows: &[crate::codec::RowKey],
        asked: &[i64],
    ) -> Result<()> {
        let keyspace = self.base.keyspace().clone();
        let keys: Vec<Vec<u8>> = rows
            .iter()
            .map(|row| keyspace.row_key(kind, row.table_id, row.id))
            .filter(|key| self.writes.get(key).is_none())
            .collect();
        let values = self.base.values(&keys).await?;
        let (writes, undo, _, _) = self.parts();
        for (key, value) in keys.into_iter().zip(values) {
            writes.require(key, as_read(value.as_deref()), undo)?;
        }
        if kind == Kind::DataFile {
            let found: BTreeSet<i64> = rows.iter().map(|row| row.id).collect();
            for id in asked.iter().filter(|id| !found.contains(id)) {
                let key = keyspace.row_key(Kind::DataFileById, TableId(0), *id);
                writes.require(key, Requirement::Absent, undo)?;
            }
        }
        Ok(())
    }
}

impl Staging {
    /// Applies one change. Final violations go to `violations` (and the caller takes the
    /// request back, or fails the batch); pending ones stay in the staging until the commit.
    /// Returns the rows the change affected in the transaction's view.
    ///
    /// # Errors
    /// [`Error::Kv`] or [`Error::Codec`] when reading the snapshot fails, and
    /// [`Error::BadRows`] for rows that are not canonical for their table.
    pub async fn apply(&mut self, op: &Op, violations: &mut Vec<Violation>) -> Result<u64> {
        let affected = match op {
            Op::Insert(insert) => match insert.table() {
                CatalogTable::ColumnMapping => self.insert_mappings(insert, violations).await?,
                CatalogTable::NameMapping => self.insert_names(insert, violations)?,
                CatalogTable::DataFile => self.insert_files(insert, violations).await?,
            },
            Op::Delete(delete) => self.delete(delete, violations).await?,
            Op::Update(update) => self.update(update, violations).await?,
            Op::Hold(hold) => {
                self.hold(hold).await?;
                // Not a change: it affects no rows and has no count of its own.
                return Ok(0);
            }
        };
        self.affected.push(affected);
        Ok(affected)
    }

    /// The position of the first of `rows` rows inserted into `table`, among the
    /// transaction's inserts into it.
    fn positions(&mut self, table: CatalogTable, rows: usize) -> usize {
        let Some(slot) = self.inserted_rows.get_mut(table_slot(table)) else {
            return 0;
        };
        let first = *slot;
        *slot += rows;
        first
    }

    async fn insert_mappings(
        &mut self,
        insert: &Insert,
        violations: &mut Vec<Violation>,
    ) -> Result<u64> {
        let rows = canonical(insert)?;
        let first = self.positions(CatalogTable::ColumnMapping, rows.len());
        let null = |column, row: usize, row_id| Violation::NullColumn {
            table: CatalogTable::ColumnMapping,
            column,
            row: first + row,
            row_id,
        };
        let mut candidates = Vec::with_capacity(rows.len());
        for row in 0..rows.len() {
            let Some(mapping_id) = rows.int(column_mapping::MAPPING_ID, row) else {
                violations.push(null("mapping_id", row, None));
                continue;
            };
            let Some(table_id) = rows.int(column_mapping::TABLE_ID, row) else {
                violations.push(null("table_id", row, Some(mapping_id)));
                self.refuse(mapping_id);
                continue;
            };
            candidates.push((row, table_id, mapping_id));
        }
        self.guard_inserts(Kind::Mapping, candidates.iter().map(|(_, table, _)| *table))
            .await?;
        // A record and an index entry per mapping, and the mapping held as inserted.
        self.reserve(2 * candidates.len(), candidates.len(), candidates.len());
        // Does the snapshot hold the keys? One index span (what the staged writes decide is
        // looked at once per key, when it is inserted).
        let keyspace = self.base.keyspace().clone();
        let mut keys = RowKeys::default();
        let mut ask: Vec<i64> = candidates.iter().map(|(_, _, id)| *id).collect();
        ask.sort_unstable();
        ask.dedup();
        let in_base: std::collections::HashSet<MappingKey> = self
            .base
            .index_rows(Kind::MappingById, &ask)
            .await?
            .into_iter()
            .map(|row| (row.table_id.0, row.id))
            .collect();

        for (row, table_id, mapping_id) in candidates {
            keys.set(&keyspace, Kind::Mapping, TableId(table_id), mapping_id);
            if in_base.contains(&(table_id, mapping_id)) && self.writes.read(&keys.key).is_none() {
                violations.push(Violation::MappingExists {
                    table_id,
                    mapping_id,
                });
                self.refuse(mapping_id);
                continue;
            }
            let head = MappingHead {
                mapping_id,
                table_id,
                map_type: rows.text(column_mapping::TYPE, row),
            };
            let waiting = self.take_waiting(mapping_id);
            let mut names: Vec<NameRef<'_>> =
                waiting.iter().flatten().map(OwnedName::as_ref).collect();
            names.sort_by_key(|name| name.column_id);
            let mut pending = Vec::new();
            if fold::check_names(mapping_id, &names, violations, &mut pending) {
                self.refuse(mapping_id);
                continue;
            }
            let has_names = !names.is_empty();
            let (writes, undo, value_buf, _) = self.parts();
            let value =
                value_buf.value(|out| encode_mapping_into(out, &head, names.iter().copied()));
            let (prior, at) = writes.insert_new(&keys.key, value, undo)?;
            match prior {
                // Absent, or deleted by this transaction: created (again).
                Prior::Unstaged | Prior::Deleted => {}
                Prior::Written => {
                    violations.push(Violation::DuplicateMappingInBatch {
                        table_id,
                        mapping_id,
                    });
                    continue;
                }
                Prior::Required => {
                    violations.push(Violation::MappingExists {
                        table_id,
                        mapping_id,
                    });
                    self.refuse(mapping_id);
                    continue;
                }
            }
            writes.insert(&keys.index_key, &keys.index_value, undo)?;
            if !self.set_inserted_id(mapping_id, table_id, at, has_names) {
                self.set_unnamed((table_id, mapping_id), !has_names);
            }
            self.set_missing_parents((table_id, mapping_id), pending);
            self.summary.mappings_created += 1;
        }
        Ok(rows.len() as u64)
    }

    fn insert_names(&mut self, insert: &Insert, violations: &mut Vec<Violation>) -> Result<u64> {
        let rows = canonical(insert)?;
        let first = self.positions(CatalogTable::NameMapping, rows.len());
        let required = [
            name_mapping::MAPPING_ID,
            name_mapping::COLUMN_ID,
            name_mapping::SOURCE_NAME,
            name_mapping::TARGET_FIELD_ID,
            name_mapping::IS_PARTITION,
        ];
        let all_valid = !required.iter().any(|&column| rows.has_nulls(column));
        let mut valid: Vec<u32> = Vec::with_capacity(rows.len());
        if all_valid {
            // No NULL where one is refused (what every well-formed batch is): no row to check.
            let len = u32::try_from(rows.len()).map_err(|_| Error::InvalidRequest {
                reason: "a batch of more than 2^32 rows".into(),
            })?;
            valid.extend(0..len);
        } else {
            for row in 0..rows.len() {
                let null = |column, row_id| Violation::NullColumn {
                    table: CatalogTable::NameMapping,
                    column,
                    row: first + row,
                    row_id,
                };
                let Some(mapping_id) = rows.int(name_mapping::MAPPING_ID, row) else {
                    violations.push(null("mapping_id", None));
                    continue;
                };
                let before = violations.len();
                if rows.int(name_mapping::COLUMN_ID, row).is_none() {
                    violations.push(null("column_id", Some(mapping_id)));
                }
                if rows.text(name_mapping::SOURCE_NAME, row).is_none() {
                    violations.push(null("source_name", Some(mapping_id)));
                }
                if rows.int(name_mapping::TARGET_FIELD_ID, row).is_none() {
                    violations.push(null("target_field_id", Some(mapping_id)));
                }
                if rows.boolean(name_mapping::IS_PARTITION, row).is_none() {
                    violations.push(null("is_partition", Some(mapping_id)));
                }
                if violations.len() == before {
                    valid.push(u32::try_from(row).map_err(|_| Error::InvalidRequest {
                        reason: "a batch of more than 2^32 rows".into(),
                    })?);
                }
            }
        }
        let names = NameColumns::new(&rows).ok_or_else(|| Error::BadRows {
            table: CatalogTable::NameMapping,
            problem: "not the columns of ducklake_name_mapping".into(),
        })?;
        let order = fold::grouped(&names, &valid);
        let mut group: Vec<NameRef<'_>> = Vec::new();
        let mut rest = order.as_slice();
        while let Some(&head) = rest.first() {
            let mapping_id = names.mapping_id(head as usize);
            let len = rest
                .iter()
                .take_while(|&&row| names.mapping_id(row as usize) == mapping_id)
                .count();
            let (run, tail) = rest.split_at(len);
            rest = tail;
            group.clear();
            group.extend(run.iter().map(|&row| names.at(row as usize)));
            self.attach(mapping_id, &group, violations)?;
        }
        Ok(rows.len() as u64)
    }

    /// Adds name rows (sorted by `column_id`) to the mapping `mapping_id` this transaction
    /// inserted, or keeps them waiting for it.
    fn attach(
        &mut self,
        mapping_id: i64,
        group: &[NameRef<'_>],
        violations: &mut Vec<Violation>,
    ) -> Result<()> {
        let inserted = self
            .inserted_ids
            .get(&mapping_id)
            .map(|inserted| (inserted.table_id, inserted.at));
        let table_id = inserted.map(|(table_id, _)| table_id);
        let mut outcome = None;
        let held = match inserted {
            None => false,
            Some((table_id, at)) => {
                let (writes, undo, value_buf, keyspace) = self.parts();
                debug_assert!(
                    writes.key_at(at).is_some_and(|key| {
                        *key == *keyspace.row_key(Kind::Mapping, TableId(table_id), mapping_id)
                    }),
                    "mapping {mapping_id}'s record is not where it was staged"
                );
                writes.rewrite_at(at, undo, |value| -> Result<Option<&[u8]>> {
                    let record = read_mapping(value)?;
                    let head = record.head();
                    let existing: Vec<NameRef<'_>> = record.names().collect::<Result<_, _>>()?;
                    let merged: Cow<'_, [NameRef<'_>]> = if existing.is_empty() {
                        Cow::Borrowed(group)
                    } else {
                        let mut merged = existing;
                        merged.extend_from_slice(group);
                        merged.sort_by_key(|name| name.column_id);
                        Cow::Owned(merged)
                    };
                    let mut pending = Vec::new();
                    if fold::check_names(mapping_id, &merged, violations, &mut pending) {
                        outcome = Some(Err(()));
                        return Ok(None);
                    }
                    outcome = Some(Ok(pending));
                    Ok(Some(ValueBuffer::value(value_buf, |out| {
                        encode_mapping_into(out, &head, merged.iter().copied());
                    })))
                })?
            }
        };
        match (table_id, outcome) {
            (Some(table_id), Some(Ok(pending))) => {
                self.set_unnamed((table_id, mapping_id), false);
                self.set_missing_parents((table_id, mapping_id), pending);
            }
            (Some(table_id), Some(Err(()))) => {
                // The mapping is refused with its name rows: it leaves the view, so what
                // references it is reported too.
                let row = crate::codec::RowKey {
                    kind: Kind::Mapping,
                    table_id: TableId(table_id),
                    id: mapping_id,
                };
                self.delete_rows(Kind::Mapping, &[row])?;
                self.refuse(mapping_id);
            }
            _ if !held && !self.refused.contains(&mapping_id) => {
                self.extend_waiting(mapping_id, group.iter().map(OwnedName::of));
            }
            _ => {}
        }
        Ok(())
    }

    async fn insert_files(
        &mut self,
        insert: &Insert,
        violations: &mut Vec<Violation>,
    ) -> Result<u64> {
        let rows = canonical(insert)?;
        let first = self.positions(CatalogTable::DataFile, rows.len());
        let mut candidates = Vec::with_capacity(rows.len());
        for row in 0..rows.len() {
            let null = |column, row_id| Violation::NullColumn {
                table: CatalogTable::DataFile,
                column,
                row: first + row,
                row_id,
            };
            let Some(data_file_id) = rows.int(data_file::DATA_FILE_ID, row) else {
                violations.push(null("data_file_id", None));
                continue;
            };
            let Some(table_id) = rows.int(data_file::TABLE_ID, row) else {
                violations.push(null("table_id", Some(data_file_id)));
                continue;
            };
            candidates.push((row, data_file_id, table_id));
        }
        self.guard_inserts(
            Kind::DataFile,
            candidates.iter().map(|(_, _, table)| *table),
        )
        .await?;
        // A record and an index entry per file.
        self.reserve(2 * candidates.len(), 0, 0);
        let keyspace = self.base.keyspace().clone();
        let (in_base, found) = self.files_in_base(&rows, &candidates).await?;
        let mut key = Vec::new();
        let mut file = RowKeys::default();
        let mut references = Vec::new();
        for ((row, data_file_id, table_id), found) in candidates.into_iter().zip(found) {
            file.set(&keyspace, Kind::DataFile, TableId(table_id), data_file_id);
            if let Some(tables) = in_base.get(&data_file_id) {
                // The index is unique: its one key per id says whether the transaction wrote
                // it.
                if matches!(self.writes.read(&file.index_key), Some(Some(_))) {
                    violations.push(Violation::DuplicateDataFileInBatch { data_file_id });
                    continue;
                }
                let live_in_base = tables.iter().any(|table| {
                    key_into(&mut key, &keyspace, Kind::DataFile, *table, data_file_id);
                    !matches!(self.writes.read(&key), Some(None))
                });
                if live_in_base {
                    violations.push(Violation::DataFileExists { data_file_id });
                    continue;
                }
            }
            let (writes, undo, value_buf, _) = self.parts();
            // One look-up both finds an id the transaction already wrote and stages the new
            // one's index entry.
            let (prior, _) = writes.insert_new(&file.index_key, &file.index_value, undo)?;
            match prior {
                Prior::Unstaged | Prior::Deleted => {}
                Prior::Written => {
                    violations.push(Violation::DuplicateDataFileInBatch { data_file_id });
                    continue;
                }
                Prior::Required => {
                    violations.push(Violation::DataFileExists { data_file_id });
                    continue;
                }
            }
            let mut encoded = Ok(());
            let value = value_buf.value(|out| {
                encoded = encode_data_file_into(out, |i| rows.cell(i, row));
            });
            encoded?;
            writes.insert(&file.key, value, undo)?;
            if let (Some(mapping_id), Some(found)) = (rows.int(data_file::MAPPING_ID, row), found) {
                references.push(Reference {
                    data_file_id,
                    table_id,
                    mapping_id,
                    found,
                });
            }
            self.summary.files_created += 1;
        }
        self.references.extend(references);
        Ok(rows.len() as u64)
    }

    /// What the snapshot holds of the data files `candidates` (`(row, data_file_id,
    /// table_id)`) insert: the tables each id is in (one index span), and the keys of the
    /// mappings they reference that it holds (one sorted multi-get), leaving out what the
    /// staged writes decide.
    async fn files_in_base(
        &self,
        rows: &Columns<'_>,
        candidates: &[(usize, i64, i64)],
    ) -> Result<(HashMap<i64, Vec<i64>>, Vec<Option<Found>>)> {
        let keyspace = self.base.keyspace();
        let mut ids: Vec<i64> = candidates.iter().map(|(_, id, _)| *id).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut in_base: HashMap<i64, Vec<i64>> = HashMap::new();
        for row in self.base.index_rows(Kind::DataFileById, &ids).await? {
            in_base.entry(row.id).or_default().push(row.table_id.0);
        }
        let mut key = Vec::new();
        let mut found = Vec::with_capacity(candidates.len());
        let mut ask: Vec<Vec<u8>> = Vec::new();
        for (row, _, table_id) in candidates {
            let Some(mapping_id) = rows.int(data_file::MAPPING_ID, *row) else {
                found.push(None);
                continue;
            };
            // No need to build its key and probe the staged writes.
            if self.writes_mapping((*table_id, mapping_id)) {
                found.push(Some(Found::Staged));
                continue;
            }
            key_into(&mut key, keyspace, Kind::Mapping, *table_id, mapping_id);
            found.push(Some(match self.writes.read(&key) {
                Some(Some(_)) => Found::Staged,
                Some(None) => Found::Missing,
                None => {
                    ask.push(key.clone());
                    // Decided below, from the snapshot.
                    Found::InBase
                }
            }));
        }
        if !ask.is_empty() {
            let mut sorted = ask.clone();
            sorted.sort_unstable();
            sorted.dedup();
            let values = self.base.values(&sorted).await?;
            let present: BTreeSet<&[u8]> = sorted
                .iter()
                .zip(&values)
                .filter(|(_, value)| value.is_some())
                .map(|(key, _)| key.as_slice())
                .collect();
            let mut asked = ask.iter();
            for slot in &mut found {
                if *slot == Some(Found::InBase)
                    && let Some(key) = asked.next()
                    && !present.contains(key.as_slice())
                {
                    *slot = Some(Found::Missing);
                }
            }
        }
        Ok((in_base, found))
    }

    async fn hold(&mut self, hold: &Hold) -> Result<()> {
        match hold {
            Hold::Tables { kind, tables } => {
                self.hold_tables(*kind, tables).await?;
            }
            Hold::DataFileIds(ids) => {
                let ids = sorted(ids.iter().map(|id| id.0));
                let rows = self.view().index_rows(Kind::DataFileById, &ids).await?;
                self.hold_rows(Kind::DataFile, &rows, &ids).await?;
            }
            Hold::Ranges { kind, ranges } => self.hold_ranges(*kind, ranges).await?,
        }
        Ok(())
    }

    async fn delete(&mut self, delete: &Delete, violations: &mut Vec<Violation>) -> Result<u64> {
        let keyspace = self.base.keyspace().clone();
        match delete {
            Delete::ColumnMappingsOfTables(tables) => {
                let rows = self.hold_tables(Kind::Mapping, tables).await?;
                self.delete_rows(Kind::Mapping, &rows)
            }
            Delete::ColumnMappings(ids) => {
                let ids = sorted(ids.iter().map(|id| id.0));
                let rows = self.view().index_rows(Kind::MappingById, &ids).await?;
                self.hold_rows(Kind::Mapping, &rows, &ids).await?;
                self.delete_rows(Kind::Mapping, &rows)
            }
            Delete::OrphanNameMappings => Ok(0),
            Delete::NameMappings(ids) => {
                let rows = self
                    .view()
                    .index_rows(Kind::MappingById, &sorted(ids.iter().map(|id| id.0)))
                    .await?;
                for row in rows {
                    violations.push(Violation::LiveNameMappingDelete {
                        table_id: row.table_id.0,
                        mapping_id: row.id,
                    });
                }
                Ok(0)
            }
            Delete::DataFiles(ids) => {
                let ids = sorted(ids.iter().map(|id| id.0));
                let rows = self.view().index_rows(Kind::DataFileById, &ids).await?;
                self.hold_rows(Kind::DataFile, &rows, &ids).await?;
                self.delete_rows(Kind::DataFile, &rows)
            }
            Delete::DataFileIdRange(range) => {
                // The id range of the index is held whole: an insert of an id in it, or a
                // change to a file in it, conflicts with the delete.
                let span = keyspace.id_span(Kind::DataFileById, range.clone());
                self.hold_ranges(Kind::DataFile, &[span]).await?;
                let rows = self
                    .view()
                    .index_entries(Kind::DataFileById, range.clone())
                    .await?;
                self.hold_rows(Kind::DataFile, &rows, &[]).await?;
                self.delete_rows(Kind::DataFile, &rows)
            }
            Delete::DataFilesOfTables(tables) => {
                let rows = self.hold_tables(Kind::DataFile, tables).await?;
                self.delete_rows(Kind::DataFile, &rows)
            }
        }
    }

    /// Deletes rows of row kind `kind` present in the view, with their index entries.
    fn delete_rows(&mut self, kind: Kind, rows: &[crate::codec::RowKey]) -> Result<u64> {
        let mut deleted = 0;
        let mut keys = RowKeys::default();
        for row in rows {
            let (table_id, id) = (row.table_id.0, row.id);
            let (writes, undo, _, keyspace) = self.parts();
            keys.set(keyspace, kind, row.table_id, id);
            let created_here = writes.get(&keys.key).is_some_and(|staged| {
                staged.requirement == Requirement::Absent && matches!(staged.write, Some(Some(_)))
            });
            writes.delete(&keys.key, undo)?;
            writes.delete(&keys.index_key, undo)?;
            match (kind, created_here) {
                (Kind::Mapping, true) => self.summary.mappings_created -= 1,
                (Kind::Mapping, false) => self.summary.mappings_deleted += 1,
                (_, true) => self.summary.files_created -= 1,
                (_, false) => self.summary.files_deleted += 1,
            }
            if kind == Kind::Mapping {
                self.mappings_deleted = true;
            }
            if kind == Kind::Mapping && self.writes_mapping((table_id, id)) {
                self.set_unnamed((table_id, id), false);
                self.remove_inserted_id(id);
                self.set_missing_parents((table_id, id), Vec::new());
            }
            deleted += 1;
        }
        Ok(deleted)
    }

    async fn update(&mut self, update: &Update, violations: &mut Vec<Violation>) -> Result<u64> {
        let (end_snapshot, target) = match update {
            Update::MappingTable(table) => {
                violations.push(Violation::MappingUpdate { table: *table });
                return Ok(0);
            }
            Update::OtherDataFileUpdate { description } => {
                violations.push(Violation::UnsupportedDataFileUpdate {
                    reason: description.clone(),
                });
                return Ok(0);
            }
            Update::EndDataFiles {
                end_snapshot,
                target,
            } => (*end_snapshot, target),
        };
        let keyspace = self.base.keyspace().clone();
        let rows = match target {
            EndTarget::DataFiles(ids) => {
                let ids = sorted(ids.iter().map(|id| id.0));
                let rows = self.view().index_rows(Kind::DataFileById, &ids).await?;
                self.hold_rows(Kind::DataFile, &rows, &ids).await?;
                rows
            }
            EndTarget::Tables(tables) => self.hold_tables(Kind::DataFile, tables).await?,
        };
        let keys: Vec<Vec<u8>> = rows
            .iter()
            .map(|row| keyspace.row_key(Kind::DataFile, row.table_id, row.id))
            .collect();
        let values = self.view().values(&keys).await?;
        let mut updated = 0;
        for (key, value) in keys.into_iter().zip(values) {
            let Some(value) = value else { continue };
            let record: DataFileRecord<'_> = check_data_file(&keyspace, &key, &value)?;
            if record.cell(data_file::END_SNAPSHOT) != Cell::Null {
                continue;
            }
            let (writes, undo, value_buf, _) = self.parts();
            let mut encoded = Ok(());
            let ended = value_buf.value(|out| {
                encoded = encode_data_file_into(out, |i| {
                    if i == data_file::END_SNAPSHOT {
                        Cell::BigInt(end_snapshot)
                    } else {
                        record.cell(i)
                    }
                });
            });
            encoded?;
            let created_here = writes
                .get(&key)
                .is_some_and(|staged| staged.requirement == Requirement::Absent);
            // A stored file is held as read (above, or by its table's range).
            writes.put(key, ended, undo)?;
            if !created_here {
                self.summary.files_updated += 1;
            }
            updated += 1;
        }
        Ok(updated)
    }

    /// The violations a later change could still have mended, as they stand now: the
    /// transaction cannot commit while there are any.
    #[must_use]
    pub fn pending(&self) -> Vec<Violation> {
        let keyspace = self.base.keyspace();
        // In key order, as the mappings are stored.
        let mut unnamed: Vec<MappingKey> = self
            .inserted_ids
            .iter()
            .filter(|(_, inserted)| !inserted.named)
            .map(|(&id, inserted)| (inserted.table_id, id))
            .chain(self.unnamed.iter().copied())
            .collect();
        unnamed.sort_unstable();
        let mut out: Vec<Violation> = unnamed
            .into_iter()
            .map(|(table_id, mapping_id)| Violation::EmptyMapping {
                table_id,
                mapping_id,
            })
            .collect();
        let mut missing: Vec<(&MappingKey, &Vec<Violation>)> =
            self.missing_parents.iter().collect();
        missing.sort_unstable_by_key(|(key, _)| **key);
        out.extend(
            missing
                .into_iter()
                .flat_map(|(_, violations)| violations)
                .cloned(),
        );
        out.extend(
            self.waiting
                .iter()
                .map(|(&mapping_id, rows)| Violation::OrphanNameMappings {
                    mapping_id,
                    rows: rows.len(),
                }),
        );
        let mut key = Vec::new();
        for reference in &self.references {
            if reference.found == Found::Staged && !self.mappings_deleted {
                // Staged with the file, and no mapping deleted since: it holds.
                continue;
            }
            key_into(
                &mut key,
                keyspace,
                Kind::DataFile,
                reference.table_id,
                reference.data_file_id,
            );
            if !matches!(self.writes.read(&key), Some(Some(_))) {
                continue;
            }
            key_into(
                &mut key,
                keyspace,
                Kind::Mapping,
                reference.table_id,
                reference.mapping_id,
            );
            let known = match self.writes.read(&key) {
                Some(written) => written.is_some(),
                None => reference.found == Found::InBase,
            };
            if !known {
                out.push(Violation::UnknownMapping {
                    data_file_id: reference.data_file_id,
                    table_id: reference.table_id,
                    mapping_id: reference.mapping_id,
                });
            }
        }
        out
    }

    /// The staged writes to commit, once nothing is pending: every stored mapping an inserted
    /// file references is required to still be there.
    ///
    /// # Errors
    /// [`Error::Validation`] with every pending violation.
    pub fn into_writes(mut self) -> Result<(Arc<StagedWrites>, Vec<u64>, PlanSummary)> {
        let pending = self.pending();
        if !pending.is_empty() {
            return Err(Error::Validation(super::ValidationError {
                violations: pending,
            }));
        }
        self.end_request(true);
        let references = mem::take(&mut self.references);
        let mut key = Vec::new();
        for reference in references.into_iter().filter(|r| r.found == Found::InBase) {
            let (writes, undo, _, keyspace) = self.parts();
            let (table_id, mapping_id) = (reference.table_id, reference.mapping_id);
            key_into(&mut key, keyspace, Kind::Mapping, table_id, mapping_id);
            if writes.read(&key).is_none() {
                writes.require_present(&key, undo)?;
            }
        }
        // Not sealed here: the store seals them as it commits, beside its own work when its
        // backend can ([`crate::kv::KvBackend::orders_writes`]).
        Ok((self.writes, self.affected, self.summary))
    }

    // --- Bookkeeping that a request can take back. --------------------------------------

    /// Whether `inserted_ids` holds mapping `key`: the transaction inserted it and writes its
    /// record (a delete takes it out).
    fn writes_mapping(&self, (table_id, id): MappingKey) -> bool {
        self.inserted_ids
            .get(&id)
            .is_some_and(|inserted| inserted.table_id == table_id)
    }

    /// Holds mapping `id` of `table_id`, staged at `at`, as inserted by the transaction, with
    /// or without a name row, unless its id is held already; returns whether it was held now.
    fn set_inserted_id(&mut self, id: i64, table_id: i64, at: usize, named: bool) -> bool {
        let std::collections::hash_map::Entry::Vacant(slot) = self.inserted_ids.entry(id) else {
            return false;
        };
        slot.insert(Inserted {
            table_id,
            named,
            at,
        });
        self.record(Change::InsertedId { id, previous: None });
        true
    }

    /// Makes room for `keys` more staged keys, `mappings` more inserted mappings and `changes`
    /// more changes of the open request, in one step each: a batch's rows are known before
    /// they are staged, and growing a large table or vector a doubling at a time copies it
    /// each time into fresh memory.
    fn reserve(&mut self, keys: usize, mappings: usize, changes: usize) {
        Arc::make_mut(&mut self.writes).reserve(keys);
        self.inserted_ids.reserve(mappings);
        if let Some(journal) = self.journal.as_mut() {
            journal.changes.reserve(changes);
        }
    }

    fn remove_inserted_id(&mut self, id: i64) {
        if let Some(previous) = self.inserted_ids.remove(&id) {
            self.record(Change::InsertedId {
                id,
                previous: Some(previous),
            });
        }
    }

    fn set_unnamed(&mut self, key: MappingKey, unnamed: bool) {
        let was = self.mark_unnamed(key, unnamed);
        if was != unnamed {
            self.record(Change::Unnamed { key, was });
        }
    }

    /// Sets whether mapping `key` has no name row yet, recording nothing; returns whether it
    /// had none before. A mapping `inserted_ids` holds keeps it there, where its name rows
    /// look it up anyway.
    fn mark_unnamed(&mut self, key: MappingKey, unnamed: bool) -> bool {
        let (table_id, id) = key;
        match self.inserted_ids.get_mut(&id) {
            Some(inserted) if inserted.table_id == table_id => {
                let was = !inserted.named;
                inserted.named = !unnamed;
                was
            }
            _ if unnamed => !self.unnamed.insert(key),
            _ => self.unnamed.remove(&key),
        }
    }

    fn set_missing_parents(&mut self, key: MappingKey, missing: Vec<Violation>) {
        if missing.is_empty() && self.missing_parents.is_empty() {
            // What almost every mapping does: nothing to record, nothing to look up.
            return;
        }
        let previous = if missing.is_empty() {
            self.missing_parents.remove(&key)
        } else {
            self.missing_parents.insert(key, missing)
        };
        if previous.is_some() || self.missing_parents.contains_key(&key) {
            self.record(Change::MissingParents { key, previous });
        }
    }

    /// Marks mapping `id` as refused in this transaction: its name rows, waiting or still to
    /// come, go with the refusal.
    fn refuse(&mut self, id: i64) {
        if self.refused.insert(id) {
            self.record(Change::Refused { id });
        }
        drop(self.take_waiting(id));
    }

    fn take_waiting(&mut self, id: i64) -> Option<Vec<OwnedName>> {
        let names = self.waiting.remove(&id)?;
        self.waiting_bytes -= names.iter().map(OwnedName::size).sum::<usize>();
        self.record(Change::Waiting {
            id,
            previous: Some(names.clone()),
        });
        Some(names)
    }

    fn extend_waiting(&mut self, id: i64, names: impl Iterator<Item = OwnedName>) {
        let previous = self.waiting.get(&id).cloned();
        let slot = self.waiting.entry(id).or_default();
        let before = slot.len();
        slot.extend(names);
        self.waiting_bytes += slot
            .get(before..)
            .unwrap_or_default()
            .iter()
            .map(OwnedName::size)
            .sum::<usize>();
        self.record(Change::Waiting { id, previous });
    }
}

/// `ids` sorted, without duplicates.
fn sorted(ids: impl Iterator<Item = i64>) -> Vec<i64> {
    let mut ids: Vec<i64> = ids.collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}
