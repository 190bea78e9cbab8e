//! The TiKV backend: optimistic Percolator transactions through `tikv-client`.
//!
//! This module is the only place that sees `tikv-client` types; every error it produces is a
//! [`KvError`] or a [`CommitOutcome`]. Keys are stored as the codec made them (they already
//! carry the deployment prefix).
//!
//! - A snapshot is a start timestamp. Each read builds a fresh read-only `tikv_client::Snapshot`
//!   at that timestamp, so reads of one snapshot share no buffer (the client caches every pair
//!   a transaction reads) and need no lock between them.
//! - A scan page is one bounded `scan(range, limit)`: the client sends one `KvScan` per region
//!   with that limit and merges the answers, so the limit bounds every region's response too.
//! - A commit is one optimistic transaction. Its requirements (keys absent, present or
//!   unchanged since the caller read them, ranges unchanged) are read at its start timestamp,
//!   and every key it requires or writes is part of its prewrite, so a concurrent writer of
//!   any of them makes one of the two conflict. A write conflict is retried internally with a
//!   new timestamp, a bounded number of times, and the retry checks every requirement again:
//!   a write set that depends on what its caller read is never applied over a change the
//!   caller did not see. A range requirement's own keys are not locked; what writes into such
//!   a range locks is a guard key the range's writer changes (see `codec::key`).
//! - Reads, and commits before their prewrite, wait out locks of live transactions for about
//!   [`TikvOptions::lock_wait`], through the client's own lock backoff; the client resolves
//!   expired locks itself. What stays a loop of ours does what the client's options cannot:
//!   waiting for a restarting PD (tikv-client 0.4's PD retries are fixed), retrying a write
//!   conflict with every requirement checked again at a new timestamp, and asking a scan
//!   whose answer outgrew the message limit for fewer rows.
//! - Nobody else advances the GC safe point: [`TikvBackend::advance_gc`] (or the task of
//!   [`TikvBackend::spawn_gc`]) does, never past the start of a snapshot still open, nor past
//!   what another deployment on the cluster registered with PD as its oldest read.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use tikv_client::{
    Backoff, CheckLevel, Error as TikvError, Key, RetryOptions, Snapshot as TikvSnapshot,
    Timestamp, TimestampExt as _, Transaction, TransactionClient, TransactionOptions,
};

use super::{
    CommitOutcome, Conflict, Divided, Division, KeyRange, KvBackend, KvError, KvSnapshot, Page,
    PageSize, Requirement, StagedWrites,
};

const NAME: &str = "tikv";

/// Most pairs one scan request asks each region for. With the client's 4 MiB response limit
/// this leaves about 4 KiB per pair; larger pairs shrink the limit adaptively.
const MAX_SCAN_ROWS: usize = 1024;

/// The first pause of a reader that meets a live transaction's lock, in milliseconds; the
/// pauses double from here.
const LOCK_BACKOFF_BASE_MS: u64 = 2;
/// The longest pause between a reader's attempts to get past a live lock, in milliseconds.
const LOCK_BACKOFF_MAX_MS: u64 = 100;

/// How long a request that needs PD sleeps before asking an unreachable PD again.
const PD_RETRY_PAUSE: Duration = Duration::from_millis(250);

/// Most region boundaries one division asks PD for (one call each); a range over more
/// regions divides at the first of them.
const MAX_REGIONS_DIVIDED: usize = 4096;

/// How long PD keeps a deployment's service safe point without a renewal.
pub const GC_SERVICE_TTL: Duration = Duration::from_mins(30);

/// The service name a backend registers its GC safe point under unless told otherwise.
const DEFAULT_GC_SERVICE: &str = "moraine";

/// How many bits of a TSO timestamp hold the logical counter.
const LOGICAL_BITS: u32 = 18;

