//! Search (RFC 4511 4.5) with the paged results control (RFC 2696).
//!
//! Runs on a blocking thread inside one LMDB read transaction: resolve the
//! base, ask the store for candidates, restrict them to the scope, then test
//! each candidate in ID order — checking abandon, time and size limits on
//! every one — and stream matching entries to the connection. Nothing holds
//! the whole result set.

use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use pando_model::{AttributeType, Dn, Entry, Schema, Ternary};
use pando_proto::{
    oid, Control, EntryEncoder, Filter, LdapMessage, LdapResult, PagedResults, ProtocolOp,
    ResultCode, Scope, SearchRequest,
};
use pando_store::{Candidates, EntryId, View};
use roaring::RoaringTreemap;
use tokio::sync::mpsc;

use super::special::{SUBSCHEMA_DN, SUBSCHEMA_NORM};
use super::COMPUTED;
use crate::acl::{self, Access, EntryRules};
use crate::error::{LdapError, OpResult};
use crate::state::{Identity, Server};

/// Flush streamed entries to the connection in chunks of about this size.
const CHUNK: usize = 32 * 1024;

pub struct SearchJob {
    pub server: Arc<Server>,
    pub who: Identity,
    pub msg_id: i32,
    pub req: SearchRequest,
    pub controls: super::controls::Requested,
    pub abandoned: Arc<AtomicBool>,
    pub out: mpsc::Sender<Vec<u8>>,
}

/// What a search ends with; None when it was abandoned (no response is sent).
pub struct SearchOutcome {
    pub result: LdapResult,
    pub controls: Vec<Control>,
    pub entries: u64,
}

/// Which attributes a search returns (RFC 4511 4.5.1.8, RFC 3673, RFC 4529).
struct Selection {
    all_user: bool,
    all_oper: bool,
    /// Requested types (lowercase canonical names) with required options.
    named: Vec<(String, Vec<String>)>,
    /// OIDs of the requested types, in the order of `named` (resolved once
    /// per search, not once per attribute of every entry).
    named_oids: Vec<String>,
}

impl Selection {
    fn new(schema: &Schema, attrs: &[String]) -> Selection {
        let mut s = Selection {
            all_user: attrs.is_empty(),
            all_oper: false,
            named: Vec::new(),
            named_oids: Vec::new(),
        };
        for a in attrs {
            match a.as_str() {
                "*" => s.all_user = true,
                "+" => s.all_oper = true,
                "1.1" => {}
                _ if a.starts_with('@') => {
                    if let Some(list) = schema.object_class_attrs(&a[1..]) {
                        for at in list {
                            s.named.push((at.name().to_ascii_lowercase(), Vec::new()));
                        }
                    }
                }
                // Unrecognised descriptions are ignored (RFC 4511 4.5.1.8).
                _ => {
                    if let Ok((desc, at)) = schema.canonical_desc(a) {
                        s.named
                            .push((at.name().to_ascii_lowercase(), options_of(&desc)));
                    }
                }
            }
        }
        s.named_oids = s
            .named
            .iter()
            .map(|(n, _)| {
                schema
                    .attribute(n)
                    .map(|t| t.oid.clone())
                    .unwrap_or_default()
            })
            .collect();
        s
    }

    fn wants(&self, schema: &Schema, at: &AttributeType, opts: &[String]) -> bool {
        if if at.is_operational() {
            self.all_oper
        } else {
            self.all_user
        } {
            return true;
        }
        self.named
            .iter()
            .zip(&self.named_oids)
            .any(|((_, want_opts), oid)| {
                want_opts.iter().all(|o| opts.contains(o)) && is_subtype_of(schema, at, oid)
            })
    }

    /// No attribute at all goes out ("1.1" alone).
    fn wants_nothing(&self) -> bool {
        !self.all_user && !self.all_oper && self.named.is_empty()
    }

    fn wants_computed(&self, name: &str) -> bool {
        (self.all_oper && name != "numSubordinates")
            || self.named.iter().any(|(n, _)| n.eq_ignore_ascii_case(name))
    }
}

/// The names under which the attributes a search returns or tests can be
/// stored, when it names them (no `*` or `+`) and none has subtypes: then an
/// entry's other attributes are skipped, not decoded. None: decode all.
/// (A superset is enough: what goes out is still decided by the Emitter.)
struct Wanted<'s> {
    names: Vec<&'s str>,
}

impl<'s> Wanted<'s> {
    fn new(
        schema: &'s Schema,
        sel: &Selection,
        tested: &[&'s AttributeType],
    ) -> Option<Wanted<'s>> {
        if sel.all_user || sel.all_oper {
            return None;
        }
        let mut names = Vec::new();
        let named = sel.named_oids.iter().map(|oid| schema.attribute(oid));
        for at in named.chain(tested.iter().map(|t| Some(*t))) {
            // An unresolvable request selects nothing.
            let Some(at) = at else { continue };
            if schema.has_subtypes(at) {
                return None;
            }
            names.extend(at.names.iter().map(String::as_str));
        }
        Some(Wanted { names })
    }

    fn keep(&self, desc: &str) -> bool {
        let base = desc.split(';').next().unwrap_or("");
        // Stored descriptions are names; an OID is decoded to be safe.
        base.starts_with(|c: char| c.is_ascii_digit())
            || self.names.iter().any(|n| n.eq_ignore_ascii_case(base))
    }
}

/// `at` is the type with OID `oid` or one of its subtypes (an empty OID,
/// an unresolvable request, matches nothing). Types without a superior —
/// most of them — are decided without a schema lookup.
fn is_subtype_of(schema: &Schema, at: &AttributeType, oid: &str) -> bool {
    let mut cur = Some(at);
    // Schemas are checked for SUP cycles on load; the bound is a backstop.
    for _ in 0..16 {
        let Some(c) = cur else { return false };
        if !oid.is_empty() && c.oid == oid {
            return true;
        }
        cur = c.sup.as_deref().and_then(|s| schema.attribute(s));
    }
    false
}

