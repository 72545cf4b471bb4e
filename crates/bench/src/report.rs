//! What a run prints: one line per interval, then the summary (text, or
//! one JSON object with `--json`), and a `RESULT key=value ...` line in the
//! format of the shared benchmark kit's `load.sh`, so scripts can compare
//! the two generators.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::config::{OpKind, Plan};
use crate::stats::{KindStats, Latency, Stats};

/// One interval's figures (all operations together).
#[derive(Clone, Debug)]
pub struct Line {
    /// End of the interval, from the end of the warm-up.
    pub t: Duration,
    pub ops: u64,
    pub ops_per_s: f64,
    pub errors: u64,
    pub lat: Latency,
}

impl Line {
    pub fn new(t: Duration, span: Duration, stats: &Stats) -> Line {
        let k = stats.total();
        let secs = span.as_secs_f64();
        Line {
            t,
            ops: k.ops,
            ops_per_s: if secs > 0.0 { k.ops as f64 / secs } else { 0.0 },
            errors: k.errors,
            lat: k.latency(),
        }
    }

    pub fn header() -> String {
        format!(
            "{:>8} {:>10} {:>9} {:>9} {:>9} {:>9} {:>7}",
            "time s", "ops/s", "mean ms", "p50 ms", "p99 ms", "max ms", "errors"
        )
    }

    pub fn text(&self) -> String {
        format!(
            "{:>8.1} {:>10.1} {:>9.3} {:>9.3} {:>9.3} {:>9.3} {:>7}",
            self.t.as_secs_f64(),
            self.ops_per_s,
            self.lat.mean,
            self.lat.p50,
            self.lat.p99,
            self.lat.max,
            self.errors
        )
    }

    fn json(&self) -> Value {
        json!({
            "t_s": round(self.t.as_secs_f64(), 3),
            "ops": self.ops,
            "ops_per_s": round(self.ops_per_s, 1),
            "errors": self.errors,
            "mean_ms": round(self.lat.mean, 4),
            "p50_ms": round(self.lat.p50, 4),
            "p99_ms": round(self.lat.p99, 4),
            "max_ms": round(self.lat.max, 4),
        })
    }
}

fn round(v: f64, digits: i32) -> f64 {
    let m = 10f64.powi(digits);
    (v * m).round() / m
}

/// CPU time used so far by this process, optionally the server, and the
/// whole machine.
#[derive(Clone, Copy, Debug)]
pub struct CpuSample {
    at: Instant,
    client_s: f64,
    server_s: Option<f64>,
    /// Busy time of all CPUs (user, nice, system, irq, softirq).
    machine_s: Option<f64>,
}

fn clock_ticks() -> f64 {
    // SAFETY: sysconf only reads a configuration value.
    let t = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    if t > 0 {
        t as f64
    } else {
        100.0
    }
}

fn self_cpu_s() -> f64 {
    // SAFETY: getrusage fills the zeroed struct we own; RUSAGE_SELF is valid.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// utime + stime of a process from /proc/PID/stat (fields 14 and 15).
fn pid_cpu_s(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces; count from the ')' after it.
    let rest = s.get(s.rfind(')')? + 2..)?;
    let mut f = rest.split(' ').skip(11);
    let ut: f64 = f.next()?.parse().ok()?;
    let st: f64 = f.next()?.parse().ok()?;
    Some((ut + st) / clock_ticks())
}

/// Busy seconds of all CPUs from the first line of /proc/stat:
/// `cpu user nice system idle iowait irq softirq steal ...`.
fn machine_busy_s() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/stat").ok()?;
    let v: Vec<f64> = s
        .lines()
        .next()?
        .split_whitespace()
        .skip(1)
        .take(7)
        .map(|x| x.parse().unwrap_or(0.0))
        .collect();
    let busy = v.first()? + v.get(1)? + v.get(2)? + v.get(5)? + v.get(6)?;
    Some(busy / clock_ticks())
}

impl CpuSample {
    pub fn now(server_pid: Option<u32>) -> CpuSample {
        CpuSample {
            at: Instant::now(),
            client_s: self_cpu_s(),
            server_s: server_pid.and_then(pid_cpu_s),
            machine_s: machine_busy_s(),
        }
    }
}

/// The run's result.
pub struct Summary<'a> {
    pub plan: &'a Plan,
    /// Measured time.
    pub elapsed: Duration,
    pub stats: Stats,
    pub intervals: Vec<Line>,
    /// CPU samples at the start and end of the measured time.
    pub cpu: Option<(CpuSample, CpuSample)>,
    pub stopped: Option<String>,
    pub fatal: Option<String>,
    /// add/delete ran out of keys before the end.
    pub keys_used_up: bool,
}

