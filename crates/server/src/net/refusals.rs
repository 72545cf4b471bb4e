//! Refused work is paced: a client whose requests the server refuses
//! (insufficient access, a limit exceeded, unwilling, malformed names or
//! values, a write to an entry that does not exist…)
//! gets its next requests read more slowly, so a flood of requests that
//! will only be refused cannot take the server's time from clients whose
//! requests are served.
//!
//! Each refused request costs its size in bytes, at least
//! [`MIN_COST`]. A connection may spend [`CONN_RATE`] bytes a second of
//! refused requests (bursts to [`CONN_BURST`]); the connections from one
//! client address together [`IP_RATE`] (bursts to [`IP_BURST`]). A
//! connection over its own budget, or with refusals of its own while its
//! address is over the shared one, reads nothing more until the budget is
//! back: the client's sends then wait in TCP, costing the server nothing.
//! A connection with nothing served yet counts as refused for this (its
//! pipelined requests are read before the first is answered), so an
//! attacker opening fresh connections is paced too. Responses already
//! due are still written meanwhile. A connection that has been served and
//! not refused never waits, whatever its neighbours at the same address
//! do.
//!
//! Binds with a wrong password are paced by `throttle` instead (per DN and
//! address, with lockout); their results do not count here.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pando_proto::ResultCode;
use tokio::time::Instant;

/// Least cost of one refused request, in bytes: a connection may have
/// about a thousand small requests refused a second before it waits.
pub const MIN_COST: u64 = 1024;
/// Refused bytes a second one connection may send.
pub const CONN_RATE: f64 = 1024.0 * 1024.0;
pub const CONN_BURST: f64 = 4.0 * CONN_RATE;
/// Refused bytes a second one client address may send, all its
/// connections together.
pub const IP_RATE: f64 = 8.0 * 1024.0 * 1024.0;
pub const IP_BURST: f64 = 4.0 * IP_RATE;
/// Longest single wait; the budget is checked again after it.
const MAX_WAIT: Duration = Duration::from_secs(1);
/// Most addresses tracked; beyond it, those whose budget is full again
/// are forgotten, and if that is not enough, all of them.
const MAX_ADDRESSES: usize = 100_000;

/// Whether a result code means the request was refused rather than
/// served (what a client acting in good faith rarely meets). A write to
/// an entry that does not exist counts too; a read of one does not
/// (looking a name up is ordinary).
pub fn is_refusal(code: u32, write: bool) -> bool {
    (write && code == ResultCode::NO_SUCH_OBJECT.0)
        || [
            ResultCode::PROTOCOL_ERROR,
            ResultCode::INVALID_DN_SYNTAX,
            ResultCode::INVALID_ATTRIBUTE_SYNTAX,
            ResultCode::ADMIN_LIMIT_EXCEEDED,
            ResultCode::STRONGER_AUTH_REQUIRED,
            ResultCode::CONFIDENTIALITY_REQUIRED,
            ResultCode::INAPPROPRIATE_AUTHENTICATION,
            ResultCode::INSUFFICIENT_ACCESS_RIGHTS,
            ResultCode::UNWILLING_TO_PERFORM,
        ]
        .iter()
        .any(|c| c.0 == code)
}

/// A token bucket of bytes.
#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

impl Bucket {
    fn full(burst: f64, now: Instant) -> Bucket {
        Bucket {
            tokens: burst,
            at: now,
        }
    }

    fn refill(&mut self, rate: f64, burst: f64, now: Instant) {
        let secs = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + secs * rate).min(burst);
        self.at = now;
    }

    /// How long until the bucket is no longer in debt.
    fn debt_wait(&self, rate: f64) -> Option<Duration> {
        (self.tokens < 0.0).then(|| Duration::from_secs_f64(-self.tokens / rate).min(MAX_WAIT))
    }
}

/// The budgets of every client address (shared by the listeners).
#[derive(Default)]
pub struct Table {
    by_ip: Mutex<HashMap<IpAddr, Bucket>>,
}

impl Table {
    fn charge(&self, ip: IpAddr, cost: f64, now: Instant) {
        let mut map = self.by_ip.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= MAX_ADDRESSES && !map.contains_key(&ip) {
            map.retain(|_, b| {
                b.refill(IP_RATE, IP_BURST, now);
                b.tokens < IP_BURST
            });
            if map.len() >= MAX_ADDRESSES {
                map.clear();
            }
        }
        let b = map.entry(ip).or_insert_with(|| Bucket::full(IP_BURST, now));
        b.refill(IP_RATE, IP_BURST, now);
        b.tokens -= cost;
    }

    fn wait(&self, ip: IpAddr, now: Instant) -> Option<Duration> {
        let mut map = self.by_ip.lock().unwrap_or_else(|p| p.into_inner());
        let b = map.get_mut(&ip)?;
        b.refill(IP_RATE, IP_BURST, now);
        b.debt_wait(IP_RATE)
    }
}

