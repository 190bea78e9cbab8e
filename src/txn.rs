//! Transactions: a staged batch per transaction, evaluated as each change is staged and
//! committed atomically at the end; sessions that bind untagged requests to their open
//! transaction; expiry of abandoned ones.
//!
//! - Nothing is written before the commit. A transaction's reads see the snapshot it started
//!   from with its own staged changes laid over it ([`Transactions::view`]).
//! - The storage snapshot is taken lazily, at the first staged change: an open but idle
//!   transaction (ADBC opens one on every connect) pins nothing.
//! - Each change is evaluated when it is staged, so a statement that breaks a constraint no
//!   later change can mend is refused at once and leaves the transaction as it was. What a
//!   later change may still mend (a mapping whose name rows come in the next ingest) is
//!   checked again at the commit.
//! - The commit applies the evaluated plan against the snapshot the transaction read, with
//!   insert-if-absent for every created key, so two transactions creating the same mapping
//!   cannot both commit: the second gets a conflict.

use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};

use crate::catalog::{Catalog, CatalogSnapshot};
use crate::clock::Clock;
use crate::error::{Error, Limit, Result};
use futures::{Stream, StreamExt as _};
use tokio::sync::watch;

use crate::write::{CommitReport, Op, Staging, ValidationError};

/// Limits and timeouts of transactions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TxnConfig {
    /// A transaction unused for this long is rolled back.
    pub idle_timeout: Duration,
    /// Most rows one transaction may stage.
    pub max_rows: u64,
    /// Most bytes one transaction may hold staged: its records and their bookkeeping, as
    /// allocated.
    pub max_bytes: u64,
    /// Most transactions open at once on the server.
    pub max_open: usize,
    /// Most transactions one session may have open at once.
    pub max_open_per_session: usize,
}

impl Default for TxnConfig {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_mins(5),
            max_rows: 2_000_000,
            max_bytes: 512 << 20,
            max_open: 1024,
            max_open_per_session: 16,
        }
    }
}

/// A transaction id: 128 random bits, hex.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TxnId(String);

impl TxnId {
    /// The id a client sent, as bytes.
    #[must_use]
    pub fn from_bytes(bytes: &[u8]) -> Self {
        Self(String::from_utf8_lossy(bytes).into_owned())
    }

    /// The id as the client sees it.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        self.0.as_bytes()
    }
}

impl fmt::Display for TxnId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TxnId {
    /// A new id: 128 bits from the operating system's generator, hex.
    ///
    /// # Errors
    /// [`Error::Internal`] when the generator is unavailable.
    fn random() -> Result<Self> {
        crate::auth::random_hex::<16>("").map(Self)
    }
}

/// How a transaction ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ending {
    Committed,
    RolledBack,
    /// Its commit was refused (validation, conflict): nothing was written.
    Failed,
    /// Its commit reached the store, which did not say whether it applied it.
    OutcomeUnknown,
    Expired,
}

struct Ended {
    how: Ending,
    at: Instant,
    owner: Option<String>,
}

/// Ended transactions are remembered this long, to answer late calls precisely.
const REMEMBER_ENDED: Duration = Duration::from_hours(1);
/// At most this many ended transactions are remembered.
const MAX_REMEMBERED: usize = 100_000;

struct Open {
    txn: Arc<tokio::sync::Mutex<Txn>>,
    /// The transaction's [`Txn::discarded`], settable without its lock.
    discarded: Arc<AtomicBool>,
    last_used: Instant,
    session: Option<String>,
    /// Whether only `session` may use it (see [`Transactions::begin`]).
    owned: bool,
}

impl Open {
    fn owner(&self) -> Option<&str> {
        self.session.as_deref().filter(|_| self.owned)
    }
}

#[derive(Default)]
struct Registry {
    open: HashMap<TxnId, Open>,
    ended: HashMap<TxnId, Ended>,
    /// Session token → its open transaction.
    sessions: HashMap<String, TxnId>,
}

impl Registry {
    fn end(&mut self, id: &TxnId, how: Ending, now: Instant) -> Option<Open> {
        let open = self.open.remove(id)?;
        crate::metrics::get().transactions_open.dec();
        if let Some(session) = &open.session
            && self.sessions.get(session) == Some(id)
        {
            self.sessions.remove(session);
        }
        if self.ended.len() >= MAX_REMEMBERED {
            self.ended
                .retain(|_, e| now.duration_since(e.at) < REMEMBER_ENDED);
            if self.ended.len() >= MAX_REMEMBERED {
                self.ended.clear();
            }
        }
        self.ended.insert(
            id.clone(),
            Ended {
                how,
                at: now,
                owner: open.owner().map(str::to_owned),
            },
        );
        Some(open)
    }

