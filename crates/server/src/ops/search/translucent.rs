//! A search whose base is in a translucent suffix (`overlays::translucent`):
//!
//! 1. the local entries in scope are read from the store: local parts by
//!    name, and local entries;
//! 2. the remote is searched with the same base and scope and the filter
//!    made weaker where the parts in scope override attributes
//!    (`translucent::relax`), so every entry that could match once merged
//!    comes back;
//! 3. each remote entry is merged with its part (a local entry of the
//!    same name hides it) and tested against the client's filter with
//!    this server's access rules, as held entries are; then the local
//!    entries are.
//!
//! When the remote cannot be read, the local entries still go out and the
//! search ends with `unavailable`, naming the remote and the failure. The
//! entries are not sorted (a critical sort or VLV control is refused) nor
//! paged (a paged search gets every entry in one page).

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use pando_model::Entry;
use pando_proto::{Filter, LdapResult, ResultCode, Scope};
use pando_store::EntryId;

use super::plan::Plan;
use super::{
    emitter_for, flush, paged_done, Finished, Matcher, Out, Path, SearchJob, SearchOutcome, CHUNK,
};
use crate::acl::{self, Access};
use crate::error::{LdapError, OpResult};
use crate::overlays::translucent::{self, remote::Found, Relaxed, Translucent};

/// What the store holds in the search's scope.
struct Local {
    /// The base is stored (entry or part).
    base_stored: bool,
    parts: HashMap<String, Entry>,
    /// Local entries with their normalised DNs and IDs.
    own: Vec<(String, EntryId, Entry)>,
}

impl Local {
    fn own_base(&self, base_norm: &str) -> Option<&(String, EntryId, Entry)> {
        self.own.iter().find(|(n, _, _)| n == base_norm)
    }
}

/// One entry to test: its normalised DN, where it is stored (local
/// entries: computed attributes come from there) and its content.
type Candidate = (String, Option<EntryId>, Entry);

/// Run the search to its end.
pub async fn run(job: &Arc<SearchJob>, t: &Translucent) -> Finished {
    let mut outcome = match search(job, t).await {
        Ok(Some(o)) => o,
        Ok(None) => return Finished::Abandoned,
        Err(e) => SearchOutcome {
            result: e.into_result(),
            controls: paged_done(job),
            entries: 0,
        },
    };
    // Unsorted, as a virtual tree's: a non-critical sort says so.
    super::hooks::after(job, Path::VirtualTree, &mut outcome);
    Finished::Done(outcome)
}

