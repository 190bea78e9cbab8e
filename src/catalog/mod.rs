//! Snapshot reads of the catalog's records: point gets, index look-ups and paged range scans.
//!
//! This is the one place that knows how records are found: a table's rows by key range, rows
//! by id through the id indexes, and rows in id order across tables. It writes only to bring a
//! store of an earlier layout up to date ([`Catalog::upgrade`]). Records
//! leave as [`Page`]s of stored pairs; [`check_mapping`] and [`check_data_file`] read a pair in
//! place and check it against its key (a value whose ids disagree with its key is
//! corruption, reported as such).

use std::ops::RangeInclusive;
use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt as _};

use crate::codec::{
    CodecError, DataFileRecord, Keyspace, Kind, MappingHead, MappingRecord, RawName, RowKey,
    Setting, decode_mapping, hex, read_data_file, read_mapping, read_mapping_raw,
};
use crate::error::Result;
use crate::kv::{
    CommitOutcome, Conflict, Division, KeyRange, Page, PageSize, Snapshot, StagedWrites, Store,
};
use crate::model::{ColumnMapping, DuckLakeVersion, MappingId, TableId};

mod id_order;

/// Index entries read per page when rows are read in id order.
const ID_ORDER_PAGE: PageSize = PageSize {
    rows: 8192,
    bytes: 4 << 20,
};

/// Index entries of the first page when rows are read in id order; the pages after it double
/// up to [`ID_ORDER_PAGE`]. A full first page reads (with its read-ahead) eight times its
/// 8,192 rows before the first row leaves: at 100k mappings, 40 ms of one core during which
/// nothing downstream has work.
const ID_ORDER_FIRST_ENTRIES: usize = 64;

/// A set of ids whose span is at most this many times its size is read as one span of the
/// index (a sequential read of small entries); a sparser set is probed one run of consecutive
/// ids at a time, in one round trip.
const DENSE_SPAN_FACTOR: i64 = 16;

/// The catalog: a store and the keyspace of one deployment in it.
#[derive(Debug, Clone)]
pub struct Catalog {
    store: Store,
    keyspace: Keyspace,
    ducklake: DuckLakeVersion,
}

impl Catalog {
    /// The catalog of `keyspace` in `store`, serving DuckLake 0.3's tables until
    /// [`with_ducklake`](Self::with_ducklake) says otherwise.
    #[must_use]
    pub fn new(store: Store, keyspace: Keyspace) -> Self {
        Self {
            store,
            keyspace,
            ducklake: DuckLakeVersion::default(),
        }
    }

    /// This catalog serving DuckLake `version`'s tables (what
    /// [`settle_ducklake`](Self::settle_ducklake) returned).
    #[must_use]
    pub fn with_ducklake(self, version: DuckLakeVersion) -> Self {
        Self {
            ducklake: version,
            ..self
        }
    }

    /// The DuckLake version whose tables this catalog serves and accepts.
    #[must_use]
    pub fn ducklake(&self) -> DuckLakeVersion {
        self.ducklake
    }