/// Settings of a [`TikvBackend`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TikvOptions {
    /// How long [`TikvBackend::connect`] waits for PD, and how long a later request for a
    /// timestamp waits for an unreachable PD (a restarting PD, a leader change) to answer.
    pub connect_timeout: Duration,
    /// How long a read, or a commit before its prewrite, waits for a live lock to go away.
    pub lock_wait: Duration,
    /// How many times a commit that met a write conflict is tried again.
    pub conflict_retries: u32,
}

impl Default for TikvOptions {
    fn default() -> Self {
        Self {
            connect_timeout: Duration::from_secs(10),
            lock_wait: Duration::from_secs(20),
            conflict_retries: 8,
        }
    }
}

/// The TiKV backend.
#[derive(Clone)]
pub struct TikvBackend {
    client: TransactionClient,
    options: TikvOptions,
    /// PD's endpoints, for the calls the client does not make.
    pd_endpoints: Arc<[String]>,
    /// This deployment's name among the services holding back the cluster's GC.
    gc_service: Arc<str>,
    open: Arc<OpenSnapshots>,
    gc: Arc<Mutex<u64>>,
}

impl fmt::Debug for TikvBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TikvBackend")
            .field("options", &self.options)
            .field("open_snapshots", &self.open.count())
            .finish_non_exhaustive()
    }
}

impl TikvBackend {
    /// Connects to the cluster whose PD answers at `pd_endpoints` (`host:port`), waiting at
    /// most `timeout`, with otherwise default [`TikvOptions`].
    ///
    /// # Errors
    /// [`KvError::Unavailable`] when no PD endpoint answers within `timeout`.
    pub async fn connect(pd_endpoints: Vec<String>, timeout: Duration) -> Result<Self, KvError> {
        Self::connect_with(
            pd_endpoints,
            TikvOptions {
                connect_timeout: timeout,
                ..TikvOptions::default()
            },
        )
        .await
    }

    /// Connects with explicit `options`.
    ///
    /// # Errors
    /// [`KvError::Unavailable`] when no PD endpoint answers within `options.connect_timeout`.
    pub async fn connect_with(
        pd_endpoints: Vec<String>,
        options: TikvOptions,
    ) -> Result<Self, KvError> {
        if pd_endpoints.is_empty() {
            return Err(unavailable("no PD endpoint given"));
        }
        let shown = pd_endpoints.join(",");
        let endpoints: Arc<[String]> = pd_endpoints.clone().into();
        // The client has no connect deadline of its own: a PD that accepts connections and
        // never answers would hold it forever.
        let client = match tokio::time::timeout(
            options.connect_timeout,
            TransactionClient::new(pd_endpoints),
        )
        .await
        {
            Ok(Ok(client)) => client,
            Ok(Err(err)) => {
                return Err(unavailable(format!("PD at {shown} did not answer: {err}")));
            }
            Err(_) => {
                return Err(unavailable(format!(
                    "PD at {shown} did not answer within {:?}",
                    options.connect_timeout
                )));
            }
        };
        Ok(Self {
            client,
            options,
            pd_endpoints: endpoints,
            gc_service: Arc::from(DEFAULT_GC_SERVICE),
            open: Arc::new(OpenSnapshots::default()),
            gc: Arc::new(Mutex::new(0)),
        })
    }

    /// The settings in force.
    #[must_use]
    pub fn options(&self) -> TikvOptions {
        self.options
    }

    /// How many snapshots are open now.
    #[must_use]
    pub fn open_snapshots(&self) -> usize {
        self.open.count()
    }

    /// This backend with `service` as its name among the deployments that hold back the
    /// cluster's GC (one per key prefix sharing a cluster).
    #[must_use]
    pub fn with_gc_service(mut self, service: &str) -> Self {
        self.gc_service = Arc::from(service);
        self
    }

