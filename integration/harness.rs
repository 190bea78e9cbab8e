//! Test fixtures: stores on each backend, with their temporary directories.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use moraine::kv::memory::MemoryBackend;
use moraine::kv::redb::RedbBackend;
use moraine::kv::{
    CommitOutcome, KeyRange, KvBackend, KvError, KvSnapshot, PageSize, PreparedWrite, ScanPage,
    Store, StoreLimits,
};
use tempfile::TempDir;

/// A store under test and whatever must outlive it.
pub struct TestStore {
    pub store: Store,
    /// Counts the pages every snapshot of this store has read.
    pub pages_read: Arc<AtomicUsize>,
    pub _dir: Option<TempDir>,
}

/// Which backend a test runs on.
#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Memory,
    Redb,
}

impl Backend {
    pub async fn open(self) -> TestStore {
        self.open_with(StoreLimits::default()).await
    }

    pub async fn open_with(self, limits: StoreLimits) -> TestStore {
        let (backend, dir): (Arc<dyn KvBackend>, _) = match self {
            Backend::Memory => (Arc::new(MemoryBackend::default()), None),
            Backend::Redb => {
                let dir = tempfile::tempdir().expect("temp dir");
                let backend = RedbBackend::open(dir.path()).await.expect("open redb");
                (Arc::new(backend), Some(dir))
            }
        };
        let pages_read = Arc::new(AtomicUsize::new(0));
        let counting = Counting {
            inner: backend,
            pages: Arc::clone(&pages_read),
        };
        TestStore {
            store: Store::new(Arc::new(counting), limits),
            pages_read,
            _dir: dir,
        }
    }
}

/// A backend wrapper that counts scanned pages, to see that a scan stops with its consumer.
struct Counting {
    inner: Arc<dyn KvBackend>,
    pages: Arc<AtomicUsize>,
}

#[async_trait]
impl KvBackend for Counting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn snapshot(&self) -> Result<Arc<dyn KvSnapshot>, KvError> {
        Ok(Arc::new(CountingSnapshot {
            inner: self.inner.snapshot().await?,
            pages: Arc::clone(&self.pages),
        }))
    }

    async fn commit(&self, writes: Vec<PreparedWrite>) -> Result<CommitOutcome, KvError> {
        self.inner.commit(writes).await
    }
}

struct CountingSnapshot {
    inner: Arc<dyn KvSnapshot>,
    pages: Arc<AtomicUsize>,
}

#[async_trait]
impl KvSnapshot for CountingSnapshot {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.inner.get(key).await
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.inner.batch_get(keys).await
    }

    async fn scan_page(&self, range: &KeyRange, page: PageSize) -> Result<ScanPage, KvError> {
        self.pages.fetch_add(1, Ordering::SeqCst);
        self.inner.scan_page(range, page).await
    }
}