    /// The DuckLake version of the deployment: the one its keyspace records, else
    /// `requested` (0.3 when `None`), which is then recorded, so that every later start
    /// serves the same one.
    ///
    /// # Errors
    /// [`Error::Config`](crate::Error::Config) when `requested` is not the recorded version,
    /// when the record names no version this build knows, or when a store that holds data
    /// files from before versions were recorded (DuckLake 0.3's) is asked for another;
    /// [`Error::Kv`](crate::Error::Kv) when the store fails.
    pub async fn settle_ducklake(
        &self,
        requested: Option<DuckLakeVersion>,
    ) -> Result<DuckLakeVersion> {
        let key = self.keyspace.setting_key(Setting::DuckLakeVersion);
        loop {
            let snapshot = self.store.snapshot().await?;
            if let Some(value) = snapshot.get(&key).await? {
                let name = String::from_utf8_lossy(&value);
                let recorded = DuckLakeVersion::parse(&name).ok_or_else(|| {
                    version_error(format!(
                        "the store records DuckLake version {name:?}, which this moraine \
                         does not serve (it serves {})",
                        served_versions()
                    ))
                })?;
                return match requested {
                    Some(asked) if asked != recorded => Err(version_error(format!(
                        "this deployment serves DuckLake {recorded}'s catalog, recorded at \
                         its first start; it cannot serve DuckLake {asked}'s (a deployment of \
                         {asked} needs a fresh data directory or key prefix)"
                    ))),
                    _ => Ok(recorded),
                };
            }
            let version = requested.unwrap_or_default();
            let files = snapshot
                .page(&self.keyspace.kind_range(Kind::DataFile), PageSize::rows(1))
                .await?;
            if version != DuckLakeVersion::V0_3 && !files.is_empty() {
                return Err(version_error(format!(
                    "the store holds data files from before moraine recorded DuckLake \
                     versions, which are DuckLake 0.3's; it cannot serve {version}"
                )));
            }
            let mut writes = crate::kv::WriteSet::new();
            writes.insert(key.clone(), version.name().as_bytes().to_vec());
            match self.store.commit(writes).await? {
                CommitOutcome::Committed => return Ok(version),
                // Another server recorded one first: read it.
                CommitOutcome::Conflict(_) => {}
                CommitOutcome::Unknown { reason } => {
                    return Err(crate::Error::CommitUnknown { reason });
                }
            }
        }
    }

    /// The underlying store.
    #[must_use]
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// This deployment's keyspace.
    #[must_use]
    pub fn keyspace(&self) -> &Keyspace {
        &self.keyspace
    }

    /// Brings a store written by an earlier moraine to the current layout: moves the entries
    /// of the data-file index from its first layout (`data_file_id, table_id` in the key) to
    /// the unique one (the id alone), one page per commit, so that an interrupted upgrade
    /// resumes where it stopped. Returns how many entries moved.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv) when the store fails, and
    /// [`Error::Config`](crate::Error::Config) when two tables hold the same `data_file_id`
    /// (which the first layout let concurrent commits do): the index cannot be unique until
    /// one of them is removed.
    pub async fn upgrade(&self) -> Result<u64> {
        let old = self.keyspace.kind_range(Kind::DataFileByIdV1);
        let mut moved = 0;
        loop {
            let snapshot = self.store.snapshot().await?;
            let page = snapshot.page(&old, PageSize::rows(UPGRADE_PAGE)).await?;
            if page.is_empty() {
                return Ok(moved);
            }
            let mut writes = crate::kv::WriteSet::new();
            let mut previous: Option<RowKey> = None;
            for (key, _) in page.iter() {
                let entry = self.keyspace.decode(key)?;
                if let Some(previous) = previous.filter(|p| p.id == entry.id) {
                    return Err(duplicate_file(entry.id, previous.table_id, entry.table_id));
                }
                previous = Some(entry);
                writes.delete(key.to_vec()).insert(
                    self.keyspace
                        .row_key(Kind::DataFileById, entry.table_id, entry.id),
                    Keyspace::index_value(Kind::DataFileById, entry.table_id),
                );
            }
            let entries = page.len() as u64;
            match self.store.commit(writes).await? {
                CommitOutcome::Committed => moved += entries,
                CommitOutcome::Conflict(Conflict::AlreadyExists { key }) => {
                    let id = self.keyspace.decode_head(&key)?.1;
                    let now = self.snapshot().await?;
                    let held = now.index_rows(Kind::DataFileById, &[id]).await?;
                    let first = held.first().map_or(TableId(0), |row| row.table_id);
                    let second = page
                        .iter()
                        .filter_map(|(key, _)| self.keyspace.decode(key).ok())
                        .find(|row| row.id == id)
                        .map_or(TableId(0), |row| row.table_id);
                    return Err(duplicate_file(id, first, second));
                }
                // Another server upgrading the same keyspace moved these first: read on.
                CommitOutcome::Conflict(_) => {}
                CommitOutcome::Unknown { reason } => {
                    return Err(crate::Error::CommitUnknown { reason });
                }
            }
        }
    }

    /// A consistent view of the catalog.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv) when the store cannot provide one.
    pub async fn snapshot(&self) -> Result<CatalogSnapshot> {
        Ok(CatalogSnapshot {
            snapshot: self.store.snapshot().await?,
            keyspace: self.keyspace.clone(),
        })
    }
}

