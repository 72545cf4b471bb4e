//! `pando stat`: one line per interval, like vmstat/iostat, from a running
//! server's Prometheus endpoint (`--url http://…/metrics`) or its
//! `cn=Monitor` subtree over LDAP (`--url ldap://…` with `-D`/`-w`, or
//! `--url ldapi://…` with SASL EXTERNAL).
//!
//! Every figure is a difference between two samples of the server's
//! cumulative counters. Interval latency percentiles come from the
//! difference of the latency histogram buckets, so they are bucket upper
//! bounds (steps of 1, 1.5, 2, 3, 5, 7 per decade). An interval is marked
//! `*` when its p99 is over 3× the median p99 of the intervals before it,
//! or its max over 10× that median: spikes to line up with the I/O and CPU
//! columns.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::time::{Duration, Instant};

use pando_proto::Scope;

use crate::ldap_client::Ldap;

/// Operation types in column order (abandon is counted in TOTAL only).
const COLUMNS: &[(&str, &str)] = &[
    ("bind", "BIND"),
    ("search", "SEARCH"),
    ("compare", "COMPARE"),
    ("add", "ADD"),
    ("delete", "DELETE"),
    ("modify", "MODIFY"),
    ("moddn", "MODDN"),
    ("unbind", "UNBIND"),
];
const ALL_OPS: &[&str] = &[
    "bind", "search", "compare", "add", "delete", "modify", "moddn", "extended", "abandon",
    "unbind",
];
/// Types whose latency counts in the interval percentiles (abandon and
/// unbind have no response).
const TIMED_OPS: &[&str] = &[
    "bind", "search", "compare", "add", "delete", "modify", "moddn", "extended",
];

#[derive(clap::Args)]
pub struct StatArgs {
    /// Where to read from: http://HOST:PORT/metrics, ldap://HOST:PORT or
    /// ldapi://PATH (percent-encoded socket path).
    #[arg(long, short = 'H', default_value = "http://127.0.0.1:9389/metrics")]
    url: String,
    #[command(flatten)]
    bind: crate::ldap_client::BindArgs,
    /// Seconds between lines.
    #[arg(long, default_value_t = 1.0)]
    interval: f64,
    /// Lines to print, then exit (0 = until interrupted).
    #[arg(long, default_value_t = 0)]
    count: u64,
    /// Comma-separated values with a header line.
    #[arg(long)]
    csv: bool,
}

/// Cumulative figures at one moment.
#[derive(Clone, Debug, Default)]
struct Sample {
    at: Option<Instant>,
    completed: HashMap<String, f64>,
    /// (le in µs, or u64::MAX for +Inf) → cumulative count, summed over
    /// the timed operation types.
    buckets: Vec<(u64, f64)>,
    bytes_in: f64,
    bytes_out: f64,
    read_bytes: f64,
    write_bytes: f64,
    cpu_secs: f64,
    /// Entries consumers applied and deleted (all consumers).
    repl_changes: f64,
    /// The largest delay of a consumer's last change, seconds (None: no
    /// consumer has one).
    repl_delay: Option<f64>,
    /// Changes consumers lack, all server IDs (None: none counted).
    repl_behind: Option<f64>,
}

/// Parse Prometheus text into `name{labels}` → value (labels as written).
pub fn parse_prometheus(text: &str) -> HashMap<String, f64> {
    let mut m = HashMap::new();
    for line in text.lines() {
        if line.starts_with('#') || line.trim().is_empty() {
            continue;
        }
        if let Some((k, v)) = line.rsplit_once(' ') {
            if let Ok(v) = v.parse::<f64>() {
                m.insert(k.to_string(), v);
            }
        }
    }
    m
}

fn label<'a>(key: &'a str, name: &str) -> Option<&'a str> {
    let start = key.find(&format!("{name}=\""))? + name.len() + 2;
    let end = key[start..].find('"')? + start;
    Some(&key[start..end])
}

