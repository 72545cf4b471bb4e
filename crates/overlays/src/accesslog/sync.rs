//! Content synchronization of cn=accesslog: the provider's side of
//! OpenLDAP's delta-syncrepl (`syncdata=accesslog`), as a slapd consumer
//! drives it. The log holds the change log's records in OpenLDAP's
//! accesslog schema (`accesslog`); this serves them the way
//! OpenLDAP's syncprov serves its log database (`syncprov-nopresent`,
//! `syncprov-reloadhint`):
//!
//! - a consumer's cookie is checked as on the data (53 for a cookie newer
//!   than this server for its own ID, or with CSNs when this server has
//!   none); when the change log no longer covers it (its floor is newer
//!   than the cookie's CSN of a server whose changes the consumer lacks),
//!   e-syncRefreshRequired (4096): the consumer then refreshes the data
//!   whole and comes back — never a present phase, which a consumer would
//!   apply to its data;
//! - the refresh sends every record newer than the cookie (per server ID)
//!   as `add`, in CSN order, then ends with this server's state;
//! - persist mode sends each committed operation's records as it commits.
//!
//! A record carries a cookie naming its CSN alone, as syncprov sends it.
//! The records of one operation (a tree delete, a rename with its
//! children, a write with the referential-integrity or memberOf changes it
//! caused) share one CSN, and a slapd consumer drops a record whose CSN is
//! not newer than its state: so only the last record of an operation
//! carries the cookie, and the consumer's state moves once all of them
//! are applied.

use std::sync::Arc;

use pando_proto::sync::{
    csn_sid, Cookie, SyncDone, SyncInfo, SyncMode, SyncRequest, SyncStateKind,
};
use pando_proto::{oid, LdapResult, ResultCode, Scope};

use crate::accesslog::{self, SyncRecord};
use pando_ops::error::{LdapError, OpResult};
use pando_ops::search::emit::Emitter;
use pando_ops::search::limits::{smaller_limit, Limits};
use pando_ops::search::persistent::{deliver, done, start_following, Started};
use pando_ops::search::sync_provider::{control, info_message, state_control, Sink};
use pando_ops::search::{emitter_for, Finished, SearchJob, SearchOutcome, CHUNK};

/// Run a synchronization search of cn=accesslog (its base) until it ends.
/// `log`: the access log, None when the overlay is not configured.
pub async fn run(
    job: &Arc<SearchJob>,
    req: SyncRequest,
    theirs: Cookie,
    log: Option<Arc<accesslog::AccessLog>>,
) -> Finished {
    let log = match check(job, log) {
        Ok(log) => log,
        Err(e) => return done(e.into_result(), 0),
    };
    let persist = req.mode == SyncMode::RefreshAndPersist;
    let Started {
        place: _place,
        mut follower,
        thread: slot,
    } = match start_following(job, persist).await {
        Ok(started) => started,
        Err(end) => return end,
    };
    let (j, l) = (job.clone(), log.clone());
    let ran = tokio::task::spawn_blocking(move || {
        let out = refresh(&j, &l, &theirs);
        drop(slot);
        out
    })
    .await;
    let (sent, cookie) = match ran {
        Ok(Ok(Some(r))) => r,
        Ok(Ok(None)) => return Finished::Abandoned,
        Ok(Err(e)) => return done(e.into_result(), 0),
        Err(_) => return Finished::Failed,
    };
    let text = Some(cookie.format().into_bytes());
    let Some(follower) = follower.as_mut() else {
        let value = SyncDone {
            cookie: text,
            refresh_deletes: true,
        };
        return Finished::Done(SearchOutcome {
            result: LdapResult::success(),
            controls: vec![control(oid::SYNC_DONE, value.encode())],
            entries: sent,
        });
    };
    let mut buf = Vec::new();
    let info = SyncInfo::RefreshDelete {
        cookie: text,
        done: true,
    };
    info_message(job.msg_id, &info, &mut buf);
    if !deliver(job, buf).await {
        return Finished::Abandoned;
    }
    let origin = req
        .cookie
        .as_deref()
        .and_then(|c| Cookie::parse(c).ok())
        .and_then(|c| c.sid);
    let mut sent = sent;
    loop {
        let committed = match follower.next(job, sent).await {
            Ok(c) => c,
            Err(end) => return end,
        };
        // Only a cookie moved (a consumer's), or nothing was logged.
        if committed.csn.is_empty() {
            continue;
        }
        let (chunks, n) = match persist_operation(job, &log, &cookie, &committed.csn, origin) {
            Ok(out) => out,
            Err(e) => return done(e.into_result(), sent),
        };
        for chunk in chunks {
            if !deliver(job, chunk).await {
                return Finished::Abandoned;
            }
        }
        sent += n;
    }
}

