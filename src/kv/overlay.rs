//! A snapshot seen through a transaction's staged writes: reads answer from the writes where
//! they touch a key, and from the base snapshot everywhere else.
//!
//! This is how a transaction reads its own writes without writing anything to the store: the
//! staged changes stay in memory until the one atomic commit. The view shares the staged
//! writes; it copies nothing when it is made.

use std::ops::Bound;
use std::sync::Arc;

use async_trait::async_trait;

use super::page::fill_page;
use super::{Divided, Division, KeyRange, KvError, KvSnapshot, Page, PageSize, StagedWrites};

pub(crate) struct OverlaySnapshot {
    pub(crate) base: Arc<dyn KvSnapshot>,
    pub(crate) writes: Arc<StagedWrites>,
}

#[async_trait]
impl KvSnapshot for OverlaySnapshot {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        match self.writes.read(key) {
            Some(written) => Ok(written.map(<[u8]>::to_vec)),
            None => self.base.get(key).await,
        }
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let unwritten: Vec<Vec<u8>> = keys
            .iter()
            .filter(|key| self.writes.read(key).is_none())
            .cloned()
            .collect();
        let mut from_base = self.base.batch_get(&unwritten).await?.into_iter();
        Ok(keys
            .iter()
            .map(|key| match self.writes.read(key) {
                Some(written) => written.map(<[u8]>::to_vec),
                None => from_base.next().flatten(),
            })
            .collect())
    }

    /// The base's marks, with every key the writes put in `range`: a written key may be new
    /// and share its prefix with a stored one.
    async fn twins(&self, range: &KeyRange) -> Result<Option<Vec<Vec<u8>>>, KvError> {
        let Some(mut twins) = self.base.twins(range).await? else {
            return Ok(None);
        };
        let written: Vec<Vec<u8>> = self
            .writes
            .written((
                Bound::Included(range.start.as_slice()),
                Bound::Excluded(range.end.as_slice()),
            ))
            .filter(|(_, value)| value.is_some())
            .map(|(key, _)| key.to_vec())
            .collect();
        if !written.is_empty() {
            twins.extend(written);
            twins.sort_unstable();
            twins.dedup();
        }
        Ok(Some(twins))
    }

    /// The base's division: a transaction's staged writes are small beside what it reads.
    async fn divide(&self, range: &KeyRange, division: Division) -> Result<Divided, KvError> {
        self.base.divide(range, division).await
    }

    async fn scan_page(&self, range: &KeyRange, page: PageSize) -> Result<Page, KvError> {
        let page = page.at_least_one();
        let mut range = range.clone();
        loop {
            let base = self.base.scan_page(&range, page).await?;
            let exhausted = base.is_exhausted() || base.is_empty();
            // The part of the range this base page covers: up to its last key, or all of it.
            let covered_end = match base.last_key() {
                Some(last) if !exhausted => Bound::Included(last),
                _ => Bound::Excluded(range.end.as_slice()),
            };
            let written = self
                .writes
                .written((Bound::Included(range.start.as_slice()), covered_end));
            let (mut merged, more) = merge(&base, written, page);
            if more {
                return Ok(merged);
            }
            if !merged.is_empty() || exhausted {
                merged.set_exhausted(exhausted);
                return Ok(merged);
            }
            // Every pair of this base page was deleted by the writes: read on.
            let Some(last) = base.last_key() else {
                return Ok(Page::exhausted_empty());
            };
            range = range.after(last);
            if range.is_empty() {
                return Ok(Page::exhausted_empty());
            }
        }
    }
}