fn from_prometheus(m: &HashMap<String, f64>) -> Sample {
    let g = |k: &str| m.get(k).copied().unwrap_or(0.0);
    let mut s = Sample {
        bytes_in: g("pando_received_bytes_total"),
        bytes_out: g("pando_sent_bytes_total"),
        read_bytes: g("pando_process_read_bytes_total"),
        write_bytes: g("pando_process_write_bytes_total"),
        cpu_secs: g("process_cpu_seconds_total"),
        ..Sample::default()
    };
    let mut buckets: HashMap<u64, f64> = HashMap::new();
    for (k, v) in m {
        if k.starts_with("pando_repl_applied_total{") || k.starts_with("pando_repl_deleted_total{")
        {
            s.repl_changes += v;
        } else if k.starts_with("pando_repl_delay_seconds{") {
            s.repl_delay = Some(s.repl_delay.unwrap_or(0.0).max(*v));
        } else if k.starts_with("pando_repl_changes_behind{") {
            s.repl_behind = Some(s.repl_behind.unwrap_or(0.0) + v);
        } else if k.starts_with("pando_operations_completed_total{") {
            if let Some(op) = label(k, "op") {
                s.completed.insert(op.to_string(), *v);
            }
        } else if k.starts_with("pando_operation_duration_seconds_bucket{") {
            let (Some(op), Some(le)) = (label(k, "op"), label(k, "le")) else {
                continue;
            };
            if !TIMED_OPS.contains(&op) {
                continue;
            }
            let le = if le == "+Inf" {
                u64::MAX
            } else {
                (le.parse::<f64>().unwrap_or(0.0) * 1e6).round() as u64
            };
            *buckets.entry(le).or_default() += v;
        }
    }
    s.buckets = buckets.into_iter().collect();
    s.buckets.sort_by_key(|b| b.0);
    s
}

fn from_monitor(m: &HashMap<String, HashMap<String, Vec<String>>>) -> Sample {
    let n = |dn: &str, a: &str| -> f64 {
        m.get(dn)
            .and_then(|e| e.get(a))
            .and_then(|v| v.first())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0.0)
    };
    let mut s = Sample {
        bytes_in: n("cn=connections,cn=monitor", "pandobytesin"),
        bytes_out: n("cn=connections,cn=monitor", "pandobytesout"),
        read_bytes: n("cn=monitor", "pandoreadbytes"),
        write_bytes: n("cn=monitor", "pandowritebytes"),
        cpu_secs: n("cn=monitor", "pandocpumicros") / 1e6,
        ..Sample::default()
    };
    let mut buckets: HashMap<u64, f64> = HashMap::new();
    for op in ALL_OPS {
        // Monitor RDNs are cn=Search, cn=Modrdn… (cn=ModDN before slapd's
        // name was taken); DNs were lower-cased.
        let mut dn = format!("cn={op},cn=operations,cn=monitor");
        if *op == "moddn" && m.contains_key("cn=modrdn,cn=operations,cn=monitor") {
            dn = "cn=modrdn,cn=operations,cn=monitor".to_string();
        }
        s.completed.insert(op.to_string(), n(&dn, "pandocompleted"));
        if !TIMED_OPS.contains(op) {
            continue;
        }
        if let Some(vals) = m.get(&dn).and_then(|e| e.get("pandolatencybucket")) {
            for v in vals {
                if let Some((le, c)) = v.split_once(' ') {
                    let le = if le == "+Inf" {
                        u64::MAX
                    } else {
                        le.parse().unwrap_or(0)
                    };
                    *buckets.entry(le).or_default() += c.parse::<f64>().unwrap_or(0.0);
                }
            }
        }
    }
    s.buckets = buckets.into_iter().collect();
    s.buckets.sort_by_key(|b| b.0);
    for (dn, attrs) in m {
        if !dn.ends_with(",cn=replication,cn=monitor") {
            continue;
        }
        for a in ["pandoreplapplied", "pandorepldeleted"] {
            s.repl_changes += n(dn, a);
        }
        for v in attrs.get("pandorepldelay").into_iter().flatten() {
            if let Some(d) = v.split_once(' ').and_then(|(_, d)| d.parse::<f64>().ok()) {
                s.repl_delay = Some(s.repl_delay.unwrap_or(0.0).max(d));
            }
        }
        for v in attrs.get("pandoreplchangesbehind").into_iter().flatten() {
            let count = v.rsplit_once('=').and_then(|(_, n)| n.parse::<f64>().ok());
            if let Some(n) = count {
                s.repl_behind = Some(s.repl_behind.unwrap_or(0.0) + n);
            }
        }
    }
    s
}

enum Source {
    Http { addr: String, path: String },
    Ldap(Box<Ldap>),
}

