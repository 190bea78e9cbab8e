//! The ordered transactional key-value store, backend-neutral.
//!
//! [`Store`] is what the rest of moraine holds. It wraps one [`KvBackend`] and is the one
//! place that enforces the [`StoreLimits`] and the write-set rules, so that every backend
//! accepts and refuses exactly the same commits:
//! - a read is a [`Snapshot`]: point get, batch get, and range scans that stream [`Page`]s and
//!   stop when their consumer stops;
//! - a write is one set of [`StagedWrites`] committed atomically, with one of three outcomes
//!   ([`CommitOutcome`]): committed, conflict (nothing written; may be retried), or unknown.
//!
//! Backends ([`memory`], [`redb`](mod@self::redb), [`tikv`](mod@self::tikv)) only see writes
//! already checked and reduced to one [`Staged`] write per key, in key order.
//!
//! A [`Page`] holds its pairs in one buffer: a scan allocates per page, not per pair.

mod digest;
mod divide;
pub mod memory;
mod near;
mod overlay;
mod page;
#[cfg(feature = "tikv")]
mod pd;
pub mod redb;
mod staged;
#[cfg(feature = "tikv")]
pub mod tikv;
mod write_set;

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use futures::stream::{self, BoxStream, StreamExt as _};

pub use crate::key_range::KeyRange;
pub use digest::{Digest, Digester};
pub use divide::{Divided, Division};
pub use near::NearIds;
pub use page::{KvPair, Page, PageSize};
pub use staged::{KeyOrder, Prior, RangeRequirement, Requirement, Staged, StagedWrites, Undo};
pub use write_set::{Mutation, WriteSet};

use crate::key_range::hex;

/// Limits every commit is checked against before any backend sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    /// Longest key, in bytes.
    pub max_key_bytes: usize,
    /// Longest value, in bytes.
    pub max_value_bytes: usize,
    /// Most keys one commit writes or requires.
    pub max_write_set_ops: usize,
    /// Most key and value bytes in one commit.
    pub max_write_set_bytes: usize,
}

impl StoreLimits {
    /// TiKV's limits, and a sensible design target for any store that replicates its writes
    /// through a log: 8 KiB keys and 8 MiB raft entries bound keys and values, and about
    /// 100 MiB (the default of `TiDB`) bounds one transaction.
    #[must_use]
    pub fn replicated() -> Self {
        Self {
            max_key_bytes: 4 << 10,
            max_value_bytes: 6 << 20,
            max_write_set_ops: 1 << 20,
            max_write_set_bytes: 96 << 20,
        }
    }

    /// Limits of the embedded store: the same keys and values as a cluster accepts, so that
    /// data moves between them, but transactions bounded only by what the process can stage
    /// (the transaction limits bound that, see `serve --txn-max-bytes`).
    #[must_use]
    pub fn embedded() -> Self {
        Self {
            max_write_set_ops: usize::MAX,
            max_write_set_bytes: usize::MAX,
            ..Self::replicated()
        }
    }
}

impl Default for StoreLimits {
    fn default() -> Self {
        Self::replicated()
    }
}

/// Why a commit that reached the store did not apply. Nothing of it was written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Conflict {
    /// An insert-if-absent found its key already present.
    #[error("key {} already exists", hex(key))]
    AlreadyExists {
        /// The key.
        key: Vec<u8>,
    },
    /// A write that required its key to be present found it absent.
    #[error("key {} does not exist", hex(key))]
    Missing {
        /// The key.
        key: Vec<u8>,
    },
    /// A record the transaction read and updates or deletes was changed since it was read.
    #[error("key {} was changed since it was read", hex(key))]
    Changed {
        /// The key.
        key: Vec<u8>,
    },
    /// A range the transaction read whole no longer holds what it read: a row was inserted,
    /// changed or removed in it since.
    #[error(
        "the range from {} to {} was changed since it was read",
        hex(start),
        hex(end)
    )]
    RangeChanged {
        /// The range's first key.
        start: Vec<u8>,
        /// The key after the range.
        end: Vec<u8>,
    },
    /// A concurrent transaction wrote a key this one writes.
    #[error("write conflict on key {}", key.as_deref().map(hex).unwrap_or_default())]
    WriteConflict {
        /// The key, where the backend names it.
        key: Option<Vec<u8>>,
    },
}