/// One connection's budget, shared with the tasks running its operations
/// (they charge it when the answer is a refusal).
pub struct Pace {
    own: Mutex<Bucket>,
    /// An operation of this connection succeeded.
    served: AtomicBool,
    /// An operation of this connection was refused (until then, a served
    /// connection reads without looking at any budget).
    refused: AtomicBool,
    ip: Option<IpAddr>,
    table: Arc<Table>,
}

impl Pace {
    pub fn new(table: Arc<Table>, ip: Option<IpAddr>) -> Pace {
        Pace {
            own: Mutex::new(Bucket::full(CONN_BURST, Instant::now())),
            served: AtomicBool::new(false),
            refused: AtomicBool::new(false),
            ip: ip.map(|i| i.to_canonical()),
            table,
        }
    }

    /// An operation of `bytes` (a write or not) answered `code`.
    pub fn answered(&self, code: u32, bytes: usize, write: bool) {
        if [
            ResultCode::SUCCESS,
            ResultCode::COMPARE_FALSE,
            ResultCode::COMPARE_TRUE,
        ]
        .iter()
        .any(|c| c.0 == code)
        {
            self.served.store(true, Ordering::Relaxed);
        }
        if !is_refusal(code, write) {
            return;
        }
        self.refused.store(true, Ordering::Relaxed);
        let cost = (bytes as u64).max(MIN_COST) as f64;
        let now = Instant::now();
        {
            let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
            own.refill(CONN_RATE, CONN_BURST, now);
            own.tokens -= cost;
        }
        if let Some(ip) = self.ip {
            self.table.charge(ip, cost, now);
        }
    }

    /// How long to wait before reading more from the socket: only a
    /// connection refused itself waits here (one that has sent nothing, or
    /// was only served, reads at once; it is paced after each request it
    /// sends, by [`Pace::wait`]).
    pub fn wait_to_read(&self) -> Option<Duration> {
        if !self.refused.load(Ordering::Relaxed) {
            return None;
        }
        self.wait()
    }

    /// How long to wait after a request before the next (None: go on).
    pub fn wait(&self) -> Option<Duration> {
        if self.served.load(Ordering::Relaxed) && !self.refused.load(Ordering::Relaxed) {
            return None;
        }
        let now = Instant::now();
        let own = {
            let mut own = self.own.lock().unwrap_or_else(|p| p.into_inner());
            own.refill(CONN_RATE, CONN_BURST, now);
            *own
        };
        if let Some(w) = own.debt_wait(CONN_RATE) {
            return Some(w);
        }
        // Refused lately (its own budget not full), or nothing served yet
        // (a new connection's pipelined requests are read before the
        // first is answered): the address's budget counts too.
        if own.tokens < CONN_BURST || !self.served.load(Ordering::Relaxed) {
            return self.ip.and_then(|ip| self.table.wait(ip, now));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOCAL: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

    #[tokio::test(start_paused = true)]
    async fn refused_bytes_beyond_the_burst_wait_and_the_budget_comes_back() {
        let table = Arc::new(Table::default());
        let pace = Pace::new(table.clone(), Some(LOCAL));
        // Served requests cost nothing, however large.
        pace.answered(0, 100 << 20, true);
        pace.answered(32, 100 << 20, false);
        assert_eq!(pace.wait(), None);
        // The burst is free; one more megabyte is a second's wait.
        pace.answered(50, CONN_BURST as usize, false);
        assert_eq!(pace.wait(), None);
        pace.answered(34, 1 << 20, false);
        let w = pace.wait().unwrap();
        assert!(w > Duration::from_millis(990) && w <= MAX_WAIT, "{w:?}");
        tokio::time::advance(Duration::from_millis(1001)).await;
        assert_eq!(pace.wait(), None);
        // Small refusals cost MIN_COST each.
        for _ in 0..(CONN_RATE as u64 / MIN_COST + 1) {
            pace.answered(50, 10, false);
        }
        assert!(pace.wait().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn an_address_over_budget_slows_its_refused_connections_only() {
        let table = Arc::new(Table::default());
        let served = Pace::new(table.clone(), Some(LOCAL));
        served.answered(0, 100, false);
        let fresh = Pace::new(table.clone(), Some(LOCAL));
        let many: Vec<Pace> = (0..12)
            .map(|_| Pace::new(table.clone(), Some(LOCAL)))
            .collect();
        // Each within its own burst; together past the address's.
        for p in &many {
            p.answered(50, (CONN_BURST * 0.9) as usize, true);
        }
        assert!(many.iter().all(|p| p.wait().is_some()));
        assert_eq!(
            served.wait(),
            None,
            "a connection served and never refused reads on"
        );
        assert!(
            fresh.wait().is_some(),
            "a new connection waits for the address"
        );
        // Another address is not affected.
        let other = Pace::new(table, Some("10.0.0.1".parse().unwrap()));
        other.answered(50, 10, false);
        assert_eq!(other.wait(), None);
    }
}