fn version_error(reason: String) -> crate::Error {
    crate::Error::Config {
        setting: "ducklake-version",
        reason,
    }
}

/// The versions this build serves, for messages: `0.3, 1.0, 1.1`.
fn served_versions() -> String {
    DuckLakeVersion::ALL.map(DuckLakeVersion::name).join(", ")
}

/// Index entries one commit of [`Catalog::upgrade`] moves.
const UPGRADE_PAGE: usize = 1024;

fn duplicate_file(data_file_id: i64, first: TableId, second: TableId) -> crate::Error {
    crate::Error::Config {
        setting: "data directory",
        reason: format!(
            "data_file_id {data_file_id} is in table {first} and in table {second}; \
             data_file_id is unique across tables, so remove one of the two files (with an \
             earlier moraine) before starting this one"
        ),
    }
}

/// A part of a kind's rows: the rows of a range of whole tables.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TablePart {
    /// The tables, by id.
    pub tables: RangeInclusive<i64>,
    /// The part's key and value bytes, where the store measured them.
    pub volume: Option<u64>,
}

/// A consistent view of the catalog: every read sees the same committed state.
#[derive(Debug, Clone)]
pub struct CatalogSnapshot {
    snapshot: Snapshot,
    keyspace: Keyspace,
}

impl CatalogSnapshot {
    /// This view with `writes` applied, uncommitted: a transaction's view of its own staged
    /// changes. Shares `writes`; copies nothing.
    #[must_use]
    pub fn overlaid(&self, writes: Arc<StagedWrites>) -> CatalogSnapshot {
        CatalogSnapshot {
            snapshot: self.snapshot.overlaid(writes),
            keyspace: self.keyspace.clone(),
        }
    }

    /// The same keyspace over an empty store ([`Snapshot::empty`]): what the scans of a plan
    /// kept between executions read until each execution binds them to its own snapshot.
    #[must_use]
    pub fn detached(&self) -> CatalogSnapshot {
        CatalogSnapshot {
            snapshot: Snapshot::empty(),
            keyspace: self.keyspace.clone(),
        }
    }

    /// The keyspace read.
    #[must_use]
    pub fn keyspace(&self) -> &Keyspace {
        &self.keyspace
    }

    /// The store view underneath.
    #[must_use]
    pub fn kv(&self) -> &Snapshot {
        &self.snapshot
    }

    /// Mapping `mapping_id` of table `table_id`, decoded.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv) or [`Error::Codec`](crate::Error::Codec).
    pub async fn mapping(
        &self,
        table_id: TableId,
        mapping_id: MappingId,
    ) -> Result<Option<ColumnMapping>> {
        let key = self.keyspace.mapping_key(table_id, mapping_id);
        match self.snapshot.get(&key).await? {
            Some(value) => {
                check_mapping(&self.keyspace, &key, &value)?;
                Ok(Some(decode_mapping(&value)?))
            }
            None => Ok(None),
        }
    }

    /// The rows that index `index` lists for `ids` (sorted, without duplicates), in id order.
    /// Dense ids are read as one span of the index; sparse ones as one short range each, in
    /// one round trip.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv) or [`Error::Codec`](crate::Error::Codec).
    pub async fn index_rows(&self, index: Kind, ids: &[i64]) -> Result<Vec<RowKey>> {
        let (Some(&first), Some(&last)) = (ids.first(), ids.last()) else {
            return Ok(Vec::new());
        };
        let count = i64::try_from(ids.len()).unwrap_or(i64::MAX);
        let span = last.saturating_sub(first).saturating_add(1);
        if span <= count.saturating_mul(DENSE_SPAN_FACTOR) {
            let rows = self.index_entries(index, first..=last).await?;
            return Ok(rows
                .into_iter()
                .filter(|row| ids.binary_search(&row.id).is_ok())
                .collect());
        }
        let runs = runs(ids);
        let ranges: Vec<KeyRange> = runs
            .iter()
            .map(|run| self.keyspace.id_span(index, run.clone()))
            .collect();
        let mut rows = Vec::new();
        // Each run's entries: at most one per table of each id, so a page of a few per id
        // holds them; a longer run is read on.
        for (range, page) in ranges.iter().zip(
            self.snapshot
                .first_pages(&ranges, PageSize::rows(64))
                .await?,
        ) {
            let exhausted = page.is_exhausted();
            rows.extend(self.index_page_rows(index, &page)?);
            if !exhausted && let Some(last) = page.last_key() {
                let rest = range.after(last);
                let mut pages = self.snapshot.scan(rest);
                while let Some(page) = pages.next().await {
                    rows.extend(self.index_page_rows(index, &page?)?);
                }
            }
        }
        Ok(rows)
    }

