//! Test fixtures: stores on each backend, with their temporary directories.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use moraine::codec::Keyspace;
use moraine::kv::memory::MemoryBackend;
use moraine::kv::redb::{RedbBackend, RedbOptions};
use moraine::kv::{
    CommitOutcome, KeyRange, KvBackend, KvError, KvSnapshot, Page, PageSize, StagedWrites, Store,
    StoreLimits,
};
use tempfile::TempDir;
use tokio::sync::Notify;

/// A store under test and whatever must outlive it.
pub struct TestStore {
    pub store: Store,
    /// What this store's snapshots have read, and how many are alive.
    pub reads: Arc<Reads>,
    pub _dir: Option<TempDir>,
    /// The fake TiKV cluster the store runs on, kept running while the store lives.
    #[cfg(feature = "tikv")]
    pub cluster: Option<Arc<crate::fake_tikv::FakeCluster>>,
}

/// What a store's snapshots have read, and how many of them are alive, for tests that watch
/// what a server does with the store.
#[derive(Default)]
pub struct Reads {
    /// Pages scanned.
    pub pages: AtomicUsize,
    /// Keys read: one per point get, one per key of a batch get, one per record of a scanned
    /// page.
    pub keys: AtomicUsize,
    /// Snapshots taken and not yet dropped.
    live: AtomicUsize,
    /// Notified after every change of the counts above.
    changed: Notify,
}

impl Reads {
    /// Pages scanned so far.
    pub fn pages(&self) -> usize {
        self.pages.load(Ordering::SeqCst)
    }

    /// Keys read so far.
    pub fn keys(&self) -> usize {
        self.keys.load(Ordering::SeqCst)
    }

    /// Snapshots alive now.
    pub fn live_snapshots(&self) -> usize {
        self.live.load(Ordering::SeqCst)
    }

    fn count(&self, counter: &AtomicUsize, n: usize) {
        counter.fetch_add(n, Ordering::SeqCst);
        self.changed.notify_waiters();
    }

    /// Waits until `done` holds of the counts: for a test to know that a server got as far
    /// as a read, or let go of its snapshots. Fails the test, naming `what`, after 30 s.
    pub async fn until(&self, what: &str, done: impl Fn(&Self) -> bool) {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            // Registered before the counts are looked at, so no change in between is missed.
            changed.as_mut().enable();
            if done(self) {
                return;
            }
            tokio::time::timeout_at(deadline, changed)
                .await
                .unwrap_or_else(|_| panic!("not within 30 s: {what}"));
        }
    }
}

/// Which backend a test runs on.
#[derive(Debug, Clone, Copy)]
pub enum Backend {
    Memory,
    Redb,
    /// `TikvBackend` over a fresh in-process fake cluster with several regions, or over the
    /// real cluster whose PD endpoints `PD_ADDRS` lists (comma-separated), each test under a
    /// key prefix of its own.
    #[cfg(feature = "tikv")]
    Tikv,
}

impl Backend {
    pub async fn open(self) -> TestStore {
        self.open_with(StoreLimits::default()).await
    }

    pub async fn open_with(self, limits: StoreLimits) -> TestStore {
        #[cfg(feature = "tikv")]
        let mut cluster = None;
        let (backend, dir): (Arc<dyn KvBackend>, _) = match self {
            Backend::Memory => (Arc::new(MemoryBackend::default()), None),
            #[cfg(feature = "tikv")]
            Backend::Tikv => {
                let (backend, fake) = tikv::open().await;
                cluster = fake;
                (backend, None)
            }
            Backend::Redb => {
                let dir = tempfile::tempdir().expect("temp dir");
                // Tallied and marked as the server does it, so whole-table reads divide from
                // the tallies and table-scoped mapping loads read the marks.
                let options = RedbOptions {
                    tally: Some(moraine::server::row_tally(&test_keyspace())),
                    twins: Some(moraine::server::mapping_twins(&test_keyspace())),
                    ..RedbOptions::default()
                };
                let backend = RedbBackend::open_with(dir.path(), options)
                    .await
                    .expect("open redb");
                (Arc::new(backend), Some(dir))
            }
        };
        let reads = Arc::new(Reads::default());
        let counting = Counting {
            inner: backend,
            reads: Arc::clone(&reads),
        };
        TestStore {
            store: Store::new(Arc::new(counting), limits),
            reads,
            _dir: dir,
            #[cfg(feature = "tikv")]
            cluster,
        }
    }
}

/// A backend wrapper that counts what its snapshots read: scanned pages, to see that a scan
/// stops with its consumer, and keys, to see what a statement costs.
struct Counting {
    inner: Arc<dyn KvBackend>,
    reads: Arc<Reads>,
}

#[async_trait]
impl KvBackend for Counting {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn snapshot(&self) -> Result<Arc<dyn KvSnapshot>, KvError> {
        let inner = self.inner.snapshot().await?;
        self.reads.count(&self.reads.live, 1);
        Ok(Arc::new(CountingSnapshot {
            inner,
            reads: Arc::clone(&self.reads),
        }))
    }

    async fn commit(&self, writes: Arc<StagedWrites>) -> Result<CommitOutcome, KvError> {
        self.inner.commit(writes).await
    }
}

