//! RFC 4533 content synchronization, the provider's side: a search with
//! the Sync Request control, as OpenLDAP's consumers (and Pando's) send it.
//!
//! **Refresh.** On one snapshot, against the consumer's cookie (its CSN
//! per server ID; see `pando_proto::sync::Cookie`):
//! - no cookie CSN: the initial content, every entry as `add`, ending as
//!   OpenLDAP ends it (refreshDeletes TRUE: there is nothing to delete);
//! - nothing newer here than the cookie: nothing, ending as a delete phase;
//! - the change log covers the cookie (its floor is not newer than any of
//!   the cookie's CSNs; `pando_store::LoggedChange`): a **delete phase** —
//!   the UUIDs of entries deleted, moved out of scope, or changed so they
//!   no longer match since the cookie, in `syncIdSet`s (refreshDeletes
//!   TRUE), then the entries changed since the cookie as `add`;
//! - otherwise a **present phase**: every matching entry, the changed ones
//!   as `add`, the others as UUIDs in `syncIdSet`s (the consumer deletes
//!   what was not mentioned) — or e-syncRefreshRequired (4096) when
//!   `replication.refresh_required` is set and the consumer did not ask for
//!   a reload.
//!
//! A cookie CSN for this server's ID newer than this server's, or a cookie
//! with CSNs when this server has none, is answered unwillingToPerform
//! (53), as OpenLDAP answers both ("consumer state is newer than
//! provider"): the consumer was synchronised with another history.
//!
//! refreshOnly ends with SearchResultDone and a Sync Done control carrying
//! the new cookie. refreshAndPersist ends the refresh with a Sync Info
//! (refreshPresent or refreshDelete) and then follows the change feed:
//! every change within the search is sent with a Sync State control
//! (`add` for a new entry, `modify` for a changed one with all its
//! attributes, `delete` with the DN only for an entry that went or left
//! the search) and the cookie after it; an operation that gives it nothing
//! still moves its cookie (a `newcookie` Sync Info); changes whose CSN
//! carries the consumer's own server ID (its cookie's `sid`) are not sent
//! back. It ends
//! as a persistent search ends (Cancel, Abandon, shutdown, or
//! adminLimitExceeded when the consumer falls more than
//! `limits.persistent_search_backlog` operations behind; it then comes back
//! with its cookie).
//!
//! Entries carry stored attributes only (computed ones, contextCSN among
//! them, are each server's own). Access is the requester's, as for any
//! search; its size and time limits apply to the refresh only.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pando_model::{Dn, Entry};
use pando_proto::sync::{
    csn_sid, uuid_bytes, Cookie, SyncDone, SyncInfo, SyncMode, SyncRequest, SyncState,
    SyncStateKind, SyncUuid,
};
use pando_proto::{
    oid, Control, DerefAliases, EntryEncoder, LdapMessage, LdapResult, ProtocolOp, ResultCode,
};
use pando_store::{Candidates, EntryId, LoggedKind, View};
use roaring::RoaringTreemap;

use super::emit::Emitter;
use super::limits::{smaller_limit, Limits};
use super::matcher::Matcher;
use super::persistent::{deliver, done, settle, start_following, Started};
use super::plan::{scope_candidates, Plan};
use super::{emitter_for, Finished, SearchJob, SearchOutcome, CHUNK};
use crate::error::{LdapError, OpResult};
use crate::feed::{Committed, Kind};
use crate::norm_dn::{in_scope, split_rdns};
use crate::write::change::entry_csn;
use crate::write::Change;

/// UUIDs per `syncIdSet` message, as OpenLDAP sends them.
const ID_SET_SIZE: usize = 256;

/// How often a refresh waiting for its client looks for Abandon.
const CHECK_ABANDON: Duration = Duration::from_millis(100);

/// Run a synchronization search until it ends (see the module header).
pub async fn run(job: &Arc<SearchJob>) -> Finished {
    let Some(req) = job.controls.sync.clone() else {
        return super::run_to_end(job).await;
    };
    let theirs = match their_cookie(job, &req) {
        Ok(c) => c,
        Err(refused) => return done(refused, 0),
    };
    // A tree that synchronizes its own entries (the access log) does so.
    let base = pando_model::Dn::parse(&job.req.base).ok();
    if let Some(tree) = base.and_then(|b| super::virtual_tree::owner(&job.server, &b)) {
        if let Some(sync) = tree.synchronize(job, req.clone(), theirs.clone()) {
            return sync.await;
        }
    }
    let persist = req.mode == SyncMode::RefreshAndPersist;
    let what = "a content synchronization search";
    let base = match settle(job, what, persist) {
        Ok(base) => Arc::new(base),
        Err(e) => return done(e.into_result(), 0),
    };
    let Started {
        place: _place,
        mut follower,
        thread: slot,
    } = match start_following(job, persist).await {
        Ok(started) => started,
        Err(end) => return end,
    };
    let (j, b, r) = (job.clone(), base.clone(), req.clone());
    let ran = tokio::task::spawn_blocking(move || {
        let out = refresh(&j, &r, &theirs, &b);
        drop(slot);
        out
    })
    .await;
    let refreshed = match ran {
        Ok(Ok(Some(r))) => r,
        Ok(Ok(None)) => return Finished::Abandoned,
        Ok(Err(e)) => return done(e.into_result(), 0),
        Err(_) => return Finished::Failed,
    };
    let Refreshed {
        sent,
        cookie,
        deletes,
    } = refreshed;
    let Some(follower) = follower.as_mut() else {
        let value = SyncDone {
            cookie: Some(cookie.format().into_bytes()),
            refresh_deletes: deletes,
        };
        return Finished::Done(SearchOutcome {
            result: LdapResult::success(),
            controls: vec![control(oid::SYNC_DONE, value.encode())],
            entries: sent,
        });
    };
    follow(job, follower, &base, &req, cookie, deletes, sent).await
}

