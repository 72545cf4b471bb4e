//! A server behind the proxy: its role, whether it is in rotation, how
//! many operations it has outstanding, and the connections anonymous
//! clients share to it.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use pando_client::{Client, Endpoint};
use pando_proto::{BindAuth, BindRequest, ProtocolOp, ResultCode};
use tokio::sync::Notify;

use crate::csn::{self, Csns};
use crate::decode_log::DecodeLog;
use crate::link::{Link, Peer};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    Provider,
    Replica,
}

/// Who the proxy's own questions (health, contextCSN) are asked as.
pub struct Identity {
    pub bind_dn: String,
    pub password: Vec<u8>,
}

impl std::fmt::Debug for Identity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Identity")
            .field("bind_dn", &self.bind_dn)
            .finish_non_exhaustive()
    }
}

/// What the proxy last learned of a server's contextCSN, and when.
struct Known {
    base: String,
    csns: Csns,
    at: Option<Instant>,
}

/// A server behind the proxy.
pub struct Upstream {
    pub url: String,
    pub role: Role,
    /// Answered the last health check (and no connection failed since).
    healthy: AtomicBool,
    /// Behind the active provider by more than `max_lag_secs`.
    lagging: AtomicBool,
    /// Operations sent and not yet finished, over every link.
    outstanding: AtomicUsize,
    /// Operations sent to it since the start.
    pub served: AtomicU64,
    /// Shared links (anonymous), at most `connections`.
    shared: tokio::sync::Mutex<Vec<Arc<Link>>>,
    /// Every link to it, shared or a client's own (to answer their
    /// operations when it stops answering).
    links: Mutex<Vec<Weak<Link>>>,
    next_shared: AtomicUsize,
    connections: usize,
    timeout: Duration,
    max_pdu: usize,
    log: Option<Arc<DecodeLog>>,
    /// Why it is out of rotation (for the log and the status line).
    pub why: Mutex<String>,
    /// Wakes the health checker at once (a connection failed).
    pub check_now: Arc<Notify>,
    identity: Arc<Identity>,
    known: Mutex<Known>,
    /// The connection contextCSN is read on between health checks.
    control: tokio::sync::Mutex<Option<Client>>,
}