fn options_of(desc: &str) -> Vec<String> {
    desc.split(';')
        .skip(1)
        .map(|o| o.to_ascii_lowercase())
        .collect()
}

/// Call `f` with the attribute description of every item of a filter.
fn for_each_filter_attr(filter: &Filter, f: &mut dyn FnMut(&str)) {
    match filter {
        Filter::And(v) | Filter::Or(v) => v.iter().for_each(|g| for_each_filter_attr(g, f)),
        Filter::Not(g) => for_each_filter_attr(g, f),
        Filter::Equality(a)
        | Filter::GreaterOrEqual(a)
        | Filter::LessOrEqual(a)
        | Filter::Approx(a) => f(&a.attr),
        Filter::Substrings(s) => f(&s.attr),
        Filter::Present(a) => f(a),
        Filter::Extensible(m) => {
            if let Some(a) = &m.attr {
                f(a)
            }
        }
    }
}

/// Filter attributes that need computed values added before evaluation.
fn computed_in_filter(filter: &Filter, out: &mut Vec<&'static str>) {
    for_each_filter_attr(filter, &mut |attr| {
        for c in COMPUTED {
            if attr.eq_ignore_ascii_case(c) && !out.contains(c) {
                out.push(c);
            }
        }
    });
}

fn uses_dn_attributes(f: &Filter) -> bool {
    match f {
        Filter::And(v) | Filter::Or(v) => v.iter().any(uses_dn_attributes),
        Filter::Not(g) => uses_dn_attributes(g),
        Filter::Extensible(m) => m.dn_attributes,
        _ => false,
    }
}

/// Stateless paging cookie: resume after `last` having sent `sent` entries
/// of the search whose parameters hash to `hash`. The client holds it, so
/// it is sealed with a MAC under a key made at start: a forged `sent` would
/// let a client page past the size limit (which counts across pages).
///
/// | offset | size | field |
/// |---|---|---|
/// | 0 | 8 | last entry ID sent (BE) |
/// | 8 | 8 | entries sent so far (BE) |
/// | 16 | 8 | request hash (BE) |
/// | 24 | 16 | HMAC-SHA256 of bytes 0..24, cut to 16 bytes |
struct Cookie {
    last: EntryId,
    sent: u64,
    hash: u64,
}

const COOKIE_BODY: usize = 24;
const COOKIE_MAC: usize = 16;

/// This process's cookie key: cookies do not outlive a restart (the client
/// then starts its paged search again).
fn cookie_mac(body: &[u8]) -> [u8; COOKIE_MAC] {
    use hmac::{Hmac, Mac};
    static KEY: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    let key = KEY.get_or_init(|| {
        let mut k = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut k);
        k
    });
    let mut mac = <Hmac<sha2::Sha256> as Mac>::new_from_slice(key).expect("any key length");
    mac.update(body);
    let full = mac.finalize().into_bytes();
    let mut out = [0u8; COOKIE_MAC];
    out.copy_from_slice(&full[..COOKIE_MAC]);
    out
}

impl Cookie {
    fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(COOKIE_BODY + COOKIE_MAC);
        v.extend_from_slice(&self.last.to_be_bytes());
        v.extend_from_slice(&self.sent.to_be_bytes());
        v.extend_from_slice(&self.hash.to_be_bytes());
        let mac = cookie_mac(&v);
        v.extend_from_slice(&mac);
        v
    }

    fn decode(b: &[u8]) -> Option<Cookie> {
        if b.len() != COOKIE_BODY + COOKIE_MAC {
            return None;
        }
        let (body, mac) = b.split_at(COOKIE_BODY);
        if !crate::password::ct_eq(&cookie_mac(body), mac) {
            return None;
        }
        let n = |i: usize| {
            body.get(i..i + 8)
                .and_then(|s| <[u8; 8]>::try_from(s).ok())
                .map(u64::from_be_bytes)
        };
        Some(Cookie {
            last: n(0)?,
            sent: n(8)?,
            hash: n(16)?,
        })
    }
}

fn request_hash(req: &SearchRequest) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    req.base.to_ascii_lowercase().hash(&mut h);
    (req.scope as u8).hash(&mut h);
    req.filter.to_string().hash(&mut h);
    req.attrs.hash(&mut h);
    req.types_only.hash(&mut h);
    h.finish()
}

/// Build the output of one entry into `buf`.
struct Emitter<'a> {
    schema: &'a Schema,
    sel: Selection,
    types_only: bool,
    /// The response's message ID; None: a bare SearchResultEntry (the
    /// value of a pre-read or post-read response control).
    msg_id: Option<i32>,
}

/// Access decisions for the entry being emitted: only attributes the
/// requester may read go out.
struct Guard<'g, 'a> {
    access: &'g mut Access<'a>,
    rules: &'g EntryRules,
    norm: &'g str,
}

impl Guard<'_, '_> {
    fn may_read(&mut self, view: Option<&View<'_>>, at: &AttributeType) -> bool {
        self.access
            .allows(view, self.rules, self.norm, Some(at), acl::READ)
    }
}

