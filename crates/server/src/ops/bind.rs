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
    let stored = {
        let server = server.clone();
        let dn = dn.clone();
        tokio::task::spawn_blocking(move || -> OpResult<Vec<Vec<u8>>> {
            let rtxn = server.store.read()?;
            let view = rtxn.view();
            let Ok(id) = super::resolve(&view, &dn) else {
                return Ok(Vec::new());
            };
            let attrs = view.attrs(id)?.unwrap_or_default();
            Ok(attrs
                .into_iter()
                .filter(|a| {
                    a.desc
                        .split(';')
                        .next()
                        .is_some_and(|b| b.eq_ignore_ascii_case("userPassword"))
                })
                .flat_map(|a| a.values)
                .collect())
        })
        .await
        .map_err(|_| LdapError::new(ResultCode::OTHER, "bind task failed"))??
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

/// Password hashing is slow by design: keep it off the async threads.
async fn verify(clear: Vec<u8>, stored: Vec<Vec<u8>>) -> bool {
    tokio::task::spawn_blocking(move || stored.iter().any(|s| password::verify_password(&clear, s)))
        .await
        .unwrap_or(false)
}
