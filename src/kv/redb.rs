//! The embedded backend: one redb file, durable on commit.
//!
//! All data lives in one `&[u8] -> &[u8]` table, ordered by raw key bytes, which is the
//! memcomparable order the keyspace is built for. redb is blocking: reads run on tokio's
//! blocking pool, never on the async runtime's workers.
//!
//! Commits go through one writer thread, which groups the commits waiting for it into one redb
//! write transaction and one durable write (group commit). Each commit of a group is checked
//! against the state the commits before it in the group leave, so the outcome is the same as
//! committing them one after another: a commit whose requirement fails is a conflict and
//! writes nothing, the others land together.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, PoisonError};

use async_trait::async_trait;
use redb::{
    Database, Durability, ReadOnlyTable, ReadableDatabase as _, ReadableTable as _, Table,
    TableDefinition,
};

use super::memory::first_unmet;
use super::page::fill_page;
use super::{CommitOutcome, KeyRange, KvBackend, KvError, KvSnapshot, Page, PageSize, StagedWrites};

const DATA: TableDefinition<&[u8], &[u8]> = TableDefinition::new("moraine_kv");

/// File name of the store inside its data directory.
pub const FILE_NAME: &str = "moraine.redb";

const NAME: &str = "redb";

/// Most commits one group holds.
const MAX_GROUP: usize = 256;
/// A group takes no more commits once it holds this many bytes.
const MAX_GROUP_BYTES: usize = 64 << 20;

/// Settings of the embedded store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RedbOptions {
    /// Memory redb may use to cache pages and buffer writes.
    pub cache_bytes: usize,
}

