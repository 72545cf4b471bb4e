//! Search (RFC 4511 4.5) with the paged results control (RFC 2696).
//!
//! Runs on a blocking thread inside one LMDB read transaction: resolve the
//! base, ask the store for candidates, restrict them to the scope, then test
//! each candidate in ID order — checking abandon, time and size limits on
//! every one — and stream matching entries to the connection. Nothing holds
//! the whole result set.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use pando_model::{Dn, Entry};
use pando_proto::{Control, LdapMessage, LdapResult, ProtocolOp, ResultCode};
use pando_store::{EntryId, View};
use tokio::sync::mpsc;

pub mod emit;
pub mod follow_places;
pub mod holders;
pub mod hooks;
pub mod limits;
pub mod matcher;
mod paging;
pub mod persistent;
pub mod plan;
mod sort;
pub mod sort_cache;
pub mod sync_provider;
pub mod virtual_tree;

use crate::error::{LdapError, OpResult};
pub use crate::job::{Finished, Path, SearchJob, SearchOutcome};
pub use emit::encode_read_entry;
use emit::{Emitter, Selection};
pub use holders::Holders as PersistentHolders;
use limits::Limits;
use matcher::Matcher;
use paging::{paged_control, request_hash, Cookie};
use pando_access::acl::{self, Access, EntryRules};
pub use plan::types_in_filter;
use plan::{Plan, PlanInput};
pub use sort_cache::SortCache;

/// Flush streamed entries to the connection in chunks of about this size.
pub const CHUNK: usize = 32 * 1024;

/// Searches with at most this many candidates run on the async thread that
/// received them: a thread handoff costs more than such a search.
pub const INLINE_CANDIDATES: u64 = 8;