impl Source {
    fn open(args: &StatArgs) -> Result<Source, String> {
        if let Some(rest) = args.url.strip_prefix("http://") {
            let (addr, path) = match rest.find('/') {
                Some(i) => (&rest[..i], &rest[i..]),
                None => (rest, "/metrics"),
            };
            return Ok(Source::Http {
                addr: addr.to_string(),
                path: path.to_string(),
            });
        }
        let l = args.bind.open(&args.url)?;
        Ok(Source::Ldap(Box::new(l)))
    }

    fn sample(&mut self) -> Result<Sample, String> {
        let mut s = match self {
            Source::Http { addr, path } => {
                from_prometheus(&parse_prometheus(&http_get(addr, path)?))
            }
            Source::Ldap(l) => from_monitor(&l.search_all("cn=Monitor", Scope::Sub, &[]).map_err(|e| {
                format!("reading cn=Monitor failed: {e} (administrators only, unless [[access]] grants it)")
            })?),
        };
        s.at = Some(Instant::now());
        Ok(s)
    }
}

fn http_get(addr: &str, path: &str) -> Result<String, String> {
    let mut s =
        std::net::TcpStream::connect(addr).map_err(|e| format!("cannot connect to {addr}: {e}"))?;
    let _ = s.set_read_timeout(Some(Duration::from_secs(10)));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .map_err(|e| format!("{addr}: {e}"))?;
    let mut body = String::new();
    s.read_to_string(&mut body)
        .map_err(|e| format!("{addr}: {e}"))?;
    let (head, rest) = body
        .split_once("\r\n\r\n")
        .ok_or_else(|| format!("{addr}: not an HTTP response"))?;
    if !head.starts_with("HTTP/1.1 200") && !head.starts_with("HTTP/1.0 200") {
        return Err(format!(
            "{addr}{path}: {}",
            head.lines().next().unwrap_or("no status")
        ));
    }
    Ok(rest.to_string())
}

/// One interval's figures.
#[derive(Debug, Default, PartialEq)]
struct Line {
    rates: Vec<f64>,
    total: f64,
    /// Interval latency percentiles (bucket upper bounds), microseconds;
    /// None without timed operations.
    p50: Option<u64>,
    p99: Option<u64>,
    max: Option<u64>,
    in_rate: f64,
    out_rate: f64,
    read_rate: f64,
    write_rate: f64,
    read_per_op: f64,
    write_per_op: f64,
    cpu: f64,
    /// Entries consumers applied or deleted per second.
    repl_rate: f64,
    /// Seconds (the largest consumer's last-change delay).
    repl_delay: Option<f64>,
    /// Changes consumers lack (as last counted).
    repl_behind: Option<f64>,
}

fn quantile(diff: &[(u64, f64)], q: f64) -> Option<u64> {
    let total = diff.last().map(|d| d.1)?;
    if total <= 0.0 {
        return None;
    }
    let want = (q * total).max(1.0);
    diff.iter().find(|d| d.1 >= want - 1e-9).map(|d| d.0)
}

fn interval(a: &Sample, b: &Sample) -> Line {
    let secs = match (a.at, b.at) {
        (Some(x), Some(y)) => y.duration_since(x).as_secs_f64().max(1e-6),
        _ => 1.0,
    };
    let d = |x: f64, y: f64| (y - x).max(0.0);
    let op = |name: &str| {
        d(
            a.completed.get(name).copied().unwrap_or(0.0),
            b.completed.get(name).copied().unwrap_or(0.0),
        )
    };
    let total_ops: f64 = ALL_OPS.iter().map(|o| op(o)).sum();
    let diff: Vec<(u64, f64)> = b
        .buckets
        .iter()
        .map(|(le, c)| {
            let before = a
                .buckets
                .iter()
                .find(|x| x.0 == *le)
                .map(|x| x.1)
                .unwrap_or(0.0);
            (*le, d(before, *c))
        })
        .collect();
    // The highest bucket whose count grew holds the interval's max.
    let mut max = None;
    let mut prev = 0.0;
    for (le, c) in &diff {
        if *c > prev {
            max = Some(*le);
        }
        prev = *c;
    }
    let read = d(a.read_bytes, b.read_bytes);
    let write = d(a.write_bytes, b.write_bytes);
    Line {
        rates: COLUMNS.iter().map(|(o, _)| op(o) / secs).collect(),
        total: total_ops / secs,
        p50: quantile(&diff, 0.50),
        p99: quantile(&diff, 0.99),
        max,
        in_rate: d(a.bytes_in, b.bytes_in) / secs,
        out_rate: d(a.bytes_out, b.bytes_out) / secs,
        read_rate: read / secs,
        write_rate: write / secs,
        read_per_op: if total_ops > 0.0 {
            read / total_ops
        } else {
            0.0
        },
        write_per_op: if total_ops > 0.0 {
            write / total_ops
        } else {
            0.0
        },
        cpu: d(a.cpu_secs, b.cpu_secs) / secs * 100.0,
        repl_rate: d(a.repl_changes, b.repl_changes) / secs,
        repl_delay: b.repl_delay,
        repl_behind: b.repl_behind,
    }
}

