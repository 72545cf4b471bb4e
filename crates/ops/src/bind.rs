//! Bind (RFC 4511 4.2, RFC 4513): anonymous, simple, and SASL EXTERNAL.

use std::sync::Arc;

use pando_model::{Dn, Entry};
use pando_proto::{BindAuth, BindRequest, Control, ResultCode};
use pando_store::{EntryId, Lookup, View};

use crate::error::{LdapError, OpResult};
use crate::state::Server;
use pando_access::acl;
use pando_access::auth::{peercred_dn, MapTarget};
use pando_access::{Identity, Session};

/// Authenticate; the new identity on success, with the response controls
/// (the password policy's, when `wants_policy`). Failed binds leave the
/// connection anonymous (the caller resets it).
pub async fn bind(
    server: &Arc<Server>,
    req: BindRequest,
    session: &Arc<Session>,
    wants_policy: bool,
) -> OpResult<(Identity, Vec<Control>)> {
    if req.version != 3 {
        return Err(LdapError::protocol(format!(
            "LDAP version {} is not supported",
            req.version
        )));
    }
    let pw = match req.auth {
        BindAuth::Simple(pw) => pw,
        BindAuth::Sasl {
            mechanism,
            credentials,
        } => {
            if mechanism.eq_ignore_ascii_case("EXTERNAL") {
                return external(server, session, credentials.as_deref()).map(|w| (w, Vec::new()));
            }
            return Err(LdapError::new(
                ResultCode::AUTH_METHOD_NOT_SUPPORTED,
                format!("SASL mechanism '{mechanism}' is not supported"),
            ));
        }
    };
    if req.name.is_empty() {
        if pw.is_empty() {
            return Ok((Identity::anonymous(session.clone()), Vec::new()));
        }
        return Err(invalid());
    }
    if pw.is_empty() {
        // RFC 4513 5.1.2: unauthenticated binds are refused by default.
        return Err(LdapError::unwilling(
            "unauthenticated bind (DN with no password) disallowed",
        ));
    }
    if server.auth.require_secure_binds && !session.tls && session.peer_cred.is_none() {
        return Err(LdapError::new(
            ResultCode::CONFIDENTIALITY_REQUIRED,
            "simple binds with a password need TLS (StartTLS or ldaps://) or ldapi",
        ));
    }
    // Normalised once: the RDNs find the entry, their join is the identity.
    let (rdns, norm) = super::bind_dn_rdns(server, &req.name)?;
    let attempt = server.rt.throttle.begin(&norm, session).await?;
    let policy = server.policy.as_deref();
    // Looked at before the account is read: a failure no longer pending
    // then was committed before the read.
    let pending = policy.is_some_and(|p| p.has_pending(&norm));
    let (ok, account, upgrade) = check_simple(
        server,
        session,
        &req.name,
        &rdns,
        &norm,
        pw,
        policy.is_some(),
    )
    .await?;
    let verdict = match (policy, account) {
        (Some(p), Some(account)) => Some(
            p.judge_bind(server, &norm, account, pending, ok.is_some(), wants_policy)
                .await?,
        ),
        _ => None,
    };
    conclude(server, session, &norm, attempt, ok, verdict, upgrade).await
}

/// The bind's answer once the password and the policy have spoken: the
/// throttle told of the outcome, an upgrade made on success, the identity
/// restricted when the policy says so.
async fn conclude(
    server: &Arc<Server>,
    session: &Arc<Session>,
    norm: &str,
    attempt: crate::throttle::Attempt<'_>,
    ok: Option<Identity>,
    verdict: Option<crate::seams::BindVerdict>,
    upgrade: Upgrade,
) -> OpResult<(Identity, Vec<Control>)> {
    use crate::seams::BindVerdict;
    match (ok, verdict) {
        (Some(_), Some(BindVerdict::Refuse(e))) | (None, Some(BindVerdict::Refuse(e))) => {
            attempt.failed().await;
            Err(e)
        }
        (Some(who), verdict) => {
            attempt.succeeded();
            // Only now, with the bind settled: an upgrade's work must not
            // tell a right password from a wrong one where the answer
            // does not (a locked account).
            if let Some((clear, weak)) = upgrade {
                super::rehash::after_bind(server, norm, &clear, &weak).await;
            }
            let who = who
                .with_session(session.clone())
                .with_admin_from(&server.root_dn_norm, &server.auth);
            Ok(match verdict {
                Some(BindVerdict::Allow {
                    controls,
                    restricted,
                }) => {
                    let who = if restricted {
                        who.restricted_to_password_change()
                    } else {
                        who
                    };
                    (who, controls)
                }
                _ => (who, Vec::new()),
            })
        }
        (None, _) => {
            attempt.failed().await;
            Err(invalid())
        }
    }
}

