//! The in-memory backend: a `BTreeMap` behind a lock, the reference model for tests.
//!
//! A snapshot shares the map of its moment; a commit copies the map only while snapshots
//! still hold the old one. Nothing survives the process.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, PoisonError, RwLock};

use async_trait::async_trait;
use bytes::Bytes;

use super::page::fill_page;
use super::{
    CommitOutcome, KeyRange, KvBackend, KvError, KvSnapshot, Page, PageSize, StagedWrites,
};

type Map = BTreeMap<Bytes, Bytes>;

/// The in-memory backend.
#[derive(Debug, Default)]
pub struct MemoryBackend {
    map: RwLock<Arc<Map>>,
}

#[async_trait]
impl KvBackend for MemoryBackend {
    fn name(&self) -> &'static str {
        "memory"
    }

    async fn snapshot(&self) -> Result<Arc<dyn KvSnapshot>, KvError> {
        let map = self.map.read().unwrap_or_else(PoisonError::into_inner);
        Ok(Arc::new(MemorySnapshot {
            map: Arc::clone(&map),
        }))
    }

    async fn commit(&self, writes: Arc<StagedWrites>) -> Result<CommitOutcome, KvError> {
        let mut guard = self.map.write().unwrap_or_else(PoisonError::into_inner);
        let unmet = writes.first_unmet(
            |key| Ok::<_, KvError>(guard.get(key)),
            |range, pair| {
                for (key, value) in guard.range::<[u8], _>((
                    Bound::Included(range.start.as_slice()),
                    Bound::Excluded(range.end.as_slice()),
                )) {
                    pair(key, value);
                }
                Ok(())
            },
        )?;
        if let Some(conflict) = unmet {
            return Ok(CommitOutcome::Conflict(conflict));
        }
        let map = Arc::make_mut(&mut guard);
        for (key, staged) in writes.iter() {
            match &staged.write {
                Some(Some(value)) => {
                    map.insert(Bytes::copy_from_slice(key), Bytes::copy_from_slice(value));
                }
                Some(None) => {
                    map.remove(key);
                }
                None => {}
            }
        }
        Ok(CommitOutcome::Committed)
    }
}

struct MemorySnapshot {
    map: Arc<Map>,
}

/// A snapshot of an empty map.
pub(super) fn empty_snapshot() -> Arc<dyn KvSnapshot> {
    Arc::new(MemorySnapshot {
        map: Arc::new(Map::new()),
    })
}

#[async_trait]
impl KvSnapshot for MemorySnapshot {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        Ok(self.map.get(key).map(|v| v.to_vec()))
    }

    async fn scan_page(&self, range: &KeyRange, page: PageSize) -> Result<Page, KvError> {
        let items = self
            .map
            .range::<[u8], _>((
                Bound::Included(range.start.as_slice()),
                Bound::Excluded(range.end.as_slice()),
            ))
            .map(Ok::<_, KvError>);
        fill_page(items, page.at_least_one(), |out, (key, value)| {
            out.push(key, value);
        })
    }
}