/// The base pairs with the writes over the same stretch of keys applied, in key order, up to
/// the pair that fills a page of `size` (`size` at least one, as a scan asks); and whether a
/// pair lies after that one. Only what the page takes is read (and one pair more): the writes
/// may reach far past the base page (a base that is empty there, a large transaction's own
/// rows), and a scan through them reads them a page at a time, not all of them again for
/// every page.
fn merge<'w>(
    base: &Page,
    written: impl Iterator<Item = (&'w [u8], Option<&'w [u8]>)>,
    size: PageSize,
) -> (Page, bool) {
    let mut written = written.peekable();
    let mut base = base.iter().peekable();
    // The next pair of the merged stretch: a write before (or at) the next base key wins
    // (a delete removes its key), else the base pair.
    let next = || -> Option<(&[u8], &[u8])> {
        loop {
            let take_written = match (written.peek(), base.peek()) {
                (Some((w_key, _)), Some((key, _))) => *w_key <= *key,
                (Some(_), None) => true,
                (None, Some(_)) => false,
                (None, None) => return None,
            };
            if !take_written {
                return base.next();
            }
            let (w_key, w_value) = written.next()?;
            if base.peek().is_some_and(|(key, _)| *key == w_key) {
                base.next();
            }
            if let Some(w_value) = w_value {
                return Some((w_key, w_value));
            }
        }
    };
    let mut pairs = std::iter::from_fn(next).peekable();
    let Ok(out) = fill_page(
        pairs.by_ref().map(Ok::<_, std::convert::Infallible>),
        size,
        |out, (key, value)| out.push(key, value),
    );
    let more = !out.is_exhausted() && pairs.peek().is_some();
    (out, more)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{CommitOutcome, KvPair, Store, Undo, WriteSet};
    use bytes::Bytes;
    use futures::TryStreamExt as _;

    fn pairs(items: &[(&[u8], &[u8])]) -> Vec<(Vec<u8>, Vec<u8>)> {
        items
            .iter()
            .map(|(k, v)| (k.to_vec(), v.to_vec()))
            .collect()
    }

    #[tokio::test]
    async fn reads_merge_base_and_writes_in_key_order() {
        let store = Store::memory();
        let mut base = WriteSet::new();
        for key in [b"a", b"c", b"e", b"g"] {
            base.put(key.to_vec(), b"base".to_vec());
        }
        assert_eq!(
            store.commit(base).await.ok(),
            Some(CommitOutcome::Committed)
        );
        let mut staged = StagedWrites::new();
        let mut undo = Undo::new();
        let b = |s: &[u8]| Bytes::copy_from_slice(s);
        staged.delete(b(b"a"), &mut undo).expect("stage");
        staged.put(b(b"b"), b(b"new"), &mut undo).expect("stage");
        staged.delete(b(b"c"), &mut undo).expect("stage");
        staged.put(b(b"d"), b(b"new"), &mut undo).expect("stage");
        staged
            .put(b(b"e"), b(b"changed"), &mut undo)
            .expect("stage");
        staged.put(b(b"z"), b(b"after"), &mut undo).expect("stage");
        staged.require_present(b(b"g"), &mut undo).expect("stage");
        let snapshot = store
            .snapshot()
            .await
            .expect("snapshot")
            .overlaid(Arc::new(staged));
        // Pages of one pair, bounded by rows or by bytes, force every page boundary through
        // the merge; merged pages keep to the bound as a plain scan's do.
        for page in [
            PageSize {
                rows: 1,
                bytes: usize::MAX,
            },
            PageSize {
                rows: 100,
                bytes: 1,
            },
        ] {
            let pages: Vec<Vec<KvPair>> = snapshot
                .scan_pages(KeyRange::new(b"a".to_vec(), b"zz".to_vec()), page)
                .map_ok(|p| p.to_pairs())
                .try_collect()
                .await
                .expect("scan");
            assert!(pages.iter().all(|p| p.len() == 1), "{page:?}: {pages:?}");
            let got: Vec<(Vec<u8>, Vec<u8>)> = pages
                .into_iter()
                .flatten()
                .map(|KvPair { key, value }| (key, value))
                .collect();
            assert_eq!(
                got,
                pairs(&[
                    (b"b", b"new"),
                    (b"d", b"new"),
                    (b"e", b"changed"),
                    (b"g", b"base"),
                    (b"z", b"after")
                ])
            );
        }
        assert_eq!(snapshot.get(b"a").await.expect("get"), None);
        assert_eq!(
            snapshot
                .batch_get(&[b"c".to_vec(), b"g".to_vec(), b"b".to_vec()])
                .await
                .expect("batch get"),
            vec![None, Some(b"base".to_vec()), Some(b"new".to_vec())]
        );
        // The store itself is untouched.
        assert_eq!(
            store
                .snapshot()
                .await
                .expect("snapshot")
                .get(b"a")
                .await
                .expect("get"),
            Some(b"base".to_vec())
        );
    }

    /// A page over writes that reach far past the base (here: a base with nothing there)
    /// reads the writes the page takes and one more, not every write to the end of the range:
    /// a scan through many staged or unapplied rows reads each once, not once per page.
    #[test]
    fn a_merged_page_reads_only_the_writes_it_takes() {
        let mut staged = StagedWrites::new();
        let mut undo = Undo::new();
        for i in 0..1000_u32 {
            let key = Bytes::from(format!("k{i:04}"));
            // Every tenth write a delete: skipped, never a pair.
            if i % 10 == 3 {
                staged.delete(key, &mut undo).expect("stage");
            } else {
                staged
                    .put(key, Bytes::from_static(b"v"), &mut undo)
                    .expect("stage");
            }
        }
        staged.seal();
        let pulled = std::cell::Cell::new(0_usize);
        let written = staged
            .written((Bound::Unbounded, Bound::Unbounded))
            .inspect(|_| pulled.set(pulled.get() + 1));
        let empty = Page::with_capacity(0, 0);
        let (page, more) = merge(&empty, written, PageSize::rows(8));
        let keys: Vec<&[u8]> = page.iter().map(|(key, _)| key).collect();
        assert_eq!(
            keys,
            [
                &b"k0000"[..],
                b"k0001",
                b"k0002",
                b"k0004",
                b"k0005",
                b"k0006",
                b"k0007",
                b"k0008"
            ]
        );
        assert!(more, "pairs lie after the page");
        // The page's eight pairs, the delete among them, and the one pair that says more
        // lie after it.
        assert_eq!(pulled.get(), 10);
    }
}
