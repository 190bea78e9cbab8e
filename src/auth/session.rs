//! Sessions: who a call comes from, and what it may do.
//!
//! A session is opened by a login (Basic credentials) or by the first call with a
//! pre-issued token, and is named by a bearer token of 256 random bits. The server keeps only
//! the token's SHA-256. A session ends when idle past its timeout, past its lifetime, when
//! closed, or when the user or token it came from is removed or changes role.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use super::{Role, token_digest};
use crate::error::{Error, Limit, Result};

/// The caller of a request, as the gate found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    /// The session's id, which transactions and prepared statements are bound to; `None` for
    /// a call that belongs to no session (an unauthenticated server's one-off calls).
    pub id: Option<Arc<str>>,
    /// Who: `user:NAME`, `token:NAME`, or `anonymous`.
    pub principal: Arc<str>,
    /// What it may do.
    pub role: Role,
    /// Whether the caller presented the session's token, rather than being handed it by
    /// this call: only then can it be trusted to come back as this session, so only then
    /// is what the call creates bound to the session alone.
    pub established: bool,
}

impl Session {
    /// A caller of an unauthenticated server, in the session `id` if it has one.
    #[must_use]
    pub fn unauthenticated(id: Option<Arc<str>>) -> Self {
        Self {
            id,
            principal: Arc::from("anonymous"),
            role: Role::Admin,
            established: true,
        }
    }

    /// The session's id, if any.
    #[must_use]
    pub fn id(&self) -> Option<&str> {
        self.id.as_deref()
    }

    /// The session that owns what this call creates: its own once established, else none
    /// (a transaction or prepared statement made by the call that opened the session belongs
    /// to whoever holds its unguessable id, as the client may never present the new token).
    #[must_use]
    pub fn owner(&self) -> Option<&str> {
        self.id().filter(|_| self.established)
    }

    /// Checks that the caller may do `what`, which needs `role`.
    ///
    /// # Errors
    /// [`Error::PermissionDenied`] naming the caller, its role and what was refused.
    pub fn require(&self, role: Role, what: &'static str) -> Result<()> {
        if self.role >= role {
            return Ok(());
        }
        Err(Error::PermissionDenied {
            principal: self.principal.to_string(),
            role: self.role.name(),
            needs: role.name(),
            what,
        })
    }
}

/// Where a session came from, so that it ends when that goes away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// A login of this user.
    User(String),
    /// This pre-issued token.
    Token(String),
}

/// A session whose token has not come back within this long may be ended to make room.
const UNCLAIMED_SESSION_TIMEOUT: Duration = Duration::from_mins(1);

/// How many sessions, and for how long.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SessionLimits {
    /// A session unused this long ends.
    pub idle_timeout: Duration,
    /// A session ends this long after it was opened, however busy.
    pub lifetime: Duration,
    /// Most sessions open at once.
    pub max_sessions: usize,
}

impl Default for SessionLimits {
    fn default() -> Self {
        Self {
            idle_timeout: Duration::from_hours(1),
            lifetime: Duration::from_hours(24),
            max_sessions: 4096,
        }
    }
}

struct Live {
    session: Session,
    origin: Origin,
    opened: Instant,
    last_used: Instant,
}

/// The open sessions of an authenticating server.
pub struct Sessions {
    live: Mutex<HashMap<[u8; 32], Live>>,
    next: AtomicU64,
    limits: SessionLimits,
}

impl Sessions {
    /// None open yet.
    #[must_use]
    pub fn new(limits: SessionLimits) -> Self {
        Self {
            live: Mutex::new(HashMap::new()),
            next: AtomicU64::new(1),
            limits,
        }
    }

    /// Its limits.
    #[must_use]
    pub fn limits(&self) -> SessionLimits {
        self.limits
    }

    fn live(&self) -> std::sync::MutexGuard<'_, HashMap<[u8; 32], Live>> {
        self.live.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn expired(&self, live: &Live, now: Instant) -> bool {
        now.duration_since(live.last_used) >= self.limits.idle_timeout
            || now.duration_since(live.opened) >= self.limits.lifetime
    }