/// The refresh is over: say so (refreshDelete or refreshPresent, done,
/// with the cookie), then send each committed change in scope as it
/// comes, until the client abandons or the server stops.
async fn follow(
    job: &Arc<SearchJob>,
    follower: &mut super::persistent::Follower,
    base: &Arc<String>,
    req: &SyncRequest,
    mut cookie: Cookie,
    deletes: bool,
    sent: u64,
) -> Finished {
    let text = Some(cookie.format().into_bytes());
    let info = if deletes {
        SyncInfo::RefreshDelete {
            cookie: text,
            done: true,
        }
    } else {
        SyncInfo::RefreshPresent {
            cookie: text,
            done: true,
        }
    };
    let mut buf = Vec::new();
    info_message(job.msg_id, &info, &mut buf);
    if !deliver(job, buf).await {
        return Finished::Abandoned;
    }
    let origin = cookie_origin(req);
    let mut sent = sent;
    loop {
        let committed = match follower.next(job, sent).await {
            Ok(c) => c,
            Err(end) => return end,
        };
        let encoded = match persist_off_loop(job, base, committed, &mut cookie, origin).await {
            Some(Ok(e)) => e,
            Some(Err(e)) => return done(e.into_result(), sent),
            None => return Finished::Abandoned,
        };
        for chunk in encoded.0 {
            if !deliver(job, chunk).await {
                return Finished::Abandoned;
            }
        }
        sent += encoded.1;
    }
}

/// The cookie the client sent, parsed (empty when it sent none); or the
/// refusal: a malformed cookie, or alias dereferencing while searching
/// (RFC 4533 3.3: aliases are not dereferenced in content
/// synchronization).
fn their_cookie(job: &SearchJob, req: &SyncRequest) -> Result<Cookie, LdapResult> {
    let theirs = req
        .cookie
        .as_deref()
        .map(Cookie::parse)
        .transpose()
        .map_err(|e| {
            LdapResult::new(
                ResultCode::PROTOCOL_ERROR,
                format!("malformed sync cookie: {}", e.reason),
            )
        })?;
    if matches!(
        job.req.deref,
        DerefAliases::InSearching | DerefAliases::Always
    ) {
        return Err(LdapResult::new(
            ResultCode::PROTOCOL_ERROR,
            "a content synchronization search cannot dereference aliases while searching",
        ));
    }
    Ok(theirs.unwrap_or_default())
}

/// The server ID the consumer gave in its cookie (its own): changes it
/// made are not sent back to it.
fn cookie_origin(req: &SyncRequest) -> Option<u16> {
    req.cookie
        .as_deref()
        .and_then(|c| Cookie::parse(c).ok())
        .and_then(|c| c.sid)
}

/// The search's emitter, sending stored attributes only (computed ones
/// are each server's own).
fn stored_emitter(job: &SearchJob) -> Emitter<'_> {
    let mut e = emitter_for(job);
    std::sync::Arc::make_mut(&mut e.sel).stored_only = true;
    e
}

pub fn control(oid: &str, value: Vec<u8>) -> Control {
    Control {
        oid: oid.into(),
        critical: false,
        value: Some(value),
    }
}

pub fn state_control(state: SyncStateKind, uuid: SyncUuid, cookie: Option<&Cookie>) -> Control {
    let value = SyncState {
        state,
        uuid,
        cookie: cookie.map(|c| c.format().into_bytes()),
    };
    control(oid::SYNC_STATE, value.encode())
}

pub fn info_message(msg_id: i32, info: &SyncInfo, buf: &mut Vec<u8>) {
    LdapMessage {
        id: msg_id,
        op: ProtocolOp::IntermediateResponse {
            name: Some(oid::SYNC_INFO.into()),
            value: Some(info.encode()),
        },
        controls: Vec::new(),
    }
    .encode(buf);
}