    /// Ends transaction `id` if it has been idle past `timeout` and no call is using it;
    /// returns whether it did. Each lookup checks only the transaction it names; the reaper
    /// checks them all.
    fn expire_one(&mut self, id: &TxnId, timeout: Duration, now: Instant) -> bool {
        let idle = self.open.get(id).is_some_and(|open| {
            now.duration_since(open.last_used) >= timeout && open.txn.try_lock().is_ok()
        });
        if idle && let Some(open) = self.end(id, Ending::Expired, now) {
            crate::metrics::get().transactions_expired.inc();
            open.discard();
        }
        idle
    }

    /// Ends every transaction idle past `timeout` that no call is using.
    fn expire(&mut self, timeout: Duration, now: Instant) -> usize {
        let ids: Vec<TxnId> = self.open.keys().cloned().collect();
        ids.iter()
            .filter(|id| self.expire_one(id, timeout, now))
            .count()
    }
}

/// One open transaction's state.
struct Txn {
    /// The staged changes, over the snapshot the transaction reads, from its first change on.
    staging: Option<Staging>,
    /// Rows staged (a delete or update counts one).
    rows: u64,
    /// Set once committed, rolled back or expired: a call that was waiting on the lock must
    /// not use it.
    done: bool,
    /// Set, without the lock, when the transaction is rolled back or expires while a call
    /// holds or awaits the lock: that call then refuses to use it, or to report a change
    /// staged into it, and drops what it staged.
    discarded: Arc<AtomicBool>,
}

impl Txn {
    fn discard(&mut self) {
        self.done = true;
        self.staging = None;
    }

    /// Whether the transaction has ended for the call holding its lock.
    fn ended(&self) -> bool {
        self.done || self.discarded.load(Ordering::Acquire)
    }
}

impl Open {
    /// Discards a transaction that is rolled back or expires: at once when no call holds it,
    /// else by the call that does, as soon as it looks (see [`Txn::ended`]).
    fn discard(&self) {
        self.discarded.store(true, Ordering::Release);
        if let Ok(mut txn) = self.txn.try_lock() {
            txn.discard();
        }
    }
}

/// The transactions of one server.
pub struct Transactions {
    catalog: Catalog,
    config: TxnConfig,
    registry: Arc<Mutex<Registry>>,
    clock: Clock,
    /// How many passes the reaper has made.
    reaped: watch::Sender<u64>,
}

impl fmt::Debug for Transactions {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transactions")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Transactions {
    /// No transactions yet, over `catalog`, timed by the system clock.
    #[must_use]
    pub fn new(catalog: Catalog, config: TxnConfig) -> Self {
        Self::with_clock(catalog, config, Clock::system())
    }

    /// No transactions yet, over `catalog`, their timeouts read on `clock`.
    #[must_use]
    pub fn with_clock(catalog: Catalog, config: TxnConfig, clock: Clock) -> Self {
        Self {
            catalog,
            config,
            registry: Arc::new(Mutex::new(Registry::default())),
            clock,
            reaped: watch::Sender::new(0),
        }
    }

    /// The limits and timeouts in force.
    #[must_use]
    pub fn config(&self) -> TxnConfig {
        self.config
    }

    /// The catalog written.
    #[must_use]
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    fn registry(&self) -> MutexGuard<'_, Registry> {
        self.registry.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Starts expiring idle transactions in the background, until the transactions are
    /// dropped. Expiry also happens on every lookup; this releases abandoned ones promptly.
    pub fn spawn_reaper(&self) {
        let registry: Weak<Mutex<Registry>> = Arc::downgrade(&self.registry);
        let timeout = self.config.idle_timeout;
        let period = (timeout / 4).clamp(Duration::from_millis(50), Duration::from_secs(10));
        let clock = self.clock.clone();
        let reaped = self.reaped.clone();
        // The passes' times are fixed from now on, so a clock moved right after this call
        // still wakes the first pass.
        let mut next = clock.now() + period;
        tokio::spawn(async move {
            loop {
                clock.sleep_until(next).await;
                // A late pass is not made up for: the next one is a period on.
                next = (next + period).max(clock.now());
                let Some(registry) = registry.upgrade() else {
                    return;
                };
                let expired = registry
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .expire(timeout, clock.now());
                if expired > 0 {
                    tracing::info!(expired, "rolled back idle transactions");
                }
                reaped.send_modify(|passes| *passes += 1);
            }
        });
    }

    /// Follows the reaper's passes: the number it has made so far, changing after each.
    #[must_use]
    pub fn reaper_passes(&self) -> watch::Receiver<u64> {
        self.reaped.subscribe()
    }

