//! One simulated client: a connection for searches and writes ("main",
//! bound as --bind-dn, pipelined up to --depth requests) and, for the
//! bind and auth operations, a second connection that binds ("bind", one
//! request at a time: a bind must not be pipelined).
//!
//! The task owns its buffers and reuses them: requests are encoded from
//! [`MessageTemplate`]s into the write buffer, responses are read into the
//! read buffer and only their envelope is looked at ([`crate::wire`]). It
//! uses the socket's readiness API (`readable`/`try_read`, `try_write`) so
//! that reading and writing never wait on each other: a server that is
//! slow to read our requests cannot stall the reading of its responses.
//!
//! Operations occupy *slots*, one per outstanding request on the main
//! connection. Slot `s` uses message IDs `s+1, s+1+D, s+1+2D, ...` (D the
//! depth), so a response finds its slot by `(id-1) % D` without a map.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use pando_proto::{
    frame_length, op_tag, BindAuth, BindRequest, LdapMessage, ProtocolOp, ResultCode,
};
use tokio::net::{TcpStream, UnixStream};
use tokio::sync::Notify;

use crate::config::{OpKind, Plan, Target};
use crate::keys::Rng;
use crate::schedule::{latency_start, OpenLoop};
use crate::stats::{ErrKey, Stats};
use crate::template::{decimal, MessageTemplate};
use crate::wire;

/// Largest response accepted (a search entry can be big).
const MAX_PDU: usize = 64 << 20;
/// How long connecting and the setup bind may take.
const SETUP_TIMEOUT: Duration = Duration::from_secs(10);
/// Errors shown with their diagnostic message (the rest are only counted).
const ERRORS_SHOWN: u32 = 5;

/// State shared by every client of the run.
pub struct Shared {
    pub plan: Plan,
    stop: AtomicBool,
    pub stop_notify: Notify,
    /// Why the run stopped before its end (interrupted, a fatal error).
    stop_reason: Mutex<Option<String>>,
    fatal: Mutex<Option<String>>,
    /// Sequential keys, and the add/delete cursor.
    pub seq: AtomicU64,
    /// --count: measured operations started and finished.
    claimed: AtomicU64,
    finished: AtomicU64,
    errors_shown: AtomicU32,
}

impl Shared {
    pub fn new(plan: Plan) -> Shared {
        Shared {
            plan,
            stop: AtomicBool::new(false),
            stop_notify: Notify::new(),
            stop_reason: Mutex::new(None),
            fatal: Mutex::new(None),
            seq: AtomicU64::new(0),
            claimed: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            errors_shown: AtomicU32::new(0),
        }
    }

