//! Extended operations: WhoAmI (RFC 4532), Password Modify (RFC 3062), and
//! Pando's own: online backup and replication changes behind.

use std::sync::Arc;

use pando_model::Attribute;
use pando_proto::{
    encode_passwd_modify_response, oid, ExtendedRequest, ExtendedResponse, LdapResult,
    PasswdModifyRequest, ResultCode,
};
use pando_store::View;

use super::controls::Requested;
use super::write::{Before, Change, WriteCtx, WriteOp};
use crate::error::{LdapError, OpResult};
use crate::state::Server;
use pando_access::acl;
use pando_access::Identity;

pub async fn extended(
    server: &Arc<Server>,
    who: &Identity,
    controls: Requested,
    req: ExtendedRequest,
) -> OpResult<ExtendedResponse> {
    match req.name.as_str() {
        // RFC 4532 2.1: the request has no value.
        oid::WHOAMI if req.value.is_some() => Err(LdapError::protocol(
            "a Who am I? request has no request value",
        )),
        oid::WHOAMI => {
            let authz = if who.is_anonymous() {
                String::new()
            } else {
                format!("dn:{}", who.dn())
            };
            Ok(ExtendedResponse {
                result: LdapResult::success(),
                name: None,
                value: Some(authz.into_bytes()),
            })
        }
        oid::PASSWD_MODIFY => {
            let ctx = WriteCtx::new(server, who, controls);
            passwd_modify(ctx, req.value.as_deref()).await
        }
        super::special::BACKUP_EXOP => online_backup(server, who, req.value).await,
        super::special::CHANGES_BEHIND_EXOP => changes_behind(server, who, req.value).await,
        super::special::DIGEST_EXOP => super::digest_answer::answer(server, who, req.value).await,
        super::special::CONFIG_STATE_EXOP => config_state(server, who, req.value),
        super::special::PWD_FAILURES_EXOP => {
            let (dn, count) = super::policy::failures_request(req.value.as_deref())?;
            let Some(p) = &server.policy else {
                return Err(LdapError::unwilling("the password policy overlay is off"));
            };
            p.forwarded_failures(server, who, dn, count).await?;
            Ok(ExtendedResponse {
                result: LdapResult::success(),
                name: Some(super::special::PWD_FAILURES_EXOP.to_string()),
                value: None,
            })
        }
        other => Err(LdapError::protocol(format!(
            "unsupported extended operation {other}"
        ))),
    }
}

async fn passwd_modify(ctx: Arc<WriteCtx>, value: Option<&[u8]>) -> OpResult<ExtendedResponse> {
    let (server, who) = (&ctx.server.clone(), &ctx.who.clone());
    let req = match value {
        None => PasswdModifyRequest {
            user_identity: None,
            old_password: None,
            new_password: None,
        },
        Some(v) => PasswdModifyRequest::decode(v).map_err(|e| {
            LdapError::protocol(format!("malformed Password Modify request: {}", e.reason))
        })?,
    };
    // The result codes of refusals are slapd's (RFC 3062 names none).
    if who.is_anonymous() {
        return Err(LdapError::new(
            ResultCode::STRONGER_AUTH_REQUIRED,
            "only authenticated users may change passwords",
        ));
    }
    let target = target_of(server, who, req.user_identity.as_deref())?;
    let norm = server
        .schema
        .normalize_dn(&target)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN: {e}")))?;
    // Access is settled before any hashing, so refused callers cost little.
    may_set_password(server, who, &target, &norm)?;
    let generated = req.new_password.is_none();
    let new_clear = match req.new_password {
        Some(p) if !p.is_empty() => p,
        Some(_) => return Err(LdapError::unwilling("the new password is empty")),
        None => pando_password::generate_password().into_bytes(),
    };
    // Check the old password (if given) against what is stored; like every
    // slow hash, through the server's bounded queue. The values checked
    // are remembered: the write below only goes ahead if they are still
    // the stored ones, so a concurrent change cannot slip in between the
    // check and the write.
    // A wrong old password is a failed password check like a failed bind:
    // the same throttle (per DN and address) and the password policy's
    // failure count and lockout, or this would be an unthrottled oracle.
    let checked = match req.old_password {
        None => None,
        Some(old) => Some(check_old_password(server, who, &target, &norm, old).await?),
    };
    if let Some(p) = &server.policy {
        // A generated password is the server's own: not quality-checked.
        let clear = (!generated).then_some(new_clear.as_slice());
        p.check_change(
            server,
            who,
            &norm,
            clear,
            checked.is_some(),
            ctx.controls.ppolicy,
        )
        .await?;
    }
    let hashed = server.passwords.hash_one(new_clear.clone()).await?;
    let op = SetPassword {
        target,
        norm,
        hashed: hashed.into_bytes(),
        checked,
    };
    // Extended operations take no write controls (see ops::controls).
    super::write::run(ctx, Arc::new(op)).await?;
    let value = if generated {
        Some(encode_passwd_modify_response(Some(&new_clear)))
    } else {
        None
    };
    Ok(ExtendedResponse {
        result: LdapResult::success(),
        name: None,
        value,
    })
}

