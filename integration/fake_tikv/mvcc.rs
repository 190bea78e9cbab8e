//! Percolator MVCC over raw keys, as one TiKV store applies it: a lock column, a write column
//! of commit records, and the values inside the records. No I/O, no regions: the store checks
//! those before it calls in here.

use std::collections::BTreeMap;
use std::ops::Bound;

use super::proto::kvrpcpb::{self, KeyError, LockInfo, Op};

/// A prewrite lock.
#[derive(Debug, Clone)]
pub struct Lock {
    pub start_ts: u64,
    pub primary: Vec<u8>,
    pub kind: LockKind,
    pub ttl: u64,
    pub txn_size: u64,
}

/// What committing a lock will write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LockKind {
    Put(Vec<u8>),
    Delete,
    /// Only locks the key (`Op::Lock`): readers pass it, writers conflict with it.
    Lock,
}

/// One record of the write column, keyed by its commit timestamp.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    pub start_ts: u64,
    pub kind: WriteKind,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteKind {
    Put(Vec<u8>),
    Delete,
    Lock,
    /// Written at the transaction's start timestamp, so that a late prewrite cannot succeed.
    Rollback,
}

/// The outcome of a transaction as `CheckTxnStatus` reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnStatus {
    Locked { ttl: u64, lock: LockInfo },
    Committed(u64),
    RolledBack(kvrpcpb::Action),
}

/// Milliseconds of wall time in a TSO timestamp.
pub fn physical(ts: u64) -> u64 {
    ts >> 18
}

#[derive(Debug, Default)]
pub struct Mvcc {
    locks: BTreeMap<Vec<u8>, Lock>,
    /// Per key: commit timestamp to record.
    writes: BTreeMap<Vec<u8>, BTreeMap<u64, Write>>,
}

impl Lock {
    pub fn info(&self, key: &[u8]) -> LockInfo {
        LockInfo {
            primary_lock: self.primary.clone(),
            lock_version: self.start_ts,
            key: key.to_vec(),
            lock_ttl: self.ttl,
            txn_size: self.txn_size,
            lock_type: match self.kind {
                LockKind::Put(_) => Op::Put,
                LockKind::Delete => Op::Del,
                LockKind::Lock => Op::Lock,
            } as i32,
            ..LockInfo::default()
        }
    }
}

fn locked(info: LockInfo) -> KeyError {
    KeyError {
        locked: Some(info),
        ..KeyError::default()
    }
}

fn abort(message: impl Into<String>) -> KeyError {
    KeyError {
        abort: message.into(),
        ..KeyError::default()
    }
}

impl Mvcc {
    /// The committed value of `key` at `ts`, or the lock that hides it.
    pub fn read(&self, key: &[u8], ts: u64) -> Result<Option<Vec<u8>>, LockInfo> {
        if let Some(lock) = self.locks.get(key)
            && lock.start_ts <= ts
            && lock.kind != LockKind::Lock
        {
            return Err(lock.info(key));
        }
        Ok(self.data_at(key, ts))
    }

    /// The newest Put or Delete committed at or before `ts`.
    fn data_at(&self, key: &[u8], ts: u64) -> Option<Vec<u8>> {
        let versions = self.writes.get(key)?;
        for write in versions.range(..=ts).rev().map(|(_, w)| w) {
            match &write.kind {
                WriteKind::Put(value) => return Some(value.clone()),
                WriteKind::Delete => return None,
                WriteKind::Lock | WriteKind::Rollback => {}
            }
        }
        None
    }