impl Emitter<'_> {
    fn emit(
        &self,
        view: Option<&View<'_>>,
        id: Option<EntryId>,
        dn: &str,
        entry: &Entry,
        guard: Option<Guard<'_, '_>>,
        buf: &mut Vec<u8>,
    ) -> OpResult<()> {
        let attrs = entry
            .attrs
            .iter()
            .map(|a| (a.desc.as_str(), a.values.iter().map(Vec::as_slice)));
        self.emit_attrs(view, id, dn, attrs, guard, buf)
    }

    /// [`Emitter::emit`] from (description, values) pairs: decoded
    /// attributes, or ones borrowed from the store.
    fn emit_attrs<'v, V: Iterator<Item = &'v [u8]>>(
        &self,
        view: Option<&View<'_>>,
        id: Option<EntryId>,
        dn: &str,
        attrs: impl Iterator<Item = (&'v str, V)>,
        mut guard: Option<Guard<'_, '_>>,
        buf: &mut Vec<u8>,
    ) -> OpResult<()> {
        let mut enc = match self.msg_id {
            Some(id) => EntryEncoder::begin(buf, id, dn.as_bytes()),
            None => EntryEncoder::begin_bare(buf, dn.as_bytes()),
        };
        for (desc, values) in attrs {
            let base = desc.split(';').next().unwrap_or("");
            let Some(at) = self.schema.attribute(base) else {
                continue;
            };
            if COMPUTED.iter().any(|c| c.eq_ignore_ascii_case(base)) && id.is_some() {
                continue; // recomputed below for stored entries
            }
            if !self.sel.wants(self.schema, at, &options_of(desc)) {
                continue;
            }
            // Access last: only attributes that would go out are checked.
            if guard.as_mut().is_some_and(|g| !g.may_read(view, at)) {
                continue;
            }
            if self.types_only {
                enc.attr_names_only(desc.as_bytes());
            } else {
                enc.attr(desc.as_bytes(), values);
            }
        }
        if let (Some(view), Some(id)) = (view, id) {
            for name in COMPUTED {
                if !self.sel.wants_computed(name) {
                    continue;
                }
                let readable = match (self.schema.attribute(name), guard.as_mut()) {
                    (Some(at), Some(g)) => g.may_read(Some(view), at),
                    _ => true,
                };
                if !readable {
                    continue;
                }
                let access = guard.as_mut().map(|g| &mut *g.access);
                let Some(value) = computed_value(self.schema, view, access, id, dn, name)? else {
                    continue;
                };
                if self.types_only {
                    enc.attr_names_only(name.as_bytes());
                } else {
                    enc.attr(name.as_bytes(), [value.as_bytes()]);
                }
            }
        }
        enc.finish();
        Ok(())
    }
}

/// A SearchResultEntry on its own (the value of the RFC 4527 read-entry
/// response controls): `entry` named `dn`, with the attributes `attrs`
/// selects as a search would, less those `access` (None: unrestricted)
/// does not let the requester read. Computed attributes are not included.
pub(crate) fn encode_read_entry(
    schema: &Schema,
    view: &View<'_>,
    access: Option<&mut Access<'_>>,
    norm: &str,
    dn: &str,
    entry: &Entry,
    attrs: &[String],
) -> OpResult<Vec<u8>> {
    let emitter = Emitter {
        schema,
        sel: Selection::new(schema, attrs),
        types_only: false,
        msg_id: None,
    };
    let mut buf = Vec::new();
    match access {
        Some(access) => {
            let rules = access.entry(schema, norm, entry);
            let guard = Guard {
                access,
                rules: &rules,
                norm,
            };
            emitter.emit(Some(view), None, dn, entry, Some(guard), &mut buf)?;
        }
        None => emitter.emit(Some(view), None, dn, entry, None, &mut buf)?,
    }
    Ok(buf)
}

/// The value of computed attribute `name` of entry `id`; None when it is
/// not given (a restricted count too costly to make). `access`: the
/// requester's, None when unrestricted.
fn computed_value(
    schema: &Schema,
    view: &View<'_>,
    access: Option<&mut Access<'_>>,
    id: EntryId,
    dn: &str,
    name: &str,
) -> OpResult<Option<String>> {
    let counts = matches!(name, "hasSubordinates" | "numSubordinates");
    // Children the requester may not see are not counted (they would
    // reveal entries a search does not return), unless it sees them all.
    if let (true, Some(access)) = (counts, access) {
        if !access.reads_every_entry() {
            let first_only = name == "hasSubordinates";
            let seen =
                visible_children(schema, view, access, id, first_only, MAX_CHILDREN_CHECKED)?;
            return Ok(seen.map(|n| match (first_only, n > 0) {
                (true, true) => "TRUE".to_string(),
                (true, false) => "FALSE".to_string(),
                (false, _) => n.to_string(),
            }));
        }
    }
    Ok(Some(match name {
        "entryDN" => dn.to_string(),
        "subschemaSubentry" => SUBSCHEMA_DN.to_string(),
        "hasSubordinates" => if view.has_children(id)? {
            "TRUE"
        } else {
            "FALSE"
        }
        .to_string(),
        _ => view.count_children(id)?.to_string(),
    }))
}

/// Most children of one entry checked one by one for a restricted
/// requester's hasSubordinates or numSubordinates. Each check may decode
/// the child (rules with filters), and a `+` search asks for every entry
/// it returns, so the work is capped per entry.
const MAX_CHILDREN_CHECKED: usize = 1000;

/// How many children of `id` the requester may see (read access to the
/// entry itself, as a search decides what it returns), counting up to the
/// first when `first_only`. None when that is not known after checking
/// `max` children: the attribute is then left out, which reveals nothing,
/// rather than given as a guess (a bound presented as a count).
fn visible_children(
    schema: &Schema,
    view: &View<'_>,
    access: &mut Access<'_>,
    id: EntryId,
    first_only: bool,
    max: usize,
) -> OpResult<Option<u64>> {
    let kids = view.children_up_to(id, max.saturating_add(1))?;
    let mut rules = EntryRules::default();
    let mut seen = 0u64;
    for &kid in kids.iter().take(max) {
        let (_, norm) = view.dn_pair(kid)?;
        let entry = Entry {
            dn: Dn { rdns: Vec::new() },
            attrs: if access.reads_entries() {
                view.attrs(kid)?.unwrap_or_default()
            } else {
                Vec::new()
            },
        };
        access.entry_into(schema, &norm, &entry, &mut rules);
        if access.allows(Some(view), &rules, &norm, None, acl::READ) {
            seen += 1;
            if first_only {
                return Ok(Some(seen));
            }
        }
    }
    Ok((kids.len() <= max).then_some(seen))
}