/// Where entries go: straight to the connection (blocking thread), or into
/// a buffer the async caller sends afterwards (inline).
pub enum Out<'a> {
    Channel(&'a mpsc::Sender<Vec<u8>>),
    Buffer(&'a mut Vec<u8>),
}

enum Step {
    Done(Option<SearchOutcome>),
    /// Too many candidates to run inline; nothing was sent.
    TooBig,
    /// The client is not taking entries: the search let go of its read
    /// transaction and resumes (`run`) once `chunk` is delivered.
    Paused {
        chunk: Vec<u8>,
        resume: Resume,
    },
}

/// Where a paused search carries on: after entry `after`, with `sent`
/// entries already sent (in this page, for a paged search), its time limit
/// counted from `started`.
#[derive(Clone, Copy)]
pub struct Resume {
    after: EntryId,
    sent: u64,
    started: Instant,
}

/// How long a search on its own thread waits for a client that is not
/// taking its entries while still holding its read transaction and its
/// thread. Past this it lets go of both (a long-lived reader stops LMDB
/// from reusing pages, and the file grows; threads are few), the
/// connection's task waits for the client, and the search resumes on a
/// fresh snapshot after the last entry sent, like the next page of a
/// paged search.
const HOLD_FOR_SLOW_CLIENT: Duration = Duration::from_millis(500);

fn outcome(paged: bool, r: OpResult<Step>) -> Step {
    match r {
        Ok(s) => s,
        Err(e) => Step::Done(Some(SearchOutcome {
            result: e.into_result(),
            // A failed paged search still answers with an (empty-cookie) control.
            controls: if paged {
                vec![paged_control(0, Vec::new())]
            } else {
                Vec::new()
            },
            entries: 0,
        })),
    }
}

/// How a search on its own thread ended for now.
pub enum Ran {
    /// Finished; None when abandoned (no response is sent).
    Done(Option<SearchOutcome>),
    /// The client is not taking entries: the search let go of its read
    /// transaction. Deliver `chunk` (waiting as long as the connection
    /// allows, holding no thread), then call [`run`] again with `resume`.
    Paused { chunk: Vec<u8>, resume: Resume },
}

/// Run a search on the current (blocking) thread until it ends or its
/// client stops taking entries.
pub fn run(job: &SearchJob, resume: Option<Resume>) -> Ran {
    let out = job.out.clone();
    let step = search(job, &mut Out::Channel(&out), None, resume);
    match outcome(job.controls.paged.is_some(), step) {
        Step::Done(o) => Ran::Done(o),
        Step::TooBig => Ran::Done(None),
        Step::Paused { chunk, resume } => Ran::Paused { chunk, resume },
    }
}

/// Run a search on blocking threads until it ends, its entries streamed to
/// `job.out`. At most `limits.max_search_threads` such searches run at
/// once (others wait their turn); a search whose client is not taking its
/// entries gives back its thread, its permit and its read transaction
/// while this task waits for the client, so slow clients cannot hold the
/// threads and LMDB readers that other searches, binds and writes need.
pub async fn run_to_end(job: &Arc<SearchJob>) -> Finished {
    let abandoned = || job.abandoned.load(Ordering::Relaxed);
    let mut resume = None;
    loop {
        let Some(slot) = search_thread(job).await else {
            return Finished::Abandoned;
        };
        if abandoned() {
            return Finished::Abandoned;
        }
        let j = job.clone();
        let ran = tokio::task::spawn_blocking(move || {
            let ran = run(&j, resume);
            drop(slot);
            ran
        })
        .await;
        match ran {
            Ok(Ran::Paused { chunk, resume: r }) => {
                // Bounded by the connection's write-rate rule: a client
                // below it is dropped and the send fails.
                if job.out.send(chunk).await.is_err() || abandoned() {
                    return Finished::Abandoned;
                }
                resume = Some(r);
            }
            Ok(Ran::Done(Some(o))) => return Finished::Done(o),
            Ok(Ran::Done(None)) => return Finished::Abandoned,
            Err(_) => return Finished::Failed,
        }
    }
}

/// One of the `limits.max_search_threads` places for work on the blocking
/// pool; while waiting (keeping its place in the queue) the search still
/// notices Abandon and Cancel. None: abandoned, or the server is closing.
pub async fn search_thread(job: &SearchJob) -> Option<tokio::sync::OwnedSemaphorePermit> {
    let wait = job
        .server
        .rt
        .search_threads
        .places()
        .clone()
        .acquire_owned();
    tokio::pin!(wait);
    loop {
        match tokio::time::timeout(Duration::from_millis(100), &mut wait).await {
            Ok(Ok(slot)) => return Some(slot),
            Ok(Err(_)) => return None,
            Err(_) if job.abandoned.load(Ordering::Relaxed) => return None,
            Err(_) => {}
        }
    }
}

/// Try the search on the calling thread, its entries and its
/// SearchResultDone encoded into `out`; `Err(job)` (nothing written) when it
/// must run on its own task (`stack::search`): too big for this, followed
/// (persistent, sync), or read from a translucent suffix's remote server.
/// Answers the result code and entries sent.
// The job comes back by value only on the (rare) hand-off path; boxing it
// would cost an allocation on every search instead.
#[allow(clippy::result_large_err)]
pub fn run_inline(job: SearchJob, out: &mut Vec<u8>) -> Result<Option<(u32, u64)>, SearchJob> {
    if job.followed() || crate::remote::serving(&job.server, &job.req.base).is_some() {
        return Err(job);
    }
    let step = outcome(
        job.controls.paged.is_some(),
        search(&job, &mut Out::Buffer(out), Some(INLINE_CANDIDATES), None),
    );
    match step {
        Step::Done(Some(o)) => {
            let answered = (o.result.code.0, o.entries);
            LdapMessage {
                id: job.msg_id,
                op: ProtocolOp::SearchResultDone(o.result),
                controls: o.controls,
            }
            .encode(out);
            Ok(Some(answered))
        }
        // Abandoned: nothing more is said. (Only a channel pauses, so a
        // search into a buffer is never Paused; were it, its entries so
        // far are in `out` and the rest is lost: answered as abandoned.)
        Step::Done(None) | Step::Paused { .. } => Ok(None),
        Step::TooBig => Err(job),
    }
}

/// The controls a finished search answers with: an empty paged results
/// cookie when paging was asked for.
pub fn paged_done(job: &SearchJob) -> Vec<Control> {
    if job.controls.paged.is_some() {
        vec![paged_control(0, Vec::new())]
    } else {
        Vec::new()
    }
}

/// A search, then the hooks' `after` on its outcome.
fn search(
    job: &SearchJob,
    out: &mut Out<'_>,
    inline_max: Option<u64>,
    resume: Option<Resume>,
) -> OpResult<Step> {
    Ok(match search_unhooked(job, out, inline_max, resume)? {
        (Step::Done(Some(mut o)), path) => {
            hooks::after(job, path, &mut o);
            Step::Done(Some(o))
        }
        (step, _) => step,
    })
}

/// A search: the virtual trees answer for their own bases; otherwise
/// resolve and check the base, work out the limits, the page and the plan,
/// then stream the matches.
fn search_unhooked(
    job: &SearchJob,
    out: &mut Out<'_>,
    inline_max: Option<u64>,
    resume: Option<Resume>,
) -> OpResult<(Step, Path)> {
    let refused = |o: SearchOutcome| Ok((Step::Done(Some(o)), Path::Refused));
    let server = &job.server;
    let schema = &*server.schema;
    let req = &job.req;
    // The time limit counts from here (or from the first run, resumed).
    let started = resume.map_or_else(Instant::now, |r| r.started);
    let cached = server.base_cache.get(schema, &req.base)?;
    let (base, base_norm_rdns, base_norm) = (&cached.0, &cached.1, &cached.2);
    let emitter = emitter_for(job);
    if let Some(tree) = virtual_tree::owner(server, base) {
        return search_virtual(job, out, tree, &emitter, base);
    }
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    let base_id = super::resolve_rdns_for(server, &view, &job.who, base_norm_rdns)?;
    let mut access = Access::new(&server.acl, &job.who);
    check_base(job, &view, &mut access, base_id, base_norm, resume)?;
    let limits = Limits::for_requester(server, &job.who, &view);
    // Sorting (and a virtual list view, which needs it) is settled first:
    // a sort that cannot be done fails a critical request, and otherwise
    // the entries go out unsorted with the reason in the sort response
    // (added by the sort response hook).
    let keys = match sorting(job, schema)? {
        Sorting::None | Sorting::Unsortable => None,
        Sorting::Keys(keys) => Some(keys),
        Sorting::Refused(done) => return refused(done),
    };
    let page = match Page::start(job, limits.size, keys.is_some())? {
        Ok(page) => page,
        Err(done) => return refused(done),
    };
    let Some(plan) = make_plan(
        job,
        &view,
        base_id,
        limits.unindexed,
        keys.as_deref(),
        inline_max,
        &emitter,
    )?
    else {
        return Ok((Step::TooBig, Path::Streamed));
    };
    let matcher = Matcher {
        schema,
        view: &view,
        plan: &plan,
        base: base_id,
        filter: &req.filter,
        compiled: schema.compile_filter(&req.filter),
        masked: HashMap::new(),
        access,
        rules: EntryRules::default(),
    };
    let sort_bounds = sort::Bounds::of(&server.cfg.config.limits);
    let run_limits = RunLimits::new(job, &limits, started);
    Ok(match &keys {
        Some(keys) => {
            let step = sort::run(
                job,
                out,
                matcher,
                &emitter,
                keys,
                page,
                run_limits,
                sort_bounds,
                resume,
                rtxn.generation(),
            )?;
            (step, Path::Sorted)
        }
        None => {
            let step = stream(job, out, matcher, &emitter, page, run_limits, resume)?;
            (step, Path::Streamed)
        }
    })
}

/// The search's plan on `view` (candidates, scope checks, what to
/// decode), its subentries shown or hidden as the request asks; None when
/// the search is too big for `inline_max`.
fn make_plan<'s>(
    job: &'s SearchJob,
    view: &View<'_>,
    base: EntryId,
    unindexed: u64,
    keys: Option<&[sort::Key<'s>]>,
    inline_max: Option<u64>,
    emitter: &Emitter<'_>,
) -> OpResult<Option<Plan<'s>>> {
    let (server, req) = (&job.server, &job.req);
    let schema = &*server.schema;
    let key_types = keys.map(sort::key_types).unwrap_or_default();
    let input = PlanInput {
        schema,
        filter: &req.filter,
        scope: req.scope,
        base,
        unindexed_limit: unindexed,
        rules_read_entries: server.acl.reads_entries(),
        also_decode: &key_types,
        // A sorted search reads every match first: never inline.
        inline_max: if keys.is_some() {
            inline_max.map(|_| 0)
        } else {
            inline_max
        },
        entry_steps: !emitter.steps.is_empty(),
    };
    let Some(mut plan) = Plan::make(view, input, &emitter.sel)? else {
        return Ok(None);
    };
    plan.show_subentries(
        view,
        &server.rt.subentries,
        job.controls.subentries,
        req.scope,
    )?;
    Ok(Some(plan))
}