    pub fn stopping(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Ends the run: no new requests, no more recording. The first reason
    /// is kept (None: the run simply reached its count).
    pub fn stop(&self, reason: Option<String>) {
        if let Some(r) = reason {
            let mut g = self.stop_reason.lock().unwrap_or_else(|e| e.into_inner());
            g.get_or_insert(r);
        }
        self.stop.store(true, Ordering::Relaxed);
        self.stop_notify.notify_waiters();
    }

    /// A client cannot go on: stop the run and report `msg` at the end.
    pub fn fail(&self, msg: String) {
        {
            let mut g = self.fatal.lock().unwrap_or_else(|e| e.into_inner());
            g.get_or_insert(msg);
        }
        self.stop(Some("fatal error".into()));
    }

    pub fn fatal(&self) -> Option<String> {
        self.fatal.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn stop_reason(&self) -> Option<String> {
        self.stop_reason
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// --count: may one more measured operation start?
    fn claim(&self) -> bool {
        match self.plan.count {
            None => true,
            Some(n) => self.claimed.fetch_add(1, Ordering::Relaxed) < n,
        }
    }

    /// --count: a measured operation finished; stops the run at the last.
    fn finished_one(&self) {
        if let Some(n) = self.plan.count {
            if self.finished.fetch_add(1, Ordering::Relaxed) + 1 == n {
                self.stop(None);
            }
        }
    }
}

/// The run's clock, fixed when the load starts.
#[derive(Clone, Copy, Debug)]
pub struct Timeline {
    pub start: Instant,
    /// Operations issued from here on are measured.
    pub warmup_end: Instant,
    /// End of the measured time (--duration).
    pub end: Option<Instant>,
    /// No request is issued at or after this.
    pub issue_until: Instant,
    /// Clients stop waiting for outstanding responses here.
    pub drain_deadline: Instant,
}

/// How long outstanding requests may take to finish after the end.
pub const DRAIN: Duration = Duration::from_secs(5);

impl Timeline {
    pub fn new(start: Instant, plan: &Plan) -> Timeline {
        let warmup_end = start + plan.warmup;
        let end = plan.duration.map(|d| warmup_end + d);
        let issue_until = warmup_end + plan.time_cap;
        Timeline {
            start,
            warmup_end,
            end,
            issue_until,
            drain_deadline: issue_until + DRAIN,
        }
    }
}

// ---------------------------------------------------------------- sockets

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Stream {
    async fn readable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.readable().await,
            Stream::Unix(s) => s.readable().await,
        }
    }

    async fn writable(&self) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.writable().await,
            Stream::Unix(s) => s.writable().await,
        }
    }

    fn try_read_buf(&self, buf: &mut Vec<u8>) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_read_buf(buf),
            Stream::Unix(s) => s.try_read_buf(buf),
        }
    }

    /// Marks the socket not readable without a system call: used after a
    /// short read, which means the kernel had nothing more. tokio clears
    /// the flag only if no newer readiness event arrived meanwhile, so no
    /// wake-up can be lost; this saves the `recv` that would only return
    /// EAGAIN on every operation.
    fn clear_read_ready(&self) {
        let would_block = || Err::<(), _>(io::Error::from(io::ErrorKind::WouldBlock));
        let _ = match self {
            Stream::Tcp(s) => s.try_io(tokio::io::Interest::READABLE, would_block),
            Stream::Unix(s) => s.try_io(tokio::io::Interest::READABLE, would_block),
        };
    }

    fn try_write(&self, b: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.try_write(b),
            Stream::Unix(s) => s.try_write(b),
        }
    }
}

struct Conn {
    stream: Stream,
    /// Received bytes not yet consumed (at most one partial PDU after a read).
    rbuf: Vec<u8>,
    /// Encoded requests; `wbuf[wpos..]` is not yet sent.
    wbuf: Vec<u8>,
    wpos: usize,
    what: &'static str,
}

impl Conn {
    fn pending(&self) -> bool {
        self.wpos < self.wbuf.len()
    }

    /// Sends what the socket takes now.
    fn flush(&mut self) -> Result<(), String> {
        while self.pending() {
            match self
                .stream
                .try_write(self.wbuf.get(self.wpos..).unwrap_or_default())
            {
                Ok(0) => {
                    return Err(format!(
                        "{} connection: the server stopped reading",
                        self.what
                    ))
                }
                Ok(n) => self.wpos += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) => return Err(format!("{} connection: write failed: {e}", self.what)),
            }
        }
        self.wbuf.clear();
        self.wpos = 0;
        Ok(())
    }

    /// Reads what is there; false when nothing was (a spurious wake-up).
    fn read(&mut self) -> Result<bool, String> {
        if self.rbuf.capacity() - self.rbuf.len() < 16 << 10 {
            self.rbuf.reserve(64 << 10);
        }
        let room = self.rbuf.capacity() - self.rbuf.len();
        match self.stream.try_read_buf(&mut self.rbuf) {
            Ok(0) => Err(format!("the server closed a {} connection", self.what)),
            Ok(n) => {
                if n < room {
                    self.stream.clear_read_ready();
                }
                Ok(true)
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(false),
            Err(e) => Err(format!("{} connection: read failed: {e}", self.what)),
        }
    }

    async fn write_all(&mut self) -> Result<(), String> {
        loop {
            self.flush()?;
            if !self.pending() {
                return Ok(());
            }
            self.stream
                .writable()
                .await
                .map_err(|e| format!("{} connection: {e}", self.what))?;
        }
    }

    /// Waits for one whole PDU and returns its length (setup path).
    async fn read_frame(&mut self) -> Result<usize, String> {
        loop {
            match frame_length(&self.rbuf, MAX_PDU) {
                Ok(Some(n)) => return Ok(n),
                Ok(None) => {}
                Err(e) => return Err(format!("{} connection: {e}", self.what)),
            }
            self.stream
                .readable()
                .await
                .map_err(|e| format!("{} connection: {e}", self.what))?;
            self.read()?;
        }
    }
}