/// What became of a commit.
///
/// After `Committed` every mutation is durable and visible to later snapshots. After
/// `Conflict` nothing was written: the caller may re-read and retry. After `Unknown` the
/// commit may or may not have been applied: do not retry blindly; re-read to find out.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CommitOutcome {
    /// Applied, durably, all of it.
    Committed,
    /// Not applied, because the store's state did not allow it.
    Conflict(Conflict),
    /// The backend failed while committing; the commit may or may not have been applied.
    Unknown {
        /// The backend's account.
        reason: String,
    },
}

/// A store operation failed before anything could be applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KvError {
    /// A key over [`StoreLimits::max_key_bytes`].
    #[error("key of {len} bytes exceeds the limit of {max}")]
    KeyTooLarge {
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A value over [`StoreLimits::max_value_bytes`].
    #[error("value of {len} bytes for key {} exceeds the limit of {max}", hex(key))]
    ValueTooLarge {
        /// Its key.
        key: Vec<u8>,
        /// Its length.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A write set over [`StoreLimits::max_write_set_ops`] or `max_write_set_bytes`.
    #[error(
        "write set of {ops} mutations and {bytes} bytes exceeds the store's limit of {max_ops} mutations and {max_bytes} bytes per commit"
    )]
    WriteSetTooLarge {
        /// Mutations in it.
        ops: usize,
        /// Key and value bytes in it.
        bytes: usize,
        /// The mutation limit.
        max_ops: usize,
        /// The byte limit.
        max_bytes: usize,
    },
    /// A write set that inserts a key it already wrote, or requires a key it deleted.
    #[error("write set contradicts itself at key {}: {reason}", hex(key))]
    ContradictoryWriteSet {
        /// The key.
        key: Vec<u8>,
        /// What the contradiction is.
        reason: &'static str,
    },
    /// The backend could not be reached; nothing was attempted.
    #[error("{backend} store unavailable: {reason}")]
    Unavailable {
        /// Which backend.
        backend: &'static str,
        /// Its account.
        reason: String,
    },
    /// The backend failed (I/O, corruption of its own structures).
    #[error("{backend} store failed: {reason}")]
    Backend {
        /// Which backend.
        backend: &'static str,
        /// Its account.
        reason: String,
    },
}