async fn search(job: &Arc<SearchJob>, t: &Translucent) -> OpResult<Option<SearchOutcome>> {
    let started = Instant::now();
    let c = &job.controls;
    if c.vlv.is_some() || c.sort.as_ref().is_some_and(|s| s.critical) {
        return Err(LdapError::new(
            ResultCode::UNAVAILABLE_CRITICAL_EXTENSION,
            "entries of a translucent suffix are not sorted",
        ));
    }
    let server = job.server.clone();
    let schema = &*server.schema;
    let base = crate::ops::parse_dn(&job.req.base)?;
    let base_norm = schema
        .normalize_dn(&base)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN '{}': {e}", job.req.base)))?;
    let mut local = {
        let (j, max, b) = (job.clone(), t.max_entries, base.clone());
        tokio::task::spawn_blocking(move || read_local(&j, &b, max))
            .await
            .map_err(|_| LdapError::new(ResultCode::OTHER, "search failed unexpectedly"))??
    };
    let scope = job.req.scope;
    let base_own = local.own_base(&base_norm).is_some();
    // A local base entry hides the remote's: a base search needs nothing
    // from there.
    let asked = if base_own && scope == Scope::Base {
        Ok(Found::default())
    } else {
        let mut types: Vec<String> = t.local_types().cloned().collect();
        for p in local.parts.values() {
            for ty in translucent::overridden_types(schema, p) {
                if !types.contains(&ty) {
                    types.push(ty);
                }
            }
        }
        let all = Filter::Present("objectClass".into());
        let (scope, filter) = match translucent::relax(schema, &job.req.filter, &types) {
            Relaxed::Filter(f) => (scope, f),
            Relaxed::All => (scope, all),
            // Nothing there can match: only the base is read (below).
            Relaxed::None => (Scope::Base, all),
        };
        let asked = t
            .remote
            .search(
                schema,
                &job.req.base,
                scope,
                &filter,
                t.max_entries,
                &job.abandoned,
            )
            .await;
        asked.map(|mut f| {
            if scope != job.req.scope {
                f.entries.clear();
            }
            f
        })
    };
    if job.abandoned.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let (mut found, failure) = match asked {
        Ok(f) => (f, None),
        Err(e) => {
            tracing::warn!(remote = %t.remote.endpoint.url, base = %job.req.base, error = %e, "translucent: the remote server could not be searched");
            (
                Found::default(),
                Some(t.failure_text(job.who.is_admin(), &e)),
            )
        }
    };
    let no_such = || LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object");
    if let Some(why) = &failure {
        if !local.base_stored {
            return Err(LdapError::new(ResultCode::UNAVAILABLE, why.clone()));
        }
    } else if found.no_such_object && !base_own {
        return Err(no_such());
    }
    // The merged remote entries; a local entry of the same name hides one.
    let mut candidates: Vec<Candidate> = Vec::new();
    for (norm, r) in std::mem::take(&mut found.entries) {
        if local.own.iter().any(|(n, _, _)| *n == norm) {
            continue;
        }
        let e = match local.parts.get(&norm) {
            Some(p) => translucent::merge(schema, r, p),
            None => r,
        };
        candidates.push((norm, None, e));
    }
    // The base entry as the client sees it, for its access check and the
    // assertion control: read again when the search did not bring it.
    let base_entry = match candidates.iter().find(|(n, _, _)| *n == base_norm) {
        Some((_, _, e)) => Some(e.clone()),
        None => match local.own_base(&base_norm) {
            Some((_, _, e)) => Some(e.clone()),
            None if failure.is_some() => local.parts.get(&base_norm).cloned(),
            None => {
                let read = t.remote.read(schema, &job.req.base).await.map_err(|e| {
                    tracing::warn!(remote = %t.remote.endpoint.url, error = %e, "translucent: the remote server could not be read");
                    LdapError::new(ResultCode::UNAVAILABLE, t.failure_text(job.who.is_admin(), &e))
                })?;
                read.map(|r| match local.parts.get(&base_norm) {
                    Some(p) => translucent::merge(schema, r, p),
                    None => r,
                })
            }
        },
    };
    let Some(base_entry) = base_entry else {
        return Err(no_such());
    };
    candidates.extend(local.own.drain(..).map(|(n, id, e)| (n, Some(id), e)));
    let j = job.clone();
    let sent =
        tokio::task::spawn_blocking(move || emit(&j, &base_norm, &base_entry, candidates, started))
            .await
            .map_err(|_| LdapError::new(ResultCode::OTHER, "search failed unexpectedly"))??;
    let Some((n, limited)) = sent else {
        return Ok(None);
    };
    let result = if let Some(r) = limited {
        r
    } else if let Some(why) = failure {
        LdapResult::new(
            ResultCode::UNAVAILABLE,
            format!("{why}: only entries held here were returned"),
        )
    } else if let Some(why) = found.cut {
        LdapResult::new(
            ResultCode::ADMIN_LIMIT_EXCEEDED,
            format!(
                "the remote server of {} did not send every entry ({why}): narrow the search",
                t.suffix
            ),
        )
    } else {
        LdapResult::success()
    };
    Ok(Some(SearchOutcome {
        result,
        controls: paged_done(job),
        entries: n,
    }))
}