async fn connect(plan: &Plan, what: &'static str) -> Result<Conn, String> {
    let stream = tokio::time::timeout(SETUP_TIMEOUT, async {
        match &plan.target {
            Target::Tcp(a) => {
                let s = TcpStream::connect(a).await?;
                s.set_nodelay(true)?;
                Ok(Stream::Tcp(s))
            }
            Target::Unix(p) => UnixStream::connect(p).await.map(Stream::Unix),
        }
    })
    .await
    .map_err(|_| {
        format!(
            "cannot connect to {}: no answer in {SETUP_TIMEOUT:?}",
            plan.url
        )
    })?
    .map_err(|e: io::Error| format!("cannot connect to {}: {e}", plan.url))?;
    Ok(Conn {
        stream,
        rbuf: Vec::with_capacity(64 << 10),
        wbuf: Vec::with_capacity(4 << 10),
        wpos: 0,
        what,
    })
}

/// A simple bind before the load starts; the error names the DN, the
/// result code and the server's message.
async fn setup_bind(conn: &mut Conn, dn: &str, password: &[u8]) -> Result<(), String> {
    LdapMessage {
        id: 1,
        op: ProtocolOp::BindRequest(BindRequest {
            version: 3,
            name: dn.to_string(),
            auth: BindAuth::Simple(password.to_vec()),
        }),
        controls: vec![],
    }
    .encode(&mut conn.wbuf);
    let work = async {
        conn.write_all().await?;
        let n = conn.read_frame().await?;
        let frame: Vec<u8> = conn.rbuf.drain(..n).collect();
        let env = wire::envelope(&frame)?;
        match (env.op, env.code) {
            (op_tag::BIND_RESPONSE, Some(0)) => Ok(()),
            (_, Some(code)) => {
                let diag = wire::diagnostic(&frame);
                Err(format!(
                    "bind as '{dn}' failed: {}{}",
                    ResultCode(code),
                    if diag.is_empty() {
                        String::new()
                    } else {
                        format!(": {diag}")
                    }
                ))
            }
            (op, None) => Err(format!("bind as '{dn}': unexpected response 0x{op:02x}")),
        }
    };
    tokio::time::timeout(SETUP_TIMEOUT, work)
        .await
        .map_err(|_| format!("bind as '{dn}': no answer in {SETUP_TIMEOUT:?}"))?
}

// ---------------------------------------------------------------- the client

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    Free,
    /// Waiting for a search's entries and result (search, or auth's first step).
    Search,
    /// Waiting for a modify, add or delete response.
    Write,
    /// Waiting for the bind connection.
    BindQueued,
    /// Waiting for a bind response.
    Bind,
}

struct Slot {
    step: Step,
    /// Index into `plan.ops` (and the stats' kinds).
    kind: usize,
    op: OpKind,
    msg_id: i32,
    /// Start of the latency: issue time, or in open loop the scheduled time
    /// when the request waited for this slot ([`crate::schedule::latency_start`]).
    started: Instant,
    /// When the slot last became free.
    free_since: Instant,
    measured: bool,
    key: u64,
    entries: u64,
    /// auth: the DN found by the search (buffer reused).
    dn: Vec<u8>,
}

/// The next main-connection message ID of slot `slot` after `prev`.
pub fn next_msg_id(prev: i32, slot: usize, depth: usize) -> i32 {
    let d = depth as i32;
    if prev <= 0 || prev > i32::MAX - d {
        slot as i32 + 1
    } else {
        prev + d
    }
}

