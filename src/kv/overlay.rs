//! A snapshot seen through a transaction's uncommitted writes: reads answer from the writes
//! where they touch a key, and from the base snapshot everywhere else.
//!
//! This is how a transaction reads its own writes without writing anything to the store: the
//! staged changes stay in memory until the one atomic commit.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::Arc;

use async_trait::async_trait;

use super::{KeyRange, KvError, KvPair, KvSnapshot, Mutation, PageSize, ScanPage, WriteSet};

/// Each written key's value after the writes: `Some` written, `None` deleted.
pub(crate) type NetWrites = BTreeMap<Vec<u8>, Option<Vec<u8>>>;

/// The net effect of `writes`, key by key. Requirements write nothing and are left out.
pub(crate) fn net_writes(writes: &WriteSet) -> NetWrites {
    let mut net = NetWrites::new();
    for mutation in writes.mutations() {
        match mutation {
            Mutation::Put { key, value } | Mutation::Insert { key, value } => {
                net.insert(key.clone(), Some(value.clone()));
            }
            Mutation::Delete { key } => {
                net.insert(key.clone(), None);
            }
            Mutation::RequirePresent { .. } => {}
        }
    }
    net
}

pub(crate) struct OverlaySnapshot {
    pub(crate) base: Arc<dyn KvSnapshot>,
    pub(crate) writes: Arc<NetWrites>,
}

#[async_trait]
impl KvSnapshot for OverlaySnapshot {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        match self.writes.get(key) {
            Some(written) => Ok(written.clone()),
            None => self.base.get(key).await,
        }
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let unwritten: Vec<Vec<u8>> = keys
            .iter()
            .filter(|key| !self.writes.contains_key(*key))
            .cloned()
            .collect();
        let mut from_base = self.base.batch_get(&unwritten).await?.into_iter();
        Ok(keys
            .iter()
            .map(|key| match self.writes.get(key) {
                Some(written) => written.clone(),
                None => from_base.next().flatten(),
            })
            .collect())
    }

    async fn scan_page(&self, range: &KeyRange, page: PageSize) -> Result<ScanPage, KvError> {
        let mut range = range.clone();
        loop {
            let base = self.base.scan_page(&range, page).await?;
            let exhausted = base.exhausted || base.pairs.is_empty();
            // The part of the range this base page covers: up to its last key, or all of it.
            let covered_end = match base.pairs.last() {
                Some(last) if !exhausted => Bound::Included(last.key.clone()),
                _ => Bound::Excluded(range.end.clone()),
            };
            let written = self
                .writes
                .range((Bound::Included(range.start.clone()), covered_end));
            let resume = base.pairs.last().map(|last| last.key.clone());
            let mut pairs = merge(base.pairs, written);
            if pairs.len() > page.rows {
                pairs.truncate(page.rows);
                return Ok(ScanPage {
                    pairs,
                    exhausted: false,
                });
            }
            if !pairs.is_empty() || exhausted {
                return Ok(ScanPage { pairs, exhausted });
            }
            // Every pair of this base page was deleted by the writes: read on.
            let Some(mut start) = resume else {
                return Ok(ScanPage {
                    pairs,
                    exhausted: true,
                });
            };
            start.push(0);
            range.start = start;
            if range.is_empty() {
                return Ok(ScanPage {
                    pairs: Vec::new(),
                    exhausted: true,
                });
            }
        }
    }
}

/// The base pairs with the writes over the same stretch of keys applied, in key order.
fn merge<'w>(
    base: Vec<KvPair>,
    written: impl Iterator<Item = (&'w Vec<u8>, &'w Option<Vec<u8>>)>,
) -> Vec<KvPair> {
    let mut out = Vec::with_capacity(base.len());
    let mut written = written.peekable();
    for pair in base {
        while let Some((key, value)) =
            written.next_if(|(key, _)| key.as_slice() < pair.key.as_slice())
        {
            if let Some(value) = value {
                out.push(KvPair {
                    key: key.clone(),
                    value: value.clone(),
                });
            }
        }
        match written.next_if(|(key, _)| key.as_slice() == pair.key.as_slice()) {
            Some((key, Some(value))) => out.push(KvPair {
                key: key.clone(),
                value: value.clone(),
            }),
            Some((_, None)) => {}
            None => out.push(pair),
        }
    }
    for (key, value) in written {
        if let Some(value) = value {
            out.push(KvPair {
                key: key.clone(),
                value: value.clone(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::Store;
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
            Some(super::super::CommitOutcome::Committed)
        );
        let mut staged = WriteSet::new();
        staged
            .delete(b"a".to_vec())
            .put(b"b".to_vec(), b"new".to_vec())
            .delete(b"c".to_vec())
            .put(b"e".to_vec(), b"changed".to_vec())
            .put(b"z".to_vec(), b"after".to_vec());
        let snapshot = store.snapshot().await.expect("snapshot").overlaid(&staged);
        // Pages of one pair force every page boundary through the merge.
        let page = PageSize { rows: 1, bytes: 1 };
        let got: Vec<(Vec<u8>, Vec<u8>)> = snapshot
            .scan_pages(KeyRange::new(b"a".to_vec(), b"zz".to_vec()), page)
            .try_concat()
            .await
            .expect("scan")
            .into_iter()
            .map(|p| (p.key, p.value))
            .collect();
        assert_eq!(
            got,
            pairs(&[
                (b"b", b"new"),
                (b"e", b"changed"),
                (b"g", b"base"),
                (b"z", b"after")
            ])
        );
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
}
