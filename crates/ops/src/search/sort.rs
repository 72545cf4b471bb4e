//! Server-side sorting (RFC 2891) and virtual list views
//! (draft-ietf-ldapext-ldapv3-vlv-09).
//!
//! A sorted search collects every match with its sort keys — at most
//! `limits.max_sort_entries` of them, else adminLimitExceeded — sorts them,
//! then emits them in order: all of them, one page of a paged search, or a
//! VLV window. Nothing is kept between requests: each page or window is
//! sorted again on a fresh snapshot, so a cookie or VLV offset means the
//! same position as long as the data does not change, and no state is held
//! for clients that go away.
//!
//! Order: per key, a value's ordering key under the key's ordering rule
//! (`Schema::sort_order`); of several values the lowest counts (the highest
//! in reverse order); an entry without a value, or whose values the
//! requester may not read, sorts after all others (before them in reverse,
//! as slapd's sssvlv does); ties go by the next key, then by entry ID.

use std::cmp::Ordering as CmpOrdering;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use pando_model::{AttributeType, Entry, Schema, SortOrder};
use pando_proto::control_values::{self as cv, VlvResponse, VlvTarget};
use pando_proto::{oid, Control, LdapResult, ResultCode};
use pando_store::EntryId;

use super::emit::Emitter;
use super::matcher::Matcher;
use super::paging::{paged_control, Cookie};
use super::sort_cache::CacheKey;
use super::{flush, send_or_hold, Out, Page, Resume, RunLimits, SearchJob, SearchOutcome, Step};
use crate::controls::{Sort, Vlv};
use crate::error::OpResult;
use pando_access::acl;

/// One sort key, resolved against the schema.
pub(super) struct Key<'s> {
    at: &'s AttributeType,
    order: SortOrder,
    reverse: bool,
}

/// Why a sort cannot be done: the sortResult code and the attribute.
pub(super) struct Unsortable {
    pub(super) code: ResultCode,
    pub(super) attr: Option<String>,
    pub(super) message: String,
}

/// The request's keys resolved: an unknown attribute is noSuchAttribute,
/// an unknown or unusable ordering rule inappropriateMatching. A critical
/// request naming no rule for a type without an ORDERING rule (`cn`) is
/// inappropriateMatching too, as RFC 2891 and slapd have it; a
/// non-critical one is sorted as the type's EQUALITY rule compares
/// (address books send such sorts, and would otherwise get none).
/// A key that repeats an earlier one (same type, rule and direction) can
/// never change the order and is dropped.
pub(super) fn resolve<'s>(schema: &'s Schema, sort: &Sort) -> Result<Vec<Key<'s>>, Unsortable> {
    let inappropriate = |attr: &str, why: String| Unsortable {
        code: ResultCode::INAPPROPRIATE_MATCHING,
        attr: Some(attr.to_string()),
        message: format!("sort key {attr}: {why}"),
    };
    let mut keys: Vec<Key<'s>> = Vec::with_capacity(sort.keys.len());
    for k in &sort.keys {
        let Ok((_, at)) = schema.canonical_desc(&k.attr) else {
            return Err(Unsortable {
                code: ResultCode::NO_SUCH_ATTRIBUTE,
                attr: Some(k.attr.clone()),
                message: format!("sort key {}: unknown attribute type", k.attr),
            });
        };
        if sort.critical && k.ordering_rule.is_none() && !schema.has_ordering(at) {
            let why = format!("{} has no ordering rule; name one", at.name());
            return Err(inappropriate(&k.attr, why));
        }
        let order = schema
            .sort_order(at, k.ordering_rule.as_deref())
            .map_err(|why| inappropriate(&k.attr, why))?;
        let seen = keys.iter().any(|o| {
            o.at.oid == at.oid && o.order.name() == order.name() && o.reverse == k.reverse
        });
        if !seen {
            keys.push(Key {
                at,
                order,
                reverse: k.reverse,
            });
        }
    }
    Ok(keys)
}

/// The attribute types the keys read (decoded for every match).
pub(super) fn key_types<'s>(keys: &[Key<'s>]) -> Vec<&'s AttributeType> {
    keys.iter().map(|k| k.at).collect()
}

/// The sort response control.
pub(super) fn response(code: ResultCode, attr: Option<&str>) -> Control {
    Control {
        oid: oid::SORT_RESPONSE.to_string(),
        critical: false,
        value: Some(cv::encode_sort_response(code.0, attr)),
    }
}

