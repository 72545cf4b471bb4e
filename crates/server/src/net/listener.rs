//! Accept loops for TCP, LDAPS and ldapi (Unix socket) listeners.

use std::collections::HashMap;
use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pando_proto::{notice_of_disconnection, ResultCode};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};

use super::connection::Connection;
use pando_access::{PeerCred, Session};
use pando_config::Listener;

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

pub enum Bound {
    Tcp(TcpListener),
    /// TLS from the first byte.
    Ldaps(TcpListener),
    /// The socket path, and whether this process created it (and removes
    /// it at shutdown) rather than receiving it from systemd.
    Unix(UnixListener, std::path::PathBuf, bool),
}

/// Open connections per client address (`limits.max_connections_per_ip`),
/// shared by every TCP listener; ldapi connections are not counted.
pub struct PerIpLimit {
    /// 0 = no limit; changes while serving (connections over a lowered
    /// limit stay open).
    max: std::sync::atomic::AtomicUsize,
    counts: Mutex<HashMap<IpAddr, usize>>,
}

/// One counted connection; dropping it (when the connection ends) gives
/// the slot back.
pub struct IpSlot {
    limit: Arc<PerIpLimit>,
    ip: IpAddr,
}

impl PerIpLimit {
    pub fn new(max: usize) -> Arc<PerIpLimit> {
        Arc::new(PerIpLimit {
            max: std::sync::atomic::AtomicUsize::new(max),
            counts: Mutex::new(HashMap::new()),
        })
    }

    pub fn set_max(&self, max: usize) {
        self.max.store(max, std::sync::atomic::Ordering::Relaxed);
    }

    /// A slot for `ip`, or None when it already has `max` connections.
    /// IPv4-mapped IPv6 addresses count as the IPv4 address.
    pub fn try_acquire(self: &Arc<Self>, ip: IpAddr) -> Option<IpSlot> {
        let ip = ip.to_canonical();
        let mut counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        let n = counts.entry(ip).or_insert(0);
        let max = self.max.load(std::sync::atomic::Ordering::Relaxed);
        if max > 0 && *n >= max {
            return None;
        }
        *n += 1;
        Some(IpSlot {
            limit: self.clone(),
            ip,
        })
    }

    /// Connections currently counted for `ip`.
    pub fn count(&self, ip: IpAddr) -> usize {
        let counts = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        counts.get(&ip.to_canonical()).copied().unwrap_or(0)
    }
}

impl Drop for IpSlot {
    fn drop(&mut self) {
        let mut counts = self.limit.counts.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = counts.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                counts.remove(&self.ip);
            }
        }
    }
}

/// Bind every configured listener before serving, so a port in use is
/// reported at start-up rather than later.
pub fn bind_all(listeners: &[Listener]) -> std::io::Result<Vec<Bound>> {
    listeners.iter().map(bind_one).collect()
}

/// Bind one listener (inside the runtime: the socket is registered with it).
pub fn bind_one(l: &Listener) -> std::io::Result<Bound> {
    match l {
        Listener::Tcp(addr) | Listener::Ldaps(addr) => {
            let named = |e: std::io::Error| {
                std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}"))
            };
            let std_listener = std::net::TcpListener::bind(addr).map_err(named)?;
            std_listener.set_nonblocking(true).map_err(named)?;
            let tl = TcpListener::from_std(std_listener).map_err(named)?;
            Ok(match l {
                Listener::Ldaps(_) => Bound::Ldaps(tl),
                _ => Bound::Tcp(tl),
            })
        }
        Listener::Ldapi(path) => {
            // A socket file left by an earlier run is replaced; anything
            // else at that path is not touched.
            if let Ok(meta) = std::fs::symlink_metadata(path) {
                use std::os::unix::fs::FileTypeExt;
                if meta.file_type().is_socket() {
                    std::fs::remove_file(path)?;
                }
            }
            let ul = UnixListener::bind(path).map_err(|e| {
                std::io::Error::new(
                    e.kind(),
                    format!("cannot listen on {}: {e}", path.display()),
                )
            })?;
            // Reachable by anyone who can reach the data directory; who
            // may do what is decided per identity, not by file mode.
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o666))?;
            Ok(Bound::Unix(ul, path.clone(), true))
        }
    }
}

/// What every accept loop shares besides its socket.
#[derive(Clone)]
pub struct AcceptCtx {
    pub conn_limit: Arc<Semaphore>,
    pub per_ip: Arc<PerIpLimit>,
    /// Flips at shutdown: accept loops and connections end.
    pub shutdown: watch::Receiver<bool>,
    /// The threads connections are served on.
    pub shards: Arc<super::shards::Shards>,
}

