//! The in-directory access log: completed operations as entries below
//! `cn=accesslog`, in OpenLDAP's accesslog schema (auditAdd, auditModify,
//! auditSearch, … with reqStart, reqType, reqDN, reqMod, reqResult…).
//!
//! Successful writes are not stored twice: their records are the change
//! log's (`pando_store::LoggedChange`, which replication reads), shown in
//! this form. Everything else configured (reads, binds, failed writes) is
//! recorded in the store's access log database, purged by age.
//!
//! A record's RDN is `reqStart`, a time to the nanosecond (nine fraction
//! digits, the most a GeneralizedTime keeps here): the operation's
//! microsecond, then three digits that keep records of one microsecond
//! apart. Records this server stores use 500-999 (a counter). Records of
//! the change log use 0-499, by their position among the change log's
//! records of that microsecond; an operation that changed more entries
//! than that in one microsecond (a large tree delete) runs on into the
//! following nanoseconds. Every reqStart has the same length, so records
//! sort in time order as text.
//!
//! Stored records are bounded, as any client can make them: each one's
//! values to `max_record_bytes` (longer values cut, marked); the whole log
//! to `max_records` and `max_bytes`, the oldest purged first (the change
//! log, which delta-sync reads, is never touched); anonymous operations
//! that fail are counted, not stored. Records reach the writer through a
//! bounded in-memory queue with at most one writer job waiting for it, so
//! a flood costs the writer one job per batch, never one per request, and
//! real writes and replication are not queued behind it.

pub mod sync;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use pando_model::{Attribute, Dn, Entry, Schema, Ternary};
use pando_proto::{BindAuth, DerefAliases, ProtocolOp, Scope};
use pando_store::{LoggedChange, LoggedKind, ModOp, View};

use pando_access::Identity;
use pando_config::overlay::AccesslogConfig;
use pando_observe::metrics::OpKind;
use pando_ops::state::Server;

pub const SUFFIX: &str = "cn=accesslog";

/// Which operations are logged.
#[derive(Clone, Debug, Default)]
pub struct Ops {
    kinds: Vec<OpKind>,
}

impl Ops {
    pub fn parse(words: &[String]) -> Result<Ops, String> {
        use OpKind::*;
        let mut kinds = Vec::new();
        for w in words {
            let add: &[OpKind] = match w.to_ascii_lowercase().as_str() {
                "add" => &[Add],
                "delete" => &[Delete],
                "modify" => &[Modify],
                "modrdn" => &[ModDn],
                "search" => &[Search],
                "compare" => &[Compare],
                "bind" | "session" => &[Bind],
                "extended" => &[Extended],
                "writes" => &[Add, Delete, Modify, ModDn],
                "reads" => &[Search, Compare],
                "all" => &[Add, Delete, Modify, ModDn, Search, Compare, Bind, Extended],
                other => {
                    return Err(format!(
                        "'{other}' is not an operation (add, delete, modify, modrdn, search, compare, bind, extended, writes, reads, session, all)"
                    ))
                }
            };
            for k in add {
                if !kinds.contains(k) {
                    kinds.push(*k);
                }
            }
        }
        Ok(Ops { kinds })
    }

    pub fn logs(&self, k: OpKind) -> bool {
        self.kinds.contains(&k)
    }
}

pub struct AccessLog {
    ops: Ops,
    success_only: bool,
    purge_days: u64,
    max_records: u64,
    max_bytes: u64,
    max_record_bytes: usize,
    queue_records: usize,
    queue: Arc<Queue>,
}

/// An operation being logged: its record's attributes so far.
pub struct Pending {
    kind: OpKind,
    /// Made by an anonymous client (a failure is then only counted).
    anonymous: bool,
    start_micros: u64,
    attrs: Vec<(&'static str, Vec<Vec<u8>>)>,
}

/// Records waiting for the writer, as (reqStart, encoded record).
///
/// Invariant: when `records` is not empty, `job_queued` is set and one
/// writer job that has not yet run will take them all. Records arriving
/// while it waits join it.
#[derive(Default)]
struct Queue {
    state: Mutex<QueueState>,
}

#[derive(Default)]
struct QueueState {
    records: Vec<(String, Vec<u8>)>,
    job_queued: bool,
}

impl Queue {
    /// Add a record unless `limit` are waiting; whether a job must be
    /// submitted for it (none is queued yet). None: the queue is full.
    fn push(&self, limit: usize, record: (String, Vec<u8>)) -> Option<bool> {
        let mut q = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if q.records.len() >= limit {
            return None;
        }
        q.records.push(record);
        Some(!std::mem::replace(&mut q.job_queued, true))
    }

