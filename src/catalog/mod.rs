//! Snapshot reads of the catalog's records: point gets, index look-ups and paged range scans,
//! decoded and checked against their keys.
//!
//! This is the one place that turns stored pairs into [`ColumnMapping`]s and [`DataFile`]s; it
//! never writes. A value whose ids disagree with its key is corruption, reported as such.

use std::ops::RangeInclusive;

use futures::stream::{BoxStream, StreamExt as _};

use crate::codec::{CodecError, Keyspace, Kind, RowKey, decode_data_file, decode_mapping};
use crate::error::Result;
use crate::kv::{KeyRange, KvPair, PageSize, Snapshot, Store, WriteSet};
use crate::model::{ColumnMapping, DataFile, DataFileId, MappingId, TableId};

/// The catalog: a store and the keyspace of one deployment in it.
#[derive(Debug, Clone)]
pub struct Catalog {
    store: Store,
    keyspace: Keyspace,
}

impl Catalog {
    /// The catalog of `keyspace` in `store`.
    #[must_use]
    pub fn new(store: Store, keyspace: Keyspace) -> Self {
        Self { store, keyspace }
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

/// A consistent view of the catalog: every read sees the same committed state.
#[derive(Debug, Clone)]
pub struct CatalogSnapshot {
    snapshot: Snapshot,
    keyspace: Keyspace,
}

impl CatalogSnapshot {
    /// This view with `writes` applied, uncommitted: a transaction's view of its own staged
    /// changes.
    #[must_use]
    pub fn overlaid(&self, writes: &WriteSet) -> CatalogSnapshot {
        CatalogSnapshot {
            snapshot: self.snapshot.overlaid(writes),
            keyspace: self.keyspace.clone(),
        }
    }

    /// The keyspace read.
    #[must_use]
    pub fn keyspace(&self) -> &Keyspace {
        &self.keyspace
    }

    /// Mapping `mapping_id` of table `table_id`.
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
            Some(value) => Ok(Some(decode_mapping_at(&self.keyspace, &key, &value)?)),
            None => Ok(None),
        }
    }

    /// Whether each mapping `(table_id, mapping_id)` exists, in the same order; one batch read.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv).
    pub async fn mappings_exist(&self, keys: &[(TableId, MappingId)]) -> Result<Vec<bool>> {
        let keys: Vec<Vec<u8>> = keys
            .iter()
            .map(|(table_id, mapping_id)| self.keyspace.mapping_key(*table_id, *mapping_id))
            .collect();
        Ok(self
            .snapshot
            .batch_get(&keys)
            .await?
            .iter()
            .map(Option::is_some)
            .collect())
    }

    /// The rows that index `kind` lists for `ids`. Ids are looked up in runs of consecutive
    /// ids, one index range each.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv) or [`Error::Codec`](crate::Error::Codec).
    pub async fn index_lookup(
        &self,
        kind: Kind,
        ids: impl IntoIterator<Item = i64>,
    ) -> Result<Vec<RowKey>> {
        let mut sorted: Vec<i64> = ids.into_iter().collect();
        sorted.sort_unstable();
        sorted.dedup();
        let mut rows = Vec::new();
        for run in runs(&sorted) {
            rows.extend(self.index_entries(kind, run).await?);
        }
        Ok(rows)
    }

    /// The data files with these ids, found through the `data_file_id` index.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv) or [`Error::Codec`](crate::Error::Codec).
    pub async fn data_files_by_id(&self, ids: &[DataFileId]) -> Result<Vec<DataFile>> {
        let rows = self
            .index_lookup(Kind::DataFileById, ids.iter().map(|id| id.0))
            .await?;
        self.data_files_at(&rows).await
    }

    /// The data files whose ids lie in `ids`, through the `data_file_id` index.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv) or [`Error::Codec`](crate::Error::Codec).
    pub async fn data_files_in_id_range(&self, ids: RangeInclusive<i64>) -> Result<Vec<DataFile>> {
        let rows = self.index_entries(Kind::DataFileById, ids).await?;
        self.data_files_at(&rows).await
    }

    /// The rows that index `kind` lists for the row ids `ids`, in id order.
    ///
    /// # Errors
    /// [`Error::Kv`](crate::Error::Kv) or [`Error::Codec`](crate::Error::Codec).
    pub async fn index_entries(&self, kind: Kind, ids: RangeInclusive<i64>) -> Result<Vec<RowKey>> {
        let range = self.keyspace.id_span(kind, ids);
        let mut pages = self.snapshot.scan(range);
        let mut rows = Vec::new();
        while let Some(page) = pages.next().await {
            for pair in page? {
                let index = self.keyspace.decode(&pair.key)?;
                rows.push(RowKey {
                    kind: kind.counterpart(),
                    ..index
                });
            }
        }
        Ok(rows)
    }

    async fn data_files_at(&self, rows: &[RowKey]) -> Result<Vec<DataFile>> {
        let keys: Vec<Vec<u8>> = rows
            .iter()
            .map(|row| self.keyspace.row_key(Kind::DataFile, row.table_id, row.id))
            .collect();
        let values = self.snapshot.batch_get(&keys).await?;
        let mut files = Vec::with_capacity(keys.len());
        for (key, value) in keys.iter().zip(values) {
            let value = value.ok_or_else(|| CodecError::DanglingIndexEntry {
                key: crate::codec::hex(key),
            })?;
            files.push(decode_data_file_at(&self.keyspace, key, &value)?);
        }
        Ok(files)
    }

