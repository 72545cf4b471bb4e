//! A search whose base is in a translucent suffix:
//!
//! 0. the search right on the base is settled first ([`settle_base`]): a
//!    requester refused it costs no remote search; one allowed then holds
//!    a search thread's place until the end, as a large search does;
//! 1. the local entries in scope that may match are found through the
//!    store's indexes, as for a stored search (parts among them are left
//!    out: alone they are not entries);
//! 2. the remote is searched with the same base and scope and the filter
//!    made weaker where parts override attributes (`translucent::relax`,
//!    with the types the suffix's parts hold, remembered per store
//!    generation), so every entry that could match once merged comes back;
//! 3. each remote entry is looked up here by name: merged with its part,
//!    or hidden by a local entry; then it is tested against the client's
//!    filter with this server's access rules, as held entries are; then
//!    the local entries are.
//!
//! When the remote cannot be read, the local entries still go out and the
//! search ends with `unavailable`, naming the remote and the failure. The
//! entries are not sorted (a critical sort or VLV control is refused) nor
//! paged (a paged search gets every entry in one page).

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use pando_model::{Dn, Entry};
use pando_proto::{Filter, LdapResult, ResultCode, Scope};
use pando_store::{EntryId, View};
use tokio::sync::OwnedSemaphorePermit;

use super::remote::{Found, Query};
use super::{Relaxed, Translucent};
use crate::translucent;
use pando_access::acl::{self, Access};
use pando_ops::error::{LdapError, OpResult};
use pando_ops::search::matcher::Matcher;
use pando_ops::search::plan::{scope_candidates, Plan};
use pando_ops::search::{
    emitter_for, flush, paged_done, Finished, Out, Path, SearchJob, SearchOutcome, CHUNK,
};

/// What the store holds at the base and in the search's scope.
struct Local {
    /// The base as stored: a local entry (with its ID) or a part.
    base: Option<(Option<EntryId>, Entry)>,
    /// Local entries in scope that may match, with their normalised DNs.
    own: Vec<(String, EntryId, Entry)>,
}

impl Local {
    fn base_own(&self) -> Option<&(Option<EntryId>, Entry)> {
        self.base.as_ref().filter(|(id, _)| id.is_some())
    }