impl Default for RedbOptions {
    fn default() -> Self {
        Self {
            cache_bytes: 64 << 20,
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

    /// Opens the store in directory `dir` with `options`.
    ///
    /// # Errors
    /// As [`open`](Self::open).
    pub async fn open_with(dir: &Path, options: RedbOptions) -> Result<Self, KvError> {
        let dir = dir.to_owned();
        blocking(move || {
            std::fs::create_dir_all(&dir).map_err(|err| unavailable(&dir, &err))?;
            let path = dir.join(FILE_NAME);
            let db = Database::builder()
                .set_cache_size(options.cache_bytes)
                .create(&path)
                .map_err(|err| unavailable(&path, &err))?;
            let txn = db.begin_write().map_err(failed)?;
            txn.open_table(DATA).map_err(failed)?;
            txn.commit().map_err(failed)?;
            let db = Arc::new(db);
            let committer = Arc::new(Committer::start(Arc::clone(&db))?);
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

#[async_trait]
impl KvBackend for RedbBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    async fn snapshot(&self) -> Result<Arc<dyn KvSnapshot>, KvError> {
        let db = Arc::clone(&self.db);
        blocking(move || {
            let txn = db.begin_read().map_err(failed)?;
            let table = txn.open_table(DATA).map_err(failed)?;
            Ok(Arc::new(RedbSnapshot {
                table: Arc::new(table),
            }) as Arc<dyn KvSnapshot>)
        })
        .await
    }

    async fn commit(&self, writes: Arc<StagedWrites>) -> Result<CommitOutcome, KvError> {
        self.committer.commit(writes).await
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
/// the thread, so that the file is released when the backend is.
#[derive(Debug)]
struct Committer {
    queue: Mutex<Option<mpsc::Sender<Request>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
}

impl Committer {
    fn start(db: Arc<Database>) -> Result<Self, KvError> {
        let (queue, requests) = mpsc::channel::<Request>();
        let thread = std::thread::Builder::new()
            .name("moraine-redb-writer".into())
            .spawn(move || {
                while let Ok(first) = requests.recv() {
                    let mut bytes = first.bytes();
                    let mut group = vec![first];
                    while group.len() < MAX_GROUP && bytes < MAX_GROUP_BYTES {
                        let Ok(next) = requests.try_recv() else { break };
                        bytes += next.bytes();
                        group.push(next);
                    }
                    commit_group(&db, group);
                }
            })
            .map_err(|err| KvError::Backend {
                backend: NAME,
                reason: format!("cannot start the writer thread: {err}"),
            })?;
        Ok(Self {
            queue: Mutex::new(Some(queue)),
            thread: Mutex::new(Some(thread)),
        })
    }

    async fn commit(&self, writes: Arc<StagedWrites>) -> Result<CommitOutcome, KvError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let sent = self
            .queue
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
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
        drop(
            self.queue
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take(),
        );
        if let Some(thread) = self
            .thread
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take()
        {
            let _ = thread.join();
        }
    }
}

/// Commits a group in one write transaction: each request checked and applied in turn, one
/// durable commit for all that applied.
fn commit_group(db: &Database, group: Vec<Request>) {
    let mut pending = group.into_iter();
    let mut applied: Vec<Request> = Vec::new();
    let failure = (|| -> Result<redb::WriteTransaction, KvError> {
        let mut txn = db.begin_write().map_err(failed)?;
        txn.set_durability(Durability::Immediate).map_err(failed)?;
        {
            let mut table = txn.open_table(DATA).map_err(failed)?;
            for request in pending.by_ref() {
                match apply(&mut table, &request.writes) {
                    Ok(None) => applied.push(request),
                    Ok(Some(conflict)) => request.answer(Ok(CommitOutcome::Conflict(conflict))),
                    Err(err) => {
                        request.answer(Err(err.clone()));
                        return Err(err);
                    }
                }
            }
        }
        Ok(txn)
    })();
    match failure {
        Err(err) => {
            // The transaction was dropped, which aborts it: nothing of the group was written.
            for request in applied.into_iter().chain(pending) {
                request.answer(Err(err.clone()));
            }
        }
        Ok(txn) => {
            // Past this point redb may have written part of the commit: a failure leaves the
            // outcome to whatever the file holds on the next open.
            let outcome = match txn.commit() {
                Ok(()) => CommitOutcome::Committed,
                Err(err) => CommitOutcome::Unknown {
                    reason: err.to_string(),
                },
            };
            for request in applied {
                request.answer(Ok(outcome.clone()));
            }
        }
    }
}

/// Checks one request's requirements against the table as the group left it, then applies
/// its writes. `Ok(Some(conflict))` wrote nothing.
fn apply(
    table: &mut Table<'_, &'static [u8], &'static [u8]>,
    writes: &StagedWrites,
) -> Result<Option<super::Conflict>, KvError> {
    let mut lookup_error = None;
    let unmet = first_unmet(writes, |key| match table.get(key) {
        Ok(value) => value.is_some(),
        Err(err) => {
            lookup_error.get_or_insert(err);
            false
        }
    });
    if let Some(err) = lookup_error {
        return Err(failed(err));
    }
    if unmet.is_some() {
        return Ok(unmet);
    }
    for (key, staged) in writes.iter() {
        match &staged.write {
            Some(Some(value)) => {
                table.insert(key.as_ref(), value.as_ref()).map_err(failed)?;
            }
            Some(None) => {
                table.remove(key.as_ref()).map_err(failed)?;
            }
            None => {}
        }
    }
    Ok(None)
}

struct RedbSnapshot {
    table: Arc<ReadOnlyTable<&'static [u8], &'static [u8]>>,
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
        blocking(move || {
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
        blocking(move || {
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
        blocking(move || page_of(&table, &range, page)).await
    }

    async fn scan_pages(&self, ranges: &[KeyRange], page: PageSize) -> Result<Vec<Page>, KvError> {
        let table = Arc::clone(&self.table);
        let ranges = ranges.to_vec();
        blocking(move || {
            ranges
                .iter()
                .map(|range| page_of(&table, range, page))
                .collect()
        })
        .await
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
