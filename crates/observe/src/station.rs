//! The dashboard's "weather station": second by second, what the server
//! did (operations by type with their latency percentiles and maximum,
//! connections, bytes, CPU, store I/O, the writer's batches and commits,
//! replication), kept for the last hour in memory, with seconds whose
//! latencies stand out marked and lined up with what else happened in
//! them, and the slowest operations of each second with their access log
//! line.
//!
//! Recording ([`Recorder`], inside the metrics registry) costs an
//! operation two relaxed atomic adds and a `fetch_max`: per type a
//! cumulative count per latency bucket (quarter powers of two, so a
//! percentile is within 12% of the truth) and the second's maximum. An
//! operation slower than the fifth slowest of its second so far takes a
//! lock to be listed. Once a second [`Station::tick`] (the server's
//! sampler) turns the differences into a [`Second`].
//!
//! Must not name the server's state: the server hands each tick what it
//! read ([`Inputs`]).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use serde::Serialize;

use crate::op_kind::{OpKind, OP_KINDS};

/// Latency buckets: four per power of two from 1 µs; the last one holds
/// everything from 2^28 µs (268 s) up.
const BUCKETS: usize = 113;
/// Slowest operations listed per second.
pub const SLOWEST: usize = 5;
/// Seconds kept: the last hour.
pub const KEEP: usize = 3600;
/// Seconds of history a second is compared with.
const BASELINE: usize = 60;
/// An operation type with no history in that time stands out from this
/// latency on.
const NO_HISTORY_MS: f64 = 1000.0;

fn bucket(us: u64) -> usize {
    let us = us.max(1);
    let e = 63 - us.leading_zeros() as usize;
    let frac = match e {
        0 => 0,
        1 => ((us << 1) & 3) as usize,
        _ => ((us >> (e - 2)) & 3) as usize,
    };
    (4 * e + frac).min(BUCKETS - 1)
}

/// The middle of bucket `i`, in microseconds.
fn bucket_value(i: usize) -> f64 {
    let (e, frac) = (i / 4, i % 4);
    let low = (1u64 << e) as f64 * (1.0 + frac as f64 / 4.0);
    let width = (1u64 << e) as f64 / 4.0;
    low + width / 2.0
}

/// One operation among the slowest of its second.
#[derive(Clone, Debug, Serialize, PartialEq)]
pub struct SlowOp {
    pub kind: &'static str,
    pub ms: f64,
    /// Its access log line (without the time stamp's date when the access
    /// log is off: then only what the network knows).
    pub line: String,
}

/// Copies of the buckets, written by threads according to their slot, so
/// that two cores rarely write the same cache line.
const COPIES: usize = 4;

/// What operations record into.
pub struct Recorder {
    /// Per type, `COPIES` copies of the buckets (type × COPIES + copy).
    buckets: Vec<[AtomicU64; BUCKETS]>,
    max: Vec<AtomicU64>,
    /// The etime an operation must pass to be listed this second.
    threshold: AtomicU64,
    slow: Mutex<Vec<(u64, SlowOp)>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            buckets: (0..OP_KINDS.len() * COPIES)
                .map(|_| std::array::from_fn(|_| AtomicU64::new(0)))
                .collect(),
            max: OP_KINDS.iter().map(|_| AtomicU64::new(0)).collect(),
            threshold: AtomicU64::new(0),
            slow: Mutex::new(Vec::new()),
        }
    }
}

impl Recorder {
    pub fn record(&self, kind: OpKind, etime_us: u64) {
        let k = kind as usize;
        let copy = k * COPIES + crate::op_kind::slot(COPIES);
        self.buckets[copy][bucket(etime_us)].fetch_add(1, Ordering::Relaxed);
        // Mostly a read: the line is written only by a new maximum.
        if etime_us > self.max[k].load(Ordering::Relaxed) {
            self.max[k].fetch_max(etime_us, Ordering::Relaxed);
        }
    }

    /// Whether an operation of `etime_us` is among the slowest of this
    /// second so far (then describe it and [`Recorder::keep`] it).
    pub fn wants(&self, etime_us: u64) -> bool {
        etime_us > self.threshold.load(Ordering::Relaxed)
    }

    pub fn keep(&self, kind: OpKind, etime_us: u64, line: String) {
        let Ok(mut slow) = self.slow.lock() else {
            return;
        };
        let op = SlowOp {
            kind: kind.name(),
            ms: etime_us as f64 / 1000.0,
            line,
        };
        slow.push((etime_us, op));
        slow.sort_by_key(|(us, _)| std::cmp::Reverse(*us));
        slow.truncate(SLOWEST);
        if slow.len() == SLOWEST {
            self.threshold.store(slow[SLOWEST - 1].0, Ordering::Relaxed);
        }
    }

