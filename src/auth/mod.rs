//! Who may do what: users and tokens with roles, read from a credentials file; the sessions
//! they open; and who a call's credentials make its caller ([`authenticator`]).
//!
//! The credentials file (`serve --auth-file`) holds one entry per line, never a secret in
//! clear:
//!
//! ```text
//! # moraine credentials
//! user alice writer $argon2id$v=19$m=19456,t=2,p=1$…
//! token nightly-export reader sha256:9f86d0…  expires=1798761600
//! ```
//!
//! A user's password is stored as an Argon2id PHC string; a token, 256 random bits, as its
//! SHA-256 (a slow hash adds nothing to a secret that cannot be guessed). `moraine user` and
//! `moraine token` edit the file; a running server rereads it on SIGHUP.

pub mod authenticator;
pub mod cli;
pub mod manage;
pub mod session;

use std::collections::BTreeMap;
use std::fmt;
use std::path::Path;
use std::str::FromStr;

use base64::Engine as _;
use sha2::{Digest as _, Sha256};

use crate::error::{Error, Result};
use crate::key_range::hex;

pub use authenticator::Authenticator;
pub use session::{Session, SessionLimits, Sessions};

/// What a caller may do. Each role may do everything the ones before it may.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    /// Queries, `DoGet`, metadata.
    Reader,
    /// Also transactions, ingest, DML and `DoPut`.
    Writer,
    /// Also token management.
    Admin,
}

impl Role {
    /// The role's name, as the credentials file and the command line spell it.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Role::Reader => "reader",
            Role::Writer => "writer",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Role {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        match text {
            "reader" => Ok(Role::Reader),
            "writer" => Ok(Role::Writer),
            "admin" => Ok(Role::Admin),
            other => Err(Error::InvalidRequest {
                reason: format!(
                    "role {:?} is not one of reader, writer, admin",
                    crate::error::excerpt(other)
                ),
            }),
        }
    }
}

/// A user who logs in with a password.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// What the user may do.
    pub role: Role,
    /// The password's Argon2id PHC string.
    pub password_hash: String,
}

/// A pre-issued bearer token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenEntry {
    /// What a caller with the token may do.
    pub role: Role,
    /// SHA-256 of the token.
    pub digest: [u8; 32],
    /// Seconds since the Unix epoch after which the token is refused, if it expires.
    pub expires: Option<u64>,
}

/// The users and tokens of a credentials file.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// By name.
    pub users: BTreeMap<String, User>,
    /// By name.
    pub tokens: BTreeMap<String, TokenEntry>,
}

/// Longest user or token name.
const MAX_NAME: usize = 64;

/// Checks a user or token name: 1 to 64 of `[A-Za-z0-9._@-]`.
///
/// # Errors
/// [`Error::InvalidRequest`] naming the name and the rule.
pub fn check_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'@' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::InvalidRequest {
            reason: format!(
                "name {:?} must be 1 to {MAX_NAME} characters of A-Z a-z 0-9 . _ @ -",
                crate::error::excerpt(name)
            ),
        })
    }
}

