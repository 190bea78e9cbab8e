//! Prepared statement handles: the statement, its parameter schema and its bound parameters,
//! kept until closed or unused for longer than the time-to-live (clients such as the Rust CLI
//! never close them).

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::ScalarValue;

use crate::error::{Error, Limit, Result};
use crate::query::dml::WriteStatement;
use crate::txn::TxnId;

/// One prepared statement.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// The SQL.
    pub sql: String,
    /// Its parameters (`"0"`, `"1"`, …).
    pub parameters: SchemaRef,
    /// The values bound last, if any.
    pub bound: Vec<ScalarValue>,
    /// The write it performs, for `INSERT`, `UPDATE` and `DELETE`.
    pub write: Option<WriteStatement>,
    /// The transaction it was prepared in.
    pub txn: Option<TxnId>,
}

struct Entry {
    statement: Prepared,
    session: Option<String>,
    /// Whether only `session` may use it.
    owned: bool,
    last_used: Instant,
}

/// How many prepared statements the server keeps, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PreparedLimits {
    /// A handle unused this long is forgotten.
    pub ttl: Duration,
    /// Most handles live at once on the server.
    pub max_total: usize,
    /// Most handles one session may hold.
    pub max_per_session: usize,
    /// Most bytes of SQL text the live handles may hold together.
    pub max_text_bytes: usize,
}

impl Default for PreparedLimits {
    fn default() -> Self {
        Self {
            ttl: Duration::from_mins(10),
            max_total: 4096,
            max_per_session: 256,
            max_text_bytes: 256 << 20,
        }
    }
}

/// The live handles of one server.
pub struct PreparedStatements {
    entries: Mutex<HashMap<Vec<u8>, Entry>>,
    limits: PreparedLimits,
}

impl PreparedStatements {
    /// An empty set within `limits`.
    #[must_use]
    pub fn new(limits: PreparedLimits) -> Self {
        Self {
            entries: Mutex::new(HashMap::new()),
            limits,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stores `statement`, prepared by `session`, and returns its new handle: 128 random
    /// bits, usable only by that session when `owned` (else by anyone holding it).
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when the server or the session holds as many handles, or as
    /// much SQL text, as it may; [`Error::Internal`] without OS randomness.
    pub fn insert(
        &self,
        statement: Prepared,
        session: Option<&str>,
        owned: bool,
    ) -> Result<Vec<u8>> {
        let handle = crate::auth::random_hex::<16>("ps-")?.into_bytes();
        let now = Instant::now();
        let mut entries = self.lock();
        entries.retain(|_, e| now.duration_since(e.last_used) < self.limits.ttl);
        let limit = |limit: Limit, max: usize| {
            Err(Error::LimitExceeded {
                limit,
                max: u64::try_from(max).unwrap_or(u64::MAX),
            })
        };
        if entries.len() >= self.limits.max_total {
            return limit(Limit::PreparedStatements, self.limits.max_total);
        }
        if let Some(session) = session {
            let of_session = entries
                .values()
                .filter(|e| e.session.as_deref() == Some(session))
                .count();
            if of_session >= self.limits.max_per_session {
                return limit(
                    Limit::SessionPreparedStatements,
                    self.limits.max_per_session,
                );
            }
        }
        let text: usize = entries.values().map(|e| e.statement.sql.len()).sum();
        if text + statement.sql.len() > self.limits.max_text_bytes {
            return limit(Limit::PreparedSqlBytes, self.limits.max_text_bytes);
        }
        entries.insert(
            handle.clone(),
            Entry {
                statement,
                session: session.map(str::to_owned),
                owned,
                last_used: now,
            },
        );
        Ok(handle)
    }

    /// The statement of `handle`, marking it used, for a call from `session`.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown, closed or expired handle, or one of another
    /// session.
    pub fn get(&self, handle: &[u8], session: Option<&str>) -> Result<Prepared> {
        let now = Instant::now();
        let mut entries = self.lock();
        match entries.get_mut(handle) {
            Some(entry) if !entry.usable_by(session) => Err(not_found(handle, "unknown or closed")),
            Some(entry) if now.duration_since(entry.last_used) < self.limits.ttl => {
                entry.last_used = now;
                Ok(entry.statement.clone())
            }
            Some(_) => {
                entries.remove(handle);
                Err(not_found(handle, "expired"))
            }
            None => Err(not_found(handle, "unknown or closed")),
        }
    }

    /// Binds `values` to `handle`, for a call from `session`.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown handle, or one of another session.
    pub fn bind(
        &self,
        handle: &[u8],
        session: Option<&str>,
        values: Vec<ScalarValue>,
    ) -> Result<()> {
        let mut entries = self.lock();
        let entry = entries
            .get_mut(handle)
            .filter(|entry| entry.usable_by(session))
            .ok_or_else(|| not_found(handle, "unknown or closed"))?;
        entry.statement.bound = values;
        entry.last_used = Instant::now();
        Ok(())
    }

    /// Forgets `handle`, for a call from `session`. Closing an unknown handle is not an error.
    ///
    /// # Errors
    /// [`Error::NotFound`] for a handle of another session, which stays open.
    pub fn close(&self, handle: &[u8], session: Option<&str>) -> Result<()> {
        let mut entries = self.lock();
        match entries.get(handle) {
            Some(entry) if !entry.usable_by(session) => Err(not_found(handle, "unknown or closed")),
            _ => {
                entries.remove(handle);
                Ok(())
            }
        }
    }
}

impl Entry {
    fn usable_by(&self, session: Option<&str>) -> bool {
        !self.owned || self.session.as_deref() == session
    }
}

fn not_found(handle: &[u8], why: &'static str) -> Error {
    Error::NotFound {
        what: crate::error::Named::PreparedStatement {
            handle: crate::error::excerpt(&String::from_utf8_lossy(handle)).into_owned(),
            why,
        },
    }
}
