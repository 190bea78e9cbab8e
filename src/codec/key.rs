//! Memcomparable keys.
//!
//! | bytes     | field                                                                  |
//! |-----------|------------------------------------------------------------------------|
//! | 0..=64    | deployment key prefix, `[A-Za-z0-9._-]`, empty on the embedded default |
//! | 1         | subspace ([`Subspace`])                                                |
//! | 1         | kind ([`Kind`])                                                        |
//! | 8         | `table_id`, big-endian, sign bit flipped                               |
//! | 8         | row id (`mapping_id` or `data_file_id`), big-endian, sign bit flipped  |
//!
//! Index kinds (in the index subspace) put the row id first: the key alone says which row it
//! points to, and a range of row ids (DuckLake's `mapping_id >= cursor`, `data_file_id IN
//! (...)`) is one range of the index. The data-file index is unique: its key is the id alone
//! and its value the table, so one `data_file_id` can be in one table only, and two
//! transactions inserting it anywhere collide on one key. Guard keys, one per table and row
//! kind, are what a transaction that acts on a whole table range (DROP TABLE's end of every
//! file, a delete of every row) writes and what every insert into that table checks, so the
//! two conflict on every backend. A table's mark says it has had rows of a kind; per row
//! kind, a table-set key changes whenever a table gets its mark, and a range-holds key moves
//! on whenever a statement acts on a key range rather than on whole tables (a range of ids, a
//! filter on other columns). Such a statement moves on the guard of every marked table in its
//! span and depends on the table set; marking a table depends on the range holds. So an
//! insert into the range from any table, marked or getting its mark, conflicts with the
//! statement, and inserts, even two first ones into one table, never conflict with each
//! other (marks and the table set are written without depending on what was there).
//!
//! | kind             | subspace | tag  | components                 | value      |
//! |------------------|----------|------|----------------------------|------------|
//! | `Mapping`        | current  | 0x01 | `table_id, mapping_id`     | record     |
//! | `DataFile`       | current  | 0x02 | `table_id, data_file_id`   | record     |
//! | `MappingById`    | index    | 0x01 | `mapping_id, table_id`     | empty      |
//! | `DataFileByIdV1` | index    | 0x02 | `data_file_id, table_id`   | empty      |
//! | `DataFileById`   | index    | 0x03 | `data_file_id`             | `table_id` |
//! | `MappingGuard`   | guard    | 0x01 | `table_id`                 | counter    |
//! | `DataFileGuard`  | guard    | 0x02 | `table_id`                 | counter    |
//! | `MappingTable`   | guard    | 0x11 | `table_id`                 | empty      |
//! | `DataFileTable`  | guard    | 0x12 | `table_id`                 | empty      |
//! | `MappingTableSet`| guard    | 0x21 | `0` table set, `1` holds   | see above  |
//! | `DataFileTableSet`| guard   | 0x22 | `0` table set, `1` holds   | see above  |
//!
//! A deployment's settings (its DuckLake version) are one key each in a fourth subspace,
//! `prefix, 0x04, setting`, which no row or range of rows ever covers.
//!
//! `DataFileByIdV1` is the data-file index of stores written before the index was unique;
//! opening such a store moves its entries to `DataFileById` (see `catalog::upgrade`).
//!
//! Flipping the sign bit makes the unsigned byte order of an id equal its signed order, so
//! `(table_id, row id)` tuples sort in the store exactly as the integers do and every table of
//! one kind is one contiguous range. Prefix bytes are printable and subspace bytes are not, so
//! two deployments' keys never interleave, even when one prefix starts another.

use std::ops::RangeInclusive;

use super::{CodecError, hex};
use crate::key_range::{KeyRange, prefix_end};
use crate::model::{DataFileId, MappingId, TableId};

/// Longest deployment key prefix, in bytes.
pub const MAX_PREFIX_LEN: usize = 64;

/// Bytes after the prefix in a key of two ids: subspace, kind, two ids.
const ROW_KEY_LEN: usize = 1 + 1 + 8 + 8;