/// A SearchResultEntry with the DN only, telling the consumer the entry
/// `uuid` went (or left the search).
fn delete_message(
    msg_id: i32,
    dn: &str,
    uuid: SyncUuid,
    cookie: Option<&Cookie>,
    buf: &mut Vec<u8>,
) {
    let enc = EntryEncoder::begin(buf, msg_id, dn.as_bytes());
    enc.finish_with_controls(&[state_control(SyncStateKind::Delete, uuid, cookie)]);
}

/// The entry's entryUUID as 16 bytes (None: it has none that parses).
fn uuid_of(entry: &Entry) -> Option<SyncUuid> {
    let v = entry.get("entryUUID")?.values.first()?;
    uuid_bytes(std::str::from_utf8(v).ok()?)
}

/// What the refresh did.
struct Refreshed {
    sent: u64,
    /// This server's state when the refresh's snapshot was taken.
    cookie: Cookie,
    /// It ended as a delete phase (refreshDeletes TRUE): entries not
    /// mentioned are kept.
    deletes: bool,
}

/// How the refresh tells the consumer what it lacks.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Phase {
    /// No cookie: everything, as adds.
    Initial,
    /// Nothing changed since the cookie.
    UpToDate,
    /// Changes and deletes since the cookie, from the change log.
    Delete,
    /// Every matching entry: changed ones whole, others by UUID.
    Present,
}

/// The consumer's state against this server's: which phase, or the
/// refusal. `ours`: this server's CSN per server ID; `floor`: the change
/// log covers every change with a greater CSN. The consumer's reloadHint
/// only says it accepts a present phase instead of 4096 (OpenLDAP's
/// consumers always set it).
fn choose_phase(
    theirs: &Cookie,
    ours: &[String],
    own_sid: u16,
    floor: &str,
    reload_hint: bool,
    refresh_required: bool,
) -> OpResult<Phase> {
    let newer = || {
        LdapError::new(
            ResultCode::UNWILLING_TO_PERFORM,
            "consumer state is newer than provider (its cookie holds changes this server does not have)",
        )
    };
    if let Some(t) = theirs.csn_for(own_sid) {
        let o = ours.iter().find(|c| csn_sid(c) == Some(own_sid));
        if o.is_none_or(|o| t > o.as_str()) {
            return Err(newer());
        }
    }
    if theirs.csns.is_empty() {
        return Ok(Phase::Initial);
    }
    if ours.is_empty() {
        return Err(newer());
    }
    let behind = |o: &String| {
        csn_sid(o)
            .and_then(|sid| theirs.csn_for(sid))
            .is_none_or(|t| t < o.as_str())
    };
    if !ours.iter().any(behind) {
        return Ok(Phase::UpToDate);
    }
    // Every change after the cookie is logged: for each server, what the
    // consumer holds is not older than the floor (a server it knows
    // nothing of needs the log from the start).
    let covered = floor.is_empty()
        || ours.iter().all(|o| {
            csn_sid(o)
                .and_then(|sid| theirs.csn_for(sid))
                .is_some_and(|t| t >= floor)
        });
    if covered {
        return Ok(Phase::Delete);
    }
    if refresh_required && !reload_hint {
        return Err(LdapError::new(
            ResultCode::SYNC_REFRESH_REQUIRED,
            "the change log no longer covers this cookie: reload (the consumer's content must be refreshed whole)",
        ));
    }
    Ok(Phase::Present)
}

/// Whether a change stamped `csn` is newer than what the cookie holds for
/// its server.
fn is_newer(theirs: &Cookie, csn: &str) -> bool {
    csn_sid(csn)
        .and_then(|sid| theirs.csn_for(sid))
        .is_none_or(|t| csn > t)
}

/// Output of a refresh, sent in chunks as it grows; waits for the client
/// (noticing Abandon) rather than buffering.
pub struct Sink<'j> {
    pub job: &'j SearchJob,
    pub buf: Vec<u8>,
}

impl Sink<'_> {
    /// Send what is buffered once it reaches a chunk (`all`: whatever
    /// there is). False: the search was abandoned or its client went.
    pub fn flush(&mut self, all: bool) -> bool {
        if self.buf.is_empty() || (!all && self.buf.len() < CHUNK) {
            return !self.job.abandoned.load(Ordering::Relaxed);
        }
        let mut chunk = Some(std::mem::take(&mut self.buf));
        let handle = tokio::runtime::Handle::current();
        loop {
            if self.job.abandoned.load(Ordering::Relaxed) {
                return false;
            }
            match handle.block_on(tokio::time::timeout(CHECK_ABANDON, self.job.out.reserve())) {
                Ok(Ok(permit)) => {
                    if let Some(c) = chunk.take() {
                        permit.send(c);
                    }
                    return true;
                }
                Ok(Err(_)) => return false,
                Err(_) => {}
            }
        }
    }

    fn id_set(&mut self, uuids: &[SyncUuid], refresh_deletes: bool) {
        let info = SyncInfo::IdSet {
            cookie: None,
            refresh_deletes,
            uuids: uuids.to_vec(),
        };
        info_message(self.job.msg_id, &info, &mut self.buf);
    }
}