/// A match's keys, one per sort key (None: no readable value).
type Row = (Vec<Option<Vec<u8>>>, EntryId);

fn row_keys(
    schema: &Schema,
    keys: &[Key<'_>],
    entry: &Entry,
    may_read: &mut dyn FnMut(&AttributeType) -> bool,
) -> Vec<Option<Vec<u8>>> {
    keys.iter()
        .map(|k| {
            // Read access is per stored type: a key on a supertype (name)
            // must not order by a subtype the requester may not read (sn).
            let values = entry
                .attrs
                .iter()
                .filter(|a| {
                    let base = pando_model::desc::base(&a.desc);
                    schema
                        .attribute(base)
                        .is_some_and(|t| schema.is_subtype(t, k.at) && may_read(t))
                })
                .flat_map(|a| a.values.iter())
                .filter_map(|v| schema.sort_key(k.order, v));
            if k.reverse {
                values.max()
            } else {
                values.min()
            }
        })
        .collect()
}

fn compare(keys: &[Key<'_>], a: &Row, b: &Row) -> CmpOrdering {
    for (i, k) in keys.iter().enumerate() {
        // Absent sorts after every value: None is the largest.
        let o = match (&a.0[i], &b.0[i]) {
            (None, None) => CmpOrdering::Equal,
            (None, Some(_)) => CmpOrdering::Greater,
            (Some(_), None) => CmpOrdering::Less,
            (Some(x), Some(y)) => x.cmp(y),
        };
        let o = if k.reverse { o.reverse() } else { o };
        if o != CmpOrdering::Equal {
            return o;
        }
    }
    a.1.cmp(&b.1)
}

/// What part of the sorted list goes out.
struct Window {
    /// Index of the first entry sent, and how many at most.
    start: usize,
    len: usize,
    /// The VLV response control, for a VLV request.
    vlv: Option<Control>,
}

/// The VLV window for `req` over `rows` sorted entries (positions are
/// 1-based). By offset: the client's offset scaled by the server's count
/// over the client's estimate when it gives one; 0 means the last entry
/// and beyond the count is offsetRangeError (as slapd). By value: the
/// first entry whose first key is at or after the value (count + 1 when
/// none is).
fn vlv_window(
    ids: &[EntryId],
    vlv: &Vlv,
    reverse: bool,
    want: Option<Vec<u8>>,
    first_key: &mut dyn FnMut(EntryId) -> OpResult<Option<Vec<u8>>>,
) -> OpResult<Result<Window, (ResultCode, Control)>> {
    let count = ids.len() as u64;
    let req = &vlv.req;
    let target: u64 = match &req.target {
        VlvTarget::ByOffset {
            offset,
            content_count,
        } => {
            let (offset, client) = (*offset as u64, *content_count as u64);
            let t = match (offset, client) {
                (0, _) => count,
                (o, 0) => o,
                (o, c) => (o * count) / c,
            };
            if t > count && !(count == 0 && offset <= 1) {
                let resp = vlv_response(0, count, ResultCode::OFFSET_RANGE_ERROR, req);
                return Ok(Err((ResultCode::VIRTUAL_LIST_VIEW_ERROR, resp)));
            }
            t.max(1).min(count.max(1))
        }
        VlvTarget::GreaterOrEqual(_) => {
            // Binary search, each probe reading the first key of one entry:
            // a few dozen reads, whether the list is fresh or cached.
            let (mut lo, mut hi) = (0usize, ids.len());
            while lo < hi {
                let mid = lo + (hi - lo) / 2;
                let key = first_key(ids[mid])?;
                // Absent sorts last (first in reverse), as in `compare`.
                let o = match (&key, &want) {
                    (None, _) => CmpOrdering::Greater,
                    (Some(_), None) => CmpOrdering::Less,
                    (Some(x), Some(y)) => x.cmp(y),
                };
                let o = if reverse { o.reverse() } else { o };
                if o == CmpOrdering::Less {
                    lo = mid + 1;
                } else {
                    hi = mid;
                }
            }
            lo as u64 + 1
        }
    };
    let before = req.before as u64;
    let after = req.after as u64;
    let first = target.saturating_sub(before).max(1);
    let last = target.saturating_add(after).min(count);
    let len = if last >= first { last - first + 1 } else { 0 };
    Ok(Ok(Window {
        start: (first - 1) as usize,
        len: len as usize,
        vlv: Some(vlv_response(target, count, ResultCode::SUCCESS, req)),
    }))
}

fn vlv_response(target: u64, count: u64, code: ResultCode, req: &cv::VlvRequest) -> Control {
    let clamp = |v: u64| v.min(i32::MAX as u64) as i32;
    Control {
        oid: oid::VLV_RESPONSE.to_string(),
        critical: false,
        value: Some(
            VlvResponse {
                target_position: clamp(target),
                content_count: clamp(count),
                result: code.0,
                context_id: req.context_id.clone(),
            }
            .encode(),
        ),
    }
}

/// What one sorted search may hold while it collects (0 = no limit).
#[derive(Clone, Copy)]
pub(super) struct Bounds {
    /// Matches (`limits.max_sort_entries`).
    pub(super) entries: u64,
    /// Bytes of rows: keys with their bookkeeping (`limits.max_sort_memory_mb`).
    pub(super) bytes: u64,
}

impl Bounds {
    pub(super) fn of(limits: &pando_config::Limits) -> Bounds {
        Bounds {
            entries: limits.max_sort_entries,
            bytes: limits.max_sort_memory_mb.saturating_mul(1 << 20),
        }
    }
}

/// What a row holds in memory, as counted against [`Bounds::bytes`].
fn row_bytes(row: &Row) -> u64 {
    let slots = std::mem::size_of::<Row>() + row.0.len() * std::mem::size_of::<Option<Vec<u8>>>();
    let keys: usize = row.0.iter().flatten().map(Vec::len).sum();
    (slots + keys) as u64
}

/// The sorted search itself (see the module header). `bounds`: what it may
/// hold while collecting; `generation`: the store content generation
/// the snapshot holds, when known (the sorted list is then cached).
#[allow(clippy::too_many_arguments)]
pub(super) fn run(
    job: &SearchJob,
    out: &mut Out<'_>,
    mut matcher: Matcher<'_, '_>,
    emitter: &Emitter<'_>,
    keys: &[Key<'_>],
    page: Page,
    limits: RunLimits,
    bounds: Bounds,
    resume: Option<Resume>,
    generation: Option<u64>,
) -> OpResult<Step> {
    let sorted_ok = response(ResultCode::SUCCESS, None);
    let done =
        |code, message: &str, entries, controls| finished(job, code, message, entries, controls);
    let ids = match sorted_ids(job, &mut matcher, keys, &limits, bounds, generation)? {
        Ok(ids) => ids,
        Err(step) => return Ok(step),
    };
    let window = match choose_window(job, &mut matcher, keys, &ids, &page)? {
        Ok(w) => w,
        Err((code, resp)) => {
            let message = "the target offset is beyond the list";
            return Ok(done(code, message, 0, vec![sorted_ok, resp]));
        }
    };
    let mut controls = vec![sorted_ok];
    controls.extend(window.vlv);

    // Emit. A resumed run skips what earlier runs sent.
    let mut sent_now = resume.map_or(0, |r| r.sent);
    let end = window.start.saturating_add(window.len).min(ids.len());
    let mut buf = Vec::new();
    let mut pos = window.start.saturating_add(sent_now as usize);
    while pos < end {
        let id = ids[pos];
        pos += 1;
        if job.abandoned.load(Ordering::Relaxed) {
            return Ok(Step::Done(None));
        }
        if limits.timed_out() {
            flush(out, &mut buf)?;
            let message = "time limit exceeded";
            return Ok(done(
                ResultCode::TIME_LIMIT_EXCEEDED,
                message,
                sent_now,
                controls,
            ));
        }
        if limits.full(page.sent_before + sent_now) {
            flush(out, &mut buf)?;
            return Ok(done(
                ResultCode::SIZE_LIMIT_EXCEEDED,
                "size limit exceeded",
                sent_now,
                controls,
            ));
        }
        let Some(hit) = matcher.test(id)? else {
            continue;
        };
        matcher.emit(emitter, &hit, &mut buf)?;
        sent_now += 1;
        if buf.len() >= super::CHUNK {
            if let Some(chunk) = send_or_hold(out, &mut buf)? {
                let resume = Resume {
                    after: 0,
                    sent: sent_now,
                    started: limits.started,
                };
                return Ok(Step::Paused { chunk, resume });
            }
        }
    }
    flush(out, &mut buf)?;
    if job.controls.vlv.is_none() && page.size.is_some() && end < ids.len() {
        // More pages: the cookie holds the next position.
        let cookie = Cookie {
            last: end as u64,
            sent: page.sent_before + sent_now,
            hash: page.hash,
        }
        .encode();
        controls.push(paged_control(0, cookie));
    }
    Ok(done(ResultCode::SUCCESS, "", sent_now, controls))
}

/// A sorted search's end: `code` and `message`, with `controls` (and an
/// empty paged-results control when the request was paged and none is
/// there yet).
fn finished(
    job: &SearchJob,
    code: ResultCode,
    message: &str,
    entries: u64,
    mut controls: Vec<Control>,
) -> Step {
    if job.controls.paged.is_some() && !controls.iter().any(|c| c.oid == oid::PAGED_RESULTS) {
        controls.push(paged_control(0, Vec::new()));
    }
    Step::Done(Some(SearchOutcome {
        result: LdapResult::new(code, message),
        controls,
        entries,
    }))
}

/// The sorted list of matching IDs: reused while the store and the
/// request are the same (a client scrolling a VLV), else collected and
/// sorted now. `Err`: how the search ends instead (abandoned, or the
/// sort stopped by a limit).
fn sorted_ids(
    job: &SearchJob,
    matcher: &mut Matcher<'_, '_>,
    keys: &[Key<'_>],
    limits: &RunLimits,
    bounds: Bounds,
    generation: Option<u64>,
) -> OpResult<Result<Arc<Vec<EntryId>>, Step>> {
    let cache_key = generation.map(|g| CacheKey {
        generation: g,
        subentries: job.controls.subentries,
        request: super::paging::request_hash(&job.req)
            ^ job
                .controls
                .sort
                .as_ref()
                .map_or(0, |s| super::paging::keys_hash(&s.keys)),
        who: format!("{:?}", job.who),
    });
    let cache = &job.server.sorted;
    if let Some(ids) = cache_key.as_ref().and_then(|k| cache.get(k)) {
        return Ok(Ok(ids));
    }
    let rows = match collect(job, matcher, keys, limits, bounds)? {
        Ok(rows) => rows,
        // Abandoned: nothing more is said.
        Err((ResultCode::CANCELED, _)) => return Ok(Err(Step::Done(None))),
        Err((code, message)) => {
            let resp = response(code, None);
            return Ok(Err(finished(job, code, &message, 0, vec![resp])));
        }
    };
    let ids: Arc<Vec<EntryId>> = Arc::new(rows.into_iter().map(|r| r.1).collect());
    if let Some(k) = cache_key {
        cache.put(k, ids.clone());
    }
    Ok(Ok(ids))
}

/// Which part of the sorted list goes out: the virtual list view's
/// window, or the page. `Err`: the VLV target is beyond the list (the
/// result code and the VLV response control).
fn choose_window(
    job: &SearchJob,
    matcher: &mut Matcher<'_, '_>,
    keys: &[Key<'_>],
    ids: &[EntryId],
    page: &Page,
) -> OpResult<Result<Window, (ResultCode, Control)>> {
    let Some(vlv) = &job.controls.vlv else {
        return Ok(Ok(Window {
            start: page.after.unwrap_or(0) as usize,
            len: page.size.map_or(usize::MAX, |s| s as usize),
            vlv: None,
        }));
    };
    let schema = matcher.schema;
    let first = &keys[0];
    let want = match &vlv.req.target {
        VlvTarget::GreaterOrEqual(v) => schema.sort_key(first.order, v),
        VlvTarget::ByOffset { .. } => None,
    };
    let mut first_key = |id: EntryId| -> OpResult<Option<Vec<u8>>> {
        let Some(hit) = matcher.test(id)? else {
            return Ok(None);
        };
        let mut may_read = |at: &AttributeType| matcher.may_read(&hit.norm, at);
        Ok(row_keys(schema, &keys[..1], &hit.entry, &mut may_read).remove(0))
    };
    vlv_window(ids, vlv, first.reverse, want, &mut first_key)
}

/// Every match with its sort keys, sorted; or why the sort stopped
/// (time limit, `limits.max_sort_entries`, `limits.max_sort_memory_mb`).
fn collect(
    job: &SearchJob,
    matcher: &mut Matcher<'_, '_>,
    keys: &[Key<'_>],
    limits: &RunLimits,
    bounds: Bounds,
) -> OpResult<Result<Vec<Row>, (ResultCode, String)>> {
    let schema = matcher.schema;
    let max = bounds.entries;
    let mut rows: Vec<Row> = Vec::new();
    let mut held: u64 = 0;
    for id in matcher.plan.ids.iter() {
        if job.abandoned.load(Ordering::Relaxed) {
            return Ok(Err((ResultCode::CANCELED, "abandoned".into())));
        }
        if limits.timed_out() {
            return Ok(Err((
                ResultCode::TIME_LIMIT_EXCEEDED,
                "time limit exceeded".into(),
            )));
        }
        let Some(hit) = matcher.test(id)? else {
            continue;
        };
        if max > 0 && rows.len() as u64 >= max {
            let message = format!(
                "more than {max} entries to sort (limits.max_sort_entries); narrow the search"
            );
            return Ok(Err((ResultCode::ADMIN_LIMIT_EXCEEDED, message)));
        }
        let mut may_read = |at: &AttributeType| matcher.may_read(&hit.norm, at);
        let row = (row_keys(schema, keys, &hit.entry, &mut may_read), hit.id);
        held = held.saturating_add(row_bytes(&row));
        if bounds.bytes > 0 && held > bounds.bytes {
            let message = format!(
                "the sort keys of this search take more than {} MiB (limits.max_sort_memory_mb); narrow the search or sort by fewer or shorter keys",
                bounds.bytes >> 20
            );
            return Ok(Err((ResultCode::ADMIN_LIMIT_EXCEEDED, message)));
        }
        rows.push(row);
    }
    rows.sort_unstable_by(|a, b| compare(keys, a, b));
    Ok(Ok(rows))
}

impl Matcher<'_, '_> {
    /// May the requester read `at` on the entry just tested (`norm`)?
    pub(super) fn may_read(&mut self, norm: &str, at: &AttributeType) -> bool {
        self.access.unrestricted()
            || self
                .access
                .allows(Some(self.view), &self.rules, norm, Some(at), acl::READ)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sort(critical: bool, keys: &[(&str, Option<&str>, bool)]) -> Sort {
        Sort {
            keys: keys
                .iter()
                .map(|(a, r, rev)| cv::SortKey {
                    attr: a.to_string(),
                    ordering_rule: r.map(str::to_string),
                    reverse: *rev,
                })
                .collect(),
            critical,
            too_many: false,
        }
    }

    #[test]
    fn repeated_keys_are_dropped() {
        let schema = Schema::standard();
        let rule = Some("caseIgnoreOrderingMatch");
        let s = sort(
            true,
            &[
                ("uid", rule, false),
                ("UID", rule, false),
                ("0.9.2342.19200300.100.1.1", rule, false),
                ("uid", rule, true),
                ("uid", rule, false),
            ],
        );
        let keys = resolve(&schema, &s).unwrap_or_else(|u| panic!("{}", u.message));
        // The reverse key stays: it reads the highest value, not the lowest.
        let kept: Vec<bool> = keys.iter().map(|k| k.reverse).collect();
        assert_eq!(kept, [false, true]);
    }

    #[test]
    fn critical_sorts_need_an_ordering_rule() {
        let schema = Schema::standard();
        let Err(u) = resolve(&schema, &sort(true, &[("cn", None, false)])) else {
            panic!("a critical sort by cn without a rule resolved");
        };
        assert_eq!(u.code, ResultCode::INAPPROPRIATE_MATCHING);
        assert_eq!(u.attr.as_deref(), Some("cn"));
        // Named, or not critical: sorted.
        let named = sort(true, &[("cn", Some("caseIgnoreOrderingMatch"), false)]);
        assert!(resolve(&schema, &named).is_ok());
        assert!(resolve(&schema, &sort(false, &[("cn", None, false)])).is_ok());
        // A type with an ORDERING rule of its own needs none named.
        assert!(resolve(&schema, &sort(true, &[("createTimestamp", None, false)])).is_ok());
    }

    #[test]
    fn rows_are_counted_with_their_bookkeeping() {
        let row: Row = (vec![Some(vec![0; 100]), None], 1);
        assert!(row_bytes(&row) >= 100 + 2 * 24);
    }
}