/// The accept loops running. Listeners configured with `listen` can be
/// added and removed while serving (a removed listener stops accepting;
/// its connections go on). Sockets passed by systemd are not managed.
#[derive(Default)]
pub struct Listeners {
    state: Mutex<ListenerState>,
}

#[derive(Default)]
struct ListenerState {
    ctx: Option<AcceptCtx>,
    /// Sockets came from systemd: `listen` is not used.
    from_systemd: bool,
    /// Each loop: its configured listener (None from systemd), the switch
    /// that stops it, its task.
    running: Vec<(
        Option<Listener>,
        watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    )>,
    /// The metrics endpoint (`metrics.listen`), when on.
    metrics: Option<(
        std::net::SocketAddr,
        watch::Sender<bool>,
        tokio::task::JoinHandle<()>,
    )>,
}

impl Listeners {
    /// Start accepting on `bound` (paired with their configured listener,
    /// or None for sockets from systemd).
    pub fn start(
        &self,
        live: &Arc<dyn crate::net::frontend::Serving>,
        ctx: AcceptCtx,
        bound: Vec<(Option<Listener>, Bound)>,
    ) {
        {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            st.from_systemd = bound.iter().any(|(l, _)| l.is_none());
            st.ctx = Some(ctx);
        }
        for (l, b) in bound {
            self.spawn(live, l, b);
        }
    }

    /// Whether `listen` decides the listeners (not systemd).
    pub fn managed(&self) -> bool {
        !self
            .state
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .from_systemd
    }

    /// Accept on `b` too.
    pub fn spawn(
        &self,
        live: &Arc<dyn crate::net::frontend::Serving>,
        l: Option<Listener>,
        b: Bound,
    ) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some(ctx) = st.ctx.clone() else { return };
        let (stop_tx, stop_rx) = watch::channel(false);
        if let Some(l) = &l {
            tracing::info!(url = %l.url(), "listening");
        }
        let task = tokio::spawn(serve(b, live.clone(), ctx, stop_rx));
        st.running.push((l, stop_tx, task));
    }

    /// Stop accepting on `l` (its connections go on).
    pub fn stop(&self, l: &Listener) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = st
            .running
            .iter()
            .position(|(x, _, _)| x.as_ref() == Some(l))
        {
            let (_, stop, _) = st.running.remove(i);
            let _ = stop.send(true);
            tracing::info!(url = %l.url(), "no longer listening");
        }
    }

    /// Serve the metrics endpoint on the listener bound at `addr` instead
    /// of any earlier one; None turns it off. (After [`Listeners::start`].)
    pub fn set_metrics(
        &self,
        live: &Arc<dyn crate::net::frontend::Serving>,
        endpoint: Option<(std::net::SocketAddr, TcpListener)>,
    ) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((addr, stop, _)) = st.metrics.take() {
            let _ = stop.send(true);
            tracing::info!("metrics endpoint on {addr} closed");
        }
        let Some((addr, l)) = endpoint else { return };
        let Some(shutdown) = st.ctx.as_ref().map(|c| c.shutdown.clone()) else {
            return;
        };
        let (stop_tx, stop_rx) = watch::channel(false);
        let tls_now: crate::observe::prometheus::TlsNow = {
            let live = live.clone();
            Arc::new(move || live.frontend().tls())
        };
        let task = tokio::spawn(crate::observe::prometheus::serve(
            l,
            live.clone(),
            tls_now,
            shutdown,
            stop_rx,
        ));
        st.metrics = Some((addr, stop_tx, task));
    }

    /// Wait for every accept loop to end (after the shutdown switch).
    pub async fn join_all(&self) {
        let tasks: Vec<_> = {
            let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
            // The connection threads stop once their connections ended.
            st.ctx = None;
            let metrics = st.metrics.take().map(|(_, _, t)| t);
            st.running
                .drain(..)
                .map(|(_, _, t)| t)
                .chain(metrics)
                .collect()
        };
        for t in tasks {
            let _ = t.await;
        }
    }
}