/// The refresh stage on a blocking thread (see the module header). None:
/// abandoned.
fn refresh(
    job: &SearchJob,
    req: &SyncRequest,
    theirs: &Cookie,
    base: &str,
) -> OpResult<Option<Refreshed>> {
    let server = &job.server;
    let repl = &server.cfg.config.replication;
    let schema = &*server.schema;
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    let ours = view.context_csns()?;
    let floor = view.changelog_floor()?;
    let phase = choose_phase(
        theirs,
        &ours,
        repl.server_id,
        &floor,
        req.reload_hint,
        repl.refresh_required,
    )?;
    let cookie = Cookie {
        rid: theirs.rid,
        sid: (repl.server_id != 0).then_some(repl.server_id),
        csns: ours,
        delcsn: None,
    };
    let deletes = phase != Phase::Present;
    if phase == Phase::UpToDate {
        return Ok(Some(Refreshed {
            sent: 0,
            cookie,
            deletes,
        }));
    }
    let limits = Limits::for_requester(server, &job.who, &view);
    let size = smaller_limit(limits.size, job.req.size_limit.max(0) as u32);
    let time = smaller_limit(limits.time, job.req.time_limit.max(0) as u32);
    let started = Instant::now();
    let base_id = match view.lookup_norm(&split_rdns(base))? {
        pando_store::Lookup::Found(id) => id,
        _ => {
            return Err(LdapError::new(
                ResultCode::NO_SUCH_OBJECT,
                "the search base went away",
            ))
        }
    };
    let oldest_known = oldest_known(&cookie, theirs);
    // Otherwise every entry the filter may match.
    let ids = if phase == Phase::Delete {
        RoaringTreemap::new()
    } else {
        let cands = if job.req.scope == pando_proto::Scope::Base {
            Candidates::All
        } else {
            view.candidates(&job.req.filter)?
        };
        scope_candidates(&view, limits.unindexed, base_id, job.req.scope, cands)?.0
    };
    let plan = Plan::for_held_entries(schema, &job.req.filter);
    let mut matcher = Matcher::for_job(job, &view, &plan, base_id);
    let emitter = stored_emitter(job);
    let mut sink = Sink {
        job,
        buf: Vec::new(),
    };
    let mut scan = Scan {
        job,
        view: &view,
        base,
        theirs,
        size,
        time,
        started,
        sent: 0,
    };
    let finished = match phase {
        Phase::Delete => scan.delete_phase(&oldest_known, &mut matcher, &emitter, &mut sink)?,
        // Multi-provider: the entries deleted here go first.
        _ => {
            (!server.multi_provider() || scan.deleted_here(&mut matcher, &mut sink)?)
                && scan.present_phase(&ids, phase, &mut matcher, &emitter, &mut sink)?
        }
    };
    if !finished || !sink.flush(true) {
        return Ok(None);
    }
    Ok(Some(Refreshed {
        sent: scan.sent,
        cookie,
        deletes,
    }))
}

/// Where a delete phase starts reading the change log: the oldest of
/// the consumer's CSNs for the servers `ours` knows; from the start ("")
/// when the consumer's cookie lacks one of them.
fn oldest_known(ours: &Cookie, theirs: &Cookie) -> String {
    let known: Option<Vec<&str>> = ours
        .csns
        .iter()
        .map(|o| csn_sid(o).and_then(|sid| theirs.csn_for(sid)))
        .collect();
    known
        .and_then(|csns| csns.into_iter().min())
        .unwrap_or("")
        .to_string()
}

/// One refresh's walk over the store.
struct Scan<'a> {
    job: &'a SearchJob,
    view: &'a View<'a>,
    base: &'a str,
    theirs: &'a Cookie,
    size: u32,
    time: u32,
    started: Instant,
    sent: u64,
}