    /// The ids in `ids` that index `index` may list more than once (for more than one
    /// table), in order, where the store keeps track ([`Snapshot::twins`]); `None` where it
    /// does not, and any id may be.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv) or [`Error::Codec`](crate::Error::Codec).
    pub async fn twin_ids(
        &self,
        index: Kind,
        ids: RangeInclusive<i64>,
    ) -> Result<Option<Vec<i64>>> {
        let range = self.keyspace.id_span(index, ids);
        let Some(twins) = self.snapshot.twins(&range).await? else {
            return Ok(None);
        };
        let mut out = twins
            .iter()
            .map(|head| Ok(self.keyspace.decode_head(head)?.1))
            .collect::<Result<Vec<i64>>>()?;
        out.dedup();
        Ok(Some(out))
    }

    /// The rows that index `index` lists for the row ids `ids`, in id order.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv) or [`Error::Codec`](crate::Error::Codec).
    pub async fn index_entries(
        &self,
        index: Kind,
        ids: RangeInclusive<i64>,
    ) -> Result<Vec<RowKey>> {
        let range = self.keyspace.id_span(index, ids);
        let mut pages = self.snapshot.scan_pages(range, ID_ORDER_PAGE);
        let mut rows = Vec::new();
        while let Some(page) = pages.next().await {
            rows.extend(self.index_page_rows(index, &page?)?);
        }
        Ok(rows)
    }

    fn index_page_rows(&self, index: Kind, page: &Page) -> Result<Vec<RowKey>> {
        page.iter()
            .map(|(key, value)| {
                let entry = self.keyspace.decode_entry(key, value)?;
                Ok(RowKey {
                    kind: index.counterpart(),
                    ..entry
                })
            })
            .collect()
    }

    /// The stored values of `keys`, in the same order.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv).
    pub async fn values(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>> {
        Ok(self.snapshot.batch_get(keys).await?)
    }

    /// The rows of row kind `kind` divided into parts of about equal volume, each a range of
    /// whole tables: disjoint, in table order, together every table (the first part starts
    /// at the least table id, the last ends at the greatest). A table is never split, so one
    /// large table is one part however large.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv).
    pub async fn table_parts(&self, kind: Kind, division: Division) -> Result<Vec<TablePart>> {
        let range = self.keyspace.kind_range(kind);
        let divided = self.snapshot.divide(&range, division).await?;
        // Each cut falls at the first table wholly after it. Cuts inside one table fall at
        // the same boundary, and a cut past every table at none: the volumes of the spans
        // they would have begun join the part before.
        let mut volumes = divided.volumes.map(Vec::into_iter);
        let mut next_volume = move || volumes.as_mut().and_then(Iterator::next);
        let mut parts: Vec<TablePart> = Vec::with_capacity(divided.cuts.len() + 1);
        let mut start = i64::MIN;
        let mut volume = next_volume();
        for cut in &divided.cuts {
            let more = next_volume();
            match self.keyspace.first_table_from(kind, cut) {
                Some(first) if first > start => {
                    parts.push(TablePart {
                        tables: start..=first - 1,
                        volume,
                    });
                    start = first;
                    volume = more;
                }
                _ => volume = volume.zip(more).map(|(a, b)| a + b),
            }
        }
        parts.push(TablePart {
            tables: start..=i64::MAX,
            volume,
        });
        Ok(parts)
    }

    /// Streams the pairs of `ranges`, one range after another, one page per item. Nothing is
    /// read before the consumer asks.
    #[must_use]
    pub fn pages(&self, ranges: Vec<KeyRange>, page: PageSize) -> BoxStream<'static, Result<Page>> {
        let snapshot = self.snapshot.clone();
        stream::iter(ranges)
            .flat_map(move |range| snapshot.scan_pages(range, page))
            .map(|page| page.map_err(Into::into))
            .boxed()
    }

