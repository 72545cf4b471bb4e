//! One client connection: its requests decoded (strictly, as the server
//! decodes them), routed (reads to a replica in rotation, writes to the
//! active provider), and relayed; the responses written back in the
//! order they come.
//!
//! Identity: an anonymous client's operations share the proxy's few
//! connections to each server. A simple bind is made on a connection of
//! the client's own, to the server its reads go to; when the client then
//! uses another server (a write to the provider, a read elsewhere), the
//! proxy binds a connection there with the same DN and password, which it
//! keeps in memory for the connection's life and never prints. A SASL
//! bind pins the whole session to the active provider's connection it
//! was made on (its steps cannot be replayed); SASL EXTERNAL is refused,
//! since the server would see the proxy's credentials, not the client's.

use std::collections::HashMap;
use std::sync::Arc;

use pando_client::Stream;
use pando_proto::{
    frame_length, notice_of_disconnection, oid, BindAuth, CancelRequest, DecodeLimits,
    ExtendedRequest, ExtendedResponse, LdapMessage, LdapResult, ProtocolOp, ResultCode,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::frame;
use crate::link::{ClientOut, Link};
use crate::settle::{self, SharedFence};
use crate::tls;
use crate::upstream::{Role, Upstream};
use crate::Proxy;

/// A password held for a bound client; never printed.
struct Password(Vec<u8>);

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

#[derive(Debug)]
enum Auth {
    Anonymous,
    Simple { dn: String, password: Password },
    Sasl { upstream: usize },
}

enum Flow {
    Continue,
    Close,
    /// StartTLS (its message ID): the connection turns to TLS once this
    /// request's answer is written.
    StartTls(i32),
}

struct Session {
    proxy: Arc<Proxy>,
    out: ClientOut,
    auth: Auth,
    /// The client's own connections (bound), by server.
    pinned: HashMap<usize, Arc<Link>>,
    /// Shared connections this client has sent operations on.
    used: Vec<Arc<Link>>,
    /// Where its reads may go after its last write (read your writes).
    fence: SharedFence,
    /// The connection is TLS (ldaps, or after StartTLS).
    tls_on: bool,
}

/// A TCP client: TLS first (ldaps); then served (StartTLS is taken
/// while serving).
pub async fn serve_tcp(proxy: Arc<Proxy>, stream: TcpStream, id: u64, ldaps: bool) {
    let acceptor = match (&proxy.tls, ldaps) {
        (Some(a), true) => a.clone(),
        _ => return serve(proxy, Box::new(stream), id, Vec::new(), false).await,
    };
    match tokio::time::timeout(tls::HANDSHAKE, acceptor.accept(stream)).await {
        Ok(Ok(tls)) => serve(proxy, Box::new(tls), id, Vec::new(), true).await,
        Ok(Err(e)) => tracing::debug!(conn = id, error = %e, "TLS handshake failed"),
        Err(_) => tracing::debug!(conn = id, "TLS handshake not finished in time"),
    }
}

/// Serve one client until it unbinds or goes away; `initial`: bytes
/// already read from it; `tls_on`: the connection is TLS already.
pub async fn serve(
    proxy: Arc<Proxy>,
    stream: Box<dyn Stream>,
    id: u64,
    initial: Vec<u8>,
    tls_on: bool,
) {
    let (mut rd, wr) = tokio::io::split(stream);
    let limit = proxy.cfg.max_client_queue_bytes;
    let (tx, rx) = crate::link::ClientTx::new(limit);
    let slow = tx.slow.clone();
    let mut writer = tokio::spawn(write_loop(wr, rx));
    let max = proxy.cfg.max_pdu_bytes;
    let mut s = Session {
        proxy,
        out: ClientOut {
            id,
            tx,
            inflight: Arc::default(),
        },
        auth: Auth::Anonymous,
        pinned: HashMap::new(),
        used: Vec::new(),
        fence: SharedFence::default(),
        tls_on,
    };
    let mut buf = initial;
    buf.reserve(16 * 1024);
    'conn: loop {
        let mut used = 0;
        let mut upgrade = None;
        while let Ok(Some(n)) = frame_length(&buf[used..], max) {
            let frame = &buf[used..used + n];
            used += n;
            match s.handle(frame).await {
                Flow::Continue => {}
                Flow::Close => break 'conn,
                Flow::StartTls(msg_id) => {
                    upgrade = Some(msg_id);
                    break;
                }
            }
        }
        if upgrade.is_none() {
            if let Err(e) = frame_length(&buf[used..], max) {
                s.refuse(&buf[used..], &e.to_string()).await;
                break 'conn;
            }
        }
        buf.drain(..used);
        if let Some(msg_id) = upgrade {
            match s.start_tls(msg_id, rd, writer, buf.is_empty()).await {
                Some((r, w)) => (rd, writer) = (r, w),
                None => return s.leave(),
            }
            continue;
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(16 * 1024);
        }
        tokio::select! {
            read = rd.read_buf(&mut buf) => match read {
                Ok(0) | Err(_) => break,
                Ok(_) => {}
            },
            _ = slow.notified() => {
                tracing::warn!(conn = id, "client disconnected: it let more than {limit} bytes of responses wait unread");
                break;
            }
        }
    }
    s.leave();
    drop(s);
    let _ = writer.await;
}