/// The top-level division of the keyspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Subspace {
    /// The current state of every catalog row.
    Current = 0x01,
    /// Secondary indexes: the id indexes of mappings and data files.
    Index = 0x02,
    /// One guard key per table and row kind.
    Guard = 0x03,
    /// The deployment's settings ([`Setting`]), one key each; never a row key.
    Meta = 0x04,
}

/// A setting a deployment records in its keyspace, under `prefix, Meta, tag`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Setting {
    /// The DuckLake catalog version the deployment serves; the value is its name (`0.3`).
    DuckLakeVersion = 0x01,
}

/// What a key's row is. The kind tag follows the subspace byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A `ducklake_column_mapping` row with its name-mapping rows, key `(table_id, mapping_id)`.
    Mapping,
    /// A `ducklake_data_file` row, key `(table_id, data_file_id)`.
    DataFile,
    /// Index of mappings by `mapping_id`: key `(mapping_id, table_id)`, empty value.
    MappingById,
    /// The unique index of data files by `data_file_id`: key `data_file_id`, value `table_id`.
    DataFileById,
    /// The index of data files by `data_file_id` before it was unique: key `(data_file_id,
    /// table_id)`, empty value. Read only to upgrade a store.
    DataFileByIdV1,
    /// The guard of a table's mappings: key `table_id`, value a counter.
    MappingGuard,
    /// The guard of a table's data files: key `table_id`, value a counter.
    DataFileGuard,
    /// The mark of a table that has had mappings: key `table_id`, empty value.
    MappingTable,
    /// The mark of a table that has had data files: key `table_id`, empty value.
    DataFileTable,
    /// The table set and the range holds of mapping tables: keys `0` and `1`.
    MappingTableSet,
    /// The table set and the range holds of data-file tables: keys `0` and `1`.
    DataFileTableSet,
}

impl Kind {
    /// Every kind, in key order.
    pub const ALL: [Kind; 11] = [
        Kind::Mapping,
        Kind::DataFile,
        Kind::MappingById,
        Kind::DataFileByIdV1,
        Kind::DataFileById,
        Kind::MappingGuard,
        Kind::DataFileGuard,
        Kind::MappingTable,
        Kind::DataFileTable,
        Kind::MappingTableSet,
        Kind::DataFileTableSet,
    ];

    /// The subspace this kind lives in.
    #[must_use]
    pub fn subspace(self) -> Subspace {
        match self {
            Kind::Mapping | Kind::DataFile => Subspace::Current,
            Kind::MappingById | Kind::DataFileById | Kind::DataFileByIdV1 => Subspace::Index,
            Kind::MappingGuard
            | Kind::DataFileGuard
            | Kind::MappingTable
            | Kind::DataFileTable
            | Kind::MappingTableSet
            | Kind::DataFileTableSet => Subspace::Guard,
        }
    }

    /// The kind's tag byte, unique within its subspace.
    #[must_use]
    pub fn tag(self) -> u8 {
        match self {
            Kind::Mapping | Kind::MappingById | Kind::MappingGuard => 0x01,
            Kind::DataFile | Kind::DataFileByIdV1 | Kind::DataFileGuard => 0x02,
            Kind::DataFileById => 0x03,
            Kind::MappingTable => 0x11,
            Kind::DataFileTable => 0x12,
            Kind::MappingTableSet => 0x21,
            Kind::DataFileTableSet => 0x22,
        }
    }

    /// How many ids the key holds after the kind byte.
    #[must_use]
    pub fn arity(self) -> usize {
        match self {
            Kind::Mapping | Kind::DataFile | Kind::MappingById | Kind::DataFileByIdV1 => 2,
            Kind::DataFileById
            | Kind::MappingGuard
            | Kind::DataFileGuard
            | Kind::MappingTable
            | Kind::DataFileTable
            | Kind::MappingTableSet
            | Kind::DataFileTableSet => 1,
        }
    }

    /// The guard kind of a row kind's tables.
    ///
    /// # Panics
    /// Never for a row kind; any other kind is a caller bug caught in debug builds.
    #[must_use]
    pub fn guard(self) -> Kind {
        debug_assert!(
            self.subspace() == Subspace::Current,
            "only row kinds have guards"
        );
        match self.counterpart_row() {
            Kind::DataFile => Kind::DataFileGuard,
            _ => Kind::MappingGuard,
        }
    }