/// The stored entries in scope, sorted into parts and local entries.
fn read_local(job: &SearchJob, base: &pando_model::Dn, max: u64) -> OpResult<Local> {
    let server = &*job.server;
    let rtxn = server.store.read()?;
    let view = rtxn.view();
    let mut local = Local {
        base_stored: false,
        parts: HashMap::new(),
        own: Vec::new(),
    };
    let rdns = crate::ops::norm_rdns(&view, base)?;
    let pando_store::Lookup::Found(base_id) = view.lookup_norm(&rdns)? else {
        return Ok(local);
    };
    local.base_stored = true;
    // The base is read whatever the scope (it may be a local entry hiding
    // the remote's), and left out of the candidates below when the scope
    // excludes it.
    let mut ids: Vec<u64> = match job.req.scope {
        Scope::Base => Vec::new(),
        Scope::One => view.children(base_id)?,
        _ => view
            .subtree(base_id, max)?
            .ok_or_else(|| {
                LdapError::new(
                    ResultCode::ADMIN_LIMIT_EXCEEDED,
                    format!("more than {max} entries are held here in the search's scope (the translucent overlay's max_entries)"),
                )
            })?
            .into_iter()
            .filter(|id| *id != base_id)
            .collect(),
    };
    ids.insert(0, base_id);
    for id in ids {
        let Some(place) = view.placement(id)? else {
            continue;
        };
        let (_, norm) = view.dn_pair_of(&place)?;
        let mut e = crate::ops::stored_entry(&view, id)?;
        e.dn = view.dn(id)?;
        if translucent::is_part(&e) {
            local.parts.insert(norm, e);
        } else {
            local.own.push((norm, id, e));
        }
    }
    Ok(local)
}

/// Check the base, then test and send the candidates. The count sent,
/// and the result when a size or time limit ended it; None when the
/// client went away.
fn emit(
    job: &SearchJob,
    base_norm: &str,
    base_entry: &Entry,
    candidates: Vec<Candidate>,
    started: Instant,
) -> OpResult<Option<(u64, Option<LdapResult>)>> {
    let server = &*job.server;
    let schema = &*server.schema;
    let rtxn = server.store.read()?;
    let view = rtxn.view();
    // As for a stored base: searching it needs the search right on it.
    let mut access = Access::new(&server.acl, &job.who);
    if !access.unrestricted() {
        let rules = access.entry(schema, base_norm, base_entry);
        if !access.allows(Some(&view), &rules, base_norm, None, acl::SEARCH) {
            return Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"));
        }
    }
    super::hooks::before(job, Some(&view), base_norm, &mut || Ok(base_entry.clone()))?;
    let limits = super::limits::Limits::for_requester(server, &job.who, &view);
    let smallest = |a: u64, b: u64| match (a, b) {
        (0, b) => b,
        (a, 0) => a,
        (a, b) => a.min(b),
    };
    let size = smallest(job.req.size_limit.max(0) as u64, limits.size as u64);
    let time = smallest(job.req.time_limit.max(0) as u64, limits.time as u64);
    let plan = Plan::for_held_entries(schema, &job.req.filter);
    let mut matcher = Matcher::for_job(job, &view, &plan, 0);
    let emitter = emitter_for(job);
    let mut out = Out::Channel(&job.out);
    let mut buf = Vec::new();
    let mut n = 0u64;
    for (norm, id, entry) in candidates {
        if job.abandoned.load(Ordering::Relaxed) {
            return Ok(None);
        }
        if time > 0 && started.elapsed().as_secs() >= time {
            flush(&mut out, &mut buf)?;
            let r = LdapResult::new(ResultCode::TIME_LIMIT_EXCEEDED, "time limit exceeded");
            return Ok(Some((n, Some(r))));
        }
        if !crate::ops::norm_dn::in_scope(base_norm, job.req.scope, &norm) {
            continue;
        }
        let Some(entry) = matcher.test_held(id, &norm, entry)? else {
            continue;
        };
        if !matcher.may_read_entry(&norm, &entry) {
            continue;
        }
        if size > 0 && n >= size {
            flush(&mut out, &mut buf)?;
            let r = LdapResult::new(ResultCode::SIZE_LIMIT_EXCEEDED, "size limit exceeded");
            return Ok(Some((n, Some(r))));
        }
        matcher.emit_held(&emitter, id, &norm, &entry, &[], &mut buf)?;
        n += 1;
        if buf.len() >= CHUNK && flush(&mut out, &mut buf).is_err() {
            return Ok(None);
        }
    }
    if flush(&mut out, &mut buf).is_err() {
        return Ok(None);
    }
    Ok(Some((n, None)))
}