impl Credentials {
    /// Reads the credentials file at `path`.
    ///
    /// # Errors
    /// [`Error::Config`] when it cannot be read or a line does not parse (named by number).
    pub fn load(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|err| Error::Config {
            setting: "auth-file",
            reason: format!("{}: {err}", path.display()),
        })?;
        Self::parse(&text).map_err(|reason| Error::Config {
            setting: "auth-file",
            reason: format!("{}: {reason}", path.display()),
        })
    }

    /// Reads the credentials at `path`, or none when the file does not exist yet.
    ///
    /// # Errors
    /// As [`load`](Self::load), for a file that exists.
    pub fn load_or_default(path: &Path) -> Result<Self> {
        if path.exists() {
            Self::load(path)
        } else {
            Ok(Self::default())
        }
    }

    /// Parses the text of a credentials file.
    ///
    /// # Errors
    /// The first line that does not parse, by number.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let mut credentials = Self::default();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            credentials
                .parse_line(line)
                .map_err(|reason| format!("line {}: {reason}", index + 1))?;
        }
        Ok(credentials)
    }

    fn parse_line(&mut self, line: &str) -> std::result::Result<(), String> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        let (kind, name, role, secret, rest) = match fields.as_slice() {
            [kind, name, role, secret, rest @ ..] => (*kind, *name, *role, *secret, rest),
            _ => {
                return Err(
                    "expected `user NAME ROLE HASH` or `token NAME ROLE sha256:HEX`".into(),
                );
            }
        };
        check_name(name).map_err(|err| err.to_string())?;
        let role = Role::from_str(role).map_err(|err| err.to_string())?;
        match kind {
            "user" => {
                if !rest.is_empty() {
                    return Err(format!("user {name}: unexpected {:?}", rest.join(" ")));
                }
                argon2::PasswordHash::new(secret).map_err(|err| {
                    format!("user {name}: the password hash does not parse: {err}")
                })?;
                let user = User {
                    role,
                    password_hash: secret.to_owned(),
                };
                if self.users.insert(name.to_owned(), user).is_some() {
                    return Err(format!("user {name} is listed twice"));
                }
            }
            "token" => {
                let digest = secret
                    .strip_prefix("sha256:")
                    .and_then(decode_hex32)
                    .ok_or_else(|| format!("token {name}: expected sha256: and 64 hex digits"))?;
                let mut expires = None;
                for option in rest {
                    let seconds = option
                        .strip_prefix("expires=")
                        .and_then(|s| s.parse::<u64>().ok())
                        .ok_or_else(|| {
                            format!("token {name}: expected expires=SECONDS, got {option:?}")
                        })?;
                    expires = Some(seconds);
                }
                let token = TokenEntry {
                    role,
                    digest,
                    expires,
                };
                if self.tokens.insert(name.to_owned(), token).is_some() {
                    return Err(format!("token {name} is listed twice"));
                }
            }
            other => return Err(format!("unknown entry kind {other:?} (user or token)")),
        }
        Ok(())
    }

    /// The file's text.
    #[must_use]
    pub fn render(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::from(
            "# moraine credentials (serve --auth-file). Edit with `moraine user` and `moraine token`;\n\
             # a running server rereads this file on SIGHUP.\n",
        );
        for (name, user) in &self.users {
            let _ = writeln!(out, "user {name} {} {}", user.role, user.password_hash);
        }
        for (name, token) in &self.tokens {
            let _ = write!(
                out,
                "token {name} {} sha256:{}",
                token.role,
                hex(&token.digest)
            );
            if let Some(expires) = token.expires {
                let _ = write!(out, " expires={expires}");
            }
            out.push('\n');
        }
        out
    }

    /// Writes the file at `path` atomically (a sibling temporary file, then a rename),
    /// readable by its owner only.
    ///
    /// # Errors
    /// [`Error::Config`] when it cannot be written.
    pub fn store(&self, path: &Path) -> Result<()> {
        let io = |err: std::io::Error| Error::Config {
            setting: "auth-file",
            reason: format!("{}: {err}", path.display()),
        };
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(".tmp");
        let temporary = std::path::PathBuf::from(temporary);
        {
            use std::io::Write as _;
            let mut options = std::fs::OpenOptions::new();
            options.write(true).create(true).truncate(true);
            #[cfg(unix)]
            {
                use std::os::unix::fs::OpenOptionsExt as _;
                options.mode(0o600);
            }
            let mut file = options.open(&temporary).map_err(io)?;
            file.write_all(self.render().as_bytes()).map_err(io)?;
            file.sync_all().map_err(io)?;
        }
        std::fs::rename(&temporary, path).map_err(io)
    }

    /// The name and entry of the token `token`, if it is listed and has not expired at
    /// `now` (seconds since the epoch).
    #[must_use]
    pub fn token(&self, token: &str, now: u64) -> Option<(&str, &TokenEntry)> {
        let digest = token_digest(token);
        self.tokens
            .iter()
            .find(|(_, entry)| constant_time_eq(&entry.digest, &digest))
            .filter(|(_, entry)| entry.expires.is_none_or(|at| now < at))
            .map(|(name, entry)| (name.as_str(), entry))
    }

    /// Whether there is anything to log in with.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.users.is_empty() && self.tokens.is_empty()
    }
}

/// `N` bytes from the operating system's generator.
///
/// # Errors
/// [`Error::Internal`] when the generator is unavailable: secrets are never made any other
/// way.
pub fn random_bytes<const N: usize>() -> Result<[u8; N]> {
    let mut bytes = [0_u8; N];
    getrandom::fill(&mut bytes).map_err(|err| Error::Internal {
        context: "drawing random bytes for a secret",
        reason: format!("the operating system's generator failed: {err}"),
    })?;
    Ok(bytes)
}

/// `prefix` and `N` random bytes in hex: transaction ids, prepared-statement handles.
///
/// # Errors
/// As [`random_bytes`].
pub fn random_hex<const N: usize>(prefix: &str) -> Result<String> {
    Ok(format!("{prefix}{}", hex(&random_bytes::<N>()?)))
}

