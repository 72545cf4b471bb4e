//! Persistent search (draft-ietf-ldapext-psearch-03): after its initial
//! results (none with changesOnly) the search stays open, and every entry
//! a later change adds, modifies, renames or deletes is sent when it is
//! within the search's base and scope and matches its filter as the
//! requester may see it, in commit order, with an entry change
//! notification control when returnECs asks for it. A modify or rename
//! that takes an entry out of the result set is sent too (the entry as it
//! now is, if the requester may read it), so a client keeping copies
//! learns it left. A rename's previous DN is given only when the requester
//! could read the entry there. Entries a rename moves along with their
//! parent are not reported one by one.
//!
//! It follows the change feed ([`crate::feed`]) on its own task,
//! holding no thread and no read transaction between changes; an
//! operation touching many entries is matched on the blocking pool under
//! a search thread, as a large search is. It ends with Abandon or Cancel,
//! with `unavailable` when the server shuts down, or with
//! adminLimitExceeded when its client falls more than
//! `limits.persistent_search_backlog` operations behind (the feed's ring
//! overflowed: the writer never waits for it). Access is decided on the
//! store as it is when the change is sent.
//!
//! Only authenticated clients may hold one open; the requester's size and
//! time limits apply to the initial results only. Paged results, sort and
//! VLV are not combined with it.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use pando_model::Entry;
use pando_proto::control_values::{encode_entry_change, PersistentSearch};
use pando_proto::{oid, Control, LdapResult, ResultCode, Scope};
use pando_store::{EntryId, Lookup};
use tokio::sync::broadcast::error::RecvError;

use super::follow_places;
use super::matcher::Matcher;
use super::plan::Plan;
use super::{
    check_base, emitter_for, run_to_end, search_thread, virtual_tree, Finished, SearchJob,
    SearchOutcome,
};
use crate::error::{LdapError, OpResult};
use crate::feed::{Committed, Kind};
use crate::norm_dn::in_scope;
use crate::write::Change;
use pando_access::acl::Access;

/// How often a persistent search with no changes to send looks for
/// Abandon and Cancel.
const CHECK_ABANDON: Duration = Duration::from_millis(100);

/// An operation touching more entries than this is matched on the
/// blocking pool, holding a search thread, as a large search is.
pub(super) const INLINE_CHANGES: usize = 8;

/// Run a persistent search until it ends (see the module header).
pub async fn run(job: &Arc<SearchJob>) -> Finished {
    let Some(ps) = job.controls.persistent else {
        return run_to_end(job).await;
    };
    let base = match settle(job, "a persistent search", true) {
        Ok(base) => Arc::new(base),
        Err(e) => return done(e.into_result(), 0),
    };
    let _place = match follow_places::take(job) {
        Ok(place) => place,
        Err(refused) => return done(refused, 0),
    };
    // Subscribed before the initial search takes its snapshot: no change
    // falls between the two (one committed meanwhile may be sent twice).
    let mut follower = Follower::new(&job.server);
    let mut sent = 0;
    if !ps.changes_only {
        match run_to_end(job).await {
            Finished::Done(o) if o.result.code == ResultCode::SUCCESS => sent = o.entries,
            other => return other,
        }
    }
    loop {
        let committed = match follower.next(job, sent).await {
            Ok(c) => c,
            Err(end) => return end,
        };
        let encoded = match encode(job, ps, &base, committed).await {
            Some(Ok(out)) => out,
            Some(Err(e)) => return done(e.into_result(), sent),
            None => return Finished::Abandoned,
        };
        for chunk in encoded.chunks {
            if !deliver(job, chunk).await {
                return Finished::Abandoned;
            }
        }
        sent += encoded.entries;
    }
}

/// What a synchronization search holds before its refresh: in persist
/// mode its place among the searches that follow changes and its place
/// on the change feed (subscribed before the refresh takes its snapshot,
/// so no change falls between the two; one committed meanwhile may be
/// sent twice, and consumers skip what their cookie covers); then a
/// search thread for the refresh. Err: how the search ends instead.
pub struct Started {
    pub place: Option<super::holders::Place>,
    pub follower: Option<Follower>,
    pub thread: tokio::sync::OwnedSemaphorePermit,
}

pub async fn start_following(job: &SearchJob, persist: bool) -> Result<Started, Finished> {
    let place = match persist.then(|| follow_places::take(job)).transpose() {
        Ok(place) => place,
        Err(refused) => return Err(done(refused, 0)),
    };
    let follower = persist.then(|| Follower::new(&job.server));
    let Some(thread) = search_thread(job).await else {
        return Err(Finished::Abandoned);
    };
    Ok(Started {
        place,
        follower,
        thread,
    })
}

/// A search's place on the change feed: the committed operations it has
/// not seen yet, and how it ends otherwise.
pub struct Follower {
    feed: tokio::sync::broadcast::Receiver<Arc<Committed>>,
    closing: tokio::sync::watch::Receiver<bool>,
    tick: tokio::time::Interval,
}