/// Searches with at most this many candidates run on the async thread that
/// received them: a thread handoff costs more than such a search.
pub const INLINE_CANDIDATES: u64 = 8;

/// Where entries go: straight to the connection (blocking thread), or into
/// a buffer the async caller sends afterwards (inline).
enum Out<'a> {
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

/// Try the search on the calling thread, its entries and its
/// SearchResultDone encoded into `out`; `Err(job)` (nothing written) when it
/// is too big for that and must go to [`run`] on a blocking thread. Answers
/// the result code and entries sent.
// The job comes back by value only on the (rare) hand-off path; boxing it
// would cost an allocation on every search instead.
#[allow(clippy::result_large_err)]
pub fn run_inline(job: SearchJob, out: &mut Vec<u8>) -> Result<Option<(u32, u64)>, SearchJob> {
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

/// A search at or below cn=Monitor: its entries are made now, and each is
/// returned only to those who may read it (see `observe::monitor`).
fn search_monitor(
    job: &SearchJob,
    out: &mut Out<'_>,
    emitter: &Emitter<'_>,
    filter: &pando_model::CompiledFilter,
    base: &Dn,
) -> OpResult<Step> {
    use crate::observe::monitor;
    let server = &job.server;
    let schema = &*server.schema;
    let no_such = || LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object");
    let norm_base = schema.normalize_dn(base).map_err(|_| no_such())?;
    // Nothing is computed for requesters who can see none of it.
    let probe = Entry {
        dn: base.clone(),
        attrs: Vec::new(),
    };
    if !monitor::may_read(server, &job.who, &norm_base, &probe) {
        return Err(no_such());
    }
    let below = format!(",{norm_base}");
    let mut found = false;
    let mut n = 0u64;
    let mut buf = Vec::new();
    for (dn, entry) in monitor::entries(server) {
        let Ok(norm) = schema.normalize_dn(&entry.dn) else {
            continue;
        };
        if !monitor::may_read(server, &job.who, &norm, &entry) {
            continue;
        }
        found |= norm == norm_base;
        let rel = norm.strip_suffix(below.as_str());
        let in_scope = match job.req.scope {
            Scope::Base => norm == norm_base,
            Scope::One => rel.is_some_and(|r| !r.contains(',')),
            Scope::Sub => norm == norm_base || rel.is_some(),
            Scope::Children => rel.is_some(),
        };
        if !in_scope || filter.matches(schema, &entry) != Ternary::True {
            continue;
        }
        if job.req.size_limit > 0 && n >= job.req.size_limit as u64 {
            flush(out, &mut buf).ok();
            return Ok(Step::Done(Some(SearchOutcome {
                result: LdapError::new(ResultCode::SIZE_LIMIT_EXCEEDED, "size limit exceeded")
                    .into_result(),
                controls: Vec::new(),
                entries: n,
            })));
        }
        emitter.emit(None, None, &dn, &entry, None, &mut buf)?;
        n += 1;
    }
    if !found {
        return Err(no_such());
    }
    if flush(out, &mut buf).is_err() {
        return Ok(Step::Done(None));
    }
    Ok(Step::Done(Some(SearchOutcome {
        result: LdapResult::success(),
        controls: if job.controls.paged.is_some() {
            vec![paged_control(0, Vec::new())]
        } else {
            Vec::new()
        },
        entries: n,
    })))
}

fn assertion_failed() -> LdapError {
    LdapError::new(
        ResultCode::ASSERTION_FAILED,
        "the assertion control's filter is not true for the base entry",
    )
}

fn paged_control(size: i32, cookie: Vec<u8>) -> Control {
    Control {
        oid: oid::PAGED_RESULTS.to_string(),
        critical: false,
        value: Some(PagedResults { size, cookie }.encode()),
    }
}

fn search(
    job: &SearchJob,
    out: &mut Out<'_>,
    inline_max: Option<u64>,
    resume: Option<Resume>,
) -> OpResult<Step> {
    let server = &job.server;
    let schema = &*server.schema;
    let req = &job.req;
    let started = resume.map_or_else(Instant::now, |r| r.started);
    let cached = server.base_cache.get(schema, &req.base)?;
    let (base, base_norm_rdns) = (&cached.0, &cached.1);
    let sel = Selection::new(schema, &req.attrs);
    let emitter = Emitter {
        schema,
        sel,
        types_only: req.types_only,
        msg_id: Some(job.msg_id),
    };
    let mut access = Access::new(&server.acl, &job.who);
    let filter = schema.compile_filter(&req.filter);

    // The root DSE and the subschema subentry are not in the store.
    // Only a one-RDN base can be cn=Subschema; skip normalising others.
    let norm_base = if base.rdns.len() == 1 {
        schema.normalize_dn(base).unwrap_or_default()
    } else {
        String::new()
    };
    if base.is_root() || norm_base == SUBSCHEMA_NORM {
        if req.scope != Scope::Base {
            return Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"));
        }
        let entry = if base.is_root() {
            server.special.root_dse(server)
        } else {
            server.special.subschema(server)
        };
        if let Some(a) = &job.controls.assertion {
            if schema.compile_filter(a).matches(schema, &entry) != Ternary::True {
                return Err(assertion_failed());
            }
        }
        let mut buf = Vec::new();
        let mut n = 0;
        if filter.matches(schema, &entry) == Ternary::True {
            let dn = if base.is_root() {
                String::new()
            } else {
                SUBSCHEMA_DN.to_string()
            };
            // The root DSE and the subschema are public: what a client
            // needs to learn how to talk to the server.
            emitter.emit(None, None, &dn, &entry, None, &mut buf)?;
            n = 1;
            if flush(out, &mut buf).is_err() {
                return Ok(Step::Done(None));
            }
        }
        let controls = if job.controls.paged.is_some() {
            vec![paged_control(0, Vec::new())]
        } else {
            Vec::new()
        };
        return Ok(Step::Done(Some(SearchOutcome {
            result: LdapResult::success(),
            controls,
            entries: n,
        })));
    }

    // cn=Monitor is computed, not stored (crate::observe::monitor). Only a
    // last RDN of one `cn` value can name it: others skip the normalising.
    if base
        .rdns
        .last()
        .filter(|r| {
            r.avas.len() == 1
                && schema
                    .attribute(&r.avas[0].attr)
                    .is_some_and(|t| t.has_name("cn"))
        })
        .and_then(|r| schema.normalize_rdn(r).ok())
        .is_some_and(|r| r == crate::observe::monitor::MONITOR_NORM)
    {
        return search_monitor(job, out, &emitter, &filter, base);
    }

    let rtxn = server.store.read()?;
    let view = rtxn.view();
    let (base_id, base_rdns) =
        super::resolve_rdns_for(server, &view, &job.who, base_norm_rdns.clone())?;
    let limits = Limits::for_requester(server, &job.who, &view);
    // Time limit: the smaller of the client's and the requester's.
    let time_limit = match (req.time_limit as u32, limits.time) {
        (0, 0) => None,
        (0, s) | (s, 0) => Some(Duration::from_secs(s.into())),
        (c, s) => Some(Duration::from_secs(c.min(s).into())),
    };
    // Size limit: the smaller of the client's and the requester's, over
    // the whole search (every page of a paged one).
    let server_size = limits.size;
    // Searching needs search access to the base entry; without it the base
    // is reported missing, so its existence is not revealed.
    if !access.unrestricted() {
        let base_norm = base_rdns.join(",");
        // The entry's content matters only to rules with a filter.
        let base_entry = Entry {
            dn: Dn { rdns: Vec::new() },
            attrs: if server.acl.reads_entries() {
                view.attrs(base_id)?.unwrap_or_default()
            } else {
                Vec::new()
            },
        };
        let rules = access.entry(schema, &base_norm, &base_entry);
        if !access.allows(Some(&view), &rules, &base_norm, None, acl::SEARCH) {
            return Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"));
        }
    }

    // RFC 4528: the assertion applies to the base entry.
    if let (Some(a), None) = (&job.controls.assertion, resume) {
        let base_entry = super::stored_entry(&view, base_id)?;
        if !super::assertion_holds(
            server,
            &view,
            &job.who,
            &base_rdns.join(","),
            &base_entry,
            a,
        ) {
            return Err(assertion_failed());
        }
    }

    // Paging state.
    let hash = if job.controls.paged.is_some() {
        request_hash(req)
    } else {
        0
    };
    let (resume_after, mut sent_before, page_size) = match &job.controls.paged {
        None => (None, 0, None),
        Some(p) => {
            let (after, sent) = if p.cookie.is_empty() {
                (None, 0)
            } else {
                match Cookie::decode(&p.cookie) {
                    Some(c) if c.hash == hash => (Some(c.last), c.sent),
                    _ => return Err(LdapError::protocol("paged results cookie is invalid")),
                }
            };
            if p.size <= 0 {
                // Size 0 abandons the paged search (RFC 2696 3).
                return Ok(Step::Done(Some(SearchOutcome {
                    result: LdapResult::success(),
                    controls: vec![paged_control(0, Vec::new())],
                    entries: 0,
                })));
            }
            let mut size = p.size as u64;
            if server_size > 0 {
                size = size.min(server_size.into());
            }
            (after, sent, Some(size))
        }
    };
    // The requester's size limit counts entries across all pages of a
    // paged search, as slapd's default (size.prtotal = the hard limit):
    // otherwise paging would read the whole tree past it.
    let total_limit: Option<u64> = match (req.size_limit as u64, server_size as u64) {
        (0, 0) => None,
        (0, s) | (s, 0) => Some(s),
        (c, s) => Some(c.min(s)),
    };

    // Inline runs must stay small: give up before any scope walk when the
    // index candidates (or an unindexed scope) could be large.
    let cands = if req.scope == Scope::Base {
        Candidates::All
    } else {
        view.candidates(&req.filter)?
    };
    if let (Some(max), false) = (inline_max, req.scope == Scope::Base) {
        if !matches!(&cands, Candidates::Ids(ids) if ids.len() <= max) {
            return Ok(Step::TooBig);
        }
    }
    // Index candidates are checked against the scope one by one below,
    // with the id2parent record that also gives their DN.
    let (scope_ids, check_scope) =
        scope_candidates(&view, limits.unindexed, base_id, req.scope, cands)?;
    if inline_max.is_some_and(|m| scope_ids.len() > m) {
        return Ok(Step::TooBig);
    }

    let uses_dn = uses_dn_attributes(&req.filter);
    let mut needed_computed = Vec::new();
    computed_in_filter(&req.filter, &mut needed_computed);
    // Candidates that are exactly the matches need no filter test.
    let exact = req.scope != Scope::Base && view.candidates_are_exact(&req.filter);
    // Then, when no access rule looks inside entries and no computed
    // attribute is tested, only the emitter reads the attributes: a search
    // returning none ("1.1", as an authentication's lookup) decodes no entry
    // at all, any other sends them from the store to the wire without
    // decoding them into an Entry.
    let emitter_only =
        exact && !server.acl.reads_entries() && needed_computed.is_empty() && !uses_dn;
    let no_decode = emitter_only && emitter.sel.wants_nothing();
    let raw = emitter_only && !no_decode;
    let mut filter_types: Vec<&AttributeType> = Vec::new();
    types_in_filter(schema, &req.filter, &mut filter_types);
    // When entries are decoded: access rules with filters look at whole
    // entries; otherwise only what goes out or is tested is decoded.
    let wanted = if emitter_only || server.acl.reads_entries() {
        None
    } else {
        Wanted::new(
            schema,
            &emitter.sel,
            if exact { &[] } else { &filter_types[..] },
        )
    };
    let keep = |desc: &str| wanted.as_ref().is_none_or(|w| w.keep(desc));
    let mut masked: HashMap<u64, pando_model::CompiledFilter> = HashMap::new();
    let mut rules = EntryRules::default();
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
    let resume_after = last_id.or(resume_after);
    let iter = scope_ids
        .iter()
        .filter(|id| resume_after.is_none_or(|a| *id > a));
    for id in iter {
        if job.abandoned.load(Ordering::Relaxed) {
            return Ok(Step::Done(None));
        }
        if let Some(t) = time_limit {
            if started.elapsed() > t {
                flush(out, &mut buf)?;
                return Ok(Step::Done(Some(SearchOutcome {
                    result: LdapResult::new(ResultCode::TIME_LIMIT_EXCEEDED, "time limit exceeded"),
                    controls: if job.controls.paged.is_some() {
                        vec![paged_control(0, Vec::new())]
                    } else {
                        Vec::new()
                    },
                    entries: sent_now,
                })));
            }
        }
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
        let attrs = if no_decode || raw {
            Vec::new()
        } else {
            let Some(attrs) = view.attrs_where(id, &keep)? else {
                continue;
            };
            attrs
        };
        let (dn, norm) = view.dn_pair_of(&place)?;
        // The parsed DN is only consulted by extensible matches with dnAttributes.
        let parsed = if uses_dn {
            Dn::parse(&dn).unwrap_or(Dn { rdns: Vec::new() })
        } else {
            Dn { rdns: Vec::new() }
        };
        let mut entry = Entry { dn: parsed, attrs };
        for name in &needed_computed {
            let restricted = (!access.unrestricted()).then_some(&mut access);
            // Left out (so tests of it are Undefined) when not given.
            if let Some(v) = computed_value(schema, &view, restricted, id, &dn, name)? {
                entry.attrs.push(pando_model::Attribute {
                    desc: name.to_string(),
                    values: vec![v.into_bytes()],
                });
            }
        }
        // An exact filter is one equality the index answered: it holds
        // unless its attribute is masked (Undefined). With `no_decode` or
        // `raw` the entry here has no attributes, so it is not tested.
        let matched = if access.unrestricted() {
            if exact {
                Ternary::True
            } else {
                filter.matches(schema, &entry)
            }
        } else {
            access.entry_into(schema, &norm, &entry, &mut rules);
            if !access.allows(Some(&view), &rules, &norm, None, acl::READ) {
                continue;
            }
            // Filter items on attributes the requester may not search are
            // Undefined for them, as if the attribute were invisible.
            let mut mask = 0u64;
            for (i, at) in filter_types.iter().enumerate() {
                if !access.allows(Some(&view), &rules, &norm, Some(at), acl::SEARCH) {
                    mask |= 1 << i.min(63);
                }
            }
            if no_decode || raw {
                if mask == 0 {
                    Ternary::True
                } else {
                    Ternary::Undefined
                }
            } else if mask == 0 {
                if exact {
                    Ternary::True
                } else {
                    filter.matches(schema, &entry)
                }
            } else {
                let hidden: Vec<&str> = filter_types
                    .iter()
                    .enumerate()
                    .filter(|(i, _)| mask & (1 << (*i).min(63)) != 0)
                    .map(|(_, at)| at.oid.as_str())
                    .collect();
                let hide = |at: &AttributeType| hidden.contains(&at.oid.as_str());
                if filter_types.len() > 64 {
                    schema
                        .compile_filter_hiding(&req.filter, &hide)
                        .matches(schema, &entry)
                } else {
                    masked
                        .entry(mask)
                        .or_insert_with(|| schema.compile_filter_hiding(&req.filter, &hide))
                        .matches(schema, &entry)
                }
            }
        };
        if matched != Ternary::True {
            continue;
        }
        if let Some(limit) = total_limit {
            if sent_before + sent_now >= limit {
                flush(out, &mut buf)?;
                return Ok(Step::Done(Some(SearchOutcome {
                    result: LdapResult::new(ResultCode::SIZE_LIMIT_EXCEEDED, "size limit exceeded"),
                    controls: if job.controls.paged.is_some() {
                        vec![paged_control(0, Vec::new())]
                    } else {
                        Vec::new()
                    },
                    entries: sent_now,
                })));
            }
        }
        if page_size.is_some_and(|p| sent_now >= p) {
            // A full page went out and there is more: hand back a cookie.
            flush(out, &mut buf)?;
            sent_before += sent_now;
            let cookie = Cookie {
                last: last_id.unwrap_or(0),
                sent: sent_before,
                hash,
            }
            .encode();
            return Ok(Step::Done(Some(SearchOutcome {
                result: LdapResult::success(),
                controls: vec![paged_control(0, cookie)],
                entries: sent_now,
            })));
        }
        let guard = (!access.unrestricted()).then_some(Guard {
            access: &mut access,
            rules: &rules,
            norm: &norm,
        });
        if raw {
            let emitted = view.with_raw_attrs(id, |attrs| {
                emitter.emit_attrs(Some(&view), Some(id), &dn, attrs, guard, &mut buf)
            })?;
            match emitted {
                Some(r) => r?,
                None => continue,
            }
        } else {
            emitter.emit(Some(&view), Some(id), &dn, &entry, guard, &mut buf)?;
        }
        sent_now += 1;
        last_id = Some(id);
        if buf.len() >= CHUNK {
            if let Some(chunk) = send_or_hold(out, &mut buf)? {
                let resume = Resume {
                    after: id,
                    sent: sent_now,
                    started,
                };
                return Ok(Step::Paused { chunk, resume });
            }
        }
    }
    flush(out, &mut buf)?;
    let controls = if job.controls.paged.is_some() {
        vec![paged_control(0, Vec::new())]
    } else {
        Vec::new()
    };
    Ok(Step::Done(Some(SearchOutcome {
        result: LdapResult::success(),
        controls,
        entries: sent_now,
    })))
}

fn flush(out: &mut Out<'_>, buf: &mut Vec<u8>) -> OpResult<()> {
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

/// Attribute types a filter tests, each once.
pub(crate) fn types_in_filter<'s>(
    schema: &'s Schema,
    filter: &Filter,
    out: &mut Vec<&'s AttributeType>,
) {
    for_each_filter_attr(filter, &mut |desc| {
        if let Ok((_, at)) = schema.canonical_desc(desc) {
            if !out.iter().any(|x| std::ptr::eq(*x, at)) {
                out.push(at);
            }
        }
    });
}

/// The stricter of two limits where 0 means unlimited.
fn smaller_limit(a: u32, b: u32) -> u32 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
}

