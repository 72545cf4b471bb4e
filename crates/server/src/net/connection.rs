//! One client connection.
//!
//! One task reads, frames and decodes PDUs and drives the socket (see
//! [`super::wire`]). Binds and small searches — what directories mostly
//! serve — are answered on that task, their responses encoded straight into
//! the outgoing buffer: one read, one write, no task handoff. Everything
//! else (writes, larger searches, compares, extended operations) runs as
//! its own task, bounded per connection, and hands its responses back over
//! a channel; so a client may pipeline many operations. Responses carry
//! their request's message ID, so they may interleave in any order.
//!
//! Before a bind, the outstanding operations are abandoned and waited for
//! (RFC 4511 4.2.1), so every operation runs with the identity that was
//! current when it arrived.
//!
//! StartTLS (RFC 4511 4.14, RFC 4513 3) is accepted only with nothing
//! outstanding; then the loop ends, the response is written, the TLS
//! handshake runs on the same socket, and LDAP continues over TLS with a new
//! session (the bound identity keeps its DN).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pando_proto::{
    frame_length, notice_of_disconnection, oid, Control, ExtendedRequest, ExtendedResponse,
    LdapMessage, LdapResult, ProtocolOp, ResultCode,
};
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::sync::{mpsc, oneshot, watch, Semaphore};

use super::refusals::Pace;
use super::running::{FinishOnDrop, Outstanding, Running};
use super::wire::{Event, Wire, OUTPUT_HIGH, WRITE_STALL};

use crate::error::LdapError;
use crate::observe;
use crate::ops;
use crate::ops::operation::{is_update, Operation};
use crate::ops::stack::observed::Observed;
use crate::ops::stack::{self, Admitted};
use crate::state::Server;
use pando_access::{Identity, Session};

/// Messages from operations on other tasks queued for the connection.
const RESPONSE_QUEUE: usize = 16;

/// Input buffer capacity kept between requests; more is given back.
const INPUT_KEEP: usize = 64 * 1024;

pub struct Connection {
    /// The configuration when the connection was accepted: settings that
    /// hold for the whole connection (limits per connection, timeouts).
    pub server: Arc<Server>,
    /// The current configuration, taken by each operation when it starts.
    pub live: Arc<dyn crate::net::frontend::Serving>,
    pub id: u64,
    pub peer: String,
    /// Transport facts; replaced when StartTLS completes.
    pub session: Arc<Session>,
    pub shutdown: watch::Receiver<bool>,
}

/// How serving one stream ended.
enum Served<S> {
    Closed(&'static str),
    /// StartTLS accepted and its response written: the whole stream, for
    /// the handshake.
    StartTls(S),
}

/// How a read loop ended.
enum Ended {
    Close(&'static str),
    /// StartTLS accepted; its response is queued to the writer.
    StartTls,
}

impl Connection {
    pub async fn run<S>(mut self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let mut identity = Identity::anonymous(self.session.clone());
        observe::conn_opened(&self.server, self.id, &self.peer, self.session.tls);
        // Operation numbers of this connection (access and audit logs).
        let mut op_seq = 0u64;
        let reason = match self.serve(stream, &mut identity, &mut op_seq).await {
            Served::Closed(why) => why,
            Served::StartTls(plain) => match self.upgrade(plain).await {
                Some(tls) => {
                    identity = identity.with_session(self.session.clone());
                    match self.serve(tls, &mut identity, &mut op_seq).await {
                        Served::Closed(why) => why,
                        // Not reached: StartTLS is refused once TLS is active.
                        Served::StartTls(_) => "StartTLS over TLS",
                    }
                }
                None => "StartTLS handshake failed",
            },
        };
        tracing::debug!(conn = self.id, peer = %self.peer, reason, "connection closing");
        observe::conn_closed(&self.server, self.id, reason);
    }

    /// Serve LDAP on `stream` until the connection ends, or until StartTLS
    /// is accepted (then the stream is handed back once the response is out).
    async fn serve<S>(&self, stream: S, identity: &mut Identity, op_seq: &mut u64) -> Served<S>
    where
        S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
    {
        let idle = idle_for(&self.server, identity);
        // Responses from other tasks waiting for the connection: at most
        // this many messages (a search's are chunks of ~32 KiB), so what
        // one connection can have queued stays well under a megabyte.
        let (tx, rx) = mpsc::channel::<Vec<u8>>(RESPONSE_QUEUE);
        let mut wire = Wire::new(stream, rx, idle, self.server.clone());
        let ended = self.read_loop(&mut wire, &tx, identity, op_seq).await;
        drop(tx);
        // Responses already made, and those of operations still finishing
        // (abandoned reads stop at their next check), go out first.
        let delivered = wire.finish().await;
        match (ended, delivered) {
            (Ended::StartTls, true) => Served::StartTls(wire.stream),
            (Ended::StartTls, false) => Served::Closed("write failed before StartTLS"),
            (Ended::Close(why), true) => {
                let _ = tokio::time::timeout(WRITE_STALL, wire.stream.shutdown()).await;
                Served::Closed(why)
            }
            (Ended::Close(why), false) => Served::Closed(why),
        }
    }

