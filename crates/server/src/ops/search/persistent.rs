//! Persistent search (draft-ietf-ldapext-psearch-03): after its initial
//! results (none with changesOnly) the search stays open, and every entry
//! a later change adds, modifies, renames or deletes is sent when it is
//! within the search's base and scope and matches its filter as the
//! requester may see it, in commit order, with an entry change
//! notification control when returnECs asks for it.
//!
//! It follows the change feed ([`crate::ops::feed`]) on its own task,
//! holding no thread and no read transaction between changes. It ends
//! with Abandon or Cancel, or with adminLimitExceeded when its client
//! falls more than `limits.persistent_search_backlog` operations behind
//! (the feed's ring overflowed: the writer never waits for it). A change
//! is tested on the entry as the change left it (a delete: as it was);
//! access is decided on the store as it is when the change is sent.
//!
//! The requester's size and time limits apply to the initial results
//! only. Paged results, sort and VLV are not combined with it.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use pando_model::Entry;
use pando_proto::control_values::{encode_entry_change, PersistentSearch};
use pando_proto::{oid, Control, LdapResult, ResultCode, Scope};
use pando_store::{EntryId, Lookup};
use tokio::sync::broadcast::error::RecvError;

use super::matcher::Matcher;
use super::plan::Plan;
use super::{
    check_base, emitter_for, run_to_end, virtual_tree, Finished, SearchJob, SearchOutcome,
};
use crate::acl::{Access, EntryRules};
use crate::error::{LdapError, OpResult};
use crate::ops::feed::Committed;

/// How often a persistent search with no changes to send looks for
/// Abandon and Cancel.
const CHECK_ABANDON: Duration = Duration::from_millis(100);

/// Run a persistent search until it ends (see the module header).
pub async fn run(job: &Arc<SearchJob>) -> Finished {
    let Some(ps) = job.controls.persistent else {
        return run_to_end(job).await;
    };
    let base = match settle(job) {
        Ok(base) => base,
        Err(e) => return done(e.into_result(), 0),
    };
    let server = &job.server;
    let Ok(_place) = server.persistent_searches.clone().try_acquire_owned() else {
        return done(LdapResult::new(
            ResultCode::ADMIN_LIMIT_EXCEEDED,
            format!(
                "{} persistent searches are open, the most this server allows (limits.max_persistent_searches)",
                server.cfg.config.limits.max_persistent_searches
            ),
        ), 0);
    };
    // Subscribed before the initial search takes its snapshot: no change
    // falls between the two (one committed meanwhile may be sent twice).
    let mut feed = server.feed.subscribe();
    let mut sent = 0;
    if !ps.changes_only {
        match run_to_end(job).await {
            Finished::Done(o) if o.result.code == ResultCode::SUCCESS => sent = o.entries,
            other => return other,
        }
    }
    let mut tick = tokio::time::interval(CHECK_ABANDON);
    loop {
        let next = tokio::select! {
            next = feed.recv() => next,
            _ = tick.tick() => {
                if job.abandoned.load(Ordering::Relaxed) {
                    return Finished::Abandoned;
                }
                continue;
            }
        };
        if job.abandoned.load(Ordering::Relaxed) {
            return Finished::Abandoned;
        }
        let committed = match next {
            Ok(c) => c,
            Err(RecvError::Lagged(lost)) => {
                return done(LdapResult::new(
                    ResultCode::ADMIN_LIMIT_EXCEEDED,
                    format!(
                        "the client fell more than {} changes behind (limits.persistent_search_backlog) and {lost} were dropped; search again",
                        server.cfg.config.limits.persistent_search_backlog
                    ),
                ), sent)
            }
            Err(RecvError::Closed) => {
                return done(LdapResult::new(
                    ResultCode::UNAVAILABLE,
                    "the server is shutting down",
                ), sent)
            }
        };
        let (bytes, n) = match encode_changes(job, &ps, &base, &committed) {
            Ok(out) => out,
            Err(e) => return done(e.into_result(), sent),
        };
        if n > 0 {
            // Waits while the client is slow (bounded by the connection's
            // write-rate rule); the feed keeps the backlog meanwhile.
            if job.out.send(bytes).await.is_err() {
                return Finished::Abandoned;
            }
            sent += n;
        }
    }
}

fn done(result: LdapResult, entries: u64) -> Finished {
    Finished::Done(SearchOutcome {
        result,
        controls: Vec::new(),
        entries,
    })
}

/// The search's base as a normalised DN, after the checks any search of
/// it makes (it exists, the requester may search it, the assertion
/// control holds), and the refusals particular to persistent searches.
fn settle(job: &SearchJob) -> OpResult<String> {
    let server = &job.server;
    let c = &job.controls;
    if c.paged.is_some() || c.sort.is_some() || c.vlv.is_some() {
        return Err(LdapError::new(
            ResultCode::UNWILLING_TO_PERFORM,
            "a persistent search cannot be combined with paged results, sorting or a virtual list view",
        ));
    }
    let cached = server.base_cache.get(&server.schema, &job.req.base)?;
    if virtual_tree::owner(&server.schema, &cached.0).is_some() {
        return Err(LdapError::new(
            ResultCode::UNWILLING_TO_PERFORM,
            "the root DSE, cn=Subschema and cn=Monitor cannot be searched persistently",
        ));
    }
    let rtxn = server.store.read()?;
    let view = rtxn.view();
    let (id, rdns) = crate::ops::resolve_rdns_for(server, &view, &job.who, cached.1.clone())?;
    let norm = rdns.join(",");
    let mut access = Access::new(&server.acl, &job.who);
    check_base(job, &view, &mut access, id, &norm, None)?;
    Ok(norm)
}

