//! The embedded backend: one redb file, and a commit log beside it.
//!
//! All data lives in one `&[u8] -> &[u8]` table, ordered by raw key bytes, which is the
//! memcomparable order the keyspace is built for; beside it, the volume tallies (`tally.rs`)
//! that let a range of whole tables divide without a walk, and the twin marks (`twins.rs`)
//! that say which mapping ids more than one table holds. redb is blocking: a read that
//! reaches more than a few hundred pairs runs on tokio's blocking pool, never on the async
//! runtime's workers; a smaller one (a point read, a short page) runs in place, since it
//! takes less time than the hand-off would.
//!
//! Commits go through one writer thread, which groups the commits waiting for it (group
//! commit). Each commit of a group is checked against the state the commits before it leave, so
//! the outcome is the same as committing them one after another: a commit whose requirement
//! fails is a conflict and writes nothing, the others land together. The group is then appended
//! to the commit log (`log.rs`) and synced, and only then acknowledged: a commit is durable
//! when it is acknowledged. A large transaction's writes come unsealed
//! ([`KvBackend::orders_writes`]) and are put in key order on a thread of their own while the
//! log is written, which takes them in any order. A second thread, the applier, then puts the
//! group's writes in redb (a large commit's runs of new keys through a cursor, in key order)
//! while the writer goes on with the next group: until they are in the file, snapshots and the
//! checks of later commits read the file through them, so an acknowledged commit is visible at
//! once, and a small commit never waits for a large transaction's B-tree work. redb's own
//! commits are not synced, except at checkpoints (every second of writing, or when the log has
//! grown large, and at shutdown), after which the log starts over; a checkpoint that would wait
//! for a large apply is put off until the apply is done. On open, the log's records that redb's
//! durable state lacks are applied again.

mod log;
mod rule;
mod tally;
mod twins;

use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use redb::{
    Database, Durability, ReadOnlyTable, ReadableDatabase as _, ReadableTable as _, TableDefinition,
};

use super::divide::Divider;
use super::overlay::OverlaySnapshot;
use super::page::fill_page;
use super::{
    CommitOutcome, Divided, Division, KeyRange, KvBackend, KvError, KvSnapshot, Page, PageSize,
    StagedWrites,
};
pub use log::LOG_NAME;
use log::Log;
use tally::Changes;
pub use tally::Tally;
use twins::Marks;
pub use twins::Twins;

const DATA: TableDefinition<&[u8], &[u8]> = TableDefinition::new("moraine_kv");
/// The store's own bookkeeping, apart from the data.
const META: TableDefinition<&str, u64> = TableDefinition::new("moraine_meta");
/// The sequence number of the last commit group applied to the redb file.
const APPLIED: &str = "applied_seq";

/// File name of the store inside its data directory.
pub const FILE_NAME: &str = "moraine.redb";

const NAME: &str = "redb";

/// Most commits one group holds.
const MAX_GROUP: usize = 256;
/// A group takes no more commits once it holds this many bytes.
const MAX_GROUP_BYTES: usize = 64 << 20;
/// A checkpoint follows as soon as the log holds this many bytes.
const CHECKPOINT_LOG_BYTES: u64 = 64 << 20;

/// Settings of the embedded store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RedbOptions {
    /// Memory redb may use to cache pages and buffer writes. The default, 16 MiB, is as fast
    /// as 32 MiB on the comparison harness's reads and commits at medium and large scale (as
    /// 32 MiB was as fast as 64 MiB at medium scale), and the server holds about 20 MiB less
    /// in every workload: the scans stream past the cache, and the operating system's page
    /// cache holds the file as well. (Measured 2026-12-07 on the release build, the two sizes
    /// alternated: a full mapping load at 1M mappings took 1.69-1.99 s of wall time and
    /// 2.10-2.37 s of server CPU with 16 MiB, 1.86-1.92 s and 2.30-2.40 s with 32 MiB; a
    /// 100k-mapping transaction peaked at 164-166 MiB instead of 187-189 MiB.)
    pub cache_bytes: usize,
    /// A checkpoint follows at most this long after the first commit it covers: the longest
    /// the commit log grows for, and so about the longest a replay after a crash takes to
    /// read back.
    pub checkpoint_every: Duration,
    /// What the store tallies by unit ([`Tally`]), so that a whole-table read divides
    /// into endpoints without walking every pair; `None` tallies nothing.
    pub tally: Option<Tally>,
    /// Which keys the store marks when they share a prefix ([`Twins`]), so that a read can
    /// ask which keys of a range may have a twin instead of looking at each; `None` marks
    /// nothing.
    pub twins: Option<Twins>,
}

impl Default for RedbOptions {
    fn default() -> Self {
        Self {
            cache_bytes: 16 << 20,
            checkpoint_every: Duration::from_secs(1),
            tally: None,
            twins: None,
        }
    }
}

/// The redb backend.
#[derive(Debug, Clone)]
pub struct RedbBackend {
    db: Arc<Database>,
    path: PathBuf,
    committer: Arc<Committer>,
}

impl RedbBackend {
    /// Opens the store in directory `dir` with default options, creating the directory and
    /// the file if missing.
    ///
    /// # Errors
    /// [`KvError::Unavailable`] when the directory or file cannot be created or opened (for
    /// example because another process holds it).
    pub async fn open(dir: &Path) -> Result<Self, KvError> {
        Self::open_with(dir, RedbOptions::default()).await
    }

    /// Opens the store in directory `dir` with `options`, applying what its commit log holds
    /// beyond the file's durable state.
    ///
    /// # Errors
    /// As [`open`](Self::open); [`KvError::Backend`] when the log cannot be read back.
    pub async fn open_with(dir: &Path, options: RedbOptions) -> Result<Self, KvError> {
        let dir = dir.to_owned();
        blocking(move || {
            std::fs::create_dir_all(&dir).map_err(|err| unavailable(&dir, &err))?;
            let path = dir.join(FILE_NAME);
            let db = Database::builder()
                .set_cache_size(options.cache_bytes)
                .create(&path)
                .map_err(|err| unavailable(&path, &err))?;
            let (mut log, applied, replayed) = recover(&db, &dir, &options)?;
            if replayed > 0 {
                tracing::info!(
                    records = replayed,
                    applied,
                    "replayed the commit log after an unclean stop"
                );
            }
            log.reset().map_err(|err| unavailable(log.path(), &err))?;
            let db = Arc::new(db);
            let committer = Arc::new(Committer::start(
                Arc::clone(&db),
                log,
                applied,
                options.checkpoint_every,
            )?);
            Ok(Self {
                db,
                path,
                committer,
            })
        })
        .await
    }

