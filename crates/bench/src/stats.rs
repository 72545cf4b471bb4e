//! Counters and latency histograms.
//!
//! Each load thread records into its own [`Stats`] (no locks, no atomics
//! per operation) and hands it to the reporter at every interval boundary,
//! starting afresh; the reporter merges the threads' interval stats into one
//! line and into the run's total.

use std::collections::BTreeMap;
use std::time::Instant;

use hdrhistogram::Histogram;
use pando_proto::ResultCode;

/// Latencies above this (one minute) are recorded as this.
pub const MAX_LATENCY_NS: u64 = 60_000_000_000;

/// Why an operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum ErrKey {
    /// The server answered with this resultCode.
    Ldap(u32),
    /// authrate: the search succeeded but found no entry to bind as.
    NoEntry,
}

impl ErrKey {
    /// `noSuchObject`, `code 4096`, `noEntryFound`.
    pub fn name(self) -> String {
        match self {
            ErrKey::Ldap(c) => match ResultCode(c).name() {
                "unknown" => format!("code {c}"),
                n => n.to_string(),
            },
            ErrKey::NoEntry => "noEntryFound".into(),
        }
    }

    pub fn code(self) -> Option<u32> {
        match self {
            ErrKey::Ldap(c) => Some(c),
            ErrKey::NoEntry => None,
        }
    }

    /// `noSuchObject (32)`; `noEntryFound (auth search returned no entry)`.
    pub fn describe(self) -> String {
        match self {
            ErrKey::Ldap(c) => format!("{} ({c})", self.name()),
            ErrKey::NoEntry => format!("{} (auth search returned no entry)", self.name()),
        }
    }
}

/// One operation kind's counters.
#[derive(Clone, Debug)]
pub struct KindStats {
    /// Latency of successful operations, nanoseconds.
    pub hist: Histogram<u64>,
    pub ops: u64,
    pub errors: u64,
    pub by_error: BTreeMap<ErrKey, u64>,
    /// Exact sum and maximum (the histogram's are rounded to its buckets).
    pub lat_sum_ns: u128,
    pub lat_max_ns: u64,
    /// Search entries received, and successful searches that found none.
    pub entries: u64,
    pub empty: u64,
}

fn new_histogram() -> Histogram<u64> {
    // 1 ns .. 60 s with 3 significant digits: constant, valid bounds.
    Histogram::new_with_bounds(1, MAX_LATENCY_NS, 3).expect("constant histogram bounds are valid")
}

impl Default for KindStats {
    fn default() -> Self {
        KindStats {
            hist: new_histogram(),
            ops: 0,
            errors: 0,
            by_error: BTreeMap::new(),
            lat_sum_ns: 0,
            lat_max_ns: 0,
            entries: 0,
            empty: 0,
        }
    }
}

/// Latency figures in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Latency {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub p999: f64,
    pub max: f64,
}

impl KindStats {
    #[inline]
    pub fn ok(&mut self, lat_ns: u64) {
        self.ops += 1;
        self.lat_sum_ns += u128::from(lat_ns);
        self.lat_max_ns = self.lat_max_ns.max(lat_ns);
        self.hist.saturating_record(lat_ns.clamp(1, MAX_LATENCY_NS));
    }

    pub fn err(&mut self, key: ErrKey) {
        self.errors += 1;
        *self.by_error.entry(key).or_insert(0) += 1;
    }

    pub fn merge(&mut self, o: &KindStats) {
        // Same bounds on both sides, so adding cannot fail.
        let _ = self.hist.add(&o.hist);
        self.ops += o.ops;
        self.errors += o.errors;
        for (k, v) in &o.by_error {
            *self.by_error.entry(*k).or_insert(0) += v;
        }
        self.lat_sum_ns += o.lat_sum_ns;
        self.lat_max_ns = self.lat_max_ns.max(o.lat_max_ns);
        self.entries += o.entries;
        self.empty += o.empty;
    }