    /// Opens a transaction, bound to `session` if given: that session's untagged requests
    /// join it until it ends. When `owned`, only that session may use it; otherwise anyone
    /// holding its (unguessable) id may.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when the server or the session has as many transactions open
    /// as it may.
    pub fn begin(&self, session: Option<&str>, owned: bool) -> Result<TxnId> {
        let id = TxnId::random()?;
        let count = |n: usize| u64::try_from(n).unwrap_or(u64::MAX);
        let now = self.clock.now();
        let discarded = Arc::new(AtomicBool::new(false));
        let mut registry = self.registry();
        if registry.open.len() >= self.config.max_open {
            // Idle ones the reaper has not reached yet do not count.
            registry.expire(self.config.idle_timeout, now);
        }
        if registry.open.len() >= self.config.max_open {
            return Err(Error::LimitExceeded {
                limit: Limit::OpenTransactions,
                max: count(self.config.max_open),
            });
        }
        if let Some(session) = session {
            let of_session = registry
                .open
                .values()
                .filter(|open| open.session.as_deref() == Some(session))
                .count();
            if of_session >= self.config.max_open_per_session {
                return Err(Error::LimitExceeded {
                    limit: Limit::SessionTransactions,
                    max: count(self.config.max_open_per_session),
                });
            }
        }
        crate::metrics::get().transactions_open.inc();
        registry.open.insert(
            id.clone(),
            Open {
                txn: Arc::new(tokio::sync::Mutex::new(Txn {
                    staging: None,
                    rows: 0,
                    done: false,
                    discarded: Arc::clone(&discarded),
                })),
                discarded,
                last_used: now,
                session: session.map(str::to_owned),
                owned,
            },
        );
        if let Some(session) = session {
            registry.sessions.insert(session.to_owned(), id.clone());
        }
        Ok(id)
    }

    /// The open transaction of `session`, if any.
    #[must_use]
    pub fn of_session(&self, session: &str) -> Option<TxnId> {
        let mut registry = self.registry();
        let id = registry.sessions.get(session).cloned()?;
        registry.expire_one(&id, self.config.idle_timeout, self.clock.now());
        registry.open.contains_key(&id).then_some(id)
    }

    /// Checks that `session` may use transaction `id`: one begun in a session belongs to it
    /// alone; one begun outside any session to whoever holds its id.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a transaction of another session, told as if it did not exist.
    pub fn check_access(&self, id: &TxnId, session: Option<&str>) -> Result<()> {
        let registry = self.registry();
        let owner = match (registry.open.get(id), registry.ended.get(id)) {
            (Some(open), _) => open.owner(),
            (None, Some(ended)) => ended.owner.as_deref(),
            (None, None) => None,
        };
        match owner {
            Some(owner) if Some(owner) != session => Err(Error::NotFound {
                what: crate::error::Named::Transaction(id.0.clone()),
            }),
            _ => Ok(()),
        }
    }

    /// Whether `id` is open.
    #[must_use]
    pub fn is_open(&self, id: &TxnId) -> bool {
        let mut registry = self.registry();
        registry.expire_one(id, self.config.idle_timeout, self.clock.now());
        registry.open.contains_key(id)
    }

    /// Rolls back the open transaction of `session`, which has gone away.
    pub fn close_session(&self, session: &str) {
        let now = self.clock.now();
        let mut registry = self.registry();
        if let Some(id) = registry.sessions.remove(session)
            && let Some(open) = registry.end(&id, Ending::RolledBack, now)
        {
            open.discard();
        }
    }

    /// The open transaction `id`, marked used.
    fn open(&self, id: &TxnId) -> Result<Arc<tokio::sync::Mutex<Txn>>> {
        let now = self.clock.now();
        let mut registry = self.registry();
        registry.expire_one(id, self.config.idle_timeout, now);
        if let Some(open) = registry.open.get_mut(id) {
            open.last_used = now;
            return Ok(Arc::clone(&open.txn));
        }
        Err(self.not_open(id, registry.ended.get(id).map(|e| e.how)))
    }

    fn touch(&self, id: &TxnId) {
        if let Some(open) = self.registry().open.get_mut(id) {
            open.last_used = self.clock.now();
        }
    }

    /// How transaction `id` ended, while the server remembers it.
    fn ending(&self, id: &TxnId) -> Option<Ending> {
        self.registry().ended.get(id).map(|e| e.how)
    }