    /// The slowest operations since the last call.
    fn take_slow(&self) -> Vec<SlowOp> {
        let Ok(mut slow) = self.slow.lock() else {
            return Vec::new();
        };
        self.threshold.store(0, Ordering::Relaxed);
        std::mem::take(&mut *slow)
            .into_iter()
            .map(|(_, o)| o)
            .collect()
    }
}

/// What the server read for a second, beside the operations.
#[derive(Clone, Debug, Default)]
pub struct Inputs {
    pub conns_current: u64,
    /// Cumulative figures: the station takes the differences.
    pub conns_total: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    pub cpu_micros: u64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub batches: u64,
    pub batch_ops: u64,
    pub commit_micros: u64,
    /// Per consumer (rid): phase, the longest delay of a change received,
    /// ms, and cumulative applied and conflict counts.
    pub consumers: Vec<ConsumerInput>,
    /// Indexes being built now.
    pub index_builds: Vec<String>,
}

#[derive(Clone, Debug, Default)]
pub struct ConsumerInput {
    pub rid: u16,
    pub phase: &'static str,
    pub delay_ms: u64,
    pub applied: u64,
    pub conflicts: u64,
}

/// One operation type's second.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct OpSecond {
    pub count: u64,
    /// Milliseconds.
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct ConsumerSecond {
    pub rid: u16,
    pub phase: &'static str,
    pub delay_ms: u64,
    pub applied: u64,
    pub conflicts: u64,
}

/// One second of the server's life.
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct Second {
    /// Unix time (seconds) the second ended.
    pub t: u64,
    /// By type name, the types with operations this second.
    pub ops: std::collections::BTreeMap<&'static str, OpSecond>,
    pub conns: u64,
    pub conns_opened: u64,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// Percent of one core.
    pub cpu: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Store bytes read and written per operation.
    pub io_per_op: f64,
    pub batches: u64,
    pub batch_size: f64,
    /// Mean commit time of the second's batches.
    pub commit_ms: f64,
    pub consumers: Vec<ConsumerSecond>,
    pub index_builds: Vec<String>,
    pub slowest: Vec<SlowOp>,
    /// Types whose latency stood out, and why (empty: an ordinary second).
    pub outliers: Vec<String>,
    /// What else stood out in this second.
    pub events: Vec<String>,
}

/// What the last tick read: the buckets' counts per type, the inputs,
/// when.
type Reading = (Vec<[u64; BUCKETS]>, Inputs, std::time::Instant);

/// The last hour, and what the next tick compares with.
pub struct Station {
    seconds: Mutex<VecDeque<Second>>,
    last: Mutex<Option<Reading>>,
}

impl Default for Station {
    fn default() -> Self {
        Station {
            seconds: Mutex::new(VecDeque::with_capacity(KEEP)),
            last: Mutex::new(None),
        }
    }
}

impl Station {
    /// Close a second: read the recorder, compare with the last tick and
    /// the last minute, keep it.
    pub fn tick(&self, rec: &Recorder, now_unix: u64, inputs: Inputs) {
        let counts: Vec<[u64; BUCKETS]> = rec
            .buckets
            .chunks(COPIES)
            .map(|copies| {
                std::array::from_fn(|i| copies.iter().map(|b| b[i].load(Ordering::Relaxed)).sum())
            })
            .collect();
        let maxes: Vec<u64> = rec
            .max
            .iter()
            .map(|m| m.swap(0, Ordering::Relaxed))
            .collect();
        let slowest = rec.take_slow();
        let now = std::time::Instant::now();
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        let Some((before, prev, at)) = last.replace((counts.clone(), inputs.clone(), now)) else {
            return;
        };
        let secs = now.duration_since(at).as_secs_f64().max(0.001);
        let mut s = Second {
            t: now_unix,
            slowest,
            ..Second::default()
        };
        for (k, kind) in OP_KINDS.iter().enumerate() {
            let delta: Vec<u64> = (0..BUCKETS)
                .map(|i| counts[k][i].saturating_sub(before[k][i]))
                .collect();
            if let Some(o) = op_second(&delta, maxes[k]) {
                s.ops.insert(kind.name(), o);
            }
        }
        fill_inputs(&mut s, &prev, &inputs, secs);
        let Ok(mut seconds) = self.seconds.lock() else {
            return;
        };
        mark(&mut s, seconds.iter().rev().take(BASELINE));
        if seconds.len() == KEEP {
            seconds.pop_front();
        }
        seconds.push_back(s);
    }