pub struct Client {
    index: usize,
    shared: Arc<Shared>,
    t: Timeline,
    stats: Rc<RefCell<Stats>>,
    main: Option<Conn>,
    bind: Option<Conn>,
    slots: Vec<Slot>,
    free: Vec<usize>,
    inflight: usize,
    bind_queue: VecDeque<usize>,
    bind_busy: Option<usize>,
    bind_msg_id: i32,
    rng: Rng,
    counter: u64,
    sched: Option<OpenLoop>,
    issuing: bool,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Which {
    Main,
    Bind,
}

async fn readable(c: Option<&Conn>) -> io::Result<()> {
    match c {
        Some(c) => c.stream.readable().await,
        None => std::future::pending().await,
    }
}

async fn writable(c: Option<&Conn>) -> io::Result<()> {
    match c {
        Some(c) => c.stream.writable().await,
        None => std::future::pending().await,
    }
}

/// Connections of one client, opened and bound before the clock starts.
pub struct Connected {
    index: usize,
    main: Option<Conn>,
    bind: Option<Conn>,
}

pub async fn open(plan: &Plan, index: usize) -> Result<Connected, String> {
    let main = if plan.uses_main() {
        let mut c = connect(plan, "main").await?;
        if let Some(cred) = &plan.bind {
            setup_bind(&mut c, &cred.dn, &cred.password).await?;
        }
        Some(c)
    } else {
        None
    };
    let bind = if plan.uses_bind_conn() {
        Some(connect(plan, "bind").await?)
    } else {
        None
    };
    Ok(Connected { index, main, bind })
}

impl Client {
    pub fn new(
        c: Connected,
        shared: Arc<Shared>,
        t: Timeline,
        stats: Rc<RefCell<Stats>>,
    ) -> Client {
        let plan = &shared.plan;
        let depth = plan.depth;
        let slots = (0..depth)
            .map(|_| Slot {
                step: Step::Free,
                kind: 0,
                op: OpKind::Search,
                msg_id: 0,
                started: t.start,
                free_since: t.start,
                measured: false,
                key: 0,
                entries: 0,
                dn: Vec::new(),
            })
            .collect();
        let sched = plan
            .rate
            .map(|r| OpenLoop::new(t.start, r, plan.connections, c.index));
        Client {
            index: c.index,
            rng: Rng::for_stream(plan.seed, c.index as u64),
            t,
            stats,
            main: c.main,
            bind: c.bind,
            slots,
            // Popped from the end: slot 0 first.
            free: (0..depth).rev().collect(),
            inflight: 0,
            bind_queue: VecDeque::with_capacity(depth),
            bind_busy: None,
            bind_msg_id: 1,
            counter: 0,
            sched,
            issuing: true,
            shared,
        }
    }

    /// Runs until the end of the run and the outstanding responses are in.
    pub async fn run(mut self) -> Result<(), String> {
        let deadline = tokio::time::sleep_until(self.t.drain_deadline.into());
        tokio::pin!(deadline);
        let tick = tokio::time::sleep_until(self.t.drain_deadline.into());
        tokio::pin!(tick);
        let mut tick_at = None;
        loop {
            self.issue(Instant::now());
            if let Some(c) = &mut self.main {
                c.flush()?;
            }
            if let Some(c) = &mut self.bind {
                c.flush()?;
            }
            if !self.issuing && self.inflight == 0 {
                break;
            }
            // Open loop: wake up for the next scheduled request if a slot is free.
            let want_tick = match &self.sched {
                Some(s) if self.issuing && !self.free.is_empty() => Some(s.next_at()),
                _ => None,
            };
            if let Some(at) = want_tick {
                if tick_at != Some(at) {
                    tick.as_mut().reset(at.into());
                    tick_at = Some(at);
                }
            }
            let main_w = self.main.as_ref().is_some_and(Conn::pending);
            let bind_w = self.bind.as_ref().is_some_and(Conn::pending);
            let woke = tokio::select! {
                biased;
                r = writable(self.main.as_ref()), if main_w => r.map(|()| None),
                r = writable(self.bind.as_ref()), if bind_w => r.map(|()| None),
                r = readable(self.main.as_ref()), if self.main.is_some() => r.map(|()| Some(Which::Main)),
                r = readable(self.bind.as_ref()), if self.bind.is_some() => r.map(|()| Some(Which::Bind)),
                () = &mut tick, if want_tick.is_some() => Ok(None),
                () = &mut deadline => {
                    if self.inflight > 0 && !self.shared.stopping() {
                        eprintln!(
                            "pando bench: client {}: gave up waiting for {} outstanding response(s) {DRAIN:?} after the end",
                            self.index, self.inflight
                        );
                    }
                    break;
                }
            };
            if let Some(w) = woke.map_err(|e| format!("connection {}: {e}", self.index))? {
                self.on_readable(w)?;
            }
        }
        self.close();
        Ok(())
    }