    /// Everything waiting; the next record needs a job of its own.
    fn take(&self) -> Vec<(String, Vec<u8>)> {
        let mut q = self.state.lock().unwrap_or_else(|p| p.into_inner());
        q.job_queued = false;
        std::mem::take(&mut q.records)
    }
}

/// Result codes of operations that did what was asked (compare's true
/// and false answers included).
fn succeeded(code: u32) -> bool {
    matches!(code, 0 | 5 | 6)
}

/// Values beyond this many of one attribute are left out of a stored
/// record (only reqAttr, the attributes a search asked for, has many).
const MAX_VALUES: usize = 64;

/// No value is cut shorter than this, so its start and the marker show.
const MIN_CUT: usize = 64;

/// Cut `v` to at most `level` bytes, ending in a marker with its length.
fn cut(v: &mut Vec<u8>, level: usize) {
    let marker = format!("...[cut, {} bytes]", v.len());
    let mut keep = level.saturating_sub(marker.len()).min(v.len());
    // Whole UTF-8 characters: back up over continuation bytes.
    while keep > 0 && v.get(keep).is_some_and(|b| b & 0xC0 == 0x80) {
        keep -= 1;
    }
    v.truncate(keep);
    v.extend_from_slice(marker.as_bytes());
}

/// Bound a record's values to about `max` bytes in all: at most
/// MAX_VALUES values per attribute, then every value longer than one
/// length cut to it, the length being the largest at which all fit (at
/// least MIN_CUT, so a record of many values may pass `max` by a little).
fn fit(attrs: &mut [(&'static str, Vec<Vec<u8>>)], max: usize) {
    for (_, values) in attrs.iter_mut() {
        values.truncate(MAX_VALUES);
    }
    let total = |level: usize| -> usize {
        attrs
            .iter()
            .flat_map(|(_, v)| v)
            .map(|v| v.len().min(level))
            .sum()
    };
    if total(usize::MAX) <= max {
        return;
    }
    let (mut lo, mut hi) = (MIN_CUT, max.max(MIN_CUT));
    while lo < hi {
        let mid = (lo + hi).div_ceil(2);
        if total(mid) <= max {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    for (_, values) in attrs.iter_mut() {
        for v in values.iter_mut().filter(|v| v.len() > lo) {
            cut(v, lo);
        }
    }
}

/// Records made in one microsecond are told apart by this counter.
static SEQUENCE: AtomicU64 = AtomicU64::new(0);

/// A time in nanoseconds since the epoch as reqStart text.
fn nanos_text(nanos: u64) -> String {
    let secs = pando_store::clock::generalized_time(nanos / 1000);
    format!(
        "{}.{:09}Z",
        secs.trim_end_matches('Z'),
        nanos % 1_000_000_000
    )
}

/// The reqStart of a record this server makes now.
fn local_start(micros: u64) -> String {
    let n = SEQUENCE.fetch_add(1, Ordering::Relaxed) % 500;
    nanos_text(micros * 1000 + 500 + n)
}

/// reqStart times of change log records, given in log order.
#[derive(Default)]
struct ChangeTimes {
    last: u64,
}

impl ChangeTimes {
    /// The reqStart of the next record, `c`: its CSN's microsecond, or
    /// the nanosecond after the previous record's when that is later.
    fn next(&mut self, c: &LoggedChange) -> String {
        let micros = pando_store::clock::parse_csn(&c.csn)
            .map(|(m, _)| m)
            .unwrap_or(0);
        let at = (micros * 1000).max(self.last + 1);
        self.last = at;
        nanos_text(at)
    }
}

fn one(v: impl Into<String>) -> Vec<Vec<u8>> {
    vec![v.into().into_bytes()]
}

fn is_write(kind: OpKind) -> bool {
    matches!(
        kind,
        OpKind::Add | OpKind::Delete | OpKind::Modify | OpKind::ModDn
    )
}

/// The record's attributes describing request `op`, added to `attrs`;
/// its object classes, reqType and target DN.
fn request_attrs<'o>(
    op: &'o ProtocolOp,
    schema: &Schema,
    attrs: &mut Vec<(&'static str, Vec<Vec<u8>>)>,
) -> Option<(&'static [&'static str], String, &'o str)> {
    const WRITE: &[&str] = &["auditObject", "auditWriteObject"];
    Some(match op {
        ProtocolOp::BindRequest(b) => {
            attrs.push(("reqVersion", one(b.version.to_string())));
            let method = match &b.auth {
                BindAuth::Simple(_) => "SIMPLE".to_string(),
                BindAuth::Sasl { mechanism, .. } => format!("SASL({mechanism})"),
            };
            attrs.push(("reqMethod", one(method)));
            (&["auditObject", "auditBind"], "bind".into(), &b.name)
        }
        ProtocolOp::SearchRequest(s) => {
            search_attrs(s, schema, attrs);
            (
                &["auditObject", "auditReadObject", "auditSearch"],
                "search".into(),
                &s.base,
            )
        }
        ProtocolOp::CompareRequest(c) => {
            let mut a = c.ava.attr.as_bytes().to_vec();
            a.push(b'=');
            // An assertion on a secret is a guess at it.
            if schema.is_secret(&c.ava.attr) {
                a.extend_from_slice(pando_observe::access_log::WITHHELD);
            } else {
                a.extend_from_slice(&c.ava.value);
            }
            attrs.push(("reqAssertion", vec![a]));
            (
                &["auditObject", "auditReadObject", "auditCompare"],
                "compare".into(),
                &c.dn,
            )
        }
        ProtocolOp::ExtendedRequest(x) => (
            &["auditObject", "auditExtended"],
            format!("extended{{{}}}", x.name),
            "",
        ),
        // Failed writes: what was asked, without values (they may hold
        // credentials).
        ProtocolOp::AddRequest(a) => (WRITE, "add".into(), &a.dn),
        ProtocolOp::DelRequest(d) => (WRITE, "delete".into(), d),
        ProtocolOp::ModifyRequest(m) => (WRITE, "modify".into(), &m.dn),
        ProtocolOp::ModifyDnRequest(m) => (WRITE, "modrdn".into(), &m.dn),
        _ => return None,
    })
}

fn search_attrs(
    s: &pando_proto::SearchRequest,
    schema: &Schema,
    attrs: &mut Vec<(&'static str, Vec<Vec<u8>>)>,
) {
    let scope = match s.scope {
        Scope::Base => "base",
        Scope::One => "one",
        Scope::Sub => "sub",
        Scope::Children => "subord",
    };
    let deref = match s.deref {
        DerefAliases::Never => "never",
        DerefAliases::InSearching => "searching",
        DerefAliases::FindingBase => "finding",
        DerefAliases::Always => "always",
    };
    attrs.push(("reqScope", one(scope)));
    attrs.push(("reqDerefAliases", one(deref)));
    attrs.push((
        "reqAttrsOnly",
        one(if s.types_only { "TRUE" } else { "FALSE" }),
    ));
    attrs.push((
        "reqFilter",
        one(pando_observe::access_log::shown_filter(schema, &s.filter)),
    ));
    if !s.attrs.is_empty() {
        attrs.push((
            "reqAttr",
            s.attrs.iter().map(|a| a.as_bytes().to_vec()).collect(),
        ));
    }
    attrs.push(("reqSizeLimit", one(s.size_limit.to_string())));
    attrs.push(("reqTimeLimit", one(s.time_limit.to_string())));
}

impl AccessLog {
    pub fn new(cfg: &AccesslogConfig) -> Result<AccessLog, String> {
        Ok(AccessLog {
            ops: Ops::parse(&cfg.ops)?,
            success_only: cfg.success_only,
            purge_days: cfg.purge_days,
            max_records: cfg.max_records,
            max_bytes: cfg.max_bytes,
            max_record_bytes: usize::try_from(cfg.max_record_bytes).unwrap_or(usize::MAX),
            queue_records: usize::try_from(cfg.queue_records).unwrap_or(usize::MAX),
            queue: Arc::default(),
        })
    }

    /// The start of a record for `op`, when it is logged here (successful
    /// writes are logged by the change log), its values bounded.
    pub fn begin(
        &self,
        conn: u64,
        who: &Identity,
        op: &ProtocolOp,
        schema: &Schema,
    ) -> Option<Box<Pending>> {
        let kind = pando_observe::kind_of(op)?;
        if !self.ops.logs(kind) || (is_write(kind) && self.success_only) {
            return None;
        }
        let mut attrs: Vec<(&'static str, Vec<Vec<u8>>)> = vec![
            ("reqSession", one(conn.to_string())),
            ("reqAuthzID", one(who.dn())),
        ];
        let (class, rtype, dn) = request_attrs(op, schema, &mut attrs)?;
        attrs.push((
            "objectClass",
            class.iter().map(|c| c.as_bytes().to_vec()).collect(),
        ));
        attrs.push(("reqType", one(rtype)));
        if !dn.is_empty() {
            attrs.push(("reqDN", one(dn)));
        }
        fit(&mut attrs, self.max_record_bytes);
        Some(Box::new(Pending {
            kind,
            anonymous: who.is_anonymous(),
            start_micros: pando_store::clock::now_micros(),
            attrs,
        }))
    }

    /// The operation ended with `code` (None: no response, e.g. abandoned)
    /// having sent `entries`: its record is queued for the writer, unless
    /// it is a successful write (the change log holds it), only successes
    /// are logged, or an anonymous client's operation failed (counted).
    pub fn end(&self, server: &Server, p: Pending, code: Option<u32>, entries: u64) {
        let code = code.unwrap_or(pando_proto::ResultCode::OTHER.0);
        if (is_write(p.kind) && code == 0) || (self.success_only && code != 0) {
            return;
        }
        let counters = &server.rt.metrics.accesslog;
        // Anyone can send these by the thousand; a bind's failure is what
        // an auditor looks for, and binds are throttled, so binds stay.
        if p.anonymous && p.kind != OpKind::Bind && !succeeded(code) {
            counters.refused_anonymous.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let Pending {
            kind,
            start_micros,
            mut attrs,
            ..
        } = p;
        let start = local_start(start_micros);
        attrs.push(("reqResult", one(code.to_string())));
        attrs.push((
            "reqEnd",
            one(nanos_text(pando_store::clock::now_micros() * 1000)),
        ));
        if kind == OpKind::Search {
            attrs.push(("reqEntries", one(entries.to_string())));
        }
        match self.queue.push(self.queue_records, (start, encode(&attrs))) {
            None => {
                counters.dropped.fetch_add(1, Ordering::Relaxed);
            }
            Some(true) => self.submit(server),
            Some(false) => {}
        }
    }

    /// Queue the writer job that stores what is waiting, purges records
    /// past their age and trims the log to its caps. Written after the
    /// operations answered; records that cannot be written are logged,
    /// counted and dropped.
    fn submit(&self, server: &Server) {
        let cutoff = (self.purge_days != 0).then(|| {
            format!(
                "{}.",
                pando_store::clock::generalized_time(
                    pando_store::clock::now_micros()
                        .saturating_sub(self.purge_days * 86_400_000_000)
                )
                .trim_end_matches('Z')
            )
        });
        let (max_records, max_bytes) = (self.max_records, self.max_bytes);
        let queue = self.queue.clone();
        let counters = server.rt.metrics.accesslog.clone();
        let job_counters = counters.clone();
        let queued = server
            .rt
            .store
            .submit(move |w: &mut pando_store::WriteTxn<'_>| {
                let records = queue.take();
                for (start, value) in &records {
                    w.put_access_record(start, value)?;
                }
                if let Some(cutoff) = &cutoff {
                    w.purge_access_records(Some(cutoff), records.len() + 16)?;
                }
                let purged = w.trim_access_records(max_records, max_bytes)?;
                job_counters.purged.fetch_add(purged, Ordering::Relaxed);
                Ok::<(), pando_store::StoreError>(())
            });
        if let Err(e) = queued {
            let lost = self.queue.take().len() as u64;
            counters.dropped.fetch_add(lost, Ordering::Relaxed);
            tracing::warn!("access log records not written ({lost}): {e}");
        }
    }

    /// Whether change log records of `kind` are shown.
    fn shows(&self, kind: LoggedKind) -> bool {
        self.ops.logs(match kind {
            LoggedKind::Add => OpKind::Add,
            LoggedKind::Delete => OpKind::Delete,
            LoggedKind::Modify => OpKind::Modify,
            LoggedKind::ModDn => OpKind::ModDn,
        })
    }
}

fn put(out: &mut Vec<u8>, b: &[u8]) {
    out.extend_from_slice(&(b.len() as u32).to_le_bytes());
    out.extend_from_slice(b);
}

/// A record's attributes as stored.
fn encode(attrs: &[(&str, Vec<Vec<u8>>)]) -> Vec<u8> {
    let mut out = vec![1u8];
    out.extend_from_slice(&(attrs.len() as u32).to_le_bytes());
    for (name, values) in attrs {
        put(&mut out, name.as_bytes());
        out.extend_from_slice(&(values.len() as u32).to_le_bytes());
        for v in values {
            put(&mut out, v);
        }
    }
    out
}

fn decode(mut b: &[u8]) -> Option<Vec<Attribute>> {
    fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
        let (h, t) = (b.get(..n)?, b.get(n..)?);
        *b = t;
        Some(h)
    }
    fn num(b: &mut &[u8]) -> Option<usize> {
        Some(u32::from_le_bytes(take(b, 4)?.try_into().ok()?) as usize)
    }
    if take(&mut b, 1)? != [1] {
        return None;
    }
    let n = num(&mut b)?;
    let mut attrs = Vec::with_capacity(n.min(64));
    for _ in 0..n {
        let len = num(&mut b)?;
        let name = String::from_utf8(take(&mut b, len)?.to_vec()).ok()?;
        let count = num(&mut b)?;
        let mut values = Vec::with_capacity(count.min(1024));
        for _ in 0..count {
            let len = num(&mut b)?;
            values.push(take(&mut b, len)?.to_vec());
        }
        attrs.push(Attribute { desc: name, values });
    }
    Some(attrs)
}

/// The entry of a record with `reqStart` `start`.
fn record_entry(start: &str, mut attrs: Vec<Attribute>) -> Option<(String, Entry)> {
    let dn_text = format!("reqStart={start},{SUFFIX}");
    let mut e = Entry::new(Dn::parse(&dn_text).ok()?);
    e.add_values("reqStart", vec![start.as_bytes().to_vec()]);
    e.attrs.append(&mut attrs);
    Some((dn_text, e))
}

/// `attr:<op> value` values of OpenLDAP's reqMod.
fn req_mod(desc: &str, op: char, values: &[Vec<u8>]) -> Vec<Vec<u8>> {
    if values.is_empty() {
        return vec![format!("{desc}:{op}").into_bytes()];
    }
    values
        .iter()
        .map(|v| {
            let mut m = format!("{desc}:{op} ").into_bytes();
            m.extend_from_slice(v);
            m
        })
        .collect()
}

/// A change log record as an access log entry named by `start`.
fn change_entry(c: &LoggedChange, start: String) -> Option<(String, Entry)> {
    let (class, rtype) = match c.kind {
        LoggedKind::Add => ("auditAdd", "add"),
        LoggedKind::Delete => ("auditDelete", "delete"),
        LoggedKind::Modify => ("auditModify", "modify"),
        LoggedKind::ModDn => ("auditModRDN", "modrdn"),
    };
    let target = c.old_dn.as_deref().unwrap_or(&c.dn);
    let mut attrs = vec![
        Attribute {
            desc: "objectClass".into(),
            values: ["auditObject", "auditWriteObject", class]
                .iter()
                .map(|c| c.as_bytes().to_vec())
                .collect(),
        },
        attr("reqType", rtype),
        attr("reqSession", "0"),
        attr("reqAuthzID", &c.by),
        attr("reqDN", target),
        attr("reqResult", "0"),
        attr("reqEnd", &start),
        attr("reqEntryUUID", &c.uuid),
        attr("entryCSN", &c.csn),
    ];
    let shape = super::change_shape::of(c);
    let mods: Vec<Vec<u8>> = shape
        .mods
        .iter()
        .flat_map(|m| {
            let op = match m.op {
                ModOp::Add => '+',
                ModOp::Delete => '-',
                ModOp::Replace => '=',
            };
            req_mod(&m.desc, op, &m.values)
        })
        .collect();
    if !mods.is_empty() {
        attrs.push(Attribute {
            desc: "reqMod".into(),
            values: mods,
        });
    }
    if let Some(r) = &shape.rename {
        attrs.push(attr("reqNewRDN", &r.new_rdn));
        if let Some(sup) = &r.new_superior {
            attrs.push(attr("reqNewSuperior", sup));
        }
        attrs.push(attr(
            "reqDeleteOldRDN",
            if r.delete_old_rdn { "TRUE" } else { "FALSE" },
        ));
        attrs.push(attr("reqNewDN", &c.dn));
    }
    record_entry(&start, attrs)
}

fn attr(name: &str, value: &str) -> Attribute {
    Attribute {
        desc: name.into(),
        values: vec![value.as_bytes().to_vec()],
    }
}

/// Whether `who` may read cn=accesslog: administrators, and those an
/// access rule naming cn=accesslog lets read it (a delta-sync consumer's
/// identity); rules covering every entry do not open it, as records show
/// every value written, passwords included.
pub fn may_read(server: &Server, who: &Identity) -> bool {
    pando_ops::config_tree::may_see(who)
        || pando_access::acl::Access::new(&server.acl, who)
            .named_allows(SUFFIX, pando_access::acl::READ)
}

/// A change log record as content synchronization of cn=accesslog sends
/// it: an entry named by its reqStart, with a UUID made from its CSN and
/// its place in its operation (the same every time it is sent).
pub struct SyncRecord {
    pub csn: String,
    pub uuid: [u8; 16],
    pub dn: String,
    pub entry: Entry,
}

/// A record's UUID: its CSN's microsecond (8 bytes), change count (3) and
/// server ID (2), then its place in the operation (3).
fn record_uuid(c: &LoggedChange) -> [u8; 16] {
    let (micros, count) = pando_store::clock::parse_csn(&c.csn).unwrap_or((0, 0));
    let sid = pando_proto::sync::csn_sid(&c.csn).unwrap_or(0);
    let mut u = [0u8; 16];
    u[..8].copy_from_slice(&micros.to_be_bytes());
    u[8..11].copy_from_slice(&count.to_be_bytes()[5..]);
    u[11..13].copy_from_slice(&sid.to_be_bytes());
    u[13..].copy_from_slice(&c.seq.to_be_bytes()[1..]);
    u
}

fn sync_record(log: &AccessLog, times: &mut ChangeTimes, c: LoggedChange) -> Option<SyncRecord> {
    let start = times.next(&c);
    if !log.shows(c.kind) {
        return None;
    }
    let uuid = record_uuid(&c);
    let (dn, entry) = change_entry(&c, start)?;
    Some(SyncRecord {
        csn: c.csn,
        uuid,
        dn,
        entry,
    })
}

/// The records of the changes with a CSN greater than `after` ("": all),
/// in CSN order.
pub fn sync_records_after<'v>(
    view: &'v View<'_>,
    log: &'v AccessLog,
    after: &str,
) -> Result<
    impl Iterator<Item = Result<SyncRecord, pando_store::StoreError>> + 'v,
    pando_store::StoreError,
> {
    let mut times = ChangeTimes::default();
    Ok(view
        .changes_after(after)?
        .filter_map(move |c| c.map(|c| sync_record(log, &mut times, c)).transpose()))
}

/// The records of the operation stamped `csn`.
pub fn sync_records_at(
    view: &View<'_>,
    log: &AccessLog,
    csn: &str,
) -> Result<Vec<SyncRecord>, pando_store::StoreError> {
    let mut times = ChangeTimes::default();
    Ok(view
        .changes_at(csn)?
        .into_iter()
        .filter_map(|c| sync_record(log, &mut times, c))
        .collect())
}

/// Where a search may start reading: the second of the lower bound on
/// reqStart a filter sets at its top (`(reqStart>=x)`, alone or in an
/// AND), as `YYYYmmddHHMMSS`, which sorts before every record of that
/// second; "" (from the start) when there is none or it has a time zone.
/// The filter itself still decides which records match.
fn seek_from(f: &pando_proto::Filter) -> String {
    use pando_proto::Filter;
    let bound = |v: &[u8]| -> Option<String> {
        let t = std::str::from_utf8(v).ok()?;
        if t.contains(['+', '-']) {
            return None;
        }
        let digits: String = t
            .chars()
            .take_while(char::is_ascii_digit)
            .take(14)
            .collect();
        Some(digits)
    };
    match f {
        Filter::GreaterOrEqual(a) if a.attr.eq_ignore_ascii_case("reqStart") => {
            bound(&a.value).unwrap_or_default()
        }
        Filter::And(items) => items.iter().map(seek_from).max().unwrap_or_default(),
        _ => String::new(),
    }
}

/// The log's root, with the state of the log as OpenLDAP's root entry
/// holds it: contextCSN (the newest change per server ID) and minCSN (per
/// server ID, the log may lack changes up to it: the change log's floor).
fn container(view: &View<'_>) -> Entry {
    let mut e = Entry::new(Dn::parse(SUFFIX).unwrap_or(Dn { rdns: Vec::new() }));
    e.add_values(
        "objectClass",
        vec![b"top".to_vec(), b"auditContainer".to_vec()],
    );
    e.add_values("cn", vec![b"accesslog".to_vec()]);
    let newest = view.context_csns().unwrap_or_default();
    let floor = view.changelog_floor().unwrap_or_default();
    // The floor's time and count, with each server ID.
    let min: Vec<Vec<u8>> = match floor.split('#').collect::<Vec<_>>()[..] {
        [time, count, _, modn] => newest
            .iter()
            .filter_map(|c| c.split('#').nth(2))
            .map(|sid| format!("{time}#{count}#{sid}#{modn}").into_bytes())
            .collect(),
        _ => Vec::new(),
    };
    if !newest.is_empty() {
        e.add_values(
            "contextCSN",
            newest.into_iter().map(String::into_bytes).collect(),
        );
    }
    if !min.is_empty() {
        e.add_values("minCSN", min);
    }
    e
}

/// The entries of `cn=accesslog` a search with `base_norm`, `scope` and
/// `filter` may return, in time order: the container and the records
/// matching the filter, at most `limit` records (0: no limit), reading at
/// most `scan` records.
pub fn entries(
    log: &AccessLog,
    server: &Server,
    base_norm: &str,
    scope: Scope,
    filter: &pando_proto::Filter,
    limit: u64,
    scan: u64,
) -> Vec<(String, Entry)> {
    let schema: &Schema = &server.schema;
    let Ok(rtxn) = server.rt.store.read() else {
        return Vec::new();
    };
    let view = rtxn.view();
    let mut out = vec![(SUFFIX.to_string(), container(&view))];
    if scope == Scope::Base && base_norm == SUFFIX {
        return out;
    }
    // One record named as the base.
    let only = base_norm
        .strip_suffix(&format!(",{SUFFIX}"))
        .and_then(|r| r.strip_prefix("reqstart="))
        .map(|s| s.to_ascii_uppercase());
    let from = match &only {
        Some(s) => s
            .chars()
            .take_while(char::is_ascii_digit)
            .take(14)
            .collect(),
        None => seek_from(filter),
    };
    let compiled = schema.compile_filter(filter);
    let mut found = 0u64;
    let mut read = 0u64;
    let mut take = |e: (String, Entry)| -> bool {
        read += 1;
        let wanted = match &only {
            // The base names one record.
            Some(_) => schema.normalize_dn(&e.1.dn).is_ok_and(|n| n == base_norm),
            None => compiled.matches(schema, &e.1) == Ternary::True,
        };
        if wanted {
            out.push(e);
            found += 1;
        }
        (limit == 0 || found <= limit) && (scan == 0 || read < scan)
    };
    // The two sources merged in reqStart order.
    let changes = change_iter(&view, log, &from);
    let records = record_iter(&view, &from);
    let mut changes = changes.peekable();
    let mut records = records.peekable();
    loop {
        let next = match (changes.peek(), records.peek()) {
            (Some(a), Some(b)) if a.0 <= b.0 => changes.next(),
            (Some(_), None) => changes.next(),
            (_, Some(_)) => records.next(),
            (None, None) => None,
        };
        let Some((_, e)) = next else { break };
        if !take(e) {
            break;
        }
    }
    out
}

/// Change log records shown (by kind), from the second `from` (CSNs
/// begin with their time, so every CSN of that second sorts after it),
/// as (reqStart, entry).
fn change_iter<'v>(
    view: &'v View<'_>,
    log: &'v AccessLog,
    from: &str,
) -> impl Iterator<Item = (String, (String, Entry))> + 'v {
    let mut times = ChangeTimes::default();
    view.changes_after(from)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .map(move |c| {
            let start = times.next(&c);
            (c, start)
        })
        .filter(move |(c, _)| log.shows(c.kind))
        .filter_map(|(c, start)| change_entry(&c, start))
        .map(|e| (start_of(&e.0).to_string(), e))
}

fn start_of(dn: &str) -> &str {
    dn.strip_prefix("reqStart=")
        .and_then(|r| r.split(',').next())
        .unwrap_or("")
}

/// Stored records from `from`, as (reqStart, entry).
fn record_iter<'v>(
    view: &'v View<'_>,
    from: &str,
) -> impl Iterator<Item = (String, (String, Entry))> + 'v {
    view.access_records_from(from)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter_map(|(k, v)| Some((k.clone(), record_entry(&k, decode(&v)?)?)))
}

