//! `pando proxy`: one LDAP address in front of several directory servers
//! (Pando or any LDAP server). Reads go to the replica in rotation with
//! the fewest operations outstanding; writes go to the active provider,
//! the first healthy one in the configured order, so that a mirror-mode
//! pair takes writes on one side at a time and moves them to the other
//! when the first fails. Operations in flight on a server that fails are
//! answered `unavailable`, never dropped. Anonymous clients' operations
//! share a few connections per server (message IDs rewritten); bound
//! clients have their own. Every message can be written out decoded.
//!
//! Layer: beside the server, above the codec, the client and `pando-web`
//! (its dashboard's HTTP). It reaches servers, Pando or not, over the
//! wire: it must not touch the server's state, store, operations or
//! replication.

mod capture;
mod client;
pub mod config;
mod csn;
mod dashboard;
mod decode_log;
pub mod frame;
mod health;
mod link;
pub mod pcap;
mod record;
mod settle;
mod tls;
mod upstream;

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{Notify, Semaphore};

pub use capture::Summary as CaptureSummary;
pub use config::{ProxyConfig, ProxyFile, UpstreamConfig};
use decode_log::DecodeLog;
use upstream::{Identity, Role, Upstream};

pub struct Proxy {
    cfg: ProxyConfig,
    upstreams: Vec<Arc<Upstream>>,
    log: Option<Arc<DecodeLog>>,
    record: Option<record::Recorder>,
    /// Where the search for the least-loaded replica starts (ties rotate).
    next_read: AtomicUsize,
    check_now: Arc<Notify>,
    /// TLS towards clients (ldaps listeners, StartTLS), when configured.
    tls: Option<tokio_rustls::TlsAcceptor>,
}

impl Proxy {
    pub fn new(cfg: ProxyConfig) -> Result<Proxy, String> {
        cfg.validate()?;
        let log = match &cfg.decode_log {
            Some(p) => Some(Arc::new(DecodeLog::open(p, cfg.decode_format == "json")?)),
            None => None,
        };
        let check_now = Arc::new(Notify::new());
        let mut password = match &cfg.credentials_file {
            Some(p) => std::fs::read(p)
                .map_err(|e| format!("proxy.credentials_file {}: {e}", p.display()))?,
            None => Vec::new(),
        };
        while matches!(password.last(), Some(b'\n' | b'\r')) {
            password.pop();
        }
        let identity = Arc::new(Identity {
            bind_dn: cfg.bind_dn.clone(),
            password,
        });
        let timeout = Duration::from_secs(cfg.timeout_secs);
        let upstreams = cfg
            .upstream
            .iter()
            .map(|u| {
                let role = if u.role == "provider" {
                    Role::Provider
                } else {
                    Role::Replica
                };
                Arc::new(Upstream::new(
                    u.url.clone(),
                    role,
                    cfg.connections,
                    timeout,
                    cfg.max_pdu_bytes,
                    log.clone(),
                    check_now.clone(),
                    identity.clone(),
                ))
            })
            .collect();
        let tls = tls::acceptor(&cfg)?;
        let record = match &cfg.record {
            Some(p) => Some(record::Recorder::open(p, cfg.record_credentials)?),
            None => None,
        };
        Ok(Proxy {
            record,
            tls,
            cfg,
            upstreams,
            log,
            next_read: AtomicUsize::new(0),
            check_now,
        })
    }

    /// Where a read goes: among the replicas in rotation that `fits`, the
    /// one with the fewest operations outstanding (ties in turn); with
    /// none, the active provider.
    fn read_target(&self, fits: impl Fn(&Upstream) -> bool) -> Option<usize> {
        let n = self.upstreams.len();
        let start = self.next_read.fetch_add(1, Ordering::Relaxed);
        let best = (0..n)
            .map(|k| (start + k) % n)
            .filter(|&i| {
                let u = &self.upstreams[i];
                u.role == Role::Replica && u.in_rotation() && fits(u)
            })
            .min_by_key(|&i| self.upstreams[i].outstanding());
        best.or_else(|| self.write_target())
    }

    fn replicas_in_rotation(&self) -> impl Iterator<Item = &Upstream> {
        self.upstreams
            .iter()
            .map(|u| &**u)
            .filter(|u| u.role == Role::Replica && u.in_rotation())
    }

    /// Whether a write's success waits for anything (read your writes, the
    /// write concern) before the client hears of it.
    fn settles_writes(&self) -> bool {
        self.cfg.read_your_writes || self.cfg.acknowledge != "none"
    }

    /// The active provider: the first healthy provider in the list.
    fn write_target(&self) -> Option<usize> {
        self.upstreams
            .iter()
            .position(|u| u.role == Role::Provider && u.is_healthy())
    }

    /// One line per server: role, state, operations sent.
    fn status(&self) -> String {
        let mut out = String::new();
        for u in &self.upstreams {
            let state = if u.in_rotation() {
                "in rotation".to_string()
            } else {
                format!(
                    "out ({})",
                    u.why.lock().map(|w| w.clone()).unwrap_or_default()
                )
            };
            out.push_str(&format!(
                "  {} {:?}: {state}, {} operations sent\n",
                u.url,
                u.role,
                u.served.load(Ordering::Relaxed)
            ));
        }
        out
    }
}