    /// The store's file.
    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Creates the tables if missing, opens the commit log in `dir` and applies, durably, the
/// log's records that the file's durable state lacks; tallies and marks the file afresh
/// when it records other rules than `options`, or when its rules were not kept through every
/// commit group it holds (a build that does not keep them applied some). Returns the log, the
/// sequence number of the last commit group the file holds, and how many records were
/// applied.
fn recover(db: &Database, dir: &Path, options: &RedbOptions) -> Result<(Log, u64, usize), KvError> {
    let tally = options.tally.as_ref();
    let mut txn = db.begin_write().map_err(failed)?;
    txn.set_durability(Durability::Immediate).map_err(failed)?;
    let (log, applied, replayed) = {
        let mut data = txn.open_table(DATA).map_err(failed)?;
        let mut meta = txn.open_table(META).map_err(failed)?;
        let mut tally_rule = txn.open_table(tally::RULE).map_err(failed)?;
        let mut tallies = txn.open_table(tally::TALLIES).map_err(failed)?;
        let mut twin_rule = txn.open_table(twins::RULE).map_err(failed)?;
        let mut twin_marks = txn.open_table(twins::TWINS).map_err(failed)?;
        let durable = meta
            .get(APPLIED)
            .map_err(failed)?
            .map_or(0, |seq| seq.value());
        let kept = |file: &redb::Table<&'static str, &'static [u8]>| {
            rule::kept_through(file).map(|through| through == Some(durable))
        };
        let recorded = Tally::recorded(&tally_rule).map_err(failed)?;
        let same = recorded.as_ref() == tally && kept(&tally_rule).map_err(failed)?;
        let recorded_twins = Twins::recorded(&twin_rule).map_err(failed)?;
        let same_twins = recorded_twins.as_ref() == options.twins.as_ref()
            && kept(&twin_rule).map_err(failed)?;
        let mut changes = Derived {
            tallies: Changes::new(recorded.filter(|_| same)),
            marks: Marks::new(recorded_twins.filter(|_| same_twins)),
        };
        let mut applied = durable;
        let mut replayed = 0;
        let log = Log::open(dir, |record| {
            if record.seq <= durable {
                return Ok(());
            }
            for &(key, value) in &record.writes {
                put(&mut data, &mut changes, key, value).map_err(std::io::Error::other)?;
            }
            applied = record.seq;
            replayed += 1;
            Ok::<_, std::io::Error>(())
        })
        .map_err(|err| unavailable(&dir.join(LOG_NAME), &err))?;
        meta.insert(APPLIED, applied).map_err(failed)?;
        changes.tallies.apply(&mut tallies).map_err(failed)?;
        changes.marks.apply(&mut twin_marks).map_err(failed)?;
        if !same {
            Tally::retally(tally, &mut tally_rule, &mut tallies, &data).map_err(failed)?;
            tracing::info!(
                tallied = tally.is_some(),
                "tallied the store's volume afresh"
            );
        }
        if !same_twins {
            let twins = options.twins.as_ref();
            Twins::remark(twins, &mut twin_rule, &mut twin_marks, &data).map_err(failed)?;
            tracing::info!(
                marked = twins.is_some(),
                "marked the store's twin keys afresh"
            );
        }
        if tally.is_some() {
            rule::keep_through(&mut tally_rule, applied).map_err(failed)?;
        }
        if options.twins.is_some() {
            rule::keep_through(&mut twin_rule, applied).map_err(failed)?;
        }
        (log, applied, replayed)
    };
    txn.commit().map_err(failed)?;
    settle(db).map_err(failed)?;
    Ok((log, applied, replayed))
}

/// What a run of writes changes beside the data: the tallies of volume and the twin marks.
struct Derived {
    tallies: Changes,
    marks: Marks,
}

impl Derived {
    /// Changes under the rules `txn`'s file records.
    fn recorded(txn: &redb::WriteTransaction) -> Result<Self, redb::Error> {
        Ok(Self {
            tallies: Changes::new(Tally::recorded(&txn.open_table(tally::RULE)?)?),
            marks: Marks::new(Twins::recorded(&txn.open_table(twins::RULE)?)?),
        })
    }

    /// Writes the changes to `txn`'s tallies and marks, and that their rules were kept
    /// through commit group `seq`.
    fn apply(self, txn: &redb::WriteTransaction, seq: u64) -> Result<(), redb::Error> {
        if self.tallies.kept() {
            rule::keep_through(&mut txn.open_table(tally::RULE)?, seq)?;
        }
        if self.marks.kept() {
            rule::keep_through(&mut txn.open_table(twins::RULE)?, seq)?;
        }
        self.tallies.apply(&mut txn.open_table(tally::TALLIES)?)?;
        self.marks.apply(&mut txn.open_table(twins::TWINS)?)
    }
}

/// Writes `value` at `key` in `data` (deletes it for `None`), recording the change of
/// volume, and a new key's twin, in `changes`.
fn put(
    data: &mut redb::Table<&'static [u8], &'static [u8]>,
    changes: &mut Derived,
    key: &[u8],
    value: Option<&[u8]>,
) -> Result<(), redb::StorageError> {
    let before = match value {
        Some(value) => data.insert(key, value)?,
        None => data.remove(key)?,
    }
    .map(|old| old.value().len());
    changes.tallies.record(key, before, value.map(<[u8]>::len));
    if before.is_none() && value.is_some() {
        changes.marks.new_key_in(data, key)?;
    }
    Ok(())
}

/// Commits nothing, durably: after a durable commit, what that commit's epilogue left in
/// redb's write buffer reaches the file.
///
/// After a durable commit that frees pages, redb frees them in an epilogue committed
/// non-durably, whose pages stay in its write buffer; until the next durable commit
/// empties the buffer, every read that misses the page cache first walks all of the
/// buffer's lock stripes to reclaim room (measured: 15% of a table-scoped load's server
/// CPU on a store of 1M mappings, 131 atomic lock attempts per page read). An empty
/// durable commit frees nothing, so it leaves nothing behind: one more fsync per
/// checkpoint, none per commit.
fn settle(db: &Database) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    txn.set_durability(Durability::Immediate)?;
    txn.commit()?;
    Ok(())
}