/// What a bind that verified may upgrade: the clear password and the
/// stored values in a scheme weaker than the configured one.
type Upgrade = Option<(Vec<u8>, Vec<Vec<u8>>)>;

/// Check a simple bind's password; Some(identity) when it is right, and,
/// when the password policy is on (`want_account`) and there is an entry,
/// its policy state and policy, read in the same snapshot; with a right
/// password, the values upgrade on bind may rewrite.
async fn check_simple(
    server: &Arc<Server>,
    session: &Arc<Session>,
    name: &str,
    rdns: &[String],
    norm: &str,
    pw: Vec<u8>,
    want_account: bool,
) -> OpResult<(Option<Identity>, Option<crate::seams::Account>, Upgrade)> {
    let who = || Identity::authenticated(name, norm, Arc::default());
    let mut checked_root = false;
    if !server.root_dn_norm.is_empty() && norm == server.root_dn_norm {
        let hash = server.root_pw_hash.clone();
        if let Some(hash) = hash {
            if server
                .passwords
                .verify(pw.clone(), vec![hash.into_bytes()])
                .await
            {
                return Ok((Some(who()), None, None));
            }
            checked_root = true;
        }
        // A root DN with no password may still exist as an entry below.
    }
    // Below a translucent suffix, a password not held here may be the
    // remote server's to check.
    let translucent = super::remote::serving(server, name);
    let mut pass_through = false;
    // One indexed lookup: cheaper inline than a handoff to a blocking thread.
    let mut account = None;
    let stored: Vec<Vec<u8>> = {
        let rtxn = server.rt.store.read()?;
        let view = rtxn.view();
        match view.lookup_norm(rdns)? {
            Lookup::Found(id) => {
                let entry = bind_entry(server, &view, id, want_account)?;
                // Binding needs auth access to userPassword, judged for the
                // not-yet-authenticated client over this session.
                let anon = Identity::anonymous(session.clone());
                let pw = server.schema.attribute("userPassword");
                let allowed =
                    super::require(server, &view, &anon, norm, &entry, &[(pw, acl::AUTH)]).is_ok();
                let stored = if allowed {
                    super::password_values(&entry.attrs)
                } else {
                    Vec::new()
                };
                if let (true, Some(pp)) = (want_account, &server.policy) {
                    account = Some(pp.account(&view, rtxn.generation(), entry)?);
                }
                // The local part of a remote entry, holding no password
                // the requester may bind with: the remote checks it.
                if let (Some(t), true, true) = (&translucent, allowed, stored.is_empty()) {
                    let classes = view
                        .attrs_where(id, &|d| d.eq_ignore_ascii_case("objectClass"))?
                        .unwrap_or_default();
                    pass_through = t.is_part(&Entry {
                        dn: Dn { rdns: Vec::new() },
                        attrs: classes,
                    });
                }
                stored
            }
            Lookup::Missing { .. } => {
                // A name only the remote may hold: binding to it needs the
                // auth right here too, judged on an entry of that name.
                if translucent.is_some() {
                    let anon = Identity::anonymous(session.clone());
                    let pw = server.schema.attribute("userPassword");
                    let nothing = Entry {
                        dn: Dn { rdns: Vec::new() },
                        attrs: Vec::new(),
                    };
                    pass_through =
                        super::require(server, &view, &anon, norm, &nothing, &[(pw, acl::AUTH)])
                            .is_ok();
                }
                Vec::new()
            }
        }
    };
    // The same answer, after the same work, whether the entry is missing,
    // has no password or the password is wrong: a bind must not reveal
    // which DNs exist (with nothing stored, a decoy hash is checked).
    if stored.is_empty() && checked_root {
        return Ok((None, account, None));
    }
    if let (true, Some(t)) = (pass_through, &translucent) {
        return Ok((t.bind(name, pw).await?.then(who), account, None));
    }
    let weak = super::rehash::weak_values(server, &stored);
    let clear = (!weak.is_empty()).then(|| pw.clone());
    let ok = server.passwords.verify(pw, stored).await;
    let upgrade = clear.filter(|_| ok).map(|c| (c, weak));
    Ok((ok.then(who), account, upgrade))
}

