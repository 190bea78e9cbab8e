//! Who a caller is: the credentials of an `authorization` header checked against the
//! credentials file, and the session they open or name. The Flight side's gate
//! (`flight::gate`) hands each call's header here and the [`Session`] found to the handlers
//! (which check roles).
//!
//! - `Basic` credentials (base64 with or without padding: the ADBC Go driver sends none)
//!   log in: on any call, not only Handshake, as the ADBC driver sends them on its first
//!   call. The response carries the new session's token as `authorization: Bearer …`.
//! - `Bearer` names a session opened by a login, or is a pre-issued token.
//! - An unauthenticated server (no credentials configured) gives every call full rights. It
//!   still hands out session tokens, so that a client's untagged calls (ADBC's ingest) join
//!   its open transaction, and what a session creates stays its own.

use std::path::PathBuf;
use std::sync::{Arc, RwLock};

use base64::Engine as _;

use super::session::{Origin, Session, SessionLimits, Sessions};
use super::{Credentials, new_token, unix_now, verify_password};
use crate::error::{Error, Result};
use crate::key_range::hex;

/// Most password checks running at once: Argon2 is slow by design, and a flood of logins
/// must not take every core.
const CONCURRENT_VERIFICATIONS: usize = 2;

/// What runs when a session ends because its user or token went away.
type SessionEndHook = Box<dyn Fn(&str) + Send + Sync>;

enum Mode {
    Open,
    Required {
        file: PathBuf,
        credentials: RwLock<Arc<Credentials>>,
    },
}

/// Who may call, and the sessions they hold.
pub struct Authenticator {
    mode: Mode,
    /// Held while the server edits its credentials file, so that edits do not interleave.
    pub(super) editing: tokio::sync::Mutex<()>,
    sessions: Sessions,
    verifying: tokio::sync::Semaphore,
    on_end: RwLock<Option<SessionEndHook>>,
}

/// A call let through: its caller, and the token to hand back when the call opened a
/// session.
#[derive(Debug, Clone)]
pub struct Admitted {
    /// The caller.
    pub session: Session,
    /// A new session's token, returned as `authorization: Bearer …`.
    pub issued: Option<String>,
}

impl Authenticator {
    /// No credentials: every caller may do everything.
    #[must_use]
    pub fn open() -> Self {
        Self::with_mode(Mode::Open, SessionLimits::default())
    }

    /// Callers log in with the users and tokens of the credentials file at `file`.
    ///
    /// # Errors
    /// [`Error::Config`] when the file cannot be read or parsed, or lists nobody.
    pub fn from_file(file: PathBuf, limits: SessionLimits) -> Result<Self> {
        let credentials = Credentials::load(&file)?;
        if credentials.is_empty() {
            return Err(Error::Config {
                setting: "auth-file",
                reason: format!(
                    "{} lists no user and no token, so nobody could call; add one with \
                     `moraine user add` or `moraine token create`",
                    file.display()
                ),
            });
        }
        Ok(Self::with_mode(
            Mode::Required {
                file,
                credentials: RwLock::new(Arc::new(credentials)),
            },
            limits,
        ))
    }

    fn with_mode(mode: Mode, limits: SessionLimits) -> Self {
        Self {
            mode,
            editing: tokio::sync::Mutex::new(()),
            sessions: Sessions::new(limits),
            verifying: tokio::sync::Semaphore::new(CONCURRENT_VERIFICATIONS),
            on_end: RwLock::new(None),
        }
    }

    /// Whether calls need credentials.
    #[must_use]
    pub fn requires_credentials(&self) -> bool {
        matches!(self.mode, Mode::Required { .. })
    }

    /// The credentials file, on a server that has one.
    pub(super) fn credentials_file(&self) -> Option<&std::path::Path> {
        match &self.mode {
            Mode::Open => None,
            Mode::Required { file, .. } => Some(file),
        }
    }

