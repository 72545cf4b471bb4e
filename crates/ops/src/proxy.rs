//! Proxied authorization v2 (RFC 4370): an operation runs as another
//! identity when its requester holds the `proxy` right on that identity's
//! entry (docs/access-control.md). Settled when the operation is made, so
//! everything after it — access checks, modifiersName, the logs, WhoAmI —
//! sees only the identity it runs as.
//!
//! The authzId (RFC 4513 5.2.1.8) is `dn:<DN>` (an existing entry),
//! `u:<name>` (the one entry under a suffix whose `uid` is the name) or
//! empty (anonymous). Anything else, an identity that is not found, or a
//! requester without the right, is authorizationDenied (123), with a
//! message that does not say which. Two more refusals keep the right from
//! reaching further than the rules say:
//! - anonymous only for administrators: rules are first-match, so a rule
//!   that denies a DN and then grants "anyone" would be escaped by
//!   becoming anonymous;
//! - an identity holding the administrator (or break-glass) role only for
//!   a requester that holds it too: the role is not part of an entry's
//!   access rules, so a `proxy` right on a subtree must not hand it over.
//!
//! The identity keeps who asked (`Identity::proxied_by`), which the audit
//! log records; each decision is logged at info level.

use pando_model::Dn;
use pando_proto::{Ava, Filter, ResultCode};
use pando_store::{Lookup, View};

use crate::error::{LdapError, OpResult};
use crate::state::Server;
use pando_access::acl::{self, Access};
use pando_access::Identity;

/// The identity `who` asks to act as, if it may.
pub fn assume(server: &Server, who: &Identity, authz: &str) -> OpResult<Identity> {
    let denied = || {
        LdapError::new(
            ResultCode::AUTHORIZATION_DENIED,
            "not authorized to act as the proxied identity",
        )
    };
    let refuse = |why: &str| {
        tracing::info!(
            requester = who.dn(),
            authz,
            why,
            "proxied authorization denied"
        );
        denied()
    };
    if authz.is_empty() || authz == "dn:" {
        if !(who.is_admin() || who.is_break_glass() || who.is_anonymous()) {
            return Err(refuse("only administrators may act as anonymous"));
        }
        return Ok(Identity::anonymous(who.session.clone()).proxied_by(who));
    }
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    let id = if let Some(dn) = authz.strip_prefix("dn:") {
        let dn = Dn::parse(dn).map_err(|_| refuse("not a DN"))?;
        match view.lookup(&dn)? {
            Ok(Lookup::Found(id)) => id,
            _ => return Err(refuse("no such entry")),
        }
    } else if let Some(name) = authz.strip_prefix("u:") {
        by_uid(server, &view, name)?.ok_or_else(|| refuse("no single entry with that uid"))?
    } else {
        return Err(refuse("not a dn: or u: identity"));
    };
    let (dn, norm) = view.dn_pair(id)?;
    let mut access = Access::new(&server.acl, who);
    if !access.unrestricted() {
        let entry = super::stored_entry(&view, id)?;
        let rules = access.entry(&server.schema, &norm, &entry);
        if !access.allows(Some(&view), &rules, &norm, None, acl::PROXY) {
            return Err(refuse("no proxy right on the entry"));
        }
    }
    let target = Identity::authenticated(dn, norm, who.session.clone())
        .with_admin_from(&server.root_dn_norm, &server.auth);
    if (target.is_admin() && !who.is_admin()) || (target.is_break_glass() && !who.is_break_glass())
    {
        return Err(refuse("the identity holds a role the requester does not"));
    }
    tracing::info!(
        requester = who.dn(),
        as_ = target.dn(),
        "proxied authorization"
    );
    Ok(target.proxied_by(who))
}

/// The one entry under a suffix whose uid is `name` (equality index, else
/// nothing: an unindexed scan per proxied operation is not worth it).
pub fn by_uid(
    server: &Server,
    view: &View<'_>,
    name: &str,
) -> OpResult<Option<pando_store::EntryId>> {
    let filter = Filter::Equality(Ava {
        attr: "uid".into(),
        value: name.as_bytes().to_vec(),
    });
    match super::unique_indexed(server, view, None, &filter)? {
        super::Unique::One(id) if server.suffix_of(&super::norm_dn_of(view, id)?).is_some() => {
            Ok(Some(id))
        }
        _ => Ok(None),
    }
}