/// The entries `committed` gives this search, encoded, and how many.
fn encode_changes(
    job: &SearchJob,
    ps: &PersistentSearch,
    base: &str,
    committed: &Committed,
) -> OpResult<(Vec<u8>, u64)> {
    let server = &job.server;
    let req = &job.req;
    let wanted: Vec<_> = committed
        .changes
        .iter()
        .filter(|c| ps.change_types & c.kind().code() != 0)
        .filter(|c| in_scope(base, req.scope, c.norm()))
        .filter(|c| shows_subentry(job, crate::ops::is_subentry(c.entry())))
        .collect();
    if wanted.is_empty() {
        return Ok((Vec::new(), 0));
    }
    let schema = &*server.schema;
    let rtxn = server.store.read()?;
    let view = rtxn.view();
    let plan = Plan::for_held_entries(schema, &req.filter);
    let mut matcher = Matcher {
        schema,
        view: &view,
        plan: &plan,
        base: 0,
        filter: &req.filter,
        compiled: schema.compile_filter(&req.filter),
        masked: HashMap::new(),
        access: Access::new(&server.acl, &job.who),
        rules: EntryRules::default(),
    };
    let emitter = emitter_for(job);
    // Where the entry is stored matters only to computed attributes.
    let needs_id = !plan.needed_computed.is_empty()
        || crate::ops::COMPUTED
            .iter()
            .any(|name| emitter.sel.wants_computed(name));
    let (mut buf, mut n) = (Vec::new(), 0);
    for c in wanted {
        let entry: Entry = c.entry().clone();
        let id = if needs_id {
            stored_id(&view, &entry)?
        } else {
            None
        };
        let Some(entry) = matcher.test_held(id, c.norm(), entry)? else {
            continue;
        };
        let controls = if ps.return_ecs {
            let previous = c.previous_dn();
            vec![Control {
                oid: oid::ENTRY_CHANGE.into(),
                critical: false,
                value: Some(encode_entry_change(
                    c.kind().code(),
                    previous.as_deref(),
                    None,
                )),
            }]
        } else {
            Vec::new()
        };
        matcher.emit_held(&emitter, id, c.norm(), &entry, &controls, &mut buf)?;
        n += 1;
    }
    Ok((buf, n))
}

/// Where the entry is stored now, if it still is.
fn stored_id(view: &pando_store::View<'_>, entry: &Entry) -> OpResult<Option<EntryId>> {
    Ok(match view.lookup(&entry.dn)? {
        Ok(Lookup::Found(id)) => Some(id),
        _ => None,
    })
}

/// RFC 3672 as a search applies it: with the subentries control only
/// subentries (TRUE) or only ordinary entries (FALSE); without it,
/// subentries only to a base-scope search.
fn shows_subentry(job: &SearchJob, is_subentry: bool) -> bool {
    match job.controls.subentries {
        Some(visible) => visible == is_subentry,
        None => !is_subentry || job.req.scope == Scope::Base,
    }
}

/// Whether the entry named `norm` is within `scope` of `base` (both
/// normalised DNs, RDNs joined by unescaped commas).
fn in_scope(base: &str, scope: Scope, norm: &str) -> bool {
    match scope {
        Scope::Base => norm == base,
        Scope::One => parent_of(norm) == Some(base),
        Scope::Sub => norm == base || is_below(norm, base),
        Scope::Children => is_below(norm, base),
    }
}

/// The DN after the first unescaped comma (None for a one-RDN DN).
fn parent_of(norm: &str) -> Option<&str> {
    let bytes = norm.as_bytes();
    let mut escaped = false;
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'\\' if !escaped => escaped = true,
            b',' if !escaped => return Some(&norm[i + 1..]),
            _ => escaped = false,
        }
    }
    None
}

/// Whether `norm` names an entry strictly below `base`.
fn is_below(norm: &str, base: &str) -> bool {
    let mut rest = norm;
    while let Some(parent) = parent_of(rest) {
        if parent == base {
            return true;
        }
        rest = parent;
    }
    // Every entry is below the root (the empty DN).
    base.is_empty() && !norm.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_follow_unescaped_commas() {
        let base = "dc=example,dc=com";
        let child = "ou=people,dc=example,dc=com";
        let grandchild = "uid=a,ou=people,dc=example,dc=com";
        // One RDN whose value holds an escaped comma and the base's text.
        let lookalike = "cn=x\\,dc=example,dc=com";
        assert!(in_scope(base, Scope::Base, base));
        assert!(!in_scope(base, Scope::Base, child));
        assert!(in_scope(base, Scope::One, child));
        assert!(!in_scope(base, Scope::One, grandchild));
        assert!(!in_scope(base, Scope::One, base));
        assert!(in_scope(base, Scope::Sub, base));
        assert!(in_scope(base, Scope::Sub, grandchild));
        assert!(!in_scope(base, Scope::Children, base));
        assert!(in_scope(base, Scope::Children, grandchild));
        assert!(!in_scope(base, Scope::Sub, lookalike));
        assert!(in_scope("dc=com", Scope::One, lookalike));
        assert!(!in_scope(base, Scope::Sub, "dc=other,dc=com"));
        assert!(in_scope("", Scope::Sub, base));
        assert_eq!(parent_of("cn=a\\\\,dc=com"), Some("dc=com"));
    }
}