impl Scan<'_> {
    /// The entry `id` if it is within the search, with its normalised DN.
    fn load(&self, id: EntryId) -> OpResult<Option<(String, Entry)>> {
        let Some(place) = self.view.placement(id)? else {
            return Ok(None);
        };
        let (_, norm) = self.view.dn_pair_of(&place)?;
        if !in_scope(self.base, self.job.req.scope, &norm) {
            return Ok(None);
        }
        Ok(self.view.entry(id)?.map(|e| (norm, e)))
    }

    /// The size and time limits (of the refresh only).
    fn check_limits(&self) -> OpResult<()> {
        if self.size > 0 && self.sent >= u64::from(self.size) {
            return Err(LdapError::new(
                ResultCode::SIZE_LIMIT_EXCEEDED,
                "the refresh reached the size limit",
            ));
        }
        if self.time > 0 && self.started.elapsed().as_secs() >= u64::from(self.time) {
            return Err(LdapError::new(
                ResultCode::TIME_LIMIT_EXCEEDED,
                "the refresh reached the time limit",
            ));
        }
        Ok(())
    }

    /// The entry `id`, named `norm`, as an add.
    fn send_add(
        &mut self,
        matcher: &mut Matcher<'_, '_>,
        emitter: &Emitter<'_>,
        (id, norm, entry): (EntryId, &str, &Entry),
        sink: &mut Sink<'_>,
    ) -> OpResult<()> {
        self.check_limits()?;
        let Some(uuid) = uuid_of(entry) else {
            return Ok(());
        };
        let ctl = [state_control(SyncStateKind::Add, uuid, None)];
        matcher.emit_held(emitter, Some(id), norm, entry, &ctl, &mut sink.buf)?;
        self.sent += 1;
        Ok(())
    }

    /// Initial content or present phase: every matching entry; changed
    /// ones (all, initially) whole, the others as present UUIDs. False:
    /// abandoned.
    fn present_phase(
        &mut self,
        ids: &RoaringTreemap,
        phase: Phase,
        matcher: &mut Matcher<'_, '_>,
        emitter: &Emitter<'_>,
        sink: &mut Sink<'_>,
    ) -> OpResult<bool> {
        let mut present: Vec<SyncUuid> = Vec::new();
        for id in ids {
            let Some((norm, entry)) = self.load(id)? else {
                continue;
            };
            let Some(uuid) = uuid_of(&entry) else {
                continue;
            };
            // A multi-provider's entry may hold changes of several servers
            // (merged), its entryCSN naming only the newest: any of them
            // newer than the cookie makes it changed.
            let changed = phase == Phase::Initial
                || entry_csn(&entry).is_none_or(|c| is_newer(self.theirs, c))
                || crate::write::merge::State::of(&entry)
                    .csns()
                    .any(|c| !c.is_empty() && is_newer(self.theirs, c));
            let Some(entry) = matcher.test_held(Some(id), &norm, entry)? else {
                continue;
            };
            if changed {
                self.send_add(matcher, emitter, (id, &norm, &entry), sink)?;
            } else {
                present.push(uuid);
                if present.len() == ID_SET_SIZE {
                    sink.id_set(&present, false);
                    present.clear();
                }
            }
            if !sink.flush(false) {
                return Ok(false);
            }
        }
        if !present.is_empty() {
            sink.id_set(&present, false);
        }
        Ok(true)
    }

    /// Multi-provider, before a whole load or a present phase: the entries
    /// deleted here that this server remembers (see `ops::write::tombstones`),
    /// each as a `delete` naming its UUID, so a consumer that holds a copy
    /// (received from another server) deletes it; of its entries this
    /// server did not name, it deletes those whose last change this
    /// server's state (the refresh's cookie) takes in, and keeps the
    /// others, as they may be on their way here.
    /// Not as syncIdSets: OpenLDAP's consumer forgets the UUIDs named
    /// present when it deletes UUIDs named in a set, and reads a later set
    /// of present UUIDs as deletes too.
    ///
    /// Only the deleted entries the search would have returned are named:
    /// a tombstone is judged as the entry it keeps, at its last name here —
    /// within the search's base and scope, and readable by the requester
    /// under the access rules, as a held entry is (not tested against the
    /// filter: the entry may have matched before its last change, and a
    /// delete of an entry the consumer does not hold is ignored). A
    /// tombstone without a name (a delete received for an entry this
    /// server never had) goes only to requesters who may read every entry.
    /// False: abandoned.
    fn deleted_here(
        &mut self,
        matcher: &mut Matcher<'_, '_>,
        sink: &mut Sink<'_>,
    ) -> OpResult<bool> {
        use crate::write::tombstones;
        let scope = self.job.req.scope;
        let mut reads_every_entry = None;
        for uuid in tombstones::deleted_uuids(self.view)? {
            let Some(bytes) = uuid_bytes(&uuid) else {
                continue;
            };
            let named = tombstones::get(self.view, &uuid)?.filter(|t| !t.norm.is_empty());
            let dn = match named {
                Some(t) => {
                    if !in_scope(self.base, scope, &t.norm)
                        || !matcher.may_read_entry(&t.norm, &t.entry)
                    {
                        continue;
                    }
                    t.norm
                }
                None => {
                    let every = *reads_every_entry
                        .get_or_insert_with(|| matcher.access.reads_every_entry());
                    if !every {
                        continue;
                    }
                    self.base.to_string()
                }
            };
            let enc = EntryEncoder::begin(&mut sink.buf, self.job.msg_id, dn.as_bytes());
            enc.finish_with_controls(&[state_control(SyncStateKind::Delete, bytes, None)]);
            if !sink.flush(false) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    /// Delete phase, from the change log, which the phase's choice made
    /// sure covers the cookie: what went or left the search since (deleted,
    /// moved out, or changed so that it no longer matches), then the
    /// changed entries that match. Deletes go first, so an entry added
    /// where a deleted one was never meets it on the consumer. False:
    /// abandoned.
    fn delete_phase(
        &mut self,
        oldest_known: &str,
        matcher: &mut Matcher<'_, '_>,
        emitter: &Emitter<'_>,
        sink: &mut Sink<'_>,
    ) -> OpResult<bool> {
        let schema = self.job.server.schema.clone();
        let scope = self.job.req.scope;
        let mut gone: Vec<SyncUuid> = Vec::new();
        // Entries the log says changed since the cookie, first change
        // first; a moved entry brings its descendants (their DNs changed,
        // not their records).
        let mut changed: Vec<EntryId> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for rec in self.view.changes_after(oldest_known)? {
            let rec = rec?;
            if !is_newer(self.theirs, &rec.csn) {
                continue;
            }
            if rec.kind == LoggedKind::Delete {
                if norm_of(&schema, &rec.dn).is_some_and(|n| in_scope(self.base, scope, &n)) {
                    gone.extend(uuid_bytes(&rec.uuid));
                }
                continue;
            }
            let Some(id) = crate::write::replicated::find_by_uuid(self.view, &rec.uuid)? else {
                continue;
            };
            if seen.insert(id) {
                changed.push(id);
            }
            if rec.kind != LoggedKind::ModDn {
                continue;
            }
            let was_in = rec
                .old_dn
                .as_deref()
                .and_then(|d| norm_of(&schema, d))
                .is_some_and(|n| in_scope(self.base, scope, &n));
            let is_in = norm_of(&schema, &rec.dn).is_some_and(|n| in_scope(self.base, scope, &n));
            if was_in && !is_in {
                gone.extend(uuid_bytes(&rec.uuid));
            }
            for below in self.view.subtree(id, u64::MAX)?.into_iter().flatten() {
                if below == id || !seen.insert(below) {
                    continue;
                }
                changed.push(below);
                // Moved out with it: gone (unknown UUIDs are ignored).
                if was_in && !is_in {
                    if let Some(u) = self.view.entry(below)?.as_ref().and_then(uuid_of) {
                        gone.push(u);
                    }
                }
            }
        }
        // The changed entries as they are now: matching ones are sent
        // below, the others went out of the result set.
        let mut matching = Vec::new();
        for &id in &changed {
            let Some((norm, entry)) = self.load(id)? else {
                continue;
            };
            let Some(u) = uuid_of(&entry) else {
                continue;
            };
            match matcher.test_held(Some(id), &norm, entry)? {
                Some(_) => matching.push(id),
                None => gone.push(u),
            }
        }
        let mut once = std::collections::HashSet::new();
        gone.retain(|u| once.insert(*u));
        for batch in gone.chunks(ID_SET_SIZE) {
            sink.id_set(batch, true);
            if !sink.flush(false) {
                return Ok(false);
            }
        }
        for id in matching {
            let Some((norm, entry)) = self.load(id)? else {
                continue;
            };
            let Some(entry) = matcher.test_held(Some(id), &norm, entry)? else {
                continue;
            };
            self.send_add(matcher, emitter, (id, &norm, &entry), sink)?;
            if !sink.flush(false) {
                return Ok(false);
            }
        }
        Ok(true)
    }
}

/// `dn` normalised, if it parses.
fn norm_of(schema: &pando_model::schema::Schema, dn: &str) -> Option<String> {
    Dn::parse(dn)
        .ok()
        .and_then(|d| schema.normalize_dn(&d).ok())
}

/// [`persist_changes`], on the blocking pool holding a search thread (as
/// a large search does) when the operation moved a subtree (its
/// descendants are walked in the store: a rename of thousands of entries
/// would otherwise hold an async worker, and every connection served by
/// it, for as long as each following session walks them) or changed more
/// than a few entries (a tree delete); None: abandoned while waiting for
/// a thread.
async fn persist_off_loop(
    job: &Arc<SearchJob>,
    base: &Arc<String>,
    committed: Arc<Committed>,
    cookie: &mut Cookie,
    origin: Option<u16>,
) -> Option<OpResult<(Vec<Vec<u8>>, u64)>> {
    if !walks_store(&committed) {
        return Some(persist_changes(job, base, &committed, cookie, origin));
    }
    let slot = super::search_thread(job).await?;
    let (j, b, mut c) = (job.clone(), base.clone(), cookie.clone());
    let ran = tokio::task::spawn_blocking(move || {
        let out = persist_changes(&j, &b, &committed, &mut c, origin);
        drop(slot);
        (out, c)
    })
    .await;
    Some(match ran {
        Ok((out, c)) => {
            *cookie = c;
            out
        }
        Err(_) => Err(LdapError::new(
            ResultCode::OTHER,
            "content synchronization failed unexpectedly",
        )),
    })
}

/// Whether [`persist_changes`] may walk many entries for `committed`: a
/// subtree moved, or more changes than a persistent search matches inline.
pub(super) fn walks_store(committed: &Committed) -> bool {
    committed.changes.len() > super::persistent::INLINE_CHANGES
        || committed.changes.iter().any(|c| c.kind() == Kind::ModDn)
}

/// The messages one committed operation gives a consumer in the persist
/// stage, in chunks, and how many entries; `cookie` (the consumer's state
/// as this session sees it) moves past it.
fn persist_changes(
    job: &SearchJob,
    base: &str,
    committed: &Committed,
    cookie: &mut Cookie,
    origin: Option<u16>,
) -> OpResult<(Vec<Vec<u8>>, u64)> {
    cookie.advance(&committed.csn);
    // Made by the consumer's own server: it has it.
    if origin.is_some() && csn_sid(&committed.csn) == origin {
        return Ok((Vec::new(), 0));
    }
    // What goes with this operation's messages: a cookie naming its own
    // CSN only, as OpenLDAP's provider sends it. Its consumers judge a
    // change by the first CSN of the cookie that comes with it, so every
    // server's CSN there would make a change of a later server ID look
    // already applied (the consumer keeps the others).
    let cookie = &Cookie {
        csns: vec![committed.csn.clone()],
        delcsn: None,
        ..cookie.clone()
    };
    // Applied here from a consumer's refresh, whose entries come in no CSN
    // order: passed on without a cookie, so the state of the servers that
    // receive it does not move with it (it would then say they hold the
    // older changes of that server ID still on their way).
    let in_order = !committed.out_of_order;
    let scope = job.req.scope;
    let touches = |c: &Change| {
        in_scope(base, scope, c.norm())
            || c.before
                .as_ref()
                .is_some_and(|b| in_scope(base, scope, &b.norm))
    };
    let new_cookie = |cookie: &Cookie| {
        let mut buf = Vec::new();
        info_message(
            job.msg_id,
            &SyncInfo::NewCookie(cookie.format().into_bytes()),
            &mut buf,
        );
        Ok((vec![buf], 0))
    };
    if !committed.changes.iter().any(touches) {
        return if in_order {
            new_cookie(cookie)
        } else {
            Ok((Vec::new(), 0))
        };
    }
    let cookie = in_order.then_some(cookie);
    let server = &job.server;
    let schema = &*server.schema;
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    let plan = Plan::for_held_entries(schema, &job.req.filter);
    let mut matcher = Matcher::for_job(job, &view, &plan, 0);
    let emitter = stored_emitter(job);
    let (mut chunks, mut buf, mut entries) = (Vec::new(), Vec::new(), 0);
    for c in committed.changes.iter().filter(|c| touches(c)) {
        if persist_change(job, base, &mut matcher, &emitter, c, cookie, &mut buf)? {
            entries += 1;
        }
        if buf.len() >= CHUNK {
            chunks.push(std::mem::take(&mut buf));
        }
        if c.kind() == Kind::ModDn {
            let out = (&mut chunks, &mut buf);
            entries += persist_descendants(job, base, &mut matcher, &emitter, c, cookie, out)?;
        }
    }
    if !buf.is_empty() {
        chunks.push(buf);
    }
    if chunks.is_empty() {
        return match cookie {
            Some(cookie) => new_cookie(cookie),
            None => Ok((Vec::new(), 0)),
        };
    }
    Ok((chunks, entries))
}

/// One entry's change for a consumer: the entry whole when it is in the
/// search afterwards (`modify` if it was before, else `add`), a delete
/// with the DN only when it was before and is not now (deleted, moved out,
/// or no longer matching), else nothing.
fn persist_change(
    job: &SearchJob,
    base: &str,
    matcher: &mut Matcher<'_, '_>,
    emitter: &Emitter<'_>,
    c: &Change,
    cookie: Option<&Cookie>,
    buf: &mut Vec<u8>,
) -> OpResult<bool> {
    let scope = job.req.scope;
    let Some(uuid) = uuid_of(c.entry()) else {
        return Ok(false);
    };
    let kind = c.kind();
    let was_in = match &c.before {
        Some(b) => {
            in_scope(base, scope, &b.norm)
                && matcher
                    .test_held(Some(b.id), &b.norm, b.entry.clone())?
                    .is_some()
        }
        None => false,
    };
    if kind != Kind::Delete && in_scope(base, scope, c.norm()) {
        let id = match &c.before {
            Some(b) => Some(b.id),
            None => match matcher.view.lookup(&c.entry().dn)? {
                Ok(pando_store::Lookup::Found(id)) => Some(id),
                _ => None,
            },
        };
        if let Some(entry) = matcher.test_held(id, c.norm(), c.entry().clone())? {
            let state = if was_in {
                SyncStateKind::Modify
            } else {
                SyncStateKind::Add
            };
            let ctl = [state_control(state, uuid, cookie)];
            matcher.emit_held(emitter, id, c.norm(), &entry, &ctl, buf)?;
            return Ok(true);
        }
    }
    let Some(b) = c.before.as_ref().filter(|_| was_in) else {
        return Ok(false);
    };
    delete_message(job.msg_id, &b.entry.dn.to_string(), uuid, cookie, buf);
    Ok(true)
}

/// The descendants of an entry `c` moved, for a consumer: their DNs
/// changed with it (their records did not), so each is sent as
/// [`persist_change`] would send a change of it alone, judged at its old
/// and new place. How many entries were sent.
fn persist_descendants(
    job: &SearchJob,
    base: &str,
    matcher: &mut Matcher<'_, '_>,
    emitter: &Emitter<'_>,
    c: &Change,
    cookie: Option<&Cookie>,
    (chunks, buf): (&mut Vec<Vec<u8>>, &mut Vec<u8>),
) -> OpResult<u64> {
    let Some(before) = &c.before else {
        return Ok(0);
    };
    let scope = job.req.scope;
    let view = matcher.view;
    let (root_dn, root_norm) = view.dn_pair(before.id)?;
    let mut sent = 0;
    for id in view.subtree(before.id, u64::MAX)?.into_iter().flatten() {
        if id == before.id {
            continue;
        }
        let Some(entry) = view.entry(id)? else {
            continue;
        };
        let Some(uuid) = uuid_of(&entry) else {
            continue;
        };
        let (dn, norm) = view.dn_pair(id)?;
        // Its place before the move: the same RDNs under the old DN.
        let (Some(rdns), Some(norm_rdns)) =
            (dn.strip_suffix(&root_dn), norm.strip_suffix(&root_norm))
        else {
            continue;
        };
        let old_dn = format!("{rdns}{}", before.entry.dn);
        let old_norm = format!("{norm_rdns}{}", before.norm);
        let was_in = in_scope(base, scope, &old_norm)
            && matcher
                .test_held(Some(id), &old_norm, entry.clone())?
                .is_some();
        let now = match in_scope(base, scope, &norm) {
            true => matcher.test_held(Some(id), &norm, entry)?,
            false => None,
        };
        if let Some(entry) = now {
            let state = match was_in {
                true => SyncStateKind::Modify,
                false => SyncStateKind::Add,
            };
            let ctl = [state_control(state, uuid, cookie)];
            matcher.emit_held(emitter, Some(id), &norm, &entry, &ctl, buf)?;
        } else if was_in {
            delete_message(job.msg_id, &old_dn, uuid, cookie, buf);
        } else {
            continue;
        }
        sent += 1;
        if buf.len() >= CHUNK {
            chunks.push(std::mem::take(buf));
        }
    }
    Ok(sent)
}

#[cfg(test)]
mod tests {
    use super::*;

    const A1: &str = "20261125000000.000001Z#000000#001#000000";
    const A2: &str = "20261125000000.000002Z#000000#001#000000";
    const B1: &str = "20261125000000.000001Z#000000#002#000000";

    fn cookie(csns: &[&str]) -> Cookie {
        Cookie {
            csns: csns.iter().map(|c| c.to_string()).collect(),
            ..Cookie::default()
        }
    }

    fn phase(theirs: &[&str], ours: &[&str], floor: &str) -> Result<Phase, u32> {
        let ours: Vec<String> = ours.iter().map(|c| c.to_string()).collect();
        choose_phase(&cookie(theirs), &ours, 1, floor, false, false).map_err(|e| e.code.0)
    }

    #[test]
    fn the_phase_follows_the_cookie_and_the_log() {
        assert_eq!(phase(&[], &[A1], ""), Ok(Phase::Initial));
        assert_eq!(phase(&[A2], &[A2], ""), Ok(Phase::UpToDate));
        assert_eq!(phase(&[A1], &[A2], ""), Ok(Phase::Delete));
        assert_eq!(phase(&[A1], &[A2], A1), Ok(Phase::Delete));
        assert_eq!(phase(&[A1], &[A2], A2), Ok(Phase::Present));
        // A server the consumer never heard of: only a whole log covers it.
        assert_eq!(phase(&[A2], &[A2, B1], ""), Ok(Phase::Delete));
        assert_eq!(phase(&[A2], &[A2, B1], A1), Ok(Phase::Present));
        // The consumer is ahead of this server on its own changes, or has
        // state where this server has none.
        assert_eq!(phase(&[A2], &[A1], ""), Err(53));
        assert_eq!(phase(&[B1], &[], ""), Err(53));
        // Not covered, with refresh_required: 4096 unless a reload is asked.
        let ours = vec![A2.to_string()];
        let c = cookie(&[A1]);
        assert_eq!(
            choose_phase(&c, &ours, 1, A2, false, true).map_err(|e| e.code.0),
            Err(4096)
        );
        assert_eq!(
            choose_phase(&c, &ours, 1, A2, true, true).map_err(|e| e.code.0),
            Ok(Phase::Present)
        );
    }
}