/// Sockets handed over by systemd socket activation (the `sd_listen_fds`
/// protocol: `LISTEN_PID` is this process, `LISTEN_FDS` sockets from fd 3,
/// optional `LISTEN_FDNAMES`). A socket named `ldaps` serves LDAPS; other
/// TCP sockets serve LDAP, Unix sockets ldapi. None when not activated.
pub fn from_systemd() -> std::io::Result<Option<Vec<Bound>>> {
    use std::os::fd::FromRawFd;
    const FIRST_FD: i32 = 3;
    let pid_matches = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == std::process::id());
    let Some(n) = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse::<i32>().ok())
        .filter(|n| pid_matches && *n > 0)
    else {
        return Ok(None);
    };
    if n > 64 {
        return Err(std::io::Error::other(format!(
            "LISTEN_FDS={n}: more sockets than a directory server listens on"
        )));
    }
    let names: Vec<String> = std::env::var("LISTEN_FDNAMES")
        .map(|s| s.split(':').map(str::to_string).collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for i in 0..n {
        let fd = FIRST_FD + i;
        let name = names.get(i as usize).map(String::as_str).unwrap_or("");
        // SAFETY: an all-zero sockaddr_storage is valid; getsockname fills
        // at most `len` bytes of it.
        let family = unsafe {
            let mut ss: libc::sockaddr_storage = std::mem::zeroed();
            let mut len = std::mem::size_of::<libc::sockaddr_storage>() as libc::socklen_t;
            if libc::getsockname(
                fd,
                (&mut ss as *mut libc::sockaddr_storage).cast(),
                &mut len,
            ) != 0
            {
                return Err(std::io::Error::other(format!(
                    "LISTEN_FDS: fd {fd} is not a socket: {}",
                    std::io::Error::last_os_error()
                )));
            }
            libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC);
            ss.ss_family as i32
        };
        match family {
            libc::AF_UNIX => {
                // SAFETY: systemd passed this descriptor to this process for
                // its exclusive use; nothing else owns it.
                let std_l = unsafe { std::os::unix::net::UnixListener::from_raw_fd(fd) };
                std_l.set_nonblocking(true)?;
                let path = std_l
                    .local_addr()?
                    .as_pathname()
                    .map(|p| p.to_path_buf())
                    .unwrap_or_else(|| format!("systemd-fd-{fd}").into());
                out.push(Bound::Unix(UnixListener::from_std(std_l)?, path, false));
            }
            libc::AF_INET | libc::AF_INET6 => {
                // SAFETY: as above.
                let std_l = unsafe { std::net::TcpListener::from_raw_fd(fd) };
                std_l.set_nonblocking(true)?;
                let l = TcpListener::from_std(std_l)?;
                out.push(if name == "ldaps" {
                    Bound::Ldaps(l)
                } else {
                    Bound::Tcp(l)
                });
            }
            other => {
                return Err(std::io::Error::other(format!(
                    "LISTEN_FDS: fd {fd} has address family {other}, not TCP or Unix"
                )))
            }
        }
    }
    Ok(Some(out))
}

/// Accept on `bound` until `shutdown` (or `stop`, for this listener
/// alone) flips. Each connection task holds a
/// permit of `conn_limit` until it ends, so the caller waits for all of
/// them to drain by taking every permit back; nothing else is kept per
/// connection once it ended (memory returns to the baseline after any
/// number of connections).
async fn serve(
    bound: Bound,
    live: Arc<dyn crate::net::frontend::Serving>,
    ctx: AcceptCtx,
    mut stop: watch::Receiver<bool>,
) {
    let AcceptCtx {
        conn_limit,
        per_ip,
        shutdown,
        shards,
    } = ctx;
    let mut closing = shutdown.clone();
    let ldaps = matches!(bound, Bound::Ldaps(_));
    loop {
        let accepted = tokio::select! {
            _ = closing.changed() => break,
            _ = stop.changed() => break,
            a = accept(&bound) => a,
        };
        let (stream, peer, session) = match accepted {
            Ok(x) => x,
            Err(e) => {
                // Out of file descriptors and similar: back off rather than spin.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = conn_limit.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "connection refused: limits.max_connections reached");
            refuse(stream, ldaps, "too many connections").await;
            continue;
        };
        let ip_slot = match session.peer_ip {
            Some(ip) => match per_ip.try_acquire(ip) {
                Some(slot) => Some(slot),
                None => {
                    tracing::warn!(%peer, "connection refused: limits.max_connections_per_ip reached");
                    refuse(stream, ldaps, "too many connections from your address").await;
                    continue;
                }
            },
            None => None,
        };
        let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(conn = id, %peer, "connection accepted");
        let conn = Connection {
            server: live.server(),
            live: live.clone(),
            id,
            peer,
            session: Arc::new(session),
            shutdown: shutdown.clone(),
        };
        // Off this loop's event loop, onto the connection's own thread.
        let stream = match stream.into_std() {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(conn = id, peer = %conn.peer, error = %e, "connection lost while handed over");
                continue;
            }
        };
        let peer_ip = conn.session.peer_ip;
        shards.spawn(peer_ip, move || async move {
            serve_connection(conn, stream, ldaps).await;
            drop(ip_slot);
            drop(permit);
        });
    }
    if let Bound::Unix(_, path, true) = &bound {
        let _ = std::fs::remove_file(path);
    }
}