fn us(v: Option<u64>) -> String {
    match v {
        None => "-".into(),
        Some(u64::MAX) => ">10s".into(),
        Some(v) if v >= 1_000_000 => format!("{:.1}s", v as f64 / 1e6),
        Some(v) if v >= 1_000 => format!("{:.1}ms", v as f64 / 1e3),
        Some(v) => format!("{v}us"),
    }
}

fn csv_us(v: Option<u64>) -> String {
    match v {
        None => String::new(),
        Some(u64::MAX) => "inf".into(),
        Some(v) => v.to_string(),
    }
}

fn human(v: f64) -> String {
    if v >= 1e9 {
        format!("{:.1}G", v / 1e9)
    } else if v >= 1e6 {
        format!("{:.1}M", v / 1e6)
    } else if v >= 1e4 {
        format!("{:.0}k", v / 1e3)
    } else {
        format!("{v:.0}")
    }
}

/// Outlier detection against the median p99 of earlier intervals.
#[derive(Default)]
struct Outliers {
    p99s: Vec<u64>,
}

impl Outliers {
    fn check(&mut self, l: &Line) -> bool {
        let Some(p99) = l.p99 else { return false };
        let mut sorted = self.p99s.clone();
        sorted.sort_unstable();
        let flagged = if sorted.len() >= 3 {
            let median = sorted[sorted.len() / 2].max(1);
            p99 > median.saturating_mul(3) || l.max.unwrap_or(0) > median.saturating_mul(10)
        } else {
            false
        };
        self.p99s.push(p99);
        flagged
    }
}

const HEADER_COLS: &[&str] = &[
    "TOTAL", "BIND", "SEARCH", "COMPARE", "ADD", "DELETE", "MODIFY", "MODDN", "UNBIND", "p50",
    "p99", "max", "in/s", "out/s", "rd/s", "wr/s", "rd/op", "wr/op", "cpu%", "repl/s", "rdelay",
    "rbehind",
];

fn text_header() -> String {
    let mut h = format!("{:<8}", "time");
    for c in HEADER_COLS {
        h.push_str(&format!(" {c:>7}"));
    }
    h
}

fn csv_header() -> String {
    let mut h = String::from("time");
    for c in HEADER_COLS {
        h.push(',');
        h.push_str(
            &c.to_ascii_lowercase()
                .replace('/', "_per_")
                .replace('%', "_pct"),
        );
    }
    h.push_str(",outlier");
    h
}

fn now_hms() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let s = secs % 86_400;
    format!("{:02}:{:02}:{:02}", s / 3600, s % 3600 / 60, s % 60)
}