/// What makes a synchronization of the log impossible: no log, a
/// requester who may not read it, a base other than the log's root.
fn check(
    job: &SearchJob,
    log: Option<Arc<accesslog::AccessLog>>,
) -> OpResult<Arc<accesslog::AccessLog>> {
    let server = &job.server;
    let c = &job.controls;
    let no_such = || LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object");
    let log = log.ok_or_else(no_such)?;
    if !accesslog::may_read(server, &job.who) {
        return Err(no_such());
    }
    if c.paged.is_some() || c.sort.is_some() || c.vlv.is_some() || c.persistent.is_some() {
        return Err(LdapError::new(
            ResultCode::UNWILLING_TO_PERFORM,
            "a content synchronization of cn=accesslog cannot be combined with paged results, sorting, a virtual list view or a persistent search",
        ));
    }
    let base = pando_model::Dn::parse(&job.req.base).ok();
    let norm = base.and_then(|b| server.schema.normalize_dn(&b).ok());
    if norm.as_deref() != Some(accesslog::SUFFIX) || job.req.scope == Scope::Base {
        return Err(LdapError::new(
            ResultCode::UNWILLING_TO_PERFORM,
            "a content synchronization of the access log searches its records: base cn=accesslog, scope one or sub",
        ));
    }
    Ok(log)
}

/// The refresh on a blocking thread: the records the cookie lacks, then
/// this server's state (None: abandoned).
fn refresh(
    job: &SearchJob,
    log: &accesslog::AccessLog,
    theirs: &Cookie,
) -> OpResult<Option<(u64, Cookie)>> {
    let server = &job.server;
    let own_sid = server.cfg.config.replication.server_id;
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    let ours = view.context_csns()?;
    let floor = view.changelog_floor()?;
    let from = first_needed(theirs, &ours, own_sid, &floor)?;
    let cookie = Cookie {
        rid: theirs.rid,
        sid: (own_sid != 0).then_some(own_sid),
        csns: ours,
        delcsn: None,
    };
    let Some(from) = from else {
        return Ok(Some((0, cookie)));
    };
    let limits = Limits::for_requester(server, &job.who, &view);
    let size = smaller_limit(limits.size, job.req.size_limit.max(0) as u32);
    let mut sender = Sender::new(job, cookie.rid, own_sid);
    let mut sink = Sink {
        job,
        buf: Vec::new(),
    };
    for record in accesslog::sync_records_after(&view, log, &from)? {
        let record = record?;
        if !is_newer(theirs, &record.csn) {
            continue;
        }
        sender.push(record, &mut sink.buf)?;
        if size != 0 && sender.sent > u64::from(size) {
            return Err(LdapError::new(
                ResultCode::SIZE_LIMIT_EXCEEDED,
                "size limit exceeded (the replication identity needs size_limit = 0)",
            ));
        }
        if !sink.flush(false) {
            return Ok(None);
        }
    }
    sender.finish(&mut sink.buf)?;
    if !sink.flush(true) {
        return Ok(None);
    }
    Ok(Some((sender.sent, cookie)))
}