/// A consistent read view, as a backend implements it.
#[async_trait]
pub trait KvSnapshot: Send + Sync + 'static {
    /// The store version this snapshot reads at, for a backend that numbers its commits in
    /// one order (the embedded store): the number of the last commit it sees. `None` for a
    /// backend that does not, and for a view that lays uncommitted writes over a snapshot.
    fn version(&self) -> Option<u64> {
        None
    }

    /// The value of `key` at this snapshot.
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError>;

    /// The values of `keys`, in the same order. Backends read sorted keys fastest.
    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let mut out = Vec::with_capacity(keys.len());
        for key in keys {
            out.push(self.get(key).await?);
        }
        Ok(out)
    }

    /// The first pairs of `range` in key order, at most `page.rows` of them, stopping after
    /// the pair that brings the page to `page.bytes`.
    async fn scan_page(&self, range: &KeyRange, page: PageSize) -> Result<Page, KvError>;

    /// [`scan_page`](Self::scan_page) of each of `ranges`, in the same order; backends answer
    /// in one round trip where they can.
    async fn scan_pages(&self, ranges: &[KeyRange], page: PageSize) -> Result<Vec<Page>, KvError> {
        let mut out = Vec::with_capacity(ranges.len());
        for range in ranges {
            out.push(self.scan_page(range, page).await?);
        }
        Ok(out)
    }

    /// Where keys of `range` may share a prefix with another stored key, for a backend that
    /// keeps track (the embedded store, under a twins rule covering `range`): every key of
    /// `range` that has a twin starts with one of the entries returned, in key order (an
    /// entry is a prefix, or a whole key). `None`, this default, when the backend does not
    /// know: any key may have one.
    async fn twins(&self, range: &KeyRange) -> Result<Option<Vec<Vec<u8>>>, KvError> {
        let _ = range;
        Ok(None)
    }

    /// Where `range` divides into spans of about equal volume, as `division` asks. This
    /// default walks the range page by page; backends that can measure it more cheaply do.
    async fn divide(&self, range: &KeyRange, division: Division) -> Result<Divided, KvError> {
        let mut divider = divide::Divider::new(division);
        let mut rest = range.clone();
        while !rest.is_empty() {
            let page = self.scan_page(&rest, DIVIDE_PAGE).await?;
            for (key, value) in page.iter() {
                divider.add(key, key.len() + value.len());
            }
            match page.last_key() {
                Some(last) if !page.is_exhausted() => rest = rest.after(last),
                _ => break,
            }
        }
        Ok(divider.finish())
    }
}

/// Pages of the default [`KvSnapshot::divide`] walk.
const DIVIDE_PAGE: PageSize = PageSize {
    rows: 4096,
    bytes: 4 << 20,
};

/// An ordered transactional key-value store, as a backend implements it.
#[async_trait]
pub trait KvBackend: Send + Sync + 'static {
    /// A short name for messages: `memory`, `redb`, `tikv`.
    fn name(&self) -> &'static str;

    /// A consistent read view of the latest committed state.
    async fn snapshot(&self) -> Result<Arc<dyn KvSnapshot>, KvError>;

    /// Applies `writes` atomically: every requirement holds and every write lands, or nothing
    /// does. `writes` holds one entry per key, already checked against the limits, and is
    /// sealed (in key order) unless the backend [orders writes](Self::orders_writes) itself.
    async fn commit(&self, writes: Arc<StagedWrites>) -> Result<CommitOutcome, KvError>;

    /// Whether [`commit`](Self::commit) takes a large transaction's writes unsealed and
    /// seals them itself, beside work of its own that does not need them in order (the
    /// embedded store's log write). Otherwise the store seals them before handing them over.
    fn orders_writes(&self) -> bool {
        false
    }
}

/// From how many unsealed keys a commit's writes go to a backend that
/// [orders writes](KvBackend::orders_writes) unsealed (a bulk load's: its seal took about as
/// long as the log write it now runs beside). Smaller writes are sealed by the committing
/// task, where concurrent commits seal theirs at once, not one after another on the
/// backend's writer thread.
const SEAL_BESIDE_FROM: usize = 1 << 14;

/// The store: one backend behind the limits and write-set rules every backend shares.
#[derive(Clone)]
pub struct Store {
    backend: Arc<dyn KvBackend>,
    limits: StoreLimits,
}

impl fmt::Debug for Store {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Store")
            .field("backend", &self.backend.name())
            .field("limits", &self.limits)
            .finish()
    }
}

impl Store {
    /// A store over `backend` with `limits`.
    #[must_use]
    pub fn new(backend: Arc<dyn KvBackend>, limits: StoreLimits) -> Self {
        Self { backend, limits }
    }

    /// A fresh in-memory store with default limits.
    #[must_use]
    pub fn memory() -> Self {
        Self::new(
            Arc::new(memory::MemoryBackend::default()),
            StoreLimits::default(),
        )
    }

