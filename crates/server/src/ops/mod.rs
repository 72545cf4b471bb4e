//! LDAP operations, one file each. Every operation takes the server state,
//! the caller's identity (a copy fixed when it started) and its request, and
//! returns an LDAP result; searches also stream entries to the connection.

pub mod bind;
pub mod compare;
pub mod extended;
pub mod search;
pub mod special;
pub mod write;

use pando_model::Dn;
use pando_proto::ResultCode;
use pando_store::{EntryId, Lookup, View};

use crate::error::{LdapError, OpResult};
use crate::state::{Identity, Server};

/// Parse a DN from a request.
pub fn parse_dn(s: &str) -> OpResult<Dn> {
    Dn::parse(s).map_err(|e| LdapError::invalid_dn(format!("invalid DN '{s}': {e}")))
}

/// Normalised RDNs of `dn`, or invalidDNSyntax naming the problem.
pub fn norm_rdns(view: &View<'_>, dn: &Dn) -> OpResult<Vec<String>> {
    view.normalize_rdns(dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN '{dn}': {e}")))
}

/// Resolve an existing entry, or noSuchObject with the deepest existing
/// ancestor as matchedDN (RFC 4511 4.1.9).
pub fn resolve(view: &View<'_>, dn: &Dn) -> OpResult<EntryId> {
    let rdns = norm_rdns(view, dn)?;
    match view.lookup_norm(&rdns)? {
        Lookup::Found(id) => Ok(id),
        Lookup::Missing { matched } => Err(no_such_object(view, matched)?),
    }
}

pub fn no_such_object(view: &View<'_>, matched: Option<EntryId>) -> OpResult<LdapError> {
    let e = LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object");
    Ok(match matched {
        Some(m) => e.with_matched(view.dn_string(m)?),
        None => e,
    })
}

/// Writes need an authenticated administrator; users may change only their
/// own password (`self_password`). Anonymous callers are told to
/// authenticate (strongerAuthRequired), as slapd does.
pub fn require_write(
    server: &Server,
    who: &Identity,
    target_norm: &str,
    self_password: bool,
) -> OpResult<()> {
    let _ = server;
    if who.is_admin() {
        Ok(())
    } else if who.is_anonymous() {
        Err(LdapError::new(
            ResultCode::STRONGER_AUTH_REQUIRED,
            "modifications require authentication",
        ))
    } else if self_password && who.norm() == target_norm {
        Ok(())
    } else {
        Err(LdapError::access("no write access to the target entry"))
    }
}