    /// The table-mark kind of a row kind.
    ///
    /// # Panics
    /// Never for a row kind; any other kind is a caller bug caught in debug builds.
    #[must_use]
    pub fn table_mark(self) -> Kind {
        debug_assert!(
            self.subspace() == Subspace::Current,
            "only row kinds have table marks"
        );
        match self.counterpart_row() {
            Kind::DataFile => Kind::DataFileTable,
            _ => Kind::MappingTable,
        }
    }

    /// The table-set kind of a row kind.
    ///
    /// # Panics
    /// Never for a row kind; any other kind is a caller bug caught in debug builds.
    #[must_use]
    pub fn table_set(self) -> Kind {
        debug_assert!(
            self.subspace() == Subspace::Current,
            "only row kinds have table sets"
        );
        match self.counterpart_row() {
            Kind::DataFile => Kind::DataFileTableSet,
            _ => Kind::MappingTableSet,
        }
    }

    /// The row kind this kind is, or is about.
    fn counterpart_row(self) -> Kind {
        match self {
            Kind::Mapping | Kind::DataFile => self,
            _ => self.counterpart(),
        }
    }

    /// The index kind that finds rows of this kind by row id, or the row kind an index or
    /// guard kind is about.
    #[must_use]
    pub fn counterpart(self) -> Kind {
        match self {
            Kind::Mapping => Kind::MappingById,
            Kind::DataFile => Kind::DataFileById,
            Kind::MappingById | Kind::MappingGuard | Kind::MappingTable | Kind::MappingTableSet => {
                Kind::Mapping
            }
            Kind::DataFileById
            | Kind::DataFileByIdV1
            | Kind::DataFileGuard
            | Kind::DataFileTable
            | Kind::DataFileTableSet => Kind::DataFile,
        }
    }

    /// Whether the key puts the row id before the table id.
    fn is_index(self) -> bool {
        self.subspace() == Subspace::Index
    }

    fn from_bytes(subspace: u8, tag: u8) -> Option<Kind> {
        Kind::ALL
            .into_iter()
            .find(|kind| kind.subspace() as u8 == subspace && kind.tag() == tag)
    }
}

/// A validated deployment key prefix, so several lakes can share one TiKV cluster.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct KeyPrefix(Box<[u8]>);

impl KeyPrefix {
    /// The empty prefix: the embedded default, one lake per store.
    #[must_use]
    pub fn none() -> Self {
        Self::default()
    }

    /// A prefix of at most [`MAX_PREFIX_LEN`] bytes from `[A-Za-z0-9._-]`.
    ///
    /// # Errors
    /// [`CodecError::InvalidKeyPrefix`] for any other byte or a longer prefix.
    pub fn new(prefix: &str) -> Result<Self, CodecError> {
        let invalid = |reason| CodecError::InvalidKeyPrefix {
            prefix: prefix.to_owned(),
            reason,
        };
        if prefix.len() > MAX_PREFIX_LEN {
            return Err(invalid("longer than 64 bytes"));
        }
        if !prefix
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
        {
            return Err(invalid("only A-Z, a-z, 0-9, '.', '_' and '-' are allowed"));
        }
        Ok(Self(prefix.as_bytes().into()))
    }

    /// The prefix bytes.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// A decoded key: of a row, or of an index entry pointing to the row `(table_id, id)`, or of a
/// guard (`id` 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RowKey {
    /// The key's kind.
    pub kind: Kind,
    /// `table_id` of the row.
    pub table_id: TableId,
    /// `mapping_id` or `data_file_id` of the row, by kind.
    pub id: i64,
}

/// Builds and parses the keys of one deployment.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Keyspace {
    prefix: KeyPrefix,
}

impl Keyspace {
    /// The keyspace of the deployment with `prefix`.
    #[must_use]
    pub fn new(prefix: KeyPrefix) -> Self {
        Self { prefix }
    }