/// A search whose base a virtual tree owns. Their few entries are not
/// sorted: a critical sort or any VLV is refused, a non-critical sort
/// answered unwillingToPerform (by the sort response hook).
fn search_virtual(
    job: &SearchJob,
    out: &mut Out<'_>,
    tree: &dyn crate::seams::VirtualTree,
    emitter: &Emitter<'_>,
    base: &Dn,
) -> OpResult<(Step, Path)> {
    let c = &job.controls;
    if c.vlv.is_some() || c.sort.as_ref().is_some_and(|s| s.critical) {
        let refusal = SearchOutcome {
            result: LdapResult::new(
                ResultCode::UNAVAILABLE_CRITICAL_EXTENSION,
                "the root DSE, cn=Subschema and cn=Monitor are not sorted",
            ),
            controls: vec![sort::response(ResultCode::UNWILLING_TO_PERFORM, None)],
            entries: 0,
        };
        return Ok((Step::Done(Some(refusal)), Path::Refused));
    }
    let step = virtual_tree::search(job, out, tree, emitter, base)?;
    Ok((step, Path::VirtualTree))
}

/// How the search's entries are encoded: its attribute selection,
/// typesOnly, message ID and the search hooks' per-entry steps.
pub fn emitter_for(job: &SearchJob) -> Emitter<'_> {
    let schema = &*job.server.schema;
    Emitter {
        schema,
        sel: Selection::remembered(&job.server.schema, &job.req.attrs),
        types_only: job.req.types_only,
        msg_id: Some(job.msg_id),
        steps: hooks::entry_steps(job),
    }
}

