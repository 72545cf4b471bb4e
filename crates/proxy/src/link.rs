//! One connection from the proxy to a server, carrying the operations of
//! one client (a bound client's own connection) or of many (anonymous
//! clients share a few per server). Each operation gets a message ID of
//! the link's own; its responses go back to its client under the client's
//! ID. When the server goes away, every operation still waiting is
//! answered `unavailable` naming the server: none is dropped silently.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use pando_client::Stream;
use pando_proto::{frame_length, LdapMessage, LdapResult, ProtocolOp, ResultCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::sync::{mpsc, oneshot};

use crate::decode_log::DecodeLog;
use crate::frame;

/// The server a link leads to, as the link sees it: what it is called,
/// and what it is told about the link's operations and failure.
pub trait Peer: Send + Sync {
    fn url(&self) -> &str;
    /// An operation was sent (it is outstanding until `finished`).
    fn started(&self);
    fn finished(&self);
    /// The connection failed: maybe the server.
    fn suspect(&self, why: &str);
}

/// A client's responses on their way to its writer: a queue bounded in
/// bytes, never waited on, so a client reading slowly never holds up the
/// server connection it shares with others (a large search's entries wait
/// for it here). One that lets more than its bound pile up is
/// disconnected (`slow` fires; its session ends and its operations are
/// dropped).
#[derive(Clone)]
pub struct ClientTx {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    queued: Arc<AtomicUsize>,
    limit: usize,
    pub slow: Arc<tokio::sync::Notify>,
}

impl ClientTx {
    /// A queue of at most `limit` bytes, and its receiving end.
    pub fn new(limit: usize) -> (ClientTx, ClientRx) {
        let (tx, rx) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let tx = ClientTx {
            tx,
            queued: queued.clone(),
            limit,
            slow: Arc::default(),
        };
        (tx, ClientRx { rx, queued })
    }

    /// Have the writer hand the stream back once what is queued is
    /// written (StartTLS).
    pub fn hand_back(&self) {
        let _ = self.tx.send(Vec::new());
    }

    /// Queue `bytes` for the client; false when it is gone or too slow.
    pub fn send(&self, bytes: Vec<u8>) -> bool {
        let n = bytes.len();
        if self.queued.fetch_add(n, Ordering::AcqRel) + n > self.limit {
            self.queued.fetch_sub(n, Ordering::AcqRel);
            self.slow.notify_one();
            return false;
        }
        self.tx.send(bytes).is_ok()
    }
}

/// The writer's end of a [`ClientTx`].
pub struct ClientRx {
    rx: mpsc::UnboundedReceiver<Vec<u8>>,
    queued: Arc<AtomicUsize>,
}

impl ClientRx {
    pub async fn recv(&mut self) -> Option<Vec<u8>> {
        let m = self.rx.recv().await?;
        self.queued.fetch_sub(m.len(), Ordering::AcqRel);
        Some(m)
    }

    pub fn try_recv(&mut self) -> Option<Vec<u8>> {
        let m = self.rx.try_recv().ok()?;
        self.queued.fetch_sub(m.len(), Ordering::AcqRel);
        Some(m)
    }
}

/// Where a client's responses go: its writer, and who it is.
#[derive(Clone)]
pub struct ClientOut {
    pub id: u64,
    pub tx: ClientTx,
    /// Its operations sent and not finished, over every link.
    pub inflight: Arc<AtomicUsize>,
}

impl ClientOut {
    fn done(&self) {
        let _ = self
            .inflight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}

/// An operation sent on a link and not yet finished.
struct Pending {
    client: ClientOut,
    client_msg: i32,
    request_tag: u8,
    started: Instant,
    entries: u64,
    bytes: u64,
    /// The last response goes here instead of to the client (a write the
    /// proxy answers only once it is settled: `client::settle`).
    hold: Option<oneshot::Sender<Vec<u8>>>,
}

pub struct Link {
    pub upstream: Arc<dyn Peer>,
    tx: mpsc::UnboundedSender<Vec<u8>>,
    pending: Mutex<HashMap<i32, Pending>>,
    next_id: AtomicI32,
    alive: AtomicBool,
}

impl Link {
    /// Relay messages over a connected (and, for a bound client, bound)
    /// stream; `buffered`: bytes already read from it.
    pub fn start(
        upstream: Arc<dyn Peer>,
        stream: Box<dyn Stream>,
        buffered: Vec<u8>,
        next_id: i32,
        log: Option<Arc<DecodeLog>>,
        max_pdu: usize,
    ) -> Arc<Link> {
        let (rd, wr) = tokio::io::split(stream);
        let (tx, rx) = mpsc::unbounded_channel();
        let link = Arc::new(Link {
            upstream,
            tx,
            pending: Mutex::new(HashMap::new()),
            next_id: AtomicI32::new(next_id.max(1)),
            alive: AtomicBool::new(true),
        });
        tokio::spawn(write_loop(wr, rx));
        tokio::spawn(read_loop(link.clone(), rd, buffered, log, max_pdu));
        link
    }

    pub fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Acquire)
    }

    /// Operations waiting for their last response.
    pub fn waiting(&self) -> usize {
        self.pending.lock().map(|p| p.len()).unwrap_or(0)
    }

    /// Send a client's request (`rest`: its bytes after the message ID).
    /// False when the link is gone: the caller answers the client.
    pub fn forward(
        &self,
        client: &ClientOut,
        client_msg: i32,
        request_tag: u8,
        rest: &[u8],
    ) -> bool {
        self.send(client, client_msg, request_tag, rest, None)
    }

    /// As `forward`, but the last response (under the client's ID) comes
    /// back to the caller rather than to the client.
    pub fn forward_held(
        &self,
        client: &ClientOut,
        client_msg: i32,
        request_tag: u8,
        rest: &[u8],
    ) -> Option<oneshot::Receiver<Vec<u8>>> {
        let (tx, rx) = oneshot::channel();
        self.send(client, client_msg, request_tag, rest, Some(tx))
            .then_some(rx)
    }

    fn send(
        &self,
        client: &ClientOut,
        client_msg: i32,
        request_tag: u8,
        rest: &[u8],
        hold: Option<oneshot::Sender<Vec<u8>>>,
    ) -> bool {
        if !self.is_alive() {
            return false;
        }
        let id = self.take_id();
        let waits = !matches!(request_tag, 0x42 | 0x50);
        if waits {
            let Ok(mut p) = self.pending.lock() else {
                return false;
            };
            // Checked under the lock `fail_all` drains with: an operation
            // is either answered by it or never taken.
            if !self.is_alive() {
                return false;
            }
            p.insert(
                id,
                Pending {
                    client: client.clone(),
                    client_msg,
                    request_tag,
                    started: Instant::now(),
                    entries: 0,
                    bytes: 0,
                    hold,
                },
            );
            self.upstream.started();
            client.inflight.fetch_add(1, Ordering::Relaxed);
        }
        let mut out = Vec::with_capacity(rest.len() + 8);
        frame::with_id(id, rest, &mut out);
        if self.tx.send(out).is_err() {
            if waits {
                self.forget(id);
            }
            return false;
        }
        true
    }

    /// The link's ID of a client's operation still running on it.
    pub fn find(&self, client: u64, client_msg: i32) -> Option<i32> {
        let p = self.pending.lock().ok()?;
        p.iter()
            .find(|(_, v)| v.client.id == client && v.client_msg == client_msg)
            .map(|(k, _)| *k)
    }

    /// Send a message the proxy made itself (an abandon with the link's
    /// ID); no response is awaited.
    pub fn send_own(&self, op: ProtocolOp) {
        let id = self.take_id();
        let msg = LdapMessage {
            id,
            op,
            controls: Vec::new(),
        };
        let _ = self.tx.send(msg.to_bytes());
    }

    /// Abandon an operation: the server is told, and its responses are no
    /// longer awaited.
    pub fn abandon(&self, id: i32) {
        self.forget(id);
        self.send_own(ProtocolOp::AbandonRequest(id));
    }

    /// A client left: its operations still running here are abandoned.
    pub fn drop_client(&self, client: u64) {
        let ids: Vec<i32> = match self.pending.lock() {
            Ok(p) => p
                .iter()
                .filter(|(_, v)| v.client.id == client)
                .map(|(k, _)| *k)
                .collect(),
            Err(_) => Vec::new(),
        };
        for id in ids {
            self.abandon(id);
        }
    }

    /// Close the link (its client left); operations still waiting on it
    /// are answered as abandoned: nothing.
    pub fn close(&self) {
        self.alive.store(false, Ordering::Release);
        let _ = self.tx.send(Vec::new());
    }

    fn take_id(&self) -> i32 {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        if id <= 0 || id == i32::MAX {
            self.next_id.store(2, Ordering::Relaxed);
            return 1;
        }
        id
    }

    fn forget(&self, id: i32) {
        if let Ok(mut p) = self.pending.lock() {
            if let Some(gone) = p.remove(&id) {
                gone.client.done();
                self.upstream.finished();
            }
        }
    }

    /// The server stopped answering (a failed health check): every waiting
    /// operation answered `unavailable` now, and the connection closed.
    pub fn abort(self: &Arc<Self>, why: String) {
        if !self.is_alive() {
            return;
        }
        self.alive.store(false, Ordering::Release);
        let _ = self.tx.send(Vec::new());
        let link = self.clone();
        tokio::spawn(async move { link.fail_all(&why).await });
    }

    /// The server is gone: every waiting operation answered `unavailable`.
    async fn fail_all(&self, why: &str) {
        let waiting: Vec<Pending> = match self.pending.lock() {
            Ok(mut p) => {
                self.alive.store(false, Ordering::Release);
                p.drain().map(|(_, v)| v).collect()
            }
            Err(_) => Vec::new(),
        };
        for p in waiting {
            p.client.done();
            self.upstream.finished();
            let msg = if why.contains(self.upstream.url()) {
                why.to_string()
            } else {
                format!("{}: {why}", self.upstream.url())
            };
            let result = LdapResult::new(ResultCode::UNAVAILABLE, msg);
            if let Some(op) = ProtocolOp::response_for(p.request_tag, result) {
                let m = LdapMessage {
                    id: p.client_msg,
                    op,
                    controls: Vec::new(),
                };
                match p.hold {
                    Some(hold) => {
                        let _ = hold.send(m.to_bytes());
                    }
                    None => {
                        p.client.tx.send(m.to_bytes());
                    }
                }
            }
        }
    }
}