/// The consumer's cookie against this server's state (`ours`, one CSN per
/// server ID) and the change log's floor: the CSN after which records are
/// needed (None: nothing is), or the refusal.
fn first_needed(
    theirs: &Cookie,
    ours: &[String],
    own_sid: u16,
    floor: &str,
) -> OpResult<Option<String>> {
    let newer = || {
        LdapError::new(
            ResultCode::UNWILLING_TO_PERFORM,
            "consumer state is newer than provider (its cookie holds changes this server does not have)",
        )
    };
    if let Some(t) = theirs.csn_for(own_sid) {
        if !ours
            .iter()
            .any(|o| csn_sid(o) == Some(own_sid) && t <= o.as_str())
        {
            return Err(newer());
        }
    }
    if !theirs.csns.is_empty() && ours.is_empty() {
        return Err(newer());
    }
    // For each server whose changes the consumer lacks, what it holds.
    let mut lagging = Vec::new();
    for o in ours {
        let held = csn_sid(o).and_then(|sid| theirs.csn_for(sid));
        match held {
            Some(t) if t >= o.as_str() => {}
            Some(t) => lagging.push(t),
            None => lagging.push(""),
        }
    }
    let Some(oldest) = lagging.iter().min() else {
        return Ok(None);
    };
    if !floor.is_empty() && *oldest < floor {
        return Err(LdapError::new(
            ResultCode::SYNC_REFRESH_REQUIRED,
            format!(
                "sync cookie is stale: the change log begins after {} (it keeps replication.changelog_days and changelog_max_changes); refresh the data, then follow the log",
                if oldest.is_empty() { "the start" } else { oldest }
            ),
        ));
    }
    Ok(Some(oldest.to_string()))
}

/// Whether a record stamped `csn` is newer than what the cookie holds for
/// its server.
fn is_newer(theirs: &Cookie, csn: &str) -> bool {
    csn_sid(csn)
        .and_then(|sid| theirs.csn_for(sid))
        .is_none_or(|t| csn > t)
}

/// Encodes records for one consumer, holding back the last one until the
/// next shows whether it ends its operation (then it carries the cookie).
struct Sender<'j> {
    emitter: Emitter<'j>,
    filter: pando_model::CompiledFilter,
    job: &'j SearchJob,
    rid: Option<u16>,
    own_sid: u16,
    held: Option<SyncRecord>,
    sent: u64,
}