/// What the sort and VLV controls ask of a search.
enum Sorting<'s> {
    None,
    Keys(Vec<sort::Key<'s>>),
    /// A non-critical sort that cannot be done: unsorted.
    Unsortable,
    /// The search ends at once with this outcome.
    Refused(SearchOutcome),
}

fn sorting<'s>(job: &SearchJob, schema: &'s pando_model::Schema) -> OpResult<Sorting<'s>> {
    let refused = |code: ResultCode, message: String, controls: Vec<Control>| {
        Ok(Sorting::Refused(SearchOutcome {
            result: LdapResult::new(code, message),
            controls,
            entries: 0,
        }))
    };
    let c = &job.controls;
    match (&c.sort, &c.vlv) {
        (None, None) => Ok(Sorting::None),
        (None, Some(_)) => refused(
            ResultCode::SORT_CONTROL_MISSING,
            "a virtual list view needs the server-side sort control".into(),
            Vec::new(),
        ),
        (Some(_), Some(_)) if c.paged.is_some() => refused(
            ResultCode::UNWILLING_TO_PERFORM,
            "a virtual list view cannot be combined with paged results".into(),
            Vec::new(),
        ),
        // Too many keys is a limit, as too many entries is: refused
        // whatever the criticality (slapd refuses too, with 53).
        (Some(s), _) if s.too_many => refused(
            ResultCode::ADMIN_LIMIT_EXCEEDED,
            format!(
                "more than {} sort keys (limits.max_sort_keys)",
                s.keys.len()
            ),
            vec![sort::response(ResultCode::ADMIN_LIMIT_EXCEEDED, None)],
        ),
        (Some(s), _) => match sort::resolve(schema, s) {
            Ok(keys) => Ok(Sorting::Keys(keys)),
            Err(u) if s.critical || c.vlv.is_some() => {
                let resp = sort::response(u.code, u.attr.as_deref());
                // A key that cannot be ordered is inappropriateMatching
                // itself, as slapd answers (and RFC 2891's sortResult);
                // other critical sorts it cannot do are
                // unavailableCriticalExtension.
                let code = if s.critical && u.code != ResultCode::INAPPROPRIATE_MATCHING {
                    ResultCode::UNAVAILABLE_CRITICAL_EXTENSION
                } else {
                    u.code
                };
                refused(code, u.message, vec![resp])
            }
            Err(_) => Ok(Sorting::Unsortable),
        },
    }
}