    /// This deployment's prefix.
    #[must_use]
    pub fn prefix(&self) -> &KeyPrefix {
        &self.prefix
    }

    /// The key of a deployment setting.
    #[must_use]
    pub fn setting_key(&self, setting: Setting) -> Vec<u8> {
        let mut key = self.prefix.as_bytes().to_vec();
        key.push(Subspace::Meta as u8);
        key.push(setting as u8);
        key
    }

    /// The key of mapping `mapping_id` of table `table_id`.
    #[must_use]
    pub fn mapping_key(&self, table_id: TableId, mapping_id: MappingId) -> Vec<u8> {
        self.row_key(Kind::Mapping, table_id, mapping_id.0)
    }

    /// The key of data file `data_file_id` of table `table_id`.
    #[must_use]
    pub fn data_file_key(&self, table_id: TableId, data_file_id: DataFileId) -> Vec<u8> {
        self.row_key(Kind::DataFile, table_id, data_file_id.0)
    }

    /// The key of row `id` of `kind` in table `table_id`; for an index kind, the key of the
    /// index entry of that row.
    #[must_use]
    pub fn row_key(&self, kind: Kind, table_id: TableId, id: i64) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.prefix.as_bytes().len() + ROW_KEY_LEN);
        self.put_row_key(&mut key, kind, table_id, id);
        key
    }

    /// Appends the key of [`row_key`](Self::row_key) to `out`, so that callers building many
    /// keys can build them into one buffer.
    ///
    /// A key of one id holds the row id for an index kind (the table goes in the entry's
    /// value, [`index_value`](Self::index_value)) and `table_id` for a guard.
    pub fn put_row_key(&self, out: &mut Vec<u8>, kind: Kind, table_id: TableId, id: i64) {
        let (first, second) = if kind.is_index() {
            (id, table_id.0)
        } else {
            (table_id.0, id)
        };
        out.extend_from_slice(self.prefix.as_bytes());
        out.push(kind.subspace() as u8);
        out.push(kind.tag());
        out.extend_from_slice(&encode_i64(first));
        if kind.arity() == 2 {
            out.extend_from_slice(&encode_i64(second));
        }
    }

    /// The index entry of row `(kind, table_id, id)`, of a row kind: its key under
    /// `kind.counterpart()`, appended to `out`, and its value. A row and its entry are written
    /// and deleted together; this is the one place that knows what the entry is.
    pub fn put_index_entry(
        &self,
        out: &mut Vec<u8>,
        kind: Kind,
        table_id: TableId,
        id: i64,
    ) -> Option<[u8; 8]> {
        let index = kind.counterpart();
        self.put_row_key(out, index, table_id, id);
        Self::index_table(index, table_id)
    }

    /// The index entry of a row key: the same row under `kind.counterpart()`.
    #[must_use]
    pub fn index_key(&self, row: RowKey) -> Vec<u8> {
        self.row_key(row.kind.counterpart(), row.table_id, row.id)
    }

    /// The value of the index entry of kind `index` for a row of table `table_id`: the table,
    /// where the key does not hold it.
    #[must_use]
    pub fn index_value(index: Kind, table_id: TableId) -> Vec<u8> {
        Self::index_table(index, table_id).map_or_else(Vec::new, |table| table.to_vec())
    }

    /// The value of an index entry of kind `index` for a row of table `table_id`, when it is
    /// not empty: the table, where the key does not hold it.
    fn index_table(index: Kind, table_id: TableId) -> Option<[u8; 8]> {
        (index.is_index() && index.arity() == 1).then(|| encode_i64(table_id.0))
    }

    /// The guard key of the tables of row kind `kind`, for table `table_id`.
    #[must_use]
    pub fn guard_key(&self, kind: Kind, table_id: TableId) -> Vec<u8> {
        self.row_key(kind.guard(), table_id, 0)
    }

    /// The table-set key of row kind `kind`: it changes, to a value it never had before,
    /// whenever one of the kind's tables gets its mark.
    #[must_use]
    pub fn table_set_key(&self, kind: Kind) -> Vec<u8> {
        self.row_key(kind.table_set(), TableId(0), 0)
    }

    /// The range-holds key of row kind `kind`: a counter that moves on whenever a statement
    /// holds a key range of the kind across tables. A transaction that gives a table its
    /// mark depends on it.
    #[must_use]
    pub fn range_holds_key(&self, kind: Kind) -> Vec<u8> {
        self.row_key(kind.table_set(), TableId(1), 0)
    }

    /// The mark of table `table_id` of row kind `kind`: present once the table has had a
    /// row of that kind.
    #[must_use]
    pub fn table_mark_key(&self, kind: Kind, table_id: TableId) -> Vec<u8> {
        self.row_key(kind.table_mark(), table_id, 0)
    }

    /// The table marks of row kind `kind` for the tables `tables.start()..=tables.end()`:
    /// one range.
    #[must_use]
    pub fn table_mark_span(&self, kind: Kind, tables: RangeInclusive<i64>) -> KeyRange {
        self.span(kind.table_mark(), tables)
    }

    /// Parses an index entry, key and value, into the row it points to.
    ///
    /// # Errors
    /// As [`decode`](Self::decode), or [`CodecError::IndexValue`] for a value that is not a
    /// table id where the key leaves the table to the value.
    pub fn decode_entry(&self, key: &[u8], value: &[u8]) -> Result<RowKey, CodecError> {
        let (kind, first, second) = self.components(key)?;
        if kind.is_index() && kind.arity() == 1 {
            let table = <[u8; 8]>::try_from(value).map_err(|_| CodecError::IndexValue {
                key: hex(key),
                len: value.len(),
            })?;
            return Ok(RowKey {
                kind,
                table_id: TableId(decode_i64(table)),
                id: first,
            });
        }
        Ok(row_of(kind, first, second))
    }

    /// Every entry of index `kind` for the row ids `ids.start()..=ids.end()`: one range.
    /// An empty interval gives an empty range.
    ///
    /// # Panics
    /// Never for an index kind; a row kind is a caller bug caught in debug builds.
    #[must_use]
    pub fn id_span(&self, kind: Kind, ids: RangeInclusive<i64>) -> KeyRange {
        debug_assert!(kind.is_index(), "id spans are ranges of an index kind");
        self.span(kind, ids)
    }

    /// The rows of row kind `kind` in table `table_id` whose ids lie in `ids`: one range.
    /// An empty interval gives an empty range.
    #[must_use]
    pub fn row_span(&self, kind: Kind, table_id: TableId, ids: RangeInclusive<i64>) -> KeyRange {
        debug_assert!(!kind.is_index(), "row spans are ranges of a row kind");
        let (lo, hi) = ids.into_inner();
        let start = self.row_key(kind, table_id, lo);
        if lo > hi {
            return KeyRange::new(start.clone(), start);
        }
        let end = match hi.checked_add(1) {
            Some(next) => self.row_key(kind, table_id, next),
            None => self.table_range(kind, table_id).end,
        };
        KeyRange::new(start, end)
    }

    /// Every row of `kind`: one range.
    #[must_use]
    pub fn kind_range(&self, kind: Kind) -> KeyRange {
        range_of_prefix(self.kind_head(kind))
    }

    /// Every row of every row kind (the current subspace): one range, whose keys group into
    /// tables by their first [`table_head_len`](Self::table_head_len) bytes.
    #[must_use]
    pub fn rows_range(&self) -> KeyRange {
        let mut head = self.prefix.as_bytes().to_vec();
        head.push(Subspace::Current as u8);
        range_of_prefix(head)
    }

    /// Length of a row key's table head (prefix, subspace, kind, `table_id`): the row keys
    /// that share their first this many bytes are one table's rows of one kind, and the
    /// bounds of [`kind_range`](Self::kind_range) and [`table_span`](Self::table_span) are
    /// no longer, so such a range is made of whole tables.
    #[must_use]
    pub fn table_head_len(&self) -> usize {
        self.first_component_end()
    }

    /// Length of an index key's id head (prefix, subspace, kind, row id): the entries that
    /// share their first this many bytes list one row id.
    #[must_use]
    pub fn id_head_len(&self) -> usize {
        self.first_component_end()
    }

    /// Where a key's first id ends: after the prefix, the subspace, the kind and that id.
    fn first_component_end(&self) -> usize {
        self.prefix.as_bytes().len() + 1 + 1 + 8
    }

    /// Every row of `kind` in table `table_id`: one contiguous range.
    #[must_use]
    pub fn table_range(&self, kind: Kind, table_id: TableId) -> KeyRange {
        self.table_span(kind, table_id..=table_id)
    }

    /// Every row of `kind` in the tables `tables.start()..=tables.end()`: one range.
    /// An empty interval gives an empty range.
    #[must_use]
    pub fn table_span(&self, kind: Kind, tables: RangeInclusive<TableId>) -> KeyRange {
        debug_assert!(!kind.is_index(), "table spans are ranges of a row kind");
        let (lo, hi) = tables.into_inner();
        self.span(kind, lo.0..=hi.0)
    }

    /// The keys of `kind` whose first component lies in `first`.
    fn span(&self, kind: Kind, first: RangeInclusive<i64>) -> KeyRange {
        let (lo, hi) = first.into_inner();
        if lo > hi {
            let start = self.head(kind, lo);
            return KeyRange::new(start.clone(), start);
        }
        let end = match hi.checked_add(1) {
            Some(next) => self.head(kind, next),
            None => self.kind_range(kind).end,
        };
        KeyRange::new(self.head(kind, lo), end)
    }

    /// The first table of row kind `kind` whose keys all lie at or after `cut`: where a
    /// division of the kind's range at the key `cut` (any bytes, such as a region boundary)
    /// falls between tables. `None` when no table of `kind` starts at or after `cut`.
    #[must_use]
    pub fn first_table_from(&self, kind: Kind, cut: &[u8]) -> Option<i64> {
        let range = self.kind_range(kind);
        if cut <= range.start.as_slice() {
            return Some(i64::MIN);
        }
        if cut >= range.end.as_slice() {
            return None;
        }
        let head = range.start.len();
        let mut bytes = [0u8; 8];
        for (to, from) in bytes.iter_mut().zip(cut.iter().skip(head)) {
            *to = *from;
        }
        let table = decode_i64(bytes);
        if cut <= self.head(kind, table).as_slice() {
            Some(table)
        } else {
            table.checked_add(1)
        }
    }

    /// The ranges of a set of tables, sorted, each table once; neighbouring tables are merged
    /// into one range.
    #[must_use]
    pub fn tables_ranges(
        &self,
        kind: Kind,
        tables: impl IntoIterator<Item = TableId>,
    ) -> Vec<KeyRange> {
        let mut ids: Vec<i64> = tables.into_iter().map(|t| t.0).collect();
        ids.sort_unstable();
        ids.dedup();
        let mut spans: Vec<(i64, i64)> = Vec::with_capacity(ids.len());
        for id in ids {
            match spans.last_mut() {
                Some((_, hi)) if hi.checked_add(1) == Some(id) => *hi = id,
                _ => spans.push((id, id)),
            }
        }
        spans
            .into_iter()
            .map(|(lo, hi)| self.table_span(kind, TableId(lo)..=TableId(hi)))
            .collect()
    }

    /// Parses a row key of this deployment.
    ///
    /// # Errors
    /// A [`CodecError`] naming what does not match: prefix, subspace, kind or length, or
    /// [`CodecError::TableInValue`] for an index entry whose table only its value holds
    /// ([`decode_entry`](Self::decode_entry) reads those).
    pub fn decode(&self, key: &[u8]) -> Result<RowKey, CodecError> {
        let (kind, first, second) = self.components(key)?;
        if kind.is_index() && kind.arity() == 1 {
            return Err(CodecError::TableInValue { key: hex(key) });
        }
        Ok(row_of(kind, first, second))
    }

    /// The kind of a key of this deployment, or of a range bound holding at least its first
    /// id, and that id (the row id of an index entry, the table of a row or a guard).
    ///
    /// # Errors
    /// As [`decode`](Self::decode), except that any valid key or such bound parses.
    pub fn decode_head(&self, key: &[u8]) -> Result<(Kind, i64), CodecError> {
        let (kind, first, _) = self.parse(key, true)?;
        Ok((kind, first))
    }

    fn components(&self, key: &[u8]) -> Result<(Kind, i64, i64), CodecError> {
        self.parse(key, false)
    }

    /// The kind and ids of `key`; with `head`, a key cut after its first id parses too.
    fn parse(&self, key: &[u8], head: bool) -> Result<(Kind, i64, i64), CodecError> {
        let prefix = self.prefix.as_bytes();
        // Not `strip_prefix` for the empty prefix (the embedded default): it calls `memcmp`
        // of 0 bytes at the empty slice's dangling address, whose masked vector load faults
        // (suppressed, slowly) on an unmapped page: a quarter of a table-scoped load's CPU.
        let rest = if prefix.is_empty() {
            key
        } else {
            key.strip_prefix(prefix)
                .ok_or_else(|| CodecError::ForeignPrefix { key: hex(key) })?
        };
        let Some((&subspace, rest)) = rest.split_first() else {
            return Err(length_error(key, 0, ROW_KEY_LEN));
        };
        if ![Subspace::Current, Subspace::Index, Subspace::Guard]
            .iter()
            .any(|known| *known as u8 == subspace)
        {
            return Err(CodecError::UnknownSubspace {
                key: hex(key),
                subspace,
            });
        }
        let Some((&tag, ids)) = rest.split_first() else {
            return Err(length_error(key, 1, ROW_KEY_LEN));
        };
        let kind = Kind::from_bytes(subspace, tag).ok_or_else(|| CodecError::UnknownKind {
            key: hex(key),
            kind: tag,
        })?;
        let expected = 2 + 8 * kind.arity();
        let head_only = head && (8..8 * kind.arity()).contains(&ids.len());
        if ids.len() != 8 * kind.arity() && !head_only {
            return Err(length_error(key, 2 + ids.len(), expected));
        }
        let id = |at: usize| {
            ids.get(at..at + 8)
                .and_then(|bytes| <[u8; 8]>::try_from(bytes).ok())
                .map_or(0, decode_i64)
        };
        Ok((kind, id(0), id(8)))
    }

    fn kind_head(&self, kind: Kind) -> Vec<u8> {
        let mut key = Vec::with_capacity(self.prefix.as_bytes().len() + ROW_KEY_LEN);
        key.extend_from_slice(self.prefix.as_bytes());
        key.push(kind.subspace() as u8);
        key.push(kind.tag());
        key
    }

    /// The prefix of every key of `kind` whose first component is `first`.
    fn head(&self, kind: Kind, first: i64) -> Vec<u8> {
        let mut key = self.kind_head(kind);
        key.extend_from_slice(&encode_i64(first));
        key
    }
}