impl<'j> Sender<'j> {
    fn new(job: &'j SearchJob, rid: Option<u16>, own_sid: u16) -> Sender<'j> {
        Sender {
            emitter: emitter_for(job),
            filter: job.server.schema.compile_filter(&job.req.filter),
            job,
            rid,
            own_sid,
            held: None,
            sent: 0,
        }
    }

    /// Queue `record` if the search's filter takes it.
    fn push(&mut self, record: SyncRecord, buf: &mut Vec<u8>) -> OpResult<()> {
        let schema = &self.job.server.schema;
        if self.filter.matches(schema, &record.entry) != pando_model::Ternary::True {
            return Ok(());
        }
        if let Some(prev) = self.held.take() {
            let last = prev.csn != record.csn;
            self.send(prev, last, buf)?;
        }
        self.held = Some(record);
        Ok(())
    }

    /// Send what is held, as the last of its operation.
    fn finish(&mut self, buf: &mut Vec<u8>) -> OpResult<()> {
        match self.held.take() {
            Some(r) => self.send(r, true, buf),
            None => Ok(()),
        }
    }

    fn send(&mut self, r: SyncRecord, last: bool, buf: &mut Vec<u8>) -> OpResult<()> {
        let cookie = last.then(|| Cookie {
            rid: self.rid,
            sid: (self.own_sid != 0).then_some(self.own_sid),
            csns: vec![r.csn.clone()],
            delcsn: None,
        });
        let ctl = [state_control(SyncStateKind::Add, r.uuid, cookie.as_ref())];
        self.emitter
            .emit(None, None, &r.dn, &r.entry, None, &ctl, buf)?;
        self.sent += 1;
        Ok(())
    }
}

/// The messages one committed operation (stamped `csn`) gives the
/// consumer: its records, or a new cookie when none is for it. Changes
/// made by the consumer's own server (`origin`) are not sent back.
fn persist_operation(
    job: &SearchJob,
    log: &accesslog::AccessLog,
    cookie: &Cookie,
    csn: &str,
    origin: Option<u16>,
) -> OpResult<(Vec<Vec<u8>>, u64)> {
    if origin.is_some() && csn_sid(csn) == origin {
        return Ok((Vec::new(), 0));
    }
    let server = &job.server;
    let records = {
        let rtxn = server.rt.store.read()?;
        accesslog::sync_records_at(&rtxn.view(), log, csn)?
    };
    let own_sid = server.cfg.config.replication.server_id;
    let mut sender = Sender::new(job, cookie.rid, own_sid);
    let (mut chunks, mut buf) = (Vec::new(), Vec::new());
    for r in records {
        sender.push(r, &mut buf)?;
        if buf.len() >= CHUNK {
            chunks.push(std::mem::take(&mut buf));
        }
    }
    sender.finish(&mut buf)?;
    if sender.sent == 0 {
        let moved = Cookie {
            csns: vec![csn.to_string()],
            delcsn: None,
            ..cookie.clone()
        };
        let info = SyncInfo::NewCookie(moved.format().into_bytes());
        info_message(job.msg_id, &info, &mut buf);
    }
    if !buf.is_empty() {
        chunks.push(buf);
    }
    Ok((chunks, sender.sent))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cookie(csns: &[&str]) -> Cookie {
        Cookie {
            csns: csns.iter().map(|c| c.to_string()).collect(),
            ..Cookie::default()
        }
    }

    const A1: &str = "20261127000001.000000Z#000000#001#000000";
    const A2: &str = "20261127000002.000000Z#000000#001#000000";
    const B1: &str = "20261127000001.500000Z#000000#002#000000";
    const B2: &str = "20261127000003.000000Z#000000#002#000000";

    fn needed(theirs: &[&str], ours: &[&str], floor: &str) -> Result<Option<String>, u32> {
        let ours: Vec<String> = ours.iter().map(|c| c.to_string()).collect();
        first_needed(&cookie(theirs), &ours, 1, floor).map_err(|e| e.into_result().code.0)
    }

    #[test]
    fn the_log_is_read_from_the_oldest_lagging_server_or_refused() {
        // Up to date: nothing.
        assert_eq!(needed(&[A2, B2], &[A2, B2], ""), Ok(None));
        // Behind for server 2 only: from its CSN, even if server 1's is older.
        assert_eq!(needed(&[A1, B1], &[A1, B2], ""), Ok(Some(B1.into())));
        assert_eq!(needed(&[A1, B1], &[A2, B2], ""), Ok(Some(A1.into())));
        // A server the cookie does not know: from the start, if logged.
        assert_eq!(needed(&[A2], &[A2, B2], ""), Ok(Some(String::new())));
        assert_eq!(needed(&[A2], &[A2, B2], A1), Err(4096));
        // The floor is past what the consumer holds of a lagging server.
        assert_eq!(needed(&[A1, B2], &[A2, B2], B1), Err(4096));
        // ... but not of one it is up to date with.
        assert_eq!(needed(&[A2, B1], &[A2, B1], B2), Ok(None));
        // No cookie: the whole log, if it covers everything.
        assert_eq!(needed(&[], &[A2], ""), Ok(Some(String::new())));
        assert_eq!(needed(&[], &[A2], A1), Err(4096));
        // 53: newer than this server for its own ID, or state here is none.
        assert_eq!(needed(&[A2], &[A1], ""), Err(53));
        assert_eq!(needed(&[B1], &[], ""), Err(53));
    }
}