    /// Advances the GC safe point to `keep` before now, or to the start of the oldest open
    /// snapshot if that is earlier, and never backwards. Returns the safe point in force.
    ///
    /// The target is first registered with PD as this deployment's service safe point, and
    /// GC goes no further than the lowest service safe point of the cluster: deployments
    /// sharing a cluster (each under its own [`with_gc_service`](Self::with_gc_service) name)
    /// never collect what another still reads. A registration lapses after
    /// [`GC_SERVICE_TTL`] unless renewed.
    ///
    /// # Errors
    /// [`KvError::Unavailable`] when PD cannot be reached, or refuses the registration (then
    /// nothing is collected), [`KvError::Backend`] when lock cleanup fails.
    pub async fn advance_gc(&self, keep: Duration) -> Result<u64, KvError> {
        let now = self
            .waiting_for_pd(|| self.client.current_timestamp())
            .await?;
        let keep_ms = u64::try_from(keep.as_millis()).unwrap_or(u64::MAX);
        let mut target = now
            .version()
            .saturating_sub(keep_ms.saturating_mul(1 << LOGICAL_BITS));
        if let Some(oldest) = self.open.oldest() {
            target = target.min(oldest);
        }
        let lowest = super::pd::update_service_safe_point(
            &self.pd_endpoints,
            &self.gc_service,
            GC_SERVICE_TTL,
            target,
        )
        .await
        .map_err(|err| unavailable(format!("registering the GC safe point failed: {err}")))?;
        target = target.min(lowest);
        let last = *self.gc.lock().unwrap_or_else(PoisonError::into_inner);
        if target <= last {
            return Ok(last);
        }
        self.client
            .gc(Timestamp::from_version(target))
            .await
            .map_err(read_error)?;
        let mut last = self.gc.lock().unwrap_or_else(PoisonError::into_inner);
        *last = (*last).max(target);
        Ok(*last)
    }