    /// The TLS handshake after StartTLS; on success the connection's
    /// session becomes a TLS one. None closes the connection.
    async fn upgrade<S>(&mut self, stream: S) -> Option<tokio_rustls::server::TlsStream<S>>
    where
        S: AsyncRead + AsyncWrite + Unpin,
    {
        // Present: StartTLS is refused without it.
        let tls = self.live.frontend().tls()?;
        match tls.accept(stream).await {
            Ok(h) => {
                self.session = Arc::new(Session {
                    tls: true,
                    client_cert_dn: h.client_cert_dn,
                    ..(*self.session).clone()
                });
                tracing::debug!(conn = self.id, client_cert = ?self.session.client_cert_dn, "StartTLS: TLS established");
                Some(h.stream)
            }
            Err(mut e) => {
                e.reason = format!("StartTLS: {}", e.reason);
                e.log(self.id, &self.peer);
                None
            }
        }
    }

    async fn read_loop<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        wire: &mut Wire<S>,
        tx: &mpsc::Sender<Vec<u8>>,
        identity: &mut Identity,
        op_seq: &mut u64,
    ) -> Ended {
        let limits = &self.server.cfg.config.limits;
        let max_ops = limits.max_ops_per_connection;
        let permits = Arc::new(Semaphore::new(max_ops));
        let anon_permits = Arc::new(Semaphore::new(limits.anonymous.max_ops.min(max_ops)));
        let outstanding: Outstanding = Arc::new(Mutex::new(HashMap::new()));
        let mut write_chain: Option<oneshot::Receiver<()>> = None;
        let mut shutdown = self.shutdown.clone();
        let changed = shutdown.changed();
        tokio::pin!(changed);
        let pace = Arc::new(Pace::new(
            self.live.frontend().refusals.clone(),
            self.session.peer_ip,
        ));
        let mut ctx = Ctx {
            tx,
            write_chain: &mut write_chain,
            permits: &permits,
            anon_permits: &anon_permits,
            outstanding: &outstanding,
            op_seq,
            pace: &pace,
            frame_len: 0,
        };
        loop {
            let input = std::mem::take(&mut wire.input);
            let start = match self.handle_frames(&input, wire, identity, &mut ctx).await {
                Ok(used) => used,
                Err(end) => return end,
            };
            wire.input = input;
            wire.input.drain(..start);
            // A buffer that grew for one large PDU is not kept for the
            // life of the connection.
            if wire.input.capacity() > INPUT_KEEP && wire.input.len() < INPUT_KEEP / 4 {
                wire.input.shrink_to(INPUT_KEEP / 4);
            }
            // At most one wait (MAX_WAIT) before each read, so shutdown is
            // still noticed; each request read waits again while in debt.
            if let Some(w) = pace.wait_to_read() {
                wire.pump_while(tokio::time::sleep(w)).await;
            }
            match wire.turn(changed.as_mut()).await {
                Event::Read => {}
                Event::Closed => {
                    abandon_all(&outstanding);
                    return Ended::Close("peer closed");
                }
                Event::WriteFailed => {
                    abandon_all(&outstanding);
                    return Ended::Close("write failed");
                }
                // Idle means nothing to read, nothing running and nothing
                // waiting to be written (reading pauses while output is
                // above the high-water mark).
                Event::Idle => {
                    let running = !outstanding.lock().map(|m| m.is_empty()).unwrap_or(true);
                    if !running && wire.pending() == 0 && !wire.backlog {
                        wire.output.extend_from_slice(&notice_of_disconnection(
                            ResultCode::UNAVAILABLE,
                            "idle timeout",
                        ));
                        return Ended::Close("idle timeout");
                    }
                }
                Event::Shutdown => {
                    // Let running operations finish briefly, then tell the client.
                    let all = permits.acquire_many(max_ops as u32);
                    let _ = wire
                        .pump_while(tokio::time::timeout(Duration::from_secs(5), all))
                        .await;
                    abandon_all(&outstanding);
                    // Their last responses (a persistent search's result)
                    // go before the notice.
                    wire.take_ready();
                    wire.output.extend_from_slice(&notice_of_disconnection(
                        ResultCode::UNAVAILABLE,
                        "server shutting down",
                    ));
                    return Ended::Close("server shutdown");
                }
            }
        }
    }