impl Follower {
    /// Following from now on (subscribe before taking the snapshot the
    /// search starts from).
    pub(super) fn new(server: &crate::state::Server) -> Follower {
        Follower {
            feed: server.rt.feed.subscribe(),
            closing: server.rt.feed.closing(),
            tick: tokio::time::interval(CHECK_ABANDON),
        }
    }

    /// The next committed operation, or how the search ends: abandoned or
    /// cancelled (no answer), `unavailable` at shutdown, adminLimitExceeded
    /// when it fell more than the feed's ring behind. `sent`: entries sent
    /// so far, for the answer.
    pub async fn next(&mut self, job: &SearchJob, sent: u64) -> Result<Arc<Committed>, Finished> {
        let limits = &job.server.cfg.config.limits;
        loop {
            let next = tokio::select! {
                next = self.feed.recv() => next,
                _ = self.closing.changed() => {
                    return Err(done(LdapResult::new(ResultCode::UNAVAILABLE, "the server is shutting down"), sent));
                }
                _ = self.tick.tick() => {
                    if job.abandoned.load(Ordering::Relaxed) {
                        return Err(Finished::Abandoned);
                    }
                    continue;
                }
            };
            if job.abandoned.load(Ordering::Relaxed) {
                return Err(Finished::Abandoned);
            }
            return match next {
                Ok(c) => Ok(c),
                Err(RecvError::Lagged(lost)) => {
                    let message = format!(
                        "the client fell more than {} changes behind (limits.persistent_search_backlog) and {lost} were dropped; search again",
                        limits.persistent_search_backlog
                    );
                    Err(done(
                        LdapResult::new(ResultCode::ADMIN_LIMIT_EXCEEDED, message),
                        sent,
                    ))
                }
                // The sender lives as long as the server, which this job holds.
                Err(RecvError::Closed) => Err(Finished::Abandoned),
            };
        }
    }
}

/// Hand `chunk` to the connection, waiting while its client is slow
/// (bounded by the connection's write-rate rule; the feed keeps the
/// backlog meanwhile) but not past an Abandon or Cancel. False: the
/// search is over.
pub async fn deliver(job: &SearchJob, chunk: Vec<u8>) -> bool {
    loop {
        match tokio::time::timeout(CHECK_ABANDON, job.out.reserve()).await {
            Ok(Ok(permit)) => {
                permit.send(chunk);
                return true;
            }
            Ok(Err(_)) => return false,
            Err(_) if job.abandoned.load(Ordering::Relaxed) => return false,
            Err(_) => {}
        }
    }
}

pub fn done(result: LdapResult, entries: u64) -> Finished {
    Finished::Done(SearchOutcome {
        result,
        controls: Vec::new(),
        entries,
    })
}

/// The search's base as a normalised DN, after the checks any search of
/// it makes (it exists, the requester may search it, the hooks' before
/// steps), and the refusals particular to searches that follow changes
/// (`what` names them; `needs_auth`: not for anonymous clients).
pub(super) fn settle(job: &SearchJob, what: &str, needs_auth: bool) -> OpResult<String> {
    let server = &job.server;
    let c = &job.controls;
    if c.paged.is_some() || c.sort.is_some() || c.vlv.is_some() {
        return Err(LdapError::new(
            ResultCode::UNWILLING_TO_PERFORM,
            format!("{what} cannot be combined with paged results, sorting or a virtual list view"),
        ));
    }
    if c.persistent.is_some() && c.sync.is_some() {
        return Err(LdapError::new(
            ResultCode::UNWILLING_TO_PERFORM,
            "a search cannot be both persistent and a content synchronization",
        ));
    }
    if needs_auth && job.who.is_anonymous() {
        return Err(LdapError::new(
            ResultCode::UNWILLING_TO_PERFORM,
            format!("{what} needs an authenticated client"),
        ));
    }
    let cached = server.base_cache.get(&server.schema, &job.req.base)?;
    if virtual_tree::owner(server, &cached.0).is_some() {
        return Err(LdapError::new(
            ResultCode::UNWILLING_TO_PERFORM,
            format!("the root DSE, cn=Subschema and cn=Monitor cannot be the base of {what}"),
        ));
    }
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    let id = crate::resolve_rdns_for(server, &view, &job.who, &cached.1)?;
    let norm = cached.2.clone();
    let mut access = Access::new(&server.acl, &job.who);
    check_base(job, &view, &mut access, id, &norm, None)?;
    Ok(norm)
}

/// What one committed operation gives a persistent search: encoded
/// entries in chunks of about [`super::CHUNK`], and how many.
#[derive(Default)]
struct Encoded {
    chunks: Vec<Vec<u8>>,
    entries: u64,
}