    /// Calls `on_end` with the id of each session that ends because its user or token was
    /// removed (so that its open transaction is rolled back).
    pub fn on_session_end(&self, on_end: impl Fn(&str) + Send + Sync + 'static) {
        *self
            .on_end
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Box::new(on_end));
    }

    pub(super) fn credentials(&self) -> Option<Arc<Credentials>> {
        match &self.mode {
            Mode::Open => None,
            Mode::Required { credentials, .. } => Some(Arc::clone(
                &credentials
                    .read()
                    .unwrap_or_else(std::sync::PoisonError::into_inner),
            )),
        }
    }

    /// Rereads the credentials file. Sessions of users or tokens no longer listed, or listed
    /// with another role, end. Returns how many sessions ended; on an unreadable file the
    /// credentials in force stay.
    ///
    /// # Errors
    /// [`Error::Config`] when the file cannot be read or parsed.
    pub fn reload(&self) -> Result<usize> {
        let Mode::Required { file, credentials } = &self.mode else {
            return Ok(0);
        };
        let fresh = Arc::new(Credentials::load(file)?);
        *credentials
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::clone(&fresh);
        let now = unix_now();
        let ended = self.sessions.retain(|origin, role| match origin {
            Origin::User(name) => fresh.users.get(name).is_some_and(|u| u.role == role),
            Origin::Token(name) => fresh
                .tokens
                .get(name)
                .is_some_and(|t| t.role == role && t.expires.is_none_or(|at| now < at)),
        });
        self.ended(&ended);
        Ok(ended.len())
    }

    fn ended(&self, ids: &[Arc<str>]) {
        if let Some(on_end) = self
            .on_end
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_ref()
        {
            for id in ids {
                on_end(id);
            }
        }
    }

    /// Ends the session `id` (`CloseSession`), and only it: another connection of the same
    /// pre-issued token keeps its own.
    pub fn close_session(&self, id: &str) {
        if let Some(id) = self.sessions.close_id(id) {
            self.ended(&[id]);
        }
    }

    /// Finds the caller of a call whose `authorization` header is as given, made on
    /// `connection` (its peer and local address, where the transport says). On an
    /// unauthenticated server, a call without a token opens a session when `opens_session`
    /// (the calls a client makes first and replays the answer's header from).
    ///
    /// A pre-issued token is a session per connection: clients that share one token (two
    /// mirrors, a loader and a notebook) each get their own, so that an untagged ingest joins
    /// the transaction its own connection began, and one client's `CloseSession` ends only
    /// its own session.
    ///
    /// # Errors
    /// [`Error::Unauthenticated`] for missing, malformed or wrong credentials;
    /// [`Error::LimitExceeded`] when a login finds the server at its session limit.
    pub async fn admit(
        &self,
        authorization: Option<&str>,
        opens_session: bool,
        connection: Option<&str>,
    ) -> Result<Admitted> {
        let credential = authorization.map(parse).transpose()?;
        let Some(credentials) = self.credentials() else {
            return Ok(open_admit(credential, opens_session));
        };
        match credential {
            None => Err(Error::Unauthenticated {
                reason: "this server needs credentials: Basic username and password, or a \
                         Bearer token",
            }),
            Some(Credential::Basic { user, password }) => {
                self.login(&credentials, &user, password).await
            }
            Some(Credential::Bearer(token)) => {
                if let Some((name, entry)) = credentials.token(&token, unix_now()) {
                    // The caller holds the token: the session is its own from the first call.
                    // Named by the token and the connection (a header cannot hold a newline).
                    let key = connection.map_or_else(|| token.clone(), |c| format!("{token}\n{c}"));
                    let session = match self.sessions.resolve(&key) {
                        Some(session) => session,
                        None => Session {
                            established: true,
                            ..self.sessions.open(
                                &key,
                                Origin::Token(name.to_owned()),
                                entry.role,
                            )?
                        },
                    };
                    return Ok(Admitted {
                        session,
                        issued: None,
                    });
                }
                let listed = super::token_digest(&token);
                if let Some((name, _)) = credentials.tokens.iter().find(|(_, t)| t.digest == listed)
                {
                    // A listed token that has expired: its sessions (one per connection) end
                    // too.
                    let origin = Origin::Token(name.clone());
                    let ended = self.sessions.retain(|o, _| *o != origin);
                    self.ended(&ended);
                    return Err(Error::Unauthenticated {
                        reason: "the bearer token has expired",
                    });
                }
                self.sessions
                    .resolve(&token)
                    .map(|session| Admitted {
                        session,
                        issued: None,
                    })
                    .ok_or(Error::Unauthenticated {
                        reason: "the bearer token is unknown, expired or revoked; log in again",
                    })
            }
        }
    }

    async fn login(
        &self,
        credentials: &Credentials,
        user: &str,
        password: String,
    ) -> Result<Admitted> {
        let refused = Error::Unauthenticated {
            reason: "wrong username or password",
        };
        // An unknown user costs a hash check too, so that timing does not tell which users
        // exist.
        let (hash, role) = match credentials.users.get(user) {
            Some(found) => (found.password_hash.clone(), Some(found.role)),
            None => (DUMMY_HASH.clone(), None),
        };
        let permit = self
            .verifying
            .acquire()
            .await
            .map_err(|_| Error::Unauthenticated {
                reason: "the server is shutting down",
            })?;
        let matches = tokio::task::spawn_blocking(move || verify_password(&hash, &password))
            .await
            .map_err(|err| Error::Internal {
                context: "checking a password",
                reason: err.to_string(),
            })?;
        drop(permit);
        let Some(role) = role.filter(|_| matches) else {
            tracing::info!(user = %crate::error::excerpt(user), "refused a login");
            return Err(refused);
        };
        let token = new_token("mrs_")?;
        let session = self
            .sessions
            .open(&token, Origin::User(user.to_owned()), role)?;
        Ok(Admitted {
            session,
            issued: Some(token),
        })
    }
}

/// An Argon2id hash of a random password nobody knows, checked for unknown users.
static DUMMY_HASH: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    new_token("")
        .and_then(|password| super::hash_password(&password))
        .unwrap_or_default()
});