/// The line printed before the run.
pub fn banner(plan: &Plan) -> String {
    let mode = match plan.rate {
        Some(r) => format!("open loop at {r}/s"),
        None => "closed loop".into(),
    };
    let length = match (plan.duration, plan.count) {
        (Some(d), Some(n)) => format!("{n} ops or {:.1} s", d.as_secs_f64()),
        (Some(d), None) => format!("{:.1} s", d.as_secs_f64()),
        (None, Some(n)) => format!("{n} ops"),
        (None, None) => String::new(),
    };
    let ops = if plan.ops.len() > 1 {
        let mut prev = 0;
        let parts: Vec<String> = plan
            .ops
            .iter()
            .map(|o| {
                let w = o.upto - prev;
                prev = o.upto;
                format!("{}={w}", o.kind.name())
            })
            .collect();
        format!(" ({})", parts.join(","))
    } else {
        String::new()
    };
    format!(
        "pando bench {}{ops} against {}: {} connection(s), depth {}, {} thread(s), {mode}, {length} after {:.1} s warm-up\n{}",
        plan.workload_name(),
        plan.url,
        plan.connections,
        plan.depth,
        plan.threads,
        plan.warmup.as_secs_f64(),
        Line::header()
    )
}

/// Percentages of one core over the measured time.
struct Cpu {
    client_pct: f64,
    server_pct: Option<f64>,
    /// All CPUs together (200% = both cores of a 2-core machine).
    machine_pct: Option<f64>,
}

impl Cpu {
    /// What neither this process nor the server used: other processes
    /// (noise) plus kernel network work accounted to neither.
    fn other_pct(&self) -> Option<f64> {
        Some(self.machine_pct? - self.client_pct - self.server_pct?)
    }
}

