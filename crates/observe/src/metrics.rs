//! The server's counters and latency histograms.
//!
//! Counters are plain `AtomicU64`s updated with relaxed ordering: each is
//! exact on its own, and a reader sees a consistent-enough snapshot (two
//! counters read together may be one operation apart).
//!
//! Latencies go into HDR histograms (microseconds, 1 µs to 1 h, 3
//! significant digits). One histogram per operation type would be a lock
//! every operation takes; instead each type has `SHARDS` histograms and a
//! thread records into the shard picked by its own slot number, so two
//! threads rarely meet on one lock. A reader merges the shards.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Instant, SystemTime};

use hdrhistogram::Histogram;

/// Histograms per operation type (a power of two).
const SHARDS: usize = 16;
/// Highest latency tracked exactly: one hour, in microseconds. Longer
/// ones are recorded as this value.
const MAX_MICROS: u64 = 3_600_000_000;

pub use crate::op_kind::{OpKind, OP_KINDS};

/// One latency histogram, sharded by thread.
struct Sharded {
    shards: Vec<Mutex<Histogram<u64>>>,
}

fn new_histogram() -> Histogram<u64> {
    // Bounds are constants that hdrhistogram accepts.
    Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("valid histogram bounds")
}

impl Sharded {
    fn new() -> Sharded {
        Sharded {
            shards: (0..SHARDS).map(|_| Mutex::new(new_histogram())).collect(),
        }
    }

    fn record(&self, micros: u64) {
        let slot = crate::op_kind::slot(SHARDS);
        if let Ok(mut h) = self.shards[slot].lock() {
            h.saturating_record(micros.clamp(1, MAX_MICROS));
        }
    }

    fn merged(&self) -> Histogram<u64> {
        let mut all = new_histogram();
        for s in &self.shards {
            if let Ok(h) = s.lock() {
                // Same bounds: adding cannot fail.
                let _ = all.add(&*h);
            }
        }
        all
    }
}

/// Per-second figures of the server process from /proc (Linux); zeros
/// elsewhere.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessFigures {
    /// Bytes read from / written to storage (`read_bytes`/`write_bytes`).
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// read/write system calls (`syscr`/`syscw`).
    pub syscr: u64,
    pub syscw: u64,
    /// User + system CPU time, microseconds.
    pub cpu_micros: u64,
    /// Threads of the process.
    pub threads: u64,
    /// Resident set size, bytes.
    pub rss_bytes: u64,
}

impl ProcessFigures {
    pub fn read() -> ProcessFigures {
        let mut p = ProcessFigures::default();
        if let Ok(io) = std::fs::read_to_string("/proc/self/io") {
            for line in io.lines() {
                let mut it = line.split(':');
                let (Some(k), Some(v)) = (it.next(), it.next()) else {
                    continue;
                };
                let v: u64 = v.trim().parse().unwrap_or(0);
                match k {
                    "read_bytes" => p.read_bytes = v,
                    "write_bytes" => p.write_bytes = v,
                    "syscr" => p.syscr = v,
                    "syscw" => p.syscw = v,
                    _ => {}
                }
            }
        }
        if let Ok(stat) = std::fs::read_to_string("/proc/self/stat") {
            // Fields after the parenthesised command name (which may hold spaces).
            if let Some(rest) = stat.rfind(')').map(|i| &stat[i + 1..]) {
                let f: Vec<&str> = rest.split_whitespace().collect();
                // rest[0] is field 3 (state): utime = 14, stime = 15,
                // num_threads = 20, rss = 24 (pages).
                let n = |i: usize| {
                    f.get(i - 3)
                        .and_then(|v| v.parse::<u64>().ok())
                        .unwrap_or(0)
                };
                // SAFETY: sysconf has no preconditions.
                let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
                // SAFETY: as above.
                let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
                p.cpu_micros = (n(14) + n(15)) * 1_000_000 / tck;
                p.threads = n(20);
                p.rss_bytes = n(24) * page;
            }
        }
        p
    }
}

/// Latency summary of one operation type, microseconds.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Latency {
    pub count: u64,
    pub sum: u64,
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
    /// Cumulative counts at the bucket bounds of [`LATENCY_BOUNDS`].
    pub buckets: Vec<u64>,
}

/// Histogram bucket upper bounds in microseconds (Prometheus `le`, and
/// what `pando stat` computes interval percentiles from): steps of 1, 1.5,
/// 2, 3, 5, 7 per decade from 10 µs to 10 s.
pub const LATENCY_BOUNDS: &[u64] = &[
    10, 15, 20, 30, 50, 70, 100, 150, 200, 300, 500, 700, 1_000, 1_500, 2_000, 3_000, 5_000, 7_000,
    10_000, 15_000, 20_000, 30_000, 50_000, 70_000, 100_000, 150_000, 200_000, 300_000, 500_000,
    700_000, 1_000_000, 1_500_000, 2_000_000, 3_000_000, 5_000_000, 7_000_000, 10_000_000,
];

/// Everything counted while the server runs. One per server.
pub struct Metrics {
    pub started: SystemTime,
    started_at: Instant,
    pub conns_current: AtomicU64,
    pub conns_total: AtomicU64,
    initiated: [AtomicU64; 10],
    completed: [AtomicU64; 10],
    /// Sum of queue/wait times (receive to start), microseconds.
    pub wait_micros: AtomicU64,
    pub entries_sent: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub pdus_in: AtomicU64,
    pub pdus_out: AtomicU64,
    /// Access-log lines dropped because its buffer was full.
    pub access_dropped: AtomicU64,
    /// Log lines that could not be written (I/O errors).
    pub log_write_errors: AtomicU64,
    /// The in-directory access log's counters, shared with its writer jobs.
    pub accesslog: std::sync::Arc<AccesslogCounters>,
    latency: Vec<Sharded>,
    /// Per second, for the dashboard (`crate::station`): what operations
    /// record, and the last hour made of it.
    pub seconds: crate::station::Recorder,
    pub station: crate::station::Station,
}

