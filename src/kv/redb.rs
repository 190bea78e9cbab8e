//! The embedded backend: one redb file, durable on commit.
//!
//! All data lives in one `&[u8] -> &[u8]` table, ordered by raw key bytes, which is the
//! memcomparable order the keyspace is built for. redb is blocking: every call runs on tokio's
//! blocking pool, never on the async runtime's workers. redb serializes write transactions,
//! so a commit checks its requirements against the latest state inside its own transaction.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use redb::{
    Database, Durability, ReadOnlyTable, ReadableDatabase as _, ReadableTable as _, TableDefinition,
};

use super::memory::{fill_page, first_unmet};
use super::{
    CommitOutcome, KeyRange, KvBackend, KvError, KvPair, KvSnapshot, PageSize, PreparedWrite,
    ScanPage,
};

const DATA: TableDefinition<&[u8], &[u8]> = TableDefinition::new("moraine_kv");

/// File name of the store inside its data directory.
pub const FILE_NAME: &str = "moraine.redb";

const NAME: &str = "redb";

/// The redb backend.
#[derive(Debug, Clone)]
pub struct RedbBackend {
    db: Arc<Database>,
    path: PathBuf,
}

impl RedbBackend {
    /// Opens the store in directory `dir`, creating the directory and the file if missing.
    ///
    /// # Errors
    /// [`KvError::Unavailable`] when the directory or file cannot be created or opened (for
    /// example because another process holds it).
    pub async fn open(dir: &Path) -> Result<Self, KvError> {
        let dir = dir.to_owned();
        blocking(move || {
            std::fs::create_dir_all(&dir).map_err(|err| unavailable(&dir, &err))?;
            let path = dir.join(FILE_NAME);
            let db = Database::create(&path).map_err(|err| unavailable(&path, &err))?;
            let txn = db.begin_write().map_err(failed)?;
            txn.open_table(DATA).map_err(failed)?;
            txn.commit().map_err(failed)?;
            Ok(Self {
                db: Arc::new(db),
                path,
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

    async fn commit(&self, writes: Vec<PreparedWrite>) -> Result<CommitOutcome, KvError> {
        let db = Arc::clone(&self.db);
        blocking(move || {
            let mut txn = db.begin_write().map_err(failed)?;
            txn.set_durability(Durability::Immediate).map_err(failed)?;
            {
                let mut table = txn.open_table(DATA).map_err(failed)?;
                let mut lookup_error = None;
                let unmet = first_unmet(&writes, |key| match table.get(key) {
                    Ok(value) => value.is_some(),
                    Err(err) => {
                        lookup_error.get_or_insert(err);
                        false
                    }
                });
                if let Some(err) = lookup_error {
                    return Err(failed(err));
                }
                if let Some(conflict) = unmet {
                    // Dropping the transaction aborts it: nothing is written.
                    return Ok(CommitOutcome::Conflict(conflict));
                }
                for write in &writes {
                    match &write.write {
                        Some(Some(value)) => {
                            table
                                .insert(write.key.as_slice(), value.as_slice())
                                .map_err(failed)?;
                        }
                        Some(None) => {
                            table.remove(write.key.as_slice()).map_err(failed)?;
                        }
                        None => {}
                    }
                }
            }
            // Past this point redb may have written part of the commit: a failure leaves the
            // outcome to whatever the file holds on the next open.
            Ok(match txn.commit() {
                Ok(()) => CommitOutcome::Committed,
                Err(err) => CommitOutcome::Unknown {
                    reason: err.to_string(),
                },
            })
        })
        .await
    }
}

struct RedbSnapshot {
    table: Arc<ReadOnlyTable<&'static [u8], &'static [u8]>>,
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

    async fn scan_page(&self, range: &KeyRange, page: PageSize) -> Result<ScanPage, KvError> {
        let table = Arc::clone(&self.table);
        let range = range.clone();
        blocking(move || {
            let items = table
                .range::<&[u8]>(range.start.as_slice()..range.end.as_slice())
                .map_err(failed)?
                .map(|item| {
                    item.map(|(key, value)| KvPair {
                        key: key.value().to_vec(),
                        value: value.value().to_vec(),
                    })
                    .map_err(failed)
                });
            fill_page(items, page)
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

fn unavailable(path: &Path, err: &dyn std::fmt::Display) -> KvError {
    KvError::Unavailable {
        backend: NAME,
        reason: format!("{}: {err}", path.display()),
    }
}