    /// Runs [`advance_gc`](Self::advance_gc) every `every` until the returned handle is
    /// dropped. Failures are logged and retried at the next tick.
    #[must_use]
    pub fn spawn_gc(&self, every: Duration, keep: Duration) -> GcTask {
        let backend = self.clone();
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(every);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticks.tick().await;
                match backend.advance_gc(keep).await {
                    Ok(safe_point) => tracing::debug!(safe_point, "tikv GC safe point advanced"),
                    Err(err) => tracing::warn!(%err, "tikv GC failed"),
                }
            }
        });
        GcTask { task }
    }

    /// Runs `request` (which needs PD) again while PD is unreachable, for up to
    /// [`TikvOptions::connect_timeout`]. The client reconnects to PD at most once a second and
    /// fails at once in between, so a restarting PD is waited out here.
    async fn waiting_for_pd<T, F, Fut>(&self, mut request: F) -> Result<T, KvError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, TikvError>>,
    {
        let started = Instant::now();
        loop {
            match request().await {
                Ok(value) => return Ok(value),
                Err(err)
                    if is_unreachable(&err) && started.elapsed() < self.options.connect_timeout =>
                {
                    tracing::debug!(%err, "tikv: PD unreachable, asking again");
                    tokio::time::sleep(PD_RETRY_PAUSE).await;
                }
                Err(err) => return Err(read_error(err)),
            }
        }
    }

    fn read_options() -> TransactionOptions {
        TransactionOptions::new_optimistic().drop_check(CheckLevel::None)
    }

    fn write_options() -> TransactionOptions {
        TransactionOptions::new_optimistic().drop_check(CheckLevel::Warn)
    }

    /// One attempt at a commit.
    async fn try_commit(&self, writes: &StagedWrites) -> Result<Attempt, KvError> {
        let started = Instant::now();
        let mut txn = self
            .waiting_for_pd(|| self.client.begin_with_options(Self::write_options()))
            .await?;
        if writes.has_requirements() {
            // The requirements are read at the commit's own start timestamp; every key they
            // name is in its prewrite (written or locked), so a change after that conflicts.
            let reads = super::Snapshot {
                inner: Arc::new(Snapshot {
                    client: self.client.clone(),
                    pd_endpoints: Arc::clone(&self.pd_endpoints),
                    timestamp: txn.start_timestamp(),
                    lock_wait: self.options.lock_wait.saturating_sub(started.elapsed()),
                    _registration: OpenSnapshot::register(
                        &self.open,
                        txn.start_timestamp().version(),
                    ),
                }),
            };
            let unmet = match requirements_unmet(&reads, writes).await {
                Ok(unmet) => unmet,
                Err(err) => {
                    abandon(&mut txn).await;
                    return Err(err);
                }
            };
            if let Some(conflict) = unmet {
                abandon(&mut txn).await;
                return Ok(Attempt::Done(CommitOutcome::Conflict(conflict)));
            }
        }
        let mut lock_only = Vec::new();
        for (key, staged) in writes.iter() {
            let key = Key::from(key.to_vec());
            let buffered = match (&staged.write, staged.requirement) {
                (Some(Some(value)), Requirement::Absent) => txn.insert(key, value.to_vec()).await,
                (Some(Some(value)), _) => txn.put(key, value.to_vec()).await,
                (Some(None), _) => txn.delete(key).await,
                (None, _) => {
                    lock_only.push(key);
                    Ok(())
                }
            };
            if let Err(err) = buffered {
                abandon(&mut txn).await;
                return Err(failed(format!("buffering a mutation failed: {err}")));
            }
        }
        if !lock_only.is_empty() {
            // A required key that is not written still takes part in the prewrite, so that a
            // concurrent delete of it conflicts with this commit.
            if let Err(err) = txn.lock_keys(lock_only).await {
                abandon(&mut txn).await;
                return Err(failed(format!("locking required keys failed: {err}")));
            }
        }
        match txn.commit().await {
            Ok(_) => Ok(Attempt::Done(CommitOutcome::Committed)),
            Err(err) => Ok(self.after_failed_commit(&mut txn, err).await),
        }
    }

    /// Decides what a failed `commit()` means. Key errors of the prewrite prove that the
    /// primary was never committed. Anything else may have struck the primary's commit, so the
    /// transaction is rolled back: if that succeeds it can never commit, and if it fails the
    /// outcome is unknown.
    async fn after_failed_commit(&self, txn: &mut Transaction, err: TikvError) -> Attempt {
        if matches!(err, TikvError::UndeterminedError(_)) {
            return Attempt::Done(CommitOutcome::Unknown {
                reason: format!("the primary key's commit was sent but not answered: {err}"),
            });
        }
        let class = classify(&err);
        let rollback = txn.rollback().await;
        match class {
            ErrorClass::AlreadyExists(key) => {
                Attempt::Done(CommitOutcome::Conflict(Conflict::AlreadyExists { key }))
            }
            ErrorClass::WriteConflict(key) => Attempt::Retry(Conflict::WriteConflict { key }),
            ErrorClass::Locked | ErrorClass::Aborted => {
                Attempt::Retry(Conflict::WriteConflict { key: None })
            }
            ErrorClass::Other => match rollback {
                Ok(()) => Attempt::Failed(classify_failure(&err)),
                Err(rollback_err) => Attempt::Done(CommitOutcome::Unknown {
                    reason: format!(
                        "commit failed ({err}) and rolling it back failed too ({rollback_err})"
                    ),
                }),
            },
        }
    }
}

/// The first requirement of `writes` that the store, read through `reads`, does not meet.
async fn requirements_unmet(
    reads: &super::Snapshot,
    writes: &StagedWrites,
) -> Result<Option<Conflict>, KvError> {
    let required: Vec<Vec<u8>> = writes
        .iter()
        .filter(|(_, staged)| staged.requirement != Requirement::None)
        .map(|(key, _)| key.to_vec())
        .collect();
    let values: BTreeMap<Vec<u8>, Vec<u8>> = required
        .iter()
        .cloned()
        .zip(reads.batch_get(&required).await?)
        .filter_map(|(key, value)| Some((key, value?)))
        .collect();
    let mut ranges = Vec::with_capacity(writes.ranges().len());
    for required in writes.ranges() {
        let pages: Vec<Page> = futures::TryStreamExt::try_collect(
            reads.scan_pages(required.range.clone(), PageSize::default()),
        )
        .await?;
        ranges.push(pages);
    }
    let mut next_range = ranges.iter();
    writes.first_unmet(
        |key| Ok(values.get(key)),
        |_, pair| {
            for page in next_range.next().into_iter().flatten() {
                for (key, value) in page.iter() {
                    pair(key, value);
                }
            }
            Ok(())
        },
    )
}

