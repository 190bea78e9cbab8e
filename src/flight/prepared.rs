//! Prepared statement handles: the statement, its parameter schema and its bound parameters,
//! kept until closed or unused for longer than the time-to-live (clients such as the Rust CLI
//! never close them).

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::ScalarValue;

use crate::error::{Error, Result};
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
    next: AtomicU64,
    limits: PreparedLimits,
    /// Distinguishes this process's handles from another's.
    nonce: u64,
}

impl PreparedStatements {
    /// An empty set within `limits`.
    #[must_use]
    pub fn new(limits: PreparedLimits) -> Self {
        let nonce = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| {
                u64::try_from(d.as_nanos() & u128::from(u64::MAX)).unwrap_or(0)
            });
        Self {
            entries: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            limits,
            nonce,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Vec<u8>, Entry>> {
        self.entries
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stores `statement`, prepared by `session`, and returns its new handle.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when the server or the session holds as many handles, or as
    /// much SQL text, as it may.
    pub fn insert(&self, statement: Prepared, session: Option<&str>) -> Result<Vec<u8>> {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let handle = format!("ps-{:x}-{id}", self.nonce).into_bytes();
        let now = Instant::now();
        let mut entries = self.lock();
        entries.retain(|_, e| now.duration_since(e.last_used) < self.limits.ttl);
        let limit = |what: String| {
            Err(Error::LimitExceeded {
                what: format!("{what}; close prepared statements you no longer use"),
            })
        };
        if entries.len() >= self.limits.max_total {
            return limit(format!(
                "{} prepared statements are open, the server's limit (serve \
                 --max-prepared-statements)",
                entries.len()
            ));
        }
        if let Some(session) = session {
            let of_session = entries
                .values()
                .filter(|e| e.session.as_deref() == Some(session))
                .count();
            if of_session >= self.limits.max_per_session {
                return limit(format!(
                    "this session has {of_session} prepared statements open, its limit (serve \
                     --max-session-prepared-statements)"
                ));
            }
        }
        let text: usize = entries.values().map(|e| e.statement.sql.len()).sum();
        if text + statement.sql.len() > self.limits.max_text_bytes {
            return limit(format!(
                "the open prepared statements hold {text} bytes of SQL, and this one would take \
                 them over the server's limit of {} bytes",
                self.limits.max_text_bytes
            ));
        }
        entries.insert(
            handle.clone(),
            Entry {
                statement,
                session: session.map(str::to_owned),
                last_used: now,
            },
        );
        Ok(handle)
    }

    /// The statement of `handle`, marking it used.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown, closed or expired handle.
    pub fn get(&self, handle: &[u8]) -> Result<Prepared> {
        let now = Instant::now();
        let mut entries = self.lock();
        match entries.get_mut(handle) {
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

    /// Binds `values` to `handle`.
    ///
    /// # Errors
    /// [`Error::NotFound`] for an unknown handle.
    pub fn bind(&self, handle: &[u8], values: Vec<ScalarValue>) -> Result<()> {
        let mut entries = self.lock();
        let entry = entries
            .get_mut(handle)
            .ok_or_else(|| not_found(handle, "unknown or closed"))?;
        entry.statement.bound = values;
        entry.last_used = Instant::now();
        Ok(())
    }

    /// Forgets `handle`. Closing an unknown handle is not an error.
    pub fn close(&self, handle: &[u8]) {
        self.lock().remove(handle);
    }
}

fn not_found(handle: &[u8], why: &str) -> Error {
    Error::NotFound {
        what: format!(
            "prepared statement {} ({why})",
            crate::error::excerpt(&String::from_utf8_lossy(handle))
        ),
    }
}