type Reader = tokio::io::ReadHalf<Box<dyn Stream>>;
type Writer = tokio::io::WriteHalf<Box<dyn Stream>>;
type WriterTask = tokio::task::JoinHandle<Option<(Writer, crate::link::ClientRx)>>;

/// Write the client's responses as they come, a batch per system call;
/// an empty message hands the stream and the queue back (StartTLS).
async fn write_loop(
    mut wr: Writer,
    mut rx: crate::link::ClientRx,
) -> Option<(Writer, crate::link::ClientRx)> {
    let mut batch = Vec::new();
    while let Some(first) = rx.recv().await {
        let mut hand_back = first.is_empty();
        batch.clear();
        batch.extend_from_slice(&first);
        while !hand_back && batch.len() < 256 * 1024 {
            match rx.try_recv() {
                Some(more) if more.is_empty() => hand_back = true,
                Some(more) => batch.extend_from_slice(&more),
                None => break,
            }
        }
        if wr.write_all(&batch).await.is_err() || wr.flush().await.is_err() {
            return None;
        }
        if hand_back {
            return Some((wr, rx));
        }
    }
    let _ = wr.shutdown().await;
    None
}

impl Session {
    async fn handle(&mut self, frame: &[u8]) -> Flow {
        let msg = match LdapMessage::decode(frame, &DecodeLimits::default()) {
            Ok(m) => m,
            Err(e) => {
                self.refuse(frame, &e.reason).await;
                return Flow::Close;
            }
        };
        let Some((_, tag, rest)) = frame::split(frame) else {
            self.refuse(frame, "no message ID").await;
            return Flow::Close;
        };
        if let Some(r) = &self.proxy.record {
            r.request(self.out.id, frame, &msg);
        }
        match &msg.op {
            ProtocolOp::UnbindRequest => {
                self.log(&msg, "proxy", frame.len());
                return Flow::Close;
            }
            ProtocolOp::AbandonRequest(target) => {
                self.log(&msg, "proxy", frame.len());
                self.abandon(*target);
            }
            ProtocolOp::BindRequest(_) => self.bind(msg, tag, rest, frame.len()).await,
            ProtocolOp::ExtendedRequest(e) if e.name == oid::START_TLS => {
                self.log(&msg, "proxy", frame.len());
                let (code, why) = match (&self.proxy.tls, self.tls_on) {
                    (Some(_), false) => return Flow::StartTls(msg.id),
                    (Some(_), true) => (
                        ResultCode::OPERATIONS_ERROR,
                        "TLS is already on for this connection",
                    ),
                    (None, _) => (
                        ResultCode::UNAVAILABLE,
                        "StartTLS is not offered: the proxy has no certificate (proxy.tls_cert_file)",
                    ),
                };
                self.answer(msg.id, tag, code, why).await;
            }
            ProtocolOp::ExtendedRequest(e) if e.name == oid::CANCEL => {
                self.log(&msg, "proxy", frame.len());
                let e = e.clone();
                self.cancel(msg.id, tag, &e).await;
            }
            op => {
                let write = is_write(op);
                self.forward(&msg, tag, rest, write, frame.len()).await;
            }
        }
        Flow::Continue
    }

    fn log(&self, msg: &LdapMessage, to: &str, size: usize) {
        if let Some(l) = &self.proxy.log {
            l.request(self.out.id, msg, to, size);
        }
    }

    /// Not LDAP: said so (a notice of disconnection), and the connection ends.
    async fn refuse(&self, bytes: &[u8], why: &str) {
        if let Some(l) = &self.proxy.log {
            l.garbage("client", &format!("conn={}", self.out.id), bytes);
        }
        tracing::debug!(conn = self.out.id, why, "client sent what is not LDAP");
        let notice = notice_of_disconnection(ResultCode::PROTOCOL_ERROR, why);
        self.out.tx.send(notice);
    }