struct CountingSnapshot {
    inner: Arc<dyn KvSnapshot>,
    reads: Arc<Reads>,
}

impl Drop for CountingSnapshot {
    fn drop(&mut self) {
        self.reads.live.fetch_sub(1, Ordering::SeqCst);
        self.reads.changed.notify_waiters();
    }
}

#[async_trait]
impl KvSnapshot for CountingSnapshot {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.reads.count(&self.reads.keys, 1);
        self.inner.get(key).await
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.reads.count(&self.reads.keys, keys.len());
        self.inner.batch_get(keys).await
    }

    async fn scan_page(&self, range: &KeyRange, page: PageSize) -> Result<Page, KvError> {
        self.reads.count(&self.reads.pages, 1);
        let page = self.inner.scan_page(range, page).await?;
        self.reads.count(&self.reads.keys, page.len());
        Ok(page)
    }

    async fn divide(
        &self,
        range: &KeyRange,
        division: moraine::kv::Division,
    ) -> Result<moraine::kv::Divided, KvError> {
        self.inner.divide(range, division).await
    }

    async fn twins(&self, range: &KeyRange) -> Result<Option<Vec<Vec<u8>>>, KvError> {
        self.reads.count(&self.reads.pages, 1);
        self.inner.twins(range).await
    }
}

/// The whole catalog as DuckLake's rows, each table sorted: what a SQL catalog would hold.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct CatalogRows {
    pub column_mappings: Vec<moraine::model::ColumnMappingRow>,
    pub name_mappings: Vec<moraine::model::NameMappingRow>,
    pub data_files: Vec<moraine::model::DataFileRow>,
}

impl CatalogRows {
    pub fn sorted(mut self) -> Self {
        self.column_mappings
            .sort_by_key(|r| (r.mapping_id, r.table_id));
        self.name_mappings
            .sort_by_key(|r| (r.mapping_id, r.column_id));
        self.data_files.sort_by_key(|r| r.data_file_id);
        self
    }
}

/// Reads every row of the catalog through a fresh snapshot.
pub async fn catalog_rows(catalog: &moraine::catalog::Catalog) -> CatalogRows {
    use futures::TryStreamExt as _;
    use moraine::codec::{Kind, decode_data_file, decode_mapping};
    let snapshot = catalog.snapshot().await.expect("snapshot");
    let keyspace = catalog.keyspace();
    let mut rows = CatalogRows::default();
    let pages: Vec<Page> = snapshot
        .pages(
            vec![keyspace.kind_range(Kind::Mapping)],
            PageSize::default(),
        )
        .try_collect()
        .await
        .expect("scan mappings");
    for (key, value) in pages.iter().flat_map(Page::iter) {
        moraine::catalog::check_mapping(keyspace, key, value).expect("a mapping record");
        let mapping = decode_mapping(value).expect("decodes");
        rows.column_mappings.push(mapping.column_row());
        rows.name_mappings.extend(mapping.name_rows());
    }
    let pages: Vec<Page> = snapshot
        .pages(
            vec![keyspace.kind_range(Kind::DataFile)],
            PageSize::default(),
        )
        .try_collect()
        .await
        .expect("scan files");
    for (key, value) in pages.iter().flat_map(Page::iter) {
        moraine::catalog::check_data_file(keyspace, key, value).expect("a data-file record");
        rows.data_files
            .push(decode_data_file(value).expect("decodes"));
    }
    rows.sorted()
}

impl TestStore {
    /// A catalog over this store, with a deployment prefix so keys of other deployments
    /// would be visible as a bug.
    /// The fake TiKV cluster under the store, when it runs on one.
    #[cfg(feature = "tikv")]
    pub fn cluster(&self) -> Option<&Arc<crate::fake_tikv::FakeCluster>> {
        self.cluster.as_ref()
    }

    pub fn catalog(&self) -> moraine::catalog::Catalog {
        moraine::catalog::Catalog::new(self.store.clone(), test_keyspace())
    }
}

/// The keyspace of the tests' catalogs: under a deployment prefix, as a shared store has.
pub fn test_keyspace() -> Keyspace {
    Keyspace::new(moraine::codec::KeyPrefix::new("test-lake").expect("prefix"))
}

#[cfg(feature = "tikv")]
pub mod tikv {
    //! The TiKV fixture: a fake cluster, or a real one named by `PD_ADDRS`.