impl Summary<'_> {
    fn secs(&self) -> f64 {
        self.elapsed.as_secs_f64()
    }

    fn rate(&self, ops: u64) -> f64 {
        if self.secs() > 0.0 {
            ops as f64 / self.secs()
        } else {
            0.0
        }
    }

    fn cpu(&self) -> Option<Cpu> {
        let (a, b) = self.cpu?;
        let wall = b.at.saturating_duration_since(a.at).as_secs_f64();
        if wall <= 0.0 {
            return None;
        }
        Some(Cpu {
            client_pct: 100.0 * (b.client_s - a.client_s) / wall,
            server_pct: match (a.server_s, b.server_s) {
                (Some(x), Some(y)) => Some(100.0 * (y - x) / wall),
                _ => None,
            },
            machine_pct: match (a.machine_s, b.machine_s) {
                (Some(x), Some(y)) => Some(100.0 * (y - x) / wall),
                _ => None,
            },
        })
    }

    /// Things the user should know about the numbers.
    pub fn warnings(&self) -> Vec<String> {
        let mut w = Vec::new();
        for (share, k) in self.plan.ops.iter().zip(&self.stats.kinds) {
            if share.kind == OpKind::Search && k.empty > 0 {
                w.push(format!(
                    "{} of {} searches ({:.1}%) returned no entry: check --range and --filter against the data",
                    k.empty,
                    k.ops,
                    100.0 * k.empty as f64 / k.ops.max(1) as f64
                ));
            }
        }
        if let Some(r) = self.plan.rate {
            let t = self.stats.total();
            let achieved = self.rate(t.ops + t.errors);
            if self.secs() > 0.0 && achieved < 0.95 * r {
                w.push(format!(
                    "the target was {r}/s but only {achieved:.1}/s completed: the server (or this machine) fell behind, latencies include the backlog"
                ));
            }
        }
        if self.keys_used_up {
            w.push(format!(
                "every key of --range was used ({} {}s), so the run ended before its time",
                self.plan.keys.n,
                self.plan.workload_name()
            ));
        }
        if let Some(s) = &self.stopped {
            w.push(format!("the run was stopped early: {s}"));
        }
        w
    }

    pub fn text(&self) -> String {
        let mut o = String::new();
        let t = self.stats.total();
        let l = t.latency();
        let _ = writeln!(
            o,
            "--- {}: {} ops in {:.2} s = {:.1} ops/s",
            self.plan.workload_name(),
            t.ops,
            self.secs(),
            self.rate(t.ops)
        );
        let _ = writeln!(
            o,
            "latency ms: mean {:.3}  p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  max {:.3}",
            l.mean, l.p50, l.p90, l.p99, l.p999, l.max
        );
        let _ = writeln!(o, "errors: {}", t.errors);
        for (k, n) in &t.by_error {
            let _ = writeln!(o, "  {}: {n}", k.describe());
        }
        if self.plan.ops.len() > 1 {
            let _ = writeln!(o, "by operation:");
            for (share, k) in self.plan.ops.iter().zip(&self.stats.kinds) {
                let l = k.latency();
                let _ = writeln!(
                    o,
                    "  {:<7} {:>9} ops {:>10.1}/s  mean {:.3}  p50 {:.3}  p99 {:.3}  max {:.3} ms  errors {}",
                    share.kind.name(),
                    k.ops,
                    self.rate(k.ops),
                    l.mean,
                    l.p50,
                    l.p99,
                    l.max,
                    k.errors
                );
            }
        }
        if t.entries > 0 {
            let searches: u64 = self
                .plan
                .ops
                .iter()
                .zip(&self.stats.kinds)
                .filter(|(s, _)| s.kind == OpKind::Search)
                .map(|(_, k)| k.ops)
                .sum();
            let _ = writeln!(
                o,
                "entries returned: {} ({:.2} per search)",
                t.entries,
                t.entries as f64 / searches.max(1) as f64
            );
        }
        if let Some(c) = self.cpu() {
            let per_op = if t.ops + t.errors > 0 {
                format!(
                    " ({:.1} µs of CPU per operation)",
                    c.client_pct / 100.0 * self.secs() * 1e6 / (t.ops + t.errors) as f64
                )
            } else {
                String::new()
            };
            let _ = write!(o, "cpu: pando bench {:.0}% of a core{per_op}", c.client_pct);
            if let Some(s) = c.server_pct {
                let _ = write!(o, ", server {s:.0}%");
            }
            if let Some(m) = c.machine_pct {
                let _ = write!(o, ", machine {m:.0}%");
            }
            if let Some(x) = c.other_pct() {
                let _ = write!(o, ", other processes and kernel {x:.0}%");
            }
            o.push('\n');
        }
        for w in self.warnings() {
            let _ = writeln!(o, "warning: {w}");
        }
        if let Some(f) = &self.fatal {
            let _ = writeln!(o, "error: {f}");
        }
        let _ = writeln!(o, "{}", self.result_line());
        o
    }

    /// `RESULT workload=... ops_per_s=... mean_ms=... p99_ms=...`, the
    /// fields of `load.sh`'s line that apply.
    pub fn result_line(&self) -> String {
        let t = self.stats.total();
        let l = t.latency();
        let mut s = format!(
            "RESULT workload={} server={} conns={} depth={} threads={} secs={:.2} ops={} ops_per_s={:.1} mean_ms={:.3} p50_ms={:.3} p99_ms={:.3} max_ms={:.3} errors={}",
            self.plan.workload_name(),
            self.plan.label.replace(char::is_whitespace, "_"),
            self.plan.connections,
            self.plan.depth,
            self.plan.threads,
            self.secs(),
            t.ops,
            self.rate(t.ops),
            l.mean,
            l.p50,
            l.p99,
            l.max,
            t.errors
        );
        if let Some(c) = self.cpu() {
            let _ = write!(s, " cpu_client={:.0}%", c.client_pct);
            if let Some(sv) = c.server_pct {
                let _ = write!(s, " cpu_server={sv:.0}%");
            }
            if let Some(x) = c.other_pct() {
                let _ = write!(s, " cpu_other={x:.0}%");
            }
            if let Some(m) = c.machine_pct {
                let _ = write!(s, " cpu_machine={m:.0}%");
            }
        }
        if let Some(r) = self.plan.rate {
            let _ = write!(s, " target_rate={r}");
        }
        s.push_str(" client=pando-bench");
        s
    }

    fn kind_json(&self, k: &KindStats) -> Value {
        let l = k.latency();
        json!({
            "ops": k.ops,
            "ops_per_s": round(self.rate(k.ops), 1),
            "errors": k.errors,
            "errors_by_code": k.by_error.iter().map(|(e, n)| json!({
                "code": e.code(), "name": e.name(), "count": n,
            })).collect::<Vec<_>>(),
            "latency_ms": {
                "mean": round(l.mean, 4),
                "p50": round(l.p50, 4),
                "p90": round(l.p90, 4),
                "p99": round(l.p99, 4),
                "p999": round(l.p999, 4),
                "max": round(l.max, 4),
            },
        })
    }

    pub fn json(&self) -> Value {
        let t = self.stats.total();
        let mut v = self.kind_json(&t);
        let by_op: serde_json::Map<String, Value> = self
            .plan
            .ops
            .iter()
            .zip(&self.stats.kinds)
            .map(|(s, k)| {
                let mut j = self.kind_json(k);
                if s.kind == OpKind::Search {
                    j["entries"] = json!(k.entries);
                    j["empty_searches"] = json!(k.empty);
                }
                (s.kind.name().to_string(), j)
            })
            .collect();
        let cpu = self.cpu();
        let extra = json!({
            "workload": self.plan.workload_name(),
            "url": self.plan.url,
            "label": self.plan.label,
            "connections": self.plan.connections,
            "depth": self.plan.depth,
            "threads": self.plan.threads,
            "mode": if self.plan.rate.is_some() { "open" } else { "closed" },
            "target_rate": self.plan.rate,
            "warmup_s": self.plan.warmup.as_secs_f64(),
            "elapsed_s": round(self.secs(), 3),
            "entries": t.entries,
            "empty_searches": t.empty,
            "by_op": by_op,
            "intervals": self.intervals.iter().map(Line::json).collect::<Vec<_>>(),
            "cpu_client_pct": cpu.as_ref().map(|c| round(c.client_pct, 1)),
            "cpu_server_pct": cpu.as_ref().and_then(|c| c.server_pct).map(|p| round(p, 1)),
            "cpu_machine_pct": cpu.as_ref().and_then(|c| c.machine_pct).map(|p| round(p, 1)),
            "stopped": self.stopped,
            "fatal": self.fatal,
            "warnings": self.warnings(),
            "result": self.result_line(),
        });
        if let (Some(obj), Value::Object(more)) = (v.as_object_mut(), extra) {
            obj.extend(more);
        }
        v
    }
}