async fn write_loop(mut wr: WriteHalf<Box<dyn Stream>>, mut rx: mpsc::UnboundedReceiver<Vec<u8>>) {
    let mut batch = Vec::new();
    while let Some(first) = rx.recv().await {
        if first.is_empty() {
            break;
        }
        batch.clear();
        batch.extend_from_slice(&first);
        while let Ok(more) = rx.try_recv() {
            if more.is_empty() {
                let _ = wr.write_all(&batch).await;
                let _ = wr.shutdown().await;
                return;
            }
            batch.extend_from_slice(&more);
        }
        if wr.write_all(&batch).await.is_err() {
            break;
        }
    }
    let _ = wr.shutdown().await;
}

async fn read_loop(
    link: Arc<Link>,
    mut rd: ReadHalf<Box<dyn Stream>>,
    mut buf: Vec<u8>,
    log: Option<Arc<DecodeLog>>,
    max_pdu: usize,
) {
    let why = loop {
        match relay_frames(&link, &mut buf, log.as_deref(), max_pdu).await {
            Ok(()) => {}
            Err(why) => break why,
        }
        if buf.capacity() - buf.len() < 4096 {
            buf.reserve(64 * 1024);
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => break "closed the connection".to_string(),
            Ok(_) => {}
            Err(e) => break format!("connection lost: {e}"),
        }
        if !link.is_alive() && link.waiting() == 0 {
            return;
        }
    };
    // Operations were lost with it: the server may be gone, so it leaves
    // the rotation until a check says otherwise. An idle connection the
    // server closed (its idle timeout) says nothing about the server: the
    // next operation opens another.
    if link.waiting() > 0 {
        tracing::info!(upstream = %link.upstream.url(), why, "a connection to a server ended with operations running");
        link.upstream.suspect(&why);
    } else {
        tracing::debug!(upstream = %link.upstream.url(), why, "an idle connection to a server ended");
    }
    link.fail_all(&why).await;
}