    fn conn(&mut self, w: Which) -> Option<&mut Conn> {
        match w {
            Which::Main => self.main.as_mut(),
            Which::Bind => self.bind.as_mut(),
        }
    }

    /// Starts as many operations as the slots, the schedule and the limits allow.
    fn issue(&mut self, now: Instant) {
        if !self.issuing {
            return;
        }
        if self.shared.stopping() {
            self.issuing = false;
            return;
        }
        while let Some(&slot) = self.free.last() {
            let at = match &self.sched {
                None => now,
                Some(s) => {
                    let t = s.next_at();
                    if t > now {
                        break;
                    }
                    t
                }
            };
            if at >= self.t.issue_until || self.t.end.is_some_and(|e| at >= e) {
                self.issuing = false;
                break;
            }
            let measured = at >= self.t.warmup_end;
            if measured && !self.shared.claim() {
                self.issuing = false;
                break;
            }
            let begin = match (&self.sched, self.slots.get(slot)) {
                (Some(_), Some(s)) => latency_start(at, s.free_since, now),
                _ => now,
            };
            if !self.start(slot, begin, measured) {
                // add/delete: every key of the range has been used.
                self.issuing = false;
                break;
            }
            self.free.pop();
            self.inflight += 1;
            if let Some(s) = &mut self.sched {
                s.take_due(now);
            }
        }
    }

    fn pick_kind(&mut self) -> usize {
        let ops = &self.shared.plan.ops;
        if ops.len() == 1 {
            return 0;
        }
        let r = self.rng.below(self.shared.plan.total_weight());
        ops.iter().position(|o| r < o.upto).unwrap_or(0)
    }

    /// Sends the first request of a new operation in `slot`; false when
    /// add/delete have no key left.
    fn start(&mut self, slot: usize, at: Instant, measured: bool) -> bool {
        let kind = self.pick_kind();
        let plan = &self.shared.plan;
        let op = plan.ops.get(kind).map_or(OpKind::Search, |o| o.kind);
        let key = match op {
            OpKind::Add | OpKind::Delete => match plan.keys.claim_once(&self.shared.seq) {
                Some(k) => k,
                None => return false,
            },
            _ => plan.keys.sample(&mut self.rng, &self.shared.seq),
        };
        let Some(s) = self.slots.get_mut(slot) else {
            return false;
        };
        s.kind = kind;
        s.op = op;
        s.started = at;
        s.measured = measured;
        s.key = key;
        s.entries = 0;
        s.dn.clear();
        match op {
            OpKind::Bind => self.queue_bind(slot),
            OpKind::Search | OpKind::Auth => self.send_main(slot, Step::Search),
            OpKind::Modify | OpKind::Add | OpKind::Delete => self.send_main(slot, Step::Write),
        }
        true
    }

    fn send_main(&mut self, slot: usize, step: Step) {
        let depth = self.shared.plan.depth;
        let counter = if self.slots.get(slot).is_some_and(|s| s.op == OpKind::Modify) {
            // Unique per client and operation, so every modify changes the value.
            self.counter += 1;
            self.counter * self.shared.plan.connections as u64 + self.index as u64
        } else {
            0
        };
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        s.msg_id = next_msg_id(s.msg_id, slot, depth);
        s.step = step;
        let (id, op, key) = (s.msg_id, s.op, s.key);
        let mut kb = [0u8; 20];
        let mut cb = [0u8; 20];
        let vars = [decimal(key, &mut kb), decimal(counter, &mut cb), &[][..]];
        let Some(tpl) = Client::template_of(&self.shared, op, false) else {
            return;
        };
        if let Some(c) = self.main.as_mut() {
            tpl.encode(&mut c.wbuf, id, &vars);
        }
    }

    fn template_of(shared: &Shared, op: OpKind, bind_step: bool) -> Option<&MessageTemplate> {
        let r = &shared.plan.requests;
        match (op, bind_step) {
            (OpKind::Search, _) => r.search.as_ref(),
            (OpKind::Auth, false) => r.auth_search.as_ref(),
            (OpKind::Auth, true) => r.auth_bind.as_ref(),
            (OpKind::Bind, _) => r.bind.as_ref(),
            (OpKind::Modify, _) => r.modify.as_ref(),
            (OpKind::Add, _) => r.add.as_ref(),
            (OpKind::Delete, _) => r.delete.as_ref(),
        }
    }