#[async_trait]
impl KvBackend for RedbBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn snapshot(&self) -> Result<Arc<dyn KvSnapshot>, KvError> {
        // Opening a read transaction reads no page: it runs in place. Under the lock, so that
        // the file and the writes not yet in it are read at the same point: a group applied
        // meanwhile is then seen twice, which is harmless, never not at all.
        let (txn, unapplied, version) = {
            let visible = self.committer.unapplied.visible();
            (
                self.db.begin_read().map_err(failed)?,
                visible.writes.clone(),
                visible.seq,
            )
        };
        let table = txn.open_table(DATA).map_err(failed)?;
        let file: Arc<dyn KvSnapshot> = Arc::new(RedbSnapshot {
            table: Arc::new(table),
            txn: Arc::new(txn),
        });
        let inner = unapplied.into_iter().fold(file, |base, writes| {
            Arc::new(OverlaySnapshot { base, writes }) as Arc<dyn KvSnapshot>
        });
        Ok(Arc::new(AtVersion { inner, version }))
    }

    async fn commit(&self, writes: Arc<StagedWrites>) -> Result<CommitOutcome, KvError> {
        self.committer.commit(writes).await
    }

    fn orders_writes(&self) -> bool {
        true
    }
}

/// A commit waiting for the writer thread.
struct Request {
    writes: Arc<StagedWrites>,
    reply: tokio::sync::oneshot::Sender<Result<CommitOutcome, KvError>>,
}

impl Request {
    fn bytes(&self) -> usize {
        self.writes.bytes()
    }

    fn answer(self, outcome: Result<CommitOutcome, KvError>) {
        // A caller that went away no longer needs the answer.
        let _ = self.reply.send(outcome);
    }
}

/// The writer thread and its queue. Dropping the last handle closes the queue and waits for
/// the thread, which checkpoints first, so that the file is released when the backend is.
#[derive(Debug)]
struct Committer {
    queue: Mutex<Option<mpsc::Sender<Request>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    /// Set when the log or redb failed after a group was logged: what the file and the log
    /// hold may then differ from what readers see, so nothing more is committed until the
    /// store is opened again (which replays the log).
    failed: Arc<AtomicBool>,
    /// What snapshots see beyond the file: the commits acknowledged but not yet applied to
    /// it, and the number of the last group acknowledged.
    unapplied: Unapplied,
}

/// What a snapshot reads besides the file, taken under one lock.
#[derive(Debug, Default)]
struct Visible {
    /// The number of the last commit group acknowledged: the version a snapshot taken now
    /// reads at.
    seq: u64,
    /// The writes of the commit groups acknowledged but not yet applied to the file, in
    /// commit order. A snapshot reads the file through them, so an acknowledged commit is
    /// visible at once.
    writes: Vec<Arc<StagedWrites>>,
    /// Key and value bytes `writes` holds.
    bytes: usize,
    /// Of those, the bytes of the groups the applier has not started on: what waits behind
    /// the apply under way.
    queued: usize,
}

/// The writes acknowledged but not yet in the file, shared by the writer (which adds them),
/// the applier (which takes them away once applied) and snapshots (which read through them).
#[derive(Debug, Default)]
struct Shared {
    visible: Mutex<Visible>,
    /// Signalled when the applier takes groups from its queue, or stops.
    taken: Condvar,
}

impl Shared {
    fn visible(&self) -> std::sync::MutexGuard<'_, Visible> {
        lock(&self.visible)
    }
}

type Unapplied = Arc<Shared>;

/// The writes of the last commit groups, newest last, so that a commit staged against a
/// recent version is checked against what was written since instead of against the file:
/// a requirement on a key nothing wrote since its version still holds. Only small commits are
/// kept, within a bound; a commit whose version is older than what is kept is checked
/// against the file.
#[derive(Debug, Default)]
struct History {
    /// Each kept group: its number and its accepted commits' writes.
    groups: std::collections::VecDeque<(u64, Vec<Arc<StagedWrites>>)>,
    /// Key and value bytes the kept groups hold.
    bytes: usize,
    /// The number of the newest group not kept: a commit read at an earlier version is not
    /// checked here.
    floor: u64,
}

/// Most bytes of writes [`History`] keeps, and most one commit may have to be kept.
const HISTORY_BYTES: usize = 8 << 20;
const HISTORY_COMMIT_BYTES: usize = 256 << 10;
/// Most groups [`History`] keeps.
const HISTORY_GROUPS: usize = 1024;

impl History {
    fn new(seq: u64) -> Self {
        Self {
            floor: seq,
            ..Self::default()
        }
    }

    /// Records group `seq`'s accepted commits.
    fn push(&mut self, seq: u64, writes: &[Arc<StagedWrites>]) {
        if writes
            .iter()
            .any(|writes| writes.bytes() > HISTORY_COMMIT_BYTES)
        {
            self.groups.clear();
            self.bytes = 0;
            self.floor = seq;
            return;
        }
        self.bytes += writes.iter().map(|w| w.bytes()).sum::<usize>();
        self.groups.push_back((seq, writes.to_vec()));
        while self.bytes > HISTORY_BYTES || self.groups.len() > HISTORY_GROUPS {
            let Some((seq, dropped)) = self.groups.pop_front() else {
                break;
            };
            self.bytes -= dropped.iter().map(|w| w.bytes()).sum::<usize>();
            self.floor = seq;
        }
    }

    /// Whether `writes`, whose requirements hold at version `read_at`, still meet them after
    /// the groups since and `accepted` (the commits before it in the group being made), as
    /// far as the kept writes tell: `true` only when none of them wrote anything `writes`
    /// requires. `false` says the file must be read to know.
    fn cleared(&self, read_at: u64, accepted: &[Request], writes: &StagedWrites) -> bool {
        if read_at < self.floor {
            return false;
        }
        let since = self
            .groups
            .iter()
            .filter(|(seq, _)| *seq > read_at)
            .flat_map(|(_, group)| group.iter().map(Arc::as_ref));
        let mut written = since.chain(accepted.iter().map(|r| r.writes.as_ref()));
        !written.any(|earlier| earlier.disturbs(writes))
    }
}