/// The access log as the operations tell it of each operation
/// (`ops::seams::OpLog`).
impl pando_ops::seams::OpLog for AccessLog {
    fn begin(
        &self,
        conn: u64,
        who: &Identity,
        request: &ProtocolOp,
        schema: &Schema,
    ) -> Option<pando_ops::seams::Begun> {
        AccessLog::begin(self, conn, who, request, schema).map(|p| p as pando_ops::seams::Begun)
    }

    fn end(
        &self,
        server: &Server,
        begun: pando_ops::seams::Begun,
        code: Option<u32>,
        entries: u64,
    ) {
        if let Ok(p) = begun.downcast::<Pending>() {
            AccessLog::end(self, server, *p, code, entries);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_bounded_and_cuts_marked() {
        let long = "é".repeat(15_000).into_bytes();
        let mut attrs = vec![
            ("reqType", one("search")),
            ("reqDN", vec![long.clone()]),
            ("reqFilter", vec![long]),
            (
                "reqAttr",
                (0..500).map(|i| format!("a{i}").into_bytes()).collect(),
            ),
        ];
        fit(&mut attrs, 4096);
        let total: usize = attrs.iter().flat_map(|(_, v)| v).map(Vec::len).sum();
        assert!(total <= 4096, "{total}");
        assert_eq!(attrs[0].1, one("search"));
        assert_eq!(attrs[3].1.len(), MAX_VALUES);
        let dn = String::from_utf8(attrs[1].1[0].clone()).expect("whole characters kept");
        assert!(
            dn.starts_with("éé") && dn.ends_with("...[cut, 30000 bytes]"),
            "{dn}"
        );
        // Small records are left as they are.
        let mut small = vec![("reqDN", one("uid=a,dc=x"))];
        fit(&mut small, 4096);
        assert_eq!(small[0].1, one("uid=a,dc=x"));
    }

    #[test]
    fn one_job_waits_for_the_queue_at_a_time() {
        let q = Queue::default();
        assert_eq!(q.push(2, ("a".into(), vec![])), Some(true));
        assert_eq!(q.push(2, ("b".into(), vec![])), Some(false));
        assert_eq!(q.push(2, ("c".into(), vec![])), None);
        assert_eq!(q.take().len(), 2);
        assert_eq!(q.push(2, ("d".into(), vec![])), Some(true));
    }

    #[test]
    fn records_round_trip_and_starts_sort_in_time_order() {
        let attrs = vec![
            ("reqType", one("search")),
            ("reqAttr", vec![b"a".to_vec(), vec![0, 1]]),
        ];
        let back = decode(&encode(&attrs)).unwrap();
        assert_eq!(back[1].values, vec![b"a".to_vec(), vec![0, 1]]);
        assert!(decode(&[2]).is_none() && decode(&[1, 9, 0, 0, 0]).is_none());
        let c = LoggedChange {
            csn: "20261125170150.123456Z#00000a#003#000000".into(),
            seq: 1,
            kind: LoggedKind::ModDn,
            uuid: "u".into(),
            dn: "uid=b,ou=New,dc=x".into(),
            old_dn: Some("uid=a,ou=Old,dc=x".into()),
            mods: vec![
                pando_store::LoggedMod {
                    op: ModOp::Delete,
                    desc: "uid".into(),
                    values: vec![b"a".to_vec()],
                },
                pando_store::LoggedMod {
                    op: ModOp::Add,
                    desc: "uid".into(),
                    values: vec![b"b".to_vec()],
                },
                pando_store::LoggedMod {
                    op: ModOp::Replace,
                    desc: "modifiersName".into(),
                    values: vec![b"cn=admin".to_vec()],
                },
            ],
            by: "cn=admin".into(),
        };
        let mut times = ChangeTimes::default();
        let start = times.next(&c);
        assert_eq!(start, "20261125170150.123456000Z");
        // The next record of that microsecond gets the next nanosecond.
        assert_eq!(times.next(&c), "20261125170150.123456001Z");
        let (dn, e) = change_entry(&c, start.clone()).unwrap();
        assert_eq!(dn, "reqStart=20261125170150.123456000Z,cn=accesslog");
        let text = |a: &str| -> Vec<String> {
            e.values(a)
                .iter()
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .collect()
        };
        assert_eq!(text("reqDN"), ["uid=a,ou=Old,dc=x"]);
        assert_eq!(text("reqNewRDN"), ["uid=b"]);
        assert_eq!(text("reqDeleteOldRDN"), ["TRUE"]);
        assert_eq!(text("reqNewSuperior"), ["ou=New,dc=x"]);
        assert_eq!(text("reqMod"), ["modifiersName:= cn=admin"]);
        assert_eq!(text("reqAuthzID"), ["cn=admin"]);
        let local = local_start(1_000_000);
        assert_eq!(local.len(), start.len());
        assert!(
            local.starts_with("19700101000001.000000") && local.as_bytes()[21] >= b'5',
            "{local}"
        );
        assert!(Ops::parse(&["writes".into(), "bind".into()])
            .unwrap()
            .logs(OpKind::Bind));
        assert!(Ops::parse(&["frob".into()]).unwrap_err().contains("frob"));
    }
}