/// Searching needs search access to the base entry (without it the base
/// is reported missing, so its existence is not revealed); then the
/// search hooks' `before` (the assertion control) may refuse it.
fn check_base(
    job: &SearchJob,
    view: &View<'_>,
    access: &mut Access<'_>,
    base_id: EntryId,
    base_norm: &str,
    resume: Option<Resume>,
) -> OpResult<()> {
    let server = &*job.server;
    if !access.unrestricted() {
        // The entry's content matters only to rules with a filter.
        let base_entry = Entry {
            dn: Dn { rdns: Vec::new() },
            attrs: if server.acl.reads_entries() {
                view.attrs(base_id)?.unwrap_or_default()
            } else {
                Vec::new()
            },
        };
        let rules = access.entry(&server.schema, base_norm, &base_entry);
        if !access.allows(Some(view), &rules, base_norm, None, acl::SEARCH) {
            return Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"));
        }
    }
    // A resumed run already passed them.
    if resume.is_none() {
        hooks::before(job, Some(view), base_norm, &mut || {
            super::stored_entry(view, base_id)
        })?;
    }
    Ok(())
}

/// Where a page of a paged search (RFC 2696) starts and how big it is.
struct Page {
    /// Hash of the search's parameters (0 when not paged).
    hash: u64,
    /// Resume after this entry (a later page).
    after: Option<EntryId>,
    /// Entries sent by earlier pages.
    sent_before: u64,
    /// Entries this page may hold (None: not paged).
    size: Option<u64>,
}

impl Page {
    /// The page the request asks for, or the outcome that ends the search
    /// at once (page size 0 abandons a paged search).
    /// `sorted`: cookies then hold a position in the sorted list, and
    /// belong to the sort keys too.
    fn start(
        job: &SearchJob,
        server_size: u32,
        sorted: bool,
    ) -> OpResult<Result<Page, SearchOutcome>> {
        let Some(p) = &job.controls.paged else {
            return Ok(Ok(Page {
                hash: 0,
                after: None,
                sent_before: 0,
                size: None,
            }));
        };
        let mut hash = request_hash(&job.req);
        if let (true, Some(s)) = (sorted, &job.controls.sort) {
            hash ^= paging::keys_hash(&s.keys);
        }
        let (after, sent_before) = if p.cookie.is_empty() {
            (None, 0)
        } else {
            match Cookie::decode(&p.cookie) {
                Some(c) if c.hash == hash => (Some(c.last), c.sent),
                _ => return Err(LdapError::protocol("paged results cookie is invalid")),
            }
        };
        if p.size <= 0 {
            // Size 0 abandons the paged search (RFC 2696 3).
            return Ok(Err(SearchOutcome {
                result: LdapResult::success(),
                controls: vec![paged_control(0, Vec::new())],
                entries: 0,
            }));
        }
        let mut size = p.size as u64;
        if server_size > 0 {
            size = size.min(server_size.into());
        }
        Ok(Ok(Page {
            hash,
            after,
            sent_before,
            size: Some(size),
        }))
    }
}

/// The time and size limits of one run of a search.
struct RunLimits {
    started: Instant,
    /// The smaller of the client's and the requester's.
    time: Option<Duration>,
    /// Entries the whole search may return: the smaller of the client's
    /// and the requester's size limits, counted across all pages of a
    /// paged search as slapd's default (size.prtotal = the hard limit)
    /// does; otherwise paging would read the whole tree past it.
    total: Option<u64>,
}

impl RunLimits {
    /// The time limit has passed.
    fn timed_out(&self) -> bool {
        self.time.is_some_and(|t| self.started.elapsed() > t)
    }

    /// `sent` entries (over all pages) are as many as the search may return.
    fn full(&self, sent: u64) -> bool {
        self.total.is_some_and(|l| sent >= l)
    }

    fn new(job: &SearchJob, limits: &Limits, started: Instant) -> RunLimits {
        let req = &job.req;
        let time = match (req.time_limit as u32, limits.time) {
            (0, 0) => None,
            (0, s) | (s, 0) => Some(Duration::from_secs(s.into())),
            (c, s) => Some(Duration::from_secs(c.min(s).into())),
        };
        let total = match (req.size_limit as u64, limits.size as u64) {
            (0, 0) => None,
            (0, s) | (s, 0) => Some(s),
            (c, s) => Some(c.min(s)),
        };
        RunLimits {
            started,
            time,
            total,
        }
    }
}