/// A new secret token: `prefix` and 256 random bits, base64url.
///
/// # Errors
/// As [`random_bytes`].
pub fn new_token(prefix: &str) -> Result<String> {
    let bytes = random_bytes::<32>()?;
    Ok(format!(
        "{prefix}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    ))
}

/// SHA-256 of a token.
#[must_use]
pub fn token_digest(token: &str) -> [u8; 32] {
    Sha256::digest(token.as_bytes()).into()
}

/// Hashes `password` with Argon2id (default parameters, a random salt).
///
/// # Errors
/// As [`random_bytes`]; [`Error::Internal`] if hashing fails.
pub fn hash_password(password: &str) -> Result<String> {
    use argon2::password_hash::{PasswordHasher as _, SaltString};
    let salt = SaltString::encode_b64(&random_bytes::<16>()?).map_err(|err| Error::Internal {
        context: "hashing a password",
        reason: err.to_string(),
    })?;
    argon2::Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .map(|hash| hash.to_string())
        .map_err(|err| Error::Internal {
            context: "hashing a password",
            reason: err.to_string(),
        })
}

/// Whether `password` matches the PHC string `hash`. Slow by design (tens of milliseconds):
/// call it off the async runtime.
#[must_use]
pub fn verify_password(hash: &str, password: &str) -> bool {
    use argon2::password_hash::PasswordVerifier as _;
    argon2::PasswordHash::new(hash).is_ok_and(|parsed| {
        argon2::Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok()
    })
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

fn decode_hex32(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    let mut out = [0_u8; 32];
    for (slot, pair) in out.iter_mut().zip(text.as_bytes().chunks(2)) {
        let pair = std::str::from_utf8(pair).ok()?;
        *slot = u8::from_str_radix(pair, 16).ok()?;
    }
    Some(out)
}

/// Seconds since the Unix epoch.
#[must_use]
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// `moraine user add`: adds (or replaces) user `name` with `role` and `password`.
///
/// # Errors
/// A bad name; an empty password; the file cannot be read or written.
pub fn add_user(path: &Path, name: &str, role: Role, password: &str) -> Result<()> {
    check_name(name)?;
    if password.is_empty() {
        return Err(Error::InvalidRequest {
            reason: "the password is empty".into(),
        });
    }
    let mut credentials = Credentials::load_or_default(path)?;
    credentials.users.insert(
        name.to_owned(),
        User {
            role,
            password_hash: hash_password(password)?,
        },
    );
    credentials.store(path)
}

/// `moraine user remove` and `moraine token revoke`: removes the user or token `name`;
/// whether there was one.
///
/// # Errors
/// The file cannot be read or written.
pub fn remove(path: &Path, name: &str, token: bool) -> Result<bool> {
    let mut credentials = Credentials::load_or_default(path)?;
    let removed = if token {
        credentials.tokens.remove(name).is_some()
    } else {
        credentials.users.remove(name).is_some()
    };
    if removed {
        credentials.store(path)?;
    }
    Ok(removed)
}

/// `moraine token create`: a new token `name` with `role`, expiring after `ttl` if given.
/// Returns the token, which is shown this once and stored only as its hash.
///
/// # Errors
/// A bad or taken name; the file cannot be read or written; no randomness.
pub fn create_token(
    path: &Path,
    name: &str,
    role: Role,
    ttl: Option<std::time::Duration>,
) -> Result<String> {
    check_name(name)?;
    let mut credentials = Credentials::load_or_default(path)?;
    if credentials.tokens.contains_key(name) {
        return Err(Error::AlreadyExists {
            what: crate::error::Named::Token(name.to_owned()),
            remedy: "revoke it first",
        });
    }
    let token = new_token("mrt_")?;
    credentials.tokens.insert(
        name.to_owned(),
        TokenEntry {
            role,
            digest: token_digest(&token),
            expires: ttl.map(|ttl| unix_now().saturating_add(ttl.as_secs())),
        },
    );
    credentials.store(path)?;
    Ok(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_file_round_trips_and_keeps_no_secret_in_clear() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("auth");
        add_user(&path, "alice", Role::Writer, "correct horse").expect("user");
        let token = create_token(
            &path,
            "ci",
            Role::Reader,
            Some(std::time::Duration::from_mins(1)),
        )
        .expect("token");
        let text = std::fs::read_to_string(&path).expect("read");
        assert!(!text.contains("correct horse"), "{text}");
        assert!(!text.contains(&token), "{text}");
        let credentials = Credentials::load(&path).expect("parses");
        assert_eq!(
            Credentials::parse(&credentials.render()),
            Ok(credentials.clone())
        );
        let alice = credentials.users.get("alice").expect("alice");
        assert_eq!(alice.role, Role::Writer);
        assert!(verify_password(&alice.password_hash, "correct horse"));
        assert!(!verify_password(&alice.password_hash, "correct horsf"));
        let now = unix_now();
        assert_eq!(credentials.token(&token, now).map(|(n, _)| n), Some("ci"));
        assert!(credentials.token(&token, now + 61).is_none(), "expired");
        assert!(credentials.token("mrt_made-up", now).is_none());
        assert!(remove(&path, "ci", true).expect("revoked"));
        assert!(
            Credentials::load(&path)
                .expect("parses")
                .token(&token, now)
                .is_none()
        );
    }

    #[test]
    fn bad_lines_are_named_by_number() {
        let err = Credentials::parse("# c\nuser bob writer not-a-hash\n").expect_err("bad hash");
        assert!(err.starts_with("line 2: user bob"), "{err}");
        let err = Credentials::parse("token t superuser sha256:00\n").expect_err("bad role");
        assert!(err.contains("superuser"), "{err}");
        let err = Credentials::parse("token t reader sha256:00\n").expect_err("short digest");
        assert!(err.contains("64 hex digits"), "{err}");
        assert!(check_name("a b").is_err());
        assert!(check_name(&"a".repeat(65)).is_err());
    }

    #[test]
    fn tokens_are_256_random_bits() {
        let a = new_token("mrt_").expect("token");
        let b = new_token("mrt_").expect("token");
        assert_ne!(a, b);
        assert_eq!(a.len(), 4 + 43);
    }
}
