//! Rows of many tables in id order: the id index gives the order, each table's rows are read
//! as ranges of that table, with read-ahead.
//!
//! A page of index entries lists, in id order, rows of many tables: in DuckLake's catalogs
//! consecutive mapping ids belong to different tables (thousands of tables interleave in a
//! large catalog). Reading each table's part of one index page as one range costs a seek per
//! table per page; at a million mappings over ten thousand tables that is most of the load's
//! time, and most of those seeks land on leaf pages the store read a moment ago. So each
//! table keeps a cursor: a refill reads its rows for this page and, ahead, as many again as
//! the page asked of it, seven times over. A table that appears often reads far ahead, one
//! that appears once a page a few rows; the rows held ahead stay about [`READ_AHEAD`] index
//! pages' worth, and never more than [`READ_AHEAD_BYTES`] (past it, a table reads only what
//! its page needs).

use std::collections::HashMap;
use std::ops::RangeInclusive;
use std::sync::Arc;

use futures::stream::{self, BoxStream, StreamExt as _};

use super::{CatalogSnapshot, mismatch};
use crate::codec::Kind;
use crate::error::Result;
use crate::kv::{KeyRange, Page, PageSize};
use crate::model::TableId;

/// Maps keyed by table, looked up once or twice per row read: foldhash's seeded hasher, as the
/// staging maps use, rather than the standard `SipHash`.
type ByTable<V> = HashMap<TableId, V, foldhash::fast::RandomState>;

/// Pages of a table read at once, counted in what one index page asks of the table.
const READ_AHEAD: usize = 8;

/// Bytes of rows read ahead at most, over all tables.
const READ_AHEAD_BYTES: usize = 64 << 20;

/// Rows read ahead of one table at most in one read.
const READ_AHEAD_ROWS: usize = 16 << 10;

/// Ranges read in one round trip at most.
const RANGES_PER_READ: usize = 4096;

/// Which tables' rows a read keeps.
pub(super) type Keep = Arc<dyn Fn(TableId) -> bool + Send + Sync>;

/// The rows of one table read but not yet listed by the index.
#[derive(Default)]
struct Cursor {
    rows: Page,
    at: usize,
    /// The key of the last row taken once `rows` ran out: the next read starts after it, so
    /// that a row the index lacks between two it lists is read, and reported.
    taken: Option<Vec<u8>>,
}

impl Cursor {
    fn left(&self) -> usize {
        self.rows.len() - self.at
    }

    /// The table's next read: right after the last row read, whatever id the index asks
    /// next, up to the end of `range`, which starts at the first id asked.
    fn rest(&self, range: KeyRange) -> KeyRange {
        match self.rows.last_key().or(self.taken.as_deref()) {
            Some(last) => KeyRange::new(Vec::new(), range.end).after(last),
            None => range,
        }
    }

    /// The rows not yet taken followed by `more`.
    fn extend(&mut self, more: Page) {
        if self.left() == 0 {
            self.rows = more;
        } else {
            let mut rows = Page::with_capacity(self.left() + more.len(), self.rows.bytes());
            for (key, value) in self.rows.iter().skip(self.at).chain(more.iter()) {
                rows.push(key, value);
            }
            self.rows = rows;
        }
        self.at = 0;
    }

    /// Lets the rows go once all are taken, keeping the last key.
    fn release_if_taken(&mut self) {
        if self.left() == 0 {
            self.taken = self.rows.last_key().map(<[u8]>::to_vec);
            self.rows = Page::default();
            self.at = 0;
        }
    }
}

/// What one index page asks of one table.
struct Asked {
    first_id: i64,
    count: usize,
}

/// A read in id order of the rows of `kind` whose ids lie in one interval.
struct IdOrder {
    snapshot: CatalogSnapshot,
    kind: Kind,
    /// The interval's last id: rows read ahead stop there, so that every row read is one the
    /// index lists (or corruption, reported as such).
    last_id: i64,
    keep: Option<Keep>,
    cursors: ByTable<Cursor>,
    /// Key and value bytes held in `cursors`.
    held: usize,
    /// Rows held in `cursors`.
    held_rows: usize,
}