    /// The backend's name.
    #[must_use]
    pub fn backend_name(&self) -> &'static str {
        self.backend.name()
    }

    /// The limits in force.
    #[must_use]
    pub fn limits(&self) -> StoreLimits {
        self.limits
    }

    /// A consistent read view of the latest committed state.
    ///
    /// # Errors
    /// [`KvError`] when the backend cannot provide one.
    pub async fn snapshot(&self) -> Result<Snapshot, KvError> {
        Ok(Snapshot {
            inner: self.backend.snapshot().await?,
        })
    }

    /// Commits `writes` atomically.
    ///
    /// # Errors
    /// [`KvError`] when the write set breaks a limit or contradicts itself, or the backend
    /// fails before committing; nothing was written then. Otherwise see [`CommitOutcome`].
    pub async fn commit(&self, writes: WriteSet) -> Result<CommitOutcome, KvError> {
        self.commit_staged(Arc::new(writes.into_staged()?)).await
    }

    /// Commits staged writes atomically: each key's requirement holds and its write lands,
    /// or nothing does.
    ///
    /// # Errors
    /// As [`commit`](Self::commit).
    pub async fn commit_staged(
        &self,
        mut writes: Arc<StagedWrites>,
    ) -> Result<CommitOutcome, KvError> {
        writes.check(&self.limits)?;
        if writes.is_empty() {
            return Ok(CommitOutcome::Committed);
        }
        let beside = self.backend.orders_writes() && writes.unsealed() >= SEAL_BESIDE_FROM;
        if !beside {
            StagedWrites::seal_shared(&mut writes);
        }
        let started = std::time::Instant::now();
        let outcome = self.backend.commit(writes).await;
        crate::metrics::get()
            .store_commit_seconds
            .observe(started.elapsed().as_secs_f64());
        outcome
    }
}

/// A consistent read view: every read through it sees the same committed state.
#[derive(Clone)]
pub struct Snapshot {
    inner: Arc<dyn KvSnapshot>,
}

impl fmt::Debug for Snapshot {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Snapshot")
    }
}

impl Snapshot {
    /// A snapshot of an empty store: what a plan kept for later executions reads until it
    /// is bound to one (it holds no backend's state, so keeping it pins nothing).
    #[must_use]
    pub fn empty() -> Snapshot {
        Snapshot {
            inner: memory::empty_snapshot(),
        }
    }

    /// The store version this snapshot reads at, where the backend has one
    /// ([`KvSnapshot::version`]).
    #[must_use]
    pub fn version(&self) -> Option<u64> {
        self.inner.version()
    }

    /// This snapshot seen through `writes`, uncommitted: reads answer from `writes` where they
    /// touch a key and from this snapshot elsewhere. Nothing is written to the store, and
    /// nothing is copied: the view shares `writes`.
    #[must_use]
    pub fn overlaid(&self, writes: Arc<StagedWrites>) -> Snapshot {
        Snapshot {
            inner: Arc::new(overlay::OverlaySnapshot {
                base: Arc::clone(&self.inner),
                writes,
            }),
        }
    }