/// May `who` set the password of `target` (normalised `norm`), and may
/// the entry hold one? Decided on a snapshot, before any hash is spent.
fn may_set_password(
    server: &Server,
    who: &Identity,
    target: &pando_model::Dn,
    norm: &str,
) -> OpResult<()> {
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    match super::resolve_for(server, &view, who, target) {
        Ok(id) => {
            let entry = super::stored_entry(&view, id)?;
            let pw = server.schema.attribute("userPassword");
            super::require(server, &view, who, norm, &entry, &[(pw, acl::WRITE)])?;
            // So is the schema: an entry whose classes do not allow a
            // password is refused before a hash is spent on it (the
            // writer checks again on the entry as it then is).
            let mut with_pw = entry;
            with_pw
                .attrs
                .retain(|a| !pando_model::desc::is_password(&a.desc));
            with_pw.attrs.push(Attribute {
                desc: "userPassword".into(),
                values: vec![b"{SSHA}placeholder".to_vec()],
            });
            server.schema.check_entry(&mut with_pw)?;
        }
        Err(e) if e.code == ResultCode::NO_SUCH_OBJECT && norm == server.root_dn_norm => {
            return Err(LdapError::unwilling(
                "the root DN is not an entry; set root_password_hash in the configuration",
            ))
        }
        Err(e) => return Err(e),
    }
    Ok(())
}

/// Check the old password given against what is stored; like every slow
/// hash, through the server's bounded queue. The values checked are
/// returned: the write only goes ahead if they are still the stored ones,
/// so a concurrent change cannot slip in between the check and the write.
/// A wrong old password is a failed password check like a failed bind:
/// the same throttle (per DN and address) and the password policy's
/// failure count and lockout, or this would be an unthrottled oracle.
async fn check_old_password(
    server: &Arc<Server>,
    who: &Identity,
    target: &pando_model::Dn,
    norm: &str,
    old: Vec<u8>,
) -> OpResult<Vec<Vec<u8>>> {
    let wrong = || LdapError::unwilling("the old password is wrong");
    let attempt = server
        .rt
        .throttle
        .begin(norm, &who.session)
        .await
        .map_err(|_| wrong())?;
    let stored = {
        let rtxn = server.rt.store.read()?;
        let view = rtxn.view();
        let id = super::resolve(&view, target)?;
        super::password_values(&view.attrs(id)?.unwrap_or_default())
    };
    let mut right = server.passwords.verify(old, stored.clone()).await;
    if let Some(p) = &server.policy {
        right = p.on_password_check(server, norm, right).await?;
    }
    if !right {
        attempt.failed().await;
        return Err(wrong());
    }
    attempt.succeeded();
    Ok(stored)
}

/// The entry a Password Modify names: its userIdentity, or the requester
/// when that is absent or empty (PHP's `ldap_exop_passwd($c, "", …)` and
/// python-ldap's `passwd_s('', …)` send it empty; slapd reads both as the
/// requester). A DN, or an RFC 4513 authzId, `dn:<DN>` or `u:<uid>` (slapd
/// takes DNs only; RFC 3062 leaves the form open).
fn target_of(
    server: &Server,
    who: &Identity,
    identity: Option<&[u8]>,
) -> OpResult<pando_model::Dn> {
    let Some(raw) = identity.filter(|u| !u.is_empty()) else {
        return super::parse_dn(who.dn());
    };
    let not_a_dn = |why: String| {
        LdapError::new(
            ResultCode::INVALID_ATTRIBUTE_SYNTAX,
            format!("userIdentity {why}"),
        )
    };
    let text = std::str::from_utf8(raw).map_err(|_| not_a_dn("is not UTF-8".into()))?;
    if let Some(uid) = text.strip_prefix("u:") {
        let rtxn = server.rt.store.read()?;
        let view = rtxn.view();
        return match super::proxy::by_uid(server, &view, uid)? {
            Some(id) => Ok(view.dn(id)?),
            // The same answer as for an entry the requester may not see:
            // which uids exist is not revealed.
            None => Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object")),
        };
    }
    super::parse_dn(text.strip_prefix("dn:").unwrap_or(text))
        .map_err(|e| not_a_dn(format!("is not a DN or authzId: {}", e.message)))
}