    /// Streams the rows of row kind `kind` whose ids lie in `ids`, in id order (then table
    /// order), one page per item, optionally only those of tables `keep`.
    ///
    /// The id index gives the order; the rows themselves are read as ranges of their tables,
    /// each read ahead of the index in proportion to how often the index lists it, so that
    /// a table is sought once every few pages rather than once a page. Nothing is read
    /// before the consumer asks.
    #[must_use]
    pub fn pages_in_id_order(
        &self,
        kind: Kind,
        ids: Vec<RangeInclusive<i64>>,
        keep: Option<Arc<dyn Fn(TableId) -> bool + Send + Sync>>,
    ) -> BoxStream<'static, Result<Page>> {
        id_order::rows_in_id_order(self, kind, ids, keep, ID_ORDER_FIRST_ENTRIES, ID_ORDER_PAGE)
    }
}

/// The index and the rows disagree: an entry whose row is missing (or a row the index lacks
/// between two it lists).
fn mismatch(key: &[u8]) -> crate::Error {
    CodecError::DanglingIndexEntry { key: hex(key) }.into()
}

/// Splits sorted, deduplicated ids into runs of consecutive ids.
fn runs(sorted: &[i64]) -> Vec<RangeInclusive<i64>> {
    let mut out: Vec<RangeInclusive<i64>> = Vec::new();
    for &id in sorted {
        match out.last_mut() {
            Some(run) if run.end().checked_add(1) == Some(id) => *run = *run.start()..=id,
            _ => out.push(id..=id),
        }
    }
    out
}

/// Reads a stored mapping record in place and checks it belongs under `key`.
///
/// # Errors
/// [`Error::Codec`](crate::Error::Codec) for a key or value that does not decode, or a record
/// stored under another key.
pub fn check_mapping<'a>(
    keyspace: &Keyspace,
    key: &[u8],
    value: &'a [u8],
) -> Result<MappingRecord<'a>> {
    let row = keyspace.decode(key)?;
    let record = read_mapping(value)?;
    let head = record.head();
    check_key(key, row, Kind::Mapping, head.table_id, head.mapping_id)?;
    Ok(record)
}

/// Reads a stored mapping record in one pass, its name rows appended to `names` with their
/// names as stored bytes, and checks it belongs under `key`, which the caller decoded as
/// `row` (a scan reads the key first, to see where a group of records ends).
///
/// # Errors
/// As [`check_mapping`].
pub fn check_mapping_raw<'a>(
    row: RowKey,
    key: &[u8],
    value: &'a [u8],
    names: &mut Vec<RawName<'a>>,
) -> Result<MappingHead<'a>> {
    let head = read_mapping_raw(value, names)?;
    check_key(key, row, Kind::Mapping, head.table_id, head.mapping_id)?;
    Ok(head)
}

/// Reads a stored data-file record in place and checks it belongs under `key`.
///
/// # Errors
/// As [`check_mapping`].
pub fn check_data_file<'a>(
    keyspace: &Keyspace,
    key: &[u8],
    value: &'a [u8],
) -> Result<DataFileRecord<'a>> {
    let row = keyspace.decode(key)?;
    let record = read_data_file(value)?;
    check_key(
        key,
        row,
        Kind::DataFile,
        record.table_id(),
        record.data_file_id(),
    )?;
    Ok(record)
}

fn check_key(key: &[u8], row: RowKey, kind: Kind, table_id: i64, id: i64) -> Result<()> {
    if row.kind == kind && row.table_id.0 == table_id && row.id == id {
        return Ok(());
    }
    Err(CodecError::KeyValueMismatch {
        key: hex(key),
        table_id,
        id,
    }
    .into())
}

#[cfg(test)]
mod tests;