    /// A response made by the proxy (the request's kind of response).
    async fn answer(&self, id: i32, request_tag: u8, code: ResultCode, why: &str) {
        if let Some(op) = ProtocolOp::response_for(request_tag, LdapResult::new(code, why)) {
            let m = LdapMessage {
                id,
                op,
                controls: Vec::new(),
            };
            self.out.tx.send(m.to_bytes());
        }
    }

    async fn forward(&mut self, msg: &LdapMessage, tag: u8, rest: &[u8], write: bool, size: usize) {
        let busy = self.out.inflight.load(std::sync::atomic::Ordering::Relaxed);
        if busy >= self.proxy.cfg.max_ops_per_connection {
            self.log(msg, "proxy", size);
            let why = format!("{busy} operations of this connection are already running");
            return self.answer(msg.id, tag, ResultCode::BUSY, &why).await;
        }
        let target = match self.auth {
            Auth::Sasl { upstream } => Some(upstream),
            _ if write => self.proxy.write_target(),
            _ => settle::read_target(&self.proxy, &self.fence).await,
        };
        let Some(u) = target else {
            self.log(msg, "proxy", size);
            let why = if write {
                "no provider is reachable through this proxy"
            } else {
                "no server is reachable through this proxy"
            };
            self.answer(msg.id, tag, ResultCode::UNAVAILABLE, why).await;
            return;
        };
        let url = self.proxy.upstreams[u].url.clone();
        self.log(msg, &url, size);
        let link = match self.link_for(u).await {
            Ok(l) => l,
            Err(why) => {
                self.answer(msg.id, tag, ResultCode::UNAVAILABLE, &why)
                    .await;
                return;
            }
        };
        let settles =
            write && self.proxy.settles_writes() && !matches!(self.auth, Auth::Sasl { .. });
        let sent = if settles {
            link.forward_held(&self.out, msg.id, tag, rest).map(|held| {
                let (p, out, fence) = (self.proxy.clone(), self.out.tx.clone(), self.fence.clone());
                tokio::spawn(settle::settle(p, u, held, out, fence, tag));
            })
        } else {
            link.forward(&self.out, msg.id, tag, rest).then_some(())
        };
        if sent.is_none() {
            let why = format!("{url}: the connection to it was lost");
            self.answer(msg.id, tag, ResultCode::UNAVAILABLE, &why)
                .await;
        }
    }

    /// The connection this client's operations to server `u` go on.
    async fn link_for(&mut self, u: usize) -> Result<Arc<Link>, String> {
        if let Some(l) = self.pinned.get(&u).filter(|l| l.is_alive()) {
            return Ok(l.clone());
        }
        let up = self.proxy.upstreams[u].clone();
        match &self.auth {
            Auth::Anonymous => {
                let link = up.shared().await?;
                if !self.used.iter().any(|l| Arc::ptr_eq(l, &link)) {
                    self.used.push(link.clone());
                }
                Ok(link)
            }
            Auth::Simple { dn, password } => {
                let mut client = up.connect().await?;
                let (code, diag) = Upstream::bind_as(&mut client, dn, &password.0).await?;
                if code != ResultCode::SUCCESS {
                    return Err(format!(
                        "{}: the proxy could not bind there as {dn}: {} ({}) {diag}",
                        up.url,
                        code.0,
                        code.name()
                    ));
                }
                let link = up.link(client);
                self.pinned.insert(u, link.clone());
                Ok(link)
            }
            Auth::Sasl { .. } => Err(format!(
                "{}: the connection this session's SASL bind was made on is gone",
                up.url
            )),
        }
    }

    async fn bind(&mut self, msg: LdapMessage, tag: u8, rest: &[u8], size: usize) {
        let ProtocolOp::BindRequest(req) = &msg.op else {
            return;
        };
        match &req.auth {
            BindAuth::Simple(pw) if req.name.is_empty() && pw.is_empty() => {
                self.close_pinned(None);
                self.auth = Auth::Anonymous;
                self.forward(&msg, tag, rest, false, size).await;
            }
            BindAuth::Simple(pw) => {
                let pw = pw.clone();
                self.simple_bind(&msg, tag, rest, pw, size).await;
            }
            BindAuth::Sasl { mechanism, .. } if mechanism.eq_ignore_ascii_case("EXTERNAL") => {
                self.close_pinned(None);
                self.log(&msg, "proxy", size);
                self.auth = Auth::Anonymous;
                let why = "SASL EXTERNAL through a proxy would name the proxy, not you: bind to a server directly";
                self.answer(msg.id, tag, ResultCode::AUTH_METHOD_NOT_SUPPORTED, why)
                    .await;
            }
            BindAuth::Sasl { .. } => self.sasl_bind(&msg, tag, rest, size).await,
        }
    }