    /// Keys with a lock or a write record in `[start, end)` (`end` empty: unbounded), in order.
    fn keys_in(&self, start: &[u8], end: &[u8]) -> Vec<Vec<u8>> {
        let upper = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end)
        };
        let mut keys: Vec<Vec<u8>> = self
            .writes
            .range::<[u8], _>((Bound::Included(start), upper))
            .map(|(k, _)| k.clone())
            .chain(
                self.locks
                    .range::<[u8], _>((Bound::Included(start), upper))
                    .map(|(k, _)| k.clone()),
            )
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Up to `limit` visible pairs of `[start, end)` at `ts`; a locked key yields its lock.
    pub fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        ts: u64,
        limit: usize,
        reverse: bool,
    ) -> Vec<(Vec<u8>, Result<Vec<u8>, LockInfo>)> {
        let mut keys = self.keys_in(start, end);
        if reverse {
            keys.reverse();
        }
        let mut out = Vec::new();
        for key in keys {
            if out.len() >= limit {
                break;
            }
            match self.read(&key, ts) {
                Ok(Some(value)) => out.push((key, Ok(value))),
                Ok(None) => {}
                Err(lock) => out.push((key, Err(lock))),
            }
        }
        out
    }

    /// Prewrites `mutations`: all of them lock, or none does and every failure is returned.
    pub fn prewrite(
        &mut self,
        mutations: &[kvrpcpb::Mutation],
        primary: &[u8],
        start_ts: u64,
        ttl: u64,
        txn_size: u64,
    ) -> Vec<KeyError> {
        let mut errors = Vec::new();
        let mut new_locks = Vec::new();
        for mutation in mutations {
            let key = &mutation.key;
            let op = Op::try_from(mutation.op).unwrap_or(Op::Put);
            if let Some(lock) = self.locks.get(key) {
                if lock.start_ts != start_ts {
                    errors.push(locked(lock.info(key)));
                }
                // Our own lock: the prewrite is being retried.
                continue;
            }
            if let Some(err) = self.newer_write_conflict(key, primary, start_ts) {
                errors.push(err);
                continue;
            }
            let exists = self.data_at(key, u64::MAX).is_some();
            let must_not_exist = op == Op::Insert
                || op == Op::CheckNotExists
                || mutation.assertion == kvrpcpb::Assertion::NotExist as i32;
            if must_not_exist && exists {
                errors.push(KeyError {
                    already_exist: Some(kvrpcpb::AlreadyExist { key: key.clone() }),
                    ..KeyError::default()
                });
                continue;
            }
            if mutation.assertion == kvrpcpb::Assertion::Exist as i32 && !exists {
                errors.push(KeyError {
                    assertion_failed: Some(kvrpcpb::AssertionFailed {
                        start_ts,
                        key: key.clone(),
                        assertion: mutation.assertion,
                        ..kvrpcpb::AssertionFailed::default()
                    }),
                    ..KeyError::default()
                });
                continue;
            }
            let kind = match op {
                Op::Put | Op::Insert => LockKind::Put(mutation.value.clone()),
                Op::Del => LockKind::Delete,
                Op::Lock => LockKind::Lock,
                Op::CheckNotExists => continue,
                Op::Rollback | Op::PessimisticLock => {
                    errors.push(abort(format!("unsupported prewrite op {op:?}")));
                    continue;
                }
            };
            new_locks.push((
                key.clone(),
                Lock {
                    start_ts,
                    primary: primary.to_vec(),
                    kind,
                    ttl,
                    txn_size,
                },
            ));
        }
        if errors.is_empty() {
            self.locks.extend(new_locks);
        }
        errors
    }

    /// A write conflict if anything was committed (or rolled back) on `key` after `start_ts`,
    /// or this transaction was already rolled back there.
    fn newer_write_conflict(&self, key: &[u8], primary: &[u8], start_ts: u64) -> Option<KeyError> {
        let versions = self.writes.get(key)?;
        let (&commit_ts, write) = versions.iter().next_back()?;
        let own_rollback = versions
            .get(&start_ts)
            .is_some_and(|w| w.start_ts == start_ts && w.kind == WriteKind::Rollback);
        if commit_ts > start_ts || own_rollback {
            return Some(KeyError {
                conflict: Some(kvrpcpb::WriteConflict {
                    start_ts,
                    conflict_ts: write.start_ts,
                    key: key.to_vec(),
                    primary: primary.to_vec(),
                    conflict_commit_ts: commit_ts,
                    reason: 0,
                }),
                ..KeyError::default()
            });
        }
        None
    }

    /// The commit record of transaction `start_ts` on `key`, if any.
    fn record_of(&self, key: &[u8], start_ts: u64) -> Option<(u64, &Write)> {
        self.writes
            .get(key)?
            .iter()
            .rev()
            .find_map(|(commit_ts, w)| (w.start_ts == start_ts).then_some((*commit_ts, w)))
    }

    /// Commits the locks of `start_ts` on `keys` at `commit_ts`.
    pub fn commit(
        &mut self,
        keys: &[Vec<u8>],
        start_ts: u64,
        commit_ts: u64,
    ) -> Result<(), KeyError> {
        for key in keys {
            match self.locks.get(key) {
                Some(lock) if lock.start_ts == start_ts => {}
                _ => match self.record_of(key, start_ts) {
                    Some((_, w)) if w.kind != WriteKind::Rollback => {}
                    _ => {
                        return Err(abort(format!(
                            "TxnLockNotFound {{ start_ts: {start_ts}, commit_ts: {commit_ts} }}"
                        )));
                    }
                },
            }
        }
        for key in keys {
            self.commit_key(key, start_ts, commit_ts);
        }
        Ok(())
    }

    fn commit_key(&mut self, key: &[u8], start_ts: u64, commit_ts: u64) {
        let Some(lock) = self.locks.get(key) else {
            return;
        };
        if lock.start_ts != start_ts {
            return;
        }
        let Some(lock) = self.locks.remove(key) else {
            return;
        };
        let kind = match lock.kind {
            LockKind::Put(value) => WriteKind::Put(value),
            LockKind::Delete => WriteKind::Delete,
            LockKind::Lock => WriteKind::Lock,
        };
        self.writes
            .entry(key.to_vec())
            .or_default()
            .insert(commit_ts, Write { start_ts, kind });
    }

    fn rollback_key(&mut self, key: &[u8], start_ts: u64) {
        if self.locks.get(key).is_some_and(|l| l.start_ts == start_ts) {
            self.locks.remove(key);
        }
        self.writes.entry(key.to_vec()).or_default().insert(
            start_ts,
            Write {
                start_ts,
                kind: WriteKind::Rollback,
            },
        );
    }

    /// Rolls back transaction `start_ts` on `keys`; fails if it committed any of them.
    pub fn rollback(&mut self, keys: &[Vec<u8>], start_ts: u64) -> Result<(), KeyError> {
        for key in keys {
            if let Some((commit_ts, w)) = self.record_of(key, start_ts)
                && w.kind != WriteKind::Rollback
            {
                return Err(abort(format!(
                    "Committed {{ start_ts: {start_ts}, commit_ts: {commit_ts} }}"
                )));
            }
        }
        for key in keys {
            self.rollback_key(key, start_ts);
        }
        Ok(())
    }

    /// What became of transaction `lock_ts`, judged on its primary key; rolls back an expired
    /// lock, and (if asked) a transaction that left no trace.
    pub fn check_txn_status(
        &mut self,
        primary: &[u8],
        lock_ts: u64,
        current_ts: u64,
        rollback_if_not_exist: bool,
    ) -> Result<TxnStatus, KeyError> {
        if let Some(lock) = self.locks.get(primary)
            && lock.start_ts == lock_ts
        {
            let expired = physical(current_ts) >= physical(lock_ts).saturating_add(lock.ttl);
            if expired {
                self.rollback_key(primary, lock_ts);
                return Ok(TxnStatus::RolledBack(kvrpcpb::Action::TtlExpireRollback));
            }
            return Ok(TxnStatus::Locked {
                ttl: lock.ttl,
                lock: lock.info(primary),
            });
        }
        match self.record_of(primary, lock_ts) {
            Some((_, w)) if w.kind == WriteKind::Rollback => {
                Ok(TxnStatus::RolledBack(kvrpcpb::Action::NoAction))
            }
            Some((commit_ts, _)) => Ok(TxnStatus::Committed(commit_ts)),
            None if rollback_if_not_exist => {
                self.rollback_key(primary, lock_ts);
                Ok(TxnStatus::RolledBack(kvrpcpb::Action::LockNotExistRollback))
            }
            None => Err(KeyError {
                txn_not_found: Some(kvrpcpb::TxnNotFound {
                    start_ts: lock_ts,
                    primary_key: primary.to_vec(),
                }),
                ..KeyError::default()
            }),
        }
    }

    /// Commits (`commit_ts > 0`) or rolls back every lock of `start_ts` in `[start, end)`.
    pub fn resolve(&mut self, start_ts: u64, commit_ts: u64, start: &[u8], end: &[u8]) {
        let keys: Vec<Vec<u8>> = self
            .keys_in(start, end)
            .into_iter()
            .filter(|k| self.locks.get(k).is_some_and(|l| l.start_ts == start_ts))
            .collect();
        for key in keys {
            if commit_ts == 0 {
                self.rollback_key(&key, start_ts);
            } else {
                self.commit_key(&key, start_ts, commit_ts);
            }
        }
    }

    /// Extends the TTL of transaction `start_ts`'s primary lock.
    pub fn heartbeat(&mut self, primary: &[u8], start_ts: u64, ttl: u64) -> Result<u64, KeyError> {
        match self.locks.get_mut(primary) {
            Some(lock) if lock.start_ts == start_ts => {
                lock.ttl = lock.ttl.max(ttl);
                Ok(lock.ttl)
            }
            _ => Err(KeyError {
                txn_not_found: Some(kvrpcpb::TxnNotFound {
                    start_ts,
                    primary_key: primary.to_vec(),
                }),
                ..KeyError::default()
            }),
        }
    }

    /// Locks of transactions that started at or before `max_version`, in `[start, end)`.
    pub fn scan_locks(
        &self,
        max_version: u64,
        start: &[u8],
        end: &[u8],
        limit: usize,
    ) -> Vec<LockInfo> {
        let upper = if end.is_empty() {
            Bound::Unbounded
        } else {
            Bound::Excluded(end)
        };
        self.locks
            .range::<[u8], _>((Bound::Included(start), upper))
            .filter(|(_, l)| l.start_ts <= max_version)
            .take(if limit == 0 { usize::MAX } else { limit })
            .map(|(k, l)| l.info(k))
            .collect()
    }

    /// Places a lock directly, as a writer that crashed after its prewrite would leave it.
    pub fn place_lock(&mut self, key: &[u8], lock: Lock) {
        self.locks.insert(key.to_vec(), lock);
    }

    /// Drops every version no read at or after `safe_point` can see.
    pub fn gc(&mut self, safe_point: u64) {
        for versions in self.writes.values_mut() {
            let newest_visible = versions
                .range(..=safe_point)
                .rev()
                .find(|(_, w)| matches!(w.kind, WriteKind::Put(_) | WriteKind::Delete))
                .map(|(ts, w)| (*ts, w.kind == WriteKind::Delete));
            versions.retain(|ts, _| {
                *ts > safe_point
                    || newest_visible.is_some_and(|(keep, deleted)| *ts == keep && !deleted)
            });
        }
        self.writes.retain(|_, versions| !versions.is_empty());
    }

    /// Whether `key` is locked.
    pub fn is_locked(&self, key: &[u8]) -> bool {
        self.locks.contains_key(key)
    }

    /// How many locks there are.
    pub fn lock_count(&self) -> usize {
        self.locks.len()
    }

    /// How many write records `key` has.
    pub fn version_count(&self, key: &[u8]) -> usize {
        self.writes.get(key).map_or(0, BTreeMap::len)
    }
}