fn length_error(key: &[u8], actual: usize, expected: usize) -> CodecError {
    CodecError::KeyLength {
        key: hex(key),
        expected,
        actual,
    }
}

/// The row a key of two ids (or a guard's one) names.
fn row_of(kind: Kind, first: i64, second: i64) -> RowKey {
    let (table_id, id) = if kind.is_index() {
        (second, first)
    } else {
        (first, second)
    };
    RowKey {
        kind,
        table_id: TableId(table_id),
        id,
    }
}

/// Big-endian with the sign bit flipped: byte order equals signed integer order.
#[must_use]
pub fn encode_i64(value: i64) -> [u8; 8] {
    (value.cast_unsigned() ^ (1 << 63)).to_be_bytes()
}

/// The inverse of [`encode_i64`].
#[must_use]
pub fn decode_i64(bytes: [u8; 8]) -> i64 {
    (u64::from_be_bytes(bytes) ^ (1 << 63)).cast_signed()
}

/// The range of every key that starts with `prefix`.
///
/// `prefix` always ends in a kind byte here, which is never `0xff`, so the successor is the
/// prefix with its last byte incremented.
fn range_of_prefix(prefix: Vec<u8>) -> KeyRange {
    let end = prefix_end(&prefix).unwrap_or_default();
    KeyRange::new(prefix, end)
}

#[cfg(test)]
mod tests;