/// Password Modify's change: userPassword replaced by one hashed value.
struct SetPassword {
    target: pando_model::Dn,
    norm: String,
    hashed: Vec<u8>,
    /// The stored values the old password was checked against: the change
    /// goes ahead only if they are still the stored ones, so a concurrent
    /// change cannot slip in between the check and the write.
    checked: Option<Vec<Vec<u8>>>,
}

impl WriteOp for SetPassword {
    fn plan(&self, ctx: &WriteCtx, view: &View<'_>) -> OpResult<Vec<Change>> {
        let (server, who) = (&*ctx.server, &ctx.who);
        let schema = &*server.schema;
        let id = super::resolve_for(server, view, who, &self.target)?;
        let old = pando_model::Entry {
            dn: view.dn(id)?,
            attrs: view.attrs(id)?.unwrap_or_default(),
        };
        super::write::hooks::on_target(ctx, view, &self.norm, &old)?;
        let pw = schema.attribute("userPassword");
        super::require(server, view, who, &self.norm, &old, &[(pw, acl::WRITE)])?;
        if self
            .checked
            .as_ref()
            .is_some_and(|c| *c != super::password_values(&old.attrs))
        {
            return Err(LdapError::new(
                ResultCode::BUSY,
                "the password changed while this request was being checked; try again",
            ));
        }
        let mut new = old.clone();
        new.attrs
            .retain(|a| !pando_model::desc::is_password(&a.desc));
        new.attrs.push(Attribute {
            desc: "userPassword".into(),
            values: vec![self.hashed.clone()],
        });
        // The checks a modify replacing userPassword passes: the entry's
        // object classes must allow it (else objectClassViolation).
        schema.check_entry(&mut new)?;
        super::write::check_invariants(schema, &old, &new)?;
        let before = Before {
            id,
            entry: old,
            norm: self.norm.clone(),
            bytes: None,
        };
        Ok(vec![Change::modify(before, new)])
    }

    /// Logged as a replace of userPassword with the stored hash.
    fn audit(&self, ctx: &WriteCtx, _changes: &[Change]) {
        let change = pando_proto::Change {
            op: pando_proto::ModOp::Replace,
            attr: pando_proto::PartialAttribute {
                name: "userPassword".into(),
                values: Vec::new(),
            },
        };
        crate::audit::write(
            &ctx.server,
            &ctx.who,
            pando_observe::audit::Record::Modify {
                dn: &self.target.to_string(),
                changes: std::slice::from_ref(&change),
                passwords: Some(std::slice::from_ref(&self.hashed)),
            },
        );
    }
}

/// Refused (insufficientAccessRights) unless `who` is an administrator or
/// the break-glass identity.
pub(crate) fn admin_only(who: &Identity, what: &str) -> OpResult<()> {
    match who.is_admin() || who.is_break_glass() {
        true => Ok(()),
        false => Err(LdapError::access(format!(
            "only an administrator may {what}"
        ))),
    }
}

/// The shared configuration, for a server following this one's (the
/// request's value, if any, is empty).
fn config_state(
    server: &Arc<Server>,
    who: &Identity,
    value: Option<Vec<u8>>,
) -> OpResult<ExtendedResponse> {
    admin_only(who, "read the configuration")?;
    if value.is_some_and(|v| !v.is_empty()) {
        return Err(LdapError::protocol(
            "the configuration state request has no request value",
        ));
    }
    let state = server
        .rt
        .config_tree
        .shared_state(server)
        .map_err(|e| LdapError::new(ResultCode::OTHER, e))?;
    Ok(ExtendedResponse {
        result: LdapResult::success(),
        name: Some(super::special::CONFIG_STATE_EXOP.to_string()),
        value: Some(state),
    })
}

/// Back up the running store into a directory on the server host.
async fn online_backup(
    server: &Arc<Server>,
    who: &Identity,
    value: Option<Vec<u8>>,
) -> OpResult<ExtendedResponse> {
    admin_only(who, "start a backup")?;
    let dest = value
        .as_deref()
        .and_then(|v| std::str::from_utf8(v).ok())
        .filter(|p| p.starts_with('/'))
        .ok_or_else(|| {
            LdapError::protocol("the request value must be an absolute destination directory")
        })?
        .to_string();
    let server2 = server.clone();
    let report = tokio::task::spawn_blocking(move || {
        pando_store::backup::backup_store(&server2.rt.store, std::path::Path::new(&dest))
    })
    .await
    .map_err(|_| LdapError::new(ResultCode::OTHER, "backup task failed"))?
    .map_err(|e| LdapError::new(ResultCode::OTHER, format!("backup failed: {e}")))?;
    tracing::info!(dest = %report.dest.display(), entries = report.manifest.entries, secs = report.total_secs, "online backup written");
    let text = toml::to_string(&report.manifest).unwrap_or_default();
    Ok(ExtendedResponse {
        result: LdapResult::success(),
        name: Some(super::special::BACKUP_EXOP.to_string()),
        value: Some(text.into_bytes()),
    })
}