    use std::sync::Arc;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, SystemTime, UNIX_EPOCH};

    use async_trait::async_trait;
    use moraine::kv::tikv::{TikvBackend, TikvOptions};
    use moraine::kv::{
        CommitOutcome, Conflict, KeyRange, KvBackend, KvError, KvSnapshot, Page, PageSize,
        StagedWrites,
    };

    use crate::fake_tikv::{ClusterConfig, FakeCluster};

    /// The conformance keys are `b"k"` and a big-endian `u32`.
    fn conformance_key(i: u32) -> Vec<u8> {
        let mut key = b"k".to_vec();
        key.extend_from_slice(&i.to_be_bytes());
        key
    }

    /// Regions split inside the conformance key space (twice) and after it.
    pub fn three_regions_and_more() -> ClusterConfig {
        ClusterConfig {
            split_keys: vec![conformance_key(32), conformance_key(250), b"l".to_vec()],
            stores: 2,
        }
    }

    /// Options that keep fault tests short: a lock of a live writer is waited for 10 s at most.
    pub fn test_options() -> TikvOptions {
        TikvOptions {
            connect_timeout: Duration::from_secs(5),
            lock_wait: Duration::from_secs(10),
            ..TikvOptions::default()
        }
    }

    /// A fresh fake cluster and a backend connected to it.
    pub async fn fake(config: ClusterConfig) -> (Arc<FakeCluster>, TikvBackend) {
        let cluster = Arc::new(FakeCluster::start(config).await);
        let backend = TikvBackend::connect_with(cluster.pd_endpoints(), test_options())
            .await
            .expect("connect to the fake cluster");
        (cluster, backend)
    }

    /// The backend for [`Backend::Tikv`](super::Backend::Tikv).
    pub async fn open() -> (Arc<dyn KvBackend>, Option<Arc<FakeCluster>>) {
        match std::env::var("PD_ADDRS") {
            Ok(addrs) if !addrs.trim().is_empty() => {
                let endpoints = addrs.split(',').map(|a| a.trim().to_owned()).collect();
                let backend = TikvBackend::connect_with(endpoints, test_options())
                    .await
                    .expect("connect to the cluster in PD_ADDRS");
                (Arc::new(Prefixed::new(Arc::new(backend))), None)
            }
            _ => {
                let (cluster, backend) = fake(three_regions_and_more()).await;
                (Arc::new(backend), Some(cluster))
            }
        }
    }

    /// Puts every key of one test under a prefix of its own, so that tests sharing a real
    /// cluster (and its leftovers) each see an empty store.
    struct Prefixed {
        inner: Arc<dyn KvBackend>,
        prefix: Vec<u8>,
    }

    impl Prefixed {
        fn new(inner: Arc<dyn KvBackend>) -> Self {
            static NEXT: AtomicU64 = AtomicU64::new(0);
            let nanos = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap_or_default()
                .as_nanos();
            let prefix = format!(
                "moraine-test/{nanos}-{}-{}/",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            );
            Self {
                inner,
                prefix: prefix.into_bytes(),
            }
        }
    }

    fn with_prefix(prefix: &[u8], key: &[u8]) -> Vec<u8> {
        let mut out = prefix.to_vec();
        out.extend_from_slice(key);
        out
    }

    fn strip(prefix: &[u8], key: Vec<u8>) -> Vec<u8> {
        key.get(prefix.len()..).map(<[u8]>::to_vec).unwrap_or(key)
    }

    #[async_trait]
    impl KvBackend for Prefixed {
        fn name(&self) -> &'static str {
            self.inner.name()
        }

        async fn snapshot(&self) -> Result<Arc<dyn KvSnapshot>, KvError> {
            Ok(Arc::new(PrefixedSnapshot {
                inner: self.inner.snapshot().await?,
                prefix: self.prefix.clone(),
            }))
        }

        async fn commit(&self, writes: Arc<StagedWrites>) -> Result<CommitOutcome, KvError> {
            let p = &self.prefix;
            let writes = Arc::new(writes.map_keys(|key| with_prefix(p, key))?);
            Ok(match self.inner.commit(writes).await? {
                CommitOutcome::Conflict(Conflict::AlreadyExists { key }) => {
                    CommitOutcome::Conflict(Conflict::AlreadyExists { key: strip(p, key) })
                }
                CommitOutcome::Conflict(Conflict::Missing { key }) => {
                    CommitOutcome::Conflict(Conflict::Missing { key: strip(p, key) })
                }
                CommitOutcome::Conflict(Conflict::WriteConflict { key }) => {
                    CommitOutcome::Conflict(Conflict::WriteConflict {
                        key: key.map(|k| strip(p, k)),
                    })
                }
                other => other,
            })
        }
    }

    struct PrefixedSnapshot {
        inner: Arc<dyn KvSnapshot>,
        prefix: Vec<u8>,
    }

    #[async_trait]
    impl KvSnapshot for PrefixedSnapshot {
        async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
            self.inner.get(&with_prefix(&self.prefix, key)).await
        }

        async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
            let keys: Vec<Vec<u8>> = keys.iter().map(|k| with_prefix(&self.prefix, k)).collect();
            self.inner.batch_get(&keys).await
        }

        async fn scan_page(&self, range: &KeyRange, page: PageSize) -> Result<Page, KvError> {
            if range.is_empty() {
                return Ok(Page::exhausted_empty());
            }
            let range = KeyRange::new(
                with_prefix(&self.prefix, &range.start),
                with_prefix(&self.prefix, &range.end),
            );
            let found = self.inner.scan_page(&range, page).await?;
            let mut out = Page::with_capacity(found.len(), found.bytes());
            for (key, value) in found.iter() {
                out.push(&strip(&self.prefix, key.to_vec()), value);
            }
            out.set_exhausted(found.is_exhausted());
            Ok(out)
        }
    }
}