impl Upstream {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        url: String,
        role: Role,
        connections: usize,
        timeout: Duration,
        max_pdu: usize,
        log: Option<Arc<DecodeLog>>,
        check_now: Arc<Notify>,
        identity: Arc<Identity>,
    ) -> Upstream {
        Upstream {
            url,
            role,
            // Out of rotation until the first check says otherwise.
            healthy: AtomicBool::new(false),
            lagging: AtomicBool::new(false),
            outstanding: AtomicUsize::new(0),
            served: AtomicU64::new(0),
            shared: tokio::sync::Mutex::new(Vec::new()),
            links: Mutex::new(Vec::new()),
            next_shared: AtomicUsize::new(0),
            connections,
            timeout,
            max_pdu,
            log,
            why: Mutex::new("not checked yet".into()),
            check_now,
            identity,
            known: Mutex::new(Known {
                base: String::new(),
                csns: Csns::new(),
                at: None,
            }),
            control: tokio::sync::Mutex::new(None),
        }
    }

    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Acquire)
    }

    /// Healthy and not lagging: reads may go to it.
    pub fn in_rotation(&self) -> bool {
        self.is_healthy() && !self.lagging.load(Ordering::Acquire)
    }

    pub fn outstanding(&self) -> usize {
        self.outstanding.load(Ordering::Relaxed)
    }

    /// The health checker's verdict; transitions are logged. A server that
    /// failed its check has its waiting operations answered.
    pub fn set_health(&self, healthy: bool, lagging: bool, why: &str) {
        if !healthy {
            self.abort_links(why);
        }
        self.store_health(healthy, lagging, why);
    }

    fn store_health(&self, healthy: bool, lagging: bool, why: &str) {
        let was = self.in_rotation();
        self.healthy.store(healthy, Ordering::Release);
        self.lagging.store(lagging, Ordering::Release);
        let now = self.in_rotation();
        if let Ok(mut w) = self.why.lock() {
            *w = why.to_string();
        }
        if was && !now {
            tracing::warn!(upstream = %self.url, why, "out of rotation");
        } else if !was && now {
            tracing::info!(upstream = %self.url, "in rotation");
        }
    }

    /// The endpoint of a connection (bound, when at all, by the caller).
    pub fn endpoint(&self) -> Endpoint {
        Endpoint {
            url: self.url.clone(),
            bind_method: "none".into(),
            bind_dn: String::new(),
            credentials: None,
            credentials_file: None,
            start_tls: false,
            tls_ca_file: None,
            tls_cert_file: None,
            tls_key_file: None,
            keepalive_secs: 60,
            timeout_secs: self.timeout.as_secs().max(1),
        }
    }

    /// A connection, not bound. A server that cannot be reached leaves
    /// the rotation at once.
    pub async fn connect(&self) -> Result<Client, String> {
        match Client::connect(&self.endpoint(), self.max_pdu).await {
            Ok(c) => Ok(c),
            Err(e) => {
                self.suspect(&e.0);
                Err(e.0)
            }
        }
    }

    /// Relay messages over a connection from [`Upstream::connect`].
    pub fn link(self: &Arc<Self>, client: Client) -> Arc<Link> {
        let (stream, buf, next) = client.into_parts();
        let link = Link::start(
            self.clone(),
            stream,
            buf,
            next,
            self.log.clone(),
            self.max_pdu,
        );
        if let Ok(mut all) = self.links.lock() {
            all.retain(|w| w.upgrade().is_some_and(|l| l.is_alive()));
            all.push(Arc::downgrade(&link));
        }
        link
    }

    /// It stopped answering: the operations waiting on its connections
    /// are answered `unavailable` and the connections closed.
    fn abort_links(&self, why: &str) {
        let all: Vec<Arc<Link>> = match self.links.lock() {
            Ok(mut l) => l.drain(..).filter_map(|w| w.upgrade()).collect(),
            Err(_) => return,
        };
        for link in all {
            link.abort(why.to_string());
        }
    }

    /// A simple bind on a connection of the proxy's: the result code and
    /// diagnostic the server answered.
    pub async fn bind_as(
        c: &mut Client,
        dn: &str,
        password: &[u8],
    ) -> Result<(ResultCode, String), String> {
        let op = ProtocolOp::BindRequest(BindRequest {
            version: 3,
            name: dn.to_string(),
            auth: BindAuth::Simple(password.to_vec()),
        });
        c.send(op, Vec::new()).await.map_err(|e| e.0)?;
        match c.recv(Some(c.timeout())).await.map_err(|e| e.0)?.op {
            ProtocolOp::BindResponse(r) => Ok((r.result.code, r.result.message)),
            other => Err(format!("answered a bind with message type {}", other.tag())),
        }
    }

    /// Bind a connection of the proxy's own as its identity (if any).
    pub async fn bind_control(&self, c: &mut Client) -> Result<(), String> {
        let id = &self.identity;
        if id.bind_dn.is_empty() {
            return Ok(());
        }
        match Self::bind_as(c, &id.bind_dn, &id.password).await? {
            (ResultCode::SUCCESS, _) => Ok(()),
            (code, diag) => Err(format!(
                "the proxy's bind as {} failed: {} ({}) {diag}",
                id.bind_dn,
                code.0,
                code.name()
            )),
        }
    }

    /// A health check's reading of its contextCSN (at `base`).
    pub fn learned(&self, base: &str, csns: Csns) {
        if let Ok(mut k) = self.known.lock() {
            k.base = base.to_string();
            k.csns = csns;
            k.at = Some(Instant::now());
        }
    }

    /// Its contextCSN as last read, and how long ago.
    pub fn known(&self) -> (Csns, Option<Duration>) {
        match self.known.lock() {
            Ok(k) => (k.csns.clone(), k.at.map(|t| t.elapsed())),
            Err(_) => (Csns::new(), None),
        }
    }

    /// Its contextCSN now (read again unless read within `fresh`), on the
    /// proxy's own connection; concurrent callers share one reading.
    pub async fn context_csns(&self, fresh: Duration) -> Result<Csns, String> {
        let mut control = self.control.lock().await;
        let (known, age) = self.known();
        if age.is_some_and(|a| a <= fresh) {
            return Ok(known);
        }
        let base = self
            .known
            .lock()
            .map(|k| k.base.clone())
            .unwrap_or_default();
        if base.is_empty() {
            return Err(format!(
                "{}: no naming context known to read contextCSN at",
                self.url
            ));
        }
        for attempt in 0..2 {
            if control.is_none() {
                let mut c = self.connect().await?;
                self.bind_control(&mut c).await?;
                *control = Some(c);
            }
            let Some(c) = control.as_mut() else { break };
            match csn::read(c, &base, "contextCSN").await {
                Ok(values) => {
                    let csns = csn::from_values(&values);
                    self.learned(&base, csns.clone());
                    return Ok(csns);
                }
                Err(e) if attempt == 1 => return Err(e),
                Err(_) => *control = None,
            }
        }
        Err(format!("{}: contextCSN could not be read", self.url))
    }

    /// One of the shared links, opened when fewer than `connections` live.
    pub async fn shared(self: &Arc<Self>) -> Result<Arc<Link>, String> {
        let mut links = self.shared.lock().await;
        links.retain(|l| l.is_alive());
        if links.len() < self.connections {
            let link = self.link(self.connect().await?);
            links.push(link.clone());
            return Ok(link);
        }
        let i = self.next_shared.fetch_add(1, Ordering::Relaxed) % links.len();
        Ok(links[i].clone())
    }
}

impl Peer for Upstream {
    fn url(&self) -> &str {
        &self.url
    }

    fn started(&self) {
        self.outstanding.fetch_add(1, Ordering::Relaxed);
        self.served.fetch_add(1, Ordering::Relaxed);
    }

    fn finished(&self) {
        let _ = self
            .outstanding
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }

    /// Out of rotation now, checked again at once (its other connections
    /// stay: the failure may be one connection's, an idle timeout say).
    fn suspect(&self, why: &str) {
        self.store_health(false, self.lagging.load(Ordering::Acquire), why);
        self.check_now.notify_one();
    }
}