/// One of the `limits.max_search_threads` places, as a search takes: for
/// work that reads as much as a search (counting changes, digests).
pub async fn search_place(server: &Server) -> OpResult<tokio::sync::OwnedSemaphorePermit> {
    server
        .rt
        .search_threads
        .places()
        .clone()
        .acquire_owned()
        .await
        .map_err(|_| LdapError::new(ResultCode::UNAVAILABLE, "the server is shutting down"))
}

/// Whoever is authenticated and may read contextCSN on a suffix entry (a
/// replica's identity) may count the changes behind it (a count reads the
/// change log's keys: not for anonymous clients).
fn may_read_context_csn(server: &Server, view: &View<'_>, who: &Identity) -> OpResult<()> {
    if who.is_anonymous() {
        return Err(LdapError::access(
            "counting replication changes needs an authenticated identity",
        ));
    }
    let at = server.schema.attribute("contextCSN");
    for (_, norm) in &server.suffixes {
        let pando_store::Lookup::Found(id) = view.lookup_norm(&super::norm_dn::split_rdns(norm))?
        else {
            continue;
        };
        let entry = pando_model::Entry {
            dn: pando_model::Dn { rdns: Vec::new() },
            attrs: view.attrs(id)?.unwrap_or_default(),
        };
        if super::require(server, view, who, norm, &entry, &[(at, acl::READ)]).is_ok() {
            return Ok(());
        }
    }
    Err(LdapError::access(
        "counting replication changes needs read access to contextCSN on a suffix entry",
    ))
}

/// How many logged operations per server ID are newer than the CSNs given
/// (a replica's contextCSN values, separated by `;`): the replica's lag in
/// changes, counted here. Answer: one line per server ID logged,
/// `sid=001 changes=12`, or `changes>=12` when the count is a lower bound
/// (the change log no longer reaches back to the replica's CSN, or the
/// count stopped at `replication.max_changes_counted` operations); every
/// server ID given has a line. For authenticated identities that may read
/// contextCSN (see `may_read_context_csn`); it reads the change log on a
/// search thread, holding one of the `limits.max_search_threads` places
/// as a search does, so counts cannot take the threads searches need.
async fn changes_behind(
    server: &Arc<Server>,
    who: &Identity,
    value: Option<Vec<u8>>,
) -> OpResult<ExtendedResponse> {
    let text = value
        .as_deref()
        .map(std::str::from_utf8)
        .transpose()
        .map_err(|_| LdapError::protocol("the request value must be CSNs separated by ';'"))?
        .unwrap_or("");
    let mut seen = std::collections::BTreeMap::new();
    for csn in text.split(';').filter(|c| !c.is_empty()) {
        let sid = pando_store::clock::parse_csn(csn)
            .ok()
            .and(pando_store::csn_sid(csn))
            .ok_or_else(|| LdapError::protocol(format!("'{csn}' is not a CSN")))?;
        seen.insert(sid, csn.to_string());
    }
    let slot = search_place(server).await?;
    let max = server.cfg.config.replication.max_changes_counted;
    let (server2, seen2, who2) = (server.clone(), seen.clone(), who.clone());
    let (counts, exact, floor) = tokio::task::spawn_blocking(move || -> OpResult<_> {
        let rtxn = server2.rt.store.read()?;
        let view = rtxn.view();
        may_read_context_csn(&server2, &view, &who2)?;
        let (counts, exact) = view.count_changes_after(&seen2, max)?;
        drop(slot);
        Ok((counts, exact, view.changelog_floor()?))
    })
    .await
    .map_err(|_| LdapError::new(ResultCode::OTHER, "count task failed"))??;
    let mut out = String::new();
    let mut counts = counts;
    for sid in seen.keys() {
        counts.entry(*sid).or_insert(0);
    }
    for (sid, n) in counts {
        let complete = exact && seen.get(&sid).is_some_and(|c| floor.as_str() <= c.as_str());
        let sign = if complete { "=" } else { ">=" };
        out.push_str(&format!("sid={sid:03x} changes{sign}{n}\n"));
    }
    Ok(ExtendedResponse {
        result: LdapResult::success(),
        name: Some(super::special::CHANGES_BEHIND_EXOP.to_string()),
        value: Some(out.into_bytes()),
    })
}