    /// The value of `key`.
    ///
    /// # Errors
    /// [`KvError`] when the backend fails.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        let started = std::time::Instant::now();
        let got = self.inner.get(key).await;
        crate::metrics::get().time_read("get", started, got)
    }

    /// The values of `keys`, in the same order.
    ///
    /// # Errors
    /// [`KvError`] when the backend fails.
    pub async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let started = std::time::Instant::now();
        let got = self.inner.batch_get(keys).await;
        crate::metrics::get().time_read("batch_get", started, got)
    }

    /// One page of `range`: its first pairs, as [`KvSnapshot::scan_page`].
    ///
    /// # Errors
    /// [`KvError`] when the backend fails.
    pub async fn page(&self, range: &KeyRange, page: PageSize) -> Result<Page, KvError> {
        if range.is_empty() {
            return Ok(Page::exhausted_empty());
        }
        let started = std::time::Instant::now();
        let got = self.inner.scan_page(range, page).await;
        crate::metrics::get().time_read("scan_page", started, got)
    }

    /// Where keys of `range` may have a twin, where the backend knows
    /// ([`KvSnapshot::twins`]).
    ///
    /// # Errors
    /// [`KvError`] when the backend fails.
    pub async fn twins(&self, range: &KeyRange) -> Result<Option<Vec<Vec<u8>>>, KvError> {
        let started = std::time::Instant::now();
        let got = self.inner.twins(range).await;
        crate::metrics::get().time_read("twins", started, got)
    }

    /// The first page of each of `ranges`, in one round trip where the backend can.
    ///
    /// # Errors
    /// [`KvError`] when the backend fails.
    pub async fn first_pages(
        &self,
        ranges: &[KeyRange],
        page: PageSize,
    ) -> Result<Vec<Page>, KvError> {
        self.inner.scan_pages(ranges, page).await
    }

    /// Where `range` divides into spans of about equal volume.
    ///
    /// # Errors
    /// [`KvError`] when the backend fails.
    pub async fn divide(&self, range: &KeyRange, division: Division) -> Result<Divided, KvError> {
        if range.is_empty() {
            return Ok(Divided::default());
        }
        let started = std::time::Instant::now();
        let divided = self.inner.divide(range, division).await;
        let mut divided = crate::metrics::get().time_read("divide", started, divided)?;
        let cuts = divided.cuts.len();
        divided.cuts.retain(|cut| divide::cuts_inside(range, cut));
        if divided.cuts.len() != cuts {
            divided.volumes = None;
        }
        Ok(divided)
    }

    /// Streams `range` in key order, one page per item, with the default [`PageSize`].
    #[must_use]
    pub fn scan(&self, range: KeyRange) -> BoxStream<'static, Result<Page, KvError>> {
        self.scan_pages(range, PageSize::default())
    }

    /// Streams `range` in key order, one page per item. Each page is read when the consumer
    /// asks for it; dropping the stream stops the scan. The stream ends after the first error.
    #[must_use]
    pub fn scan_pages(
        &self,
        range: KeyRange,
        page: PageSize,
    ) -> BoxStream<'static, Result<Page, KvError>> {
        self.scan_pages_growing(range, page, page)
    }

    /// [`scan_pages`](Self::scan_pages) with pages that grow: the first of size `first`
    /// (within `page`), each next one twice the one before, up to `page`. For a consumer that
    /// can start on a few pairs: it waits for a small page, not for a full one.
    #[must_use]
    pub fn scan_pages_growing(
        &self,
        range: KeyRange,
        first: PageSize,
        page: PageSize,
    ) -> BoxStream<'static, Result<Page, KvError>> {
        let page = page.at_least_one();
        let first = PageSize {
            rows: first.rows.min(page.rows),
            bytes: first.bytes.min(page.bytes),
        }
        .at_least_one();
        let snapshot = Arc::clone(&self.inner);
        let state = (!range.is_empty()).then_some((range, first));
        stream::unfold(state, move |state| {
            let snapshot = Arc::clone(&snapshot);
            async move {
                let (range, size) = state?;
                let next_size = PageSize {
                    rows: size.rows.saturating_mul(2).min(page.rows),
                    bytes: size.bytes.saturating_mul(2).min(page.bytes),
                };
                let started = std::time::Instant::now();
                let found = snapshot.scan_page(&range, size).await;
                match crate::metrics::get().time_read("scan_page", started, found) {
                    Err(err) => Some((Err(err), None)),
                    Ok(found) => {
                        let next = match found.last_key() {
                            Some(last) if !found.is_exhausted() => {
                                Some((range.after(last), next_size))
                                    .filter(|(rest, _)| !rest.is_empty())
                            }
                            _ => None,
                        };
                        if found.is_empty() {
                            None
                        } else {
                            Some((Ok(found), next))
                        }
                    }
                }
            }
        })
        .boxed()
    }
}