    /// Streams the mapping records in `ranges` (ranges of [`Kind::Mapping`]), one page of
    /// records per item, in key order. Nothing is read before the consumer asks.
    #[must_use]
    pub fn mappings(
        &self,
        ranges: Vec<KeyRange>,
        page: PageSize,
    ) -> BoxStream<'static, Result<Vec<ColumnMapping>>> {
        decoded(
            self.keyspace.clone(),
            self.pages(ranges, page),
            decode_mapping_at,
        )
    }

    /// Streams the keys of the mapping records in `ranges`, decoded, without decoding values.
    #[must_use]
    pub fn mapping_keys(
        &self,
        ranges: Vec<KeyRange>,
        page: PageSize,
    ) -> BoxStream<'static, Result<Vec<RowKey>>> {
        decoded(
            self.keyspace.clone(),
            self.pages(ranges, page),
            |keyspace, key, _| Ok(keyspace.decode(key)?),
        )
    }

    /// Streams the data-file records in `ranges` (ranges of [`Kind::DataFile`]), one page per
    /// item, in key order.
    #[must_use]
    pub fn data_files(
        &self,
        ranges: Vec<KeyRange>,
        page: PageSize,
    ) -> BoxStream<'static, Result<Vec<DataFile>>> {
        decoded(
            self.keyspace.clone(),
            self.pages(ranges, page),
            decode_data_file_at,
        )
    }

    /// Streams the mapping records whose `mapping_id` lies in `ids`, through the `mapping_id`
    /// index, in `mapping_id` order, one page per item.
    #[must_use]
    pub fn mappings_by_id(
        &self,
        ids: Vec<RangeInclusive<i64>>,
        page: PageSize,
    ) -> BoxStream<'static, Result<Vec<ColumnMapping>>> {
        decoded(
            self.keyspace.clone(),
            self.pages_via_index(Kind::MappingById, ids, page),
            decode_mapping_at,
        )
    }

    /// Streams the data-file records whose `data_file_id` lies in `ids`, through the
    /// `data_file_id` index, in id order, one page per item.
    #[must_use]
    pub fn data_files_by_id_ranges(
        &self,
        ids: Vec<RangeInclusive<i64>>,
        page: PageSize,
    ) -> BoxStream<'static, Result<Vec<DataFile>>> {
        decoded(
            self.keyspace.clone(),
            self.pages_via_index(Kind::DataFileById, ids, page),
            decode_data_file_at,
        )
    }

    /// Pages of the rows an index lists for `ids`: each index page, then one batch read of its
    /// rows.
    fn pages_via_index(
        &self,
        index: Kind,
        ids: Vec<RangeInclusive<i64>>,
        page: PageSize,
    ) -> BoxStream<'static, Result<Vec<KvPair>>> {
        let ranges = ids
            .into_iter()
            .map(|ids| self.keyspace.id_span(index, ids))
            .collect();
        let keyspace = self.keyspace.clone();
        let snapshot = self.snapshot.clone();
        // Two pages in flight: the next page's records are read while this one is consumed.
        self.pages(ranges, page)
            .map(move |entries| {
                let keyspace = keyspace.clone();
                let snapshot = snapshot.clone();
                async move {
                    let mut keys = Vec::new();
                    for entry in entries? {
                        let row = keyspace.decode(&entry.key)?;
                        keys.push(keyspace.row_key(index.counterpart(), row.table_id, row.id));
                    }
                    let values = snapshot.batch_get(&keys).await?;
                    keys.into_iter()
                        .zip(values)
                        .map(|(key, value)| match value {
                            Some(value) => Ok(KvPair { key, value }),
                            None => Err(CodecError::DanglingIndexEntry {
                                key: crate::codec::hex(&key),
                            }
                            .into()),
                        })
                        .collect()
                }
            })
            .buffered(2)
            .boxed()
    }

    /// The raw pages of several ranges, one range after another.
    fn pages(
        &self,
        ranges: Vec<KeyRange>,
        page: PageSize,
    ) -> BoxStream<'static, Result<Vec<KvPair>>> {
        let snapshot = self.snapshot.clone();
        futures::stream::iter(ranges)
            .flat_map(move |range| snapshot.scan_pages(range, page))
            .map(|page| page.map_err(Into::into))
            .boxed()
    }
}

/// Decodes every pair of every page with `decode`.
fn decoded<T: Send + 'static>(
    keyspace: Keyspace,
    pages: BoxStream<'static, Result<Vec<KvPair>>>,
    decode: fn(&Keyspace, &[u8], &[u8]) -> Result<T>,
) -> BoxStream<'static, Result<Vec<T>>> {
    pages
        .map(move |pairs| {
            pairs?
                .iter()
                .map(|pair| decode(&keyspace, &pair.key, &pair.value))
                .collect()
        })
        .boxed()
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

fn decode_mapping_at(keyspace: &Keyspace, key: &[u8], value: &[u8]) -> Result<ColumnMapping> {
    let row = keyspace.decode(key)?;
    let mapping = decode_mapping(value)?;
    check_key(
        key,
        row,
        Kind::Mapping,
        mapping.table_id,
        mapping.mapping_id.0,
    )?;
    Ok(mapping)
}

fn decode_data_file_at(keyspace: &Keyspace, key: &[u8], value: &[u8]) -> Result<DataFile> {
    let row = keyspace.decode(key)?;
    let file = decode_data_file(value)?;
    check_key(key, row, Kind::DataFile, file.table_id, file.data_file_id.0)?;
    Ok(file)
}

fn check_key(key: &[u8], row: RowKey, kind: Kind, table_id: TableId, id: i64) -> Result<()> {
    if row.kind == kind && row.table_id == table_id && row.id == id {
        return Ok(());
    }
    Err(CodecError::KeyValueMismatch {
        key: crate::codec::hex(key),
        table_id: table_id.0,
        id,
    }
    .into())
}