/// Search limits for one requester (0 = unlimited; unindexed: most
/// entries an unindexed search may examine).
struct Limits {
    size: u32,
    time: u32,
    unindexed: u64,
}

impl Limits {
    /// The first `[[limits.by]]` matching the requester, over the general
    /// limits (administrators: none).
    fn for_requester(server: &Server, who: &Identity, view: &View<'_>) -> Limits {
        let l = &server.cfg.config.limits;
        let base = if who.is_admin() || who.is_break_glass() {
            Limits {
                size: 0,
                time: 0,
                unindexed: u64::MAX,
            }
        } else if who.is_anonymous() {
            Limits {
                size: smaller_limit(l.size_limit, l.anonymous.size_limit),
                time: smaller_limit(l.time_limit, l.anonymous.time_limit),
                unindexed: l.unindexed_search_limit,
            }
        } else {
            Limits {
                size: l.size_limit,
                time: l.time_limit,
                unindexed: l.unindexed_search_limit,
            }
        };
        match server.limits_by.iter().find(|(w, _)| w.holds(who, view)) {
            None => base,
            Some((_, o)) => Limits {
                size: o.size_limit.unwrap_or(base.size),
                time: o.time_limit.unwrap_or(base.time),
                unindexed: o.unindexed_search_limit.unwrap_or(base.unindexed),
            },
        }
    }
}