fn open_admit(credential: Option<Credential>, opens_session: bool) -> Admitted {
    match credential {
        Some(Credential::Bearer(token)) => Admitted {
            session: Session::unauthenticated(Some(open_session_id(&token))),
            issued: None,
        },
        _ if opens_session => match new_token("mrs_") {
            Ok(token) => Admitted {
                session: Session {
                    established: false,
                    ..Session::unauthenticated(Some(open_session_id(&token)))
                },
                issued: Some(token),
            },
            // Without randomness no session can be opened safely; the call runs without one.
            Err(err) => {
                tracing::error!("{err}");
                Admitted {
                    session: Session::unauthenticated(None),
                    issued: None,
                }
            }
        },
        _ => Admitted {
            session: Session::unauthenticated(None),
            issued: None,
        },
    }
}

/// An unauthenticated server's session id for `token`: derived from the token, which the
/// server does not keep.
fn open_session_id(token: &str) -> Arc<str> {
    let digest = super::token_digest(token);
    Arc::from(format!("o{}", hex(digest.get(..16).unwrap_or_default())))
}

enum Credential {
    Basic { user: String, password: String },
    Bearer(String),
}

fn parse(value: &str) -> Result<Credential> {
    let (scheme, rest) = value.trim().split_once(' ').ok_or(Error::Unauthenticated {
        reason: "the authorization header is not `Basic …` or `Bearer …`",
    })?;
    let rest = rest.trim();
    if scheme.eq_ignore_ascii_case("bearer") && !rest.is_empty() {
        return Ok(Credential::Bearer(rest.to_owned()));
    }
    if scheme.eq_ignore_ascii_case("basic") {
        let decoded = BASIC
            .decode(rest)
            .ok()
            .and_then(|bytes| String::from_utf8(bytes).ok())
            .ok_or(Error::Unauthenticated {
                reason: "the Basic credentials are not base64 of UTF-8 `user:password`",
            })?;
        let (user, password) = decoded.split_once(':').ok_or(Error::Unauthenticated {
            reason: "the Basic credentials have no `:` between user and password",
        })?;
        return Ok(Credential::Basic {
            user: user.to_owned(),
            password: password.to_owned(),
        });
    }
    Err(Error::Unauthenticated {
        reason: "the authorization header is not `Basic …` or `Bearer …`",
    })
}

/// Standard base64, padding optional.
const BASIC: base64::engine::GeneralPurpose = base64::engine::GeneralPurpose::new(
    &base64::alphabet::STANDARD,
    base64::engine::GeneralPurposeConfig::new()
        .with_decode_padding_mode(base64::engine::DecodePaddingMode::Indifferent),
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_decode_with_or_without_padding() {
        for header in [
            "Basic YWxpY2U6cHc=",
            "Basic YWxpY2U6cHc",
            "basic  YWxpY2U6cHc= ",
        ] {
            match parse(header) {
                Ok(Credential::Basic { user, password }) => {
                    assert_eq!((user.as_str(), password.as_str()), ("alice", "pw"));
                }
                _ => panic!("{header} did not parse as Basic"),
            }
        }
        assert!(matches!(parse("Bearer abc"), Ok(Credential::Bearer(t)) if t == "abc"));
        assert!(parse("Basic !!!").is_err());
        assert!(parse("Digest x").is_err());
        assert!(parse("Bearer").is_err());
    }

    #[tokio::test]
    async fn a_pre_issued_token_is_a_session_per_connection() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let file = dir.path().join("credentials");
        let token = crate::auth::create_token(&file, "shared", crate::auth::Role::Writer, None)
            .expect("a token");
        let auth = Authenticator::from_file(file, SessionLimits::default()).expect("loads");
        let header = format!("Bearer {token}");
        let id = |admitted: Admitted| {
            assert!(
                admitted.issued.is_none(),
                "the caller already holds its token"
            );
            admitted.session.id.expect("a session")
        };
        let admit = |connection: &'static str| {
            let (auth, header) = (&auth, header.clone());
            async move {
                id(auth
                    .admit(Some(&header), true, Some(connection))
                    .await
                    .expect("admitted"))
            }
        };
        let first = admit("10.0.0.1:5000>10.0.0.2:50051").await;
        let again = admit("10.0.0.1:5000>10.0.0.2:50051").await;
        let second = admit("10.0.0.1:5001>10.0.0.2:50051").await;
        assert_eq!(first, again, "one connection keeps its session");
        assert_ne!(
            first, second,
            "two connections of one token share no session"
        );
        auth.close_session(&second);
        assert_eq!(
            admit("10.0.0.1:5000>10.0.0.2:50051").await,
            first,
            "closing one connection's session leaves the other's"
        );
        assert_ne!(
            admit("10.0.0.1:5001>10.0.0.2:50051").await,
            second,
            "a closed session is not resumed"
        );
    }

    #[test]
    fn the_dummy_hash_parses_and_matches_nothing_guessable() {
        assert!(argon2::PasswordHash::new(&DUMMY_HASH).is_ok());
        assert!(!verify_password(&DUMMY_HASH, ""));
    }
}
