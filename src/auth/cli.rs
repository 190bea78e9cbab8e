//! `moraine user` and `moraine token`: edit a credentials file. A running server picks the
//! change up at its next SIGHUP.

use std::str::FromStr as _;

use super::{Credentials, Role};
use crate::config::{TokenCommand, UserCommand};
use crate::error::{Error, Result};

/// Runs `moraine user …`.
///
/// # Errors
/// A bad name, role or password; the file cannot be read or written.
pub fn user(command: UserCommand) -> Result<()> {
    match command {
        UserCommand::Add {
            name,
            role,
            auth_file,
        } => {
            let role = Role::from_str(&role)?;
            let password = password()?;
            super::add_user(&auth_file, &name, role, &password)?;
            println!("user {name} ({role}) saved in {}", auth_file.display());
        }
        UserCommand::Remove { name, auth_file } => {
            if !super::remove(&auth_file, &name, false)? {
                return Err(Error::NotFound {
                    what: crate::error::Named::User {
                        name: name.clone(),
                        file: auth_file.clone(),
                    },
                });
            }
            println!("user {name} removed from {}", auth_file.display());
        }
    }
    Ok(())
}

/// Runs `moraine token …`.
///
/// # Errors
/// A bad name or role; the file cannot be read or written.
pub fn token(command: TokenCommand) -> Result<()> {
    match command {
        TokenCommand::Create {
            name,
            role,
            ttl,
            auth_file,
        } => {
            let role = Role::from_str(&role)?;
            let token = super::create_token(
                &auth_file,
                &name,
                role,
                ttl.map(std::time::Duration::from_secs),
            )?;
            // The token alone on stdout, for scripts; what it is on stderr.
            eprintln!(
                "token {name} ({role}) saved in {}; it is shown only now:",
                auth_file.display()
            );
            println!("{token}");
        }
        TokenCommand::List { auth_file } => {
            let credentials = Credentials::load_or_default(&auth_file)?;
            let now = super::unix_now();
            for (name, entry) in &credentials.tokens {
                let expiry = match entry.expires {
                    None => "never expires".to_owned(),
                    Some(at) if at <= now => format!("expired (at {at})"),
                    Some(at) => format!("expires at {at} (in {} s)", at - now),
                };
                println!("{name}\t{}\t{expiry}", entry.role);
            }
        }
        TokenCommand::Revoke { name, auth_file } => {
            if !super::remove(&auth_file, &name, true)? {
                return Err(Error::NotFound {
                    what: crate::error::Named::TokenIn {
                        name: name.clone(),
                        file: auth_file.clone(),
                    },
                });
            }
            println!("token {name} revoked in {}", auth_file.display());
        }
    }
    Ok(())
}

/// The password for `user add`: `MORAINE_PASSWORD`, else the first line of standard input.
fn password() -> Result<String> {
    if let Ok(password) = std::env::var("MORAINE_PASSWORD") {
        return Ok(password);
    }
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .map_err(|err| Error::InvalidRequest {
            reason: format!("reading the password from standard input: {err}"),
        })?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}