fn render(l: &Line, outlier: bool, csv: bool) -> String {
    let time = now_hms();
    if csv {
        let mut o = time;
        o.push_str(&format!(",{:.1}", l.total));
        for r in &l.rates {
            o.push_str(&format!(",{r:.1}"));
        }
        for v in [l.p50, l.p99, l.max] {
            o.push(',');
            o.push_str(&csv_us(v));
        }
        for v in [
            l.in_rate,
            l.out_rate,
            l.read_rate,
            l.write_rate,
            l.read_per_op,
            l.write_per_op,
        ] {
            o.push_str(&format!(",{v:.0}"));
        }
        let delay = l.repl_delay.map_or(String::new(), |d| format!("{d:.3}"));
        let behind = l.repl_behind.map_or(String::new(), |b| format!("{b:.0}"));
        o.push_str(&format!(
            ",{:.1},{:.1},{delay},{behind},{}",
            l.cpu,
            l.repl_rate,
            u8::from(outlier)
        ));
        o
    } else {
        let mut o = format!("{time:<8}");
        o.push_str(&format!(" {:>7}", human(l.total)));
        for r in &l.rates {
            o.push_str(&format!(" {:>7}", human(*r)));
        }
        for v in [l.p50, l.p99, l.max] {
            o.push_str(&format!(" {:>7}", us(v)));
        }
        for v in [
            l.in_rate,
            l.out_rate,
            l.read_rate,
            l.write_rate,
            l.read_per_op,
            l.write_per_op,
        ] {
            o.push_str(&format!(" {:>7}", human(v)));
        }
        o.push_str(&format!(" {:>7.1}", l.cpu));
        o.push_str(&format!(" {:>7}", human(l.repl_rate)));
        let delay = l
            .repl_delay
            .map_or("-".to_string(), |d| us(Some((d * 1e6) as u64)));
        o.push_str(&format!(" {delay:>7}"));
        let behind = l.repl_behind.map_or("-".to_string(), human);
        o.push_str(&format!(" {behind:>7}"));
        if outlier {
            o.push_str(" *");
        }
        o
    }
}

pub fn run(args: StatArgs) -> Result<std::process::ExitCode, String> {
    if !(args.interval > 0.0 && args.interval.is_finite()) {
        return Err("--interval must be a positive number of seconds".into());
    }
    let mut src = Source::open(&args)?;
    let mut prev = src.sample()?;
    let mut outliers = Outliers::default();
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    let header = if args.csv {
        csv_header()
    } else {
        text_header()
    };
    writeln!(out, "{header}").map_err(|e| e.to_string())?;
    let mut printed = 0u64;
    while args.count == 0 || printed < args.count {
        std::thread::sleep(Duration::from_secs_f64(args.interval));
        let cur = src.sample()?;
        let line = interval(&prev, &cur);
        let flagged = outliers.check(&line);
        writeln!(out, "{}", render(&line, flagged, args.csv)).map_err(|e| e.to_string())?;
        out.flush().map_err(|e| e.to_string())?;
        prev = cur;
        printed += 1;
    }
    Ok(std::process::ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(at: Instant, searches: f64, buckets: &[(u64, f64)]) -> Sample {
        let mut s = Sample {
            at: Some(at),
            ..Sample::default()
        };
        s.completed.insert("search".into(), searches);
        s.buckets = buckets.to_vec();
        s
    }

    #[test]
    fn interval_rates_and_percentiles() {
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(2);
        let a = sample(t0, 100.0, &[(100, 90.0), (1000, 100.0), (u64::MAX, 100.0)]);
        // 200 more: 196 under 100 µs, 3 under 1 ms, 1 slower.
        let b = sample(t1, 300.0, &[(100, 286.0), (1000, 299.0), (u64::MAX, 300.0)]);
        let l = interval(&a, &b);
        assert_eq!(l.rates[1], 100.0);
        assert_eq!(l.total, 100.0);
        assert_eq!(l.p50, Some(100));
        assert_eq!(l.p99, Some(1000));
        assert_eq!(l.max, Some(u64::MAX));
    }

    #[test]
    fn outliers_need_history() {
        let mut o = Outliers::default();
        let line = |p99| Line {
            p99: Some(p99),
            max: Some(p99),
            ..Line::default()
        };
        assert!(!o.check(&line(100)));
        assert!(!o.check(&line(100)));
        assert!(!o.check(&line(120)));
        assert!(o.check(&line(1000)));
        assert!(!o.check(&line(110)));
    }

    #[test]
    fn prometheus_samples() {
        let text = "# HELP x y\n# TYPE x counter\n\
            pando_operations_completed_total{op=\"search\"} 7\n\
            pando_operation_duration_seconds_bucket{op=\"search\",le=\"0.000100\"} 5\n\
            pando_operation_duration_seconds_bucket{op=\"search\",le=\"+Inf\"} 7\n\
            pando_received_bytes_total 1000\n";
        let s = from_prometheus(&parse_prometheus(text));
        assert_eq!(s.completed["search"], 7.0);
        assert_eq!(s.buckets, vec![(100, 5.0), (u64::MAX, 7.0)]);
        assert_eq!(s.bytes_in, 1000.0);
    }
}