    /// Opens a session for `origin` with `role`, named by `token`.
    ///
    /// # Errors
    /// [`Error::LimitExceeded`] when as many sessions are open as the server allows.
    pub fn open(&self, token: &str, origin: Origin, role: Role) -> Result<Session> {
        let now = Instant::now();
        let mut live = self.live();
        if live.len() >= self.limits.max_sessions {
            // Expired sessions go, and so do those whose token never came back (a client
            // that sends its password on every call opens one each time).
            live.retain(|_, l| {
                !self.expired(l, now)
                    && (l.session.established
                        || now.duration_since(l.opened) < UNCLAIMED_SESSION_TIMEOUT)
            });
        }
        if live.len() >= self.limits.max_sessions {
            return Err(Error::LimitExceeded {
                limit: Limit::Sessions,
                max: u64::try_from(self.limits.max_sessions).unwrap_or(u64::MAX),
            });
        }
        let principal = match &origin {
            Origin::User(name) => format!("user:{name}"),
            Origin::Token(name) => format!("token:{name}"),
        };
        let session = Session {
            id: Some(Arc::from(format!(
                "s{}",
                self.next.fetch_add(1, Ordering::Relaxed)
            ))),
            principal: Arc::from(principal),
            role,
            established: false,
        };
        live.insert(
            token_digest(token),
            Live {
                session: session.clone(),
                origin,
                opened: now,
                last_used: now,
            },
        );
        Ok(session)
    }

    /// The live session named by `token`, marked used.
    #[must_use]
    pub fn resolve(&self, token: &str) -> Option<Session> {
        let now = Instant::now();
        let key = token_digest(token);
        let mut live = self.live();
        let found = live.get_mut(&key)?;
        if self.expired(found, now) {
            live.remove(&key);
            return None;
        }
        found.last_used = now;
        found.session.established = true;
        Some(found.session.clone())
    }

    /// Ends the session whose id is `id`; that id, if it was open.
    pub fn close_id(&self, id: &str) -> Option<Arc<str>> {
        let mut live = self.live();
        let key = live
            .iter()
            .find(|(_, l)| l.session.id.as_deref() == Some(id))
            .map(|(key, _)| *key)?;
        live.remove(&key).and_then(|l| l.session.id)
    }

    /// Ends every session whose origin `keep` no longer accepts with the role it has; the ids
    /// of those ended.
    pub fn retain(&self, keep: impl Fn(&Origin, Role) -> bool) -> Vec<Arc<str>> {
        let mut ended = Vec::new();
        self.live().retain(|_, live| {
            let kept = keep(&live.origin, live.session.role);
            if !kept && let Some(id) = &live.session.id {
                ended.push(Arc::clone(id));
            }
            kept
        });
        ended
    }

    /// How many are open (expired ones not yet swept included).
    #[must_use]
    pub fn len(&self) -> usize {
        self.live().len()
    }

    /// Whether none is open.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_are_capped_and_end_with_their_origin() {
        let sessions = Sessions::new(SessionLimits {
            max_sessions: 2,
            ..SessionLimits::default()
        });
        let a = sessions
            .open("token-a", Origin::User("alice".into()), Role::Writer)
            .expect("a");
        sessions
            .open("token-b", Origin::Token("ci".into()), Role::Reader)
            .expect("b");
        let err = sessions
            .open("token-c", Origin::User("alice".into()), Role::Writer)
            .expect_err("over the cap");
        assert!(err.to_string().contains("--max-sessions"), "{err}");
        let resolved = sessions.resolve("token-a").expect("live");
        assert!(
            !a.established && resolved.established,
            "established once presented"
        );
        assert_eq!(resolved.id, a.id);
        assert_eq!(sessions.resolve("token-z"), None);
        let ended = sessions.retain(|origin, _| *origin != Origin::Token("ci".into()));
        assert_eq!(ended.len(), 1);
        assert_eq!(sessions.resolve("token-b"), None);
        let a_id = a.id.as_deref().expect("an id");
        assert_eq!(sessions.close_id(a_id), a.id);
        assert_eq!(sessions.close_id(a_id), None, "closed once");
        assert!(sessions.is_empty());
    }

    #[test]
    fn an_idle_session_ends() {
        let sessions = Sessions::new(SessionLimits {
            idle_timeout: Duration::ZERO,
            ..SessionLimits::default()
        });
        sessions
            .open("t", Origin::User("alice".into()), Role::Reader)
            .expect("opened");
        assert_eq!(sessions.resolve("t"), None);
    }

    #[test]
    fn roles_are_ordered() {
        let reader = Session {
            id: None,
            principal: Arc::from("user:r"),
            role: Role::Reader,
            established: true,
        };
        assert!(reader.require(Role::Reader, "read").is_ok());
        let err = reader
            .require(Role::Writer, "stage writes")
            .expect_err("refused");
        let text = err.to_string();
        assert!(text.contains("user:r") && text.contains("writer"), "{text}");
    }
}