    /// The seconds that ended after `since` (unix time), oldest first.
    pub fn since(&self, since: u64) -> Vec<Second> {
        match self.seconds.lock() {
            Ok(s) => s.iter().filter(|s| s.t > since).cloned().collect(),
            Err(_) => Vec::new(),
        }
    }
}

fn op_second(delta: &[u64], max_us: u64) -> Option<OpSecond> {
    let count: u64 = delta.iter().sum();
    if count == 0 {
        return None;
    }
    let at = |q: f64| {
        let want = ((count as f64) * q).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in delta.iter().enumerate() {
            seen += n;
            if seen >= want {
                return (bucket_value(i) / 1000.0).min(max_us as f64 / 1000.0);
            }
        }
        max_us as f64 / 1000.0
    };
    Some(OpSecond {
        count,
        p50: at(0.50),
        p90: at(0.90),
        p99: at(0.99),
        max: max_us as f64 / 1000.0,
    })
}

fn fill_inputs(s: &mut Second, prev: &Inputs, now: &Inputs, secs: f64) {
    let d = |a: u64, b: u64| a.saturating_sub(b);
    s.conns = now.conns_current;
    s.conns_opened = d(now.conns_total, prev.conns_total);
    s.bytes_in = d(now.bytes_in, prev.bytes_in);
    s.bytes_out = d(now.bytes_out, prev.bytes_out);
    s.cpu = d(now.cpu_micros, prev.cpu_micros) as f64 / secs / 10_000.0;
    s.read_bytes = d(now.read_bytes, prev.read_bytes);
    s.write_bytes = d(now.write_bytes, prev.write_bytes);
    let ops: u64 = s.ops.values().map(|o| o.count).sum();
    s.io_per_op = (s.read_bytes + s.write_bytes) as f64 / ops.max(1) as f64;
    s.batches = d(now.batches, prev.batches);
    let batch_ops = d(now.batch_ops, prev.batch_ops);
    if s.batches > 0 {
        s.batch_size = batch_ops as f64 / s.batches as f64;
        s.commit_ms = d(now.commit_micros, prev.commit_micros) as f64 / s.batches as f64 / 1000.0;
    }
    for c in &now.consumers {
        let before = prev.consumers.iter().find(|p| p.rid == c.rid);
        s.consumers.push(ConsumerSecond {
            rid: c.rid,
            phase: c.phase,
            delay_ms: c.delay_ms,
            applied: d(c.applied, before.map_or(0, |b| b.applied)),
            conflicts: d(c.conflicts, before.map_or(0, |b| b.conflicts)),
        });
    }
    s.index_builds = now.index_builds.clone();
}