/// Candidate IDs within the scope, ascending.
fn scope_candidates(
    view: &View<'_>,
    limit: u64,
    base: EntryId,
    scope: Scope,
    cands: Candidates,
) -> OpResult<(RoaringTreemap, Option<Scope>)> {
    if scope == Scope::Base {
        let mut s = RoaringTreemap::new();
        s.insert(base);
        return Ok((s, None));
    }
    let over_limit = || {
        LdapError::new(
            ResultCode::ADMIN_LIMIT_EXCEEDED,
            format!("unindexed search would examine more than {limit} entries; add an index or narrow the filter"),
        )
    };
    let mut set = match cands {
        // Index candidates: the caller checks each against the scope.
        Candidates::Ids(ids) => return Ok((ids, Some(scope))),
        Candidates::All if scope == Scope::One => {
            let kids: RoaringTreemap = view.children(base)?.into_iter().collect();
            if kids.len() > limit {
                return Err(over_limit());
            }
            kids
        }
        Candidates::All => view.subtree(base, limit)?.ok_or_else(over_limit)?,
    };
    if scope == Scope::Children {
        set.remove(base);
    }
    Ok((set, None))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::test_server::{add, server, user};
    use pando_proto::DerefAliases;

    /// Entries a search returns: DN and (attribute, values as text).
    type Found = Vec<(String, Vec<(String, Vec<String>)>)>;

    fn search_as(
        server: &Arc<Server>,
        who: &Identity,
        base: &str,
        scope: Scope,
        filter: &str,
        attrs: &[&str],
    ) -> Found {
        let (tx, mut rx) = mpsc::channel(1024);
        let job = SearchJob {
            server: server.clone(),
            who: who.clone(),
            msg_id: 1,
            req: SearchRequest {
                base: base.into(),
                scope,
                deref: DerefAliases::Never,
                size_limit: 0,
                time_limit: 0,
                types_only: false,
                filter: Filter::parse(filter).unwrap(),
                attrs: attrs.iter().map(|a| a.to_string()).collect(),
            },
            controls: Default::default(),
            abandoned: Arc::new(AtomicBool::new(false)),
            out: tx,
        };
        let Ran::Done(Some(outcome)) = run(&job, None) else {
            panic!("the search did not finish in one run");
        };
        assert_eq!(
            outcome.result.code,
            ResultCode::SUCCESS,
            "{:?}",
            outcome.result
        );
        let mut bytes = Vec::new();
        while let Ok(chunk) = rx.try_recv() {
            bytes.extend(chunk);
        }
        let mut found = Vec::new();
        let mut at = 0;
        while at < bytes.len() {
            let len = pando_proto::frame_length(&bytes[at..], usize::MAX)
                .unwrap()
                .unwrap();
            let msg = LdapMessage::decode(&bytes[at..at + len], &Default::default()).unwrap();
            at += len;
            let ProtocolOp::SearchResultEntry(e) = msg.op else {
                panic!("not an entry: {:?}", msg.op);
            };
            let attrs = e
                .attrs
                .into_iter()
                .map(|a| {
                    let v = a.values.iter().map(|v| String::from_utf8_lossy(v).into());
                    (a.name, v.collect())
                })
                .collect();
            found.push((e.dn, attrs));
        }
        found
    }

    /// The values of `name` in the one entry found (None: absent).
    fn value_of(found: &Found, name: &str) -> Option<String> {
        assert_eq!(found.len(), 1, "{found:?}");
        found[0]
            .1
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.join(","))
    }

    /// ou is indexed so that an ou= filter is exact (see `raw`).
    const HIDING_RULES: &str = r#"
