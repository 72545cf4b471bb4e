//! Accept loops for TCP and ldapi (Unix socket) listeners.

use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pando_proto::{notice_of_disconnection, ResultCode};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{watch, Semaphore};
use tokio::task::JoinSet;

use super::connection::Connection;
use crate::config::Listener;
use crate::state::{PeerCred, Server, Session};

static NEXT_CONN: AtomicU64 = AtomicU64::new(1);

pub enum Bound {
    Tcp(TcpListener),
    Unix(UnixListener, std::path::PathBuf),
}

/// Bind every configured listener before serving, so a port in use is
/// reported at start-up rather than later.
pub async fn bind_all(listeners: &[Listener]) -> std::io::Result<Vec<Bound>> {
    let mut out = Vec::new();
    for l in listeners {
        match l {
            Listener::Tcp(addr) => {
                let tl = TcpListener::bind(addr).await.map_err(|e| {
                    std::io::Error::new(e.kind(), format!("cannot listen on {addr}: {e}"))
                })?;
                out.push(Bound::Tcp(tl));
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
                out.push(Bound::Unix(ul, path.clone()));
            }
        }
    }
    Ok(out)
}

/// Accept on `bound` until `shutdown` flips; every connection task is added
/// to `tasks` so the caller can wait for them to drain.
pub async fn serve(
    bound: Bound,
    server: Arc<Server>,
    conn_limit: Arc<Semaphore>,
    mut shutdown: watch::Receiver<bool>,
    tasks: Arc<tokio::sync::Mutex<JoinSet<()>>>,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.changed() => break,
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
            let notice = notice_of_disconnection(ResultCode::BUSY, "too many connections");
            let _ = match stream {
                Stream::Tcp(mut s) => s.write_all(&notice).await,
                Stream::Unix(mut s) => s.write_all(&notice).await,
            };
            continue;
        };
        let id = NEXT_CONN.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(conn = id, %peer, "connection accepted");
        let conn = Connection {
            server: server.clone(),
            id,
            peer,
            session: Arc::new(session),
            shutdown: shutdown.clone(),
        };
        tasks.lock().await.spawn(async move {
            match stream {
                Stream::Tcp(s) => {
                    let _ = s.set_nodelay(true);
                    conn.run(s).await
                }
                Stream::Unix(s) => conn.run(s).await,
            }
            drop(permit);
        });
    }
    if let Bound::Unix(_, path) = &bound {
        let _ = std::fs::remove_file(path);
    }
}

enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// Accept one connection: the stream, a printable peer, and the session facts.
async fn accept(bound: &Bound) -> std::io::Result<(Stream, String, Session)> {
    match bound {
        Bound::Tcp(l) => {
            let (s, a) = l.accept().await?;
            let session = Session {
                peer_ip: Some(a.ip()),
                ..Session::default()
            };
            Ok((Stream::Tcp(s), a.to_string(), session))
        }
        Bound::Unix(l, path) => {
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