    /// Percentiles are the histogram's (within 0.1%), capped at the exact
    /// maximum so that they never exceed it.
    pub fn latency(&self) -> Latency {
        if self.ops == 0 {
            return Latency::default();
        }
        let max = self.lat_max_ns as f64 / 1e6;
        let q = |p: f64| (self.hist.value_at_quantile(p) as f64 / 1e6).min(max);
        Latency {
            mean: self.lat_sum_ns as f64 / self.ops as f64 / 1e6,
            p50: q(0.50),
            p90: q(0.90),
            p99: q(0.99),
            p999: q(0.999),
            max,
        }
    }
}

/// A thread's (or the run's) counters, one [`KindStats`] per operation of
/// the run, indexed like [`crate::config::Plan::ops`].
#[derive(Clone, Debug)]
pub struct Stats {
    pub kinds: Vec<KindStats>,
    /// When the latest recorded operation completed.
    pub last_completion: Option<Instant>,
}

impl Stats {
    pub fn new(kinds: usize) -> Stats {
        Stats {
            kinds: (0..kinds).map(|_| KindStats::default()).collect(),
            last_completion: None,
        }
    }

    pub fn merge(&mut self, o: &Stats) {
        for (a, b) in self.kinds.iter_mut().zip(&o.kinds) {
            a.merge(b);
        }
        self.last_completion = match (self.last_completion, o.last_completion) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        };
    }

    /// All kinds together.
    pub fn total(&self) -> KindStats {
        let mut t = KindStats::default();
        for k in &self.kinds {
            t.merge(k);
        }
        t
    }

    /// Returns the counters so far and starts afresh.
    pub fn take(&mut self) -> Stats {
        std::mem::replace(self, Stats::new(self.kinds.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_ordered_and_close() {
        let mut k = KindStats::default();
        // 1..=1000 µs, one each.
        for us in 1..=1000u64 {
            k.ok(us * 1000);
        }
        let l = k.latency();
        assert!((l.mean - 0.5005).abs() < 1e-9, "{l:?}");
        assert!((l.p50 - 0.5).abs() < 0.001, "{l:?}");
        assert!((l.p90 - 0.9).abs() < 0.001, "{l:?}");
        assert!((l.p99 - 0.99).abs() < 0.001, "{l:?}");
        assert!(l.p50 <= l.p90 && l.p90 <= l.p99 && l.p99 <= l.p999 && l.p999 <= l.max);
        assert_eq!(l.max, 1.0);
    }

    #[test]
    fn merge_adds_everything() {
        let mut a = Stats::new(2);
        let mut b = Stats::new(2);
        a.kinds[0].ok(1_000_000);
        a.kinds[1].err(ErrKey::Ldap(32));
        b.kinds[0].ok(3_000_000);
        b.kinds[1].err(ErrKey::Ldap(32));
        b.kinds[1].err(ErrKey::NoEntry);
        b.kinds[0].entries = 4;
        a.merge(&b);
        assert_eq!((a.kinds[0].ops, a.kinds[0].entries), (2, 4));
        assert_eq!(a.kinds[1].by_error[&ErrKey::Ldap(32)], 2);
        let t = a.total();
        assert_eq!((t.ops, t.errors), (2, 3));
        assert_eq!(t.latency().mean, 2.0);
        assert_eq!(t.latency().max, 3.0);
        let taken = a.take();
        assert_eq!(taken.total().ops, 2);
        assert_eq!(a.total().ops, 0);
    }

    #[test]
    fn huge_latencies_saturate() {
        let mut k = KindStats::default();
        k.ok(MAX_LATENCY_NS * 10);
        assert_eq!(k.ops, 1);
        assert!(k.latency().p99 >= 59_000.0);
    }

    #[test]
    fn error_names() {
        assert_eq!(ErrKey::Ldap(32).describe(), "noSuchObject (32)");
        assert_eq!(ErrKey::Ldap(4097).name(), "code 4097");
        assert_eq!(ErrKey::NoEntry.code(), None);
        assert!(ErrKey::NoEntry.describe().contains("no entry"));
    }
}