/// Most bytes of logged groups that may wait for the applier behind the apply under way:
/// past it the writer waits before it takes the next group, so that commits arriving faster
/// than the file takes them hold back their writers instead of the server's memory.
const MAX_QUEUED_BYTES: usize = 64 << 20;
/// A checkpoint that is due waits for the applier when no more than this many bytes are
/// still to be applied (a few small groups: a wait of milliseconds); with more (a large
/// transaction's apply under way) it is put off, so that commits are not held up behind
/// the apply, and tried again after every group and every [`DEFERRED_CHECKPOINT_POLL`].
const CHECKPOINT_BACKLOG_BYTES: usize = 4 << 20;
const DEFERRED_CHECKPOINT_POLL: Duration = Duration::from_millis(10);

/// The writer thread's state.
struct Writer {
    db: Arc<Database>,
    log: Log,
    /// The sequence number of the last commit group logged.
    seq: u64,
    /// When the first commit not yet covered by a checkpoint was logged.
    dirty_since: Option<Instant>,
    checkpoint_every: Duration,
    failed: Arc<AtomicBool>,
    unapplied: Unapplied,
    history: History,
    applier: ApplierThread,
}

impl Committer {
    fn start(
        db: Arc<Database>,
        log: Log,
        applied: u64,
        checkpoint_every: Duration,
    ) -> Result<Self, KvError> {
        let (queue, requests) = mpsc::channel::<Request>();
        let failed = Arc::new(AtomicBool::new(false));
        let unapplied = Unapplied::default();
        unapplied.visible().seq = applied;
        let mut writer = Writer::start(
            db,
            log,
            applied,
            checkpoint_every,
            Arc::clone(&failed),
            Arc::clone(&unapplied),
        )?;
        let thread = std::thread::Builder::new()
            .name("moraine-redb-writer".into())
            .spawn(move || writer.run(&requests))
            .map_err(|err| thread_failed("writer", &err))?;
        Ok(Self {
            queue: Mutex::new(Some(queue)),
            thread: Mutex::new(Some(thread)),
            failed,
            unapplied,
        })
    }

    async fn commit(&self, writes: Arc<StagedWrites>) -> Result<CommitOutcome, KvError> {
        if self.failed.load(Ordering::Acquire) {
            return Err(stopped());
        }
        let (reply, answer) = tokio::sync::oneshot::channel();
        let sent = lock(&self.queue)
            .as_ref()
            .is_some_and(|queue| queue.send(Request { writes, reply }).is_ok());
        if !sent {
            return Err(closing());
        }
        // The writer answers every request it takes; a dropped answer means it died.
        answer.await.unwrap_or_else(|_| {
            Ok(CommitOutcome::Unknown {
                reason: "the writer thread stopped while committing".into(),
            })
        })
    }
}

impl Drop for Committer {
    fn drop(&mut self) {
        drop(lock(&self.queue).take());
        if let Some(thread) = lock(&self.thread).take() {
            let _ = thread.join();
        }
    }
}

impl Writer {
    /// The writer's state, with its applier thread started.
    fn start(
        db: Arc<Database>,
        log: Log,
        seq: u64,
        checkpoint_every: Duration,
        failed: Arc<AtomicBool>,
        unapplied: Unapplied,
    ) -> Result<Self, KvError> {
        let applier = ApplierThread::start(Applier {
            db: Arc::clone(&db),
            failed: Arc::clone(&failed),
            unapplied: Arc::clone(&unapplied),
        })?;
        Ok(Self {
            db,
            log,
            seq,
            dirty_since: None,
            checkpoint_every,
            failed,
            unapplied,
            history: History::new(seq),
            applier,
        })
    }

    fn run(&mut self, requests: &mpsc::Receiver<Request>) {
        loop {
            let next = match self.dirty_since {
                // Due and put off behind a large apply: looked at again shortly.
                Some(_) if self.checkpoint_due() => requests.recv_timeout(DEFERRED_CHECKPOINT_POLL),
                Some(since) => {
                    let left = self.checkpoint_every.saturating_sub(since.elapsed());
                    requests.recv_timeout(left)
                }
                None => requests
                    .recv()
                    .map_err(|_| mpsc::RecvTimeoutError::Disconnected),
            };
            match next {
                Ok(first) => {
                    let mut bytes = first.bytes();
                    let mut group = vec![first];
                    while group.len() < MAX_GROUP && bytes < MAX_GROUP_BYTES {
                        let Ok(next) = requests.try_recv() else { break };
                        bytes += next.bytes();
                        group.push(next);
                    }
                    self.commit_group(group);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => self.checkpoint(false),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    self.checkpoint(true);
                    return;
                }
            }
        }
    }

    /// Whether a checkpoint is due: the first commit it would cover was logged
    /// `checkpoint_every` ago, or the log has grown large.
    fn checkpoint_due(&self) -> bool {
        self.dirty_since.is_some_and(|since| {
            since.elapsed() >= self.checkpoint_every || self.log.len() >= CHECKPOINT_LOG_BYTES
        })
    }

    /// Makes everything logged so far durable in the redb file, and empties the log. The
    /// applier first applies what it has not yet; when that is more than
    /// [`CHECKPOINT_BACKLOG_BYTES`] and `wait` is false, the checkpoint is put off instead.
    fn checkpoint(&mut self, wait: bool) {
        if self.dirty_since.is_none() || self.failed.load(Ordering::Acquire) {
            return;
        }
        if !wait && self.unapplied.visible().bytes > CHECKPOINT_BACKLOG_BYTES {
            return;
        }
        // The writer logs nothing while it waits: once the applier answers, the file holds
        // every group the log does, durably.
        match self.applier.checkpoint() {
            Ok(()) => {
                self.dirty_since = None;
                if let Err(err) = self.log.reset() {
                    // The log's records are redundant now; they are skipped on replay.
                    tracing::warn!(%err, "the commit log could not be emptied after a checkpoint");
                }
            }
            Err(err) => tracing::warn!(%err, "checkpoint failed; the commit log keeps the commits"),
        }
    }