    /// Handle every complete PDU already received in `input` (taken out
    /// of the wire meanwhile: frames are read in place while responses
    /// are written into the wire's output). How many bytes were used, or
    /// how the connection ends.
    async fn handle_frames<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        input: &[u8],
        wire: &mut Wire<S>,
        identity: &mut Identity,
        ctx: &mut Ctx<'_>,
    ) -> Result<usize, Ended> {
        let limits = &self.server.cfg.config.limits;
        let mut start = 0usize;
        loop {
            let max_pdu = if identity.is_anonymous() {
                limits.anonymous.max_pdu_bytes.min(limits.max_pdu_bytes)
            } else {
                limits.max_pdu_bytes
            };
            match frame_length(&input[start..], max_pdu) {
                Ok(Some(len)) => {
                    let frame = &input[start..start + len];
                    start += len;
                    let pipelined = start < input.len();
                    ctx.frame_len = len;
                    let flow = self.dispatch(frame, wire, identity, ctx, pipelined).await;
                    // Refused work is paced (`net::refusals`).
                    if let Some(w) = ctx.pace.wait() {
                        wire.pump_while(tokio::time::sleep(w)).await;
                    }
                    match flow {
                        Flow::Continue if wire.is_broken() => {
                            abandon_all(ctx.outstanding);
                            return Err(Ended::Close("write failed"));
                        }
                        // Output per connection stays bounded: requests
                        // already received wait until the client has
                        // read what is pending.
                        Flow::Continue if wire.pending() >= OUTPUT_HIGH => {
                            wire.backlog = true;
                            return Ok(start);
                        }
                        Flow::Continue => {}
                        Flow::Close(why) => {
                            abandon_all(ctx.outstanding);
                            return Err(Ended::Close(why));
                        }
                        Flow::StartTls => return Err(Ended::StartTls),
                    }
                }
                Ok(None) => return Ok(start),
                Err(e) => {
                    wire.output.extend_from_slice(&notice_of_disconnection(
                        ResultCode::PROTOCOL_ERROR,
                        &e.to_string(),
                    ));
                    abandon_all(ctx.outstanding);
                    return Err(Ended::Close("bad frame"));
                }
            }
        }
    }