    /// A bind starts a new identity: the client's own connections go,
    /// except the one the bind is made on.
    fn close_pinned(&mut self, keep: Option<usize>) {
        self.pinned.retain(|u, l| {
            let kept = Some(*u) == keep && l.is_alive();
            if !kept {
                l.close();
            }
            kept
        });
    }

    /// A SASL step: on the active provider, on the connection the earlier
    /// steps were made on (or a new one for a first step).
    async fn sasl_bind(&mut self, msg: &LdapMessage, tag: u8, rest: &[u8], size: usize) {
        let Some(u) = self.proxy.write_target() else {
            self.close_pinned(None);
            self.auth = Auth::Anonymous;
            self.forward(msg, tag, rest, true, size).await;
            return;
        };
        let going_on = matches!(self.auth, Auth::Sasl { upstream } if upstream == u);
        self.close_pinned(going_on.then_some(u));
        if !self.pinned.contains_key(&u) {
            match self.proxy.upstreams[u].connect().await {
                Ok(c) => {
                    let link = self.proxy.upstreams[u].link(c);
                    self.pinned.insert(u, link);
                }
                Err(why) => {
                    self.log(msg, "proxy", size);
                    self.answer(msg.id, tag, ResultCode::UNAVAILABLE, &why)
                        .await;
                    return;
                }
            }
        }
        self.auth = Auth::Sasl { upstream: u };
        self.forward(msg, tag, rest, true, size).await;
    }

    /// A simple bind, on the client's own connection to the server its
    /// reads go to (kept from its last bind there, or new); the server's
    /// answer relayed as it is.
    async fn simple_bind(
        &mut self,
        msg: &LdapMessage,
        tag: u8,
        rest: &[u8],
        password: Vec<u8>,
        size: usize,
    ) {
        self.auth = Auth::Anonymous;
        let ProtocolOp::BindRequest(req) = &msg.op else {
            return;
        };
        // A rebind stays on the server of the client's own connection
        // while that server is in rotation (a new connection per bind
        // would cost a connect); else where reads go.
        let kept = self.pinned.iter().find(|(u, l)| {
            let up = &self.proxy.upstreams[**u];
            l.is_alive() && up.in_rotation() && up.role == Role::Replica
        });
        let target = kept
            .map(|(u, _)| *u)
            .or_else(|| self.proxy.read_target(|_| true));
        let Some(u) = target else {
            self.close_pinned(None);
            self.log(msg, "proxy", size);
            let why = "no server is reachable through this proxy";
            return self.answer(msg.id, tag, ResultCode::UNAVAILABLE, why).await;
        };
        self.close_pinned(Some(u));
        let up = self.proxy.upstreams[u].clone();
        self.log(msg, &up.url, size);
        let link = match self.pinned.get(&u) {
            Some(l) => l.clone(),
            None => match up.connect().await {
                Ok(c) => up.link(c),
                Err(why) => {
                    return self
                        .answer(msg.id, tag, ResultCode::UNAVAILABLE, &why)
                        .await
                }
            },
        };
        self.pinned.insert(u, link.clone());
        let Some(held) = link.forward_held(&self.out, msg.id, tag, rest) else {
            let why = format!("{}: the connection to it was lost", up.url);
            return self
                .answer(msg.id, tag, ResultCode::UNAVAILABLE, &why)
                .await;
        };
        let Ok(bytes) = held.await else {
            return;
        };
        let ok = LdapMessage::decode(&bytes, &DecodeLimits::default()).is_ok_and(
            |m| matches!(m.op, ProtocolOp::BindResponse(r) if r.result.code == ResultCode::SUCCESS),
        );
        if ok {
            self.auth = Auth::Simple {
                dn: req.name.clone(),
                password: Password(password),
            };
        }
        self.out.tx.send(bytes);
    }

    fn links(&self) -> impl Iterator<Item = &Arc<Link>> {
        self.pinned.values().chain(self.used.iter())
    }