    /// Waits while more than [`MAX_QUEUED_BYTES`] of logged groups wait for the applier.
    fn wait_for_room(&self) {
        let mut visible = self.unapplied.visible();
        while visible.queued > MAX_QUEUED_BYTES && !self.failed.load(Ordering::Acquire) {
            visible = self
                .unapplied
                .taken
                .wait(visible)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Commits a group: each request checked in turn against the store as the groups
    /// acknowledged before it and the requests accepted before it in this group leave it,
    /// the accepted ones logged durably in one record, made visible to readers and
    /// acknowledged; then their writes are handed to the applier thread, which puts them
    /// in the file while the writer goes on with the next group. Readers, and the checks of
    /// later groups, see them through [`Committer::unapplied`] until they are in the file, so
    /// neither redb's B-tree work nor a large transaction's apply is on any commit's
    /// latency.
    fn commit_group(&mut self, group: Vec<Request>) {
        if self.failed.load(Ordering::Acquire) {
            for request in group {
                request.answer(Err(stopped()));
            }
            return;
        }
        self.wait_for_room();
        let seq = self.seq + 1;
        // Opened once a request needs the file, and then for the rest of the group.
        let mut committed: Option<Committed> = None;
        let mut accepted: Vec<Request> = Vec::new();
        let mut requests = group.into_iter();
        while let Some(mut request) = requests.next() {
            // A request left unsealed ([`KvBackend::orders_writes`]) is sealed beside the log
            // write when it is the group's last; one that later requests are checked against
            // is sealed now, so that their checks read it in order.
            for earlier in &mut accepted {
                StagedWrites::seal_shared(&mut earlier.writes);
            }
            // Staged against a version whose requirements nothing since has disturbed:
            // they hold, and the file need not be read for them.
            let cleared = request.writes.read_version().is_some_and(|read_at| {
                read_at <= self.seq && self.history.cleared(read_at, &accepted, &request.writes)
            });
            let unmet = if cleared {
                Ok(None)
            } else {
                StagedWrites::seal_shared(&mut request.writes);
                let view = match committed.take() {
                    Some(view) => Ok(view),
                    None => Committed::open(&self.db, &self.unapplied),
                };
                view.and_then(|view| {
                    let unmet = view.unmet(&accepted, &request.writes);
                    committed = Some(view);
                    unmet
                })
            };
            match unmet {
                Ok(None) => accepted.push(request),
                Ok(Some(conflict)) => request.answer(Ok(CommitOutcome::Conflict(conflict))),
                Err(err) => {
                    // Nothing of the group is written.
                    for request in accepted.into_iter().chain([request]).chain(requests) {
                        request.answer(Err(err.clone()));
                    }
                    return;
                }
            }
        }
        drop(committed);
        if accepted.is_empty() {
            return;
        }
        // Durable first: from here on the group will be in the store after any crash.
        if let Err(err) = log_and_seal(&mut self.log, seq, &mut accepted) {
            self.stop(accepted, &format!("writing the commit log failed: {err}"));
            return;
        }
        self.seq = seq;
        let writes: Vec<Arc<StagedWrites>> =
            accepted.iter().map(|r| Arc::clone(&r.writes)).collect();
        self.history.push(seq, &writes);
        let bytes = writes.iter().map(|w| w.bytes()).sum::<usize>();
        {
            let mut visible = self.unapplied.visible();
            visible.writes.extend(writes.iter().cloned());
            visible.bytes += bytes;
            visible.queued += bytes;
            visible.seq = seq;
        }
        for request in accepted {
            request.answer(Ok(CommitOutcome::Committed));
        }
        self.dirty_since.get_or_insert_with(Instant::now);
        if !self.applier.send(Job::Apply { seq, writes, bytes }) {
            // Acknowledged and logged: readers keep seeing the group, and the next open
            // applies it from the log.
            self.stop(Vec::new(), "the applier thread stopped");
            return;
        }
        if self.checkpoint_due() {
            self.checkpoint(false);
        }
    }

    /// After a failure past the log write: the group's outcome is unknown (the log may hold
    /// it; opening the store again applies it), and nothing more is committed.
    fn stop(&self, group: Vec<Request>, reason: &str) {
        tracing::error!(
            reason,
            "the embedded store stops committing; restart the server"
        );
        self.failed.store(true, Ordering::Release);
        for request in group {
            request.answer(Ok(CommitOutcome::Unknown {
                reason: reason.to_owned(),
            }));
        }
    }
}

/// Appends the group `accepted` to `log` as record `seq`, and seals its writes. Writes left
/// unsealed ([`KvBackend::orders_writes`]: a large transaction's) are put in key order on a
/// thread of their own while the log is written, as neither changes them and the log takes
/// them in any order: the two took about as long for a bulk load, one after the other.
fn log_and_seal(log: &mut Log, seq: u64, accepted: &mut [Request]) -> std::io::Result<()> {
    let requests: &[Request] = accepted;
    let unsealed = requests.iter().any(|r| !r.writes.is_sealed());
    let (appended, orders) = std::thread::scope(|scope| {
        let sealing = unsealed.then(|| {
            std::thread::Builder::new()
                .name("moraine-seal".into())
                .spawn_scoped(scope, || {
                    requests
                        .iter()
                        .map(|r| r.writes.order_to_seal())
                        .collect::<Vec<_>>()
                })
        });
        let appended = log.append(seq, &requests.iter().map(|r| r.writes.as_ref()));
        let orders = match sealing {
            Some(Ok(thread)) => thread.join().ok(),
            Some(Err(err)) => {
                tracing::debug!(%err, "no thread for the seal beside the log write");
                None
            }
            None => None,
        };
        (appended, orders)
    });
    appended?;
    // Sealed here what the thread did not (it could not start, or failed).
    let mut orders = orders.unwrap_or_default().into_iter();
    for request in accepted {
        match orders.next().flatten() {
            Some(order) => Arc::make_mut(&mut request.writes).seal_with(order),
            None => StagedWrites::seal_shared(&mut request.writes),
        }
    }
    Ok(())
}

/// The store as a group's requirements are checked against it: the file as a read
/// transaction sees it, and the writes acknowledged but not yet applied to the file when
/// that transaction began (some of which the applier may have put in the file meanwhile:
/// they are then read twice, which is harmless, never not at all).
struct Committed {
    table: ReadOnlyTable<&'static [u8], &'static [u8]>,
    unapplied: Vec<Arc<StagedWrites>>,
}

impl Committed {
    fn open(db: &Database, unapplied: &Shared) -> Result<Self, KvError> {
        let (txn, writes) = {
            let visible = unapplied.visible();
            (db.begin_read().map_err(failed)?, visible.writes.clone())
        };
        Ok(Self {
            table: txn.open_table(DATA).map_err(failed)?,
            unapplied: writes,
        })
    }

    /// The first requirement of `writes` that the store, as the `accepted` requests before
    /// it in the group leave it, does not meet.
    fn unmet(
        &self,
        accepted: &[Request],
        writes: &StagedWrites,
    ) -> Result<Option<super::Conflict>, KvError> {
        // Every layer of writes over the file, oldest first.
        let layers = || {
            self.unapplied
                .iter()
                .map(Arc::as_ref)
                .chain(accepted.iter().map(|r| r.writes.as_ref()))
        };
        writes.first_unmet(
            |key| {
                if let Some(written) = layers().rev().find_map(|layer| layer.read(key)) {
                    return Ok(written.map(<[u8]>::to_vec));
                }
                Ok(self
                    .table
                    .get(key)
                    .map_err(failed)?
                    .map(|value| value.value().to_vec()))
            },
            |range, pair| {
                let stored = self
                    .table
                    .range::<&[u8]>(range.start.as_slice()..range.end.as_slice())
                    .map_err(failed)?;
                let touched = layers().any(|layer| layer.written_in(range).next().is_some());
                if !touched {
                    for entry in stored {
                        let (key, value) = entry.map_err(failed)?;
                        pair(key.value(), value.value());
                    }
                    return Ok(());
                }
                // Writes not in the file went into the range: it is the file's pairs with
                // theirs laid over, in order.
                let mut merged = std::collections::BTreeMap::new();
                for entry in stored {
                    let (key, value) = entry.map_err(failed)?;
                    merged.insert(key.value().to_vec(), value.value().to_vec());
                }
                for layer in layers() {
                    for (key, value) in layer.written_in(range) {
                        match value {
                            Some(value) => merged.insert(key.to_vec(), value.to_vec()),
                            None => merged.remove(key.as_ref()),
                        };
                    }
                }
                for (key, value) in &merged {
                    pair(key, value);
                }
                Ok(())
            },
        )
    }
}

/// What the writer hands the applier, in the order it logged them.
enum Job {
    /// A logged group's writes (`bytes` of keys and values), to put in the file.
    Apply {
        seq: u64,
        writes: Vec<Arc<StagedWrites>>,
        bytes: usize,
    },
    /// Make everything applied so far durable, and answer whether that worked.
    Checkpoint(mpsc::SyncSender<Result<(), String>>),
}

/// The applier thread's state: it puts logged groups in the redb file, in order, one write
/// transaction for all the groups waiting when it starts one, and makes them durable when
/// the writer checkpoints. It is the only writer of the file.
struct Applier {
    db: Arc<Database>,
    failed: Arc<AtomicBool>,
    unapplied: Unapplied,
}

impl Applier {
    fn run(&self, jobs: &mpsc::Receiver<Job>) {
        // Whatever ends the thread, the writer must not wait for room that never comes.
        let _stopped = Stopped(self);
        let mut next = None;
        loop {
            let Some(job) = next.take().or_else(|| jobs.recv().ok()) else {
                return;
            };
            match job {
                Job::Checkpoint(done) => {
                    let outcome = if self.failed.load(Ordering::Acquire) {
                        Err(stopped().to_string())
                    } else {
                        // An empty durable commit makes what was applied durable; the second
                        // settles the first's epilogue.
                        settle(&self.db)
                            .and_then(|()| settle(&self.db))
                            .map_err(|err| err.to_string())
                    };
                    let _ = done.send(outcome);
                }
                Job::Apply { seq, writes, bytes } => {
                    let (mut last, mut batch, mut taken) = (seq, writes, bytes);
                    // The groups queued behind this one go into the same transaction.
                    loop {
                        match jobs.try_recv() {
                            Ok(Job::Apply { seq, writes, bytes }) => {
                                last = seq;
                                batch.extend(writes);
                                taken += bytes;
                            }
                            Ok(other) => {
                                next = Some(other);
                                break;
                            }
                            Err(_) => break,
                        }
                    }
                    {
                        let mut visible = self.unapplied.visible();
                        visible.queued = visible.queued.saturating_sub(taken);
                    }
                    self.unapplied.taken.notify_all();
                    // After a failure nothing more is applied: readers keep seeing the groups
                    // through `unapplied`, and the next open applies them from the log.
                    if self.failed.load(Ordering::Acquire) {
                        continue;
                    }
                    if let Err(err) = apply(&self.db, last, &batch) {
                        tracing::error!(
                            %err,
                            "applying a logged commit failed; the embedded store stops committing; restart the server"
                        );
                        self.failed.store(true, Ordering::Release);
                        self.unapplied.taken.notify_all();
                        continue;
                    }
                    let mut visible = self.unapplied.visible();
                    let applied = batch.len().min(visible.writes.len());
                    visible.writes.drain(..applied);
                    visible.bytes = visible.bytes.saturating_sub(taken);
                }
            }
        }
    }
}

/// Marks the store failed if the applier thread ends by a panic, and wakes a writer
/// waiting for room.
struct Stopped<'a>(&'a Applier);

impl Drop for Stopped<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.0.failed.store(true, Ordering::Release);
        }
        self.0.unapplied.taken.notify_all();
    }
}

