//! The proxy's live dashboard (`dashboard_listen`): second by second, each
//! server's state (in rotation, lagging, down, and why), whether it takes
//! the writes, the operations sent to it and those outstanding, and the
//! client connections; a server's change of state is the second's event
//! (marked on the charts and listed). The last hour is kept in memory.
//! The page and its assets are in the binary (`pando_web`).

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::Serialize;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::upstream::Role;
use crate::Proxy;

const PAGE: &[u8] = include_bytes!("../assets/dashboard.html");
const SCRIPT: &[u8] = include_bytes!("../assets/proxy.js");
/// Seconds kept: the last hour.
const KEEP: usize = 3600;

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct ServerSecond {
    pub url: String,
    pub role: &'static str,
    /// `in rotation`, `lagging` or `down`.
    pub state: &'static str,
    /// The active provider: writes go to it.
    pub writes: bool,
    /// Operations sent to it in the second, and outstanding at its end.
    pub ops: u64,
    pub outstanding: usize,
    /// Why it is out of rotation ("" when in).
    pub why: String,
}

#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct Second {
    pub t: u64,
    pub clients: usize,
    pub ops: u64,
    pub servers: Vec<ServerSecond>,
    /// Servers that changed state, writes that moved.
    pub events: Vec<String>,
}

/// The last hour, and each server's count of operations at the last tick.
#[derive(Default)]
pub struct Board {
    seconds: Mutex<VecDeque<Second>>,
    totals: Mutex<Vec<u64>>,
}

impl Board {
    /// Close a second: what each server did since the one before.
    fn tick(&self, proxy: &Proxy, clients: usize, now: u64) {
        let Ok(mut seconds) = self.seconds.lock() else {
            return;
        };
        let before = seconds.back();
        let active = proxy.write_target();
        let (mut servers, mut events, mut totals) = (Vec::new(), Vec::new(), Vec::new());
        for (i, u) in proxy.upstreams.iter().enumerate() {
            let served = u.served.load(Ordering::Relaxed);
            let state = match (u.is_healthy(), u.in_rotation()) {
                (false, _) => "down",
                (true, false) => "lagging",
                (true, true) => "in rotation",
            };
            let why = match state {
                "in rotation" => String::new(),
                _ => u.why.lock().map(|w| w.clone()).unwrap_or_default(),
            };
            let prev = before.and_then(|b| b.servers.get(i));
            if let Some(p) = prev.filter(|p| p.state != state) {
                events.push(match state {
                    "in rotation" => format!("{}: back in rotation (was {})", u.url, p.state),
                    _ => format!("{}: {state} ({why})", u.url),
                });
            }
            let writes = active == Some(i);
            if writes && prev.is_some_and(|p| !p.writes) {
                events.push(format!("writes moved to {}", u.url));
            }
            let last = self.totals.lock().ok().and_then(|t| t.get(i).copied());
            servers.push(ServerSecond {
                url: u.url.clone(),
                role: match u.role {
                    Role::Provider => "provider",
                    Role::Replica => "replica",
                },
                state,
                writes,
                ops: served.saturating_sub(last.unwrap_or(served)),
                outstanding: u.outstanding(),
                why,
            });
            totals.push(served);
        }
        if active.is_none() && before.is_some_and(|b| b.servers.iter().any(|s| s.writes)) {
            events.push("no provider takes writes".to_string());
        }
        if let Ok(mut t) = self.totals.lock() {
            *t = totals;
        }
        let second = Second {
            t: now,
            clients,
            ops: servers.iter().map(|s| s.ops).sum(),
            servers,
            events,
        };
        if seconds.len() == KEEP {
            seconds.pop_front();
        }
        seconds.push_back(second);
    }

    pub fn since(&self, since: u64) -> Vec<Second> {
        match self.seconds.lock() {
            Ok(s) => s.iter().filter(|s| s.t > since).cloned().collect(),
            Err(_) => Vec::new(),
        }
    }
}

/// Tick every second and answer on `listener`.
pub async fn serve(proxy: Arc<Proxy>, listener: TcpListener, slots: Arc<Semaphore>) {
    let board = Arc::new(Board::default());
    let mut second = tokio::time::interval(Duration::from_secs(1));
    second.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = second.tick() => {
                let clients = proxy.cfg.max_connections.saturating_sub(slots.available_permits());
                board.tick(&proxy, clients, pando_web::unix_now());
            }
            a = listener.accept() => match a {
                Ok((mut stream, _)) => {
                    let board = board.clone();
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(pando_web::READ_TIMEOUT * 2, async move {
                            let req = match pando_web::read_request(&mut stream).await {
                                Ok(r) => r,
                                Err(reply) if reply.is_empty() => return,
                                Err(reply) => return pando_web::send(&mut stream, "GET", reply).await,
                            };
                            let reply = answer(&board, &req);
                            pando_web::send(&mut stream, &req.method, reply).await;
                        })
                        .await;
                    });
                }
                Err(e) => {
                    tracing::warn!("dashboard: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

fn answer(board: &Board, req: &pando_web::Request) -> Vec<u8> {
    if req.method != "GET" && req.method != "HEAD" {
        return pando_web::response(405, "text/plain", b"method not allowed\n");
    }
    let (ctype, body): (&str, &[u8]) = match req.path.as_str() {
        "/dashboard" | "/dashboard/" => ("text/html; charset=utf-8", PAGE),
        "/dashboard/proxy.js" => ("text/javascript; charset=utf-8", SCRIPT),
        "/dashboard/data" => {
            let since = req.param("since").and_then(|v| v.parse().ok()).unwrap_or(0);
            let body =
                serde_json::json!({ "now": pando_web::unix_now(), "seconds": board.since(since) });
            return pando_web::response(200, "application/json", body.to_string().as_bytes());
        }
        path => match pando_web::shared_asset(path) {
            Some(found) => found,
            None => return pando_web::response(404, "text/plain", b"not found: try /dashboard\n"),
        },
    };
    pando_web::response(200, ctype, body)
}