    /// `pipelined`: more bytes followed this PDU in the same read.
    async fn dispatch<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        frame: &[u8],
        wire: &mut Wire<S>,
        identity: &mut Identity,
        ctx: &mut Ctx<'_>,
        pipelined: bool,
    ) -> Flow {
        // This operation runs under the configuration current now.
        let server = self.live.server();
        let metrics = &server.rt.metrics;
        metrics.add(&metrics.pdus_in, 1);
        let msg = match self.decode(&server, frame, wire, identity) {
            Ok(msg) => msg,
            Err(flow) => {
                ctx.pace
                    .answered(ResultCode::PROTOCOL_ERROR.0, ctx.frame_len, false);
                return flow;
            }
        };
        let id = msg.id;
        *ctx.op_seq += 1;
        let rec = Observed::new(&server, self.id, *ctx.op_seq, &msg, identity);
        if let Some(flow) = self.without_response(&msg.op, ctx, wire) {
            answered(&server, ctx, rec, None, 0, false);
            return flow;
        }
        // Down the stack (`ops::stack`). Its rare answers (a refusal, an
        // injected fault or delay) are handled in a boxed future, so this
        // one stays small for the requests that simply run.
        let admitted = stack::admit(&server, id, identity.clone(), msg.op, &msg.controls);
        let (op, mut rec) = match admitted {
            Admitted::Run { op, delay: None } => (op, rec),
            stopped => {
                let answered = self.stopped(&server, id, stopped, rec, ctx, wire, identity);
                match Box::pin(answered).await {
                    Ok(admitted) => admitted,
                    Err(flow) => return flow,
                }
            }
        };
        let work = match op.request {
            ProtocolOp::ExtendedRequest(req) if req.name == oid::START_TLS => {
                let (flow, code) = self.start_tls(id, &req, pipelined, ctx.outstanding, wire);
                answered(&server, ctx, rec, Some(code), 0, false);
                return flow;
            }
            ProtocolOp::ExtendedRequest(req) if req.name == oid::CANCEL => {
                // Counted like any operation when a slot is free, so a Bind
                // after it waits for its answer; never waiting for one, or
                // a connection at its operation limit could not cancel.
                let permit = ctx.permits.clone().try_acquire_owned().ok();
                cancel(id, &req, ctx, wire, rec, server.clone(), permit);
                return Flow::Continue;
            }
            ProtocolOp::BindRequest(req) => {
                let wants_policy = op.controls.ppolicy;
                self.bind(&server, id, req, wants_policy, wire, identity, ctx, rec)
                    .await;
                return Flow::Continue;
            }
            ProtocolOp::SearchRequest(req) => {
                let job = ops::search::SearchJob {
                    server: server.clone(),
                    who: op.who,
                    msg_id: id,
                    conn: self.id,
                    req,
                    controls: op.controls,
                    abandoned: Arc::new(AtomicBool::new(false)),
                    out: ctx.tx.clone(),
                };
                if let Some(r) = rec.as_mut() {
                    r.started();
                }
                // A small search is answered right here, on this task; any
                // other runs on its own.
                match ops::search::run_inline(job, &mut wire.output) {
                    Ok(done) => {
                        let code = done.map(|a| a.0);
                        let entries = done.map_or(0, |a| a.1);
                        answered(&server, ctx, rec, code, entries, false);
                        return Flow::Continue;
                    }
                    Err(job) => Work::Search(job),
                }
            }
            request => Work::Op(Operation { request, ..op }),
        };
        self.spawn(&server, id, work, rec, identity, ctx, wire)
            .await
    }

    /// The stack's answer other than "run it now": a delay before running
    /// it, a refusal, or an injected fault. The operation to run, or how
    /// the connection goes on.
    #[allow(clippy::too_many_arguments)]
    async fn stopped<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        server: &Arc<Server>,
        id: i32,
        admitted: Admitted,
        rec: Option<Observed>,
        ctx: &mut Ctx<'_>,
        wire: &mut Wire<S>,
        identity: &mut Identity,
    ) -> Result<(Operation, Option<Observed>), Flow> {
        match admitted {
            Admitted::Run { op, delay } => {
                if let Some(d) = delay {
                    let _ = wire.pump_while(tokio::time::sleep(d)).await;
                }
                Ok((op, rec))
            }
            Admitted::Refused(refused) => {
                self.refuse(server, id, refused, rec, ctx, wire, identity)
                    .await;
                Err(Flow::Continue)
            }
            // An injected fault is the operator's own choice (testing how an
            // application copes): never paced as a refusal.
            Admitted::Injected {
                delay,
                disconnect,
                answer,
            } => {
                let (flow, code) = self
                    .inject(id, delay, disconnect, answer, wire, identity)
                    .await;
                finish(server, rec, code, 0);
                Err(flow)
            }
        }
    }

    /// A request refused before it runs (its controls, the identity it
    /// asks to run as, a connection restricted after a reset), answered
    /// here.
    #[allow(clippy::too_many_arguments)]
    async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        server: &Server,
        id: i32,
        refused: ops::operation::Response,
        rec: Option<Observed>,
        ctx: &mut Ctx<'_>,
        wire: &mut Wire<S>,
        identity: &mut Identity,
    ) {
        if matches!(refused.op, ProtocolOp::BindResponse(_)) {
            // Any bind first ends what is outstanding, and a failed one
            // leaves the connection anonymous (RFC 4511 4.2.1).
            self.end_outstanding(ctx, wire).await;
            self.anonymous_again(identity, wire);
        }
        let write = matches!(
            refused.op,
            ProtocolOp::AddResponse(_)
                | ProtocolOp::DelResponse(_)
                | ProtocolOp::ModifyResponse(_)
                | ProtocolOp::ModifyDnResponse(_)
        );
        answered(server, ctx, rec, refused.code(), 0, write);
        put(&mut wire.output, id, refused.op, refused.controls);
    }

    /// The request, or how the connection goes on when it cannot be
    /// decoded: with a known ID and operation the stream is still framed,
    /// and just this operation fails; otherwise the connection is unusable.
    fn decode<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        server: &Server,
        frame: &[u8],
        wire: &mut Wire<S>,
        identity: &mut Identity,
    ) -> Result<LdapMessage, Flow> {
        let e = match LdapMessage::decode(frame, &server.decode_limits) {
            Ok(m) => return Ok(m),
            Err(e) => e,
        };
        if let (false, Some(id), Some(op)) =
            (e.structural, e.msg_id, e.op_tag.and_then(response_for))
        {
            tracing::debug!(conn = self.id, msg_id = id, reason = %e.reason, "malformed request");
            if e.op_tag == Some(pando_proto::op_tag::BIND_REQUEST) {
                // A failed bind leaves the connection anonymous (RFC 4511 4.2.1).
                self.anonymous_again(identity, wire);
            }
            let res = LdapError::protocol(e.reason).into_result();
            put(&mut wire.output, id, op(res), Vec::new());
            return Err(Flow::Continue);
        }
        wire.output.extend_from_slice(&notice_of_disconnection(
            ResultCode::PROTOCOL_ERROR,
            &e.reason,
        ));
        Err(Flow::Close("undecodable PDU"))
    }

    /// Requests that get no response of their own (Unbind, Abandon), and
    /// responses a client must not send: how the connection goes on.
    fn without_response<S>(
        &self,
        op: &ProtocolOp,
        ctx: &Ctx<'_>,
        wire: &mut Wire<S>,
    ) -> Option<Flow> {
        match op {
            ProtocolOp::UnbindRequest => Some(Flow::Close("unbind")),
            ProtocolOp::AbandonRequest(target) => {
                let running = ctx
                    .outstanding
                    .lock()
                    .ok()
                    .and_then(|m| m.get(target).cloned());
                if let Some(r) = running {
                    r.abandon();
                }
                Some(Flow::Continue)
            }
            // A response or notice sent by a client breaks the protocol.
            ProtocolOp::BindResponse(_)
            | ProtocolOp::SearchResultEntry(_)
            | ProtocolOp::SearchResultDone(_)
            | ProtocolOp::SearchResultReference(_)
            | ProtocolOp::ModifyResponse(_)
            | ProtocolOp::AddResponse(_)
            | ProtocolOp::DelResponse(_)
            | ProtocolOp::ModifyDnResponse(_)
            | ProtocolOp::CompareResponse(_)
            | ProtocolOp::ExtendedResponse(_)
            | ProtocolOp::IntermediateResponse { .. } => {
                wire.output.extend_from_slice(&notice_of_disconnection(
                    ResultCode::PROTOCOL_ERROR,
                    "unexpected PDU type from client",
                ));
                Some(Flow::Close("response PDU from client"))
            }
            _ => None,
        }
    }

    /// A bind (RFC 4511 4.2), on this task: what is outstanding is
    /// abandoned and waited for, then the connection takes the new
    /// identity, or becomes anonymous if the bind fails.
    #[allow(clippy::too_many_arguments)]
    async fn bind<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        server: &Arc<Server>,
        id: i32,
        req: pando_proto::BindRequest,
        wants_policy: bool,
        wire: &mut Wire<S>,
        identity: &mut Identity,
        ctx: &mut Ctx<'_>,
        mut rec: Option<Observed>,
    ) {
        self.end_outstanding(ctx, wire).await;
        // Waiting for the outstanding operations was its queue time.
        if let Some(r) = rec.as_mut() {
            r.started();
        }
        let bound = ops::bind::bind(server, req, &self.session, wants_policy);
        let (result, controls) = match wire.pump_while(bound).await {
            Ok((who, controls)) => {
                tracing::debug!(conn = self.id, dn = who.dn(), "bind ok");
                *identity = who;
                wire.set_idle(idle_for(server, identity));
                (LdapResult::success(), controls)
            }
            Err(e) => {
                self.anonymous_again(identity, wire);
                e.into_response()
            }
        };
        let code = result.code.0;
        put(&mut wire.output, id, bind_response(result), controls);
        answered(server, ctx, rec, Some(code), 0, false);
    }

    /// Error injection's answer to request `id`: after `delay`, the
    /// connection closed (`disconnect`) or `answer` sent.
    async fn inject<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        id: i32,
        delay: Option<Duration>,
        disconnect: bool,
        answer: Option<ops::operation::Response>,
        wire: &mut Wire<S>,
        identity: &mut Identity,
    ) -> (Flow, Option<u32>) {
        if let Some(d) = delay {
            let _ = wire.pump_while(tokio::time::sleep(d)).await;
        }
        let Some(answer) = answer.filter(|_| !disconnect) else {
            return (Flow::Close("error injection"), None);
        };
        if matches!(answer.op, ProtocolOp::BindResponse(_)) {
            self.anonymous_again(identity, wire);
        }
        let code = answer.code();
        put(&mut wire.output, id, answer.op, answer.controls);
        (Flow::Continue, code)
    }

    /// Abandon every outstanding operation and wait until all have ended
    /// (a bind changes the identity they run as).
    async fn end_outstanding<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        ctx: &Ctx<'_>,
        wire: &mut Wire<S>,
    ) {
        abandon_all(ctx.outstanding);
        let max = self.server.cfg.config.limits.max_ops_per_connection as u32;
        if let Ok(all) = wire.pump_while(ctx.permits.acquire_many(max)).await {
            drop(all);
        }
    }

    /// After a failed bind: anonymous, with the anonymous idle timeout.
    fn anonymous_again<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        identity: &mut Identity,
        wire: &mut Wire<S>,
    ) {
        *identity = Identity::anonymous(self.session.clone());
        wire.set_idle(idle_for(&self.server, identity));
    }

    /// Run `work` as its own task, bounded per connection (and more
    /// tightly before a bind); its responses come back over the channel.
    #[allow(clippy::too_many_arguments)]
    async fn spawn<S: AsyncRead + AsyncWrite + Unpin>(
        &self,
        server: &Arc<Server>,
        id: i32,
        work: Work,
        rec: Option<Observed>,
        identity: &Identity,
        ctx: &mut Ctx<'_>,
        wire: &mut Wire<S>,
    ) -> Flow {
        let anon_permit = if identity.is_anonymous() {
            match wire
                .pump_while(ctx.anon_permits.clone().acquire_owned())
                .await
            {
                Ok(p) => Some(p),
                Err(_) => return Flow::Close("closing"),
            }
        } else {
            None
        };
        let Ok(permit) = wire.pump_while(ctx.permits.clone().acquire_owned()).await else {
            return Flow::Close("closing");
        };
        let running = Running::new(match &work {
            Work::Search(job) => job.abandoned.clone(),
            Work::Op(..) => Arc::new(AtomicBool::new(false)),
        });
        if let Ok(mut m) = ctx.outstanding.lock() {
            m.insert(id, running.clone());
        }
        // Writes from one connection are applied in the order they were sent
        // (a pipelined child add must not overtake its parent's); each waits
        // for the previous one. Reads run freely.
        let order = match &work {
            Work::Op(op) if is_update(&op.request) => {
                let (done_tx, done_rx) = oneshot::channel();
                Some((ctx.write_chain.replace(done_rx), done_tx))
            }
            _ => None,
        };
        let task = Task {
            id,
            server: server.clone(),
            tx: ctx.tx.clone(),
            outstanding: ctx.outstanding.clone(),
            running,
            rec,
            pace: ctx.pace.clone(),
            bytes: ctx.frame_len,
            write: order.is_some(),
        };
        tokio::spawn(async move {
            // Finished however the task ends, so no Cancel waits forever.
            let _finish = FinishOnDrop(task.running.clone());
            let done = match order {
                Some((prev, done)) => {
                    if let Some(prev) = prev {
                        let _ = prev.await;
                    }
                    Some(done)
                }
                None => None,
            };
            task.run(work).await;
            if let Some(done) = done {
                let _ = done.send(());
            }
            drop(permit);
            drop(anon_permit);
        });
        Flow::Continue
    }

    /// StartTLS (RFC 4511 4.14): refused while TLS is active (or over
    /// ldapi), without a certificate, or with other operations outstanding;
    /// otherwise answered with success, after which the caller stops
    /// reading and the handshake begins.
    fn start_tls<S>(
        &self,
        id: i32,
        req: &ExtendedRequest,
        pipelined: bool,
        outstanding: &Outstanding,
        wire: &mut Wire<S>,
    ) -> (Flow, u32) {
        let busy = pipelined || outstanding.lock().map(|m| !m.is_empty()).unwrap_or(true);
        let refused = if self.session.tls {
            Some(LdapError::new(
                ResultCode::OPERATIONS_ERROR,
                "TLS is already established on this connection",
            ))
        } else if self.session.peer_ip.is_none() {
            Some(LdapError::protocol(
                "StartTLS is not offered over ldapi (the socket is local)",
            ))
        } else if self.live.frontend().tls().is_none() {
            Some(LdapError::protocol(
                "StartTLS is not available: no TLS certificate is configured",
            ))
        } else if req.value.is_some() {
            Some(LdapError::protocol("a StartTLS request has no value"))
        } else if busy {
            Some(LdapError::new(
                ResultCode::OPERATIONS_ERROR,
                "StartTLS needs every other operation on the connection to have completed",
            ))
        } else {
            None
        };
        let ok = refused.is_none();
        let result = match refused {
            Some(e) => e.into_result(),
            None => LdapResult::success(),
        };
        let code = result.code.0;
        let response = ProtocolOp::ExtendedResponse(ExtendedResponse {
            result,
            name: Some(oid::START_TLS.to_string()),
            value: None,
        });
        put(&mut wire.output, id, response, Vec::new());
        if ok {
            (Flow::StartTls, code)
        } else {
            (Flow::Continue, code)
        }
    }
}