/// The applier thread and its queue. Dropping it closes the queue and waits for the
/// thread, which applies what it was handed first.
struct ApplierThread {
    jobs: Option<mpsc::Sender<Job>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ApplierThread {
    fn start(applier: Applier) -> Result<Self, KvError> {
        let (jobs, queue) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("moraine-redb-applier".into())
            .spawn(move || applier.run(&queue))
            .map_err(|err| thread_failed("applier", &err))?;
        Ok(Self {
            jobs: Some(jobs),
            thread: Some(thread),
        })
    }

    /// Hands the applier a job; `false` if it has stopped.
    fn send(&self, job: Job) -> bool {
        self.jobs
            .as_ref()
            .is_some_and(|jobs| jobs.send(job).is_ok())
    }

    /// Waits for the applier to apply every group handed to it and make them durable.
    fn checkpoint(&self) -> Result<(), String> {
        let (done, outcome) = mpsc::sync_channel(1);
        if !self.send(Job::Checkpoint(done)) {
            return Err("the applier thread stopped".into());
        }
        outcome
            .recv()
            .unwrap_or_else(|_| Err("the applier thread stopped".into()))
    }
}

impl Drop for ApplierThread {
    fn drop(&mut self) {
        drop(self.jobs.take());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// Applies logged groups' writes, in order, and commits them with the last group's sequence
/// number, not durably: a checkpoint makes them durable later (the log holds them until
/// then).
fn apply(db: &Database, seq: u64, writes: &[Arc<StagedWrites>]) -> Result<(), redb::Error> {
    let mut txn = db.begin_write()?;
    {
        let mut changes = Derived::recorded(&txn)?;
        let mut table = txn.open_table(DATA)?;
        for writes in writes {
            let pairs = writes.written((Bound::Unbounded, Bound::Unbounded));
            if writes.len() >= CURSOR_APPLY_PAIRS {
                put_in_order(&mut table, &mut changes, pairs)?;
            } else {
                for (key, value) in pairs {
                    put(&mut table, &mut changes, key, value)?;
                }
            }
        }
        drop(table);
        changes.apply(&txn, seq)?;
        txn.open_table(META)?.insert(APPLIED, seq)?;
    }
    txn.set_durability(Durability::None)?;
    txn.commit()?;
    Ok(())
}

/// Commits with at least this many writes are applied through a cursor
/// ([`put_in_order`]); smaller ones one key at a time, which costs less than opening a cursor
/// for a few keys.
const CURSOR_APPLY_PAIRS: usize = 256;

/// New keys a cursor must take into one gap for the cursor to be worth its seek and splice;
/// after a shorter run, or at a key the table holds, the next [`SINGLE_PAIRS`] keys are
/// written one at a time.
const MIN_RUN: usize = 4;
const SINGLE_PAIRS: usize = 64;

/// Writes `pairs`, in strictly ascending key order. A run of new keys that fall into one gap
/// of the table (a new table's rows, the rows added at the end of a table, the new ids at the
/// end of an index) goes in through a cursor, which redb buffers and splices in as full
/// leaves, one update of the parent pages per megabyte, where [`put`] descends the tree for
/// every key and splits leaves as it goes. Keys the table holds (replaced or removed) and
/// new keys scattered one to a gap go one at a time: through a cursor each would cost a
/// splice, and replacing a run of stored keys that way leaves half-empty leaves behind.
fn put_in_order<'a>(
    data: &mut redb::Table<&'static [u8], &'static [u8]>,
    changes: &mut Derived,
    pairs: impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)>,
) -> Result<(), redb::Error> {
    use std::borrow::Cow;
    use std::cmp::Ordering::{Equal, Greater, Less};
    let mut pairs = pairs.peekable();
    let mut single = 0;
    while let Some(&(first, value)) = pairs.peek() {
        if single > 0 {
            pairs.next();
            put(data, changes, first, value)?;
            single -= 1;
            continue;
        }
        let mut at = data.lower_bound_mut(Bound::Included(first))?;
        let (mut run, mut stored) = (0, false);
        // The key before the gap, for the twin marks: the stored one, then each key the run
        // puts in. Every key of a run lies between it and the stored key after the gap.
        let mut before: Option<Cow<'a, [u8]>> = if changes.marks.watches(first) {
            at.peek_prev()?
                .map(|(key, _)| Cow::Owned(key.value().to_vec()))
        } else {
            None
        };
        // The stored key after the gap: the keys the run puts in go before it, so it stays
        // the same for the whole run, and is read once (a cursor's peek seeks from the root).
        let after: Option<Vec<u8>> = at.peek_next()?.map(|(next, _)| next.value().to_vec());
        while let Some(&(key, value)) = pairs.peek() {
            // The gap must lie right before `key`, and `key` must be new.
            let order = after.as_deref().map(|after| after.cmp(key));
            if value.is_some() && matches!(order, Some(Greater) | None) {
                changes
                    .marks
                    .new_key(key, before.as_deref(), after.as_deref());
            }
            match order {
                Some(Less) => break,
                Some(Equal) => {
                    stored = true;
                    break;
                }
                Some(Greater) | None => {}
            }
            pairs.next();
            // A delete of a key the table lacks changes nothing.
            if let Some(value) = value {
                at.insert_before(key, value)?;
                changes.tallies.record(key, None, Some(value.len()));
                before = Some(Cow::Borrowed(key));
                run += 1;
            }
        }
        at.close()?;
        if stored || run < MIN_RUN {
            single = SINGLE_PAIRS;
        }
    }
    Ok(())
}

