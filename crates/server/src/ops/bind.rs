//! Bind (RFC 4511 4.2, RFC 4513 5.1): anonymous and simple.

use std::sync::Arc;

use pando_proto::{BindAuth, BindRequest, ResultCode};

use crate::error::{LdapError, OpResult};
use crate::password;
use crate::state::{Identity, Server};

/// Authenticate; the new identity on success. Failed binds leave the
/// connection anonymous (the caller resets it).
pub async fn bind(server: &Arc<Server>, req: BindRequest) -> OpResult<Identity> {
    if req.version != 3 {
        return Err(LdapError::protocol(format!(
            "LDAP version {} is not supported",
            req.version
        )));
    }
    let pw = match req.auth {
        BindAuth::Simple(pw) => pw,
        BindAuth::Sasl { mechanism, .. } => {
            return Err(LdapError::new(
                ResultCode::AUTH_METHOD_NOT_SUPPORTED,
                format!("SASL mechanism '{mechanism}' is not supported"),
            ))
        }
    };
    if req.name.is_empty() {
        if pw.is_empty() {
            return Ok(Identity::Anonymous);
        }
        return Err(invalid());
    }
    if pw.is_empty() {
        // RFC 4513 5.1.2: unauthenticated binds are refused by default.
        return Err(LdapError::unwilling(
            "unauthenticated bind (DN with no password) disallowed",
        ));
    }
    let dn = super::parse_dn(&req.name)?;
    let norm = server
        .schema
        .normalize_dn(&dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN: {e}")))?;
    if norm == server.root_dn_norm {
        let hash = server.root_pw_hash.read().ok().and_then(|h| h.clone());
        if let Some(hash) = hash {
            if verify(pw.clone(), vec![hash.into_bytes()]).await {
                return Ok(Identity::Root { dn: req.name });
            }
        }
        // A root DN with no password may still exist as an entry below.
    }
    // One indexed lookup: cheaper inline than a handoff to a blocking thread.
    let stored: Vec<Vec<u8>> = {
        let rtxn = server.store.read()?;
        let view = rtxn.view();
        match super::resolve(&view, &dn) {
            Ok(id) => view
                .attrs(id)?
                .unwrap_or_default()
                .into_iter()
                .filter(|a| {
                    a.desc
                        .split(';')
                        .next()
                        .is_some_and(|b| b.eq_ignore_ascii_case("userPassword"))
                })
                .flat_map(|a| a.values)
                .collect(),
            Err(_) => Vec::new(),
        }
    };
    // The same answer whether the entry is missing, has no password or the
    // password is wrong: a bind must not reveal which DNs exist.
    if !stored.is_empty() && verify(pw, stored).await {
        return Ok(Identity::User { dn: req.name, norm });
    }
    Err(invalid())
}

fn invalid() -> LdapError {
    LdapError::new(ResultCode::INVALID_CREDENTIALS, "")
}

/// Salted-digest schemes take microseconds; key-stretching ones (argon2,
/// bcrypt, crypt, PBKDF2) take milliseconds by design.
fn is_cheap(stored: &[u8]) -> bool {
    const CHEAP: &[&str] = &[
        "{SHA}",
        "{SSHA}",
        "{SHA256}",
        "{SSHA256}",
        "{SHA384}",
        "{SSHA384}",
        "{SHA512}",
        "{SSHA512}",
    ];
    if stored.first() != Some(&b'{') {
        return true; // clear text
    }
    CHEAP
        .iter()
        .any(|p| stored.len() >= p.len() && stored[..p.len()].eq_ignore_ascii_case(p.as_bytes()))
}

/// Verify on the calling thread when every stored value is cheap to check,
/// otherwise on a blocking thread so slow hashes never stall the async ones.
async fn verify(clear: Vec<u8>, stored: Vec<Vec<u8>>) -> bool {
    if stored.iter().all(|s| is_cheap(s)) {
        return stored.iter().any(|s| password::verify_password(&clear, s));
    }
    tokio::task::spawn_blocking(move || stored.iter().any(|s| password::verify_password(&clear, s)))
        .await
        .unwrap_or(false)
}
