//! The open-loop schedule (`--rate`): when each request is due.
//!
//! Request k of connection i (of C, total rate R/s) is due at
//! `start + i/R + k*C/R` seconds, so the connections together issue one
//! request every 1/R seconds. The times depend only on k, not on when
//! earlier requests finished: a server that stalls builds a backlog, and
//! each late request's latency is counted from its due time. That is what
//! keeps the measurement free of coordinated omission (a closed-loop client
//! would simply send less during the stall and miss the waiting it caused).

use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct OpenLoop {
    /// Due time of this connection's first request.
    first: Instant,
    /// Nanoseconds between two requests of this connection.
    period_ns: f64,
    /// Index of the next request to issue.
    next: u64,
}

impl OpenLoop {
    /// Connection `index` of `connections`, sharing `rate` requests per second.
    pub fn new(start: Instant, rate: f64, connections: usize, index: usize) -> OpenLoop {
        let gap_ns = 1e9 / rate;
        OpenLoop {
            first: start + Duration::from_nanos((gap_ns * index as f64) as u64),
            period_ns: gap_ns * connections as f64,
            next: 0,
        }
    }

    /// When the next request is due.
    pub fn next_at(&self) -> Instant {
        self.first + Duration::from_nanos((self.period_ns * self.next as f64) as u64)
    }

    /// If the next request is due at or before `now`, takes it and returns
    /// its due time (the start of its latency).
    pub fn take_due(&mut self, now: Instant) -> Option<Instant> {
        let t = self.next_at();
        if t <= now {
            self.next += 1;
            Some(t)
        } else {
            None
        }
    }
}

/// Where the latency of an open-loop request starts: its due time
/// `scheduled` if its slot only became free after that (`slot_free_since`
/// later than `scheduled`: the request queued behind the server), else the
/// time it is sent (`now`).
pub fn latency_start(scheduled: Instant, slot_free_since: Instant, now: Instant) -> Instant {
    if slot_free_since > scheduled {
        scheduled
    } else {
        now
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(t: Instant, base: Instant) -> f64 {
        (t - base).as_secs_f64() * 1000.0
    }

    #[test]
    fn connections_interleave_evenly() {
        let t0 = Instant::now();
        // 1000/s over 4 connections: each sends every 4 ms, offset by 1 ms.
        let mut all: Vec<f64> = Vec::new();
        for i in 0..4 {
            let mut s = OpenLoop::new(t0, 1000.0, 4, i);
            let far = t0 + Duration::from_secs(1);
            for _ in 0..5 {
                all.push(ms(s.take_due(far).unwrap(), t0));
            }
        }
        all.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let want: Vec<f64> = (0..20).map(f64::from).collect();
        for (g, w) in all.iter().zip(&want) {
            assert!((g - w).abs() < 1e-3, "{all:?}");
        }
    }

    #[test]
    fn nothing_is_due_early_and_a_backlog_keeps_its_due_times() {
        let t0 = Instant::now();
        let mut s = OpenLoop::new(t0, 100.0, 1, 0); // every 10 ms
        assert_eq!(s.take_due(t0), Some(t0));
        assert_eq!(s.take_due(t0 + Duration::from_millis(9)), None);
        assert_eq!(ms(s.next_at(), t0).round(), 10.0);
        // The client was stuck until 35 ms: three requests are due, each
        // with its own schedule time, not "now".
        let now = t0 + Duration::from_millis(35);
        let due: Vec<f64> = std::iter::from_fn(|| s.take_due(now))
            .map(|t| ms(t, t0).round())
            .collect();
        assert_eq!(due, [10.0, 20.0, 30.0]);
        assert_eq!(ms(s.next_at(), t0).round(), 40.0);
    }

    #[test]
    fn latency_starts_at_the_due_time_only_for_a_backlog() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        // Due at 10, slot free since 5, timer fired at 11: the client's delay.
        assert_eq!(latency_start(at(10), at(5), at(11)), at(11));
        // Due at 10, the server freed the slot only at 30: counted from 10.
        assert_eq!(latency_start(at(10), at(30), at(30)), at(10));
        // Freed exactly at the due time: no wait for the server.
        assert_eq!(latency_start(at(10), at(10), at(10)), at(10));
    }

    #[test]
    fn fractional_rates_work() {
        let t0 = Instant::now();
        let mut s = OpenLoop::new(t0, 0.5, 1, 0); // one every 2 s
        s.take_due(t0).unwrap();
        assert_eq!(s.next_at() - t0, Duration::from_secs(2));
    }
}
