//! The stack's outermost layer: every request is observed, whatever
//! happens to it below. Counted and timed from its arrival (before
//! Abandon and Unbind are handled, before admission), its line in the
//! access log and its record in the in-directory access log (cn=accesslog)
//! begun there; all three completed by [`Observed::finish`] when its
//! answer is queued (or none is sent), which the network calls since only
//! it knows when that is.
//!
//! Must not name the network or the overlays (the in-directory log is the
//! state's `layers.op_log`).

use std::time::Instant;

use pando_access::Identity;
use pando_observe::access_log::{self, OpResultLine, Request};
use pando_observe::metrics::OpKind;
use pando_observe::{kind_of, OpCtx};
use pando_proto::LdapMessage;

use crate::state::Server;

/// A request on its way: what it was and when it arrived.
pub struct Observed {
    pub kind: OpKind,
    pub conn: u64,
    pub op: u64,
    pub msgid: i32,
    received: Instant,
    /// When it started running (after waiting for its turn).
    started: Option<Instant>,
    /// Described only when the access log is on.
    request: Option<Request>,
    /// The in-directory access log's record, when it logs this operation.
    logged: Option<crate::seams::Begun>,
}

impl Observed {
    /// Count a decoded request made by `who`, and begin its lines in the
    /// access logs; None for PDUs that are not requests.
    pub fn new(
        server: &Server,
        conn: u64,
        op: u64,
        msg: &LdapMessage,
        who: &Identity,
    ) -> Option<Observed> {
        let kind = kind_of(&msg.op)?;
        server.rt.metrics.op_initiated(kind);
        let logged = server
            .layers
            .op_log
            .as_ref()
            .and_then(|l| l.begin(conn, who, &msg.op, &server.schema));
        Some(Observed {
            kind,
            conn,
            op,
            msgid: msg.id,
            received: Instant::now(),
            started: None,
            request: server
                .logs
                .access
                .as_ref()
                .map(|_| Request::of(&server.schema, &msg.op)),
            logged,
        })
    }

    /// The operation begins running now; the time before is queue time.
    pub fn started(&mut self) {
        self.started = Some(Instant::now());
    }

    pub fn ctx(&self) -> OpCtx {
        OpCtx {
            conn: self.conn,
            op: self.op,
        }
    }

    /// The response has been queued (`code`), or there is none (None:
    /// abandon, unbind, an abandoned read). `entries`: search results sent.
    pub fn finish(self, server: &Server, code: Option<u32>, entries: u64) {
        let now = Instant::now();
        let etime = now.duration_since(self.received).as_micros() as u64;
        let qtime = self
            .started
            .map(|s| s.duration_since(self.received).as_micros() as u64)
            .unwrap_or(0);
        let m = &server.rt.metrics;
        m.op_completed(self.kind, etime, qtime, entries);
        if code.is_some() {
            m.add(&m.pdus_out, 1 + entries);
        }
        if let (Some(log), Some(p)) = (&server.layers.op_log, self.logged) {
            log.end(server, p, code, entries);
        }
        let line = |request| OpResultLine {
            time_micros: pando_store::clock::now_micros(),
            conn: self.conn,
            op: self.op,
            msgid: self.msgid,
            request,
            code,
            nentries: entries,
            etime_us: etime,
            qtime_us: qtime,
        };
        if let (Some(a), Some(r)) = (&server.logs.access, &self.request) {
            a.op(&line(r));
        }
        // Among the slowest of its second: listed on the dashboard with its
        // access log line (the request's tag alone when that log is off).
        if m.seconds.wants(etime) {
            let bare;
            let r = match &self.request {
                Some(r) => r,
                None => {
                    bare = Request {
                        tag: access_log::tag_of(self.kind),
                        fields: Vec::new(),
                    };
                    &bare
                }
            };
            let text = access_log::op_line(access_log::Format::Text, &line(r));
            m.seconds
                .keep(self.kind, etime, text.trim_end().to_string());
        }
    }
}