fn thread_failed(name: &str, err: &std::io::Error) -> KvError {
    KvError::Backend {
        backend: NAME,
        reason: format!("cannot start the {name} thread: {err}"),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

struct RedbSnapshot {
    table: Arc<ReadOnlyTable<&'static [u8], &'static [u8]>>,
    /// The read transaction `table` was opened in, for the tallies at the same state.
    txn: Arc<redb::ReadTransaction>,
}

/// A snapshot of the store (the file and the writes not yet in it) and the version it reads
/// at: the number of the last commit group it sees.
struct AtVersion {
    inner: Arc<dyn KvSnapshot>,
    version: u64,
}

#[async_trait]
impl KvSnapshot for AtVersion {
    fn version(&self) -> Option<u64> {
        Some(self.version)
    }

    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        self.inner.get(key).await
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        self.inner.batch_get(keys).await
    }

    async fn scan_page(&self, range: &KeyRange, page: PageSize) -> Result<Page, KvError> {
        self.inner.scan_page(range, page).await
    }

    async fn scan_pages(&self, ranges: &[KeyRange], page: PageSize) -> Result<Vec<Page>, KvError> {
        self.inner.scan_pages(ranges, page).await
    }

    async fn divide(&self, range: &KeyRange, division: Division) -> Result<Divided, KvError> {
        self.inner.divide(range, division).await
    }

    async fn twins(&self, range: &KeyRange) -> Result<Option<Vec<Vec<u8>>>, KvError> {
        self.inner.twins(range).await
    }
}

fn page_of(
    table: &ReadOnlyTable<&'static [u8], &'static [u8]>,
    range: &KeyRange,
    page: PageSize,
) -> Result<Page, KvError> {
    if range.is_empty() {
        return Ok(Page::exhausted_empty());
    }
    let items = table
        .range::<&[u8]>(range.start.as_slice()..range.end.as_slice())
        .map_err(failed)?
        .map(|item| item.map_err(failed));
    fill_page(items, page.at_least_one(), |out, (key, value)| {
        out.push(key.value(), value.value());
    })
}

#[async_trait]
impl KvSnapshot for RedbSnapshot {
    async fn get(&self, key: &[u8]) -> Result<Option<Vec<u8>>, KvError> {
        let table = Arc::clone(&self.table);
        let key = key.to_vec();
        small(1, move || {
            Ok(table
                .get(key.as_slice())
                .map_err(failed)?
                .map(|value| value.value().to_vec()))
        })
        .await
    }

    async fn batch_get(&self, keys: &[Vec<u8>]) -> Result<Vec<Option<Vec<u8>>>, KvError> {
        let table = Arc::clone(&self.table);
        let keys = keys.to_vec();
        small(keys.len(), move || {
            keys.iter()
                .map(|key| {
                    Ok(table
                        .get(key.as_slice())
                        .map_err(failed)?
                        .map(|value| value.value().to_vec()))
                })
                .collect()
        })
        .await
    }

    async fn scan_page(&self, range: &KeyRange, page: PageSize) -> Result<Page, KvError> {
        let table = Arc::clone(&self.table);
        let range = range.clone();
        small(page.rows, move || page_of(&table, &range, page)).await
    }

    async fn scan_pages(&self, ranges: &[KeyRange], page: PageSize) -> Result<Vec<Page>, KvError> {
        let table = Arc::clone(&self.table);
        let ranges = ranges.to_vec();
        small(ranges.len().saturating_mul(page.rows), move || {
            ranges
                .iter()
                .map(|range| page_of(&table, range, page))
                .collect()
        })
        .await
    }

    /// From the marks, where the file's rule covers `range`: one short range read.
    async fn twins(&self, range: &KeyRange) -> Result<Option<Vec<Vec<u8>>>, KvError> {
        let txn = Arc::clone(&self.txn);
        let range = range.clone();
        small(1, move || {
            let rule =
                Twins::recorded(&txn.open_table(twins::RULE).map_err(failed)?).map_err(failed)?;
            match rule {
                Some(rule) if rule.covers(&range) => {
                    let marks = txn.open_table(twins::TWINS).map_err(failed)?;
                    twins::marked(&marks, &rule, &range)
                        .map(Some)
                        .map_err(failed)
                }
                _ => Ok(None),
            }
        })
        .await
    }

    /// From the tallies where they cover `range` (one read per unit), else by a walk.
    async fn divide(&self, range: &KeyRange, division: Division) -> Result<Divided, KvError> {
        let table = Arc::clone(&self.table);
        let txn = Arc::clone(&self.txn);
        let range = range.clone();
        blocking(move || {
            let rule =
                Tally::recorded(&txn.open_table(tally::RULE).map_err(failed)?).map_err(failed)?;
            if rule.is_some_and(|rule| rule.covers(&range)) {
                let tallies = txn.open_table(tally::TALLIES).map_err(failed)?;
                return tally::divide(&tallies, &range, division).map_err(failed);
            }
            divide_of(&table, &range, division)
        })
        .await
    }
}

/// Walks `range` reading only the lengths of its keys and values: redb hands out views of
/// its pages, so nothing is copied but the few keys kept as cuts.
fn divide_of(
    table: &ReadOnlyTable<&'static [u8], &'static [u8]>,
    range: &KeyRange,
    division: Division,
) -> Result<Divided, KvError> {
    let mut divider = Divider::new(division);
    for item in table
        .range::<&[u8]>(range.start.as_slice()..range.end.as_slice())
        .map_err(failed)?
    {
        let (key, value) = item.map_err(failed)?;
        let key = key.value();
        divider.add(key, key.len() + value.value().len());
    }
    Ok(divider.finish())
}

/// Most pairs a read may reach to run in place on the calling task: a few B-tree descents
/// and a page of small pairs, from redb's cache or the OS's, take microseconds, less than
/// handing them to the blocking pool and back. Larger reads run on the blocking pool, so that
/// no runtime worker is held up by a long one.
const IN_PLACE_PAIRS: usize = 256;

/// Runs a read that reaches at most `pairs` pairs: in place when that is few
/// ([`IN_PLACE_PAIRS`]), else on the blocking pool.
async fn small<T: Send + 'static>(
    pairs: usize,
    work: impl FnOnce() -> Result<T, KvError> + Send + 'static,
) -> Result<T, KvError> {
    if pairs <= IN_PLACE_PAIRS {
        work()
    } else {
        blocking(work).await
    }
}

async fn blocking<T: Send + 'static>(
    work: impl FnOnce() -> Result<T, KvError> + Send + 'static,
) -> Result<T, KvError> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|err| KvError::Backend {
            backend: NAME,
            reason: format!("blocking task failed: {err}"),
        })?
}

fn failed(err: impl Into<redb::Error>) -> KvError {
    KvError::Backend {
        backend: NAME,
        reason: err.into().to_string(),
    }
}

fn stopped() -> KvError {
    KvError::Unavailable {
        backend: NAME,
        reason: "the store stopped committing after a failure of its commit log or file; restart the server"
            .into(),
    }
}

fn closing() -> KvError {
    KvError::Unavailable {
        backend: NAME,
        reason: "the store is closing".into(),
    }
}

fn unavailable(path: &Path, err: &dyn std::fmt::Display) -> KvError {
    KvError::Unavailable {
        backend: NAME,
        reason: format!("{}: {err}", path.display()),
    }
}

#[cfg(test)]
mod tests;