enum Listener {
    /// `true`: ldaps (TLS from the first byte).
    Tcp(TcpListener, bool),
    Unix(UnixListener, std::path::PathBuf),
}

async fn bind(url: &str) -> Result<Listener, String> {
    if let Some(path) = url.strip_prefix("ldapi://") {
        let path = std::path::PathBuf::from(path);
        // A socket left by an earlier run; anything else is not removed.
        use std::os::unix::fs::FileTypeExt;
        if let Ok(m) = std::fs::symlink_metadata(&path) {
            if m.file_type().is_socket() {
                let _ = std::fs::remove_file(&path);
            }
        }
        let l = UnixListener::bind(&path).map_err(|e| format!("cannot listen on {url}: {e}"))?;
        return Ok(Listener::Unix(l, path));
    }
    let (rest, ldaps) = match (url.strip_prefix("ldap://"), url.strip_prefix("ldaps://")) {
        (Some(r), _) => (r, false),
        (_, Some(r)) => (r, true),
        _ => {
            return Err(format!(
                "cannot listen on {url}: ldap://, ldaps:// or ldapi:// only"
            ))
        }
    };
    let l = TcpListener::bind(rest.trim_end_matches('/'))
        .await
        .map_err(|e| format!("cannot listen on {url}: {e}"))?;
    Ok(Listener::Tcp(l, ldaps))
}

async fn accept_loop(
    proxy: Arc<Proxy>,
    listener: Listener,
    next: Arc<AtomicU64>,
    slots: Arc<Semaphore>,
) {
    loop {
        let id = next.fetch_add(1, Ordering::Relaxed);
        match &listener {
            Listener::Tcp(l, ldaps) => match l.accept().await {
                Ok((s, peer)) => {
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        tracing::warn!(%peer, "max_connections reached: connection closed");
                        continue;
                    };
                    let _ = s.set_nodelay(true);
                    let (p, ldaps) = (proxy.clone(), *ldaps);
                    tokio::spawn(async move {
                        client::serve_tcp(p, s, id, ldaps).await;
                        drop(slot);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Listener::Unix(l, _) => match l.accept().await {
                Ok((s, _)) => {
                    let Ok(slot) = slots.clone().try_acquire_owned() else {
                        tracing::warn!("max_connections reached: connection closed");
                        continue;
                    };
                    let p = proxy.clone();
                    tokio::spawn(async move {
                        client::serve(p, Box::new(s), id, Vec::new(), false).await;
                        drop(slot);
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Listen, check the servers, and relay until SIGINT or SIGTERM.
pub async fn run(cfg: ProxyConfig) -> Result<(), String> {
    let proxy = Arc::new(Proxy::new(cfg)?);
    let mut listeners = Vec::new();
    for url in &proxy.cfg.listen {
        listeners.push(bind(url).await?);
    }
    let dashboard = match &proxy.cfg.dashboard_listen {
        Some(a) => Some(
            TcpListener::bind(a)
                .await
                .map_err(|e| format!("proxy.dashboard_listen: cannot listen on {a}: {e}"))?,
        ),
        None => None,
    };
    tokio::spawn(health::run(proxy.clone()));
    // The first check decides where the first requests go.
    for _ in 0..(proxy.cfg.timeout_secs * 20 + 20) {
        if proxy.upstreams.iter().all(|u| {
            !u.why
                .lock()
                .map(|w| w.as_str() == "not checked yet")
                .unwrap_or(false)
        }) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    println!("pando proxy is relaying:");
    for url in &proxy.cfg.listen {
        println!("  {url}");
    }
    println!("to:\n{}", proxy.status().trim_end());
    let next = Arc::new(AtomicU64::new(1));
    let slots = Arc::new(Semaphore::new(proxy.cfg.max_connections));
    if let Some(l) = dashboard {
        if let Ok(a) = l.local_addr() {
            println!("dashboard: http://{a}/dashboard");
        }
        tokio::spawn(dashboard::serve(proxy.clone(), l, slots.clone()));
    }
    let mut paths = Vec::new();
    for l in listeners {
        if let Listener::Unix(_, p) = &l {
            paths.push(p.clone());
        }
        tokio::spawn(accept_loop(proxy.clone(), l, next.clone(), slots.clone()));
    }
    wait_for_signal().await;
    for p in paths {
        let _ = std::fs::remove_file(p);
    }
    tracing::info!("pando proxy stopping:\n{}", proxy.status());
    Ok(())
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let Ok(mut term) = signal(SignalKind::terminate()) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
}

/// Read LDAP out of a packet capture (the server on `port`): the decode
/// log and the record as `[proxy]` configures them (`decode_log`,
/// `decode_format`, `record`, `record_credentials`).
pub fn read_capture(
    path: &std::path::Path,
    port: u16,
    cfg: &ProxyConfig,
) -> Result<CaptureSummary, String> {
    let log = match &cfg.decode_log {
        Some(p) => Some(DecodeLog::open(p, cfg.decode_format == "json")?),
        None => None,
    };
    let record = match &cfg.record {
        Some(p) => Some(record::Recorder::open(p, cfg.record_credentials)?),
        None => None,
    };
    capture::read(path, port, log.as_ref(), record.as_ref())
}