enum Flow {
    Continue,
    Close(&'static str),
    /// StartTLS accepted: stop reading in clear.
    StartTls,
}

/// The idle timeout for a connection bound as `who`: anonymous ones also
/// get `limits.anonymous.idle_timeout` (the smaller one applies).
fn idle_for(server: &Server, who: &Identity) -> Option<Duration> {
    let l = &server.cfg.config.limits;
    let secs = match (l.idle_timeout, l.anonymous.idle_timeout) {
        (g, a) if who.is_anonymous() && a > 0 && (g == 0 || a < g) => a,
        (g, _) => g,
    };
    (secs > 0).then(|| Duration::from_secs(secs))
}

fn abandon_all(outstanding: &Outstanding) {
    if let Ok(m) = outstanding.lock() {
        for r in m.values() {
            r.abandon();
        }
    }
}

/// The Cancel extended operation (RFC 3909; see `running`): answered at
/// once when the target is unknown or past stopping, otherwise after the
/// target has answered `canceled`.
fn cancel<S>(
    id: i32,
    req: &ExtendedRequest,
    ctx: &mut Ctx<'_>,
    wire: &mut Wire<S>,
    rec: Option<Observed>,
    server: Arc<Server>,
    permit: Option<tokio::sync::OwnedSemaphorePermit>,
) {
    let response = |code: ResultCode, message: &str| {
        ProtocolOp::ExtendedResponse(ExtendedResponse {
            result: LdapResult::new(code, message),
            name: None,
            value: None,
        })
    };
    let finish = |server: &Server, rec: Option<Observed>, code: ResultCode| {
        finish(server, rec, Some(code.0), 0);
    };
    let target = match req.value.as_deref().map(pando_proto::CancelRequest::decode) {
        Some(Ok(c)) => c.id,
        _ => {
            put(
                &mut wire.output,
                id,
                response(ResultCode::PROTOCOL_ERROR, "malformed Cancel request"),
                Vec::new(),
            );
            return finish(&server, rec, ResultCode::PROTOCOL_ERROR);
        }
    };
    if target == id {
        let code = ResultCode::CANNOT_CANCEL;
        let text = "a Cancel cannot cancel itself";
        put(&mut wire.output, id, response(code, text), Vec::new());
        return finish(&server, rec, code);
    }
    let running = ctx
        .outstanding
        .lock()
        .ok()
        .and_then(|m| m.get(&target).cloned());
    let Some(running) = running else {
        let code = ResultCode::NO_SUCH_OPERATION;
        put(
            &mut wire.output,
            id,
            response(code, "no such operation outstanding"),
            Vec::new(),
        );
        return finish(&server, rec, code);
    };
    if let Err(code) = running.cancel() {
        put(
            &mut wire.output,
            id,
            response(code, "the operation can no longer be cancelled"),
            Vec::new(),
        );
        return finish(&server, rec, code);
    }
    // The Cancel is outstanding until it has answered.
    let me = Running::uncancellable();
    let outstanding = ctx.outstanding.clone();
    if let Ok(mut m) = outstanding.lock() {
        m.insert(id, me.clone());
    }
    let tx = ctx.tx.clone();
    tokio::spawn(async move {
        let code = if running.answered().await {
            ResultCode::SUCCESS
        } else {
            ResultCode::TOO_LATE
        };
        send(&tx, id, response(code, ""), Vec::new()).await;
        finish(&server, rec, code);
        me.finish(false);
        if let Ok(mut m) = outstanding.lock() {
            if m.get(&id).is_some_and(|r| Arc::ptr_eq(r, &me)) {
                m.remove(&id);
            }
        }
        drop(permit);
    });
}

/// The `canceled` answer of a cancelled operation (None: a search that ran).
async fn send_canceled(tx: &mpsc::Sender<Vec<u8>>, id: i32, work: Option<&Work>) -> (u32, u64) {
    let e = LdapError::new(ResultCode::CANCELED, "cancelled");
    let op = match work {
        Some(Work::Op(op)) => ops::operation::refusal(&op.request, e).op,
        Some(Work::Search(_)) | None => ProtocolOp::SearchResultDone(e.into_result()),
    };
    send(tx, id, op, Vec::new()).await;
    (ResultCode::CANCELED.0, 0)
}

fn bind_response(result: LdapResult) -> ProtocolOp {
    ProtocolOp::BindResponse(pando_proto::BindResponse {
        result,
        server_sasl_creds: None,
    })
}

/// The response constructor for a request's application tag, if it has one.
fn response_for(tag: u8) -> Option<fn(LdapResult) -> ProtocolOp> {
    use pando_proto::op_tag as t;
    Some(match tag {
        t::BIND_REQUEST => bind_response,
        t::SEARCH_REQUEST => ProtocolOp::SearchResultDone,
        t::MODIFY_REQUEST => ProtocolOp::ModifyResponse,
        t::ADD_REQUEST => ProtocolOp::AddResponse,
        t::DEL_REQUEST => ProtocolOp::DelResponse,
        t::MODIFY_DN_REQUEST => ProtocolOp::ModifyDnResponse,
        t::COMPARE_REQUEST => ProtocolOp::CompareResponse,
        t::EXTENDED_REQUEST => |r| {
            ProtocolOp::ExtendedResponse(ExtendedResponse {
                result: r,
                name: None,
                value: None,
            })
        },
        _ => return None,
    })
}

/// Encode a response into `out`.
fn put(out: &mut Vec<u8>, id: i32, op: ProtocolOp, controls: Vec<Control>) {
    LdapMessage { id, op, controls }.encode(out);
}

/// Send a response from an operation running on its own task.
async fn send(tx: &mpsc::Sender<Vec<u8>>, id: i32, op: ProtocolOp, controls: Vec<Control>) {
    let msg = LdapMessage { id, op, controls };
    let _ = tx.send(msg.to_bytes()).await;
}

/// What a spawned task runs.
enum Work {
    /// A search too large to answer on the connection's task.
    Search(ops::search::SearchJob),
    Op(Operation),
}

/// An operation running on its own task, and what it reports to.
struct Task {
    id: i32,
    server: Arc<Server>,
    tx: mpsc::Sender<Vec<u8>>,
    outstanding: Outstanding,
    running: Arc<Running>,
    rec: Option<Observed>,
    /// Charged when the answer is a refusal, by the request's size.
    pace: Arc<Pace>,
    bytes: usize,
    /// The request is a write.
    write: bool,
}

impl Task {
    /// Run `work` and answer it. An operation abandoned or cancelled
    /// before it started is skipped (a cancelled one answers `canceled`);
    /// once started, a write completes and is answered (see `run_op`), so
    /// a client never loses the outcome of a change that was made.
    async fn run(mut self, work: Work) {
        let (id, running) = (self.id, self.running.clone());
        let tx = &self.tx;
        let interruptible = matches!(work, Work::Search(_));
        let mut answered = None;
        let mut canceled = false;
        if !running.start(interruptible) {
            if running.cancelled() {
                answered = Some(send_canceled(tx, id, Some(&work)).await);
                canceled = true;
            }
        } else {
            if let Some(r) = self.rec.as_mut() {
                r.started();
            }
            let ctx = self.rec.as_ref().map(|r| r.ctx()).unwrap_or_default();
            answered = match work {
                Work::Search(job) => {
                    let a = run_search(job, tx).await;
                    if a.is_none() && running.cancelled() {
                        canceled = true;
                        // A search (its job is gone): SearchResultDone.
                        Some(send_canceled(tx, id, None).await)
                    } else {
                        a
                    }
                }
                Work::Op(op) => {
                    let server = self.server.clone();
                    pando_observe::OP
                        .scope(ctx, run_op(server, op, running.stop.clone(), tx))
                        .await
                }
            };
        }
        running.finish(canceled);
        if let Some((code, _)) = answered {
            self.pace.answered(code, self.bytes, self.write);
        }
        finish(
            &self.server,
            self.rec.take(),
            answered.map(|a| a.0),
            answered.map_or(0, |a| a.1),
        );
        // Only this operation's own entry: a client may reuse a message
        // ID before the earlier operation finished.
        if let Ok(mut m) = self.outstanding.lock() {
            if m.get(&id).is_some_and(|r| Arc::ptr_eq(r, &running)) {
                m.remove(&id);
            }
        }
    }
}

/// Record how an operation answered on the connection's own task ended,
/// charging a refusal to the connection's budget (`net::refusals`).
fn answered(
    server: &Server,
    ctx: &Ctx<'_>,
    rec: Option<Observed>,
    code: Option<u32>,
    entries: u64,
    write: bool,
) {
    if let Some(c) = code {
        ctx.pace.answered(c, ctx.frame_len, write);
    }
    finish(server, rec, code, entries);
}

/// Record how an operation ended (access log, metrics).
fn finish(server: &Server, rec: Option<Observed>, code: Option<u32>, entries: u64) {
    if let Some(r) = rec {
        r.finish(server, code, entries);
    }
}

/// The connection's bookkeeping of operations running on other tasks.
struct Ctx<'a> {
    tx: &'a mpsc::Sender<Vec<u8>>,
    /// Completion of the last write sent (writes apply in order).
    write_chain: &'a mut Option<oneshot::Receiver<()>>,
    /// At most `max_ops_per_connection` operations at once.
    permits: &'a Arc<Semaphore>,
    /// At most `limits.anonymous.max_ops` of them while anonymous.
    anon_permits: &'a Arc<Semaphore>,
    outstanding: &'a Outstanding,
    /// Operation numbers of this connection (access and audit logs).
    op_seq: &'a mut u64,
    /// The connection's budget of refused work.
    pace: &'a Arc<Pace>,
    /// The size of the request being dispatched.
    frame_len: usize,
}