    fn not_open(&self, id: &TxnId, how: Option<Ending>) -> Error {
        let state = match how {
            Some(Ending::Committed) => "was already committed".to_owned(),
            Some(Ending::RolledBack) => "was rolled back".to_owned(),
            Some(Ending::Failed) => {
                "ended when its commit was refused; nothing of it was written".to_owned()
            }
            Some(Ending::OutcomeUnknown) => {
                return Error::CommitUnknown {
                    reason: format!(
                        "transaction {id} ended with its commit, whose outcome the store did not report"
                    ),
                };
            }
            Some(Ending::Expired) => format!(
                "expired after {} s idle and was rolled back; nothing of it was written",
                self.config.idle_timeout.as_secs()
            ),
            None => "is not open on this server (never begun here, or ended long ago)".to_owned(),
        };
        Error::TransactionNotOpen {
            id: id.to_string(),
            state,
        }
    }

    /// Stages `ops` (one request's changes) in transaction `id`, all or none, and returns the
    /// rows they affect in the transaction's view.
    ///
    /// # Errors
    /// [`Error::TransactionNotOpen`]; [`Error::LimitExceeded`] past the staging limits;
    /// [`Error::Validation`] when the change breaks a constraint no later change can mend.
    /// After an error the transaction is as it was.
    pub async fn stage(&self, id: &TxnId, ops: Vec<Op>) -> Result<u64> {
        self.stage_stream(id, futures::stream::once(async { Ok(ops) }))
            .await
    }

    /// Stages the changes of one request as they arrive (the batches of an upload, each
    /// decoded into changes), all or none: each batch is staged, and checked against the
    /// limits, before the next is read, so a request over a limit is refused without being
    /// buffered first. Returns the rows affected.
    ///
    /// # Errors
    /// As [`stage`](Self::stage), and whatever error the stream yields. After an error the
    /// transaction is as it was.
    pub async fn stage_stream(
        &self,
        id: &TxnId,
        ops: impl Stream<Item = Result<Vec<Op>>> + Send,
    ) -> Result<u64> {
        let handle = self.open(id)?;
        let mut txn = handle.lock().await;
        if txn.ended() {
            return Err(self.not_open(id, self.ending(id)));
        }
        let result = self.stage_locked(&mut txn, ops).await;
        if txn.ended() {
            // Rolled back or expired while this request was staged: nothing of it stays, and
            // it is not reported as staged.
            txn.discard();
            return Err(self.not_open(id, self.ending(id)));
        }
        drop(txn);
        self.touch(id);
        result
    }

    async fn stage_locked(
        &self,
        txn: &mut Txn,
        ops: impl Stream<Item = Result<Vec<Op>>> + Send,
    ) -> Result<u64> {
        let Txn { staging, rows, .. } = txn;
        let staging = match staging {
            Some(staging) => staging,
            None => staging.insert(Staging::new(self.catalog.snapshot().await?)),
        };
        staging.begin_request();
        let mut staged_rows = *rows;
        let result = self
            .apply_stream(staging, &mut staged_rows, ops, true)
            .await
            .map(|(affected, _)| affected);
        staging.end_request(result.is_ok());
        if result.is_ok() {
            *rows = staged_rows;
        }
        result
    }

    /// Applies a request's changes to `staging`, checking the limits after each. With
    /// `refuse_at_once`, a final violation fails the request there; without, every final
    /// violation of the request is collected and returned with the rows affected.
    async fn apply_stream(
        &self,
        staging: &mut Staging,
        rows: &mut u64,
        ops: impl Stream<Item = Result<Vec<Op>>> + Send,
        refuse_at_once: bool,
    ) -> Result<(u64, Vec<crate::write::Violation>)> {
        let mut ops = std::pin::pin!(ops);
        let mut affected = 0;
        let mut violations = Vec::new();
        while let Some(batch) = ops.next().await {
            for op in batch? {
                *rows += match &op {
                    Op::Insert(insert) => insert.len() as u64,
                    Op::Delete(_) | Op::Update(_) => 1,
                    Op::Hold(_) => 0,
                };
                if *rows > self.config.max_rows {
                    return Err(Error::LimitExceeded {
                        limit: Limit::TransactionRows,
                        max: self.config.max_rows,
                    });
                }
                affected += staging.apply(&op, &mut violations).await?;
                if refuse_at_once && !violations.is_empty() {
                    return Err(Error::Validation(ValidationError { violations }));
                }
                let memory = staging.memory();
                crate::metrics::get().staged(memory);
                if memory > self.config.max_bytes {
                    return Err(Error::LimitExceeded {
                        limit: Limit::TransactionBytes,
                        max: self.config.max_bytes,
                    });
                }
            }
        }
        Ok((affected, violations))
    }