/// Serve one connection on the thread it was given to: its socket joins
/// that thread's event loop here.
async fn serve_connection(conn: Connection, stream: StdStream, ldaps: bool) {
    let registered = match stream {
        StdStream::Tcp(s) => tokio::net::TcpStream::from_std(s).map(Stream::Tcp),
        StdStream::Unix(s) => tokio::net::UnixStream::from_std(s).map(Stream::Unix),
    };
    match registered {
        Ok(Stream::Tcp(s)) if ldaps => {
            let _ = s.set_nodelay(true);
            run_ldaps(conn, s).await
        }
        Ok(Stream::Tcp(s)) => {
            let _ = s.set_nodelay(true);
            conn.run(s).await
        }
        Ok(Stream::Unix(s)) => conn.run(s).await,
        Err(e) => {
            tracing::warn!(conn = conn.id, peer = %conn.peer, error = %e, "connection not served")
        }
    }
}

/// Handshake (bounded by the TLS handshake timeout, and holding the
/// connection's slots meanwhile), then serve LDAP over TLS.
async fn run_ldaps(mut conn: Connection, s: tokio::net::TcpStream) {
    let Some(tls) = conn.live.frontend().tls() else {
        // Configuration validation makes ldaps listeners need [tls].
        tracing::error!(conn = conn.id, "ldaps connection but TLS is not configured");
        return;
    };
    match tls.accept(s).await {
        Ok(h) => {
            conn.session = Arc::new(Session {
                tls: true,
                client_cert_dn: h.client_cert_dn,
                ..(*conn.session).clone()
            });
            tracing::debug!(conn = conn.id, client_cert = ?conn.session.client_cert_dn, "TLS established");
            conn.run(h.stream).await
        }
        Err(e) => e.log(conn.id, &conn.peer),
    }
}

/// Turn a connection away: a Notice of Disconnection (busy) in clear, except
/// on ldaps where the client expects a TLS handshake, so it is just closed.
async fn refuse(stream: Stream, ldaps: bool, why: &str) {
    let notice = notice_of_disconnection(ResultCode::BUSY, why);
    let _ = match stream {
        Stream::Tcp(_) if ldaps => Ok(()),
        Stream::Tcp(mut s) => s.write_all(&notice).await,
        Stream::Unix(mut s) => s.write_all(&notice).await,
    };
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// An accepted socket between two event loops.
enum StdStream {
    Tcp(std::net::TcpStream),
    Unix(std::os::unix::net::UnixStream),
}

impl Stream {
    fn into_std(self) -> std::io::Result<StdStream> {
        Ok(match self {
            Stream::Tcp(s) => StdStream::Tcp(s.into_std()?),
            Stream::Unix(s) => StdStream::Unix(s.into_std()?),
        })
    }
}

/// Accept one connection: the stream, a printable peer, and the session facts.
async fn accept(bound: &Bound) -> std::io::Result<(Stream, String, Session)> {
    match bound {
        Bound::Tcp(l) | Bound::Ldaps(l) => {
            let (s, a) = l.accept().await?;
            let session = Session {
                peer_ip: Some(a.ip()),
                ..Session::default()
            };
            Ok((Stream::Tcp(s), a.to_string(), session))
        }
        Bound::Unix(l, path, _) => {
            let (s, _) = l.accept().await?;
            let cred = s.peer_cred().ok().map(|c| PeerCred {
                uid: c.uid(),
                gid: c.gid(),
            });
            let who = match cred {
                Some(c) => format!("ldapi:{} uid={} gid={}", path.display(), c.uid, c.gid),
                None => format!("ldapi:{}", path.display()),
            };
            let session = Session {
                peer_cred: cred,
                ..Session::default()
            };
            Ok((Stream::Unix(s), who, session))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_ip_slots_are_counted_and_given_back() {
        let limit = PerIpLimit::new(2);
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let mapped: IpAddr = "::ffff:127.0.0.1".parse().unwrap();
        let b: IpAddr = "::1".parse().unwrap();
        let s1 = limit.try_acquire(a).unwrap();
        let s2 = limit.try_acquire(mapped).unwrap();
        assert!(limit.try_acquire(a).is_none(), "a third from one address");
        let s3 = limit.try_acquire(b).unwrap();
        assert_eq!(limit.count(a), 2);
        drop(s1);
        assert_eq!(limit.count(a), 1);
        let s4 = limit.try_acquire(a).unwrap();
        drop((s2, s3, s4));
        assert_eq!(limit.count(a), 0);
        assert!(limit.counts.lock().unwrap().is_empty());
        // 0 = no limit.
        let none = PerIpLimit::new(0);
        let slots: Vec<_> = (0..100).map(|_| none.try_acquire(a).unwrap()).collect();
        assert_eq!(none.count(a), 100);
        drop(slots);
    }
}