/// What the in-directory access log (`overlays::accesslog`) did not keep.
/// Counters only grow.
#[derive(Default, Debug)]
pub struct AccesslogCounters {
    /// Operations of anonymous clients that did not succeed: counted
    /// here instead of stored one record each.
    pub refused_anonymous: AtomicU64,
    /// Records dropped because the queue to the writer was full (or the
    /// store refused writes).
    pub dropped: AtomicU64,
    /// Records purged, oldest first, to keep the log within its caps.
    pub purged: AtomicU64,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    pub fn new() -> Metrics {
        Metrics {
            started: SystemTime::now(),
            started_at: Instant::now(),
            conns_current: AtomicU64::new(0),
            conns_total: AtomicU64::new(0),
            initiated: Default::default(),
            completed: Default::default(),
            wait_micros: AtomicU64::new(0),
            entries_sent: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            bytes_out: AtomicU64::new(0),
            pdus_in: AtomicU64::new(0),
            pdus_out: AtomicU64::new(0),
            access_dropped: AtomicU64::new(0),
            log_write_errors: AtomicU64::new(0),
            accesslog: Default::default(),
            latency: OP_KINDS.iter().map(|_| Sharded::new()).collect(),
            seconds: Default::default(),
            station: Default::default(),
        }
    }

    pub fn uptime_secs(&self) -> u64 {
        self.started_at.elapsed().as_secs()
    }

    pub fn conn_opened(&self) {
        self.conns_current.fetch_add(1, Ordering::Relaxed);
        self.conns_total.fetch_add(1, Ordering::Relaxed);
    }

    pub fn conn_closed(&self) {
        self.conns_current.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn op_initiated(&self, kind: OpKind) {
        self.initiated[kind as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// An operation finished: `etime_us` from receipt to response,
    /// `wait_us` of it spent queued, `entries` returned (searches).
    pub fn op_completed(&self, kind: OpKind, etime_us: u64, wait_us: u64, entries: u64) {
        self.completed[kind as usize].fetch_add(1, Ordering::Relaxed);
        self.wait_micros.fetch_add(wait_us, Ordering::Relaxed);
        if entries > 0 {
            self.entries_sent.fetch_add(entries, Ordering::Relaxed);
        }
        self.latency[kind as usize].record(etime_us);
        self.seconds.record(kind, etime_us);
    }

    pub fn add(&self, counter: &AtomicU64, n: u64) {
        counter.fetch_add(n, Ordering::Relaxed);
    }

    pub fn initiated(&self, kind: OpKind) -> u64 {
        self.initiated[kind as usize].load(Ordering::Relaxed)
    }

    pub fn completed(&self, kind: OpKind) -> u64 {
        self.completed[kind as usize].load(Ordering::Relaxed)
    }

    pub fn get(&self, counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }

    /// Merge one type's shards and summarise.
    pub fn latency(&self, kind: OpKind) -> Latency {
        let h = self.latency[kind as usize].merged();
        if h.is_empty() {
            return Latency {
                buckets: vec![0; LATENCY_BOUNDS.len()],
                ..Latency::default()
            };
        }
        let sum = h
            .iter_recorded()
            .map(|v| v.value_iterated_to() * v.count_at_value())
            .sum();
        Latency {
            count: h.len(),
            sum,
            p50: h.value_at_quantile(0.50),
            p90: h.value_at_quantile(0.90),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            max: h.max(),
            buckets: LATENCY_BOUNDS
                .iter()
                .map(|b| h.count_between(0, *b))
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_and_percentiles() {
        let m = Metrics::new();
        for i in 1..=100u64 {
            m.op_initiated(OpKind::Search);
            m.op_completed(OpKind::Search, i * 10, 1, 2);
        }
        assert_eq!(m.initiated(OpKind::Search), 100);
        assert_eq!(m.completed(OpKind::Search), 100);
        assert_eq!(m.get(&m.entries_sent), 200);
        let l = m.latency(OpKind::Search);
        assert_eq!(l.count, 100);
        assert!((495..=505).contains(&l.p50), "{l:?}");
        assert!((985..=1001).contains(&l.p99), "{l:?}");
        assert_eq!(l.max, 1000);
        // 10 µs bucket holds the first value; 1 ms bucket holds them all.
        assert_eq!(l.buckets[0], 1);
        assert_eq!(l.buckets[12], 100);
        assert_eq!(m.latency(OpKind::Bind).count, 0);
    }

    #[test]
    fn shards_merge_across_threads() {
        let m = std::sync::Arc::new(Metrics::new());
        let hs: Vec<_> = (0..8)
            .map(|_| {
                let m = m.clone();
                std::thread::spawn(move || {
                    for _ in 0..1000 {
                        m.op_completed(OpKind::Modify, 50, 0, 0);
                    }
                })
            })
            .collect();
        for h in hs {
            h.join().unwrap();
        }
        assert_eq!(m.latency(OpKind::Modify).count, 8000);
    }

    #[test]
    fn names_round_trip() {
        for k in OP_KINDS {
            assert_eq!(OpKind::from_name(k.name()), Some(k));
        }
    }
}