    /// What transaction `id` reads: its base snapshot with its staged changes, or a fresh
    /// snapshot while it has staged nothing.
    ///
    /// # Errors
    /// [`Error::TransactionNotOpen`]; store errors taking a snapshot.
    pub async fn view(&self, id: &TxnId) -> Result<CatalogSnapshot> {
        let handle = self.open(id)?;
        let mut txn = handle.lock().await;
        if txn.ended() {
            return Err(self.not_open(id, self.ending(id)));
        }
        match &mut txn.staging {
            Some(staging) => Ok(staging.view()),
            None => self.catalog.snapshot().await,
        }
    }

    /// Commits transaction `id`: all of its staged changes atomically, or nothing.
    ///
    /// # Errors
    /// [`Error::TransactionNotOpen`]; [`Error::Validation`] with every remaining violation;
    /// [`Error::CommitConflict`] when a concurrent commit changed what it relied on;
    /// [`Error::CommitUnknown`]. The transaction has ended either way.
    pub async fn commit(&self, id: &TxnId) -> Result<CommitReport> {
        let handle = {
            let now = self.clock.now();
            let mut registry = self.registry();
            registry.expire_one(id, self.config.idle_timeout, now);
            let ended = registry.ended.get(id).map(|e| e.how);
            // Ended as committed until the outcome says otherwise; no call can join it now.
            match registry.end(id, Ending::Committed, now) {
                Some(open) => open.txn,
                None => return Err(self.not_open(id, ended)),
            }
        };
        let mut txn = handle.lock().await;
        let outcome = match txn.staging.take() {
            Some(staging) => crate::write::commit::commit(&self.catalog, staging).await,
            None => Ok(CommitReport {
                affected: Vec::new(),
                summary: crate::write::PlanSummary::default(),
            }),
        };
        txn.discard();
        if let Err(err) = &outcome
            && let Some(ended) = self.registry().ended.get_mut(id)
        {
            ended.how = if matches!(err, Error::CommitUnknown { .. }) {
                Ending::OutcomeUnknown
            } else {
                Ending::Failed
            };
        }
        outcome
    }

    /// Rolls back transaction `id`. Rolling back a transaction that already rolled back, or
    /// whose commit was refused, succeeds: nothing of it is stored either way.
    ///
    /// # Errors
    /// [`Error::TransactionNotOpen`] for a committed, expired or unknown transaction;
    /// [`Error::CommitUnknown`] for one whose commit's outcome is unknown (it may be stored).
    pub fn rollback(&self, id: &TxnId) -> Result<()> {
        let now = self.clock.now();
        let mut registry = self.registry();
        registry.expire_one(id, self.config.idle_timeout, now);
        let ended = registry.ended.get(id).map(|e| e.how);
        match registry.end(id, Ending::RolledBack, now) {
            Some(open) => {
                open.discard();
                Ok(())
            }
            None if matches!(ended, Some(Ending::RolledBack | Ending::Failed)) => Ok(()),
            None => Err(self.not_open(id, ended)),
        }
    }

    /// Runs `ops` as a transaction of their own: validated against `base` (the snapshot the
    /// statement read, or a fresh one) and committed at once.
    ///
    /// # Errors
    /// As [`commit`](Self::commit).
    pub async fn autocommit(
        &self,
        ops: Vec<Op>,
        base: Option<CatalogSnapshot>,
    ) -> Result<CommitReport> {
        self.autocommit_stream(futures::stream::once(async { Ok(ops) }), base, || Ok(()))
            .await
    }

    /// Runs the changes of one request, as they arrive, as a transaction of their own, under
    /// the same staging limits as a transaction. Once the changes have all arrived,
    /// `before_commit` may still refuse the commit (an upload without its commit marker).
    ///
    /// # Errors
    /// As [`commit`](Self::commit), [`Error::LimitExceeded`], and `before_commit`'s error.
    pub async fn autocommit_stream(
        &self,
        ops: impl Stream<Item = Result<Vec<Op>>> + Send,
        base: Option<CatalogSnapshot>,
        before_commit: impl FnOnce() -> Result<()> + Send,
    ) -> Result<CommitReport> {
        let base = match base {
            Some(base) => base,
            None => self.catalog.snapshot().await?,
        };
        let mut staging = Staging::new(base);
        let mut rows = 0;
        let (_, mut violations) = self
            .apply_stream(&mut staging, &mut rows, ops, false)
            .await?;
        before_commit()?;
        if !violations.is_empty() {
            violations.extend(staging.pending());
            return Err(Error::Validation(ValidationError { violations }));
        }
        crate::write::commit::commit(&self.catalog, staging).await
    }
}

#[cfg(test)]
mod tests;