/// The background GC task of [`TikvBackend::spawn_gc`]; dropping it stops the task.
#[derive(Debug)]
pub struct GcTask {
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GcTask {
    fn drop(&mut self) {
        self.task.abort();
    }
}

enum Attempt {
    Done(CommitOutcome),
    Retry(Conflict),
    Failed(KvError),
}

#[async_trait]
impl KvBackend for TikvBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn snapshot(&self) -> Result<Arc<dyn KvSnapshot>, KvError> {
        let timestamp = self
            .waiting_for_pd(|| self.client.current_timestamp())
            .await?;
        let registration = OpenSnapshot::register(&self.open, timestamp.version());
        Ok(Arc::new(Snapshot {
            client: self.client.clone(),
            pd_endpoints: Arc::clone(&self.pd_endpoints),
            timestamp,
            lock_wait: self.options.lock_wait,
            _registration: registration,
        }))
    }

    async fn commit(&self, writes: Arc<StagedWrites>) -> Result<CommitOutcome, KvError> {
        let mut pause = Duration::from_millis(5);
        let mut attempt = 0;
        loop {
            match self.try_commit(&writes).await? {
                Attempt::Done(outcome) => return Ok(outcome),
                Attempt::Failed(err) => return Err(err),
                Attempt::Retry(conflict) => {
                    attempt += 1;
                    if attempt > self.options.conflict_retries {
                        return Ok(CommitOutcome::Conflict(conflict));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
            }
        }
    }
}

/// A snapshot: a start timestamp, kept in the backend's registry of open snapshots while it
/// lives so that GC does not pass it.
struct Snapshot {
    client: TransactionClient,
    pd_endpoints: Arc<[String]>,
    timestamp: Timestamp,
    lock_wait: Duration,
    _registration: OpenSnapshot,
}

impl Snapshot {
    /// A reader at the snapshot's timestamp that waits out live locks for about `lock_wait`,
    /// through the client's own lock backoff.
    fn reader(&self) -> TikvSnapshot {
        let options = TikvBackend::read_options().retry_options(RetryOptions {
            lock_backoff: lock_backoff(self.lock_wait),
            ..RetryOptions::default_optimistic()
        });
        self.client.snapshot(self.timestamp.clone(), options)
    }

    /// Runs `read` on a fresh reader; its error as moraine tells it.
    async fn reading<T, F, Fut>(&self, read: F) -> Result<T, KvError>
    where
        F: FnOnce(TikvSnapshot) -> Fut,
        Fut: Future<Output = Result<T, TikvError>>,
    {
        read(self.reader()).await.map_err(read_error)
    }
}

/// The client's lock backoff for waiting about `wait` for live locks to go: delays doubling
/// from [`LOCK_BACKOFF_BASE_MS`] to [`LOCK_BACKOFF_MAX_MS`], then as many more as fill
/// `wait`.
fn lock_backoff(wait: Duration) -> Backoff {
    // The doubling delays before the cap add up to about one capped delay.
    let ramp = (LOCK_BACKOFF_MAX_MS / LOCK_BACKOFF_BASE_MS).ilog2() + 1;
    let capped =
        u64::try_from(wait.as_millis() / u128::from(LOCK_BACKOFF_MAX_MS)).unwrap_or(u64::MAX);
    let attempts = ramp.saturating_add(u32::try_from(capped).unwrap_or(u32::MAX));
    Backoff::no_jitter_backoff(LOCK_BACKOFF_BASE_MS, LOCK_BACKOFF_MAX_MS, attempts)
}

#[async_trait]
impl KvSnapshot for Snapshot {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.reading(|mut reader| async move { reader.get(key.to_vec()).await })
            .await
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        if keys.is_empty() {
            return Ok(Vec::new());
        }
        let found: BTreeMap<Vec<u8>, Vec<u8>> = self
            .reading(|mut reader| {
                let keys = keys.to_vec();
                async move {
                    Ok(reader
                        .batch_get(keys)
                        .await?
                        .map(|pair| {
                            let (key, value): (Key, Vec<u8>) = pair.into();
                            (Vec::from(key), value)
                        })
                        .collect())
                }
            })
            .await?;
        // A key asked for twice is answered twice.
        Ok(keys.iter().map(|key| found.get(key).cloned()).collect())
    }

    /// At the region boundaries inside `range`: TiKV splits regions by size, so they are
    /// spans of about equal volume already, and a read of one stays on one region. Their
    /// volume is not measured.
    async fn divide(&self, range: &KeyRange, division: Division) -> Result<Divided, KvError> {
        let starts = super::pd::region_starts(
            &self.pd_endpoints,
            &range.start,
            &range.end,
            MAX_REGIONS_DIVIDED,
        )
        .await
        .map_err(|reason| KvError::Unavailable {
            backend: NAME,
            reason: format!("asking PD for region boundaries failed: {reason}"),
        })?;
        Ok(Divided {
            cuts: super::divide::thinned(starts, division.max_spans),
            volumes: None,
        })
    }

    async fn scan_page(&self, range: &KeyRange, page: PageSize) -> Result<Page, KvError> {
        if range.is_empty() {
            return Ok(Page::exhausted_empty());
        }
        let mut limit = page.rows.clamp(1, MAX_SCAN_ROWS);
        let pairs = loop {
            let asked = u32::try_from(limit).unwrap_or(u32::MAX);
            let result = self
                .reader()
                .scan(range.start.clone()..range.end.clone(), asked)
                .await
                .map(Iterator::collect::<Vec<_>>);
            match result {
                Ok(pairs) => break pairs,
                // A region's answer outgrew the gRPC message limit: ask for fewer rows.
                Err(err) if limit > 1 && is_too_large(&err) => limit /= 2,
                Err(err) => return Err(read_error(err)),
            }
        };
        let returned = pairs.len();
        let mut out = Page::with_capacity(returned, 0);
        for pair in pairs {
            if page.is_full(out.len(), out.bytes()) {
                break;
            }
            let (key, value): (Key, Vec<u8>) = pair.into();
            out.push(&Vec::from(key), &value);
        }
        // Fewer rows than asked for means the client read every region of the range to its end.
        let exhausted = out.len() == returned && returned < limit;
        out.set_exhausted(exhausted);
        Ok(out)
    }
}

/// Start timestamps of the open snapshots, with how many snapshots use each.
#[derive(Debug, Default)]
struct OpenSnapshots {
    starts: Mutex<BTreeMap<u64, usize>>,
}

impl OpenSnapshots {
    fn oldest(&self) -> Option<u64> {
        let starts = self.starts.lock().unwrap_or_else(PoisonError::into_inner);
        starts.keys().next().copied()
    }