/// Pass on every whole message in `buf`. Err: the server sent what is not
/// LDAP, or said it is going away.
async fn relay_frames(
    link: &Link,
    buf: &mut Vec<u8>,
    log: Option<&DecodeLog>,
    max_pdu: usize,
) -> Result<(), String> {
    let mut used = 0;
    loop {
        let n = match frame_length(&buf[used..], max_pdu) {
            Ok(Some(n)) => n,
            Ok(None) => break,
            Err(e) => {
                if let Some(l) = log {
                    l.garbage("server", link.upstream.url(), &buf[used..]);
                }
                return Err(format!("sent what is not LDAP: {e}"));
            }
        };
        let frame = &buf[used..used + n];
        used += n;
        let Some((id, tag, rest)) = frame::split(frame) else {
            if let Some(l) = log {
                l.garbage("server", link.upstream.url(), frame);
            }
            return Err("sent a message without a valid message ID".into());
        };
        if id == 0 {
            // An unsolicited notification: the server is going away.
            return Err("sent a notice of disconnection".into());
        }
        relay_one(link, id, tag, rest, frame.len(), log).await;
    }
    buf.drain(..used);
    Ok(())
}

async fn relay_one(
    link: &Link,
    id: i32,
    tag: u8,
    rest: &[u8],
    size: usize,
    log: Option<&DecodeLog>,
) {
    let last = frame::is_final_response(tag);
    let (client, client_msg, hold) = {
        let Ok(mut p) = link.pending.lock() else {
            return;
        };
        let Some(pending) = p.get_mut(&id) else {
            return; // an abandoned operation's late response
        };
        pending.bytes += size as u64;
        if tag == 0x64 {
            pending.entries += 1;
        }
        let mut route = (pending.client.clone(), pending.client_msg, None);
        if last {
            if let Some(done) = p.remove(&id) {
                done.client.done();
                if let Some(l) = log {
                    let url = link.upstream.url();
                    l.response(
                        done.client.id,
                        done.client_msg,
                        url,
                        rest,
                        done.started,
                        done.entries,
                        done.bytes,
                    );
                }
                route.2 = done.hold;
            }
        }
        route
    };
    if last {
        link.upstream.finished();
    }
    let mut out = Vec::with_capacity(rest.len() + 8);
    frame::with_id(client_msg, rest, &mut out);
    match hold {
        Some(h) => {
            let _ = h.send(out);
        }
        None => {
            client.tx.send(out);
        }
    }
}