    /// Abandon reaches the server running the operation, under its ID there.
    fn abandon(&self, target: i32) {
        for link in self.links() {
            if let Some(id) = link.find(self.out.id, target) {
                link.abandon(id);
                return;
            }
        }
    }

    async fn cancel(&mut self, id: i32, tag: u8, req: &ExtendedRequest) {
        let target = req
            .value
            .as_deref()
            .and_then(|v| CancelRequest::decode(v).ok())
            .map(|c| c.id);
        let Some(target) = target else {
            let why = "the cancel request's value is not a cancelRequestValue";
            return self.answer(id, tag, ResultCode::PROTOCOL_ERROR, why).await;
        };
        let found = self
            .links()
            .find_map(|l| l.find(self.out.id, target).map(|lid| (l.clone(), lid)));
        let Some((link, lid)) = found else {
            let why = "no operation of that message ID is running";
            return self.answer(id, tag, ResultCode(119), why).await;
        };
        let msg = LdapMessage {
            id,
            op: ProtocolOp::ExtendedRequest(ExtendedRequest {
                name: oid::CANCEL.into(),
                value: Some(CancelRequest { id: lid }.encode()),
            }),
            controls: Vec::new(),
        };
        let bytes = msg.to_bytes();
        let sent =
            frame::split(&bytes).is_some_and(|(_, t, rest)| link.forward(&self.out, id, t, rest));
        if !sent {
            let why = format!("{}: the connection to it was lost", link.upstream.url());
            self.answer(id, tag, ResultCode::UNAVAILABLE, &why).await;
        }
    }

    /// The client is gone: its operations on shared connections abandoned
    /// there, its own connections closed.
    /// StartTLS (message `msg_id`) with the connection's halves: refused
    /// while operations are outstanding (RFC 4511 4.14.1: the connection
    /// stays as it is) or when bytes followed it before the handshake (not
    /// TLS: the connection ends); else answered, the writer's queue
    /// drained, and the handshake made. The new halves, or None when the
    /// connection ends.
    async fn start_tls(
        &mut self,
        msg_id: i32,
        rd: Reader,
        writer: WriterTask,
        nothing_after: bool,
    ) -> Option<(Reader, WriterTask)> {
        let tag = pando_proto::op_tag::EXTENDED_REQUEST;
        if self.out.inflight.load(std::sync::atomic::Ordering::Relaxed) > 0 {
            let why =
                "operations are outstanding on this connection: StartTLS waits for their answers";
            self.answer(msg_id, tag, ResultCode::OPERATIONS_ERROR, why)
                .await;
            return Some((rd, writer));
        }
        if !nothing_after {
            let why = "data sent after StartTLS before the TLS handshake";
            self.refuse(b"", why).await;
            self.out.tx.hand_back();
            let _ = writer.await;
            return None;
        }
        let acceptor = self.proxy.tls.clone()?;
        let ok = LdapMessage {
            id: msg_id,
            op: ProtocolOp::ExtendedResponse(ExtendedResponse {
                result: LdapResult::success(),
                name: Some(oid::START_TLS.into()),
                value: None,
            }),
            controls: Vec::new(),
        };
        self.out.tx.send(ok.to_bytes());
        self.out.tx.hand_back();
        let (wr, rx) = writer.await.ok()??;
        let stream = rd.unsplit(wr);
        let id = self.out.id;
        let tls = match tokio::time::timeout(tls::HANDSHAKE, acceptor.accept(stream)).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                tracing::debug!(conn = id, error = %e, "TLS handshake after StartTLS failed");
                return None;
            }
            Err(_) => {
                tracing::debug!(
                    conn = id,
                    "TLS handshake after StartTLS not finished in time"
                );
                return None;
            }
        };
        self.tls_on = true;
        let (rd, wr) = tokio::io::split(Box::new(tls) as Box<dyn Stream>);
        Some((rd, tokio::spawn(write_loop(wr, rx))))
    }

    fn leave(&mut self) {
        for link in &self.used {
            link.drop_client(self.out.id);
        }
        for (_, l) in self.pinned.drain() {
            l.close();
        }
    }
}

/// Operations that change the directory go to the active provider; so do
/// extended operations other than Who am I? (they may write: a password
/// change).
fn is_write(op: &ProtocolOp) -> bool {
    match op {
        ProtocolOp::SearchRequest(_) | ProtocolOp::CompareRequest(_) => false,
        ProtocolOp::ExtendedRequest(e) => e.name != oid::WHOAMI,
        _ => true,
    }
}