    fn queue_bind(&mut self, slot: usize) {
        if self.bind_busy.is_none() {
            self.send_bind(slot);
        } else {
            if let Some(s) = self.slots.get_mut(slot) {
                s.step = Step::BindQueued;
            }
            self.bind_queue.push_back(slot);
        }
    }

    fn send_bind(&mut self, slot: usize) {
        self.bind_msg_id = if self.bind_msg_id == i32::MAX {
            1
        } else {
            self.bind_msg_id + 1
        };
        self.bind_busy = Some(slot);
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        s.step = Step::Bind;
        let mut kb = [0u8; 20];
        let vars = [decimal(s.key, &mut kb), &[][..], &s.dn[..]];
        let Some(tpl) = Client::template_of(&self.shared, s.op, true) else {
            return;
        };
        if let Some(c) = self.bind.as_mut() {
            tpl.encode(&mut c.wbuf, self.bind_msg_id, &vars);
        }
    }

    fn on_readable(&mut self, w: Which) -> Result<(), String> {
        let Some(conn) = self.conn(w) else {
            return Ok(());
        };
        if !conn.read()? {
            return Ok(());
        }
        let now = Instant::now();
        let mut buf = std::mem::take(&mut conn.rbuf);
        let what = conn.what;
        let mut off = 0;
        let result = loop {
            let rest = buf.get(off..).unwrap_or_default();
            match frame_length(rest, MAX_PDU) {
                Ok(Some(n)) => {
                    if let Err(e) = self.on_frame(w, rest.get(..n).unwrap_or_default(), now) {
                        break Err(e);
                    }
                    off += n;
                }
                Ok(None) => break Ok(()),
                Err(e) => break Err(format!("{what} connection: {e}")),
            }
        };
        buf.drain(..off);
        if let Some(conn) = self.conn(w) {
            conn.rbuf = buf;
        }
        result
    }

    fn on_frame(&mut self, w: Which, frame: &[u8], now: Instant) -> Result<(), String> {
        let env = wire::envelope(frame)?;
        if env.msg_id == 0 {
            return Err(format!(
                "the server sent an unsolicited notification (result {}): {}",
                env.code
                    .map_or_else(|| "none".into(), |c| ResultCode(c).to_string()),
                wire::diagnostic(frame)
            ));
        }
        match w {
            Which::Main => self.on_main(env, frame, now),
            Which::Bind => self.on_bind(env, frame, now),
        }
    }

    fn on_main(
        &mut self,
        env: wire::Envelope<'_>,
        frame: &[u8],
        now: Instant,
    ) -> Result<(), String> {
        let depth = self.shared.plan.depth;
        let slot = (env.msg_id as usize - 1) % depth;
        let Some(s) = self.slots.get_mut(slot) else {
            return Err(format!("response to unknown message ID {}", env.msg_id));
        };
        if s.msg_id != env.msg_id || !matches!(s.step, Step::Search | Step::Write) {
            return Err(format!(
                "response 0x{:02x} with message ID {} that no request of this connection is waiting for",
                env.op, env.msg_id
            ));
        }
        match env.op {
            op_tag::SEARCH_RESULT_ENTRY => {
                s.entries += 1;
                if s.op == OpKind::Auth && s.entries == 1 {
                    s.dn.extend_from_slice(env.dn);
                }
                return Ok(());
            }
            op_tag::SEARCH_RESULT_REFERENCE | op_tag::INTERMEDIATE_RESPONSE => return Ok(()),
            _ => {}
        }
        let expected = match s.op {
            OpKind::Search | OpKind::Auth => op_tag::SEARCH_RESULT_DONE,
            OpKind::Modify => op_tag::MODIFY_RESPONSE,
            OpKind::Add => op_tag::ADD_RESPONSE,
            OpKind::Delete => op_tag::DEL_RESPONSE,
            OpKind::Bind => op_tag::BIND_RESPONSE,
        };
        let code = match env.code {
            Some(c) if env.op == expected => c,
            _ => {
                return Err(format!(
                    "{} request {} got response 0x{:02x}, expected 0x{expected:02x}",
                    s.op.name(),
                    env.msg_id,
                    env.op
                ))
            }
        };
        if s.op == OpKind::Auth && code == 0 {
            if s.entries == 0 {
                self.finish(slot, Err(ErrKey::NoEntry), frame, now);
            } else {
                self.queue_bind(slot);
            }
            return Ok(());
        }
        self.finish(
            slot,
            if code == 0 {
                Ok(())
            } else {
                Err(ErrKey::Ldap(code))
            },
            frame,
            now,
        );
        Ok(())
    }