/// What a bind reads of entry `id`: the whole entry when access rules
/// look inside entries (one has a filter); otherwise only the password
/// and, under a password policy (`want_account`), its state attributes.
fn bind_entry(
    server: &Server,
    view: &View<'_>,
    id: EntryId,
    want_account: bool,
) -> OpResult<Entry> {
    if server.acl.reads_entries() {
        return super::stored_entry(view, id);
    }
    let attrs = if want_account {
        view.attrs_where(id, &|d| {
            pando_model::desc::is_password(d)
                || d.get(..3).is_some_and(|p| p.eq_ignore_ascii_case("pwd"))
        })?
    } else {
        view.attrs_where(id, &pando_model::desc::is_password)?
    };
    Ok(Entry {
        dn: Dn { rdns: Vec::new() },
        attrs: attrs.unwrap_or_default(),
    })
}

/// SASL EXTERNAL: the identity the transport established — the peer's Unix
/// credentials over ldapi, else a verified client certificate's subject —
/// mapped through `[[auth.external_map]]` when a rule matches.
fn external(
    server: &Arc<Server>,
    session: &Arc<Session>,
    authz_id: Option<&[u8]>,
) -> OpResult<Identity> {
    let authz = if let Some(c) = session.peer_cred {
        peercred_dn(c)
    } else if let Some(subject) = &session.client_cert_dn {
        subject.clone()
    } else {
        return Err(LdapError::new(
            ResultCode::INAPPROPRIATE_AUTHENTICATION,
            "SASL EXTERNAL needs an ldapi connection or a TLS client certificate",
        ));
    };
    let authz_dn = super::parse_dn(&authz)?;
    let authz_norm = server
        .schema
        .normalize_dn(&authz_dn)
        .map_err(|e| LdapError::invalid_dn(format!("external identity '{authz}': {e}")))?;
    let (dn, norm) = match server.auth.map_external(&authz_norm) {
        None => (authz, authz_norm),
        Some(MapTarget::Dn(d)) => {
            let parsed = super::parse_dn(&d)?;
            let n = server
                .schema
                .normalize_dn(&parsed)
                .map_err(|e| LdapError::invalid_dn(format!("mapped DN '{d}': {e}")))?;
            (d, n)
        }
        Some(MapTarget::Search { base, filter }) => {
            let rtxn = server.rt.store.read()?;
            let view = rtxn.view();
            let found = find_unique(server, &view, &base, &filter)?;
            let Some(d) = found else {
                return Err(LdapError::new(
                    ResultCode::INVALID_CREDENTIALS,
                    "the external identity maps to no single entry",
                ));
            };
            let parsed = super::parse_dn(&d)?;
            let n = server
                .schema
                .normalize_dn(&parsed)
                .map_err(|e| LdapError::invalid_dn(e.to_string()))?;
            (d, n)
        }
    };
    // An explicit authorization identity (RFC 4422 appendix A) must name the
    // identity itself: acting as someone else is not offered.
    if let Some(z) = authz_id.filter(|z| !z.is_empty()) {
        let z = std::str::from_utf8(z).map_err(|_| LdapError::protocol("authzId is not UTF-8"))?;
        let asked = z.strip_prefix("dn:").unwrap_or(z);
        let same = Dn::parse(asked)
            .ok()
            .and_then(|d| server.schema.normalize_dn(&d).ok())
            .is_some_and(|n| n == norm);
        if !same {
            return Err(LdapError::access(
                "asserting another authorization identity is not permitted",
            ));
        }
    }
    Ok(Identity::authenticated(dn, norm, session.clone())
        .with_admin_from(&server.root_dn_norm, &server.auth))
}

/// The DN of the single entry under `base` matching `filter`; None when
/// there are none or several. Only indexed filters are accepted here.
fn find_unique(
    server: &Server,
    view: &View<'_>,
    base: &str,
    filter: &str,
) -> OpResult<Option<String>> {
    let base = super::parse_dn(base)?;
    let base_id = super::resolve(view, &base)?;
    let f = pando_proto::Filter::parse(filter)
        .map_err(|e| LdapError::protocol(format!("mapping filter '{filter}': {e}")))?;
    match super::unique_indexed(server, view, Some(base_id), &f)? {
        super::Unique::One(id) => Ok(Some(view.dn_string(id)?)),
        super::Unique::NoneOrMany => Ok(None),
        super::Unique::Unindexed => Err(LdapError::unwilling(format!(
            "mapping filter '{filter}' is not indexed"
        ))),
    }
}

fn invalid() -> LdapError {
    LdapError::new(ResultCode::INVALID_CREDENTIALS, "")
}
