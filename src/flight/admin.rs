//! Admin actions over plain Flight: managing the bearer tokens of the server's credentials
//! file. Each is a `DoAction` whose body and one result are JSON, so that a pyarrow.flight
//! user can call it without protobuf:
//!
//! | action        | body                                               | result                                        |
//! |---------------|----------------------------------------------------|-----------------------------------------------|
//! | `CreateToken` | `{"name": N, "role": R, "ttl_seconds": S}` (S optional) | `{"name", "role", "expires", "token"}`   |
//! | `ListTokens`  | empty, or `{}`                                     | `{"tokens": [{"name", "role", "expires"}]}`   |
//! | `RevokeToken` | `{"name": N}`                                      | `{"name", "sessions_ended"}`                  |
//!
//! `expires` is seconds since the Unix epoch, or null. Only an admin may call them.

use std::str::FromStr as _;
use std::time::Duration;

use arrow_flight::ActionType;
use serde_json::{Map, Value, json};

use super::service::MoraineSqlService;
use crate::auth::{Role, Session};
use crate::error::{Error, Part, Result};

/// Creates a token.
pub(crate) const CREATE_TOKEN: &str = "CreateToken";
/// Lists the tokens.
pub(crate) const LIST_TOKENS: &str = "ListTokens";
/// Revokes a token.
pub(crate) const REVOKE_TOKEN: &str = "RevokeToken";

/// Longest action body read.
const MAX_BODY: usize = 4096;

/// Whether `kind` names an admin action.
pub(crate) fn is_admin_action(kind: &str) -> bool {
    [CREATE_TOKEN, LIST_TOKENS, REVOKE_TOKEN].contains(&kind)
}

/// The admin actions, as `ListActions` describes them.
pub(crate) fn action_types() -> Vec<ActionType> {
    let describe = |kind: &str, description: &str| ActionType {
        r#type: kind.to_owned(),
        description: description.to_owned(),
    };
    vec![
        describe(
            CREATE_TOKEN,
            "Admin: creates a bearer token. Body: JSON {\"name\", \"role\", \"ttl_seconds\"?}. \
             Result: JSON {\"name\", \"role\", \"expires\", \"token\"}; the token is shown only \
             here.",
        ),
        describe(
            LIST_TOKENS,
            "Admin: lists the bearer tokens, without secrets. Result: JSON {\"tokens\": [...]}.",
        ),
        describe(
            REVOKE_TOKEN,
            "Admin: revokes a bearer token and ends its sessions. Body: JSON {\"name\"}.",
        ),
    ]
}

impl MoraineSqlService {
    /// Runs admin action `kind` with `body` for `session`; the result's JSON.
    ///
    /// # Errors
    /// [`Error::PermissionDenied`] for a caller that is not an admin; [`Error::Malformed`]
    /// for a body that is not the action's JSON; as the token operations otherwise.
    pub(crate) async fn admin_action(
        &self,
        kind: &str,
        body: &[u8],
        session: &Session,
    ) -> Result<Vec<u8>> {
        session.require(Role::Admin, "token management")?;
        let fields = parse_body(kind, body)?;
        let result = match kind {
            CREATE_TOKEN => {
                let name = text_field(kind, &fields, "name")?;
                let role = Role::from_str(&text_field(kind, &fields, "role")?)?;
                let ttl = match fields.get("ttl_seconds") {
                    None | Some(Value::Null) => None,
                    Some(value) => Some(Duration::from_secs(value.as_u64().ok_or_else(|| {
                        Error::InvalidRequest {
                            reason: format!(
                                "{kind}: ttl_seconds must be a whole number of seconds"
                            ),
                        }
                    })?)),
                };
                let token = self.auth.create_token(name.clone(), role, ttl).await?;
                let expires = self
                    .auth
                    .list_tokens()?
                    .into_iter()
                    .find(|listed| listed.name == name)
                    .and_then(|listed| listed.expires);
                tracing::info!(by = %session.principal, token = %name, %role, "created a token");
                json!({"name": name, "role": role.name(), "expires": expires, "token": token})
            }
            LIST_TOKENS => {
                let tokens: Vec<Value> = self
                    .auth
                    .list_tokens()?
                    .into_iter()
                    .map(|listed| {
                        json!({
                            "name": listed.name,
                            "role": listed.role.name(),
                            "expires": listed.expires,
                        })
                    })
                    .collect();
                json!({ "tokens": tokens })
            }
            REVOKE_TOKEN => {
                let name = text_field(kind, &fields, "name")?;
                let ended = self.auth.revoke_token(name.clone()).await?;
                tracing::info!(by = %session.principal, token = %name, sessions_ended = ended, "revoked a token");
                json!({ "name": name, "sessions_ended": ended })
            }
            other => {
                return Err(Error::Unsupported {
                    what: format!("action {}", crate::error::excerpt(other)),
                });
            }
        };
        Ok(result.to_string().into_bytes())
    }
}

fn parse_body(kind: &str, body: &[u8]) -> Result<Map<String, Value>> {
    if body.len() > MAX_BODY {
        return Err(Error::InvalidRequest {
            reason: format!(
                "{kind}: the body holds {} bytes, over the {MAX_BODY} an admin action may",
                body.len()
            ),
        });
    }
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(Map::new());
    }
    match serde_json::from_slice(body) {
        Ok(Value::Object(fields)) => Ok(fields),
        Ok(_) => Err(Error::Malformed {
            part: Part::AdminBody(kind.to_owned()),
            problem: "must be a JSON object".into(),
        }),
        Err(err) => Err(Error::Malformed {
            part: Part::AdminBody(kind.to_owned()),
            problem: format!("is not JSON: {err}"),
        }),
    }
}

fn text_field(kind: &str, fields: &Map<String, Value>, name: &str) -> Result<String> {
    fields
        .get(name)
        .and_then(Value::as_str)
        .map(str::to_owned)
        .ok_or_else(|| Error::InvalidRequest {
            reason: format!("{kind}: the body needs \"{name}\", a string"),
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_are_json_objects_within_bounds() {
        assert!(parse_body(CREATE_TOKEN, b"").expect("empty").is_empty());
        let fields = parse_body(CREATE_TOKEN, br#"{"name": "ci", "role": "reader"}"#).expect("ok");
        assert_eq!(
            text_field(CREATE_TOKEN, &fields, "name").expect("name"),
            "ci"
        );
        let err = text_field(CREATE_TOKEN, &fields, "ttl").expect_err("absent");
        assert!(err.to_string().contains("\"ttl\""), "{err}");
        for bad in [&b"[1]"[..], b"{", b"\"x\""] {
            assert!(parse_body(REVOKE_TOKEN, bad).is_err(), "{bad:?}");
        }
        let err = parse_body(LIST_TOKENS, &vec![b' '; MAX_BODY + 1]).expect_err("too long");
        assert!(err.to_string().contains("4096"), "{err}");
    }
}