    fn on_bind(
        &mut self,
        env: wire::Envelope<'_>,
        frame: &[u8],
        now: Instant,
    ) -> Result<(), String> {
        let (Some(slot), true) = (self.bind_busy, env.msg_id == self.bind_msg_id) else {
            return Err(format!(
                "bind connection: response with message ID {} that no request is waiting for",
                env.msg_id
            ));
        };
        let code = match (env.op, env.code) {
            (op_tag::BIND_RESPONSE, Some(c)) => c,
            _ => {
                return Err(format!(
                    "bind connection: response 0x{:02x} to a bind",
                    env.op
                ))
            }
        };
        self.bind_busy = None;
        self.finish(
            slot,
            if code == 0 {
                Ok(())
            } else {
                Err(ErrKey::Ldap(code))
            },
            frame,
            now,
        );
        if let Some(next) = self.bind_queue.pop_front() {
            self.send_bind(next);
        }
        Ok(())
    }

    /// Records an operation's outcome and frees its slot.
    fn finish(&mut self, slot: usize, outcome: Result<(), ErrKey>, frame: &[u8], now: Instant) {
        let Some(s) = self.slots.get_mut(slot) else {
            return;
        };
        let recording =
            s.measured && !self.shared.stopping() && !matches!(self.t.end, Some(e) if now >= e);
        if recording {
            let mut st = self.stats.borrow_mut();
            st.last_completion = Some(now);
            if let Some(k) = st.kinds.get_mut(s.kind) {
                match outcome {
                    Ok(()) => {
                        k.ok(now.saturating_duration_since(s.started).as_nanos() as u64);
                        if s.op == OpKind::Search {
                            k.entries += s.entries;
                            if s.entries == 0 {
                                k.empty += 1;
                            }
                        }
                    }
                    Err(e) => k.err(e),
                }
            }
        }
        if let Err(e) = outcome {
            if self.shared.errors_shown.fetch_add(1, Ordering::Relaxed) < ERRORS_SHOWN {
                let diag = match e {
                    ErrKey::Ldap(_) => wire::diagnostic(frame),
                    ErrKey::NoEntry => String::new(),
                };
                eprintln!(
                    "pando bench: {} of key {} failed: {}{}",
                    s.op.name(),
                    s.key,
                    e.describe(),
                    if diag.is_empty() {
                        String::new()
                    } else {
                        format!(": {diag}")
                    }
                );
            }
        }
        let measured = s.measured;
        s.step = Step::Free;
        s.free_since = now;
        self.free.push(slot);
        self.inflight -= 1;
        if measured {
            self.shared.finished_one();
        }
    }

    /// Says goodbye with an UnbindRequest on each connection (best effort).
    fn close(&mut self) {
        for c in [self.main.as_mut(), self.bind.as_mut()]
            .into_iter()
            .flatten()
        {
            c.wbuf.clear();
            c.wpos = 0;
            LdapMessage {
                id: i32::MAX,
                op: ProtocolOp::UnbindRequest,
                controls: vec![],
            }
            .encode(&mut c.wbuf);
            let _ = c.flush();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_map_back_to_their_slot() {
        for depth in [1usize, 2, 7, 64] {
            for slot in 0..depth {
                let mut id = 0;
                for _ in 0..100 {
                    id = next_msg_id(id, slot, depth);
                    assert!(id > 0);
                    assert_eq!((id as usize - 1) % depth, slot);
                }
            }
        }
        // Wraps before overflowing, staying on the slot.
        let id = next_msg_id(i32::MAX - 3, 2, 8);
        assert_eq!(id, 3);
    }
}