/// Streams the rows of `kind` whose ids lie in `ids`, in id order (then table order), one
/// page per index page, optionally only those of tables `keep`. The index pages of each
/// interval of `ids` grow from `first_entries` entries, doubling, to `entries`: the first
/// rows leave after one small page's reads, not after the reads (with their read-ahead) of
/// a full page, while everything downstream (the batches, the client) waits for them.
pub(super) fn rows_in_id_order(
    snapshot: &CatalogSnapshot,
    kind: Kind,
    ids: Vec<RangeInclusive<i64>>,
    keep: Option<Keep>,
    first_entries: usize,
    entries: PageSize,
) -> BoxStream<'static, Result<Page>> {
    let snapshot = snapshot.clone();
    stream::iter(ids)
        .flat_map(move |ids| {
            let index = snapshot.snapshot.scan_pages_growing(
                snapshot.keyspace.id_span(kind.counterpart(), ids.clone()),
                PageSize::rows(first_entries),
                entries,
            );
            let reader = IdOrder {
                snapshot: snapshot.clone(),
                kind,
                last_id: *ids.end(),
                keep: keep.clone(),
                cursors: ByTable::default(),
                held: 0,
                held_rows: 0,
            };
            stream::unfold((index, reader), |(mut index, mut reader)| async move {
                loop {
                    let page = match index.next().await? {
                        Ok(entries) => reader.rows_of(&entries).await,
                        Err(err) => Err(err.into()),
                    };
                    match page {
                        Ok(page) if page.is_empty() => {}
                        Ok(page) => return Some((Ok(page), (index, reader))),
                        // The stream ends after its first error.
                        Err(err) => {
                            return Some((Err(err), (stream::empty().boxed(), reader)));
                        }
                    }
                }
            })
        })
        .boxed()
}

impl IdOrder {
    /// The rows an index page lists, in the page's order.
    async fn rows_of(&mut self, entries: &Page) -> Result<Page> {
        let keyspace = &self.snapshot.keyspace;
        let mut listed: Vec<(TableId, i64)> = Vec::with_capacity(entries.len());
        let mut asked: ByTable<Asked> = ByTable::default();
        for (key, value) in entries.iter() {
            let entry = keyspace.decode_entry(key, value)?;
            if self.keep.as_ref().is_some_and(|keep| !keep(entry.table_id)) {
                continue;
            }
            listed.push((entry.table_id, entry.id));
            asked
                .entry(entry.table_id)
                .and_modify(|asked| asked.count += 1)
                .or_insert(Asked {
                    first_id: entry.id,
                    count: 1,
                });
        }
        self.refill(&asked).await?;
        let keyspace = &self.snapshot.keyspace;
        let typical = self.held / self.held_rows.max(1);
        let mut out = Page::with_capacity(listed.len(), listed.len().saturating_mul(typical));
        let mut expected = Vec::new();
        for (table, id) in listed {
            expected.clear();
            keyspace.put_row_key(&mut expected, self.kind, table, id);
            let cursor = self
                .cursors
                .get_mut(&table)
                .ok_or_else(|| mismatch(&expected))?;
            let (key, value) = cursor
                .rows
                .get(cursor.at)
                .filter(|(key, _)| *key == expected.as_slice())
                .ok_or_else(|| mismatch(&expected))?;
            out.push(key, value);
            self.held = self.held.saturating_sub(key.len() + value.len());
            self.held_rows = self.held_rows.saturating_sub(1);
            cursor.at += 1;
            cursor.release_if_taken();
        }
        Ok(out)
    }

    /// Reads, for each table whose cursor holds fewer rows than `asked` of it, the rest and
    /// the read-ahead, in as few round trips as the row counts allow.
    async fn refill(&mut self, asked: &ByTable<Asked>) -> Result<()> {
        let keyspace = &self.snapshot.keyspace;
        let ahead = if self.held < READ_AHEAD_BYTES {
            READ_AHEAD - 1
        } else {
            0
        };
        // By the power of two at or above the rows to read: one read per size class.
        let mut reads: Vec<(usize, TableId, KeyRange)> = Vec::new();
        for (&table, asked) in asked {
            let cursor = self.cursors.get(&table);
            let left = cursor.map_or(0, Cursor::left);
            if left >= asked.count {
                continue;
            }
            let range = keyspace.row_span(self.kind, table, asked.first_id..=self.last_id);
            let range = match cursor {
                Some(cursor) => cursor.rest(range),
                None => range,
            };
            let rows = (asked.count - left)
                .saturating_add(asked.count.saturating_mul(ahead).min(READ_AHEAD_ROWS));
            reads.push((rows.next_power_of_two(), table, range));
        }
        reads.sort_unstable_by_key(|(rows, _, _)| *rows);
        for class in reads.chunk_by(|a, b| a.0 == b.0) {
            for chunk in class.chunks(RANGES_PER_READ) {
                let ranges: Vec<KeyRange> =
                    chunk.iter().map(|(_, _, range)| range.clone()).collect();
                let size = PageSize {
                    rows: chunk.first().map_or(1, |(rows, _, _)| *rows),
                    bytes: usize::MAX,
                };
                let found = self.snapshot.snapshot.first_pages(&ranges, size).await?;
                for ((_, table, _), rows) in chunk.iter().zip(found) {
                    self.held += rows.bytes();
                    self.held_rows += rows.len();
                    self.cursors.entry(*table).or_default().extend(rows);
                }
            }
        }
        Ok(())
    }
}