    fn base_part(&self) -> Option<&Entry> {
        match &self.base {
            Some((None, e)) => Some(e),
            _ => None,
        }
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
    pando_ops::search::hooks::after(job, Path::VirtualTree, &mut outcome);
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
    let base = pando_ops::parse_dn(&job.req.base)?;
    let base_norm = schema
        .normalize_dn(&base)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN '{}': {e}", job.req.base)))?;
    // The search right on the base is settled before the remote is
    // searched, so a requester refused it costs no remote work.
    let Some((probed, _slot)) = settle_base(job, t, &base, &base_norm).await? else {
        return Ok(None);
    };
    let (local, types) = {
        let (j, b) = (job.clone(), base.clone());
        let max = t.max_entries;
        let parts = t.parts.clone();
        let suffix = t.suffix_norm.clone();
        tokio::task::spawn_blocking(move || read_local(&j, &b, max, &parts, &suffix))
            .await
            .map_err(|_| LdapError::new(ResultCode::OTHER, "search failed unexpectedly"))??
    };
    let scope = job.req.scope;
    // A local base entry hides the remote's: a base search needs nothing
    // from there.
    let asked = if local.base_own().is_some() && scope == Scope::Base {
        Ok(Found::default())
    } else {
        ask_remote(job, t, &types).await
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
        if local.base.is_none() {
            return Err(LdapError::new(ResultCode::UNAVAILABLE, why.clone()));
        }
    } else if found.no_such_object && local.base_own().is_none() {
        return Err(no_such());
    }
    // The base entry as the client sees it, for its access check and the
    // assertion control: read again when the search did not bring it.
    // Its content matters only to access rules with filters and to the
    // assertion; that it exists, the remote's answer already says.
    let content = server.acl.reads_entries() || job.controls.assertion.is_some();
    let remote_base = match found.entries.iter().find(|(n, _)| *n == base_norm) {
        Some((_, e)) => Some(e.clone()),
        None if found.probed_base.is_some() => found.probed_base.take(),
        None if probed.is_some() => probed,
        None if local.base_own().is_some() || failure.is_some() => None,
        None if !content => Some(Entry::new(base.clone())),
        None => t.remote.read(schema, &job.req.base).await.map_err(|e| {
            tracing::warn!(remote = %t.remote.endpoint.url, error = %e, "translucent: the remote server could not be read");
            LdapError::new(ResultCode::UNAVAILABLE, t.failure_text(job.who.is_admin(), &e))
        })?,
    };
    let base_entry = match (local.base_own(), remote_base, local.base_part()) {
        (Some((_, e)), _, _) => e.clone(),
        (None, Some(r), Some(p)) => translucent::merge(schema, r, p),
        (None, Some(r), None) => r,
        // The remote cannot be read: the part stands in for its entry.
        (None, None, Some(p)) if failure.is_some() => p.clone(),
        _ => return Err(no_such()),
    };
    let remote = std::mem::take(&mut found.entries);
    let j = job.clone();
    let sent = tokio::task::spawn_blocking(move || {
        emit(&j, &base_norm, &base_entry, local.own, remote, started)
    })
    .await
    .map_err(|_| LdapError::new(ResultCode::OTHER, "search failed unexpectedly"))??;
    let Some((n, limited)) = sent else {
        return Ok(None);
    };
    let result = limited.unwrap_or_else(|| outcome(t, failure, found.cut));
    Ok(Some(SearchOutcome {
        result,
        controls: paged_done(job),
        entries: n,
    }))
}

/// Search the remote for what the client asked: its filter relaxed to what
/// the remote can decide (the attributes held here are tested after
/// merging), the attributes the client and the local parts need.
async fn ask_remote(
    job: &Arc<SearchJob>,
    t: &Translucent,
    types: &[String],
) -> Result<Found, pando_client::ClientError> {
    let schema = &*job.server.schema;
    let scope = job.req.scope;
    let mut types: Vec<String> = types.to_vec();
    for ty in t.local_types() {
        if !types.contains(ty) {
            types.push(ty.clone());
        }
    }
    let all = Filter::Present("objectClass".into());
    let (scope, filter) = match translucent::relax(schema, &job.req.filter, &types) {
        Relaxed::Filter(f) => (scope, f),
        Relaxed::All => (scope, all),
        // Nothing there can match: only the base is read (below).
        Relaxed::None => (Scope::Base, all),
    };
    let attrs = remote_attrs(job);
    let q = Query {
        base: &job.req.base,
        scope,
        filter: &filter,
        attrs: &attrs,
        max: t.max_entries,
    };
    let asked = t.remote.search(schema, &q, &job.abandoned).await;
    asked.map(|mut f| {
        if scope != job.req.scope {
            // Only the base was read, for itself (below).
            f.probed_base = f.entries.pop().map(|(_, e)| e);
        }
        f
    })
}

/// The search's result when no limit ended it: the remote's failure (only
/// entries held here were sent), its cut, or success.
fn outcome(t: &Translucent, failure: Option<String>, cut: Option<String>) -> LdapResult {
    if let Some(why) = failure {
        LdapResult::new(
            ResultCode::UNAVAILABLE,
            format!("{why}: only entries held here were returned"),
        )
    } else if let Some(why) = cut {
        LdapResult::new(
            ResultCode::ADMIN_LIMIT_EXCEEDED,
            format!(
                "the remote server of {} did not send every entry ({why}): narrow the search",
                t.suffix
            ),
        )
    } else {
        LdapResult::success()
    }
}

/// Settle the search right on the base before the remote is searched:
/// checked on the entry held here (a local entry, or the part of a remote
/// one) or, for a base held only remotely, on its name alone — unless
/// access rules with filters (or the assertion control) look at its
/// content, when that one remote entry is read first (a base search reads
/// only it anyway, and is checked with it afterwards). A requester refused
/// is answered noSuchObject, as for a stored base, having cost no remote
/// search. One allowed then holds one of the `limits.max_search_threads`
/// places while the remote is searched and the entries tested, as a large
/// search does: translucent searches hold at most that many remote
/// answers in memory at once.
///
/// The remote base when it was read, and the place; None: abandoned while
/// waiting for a place.
async fn settle_base(
    job: &Arc<SearchJob>,
    t: &Translucent,
    base: &Dn,
    base_norm: &str,
) -> OpResult<Option<(Option<Entry>, OwnedSemaphorePermit)>> {
    let server = &job.server;
    let failed = |e| {
        LdapError::new(
            ResultCode::OTHER,
            format!("search failed unexpectedly: {e}"),
        )
    };
    let held = {
        let (j, b) = (job.clone(), base.clone());
        tokio::task::spawn_blocking(move || held_base(&j, &b))
            .await
            .map_err(failed)??
    };
    let content = server.acl.reads_entries() || job.controls.assertion.is_some();
    let own = matches!(held, Some((true, _)));
    let probed = if own || !content || job.req.scope == Scope::Base {
        None
    } else {
        match t.remote.read(&server.schema, &job.req.base).await {
            Ok(Some(e)) => Some(e),
            Ok(None) if held.is_none() => {
                return Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"))
            }
            Err(e) if held.is_none() => {
                tracing::warn!(remote = %t.remote.endpoint.url, error = %e, "translucent: the remote server could not be read");
                let why = t.failure_text(job.who.is_admin(), &e);
                return Err(LdapError::new(ResultCode::UNAVAILABLE, why));
            }
            // The part stands in; the search reports the failure.
            _ => None,
        }
    };
    if own || !content || probed.is_some() {
        let entry = match (held, &probed) {
            (Some((true, e)), _) => e,
            (Some((false, part)), Some(r)) => translucent::merge(&server.schema, r.clone(), &part),
            (Some((false, part)), None) => part,
            (None, Some(r)) => r.clone(),
            (None, None) => Entry::new(base.clone()),
        };
        let (j, n) = (job.clone(), base_norm.to_string());
        tokio::task::spawn_blocking(move || {
            let rtxn = j.server.rt.store.read()?;
            may_search(&j, &rtxn.view(), &n, &entry)
        })
        .await
        .map_err(failed)??;
    }
    let Some(place) = pando_ops::search::search_thread(job).await else {
        return Ok(None);
    };
    Ok(Some((probed, place)))
}

/// The base as stored: a local entry (true) or a part (false).
fn held_base(job: &SearchJob, base: &Dn) -> OpResult<Option<(bool, Entry)>> {
    let rtxn = job.server.rt.store.read()?;
    let view = rtxn.view();
    let rdns = pando_ops::norm_rdns(&view, base)?;
    let pando_store::Lookup::Found(id) = view.lookup_norm(&rdns)? else {
        return Ok(None);
    };
    let mut e = pando_ops::stored_entry(&view, id)?;
    e.dn = view.dn(id)?;
    Ok(Some((!translucent::is_part(&e), e)))
}

/// As for a stored base: searching it needs the search right on it (a
/// refusal reads as no such object).
fn may_search(job: &SearchJob, view: &View<'_>, norm: &str, entry: &Entry) -> OpResult<()> {
    let server = &*job.server;
    let mut access = Access::new(&server.acl, &job.who);
    if !access.unrestricted() {
        let rules = access.entry(&server.schema, norm, entry);
        if !access.allows(Some(view), &rules, norm, None, acl::SEARCH) {
            return Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"));
        }
    }
    Ok(())
}

/// What the remote is asked to return: every user attribute (the filter
/// is tested here, and access rules may look at any), and the operational
/// ones the client asks for or the filter tests.
fn remote_attrs(job: &SearchJob) -> Vec<String> {
    let mut attrs = vec!["*".to_string()];
    for a in &job.req.attrs {
        if a != "*" && a != "1.1" && !attrs.iter().any(|x| x.eq_ignore_ascii_case(a)) {
            attrs.push(a.clone());
        }
    }
    pando_ops::search::plan::for_each_filter_attr(&job.req.filter, &mut |a: &str| {
        if !attrs.iter().any(|x| x.eq_ignore_ascii_case(a)) {
            attrs.push(a.to_string());
        }
    });
    attrs
}

/// The stored base, and the local entries in scope that may match the
/// filter: index candidates, as a stored search finds them (at most
/// `max` when the filter is not indexed), less the parts; and the types
/// the suffix's parts override, from the same snapshot.
fn read_local(
    job: &SearchJob,
    base: &pando_model::Dn,
    max: u64,
    parts: &translucent::PartTypes,
    suffix_norm: &str,
) -> OpResult<(Local, Arc<Vec<String>>)> {
    let server = &*job.server;
    let rtxn = server.rt.store.read()?;
    let types = parts.types(&server.schema, &rtxn, suffix_norm)?;
    let view = rtxn.view();
    let mut local = Local {
        base: None,
        own: Vec::new(),
    };
    let rdns = pando_ops::norm_rdns(&view, base)?;
    let pando_store::Lookup::Found(base_id) = view.lookup_norm(&rdns)? else {
        return Ok((local, types));
    };
    let read = |id: EntryId| -> OpResult<Entry> {
        let mut e = pando_ops::stored_entry(&view, id)?;
        e.dn = view.dn(id)?;
        Ok(e)
    };
    let b = read(base_id)?;
    let base_own = !translucent::is_part(&b);
    local.base = Some((base_own.then_some(base_id), b.clone()));
    let scope = job.req.scope;
    if scope == Scope::Base {
        if base_own {
            local.own.push((rdns.join(","), base_id, b));
        }
        return Ok((local, types));
    }
    let cands = view.candidates(&job.req.filter)?;
    let (ids, check_scope) =
        scope_candidates(&view, max, base_id, scope, cands).map_err(|e| {
            if e.code != ResultCode::ADMIN_LIMIT_EXCEEDED {
                return e;
            }
            LdapError::new(
                ResultCode::ADMIN_LIMIT_EXCEEDED,
                format!("more than {max} entries are held here in the search's scope and the filter is not indexed (the translucent overlay's max_entries)"),
            )
        })?;
    for id in ids {
        let Some(place) = view.placement(id)? else {
            continue;
        };
        let in_scope = match check_scope {
            None => true,
            Some(Scope::One) => place.parent == base_id,
            Some(s) => {
                (s != Scope::Children && id == base_id)
                    || (id != base_id
                        && place.parent != 0
                        && view.is_within(place.parent, base_id)?)
            }
        };
        if !in_scope {
            continue;
        }
        let e = read(id)?;
        if translucent::is_part(&e) {
            continue;
        }
        let (_, norm) = view.dn_pair_of(&place)?;
        local.own.push((norm, id, e));
    }
    Ok((local, types))
}

/// Check the base; merge each remote entry with its part (or leave it
/// out when a local entry of its name hides it); then test and send them
/// and the local entries. The count sent, and the result when a size or
/// time limit ended it; None when the client went away.
fn emit(
    job: &SearchJob,
    base_norm: &str,
    base_entry: &Entry,
    own: Vec<(String, EntryId, Entry)>,
    remote: Vec<(String, Entry)>,
    started: Instant,
) -> OpResult<Option<(u64, Option<LdapResult>)>> {
    let server = &*job.server;
    let schema = &*server.schema;
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    // Checked again on the base as merged: settle_base may not have
    // seen its remote content.
    may_search(job, &view, base_norm, base_entry)?;
    pando_ops::search::hooks::before(job, Some(&view), base_norm, &mut || Ok(base_entry.clone()))?;
    let mut candidates: Vec<Candidate> = Vec::with_capacity(remote.len() + own.len());
    for (norm, r) in remote {
        let rdns = pando_ops::norm_rdns(&view, &r.dn)?;
        let e = match view.lookup_norm(&rdns)? {
            pando_store::Lookup::Found(id) => {
                let stored = pando_ops::stored_entry(&view, id)?;
                if !translucent::is_part(&stored) {
                    continue; // a local entry hides it
                }
                let part = Entry {
                    dn: r.dn.clone(),
                    attrs: stored.attrs,
                };
                translucent::merge(schema, r, &part)
            }
            _ => r,
        };
        candidates.push((norm, None, e));
    }
    candidates.extend(own.into_iter().map(|(n, id, e)| (n, Some(id), e)));
    let limits = pando_ops::search::limits::Limits::for_requester(server, &job.who, &view);
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
        if !pando_ops::norm_dn::in_scope(base_norm, job.req.scope, &norm) {
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