/// A search on its own task (see `ops::search::run_to_end`), or a
/// persistent one (`ops::search::persistent`), then its SearchResultDone.
async fn run_search(job: ops::search::SearchJob, tx: &mpsc::Sender<Vec<u8>>) -> Answered {
    let id = job.msg_id;
    let job = Arc::new(job);
    let finished = stack::search(&job).await;
    match finished {
        ops::search::Finished::Done(o) => {
            let answered = Some((o.result.code.0, o.entries));
            send(tx, id, ProtocolOp::SearchResultDone(o.result), o.controls).await;
            answered
        }
        // Abandoned: no response at all (RFC 4511 4.11).
        ops::search::Finished::Abandoned => None,
        ops::search::Finished::Failed => {
            let e = LdapError::new(ResultCode::OTHER, "search failed unexpectedly");
            send(
                tx,
                id,
                ProtocolOp::SearchResultDone(e.into_result()),
                Vec::new(),
            )
            .await;
            Some((ResultCode::OTHER.0, 0))
        }
    }
}

/// Run an operation on its own task and send its response. An abandoned
/// read has no answer; a change that was made always does (RFC 4511 4.11
/// lets the operation complete normally).
async fn run_op(
    server: Arc<Server>,
    op: Operation,
    abandoned: Arc<AtomicBool>,
    tx: &mpsc::Sender<Vec<u8>>,
) -> Answered {
    let id = op.msg_id;
    let changed = is_update(&op.request);
    let response = ops::operation::perform(&server, op).await?;
    if abandoned.load(Ordering::Relaxed) && !changed {
        return None;
    }
    let code = response.code();
    send(tx, id, response.op, response.controls).await;
    code.map(|c| (c, 0))
}

/// What `run_op` answered: the result code and the entries sent; None when
/// nothing was sent (abandoned).
type Answered = Option<(u32, u64)>;