/// Test the plan's candidates in ID order and stream the matches,
/// checking abandon and the time limit on every candidate and the size
/// limit and page on every match.
fn stream(
    job: &SearchJob,
    out: &mut Out<'_>,
    mut matcher: Matcher<'_, '_>,
    emitter: &Emitter<'_>,
    page: Page,
    limits: RunLimits,
    resume: Option<Resume>,
) -> OpResult<Step> {
    let ended = |code: ResultCode, message: &str, entries: u64| {
        Step::Done(Some(SearchOutcome {
            result: LdapResult::new(code, message),
            controls: paged_done(job),
            entries,
        }))
    };
    // Inline searches (a handful of entries) start small; streamed ones
    // fill CHUNK-sized buffers.
    let mut buf = Vec::with_capacity(match out {
        Out::Buffer(_) => 2048,
        Out::Channel(_) => CHUNK + 4096,
    });
    // A resumed run counts what earlier runs of this request sent, and
    // starts after the last of it.
    let mut sent_now = resume.map_or(0, |r| r.sent);
    let mut last_id = resume.map(|r| r.after);
    let start_after = last_id.or(page.after);
    let plan = matcher.plan;
    let ids = plan
        .ids
        .iter()
        .filter(|id| start_after.is_none_or(|a| *id > a));
    for id in ids {
        if job.abandoned.load(Ordering::Relaxed) {
            return Ok(Step::Done(None));
        }
        if limits.timed_out() {
            flush(out, &mut buf)?;
            return Ok(ended(
                ResultCode::TIME_LIMIT_EXCEEDED,
                "time limit exceeded",
                sent_now,
            ));
        }
        let Some(hit) = matcher.test(id)? else {
            continue;
        };
        if limits.full(page.sent_before + sent_now) {
            flush(out, &mut buf)?;
            return Ok(ended(
                ResultCode::SIZE_LIMIT_EXCEEDED,
                "size limit exceeded",
                sent_now,
            ));
        }
        if page.size.is_some_and(|p| sent_now >= p) {
            // A full page went out and there is more: hand back a cookie.
            flush(out, &mut buf)?;
            let cookie = Cookie {
                last: last_id.unwrap_or(0),
                sent: page.sent_before + sent_now,
                hash: page.hash,
            }
            .encode();
            return Ok(Step::Done(Some(SearchOutcome {
                result: LdapResult::success(),
                controls: vec![paged_control(0, cookie)],
                entries: sent_now,
            })));
        }
        matcher.emit(emitter, &hit, &mut buf)?;
        sent_now += 1;
        last_id = Some(id);
        if buf.len() >= CHUNK {
            if let Some(chunk) = send_or_hold(out, &mut buf)? {
                let resume = Resume {
                    after: id,
                    sent: sent_now,
                    started: limits.started,
                };
                return Ok(Step::Paused { chunk, resume });
            }
        }
    }
    flush(out, &mut buf)?;
    Ok(ended(ResultCode::SUCCESS, "", sent_now))
}

pub fn flush(out: &mut Out<'_>, buf: &mut Vec<u8>) -> OpResult<()> {
    if buf.is_empty() {
        return Ok(());
    }
    match out {
        Out::Buffer(b) => {
            b.append(buf);
            Ok(())
        }
        Out::Channel(tx) => {
            let chunk = std::mem::replace(buf, Vec::with_capacity(CHUNK + 4096));
            tx.blocking_send(chunk)
                .map_err(|_| LdapError::new(ResultCode::OTHER, "connection closed"))
        }
    }
}

/// Send a full buffer on; Some(chunk) when the client has not made room
/// for it within [`HOLD_FOR_SLOW_CLIENT`] (the caller then lets go of its
/// read transaction before waiting longer).
fn send_or_hold(out: &mut Out<'_>, buf: &mut Vec<u8>) -> OpResult<Option<Vec<u8>>> {
    let closed = || LdapError::new(ResultCode::OTHER, "connection closed");
    let Out::Channel(tx) = out else {
        return flush(out, buf).map(|()| None);
    };
    let chunk = std::mem::replace(buf, Vec::with_capacity(CHUNK + 4096));
    let chunk = match tx.try_send(chunk) {
        Ok(()) => return Ok(None),
        Err(mpsc::error::TrySendError::Closed(_)) => return Err(closed()),
        Err(mpsc::error::TrySendError::Full(chunk)) => chunk,
    };
    // On a blocking-pool thread: the runtime's handle is there to wait on.
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return tx.blocking_send(chunk).map(|()| None).map_err(|_| closed());
    };
    match rt.block_on(tokio::time::timeout(HOLD_FOR_SLOW_CLIENT, tx.reserve())) {
        Ok(Ok(permit)) => {
            permit.send(chunk);
            Ok(None)
        }
        Ok(Err(_)) => Err(closed()),
        Err(_) => Ok(Some(chunk)),
    }
}