    fn count(&self) -> usize {
        let starts = self.starts.lock().unwrap_or_else(PoisonError::into_inner);
        starts.values().sum()
    }
}

/// One snapshot's entry in [`OpenSnapshots`], removed when dropped.
struct OpenSnapshot {
    registry: Arc<OpenSnapshots>,
    start: u64,
}

impl OpenSnapshot {
    fn register(registry: &Arc<OpenSnapshots>, start: u64) -> Self {
        let mut starts = registry
            .starts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        *starts.entry(start).or_insert(0) += 1;
        Self {
            registry: Arc::clone(registry),
            start,
        }
    }
}

impl Drop for OpenSnapshot {
    fn drop(&mut self) {
        let mut starts = self
            .registry
            .starts
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(count) = starts.get_mut(&self.start) {
            *count -= 1;
            if *count == 0 {
                starts.remove(&self.start);
            }
        }
    }
}

/// Ends a transaction that never reached its prewrite, or whose prewrite failed. Its locks, if
/// any, are removed now rather than after their TTL; if that fails, readers resolve them.
async fn abandon(txn: &mut Transaction) {
    if let Err(err) = txn.rollback().await {
        tracing::debug!(%err, "tikv rollback of an abandoned transaction failed");
    }
}

/// What a failed commit's error says, found by walking the client's error nesting.
#[derive(Debug, PartialEq, Eq)]
enum ErrorClass {
    /// An insert found its key present.
    AlreadyExists(Vec<u8>),
    /// Another transaction committed a key of this one after it started.
    WriteConflict(Option<Vec<u8>>),
    /// A live lock of another transaction outlasted the client's lock backoff.
    Locked,
    /// Another transaction rolled this one back (its locks expired).
    Aborted,
    /// Anything else.
    Other,
}

/// Whether TiKV refused a commit because this transaction's lock is gone (another
/// transaction resolved it). kvproto has no field for that: TiKV reports its
/// `TxnLockNotFound` only as the text of `abort` (or `retryable`), so this is the one place
/// that reads a key error's text. The fake cluster answers the same way, and
/// `tikv_faults::a_crashed_writers_lock_is_resolved_after_its_ttl` fails if the text goes.
fn lock_not_found(key_error: &tikv_client::ProtoKeyError) -> bool {
    const TXN_LOCK_NOT_FOUND: &str = "TxnLockNotFound";
    key_error.abort.contains(TXN_LOCK_NOT_FOUND) || key_error.retryable.contains(TXN_LOCK_NOT_FOUND)
}

fn classify(err: &TikvError) -> ErrorClass {
    let mut found = ErrorClass::Other;
    visit(err, &mut |leaf| {
        let class = match leaf {
            TikvError::KeyError(key_error) => {
                if let Some(exists) = &key_error.already_exist {
                    ErrorClass::AlreadyExists(exists.key.clone())
                } else if let Some(conflict) = &key_error.conflict {
                    ErrorClass::WriteConflict(Some(conflict.key.clone()))
                } else if key_error.locked.is_some() {
                    ErrorClass::Locked
                } else if key_error.txn_not_found.is_some() || lock_not_found(key_error) {
                    ErrorClass::Aborted
                } else {
                    ErrorClass::Other
                }
            }
            TikvError::ResolveLockError(_) => ErrorClass::Locked,
            TikvError::TxnNotFound(_) => ErrorClass::Aborted,
            _ => ErrorClass::Other,
        };
        // The strongest statement wins: an existing key is a definite answer, a conflict a
        // retryable one.
        found = match (&found, class) {
            (ErrorClass::AlreadyExists(_), _) => return,
            (_, class @ ErrorClass::AlreadyExists(_)) => class,
            (ErrorClass::WriteConflict(_), _) => return,
            (_, class @ ErrorClass::WriteConflict(_)) | (ErrorClass::Other, class) => class,
            _ => return,
        };
    });
    // Among several existing keys, report the first in key order, as the other backends do.
    if let ErrorClass::AlreadyExists(_) = found {
        let mut first: Option<Vec<u8>> = None;
        visit(err, &mut |leaf| {
            if let TikvError::KeyError(key_error) = leaf
                && let Some(exists) = &key_error.already_exist
                && first.as_ref().is_none_or(|f| exists.key < *f)
            {
                first = Some(exists.key.clone());
            }
        });
        if let Some(key) = first {
            return ErrorClass::AlreadyExists(key);
        }
    }
    found
}

fn visit(err: &TikvError, leaf: &mut dyn FnMut(&TikvError)) {
    match err {
        TikvError::MultipleKeyErrors(errors) | TikvError::ExtractedErrors(errors) => {
            for inner in errors {
                visit(inner, leaf);
            }
        }
        TikvError::UndeterminedError(inner) | TikvError::PessimisticLockError { inner, .. } => {
            visit(inner, leaf);
        }
        other => leaf(other),
    }
}

fn is_lock_wait(err: &TikvError) -> bool {
    let mut locked = false;
    visit(err, &mut |leaf| {
        locked |= matches!(leaf, TikvError::ResolveLockError(_))
            || matches!(leaf, TikvError::KeyError(e) if e.locked.is_some());
    });
    locked
}

/// Whether an untyped error of the client is its PD client failing to reach PD. tikv-client
/// 0.4 reports those only as `InternalError` text (`PD cluster failed to respond`, `failed
/// to connect to …`, `TimestampRequest channel is closed`), so this is the one place that
/// reads it; `tikv_faults::an_unreachable_pd_is_unavailable_within_the_timeout` and
/// `a_pd_restart_loses_no_acknowledged_commit` fail if an upgrade changes the text.
fn pd_failure(message: &str) -> bool {
    const PD_FAILURES: [&str; 3] = ["PD", "failed to connect to", "TimestampRequest"];
    PD_FAILURES.iter().any(|text| message.contains(text))
}

/// Whether a failure came from a region or store the client could not reach in time, rather
/// than from a fault of the request.
fn is_unreachable(err: &TikvError) -> bool {
    let mut unreachable = false;
    visit(err, &mut |leaf| {
        unreachable |= matches!(
            leaf,
            TikvError::RegionError(_)
                | TikvError::Grpc(_)
                | TikvError::GrpcAPI(_)
                | TikvError::LeaderNotFound { .. }
                | TikvError::RegionForKeyNotFound { .. }
                | TikvError::RegionForRangeNotFound { .. }
                | TikvError::RegionNotFoundInResponse { .. }
                | TikvError::Canceled(_)
                | TikvError::Channel(_)
                | TikvError::Io(_)
        ) || matches!(leaf, TikvError::InternalError { message } if pd_failure(message));
    });
    unreachable
}

/// Whether a gRPC message outgrew its size limit, which gRPC libraries report as
/// `OUT_OF_RANGE` (a code number the same in every one, so the client's tonic and ours agree).
fn is_too_large(err: &TikvError) -> bool {
    let mut too_large = false;
    visit(err, &mut |leaf| {
        too_large |= matches!(leaf, TikvError::GrpcAPI(status)
            if status.code() as i32 == tonic::Code::OutOfRange as i32);
    });
    too_large
}

/// Maps an error of a read, or of a commit before anything could be written.
#[expect(
    clippy::needless_pass_by_value,
    reason = "shaped for `map_err`; the error ends here"
)]
fn read_error(err: TikvError) -> KvError {
    classify_failure(&err)
}

fn classify_failure(err: &TikvError) -> KvError {
    if is_lock_wait(err) {
        return failed(format!(
            "keys stayed locked by another transaction: {}",
            describe(err)
        ));
    }
    if is_unreachable(err) {
        unavailable(describe(err))
    } else {
        failed(describe(err))
    }
}

/// Longest account of a client error kept, in bytes.
const MAX_DESCRIPTION: usize = 1000;

/// A short account of a client error: its `Display`, with lock lists summarized.
fn describe(err: &TikvError) -> String {
    match err {
        TikvError::ResolveLockError(locks) => {
            format!(
                "{} lock(s) of live transactions could not be resolved",
                locks.len()
            )
        }
        other => crate::text::shortened(&other.to_string(), MAX_DESCRIPTION).into_owned(),
    }
}

fn unavailable(reason: impl Into<String>) -> KvError {
    KvError::Unavailable {
        backend: NAME,
        reason: reason.into(),
    }
}

fn failed(reason: impl Into<String>) -> KvError {
    KvError::Backend {
        backend: NAME,
        reason: reason.into(),
    }
}

#[cfg(test)]
mod tests;