[indexes]
ou = ["eq"]
[[access]]
dn = "cn=secret,ou=people,dc=example,dc=com"
by = [{ who = "admins", rights = "all" }]
[[access]]
dn = "ou=vault,dc=example,dc=com"
scope = "children"
by = [{ who = "admins", rights = "all" }]
[[access]]
by = [{ who = "admins", rights = "all" }, { who = "users", rights = "read" }]
"#;

    fn hiding_tree(server: &Server) {
        for ou in ["People", "Vault"] {
            add(
                server,
                &format!("ou={ou},dc=example,dc=com"),
                &[("objectClass", "organizationalUnit"), ("ou", ou)],
            );
        }
        for (cn, parent) in [
            ("alice", "People"),
            ("bob", "People"),
            ("secret", "People"),
            ("gold", "Vault"),
        ] {
            add(
                server,
                &format!("cn={cn},ou={parent},dc=example,dc=com"),
                &[("objectClass", "person"), ("cn", cn), ("sn", cn)],
            );
        }
    }

    #[test]
    fn subordinate_counts_leave_out_children_the_requester_cannot_see() {
        let dir = tempfile::tempdir().unwrap();
        let server = server(dir.path(), HIDING_RULES);
        hiding_tree(&server);
        let counts = &["numSubordinates", "hasSubordinates"];
        let alice = user(&server, "cn=alice,ou=People,dc=example,dc=com", false);
        let admin = user(&server, "cn=admin,dc=example,dc=com", true);
        let people = "ou=People,dc=example,dc=com";
        let vault = "ou=Vault,dc=example,dc=com";
        let base = |who: &Identity, dn: &str| {
            let f = search_as(&server, who, dn, Scope::Base, "(objectClass=*)", counts);
            (
                value_of(&f, "numSubordinates"),
                value_of(&f, "hasSubordinates"),
            )
        };
        let some = |n: &str, has: &str| (Some(n.to_string()), Some(has.to_string()));
        // cn=secret is hidden from alice, and all of ou=Vault's children.
        assert_eq!(base(&alice, people), some("2", "TRUE"));
        assert_eq!(base(&alice, vault), some("0", "FALSE"));
        assert_eq!(base(&admin, people), some("3", "TRUE"));
        assert_eq!(base(&admin, vault), some("1", "TRUE"));
        // The same in a filter: ou=Vault has no subordinates for alice.
        let with_children = |who: &Identity| {
            let f = search_as(
                &server,
                who,
                "dc=example,dc=com",
                Scope::One,
                "(hasSubordinates=TRUE)",
                &["1.1"],
            );
            let mut dns: Vec<String> = f.into_iter().map(|(dn, _)| dn).collect();
            dns.sort();
            dns
        };
        assert_eq!(with_children(&alice), [people]);
        assert_eq!(with_children(&admin), [people, vault]);
        // Through the path that sends entries undecoded (an exact filter,
        // no rule with a filter) as well.
        for (dn, ou, want) in [
            (people, "People", some("2", "TRUE")),
            (vault, "Vault", some("0", "FALSE")),
        ] {
            let f = search_as(
                &server,
                &alice,
                "dc=example,dc=com",
                Scope::Sub,
                &format!("(ou={ou})"),
                &["ou", "numSubordinates", "hasSubordinates"],
            );
            assert_eq!(f[0].0, dn);
            let got = (
                value_of(&f, "numSubordinates"),
                value_of(&f, "hasSubordinates"),
            );
            assert_eq!(got, want, "{dn}");
        }
    }

    #[test]
    fn restricted_subordinate_counts_stop_at_the_cap_and_say_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let server = server(dir.path(), HIDING_RULES);
        hiding_tree(&server);
        let alice = user(&server, "cn=alice,ou=People,dc=example,dc=com", false);
        let mut access = Access::new(&server.acl, &alice);
        assert!(!access.reads_every_entry());
        let rtxn = server.store.read().unwrap();
        let view = rtxn.view();
        let id = |dn: &str| super::super::resolve(&view, &Dn::parse(dn).unwrap()).unwrap();
        let people = id("ou=People,dc=example,dc=com");
        let vault = id("ou=Vault,dc=example,dc=com");
        let schema = &*server.schema;
        let mut seen = |id, first_only, max| {
            visible_children(schema, &view, &mut access, id, first_only, max).unwrap()
        };
        // People: alice, bob (visible), secret (hidden).
        assert_eq!(seen(people, false, 3), Some(2));
        assert_eq!(seen(people, false, 2), None, "more children than checked");
        assert_eq!(seen(people, true, 1), Some(1), "stops at the first");
        assert_eq!(seen(people, true, 0), None);
        assert_eq!(seen(vault, true, 1), Some(0));
        assert_eq!(seen(vault, false, 0), None);
    }
}