/// [`encode_changes`], on the blocking pool when the operation touched
/// many entries (None: abandoned while waiting for a thread).
async fn encode(
    job: &Arc<SearchJob>,
    ps: PersistentSearch,
    base: &Arc<String>,
    committed: Arc<Committed>,
) -> Option<OpResult<Encoded>> {
    if committed.changes.len() <= INLINE_CHANGES {
        return Some(encode_changes(job, &ps, base, &committed));
    }
    let slot = search_thread(job).await?;
    let (job, base) = (job.clone(), base.clone());
    let ran = tokio::task::spawn_blocking(move || {
        let out = encode_changes(&job, &ps, &base, &committed);
        drop(slot);
        out
    })
    .await;
    Some(ran.unwrap_or_else(|_| {
        Err(LdapError::new(
            ResultCode::OTHER,
            "persistent search failed unexpectedly",
        ))
    }))
}

/// The entries `committed` gives this search (see [`send_change`]).
fn encode_changes(
    job: &SearchJob,
    ps: &PersistentSearch,
    base: &str,
    committed: &Committed,
) -> OpResult<Encoded> {
    let wanted: Vec<&Change> = committed
        .changes
        .iter()
        .filter(|c| ps.change_types & c.kind().code() != 0)
        .filter(|c| {
            in_scope(base, job.req.scope, c.norm())
                || c.before
                    .as_ref()
                    .is_some_and(|b| in_scope(base, job.req.scope, &b.norm))
        })
        .collect();
    let mut out = Encoded::default();
    if wanted.is_empty() {
        return Ok(out);
    }
    let server = &job.server;
    let schema = &*server.schema;
    let req = &job.req;
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    let plan = Plan::for_held_entries(schema, &req.filter);
    let mut matcher = Matcher::for_job(job, &view, &plan, 0);
    let emitter = emitter_for(job);
    let sent = Sent {
        base,
        // Where an entry is stored matters only to computed attributes.
        needs_id: !plan.needed_computed.is_empty()
            || crate::COMPUTED
                .iter()
                .any(|name| emitter.sel.wants_computed(name)),
        return_ecs: ps.return_ecs,
    };
    let mut buf = Vec::new();
    for c in wanted {
        if send_change(job, &sent, &mut matcher, &emitter, c, &mut buf)? {
            out.entries += 1;
        }
        if buf.len() >= super::CHUNK {
            out.chunks.push(std::mem::take(&mut buf));
        }
    }
    if !buf.is_empty() {
        out.chunks.push(buf);
    }
    Ok(out)
}

/// What [`send_change`] needs besides the change.
struct Sent<'a> {
    base: &'a str,
    needs_id: bool,
    return_ecs: bool,
}

/// Encode one change into `buf` when the search should see it: the entry
/// as the change left it (a delete: as it was) is in scope and matches the
/// filter as the requester may see it; or, for a modify or a rename, the
/// entry did before the change and the requester may still read it (so
/// a client keeping a copy learns that it left). A rename's previous DN
/// is given only when the requester could read the entry there.
fn send_change(
    job: &SearchJob,
    sent: &Sent<'_>,
    matcher: &mut Matcher<'_, '_>,
    emitter: &super::emit::Emitter<'_>,
    c: &Change,
    buf: &mut Vec<u8>,
) -> OpResult<bool> {
    let kind = c.kind();
    let scope = job.req.scope;
    let stored = |id: EntryId| sent.needs_id.then_some(id);
    let before = c.before.as_ref();
    // Before the change (modify, rename): visible, and in the result set?
    let (mut was_visible, mut was_in) = (false, false);
    if let (Some(b), Kind::Modify | Kind::ModDn) = (before, kind) {
        was_visible = matcher.may_read_entry(&b.norm, &b.entry);
        was_in = was_visible
            && in_scope(sent.base, scope, &b.norm)
            && shows_subentry(job, crate::is_subentry(&b.entry))
            && matcher
                .test_held(stored(b.id), &b.norm, b.entry.clone())?
                .is_some();
    }
    // After it (for a delete: the entry as it was).
    let norm = c.norm();
    // An added entry is found by its DN (a later change may have reused it).
    let id = match before {
        Some(b) => stored(b.id),
        None if sent.needs_id => stored_id(matcher.view, c.entry())?,
        None => None,
    };
    let entry = c.entry().clone();
    let is_in = in_scope(sent.base, scope, norm) && shows_subentry(job, crate::is_subentry(&entry));
    let entry = if is_in {
        matcher.test_held(id, norm, entry)?
    } else {
        None
    };
    let entry = match entry {
        Some(e) => e,
        // Left the result set: sent as it now is, if readable.
        None if was_in && matcher.may_read_entry(norm, c.entry()) => c.entry().clone(),
        None => return Ok(false),
    };
    let controls = if sent.return_ecs {
        let previous = c.previous_dn().filter(|_| was_visible);
        vec![Control {
            oid: oid::ENTRY_CHANGE.into(),
            critical: false,
            value: Some(encode_entry_change(kind.code(), previous.as_deref(), None)),
        }]
    } else {
        Vec::new()
    };
    matcher.emit_held(emitter, id, norm, &entry, &controls, buf)?;
    Ok(true)
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