/// The median of `xs` (0 for none).
fn median(mut xs: Vec<f64>) -> f64 {
    if xs.is_empty() {
        return 0.0;
    }
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// Mark `s` against the seconds before it: an operation type is an
/// outlier when its maximum or p99 is far past its usual p99; what else
/// stood out in the second is listed as its events.
fn mark<'a>(s: &mut Second, before: impl Iterator<Item = &'a Second> + Clone) {
    for (kind, o) in &s.ops {
        let usual = median(
            before
                .clone()
                .filter_map(|b| b.ops.get(kind).map(|x| x.p99))
                .collect(),
        );
        let marked = if usual > 0.0 {
            o.max >= (10.0 * usual).max(50.0) || o.p99 >= (5.0 * usual).max(20.0)
        } else {
            // No history of its own (the first binds, hashing passwords):
            // only what is slow by any measure.
            o.max >= NO_HISTORY_MS
        };
        if marked {
            let was = match usual > 0.0 {
                true => format!("usually p99 {usual:.2} ms"),
                false => "the first in a minute".to_string(),
            };
            s.outliers.push(format!(
                "{kind}: max {:.1} ms, p99 {:.1} ms ({was})",
                o.max, o.p99
            ));
        }
    }
    let usual = |f: fn(&Second) -> f64| median(before.clone().map(f).collect());
    let stands_out = |now: f64, usual: f64, at_least: f64| now >= at_least && now >= 4.0 * usual;
    let io = (s.read_bytes + s.write_bytes) as f64;
    if stands_out(
        io,
        usual(|b| (b.read_bytes + b.write_bytes) as f64),
        8.0 * 1048576.0,
    ) {
        s.events.push(format!(
            "I/O burst: {:.1} MB read and written",
            io / 1048576.0
        ));
    }
    if stands_out(s.commit_ms, usual(|b| b.commit_ms), 20.0) {
        s.events.push(format!(
            "commit stall: {:.1} ms per commit over {} batch(es)",
            s.commit_ms, s.batches
        ));
    }
    if stands_out(
        s.conns_opened as f64,
        usual(|b| b.conns_opened as f64),
        50.0,
    ) {
        s.events.push(format!(
            "connection storm: {} connections opened",
            s.conns_opened
        ));
    }
    for c in &s.consumers {
        if c.phase == "refresh" || c.applied >= 100 {
            s.events.push(format!(
                "replication catch-up: consumer {:03} {} ({} changes applied)",
                c.rid, c.phase, c.applied
            ));
        }
        if c.conflicts > 0 {
            s.events.push(format!(
                "replication conflicts: consumer {:03}: {}",
                c.rid, c.conflicts
            ));
        }
    }
    for i in &s.index_builds {
        s.events.push(format!("index build: {i}"));
    }
    if stands_out(s.cpu, usual(|b| b.cpu), 90.0) {
        s.events.push(format!("CPU: {:.0}% of a core", s.cpu));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_quarter_powers_of_two_and_cover_everything() {
        assert_eq!(bucket(0), 0);
        assert_eq!(bucket(1), 0);
        assert_eq!(bucket(2), 4);
        assert_eq!(bucket(3), 6);
        assert_eq!(bucket(4), 8);
        assert_eq!(bucket(5), 9);
        assert_eq!(bucket(7), 11);
        assert_eq!(bucket(u64::MAX), BUCKETS - 1);
        for us in [1u64, 10, 99, 1000, 12_345, 3_000_000] {
            let v = bucket_value(bucket(us));
            assert!((v - us as f64).abs() <= us as f64 * 0.15, "{us} -> {v}");
        }
    }

    fn run(station: &Station, rec: &Recorder, t: u64, ops: &[(OpKind, u64)], inputs: Inputs) {
        for &(k, us) in ops {
            rec.record(k, us);
            if rec.wants(us) {
                rec.keep(k, us, format!("op of {us} us"));
            }
        }
        station.tick(rec, t, inputs);
    }

    #[test]
    fn a_slow_second_is_marked_and_lined_up_with_what_else_happened() {
        let (station, rec) = (Station::default(), Recorder::default());
        let ordinary: Vec<(OpKind, u64)> = (0..200).map(|i| (OpKind::Search, 200 + i)).collect();
        station.tick(&rec, 999, Inputs::default());
        let mut inputs = Inputs::default();
        for t in 1000..1030 {
            inputs.conns_total += 2;
            inputs.batches += 10;
            inputs.batch_ops += 20;
            inputs.commit_micros += 10 * 1500;
            run(&station, &rec, t, &ordinary, inputs.clone());
        }
        let calm = station.since(0);
        assert_eq!(calm.len(), 30);
        assert!(
            calm.iter()
                .all(|s| s.outliers.is_empty() && s.events.is_empty()),
            "{calm:?}"
        );
        let s = &calm[29];
        assert_eq!(s.ops["search"].count, 200);
        assert!(
            (s.ops["search"].p50 - 0.3).abs() < 0.05,
            "{:?}",
            s.ops["search"]
        );
        assert!((s.ops["search"].max - 0.399).abs() < 0.001);
        assert_eq!(s.slowest.len(), SLOWEST);
        assert_eq!(s.slowest[0].line, "op of 399 us");
        // One search of 1.5 s, a stalled commit and a connection storm.
        let mut slow = ordinary.clone();
        slow.push((OpKind::Search, 1_500_000));
        inputs.conns_total += 300;
        inputs.batches += 1;
        inputs.batch_ops += 1;
        inputs.commit_micros += 900_000;
        run(&station, &rec, 1030, &slow, inputs.clone());
        let s = station.since(1029).pop().unwrap();
        assert_eq!(s.outliers.len(), 1, "{s:?}");
        assert!(
            s.outliers[0].starts_with("search: max 1500.0 ms"),
            "{:?}",
            s.outliers
        );
        assert_eq!(s.slowest[0].line, "op of 1500000 us");
        assert!(
            s.events.iter().any(|e| e.starts_with("commit stall")),
            "{:?}",
            s.events
        );
        assert!(
            s.events
                .iter()
                .any(|e| e.starts_with("connection storm: 300")),
            "{:?}",
            s.events
        );
        // The hour is bounded.
        for t in 1031..1031 + KEEP as u64 {
            station.tick(&rec, t, inputs.clone());
        }
        assert_eq!(station.since(0).len(), KEEP);
    }
}
