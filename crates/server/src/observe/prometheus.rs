//! The Prometheus endpoint (`[metrics] listen`): `GET /metrics` answers the
//! figures of `cn=Monitor` in the text exposition format 0.0.4; anything
//! else is 404 (405 for other methods), but for the dashboard's paths when
//! it is on (`super::dashboard`). The HTTP is `pando_web`'s: one request
//! per connection, which is all scrapers and the dashboard need.
//!
//! Latencies are exported twice: as a histogram
//! (`pando_operation_duration_seconds`, buckets from 10 µs to 10 s, from
//! which `pando stat` computes per-interval percentiles) and as a summary
//! of the HDR percentiles since start (`pando_operation_latency_seconds`).

use std::fmt::Write as _;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::state::Server;
use pando_observe::metrics::{Metrics, ProcessFigures, LATENCY_BOUNDS, OP_KINDS};

use pando_web::READ_TIMEOUT;

/// Bind the endpoint (inside the runtime: the socket is registered with it).
pub fn bind(addr: std::net::SocketAddr) -> Result<TcpListener, String> {
    let named = |e: std::io::Error| format!("metrics.listen: cannot listen on {addr}: {e}");
    let l = std::net::TcpListener::bind(addr).map_err(named)?;
    l.set_nonblocking(true).map_err(named)?;
    TcpListener::from_std(l).map_err(named)
}

/// The server's TLS context as it is now (a SIGHUP may replace it).
pub type TlsNow = Arc<dyn Fn() -> Option<Arc<crate::net::tls::TlsContext>> + Send + Sync>;

/// Answer on `listener` until `shutdown` flips, or `stop` (the endpoint
/// moved or was turned off); with the dashboard on, close a second on its
/// station every second.
pub async fn serve(
    listener: TcpListener,
    live: Arc<dyn crate::state::Current>,
    tls_now: TlsNow,
    mut shutdown: watch::Receiver<bool>,
    mut stop: watch::Receiver<bool>,
) {
    let local = listener.local_addr().ok();
    if let Some(a) = local {
        tracing::info!("metrics endpoint: http://{a}/metrics");
        if !a.ip().is_loopback() {
            tracing::warn!(
                "metrics.listen {a} is not a loopback address: anyone who can reach it reads the server's figures"
            );
        }
    }
    let exposed = local.is_some_and(|a| !a.ip().is_loopback());
    let mut second = tokio::time::interval(Duration::from_secs(1));
    second.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = stop.changed() => return,
            _ = second.tick() => {
                let server = live.server();
                if server.cfg.config.metrics.dashboard {
                    super::dashboard::tick(&server);
                }
            }
            a = listener.accept() => match a {
                Ok((stream, _)) => {
                    let server = live.server();
                    let tls = tls_now();
                    tokio::spawn(async move {
                        let secure = exposed && server.cfg.config.metrics.dashboard;
                        let _ = tokio::time::timeout(READ_TIMEOUT * 2, async move {
                            match (secure, tls) {
                                (false, _) => answer(stream, server, false).await,
                                (true, Some(tls)) => {
                                    if let Ok(s) = tls.accept(stream).await {
                                        answer(s.stream, server, true).await;
                                    }
                                }
                                // Refused by the configuration's check.
                                (true, None) => {}
                            }
                        })
                        .await;
                    });
                }
                Err(e) => {
                    tracing::warn!("metrics endpoint: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }
}

/// Answer one request on `stream`; `secure`: the endpoint is exposed, the
/// dashboard asks for credentials.
async fn answer<S>(mut stream: S, server: Arc<Server>, secure: bool)
where
    S: AsyncRead + AsyncWrite + Unpin,
{
    let req = match pando_web::read_request(&mut stream).await {
        Ok(r) => r,
        Err(reply) => {
            if !reply.is_empty() {
                pando_web::send(&mut stream, "GET", reply).await;
            }
            return;
        }
    };
    let dashboard = server.cfg.config.metrics.dashboard && req.path.starts_with("/dashboard");
    let reply = match (req.method.as_str(), req.path.as_str()) {
        ("GET", "/metrics") | ("HEAD", "/metrics") => {
            let s = server.clone();
            let body = tokio::task::spawn_blocking(move || render(&s))
                .await
                .unwrap_or_default();
            pando_web::response(
                200,
                "text/plain; version=0.0.4; charset=utf-8",
                body.as_bytes(),
            )
        }
        ("GET", _) | ("HEAD", _) if dashboard => {
            if secure && !super::dashboard::authorized(&server, &req).await {
                pando_web::unauthorized(
                    "pando dashboard",
                    "the dashboard asks for the root DN and its password",
                )
            } else {
                super::dashboard::answer(&server, &req)
            }
        }
        ("GET", _) | ("HEAD", _) => {
            pando_web::response(404, "text/plain", b"not found: try /metrics\n")
        }
        _ => pando_web::response(405, "text/plain", b"method not allowed\n"),
    };
    pando_web::send(&mut stream, &req.method, reply).await;
}

/// Writes one metric family: HELP, TYPE, then its samples.
struct Text {
    out: String,
}

impl Text {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, v: impl std::fmt::Display) {
        if labels.is_empty() {
            let _ = writeln!(self.out, "{name} {v}");
        } else {
            let _ = writeln!(self.out, "{name}{{{labels}}} {v}");
        }
    }

    fn one(&mut self, name: &str, kind: &str, help: &str, v: impl std::fmt::Display) {
        self.family(name, kind, help);
        self.sample(name, "", v);
    }
}

fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

fn secs(us: u64) -> String {
    format!("{}.{:06}", us / 1_000_000, us % 1_000_000)
}

/// The change log's size and the contextCSN per server ID.
fn change_log(t: &mut Text, server: &Server) {
    if let Ok(r) = server.rt.store.read() {
        let view = r.view();
        if let Ok(log) = view.changelog_summary() {
            t.one(
                "pando_changelog_records",
                "gauge",
                "Records in the change log.",
                log.count,
            );
        }
        if let Ok(csns) = view.context_csns() {
            t.family(
                "pando_context_csn_timestamp_seconds",
                "gauge",
                "Time of the newest change held, per server ID (contextCSN): compare across servers for lag.",
            );
            for csn in csns {
                let (Some(sid), Ok((us, _))) = (
                    pando_proto::sync::csn_sid(&csn),
                    pando_store::clock::parse_csn(&csn),
                ) else {
                    continue;
                };
                t.sample(
                    "pando_context_csn_timestamp_seconds",
                    &format!("sid=\"{sid:03x}\""),
                    secs(us),
                );
            }
        }
    }
}

/// The change log, contextCSN per server ID, and each consumer's figures
/// (labelled by rid, and by server ID for delays).
fn replication(t: &mut Text, server: &Server) {
    change_log(t, server);
    let statuses: Vec<(u16, crate::repl::consumer::Status)> = crate::repl::Replicas::of(server)
        .list()
        .iter()
        .filter_map(|r| r.snapshot().map(|s| (r.rid, s)))
        .collect();
    if statuses.is_empty() {
        return;
    }
    type Figure = fn(&crate::repl::consumer::Status) -> u64;
    let counters: [(&str, &str, Figure); 6] = [
        (
            "pando_repl_applied_total",
            "Entries a consumer added or changed from its provider.",
            |s| s.applied,
        ),
        (
            "pando_repl_deleted_total",
            "Entries a consumer deleted as its provider said.",
            |s| s.deleted,
        ),
        (
            "pando_repl_sessions_total",
            "Sessions a consumer started.",
            |s| s.refreshes,
        ),
        (
            "pando_repl_reloads_total",
            "Reloads a provider asked a consumer for (e-syncRefreshRequired).",
            |s| s.reloads,
        ),
        (
            "pando_repl_failures_total",
            "Failed consumer sessions.",
            |s| s.failures,
        ),
        (
            "pando_repl_conflicts_total",
            "Received changes that met a different state at a consumer (an older copy, another entry at its DN).",
            |s| s.conflicts,
        ),
    ];
    for (name, help, f) in counters {
        t.family(name, "counter", help);
        for (rid, s) in &statuses {
            t.sample(name, &format!("rid=\"{rid:03}\""), f(s));
        }
    }
    t.family(
        "pando_repl_connected",
        "gauge",
        "1 while a consumer is in its refresh or persist stage.",
    );
    for (rid, s) in &statuses {
        let up = u8::from(matches!(s.phase, "refresh" | "persist"));
        t.sample("pando_repl_connected", &format!("rid=\"{rid:03}\""), up);
    }
    use crate::repl::consumer::Status;
    let delay = |s: &Status| s.delay.iter().map(|(sid, us)| (*sid, secs(*us))).collect();
    per_sid_gauge(
        t,
        &statuses,
        "pando_repl_delay_seconds",
        "Seconds from the CSN time of a server's last change to its arrival at a consumer.",
        delay,
    );
    let behind = |s: &Status| {
        let counts = s.behind.iter();
        counts
            .map(|(sid, b)| (*sid, b.changes.to_string()))
            .collect()
    };
    per_sid_gauge(
        t,
        &statuses,
        "pando_repl_changes_behind",
        "Operations a consumer's provider logged past its cookie, per server ID (counted every count_behind_secs; a lower bound when the provider's log does not reach back).",
        behind,
    );
    t.family(
        "pando_repl_check_differing",
        "gauge",
        "Entries a consumer holds differently from its provider, in its last comparison by content (every check_secs).",
    );
    for (rid, s) in statuses.iter().filter(|(_, s)| s.checked.last.is_some()) {
        let differing = s.checked.differing;
        t.sample(
            "pando_repl_check_differing",
            &format!("rid=\"{rid:03}\""),
            differing,
        );
    }
}

/// A gauge per consumer and server ID.
fn per_sid_gauge(
    t: &mut Text,
    statuses: &[(u16, crate::repl::consumer::Status)],
    name: &str,
    help: &str,
    values: impl Fn(&crate::repl::consumer::Status) -> Vec<(u16, String)>,
) {
    t.family(name, "gauge", help);
    for (rid, s) in statuses {
        for (sid, v) in values(s) {
            t.sample(name, &format!("rid=\"{rid:03}\",sid=\"{sid:03x}\""), v);
        }
    }
}

/// The whole exposition.
pub fn render(server: &Server) -> String {
    let mut t = Text {
        out: String::with_capacity(16 * 1024),
    };
    connections(&mut t, &server.rt.metrics);
    operations(&mut t, &server.rt.metrics);
    work(&mut t, server);
    store(&mut t, server);
    logs(&mut t, server);
    replication(&mut t, server);
    process(&mut t);
    t.out
}

/// Version, uptime, connections, bytes and messages.
fn connections(t: &mut Text, m: &Metrics) {
    t.family("pando_info", "gauge", "Server version.");
    t.sample(
        "pando_info",
        &format!("version=\"{}\"", env!("CARGO_PKG_VERSION")),
        1,
    );
    let started = m
        .started
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    t.one(
        "pando_start_time_seconds",
        "gauge",
        "Start time of the server, Unix seconds.",
        started,
    );
    t.one(
        "pando_uptime_seconds",
        "gauge",
        "Seconds since the server started.",
        m.uptime_secs(),
    );
    t.one(
        "pando_connections_current",
        "gauge",
        "Connections open now.",
        m.get(&m.conns_current),
    );
    t.one(
        "pando_connections_total",
        "counter",
        "Connections accepted since start.",
        m.get(&m.conns_total),
    );
    for (name, help, v) in [
        (
            "pando_received_bytes_total",
            "LDAP bytes received.",
            &m.bytes_in,
        ),
        ("pando_sent_bytes_total", "LDAP bytes sent.", &m.bytes_out),
        (
            "pando_received_pdus_total",
            "LDAP messages received.",
            &m.pdus_in,
        ),
        (
            "pando_sent_pdus_total",
            "LDAP messages sent (responses and search entries).",
            &m.pdus_out,
        ),
        (
            "pando_search_entries_total",
            "Search result entries sent.",
            &m.entries_sent,
        ),
    ] {
        t.one(name, "counter", help, m.get(v));
    }
}

/// Operations by type: counts and latency.
fn operations(t: &mut Text, m: &Metrics) {
    t.one(
        "pando_operation_wait_seconds_total",
        "counter",
        "Time operations waited before running (queue time).",
        secs(m.get(&m.wait_micros)),
    );
    t.family(
        "pando_operations_initiated_total",
        "counter",
        "Operations received, by type.",
    );
    for k in OP_KINDS {
        t.sample(
            "pando_operations_initiated_total",
            &format!("op=\"{}\"", k.name()),
            m.initiated(k),
        );
    }
    t.family(
        "pando_operations_completed_total",
        "counter",
        "Operations finished, by type.",
    );
    for k in OP_KINDS {
        t.sample(
            "pando_operations_completed_total",
            &format!("op=\"{}\"", k.name()),
            m.completed(k),
        );
    }
    let (ini, com) = OP_KINDS.iter().fold((0u64, 0u64), |(i, c), k| {
        (i + m.initiated(*k), c + m.completed(*k))
    });
    t.one(
        "pando_operations_in_progress",
        "gauge",
        "Operations received and not yet finished.",
        ini.saturating_sub(com),
    );
    latency(t, m);
}

/// Operation latency by type: histogram, percentiles and maximum.
fn latency(t: &mut Text, m: &Metrics) {
    let lat: Vec<_> = OP_KINDS.iter().map(|k| (k.name(), m.latency(*k))).collect();
    t.family(
        "pando_operation_duration_seconds",
        "histogram",
        "Operation latency from request to response, by type.",
    );
    for (op, l) in &lat {
        for (b, c) in LATENCY_BOUNDS.iter().zip(&l.buckets) {
            t.sample(
                "pando_operation_duration_seconds_bucket",
                &format!("op=\"{op}\",le=\"{}\"", secs(*b)),
                c,
            );
        }
        t.sample(
            "pando_operation_duration_seconds_bucket",
            &format!("op=\"{op}\",le=\"+Inf\""),
            l.count,
        );
        t.sample(
            "pando_operation_duration_seconds_sum",
            &format!("op=\"{op}\""),
            secs(l.sum),
        );
        t.sample(
            "pando_operation_duration_seconds_count",
            &format!("op=\"{op}\""),
            l.count,
        );
    }
    t.family(
        "pando_operation_latency_seconds",
        "summary",
        "Operation latency percentiles since start (HDR histogram), by type.",
    );
    for (op, l) in &lat {
        for (q, v) in [
            ("0.5", l.p50),
            ("0.9", l.p90),
            ("0.99", l.p99),
            ("0.999", l.p999),
        ] {
            t.sample(
                "pando_operation_latency_seconds",
                &format!("op=\"{op}\",quantile=\"{q}\""),
                secs(v),
            );
        }
        t.sample(
            "pando_operation_latency_seconds_sum",
            &format!("op=\"{op}\""),
            secs(l.sum),
        );
        t.sample(
            "pando_operation_latency_seconds_count",
            &format!("op=\"{op}\""),
            l.count,
        );
    }
    t.family(
        "pando_operation_latency_max_seconds",
        "gauge",
        "Largest operation latency since start, by type.",
    );
    for (op, l) in &lat {
        t.sample(
            "pando_operation_latency_max_seconds",
            &format!("op=\"{op}\""),
            secs(l.max),
        );
    }
}

/// Password hashing, search threads and the writer.
fn work(t: &mut Text, server: &Server) {
    let h = server.passwords.stats();
    t.one(
        "pando_password_hashes_total",
        "counter",
        "Slow password hashes computed (hashing and bind verification).",
        h.total.load(std::sync::atomic::Ordering::Relaxed),
    );
    t.one(
        "pando_password_hashes_running",
        "gauge",
        "Slow password hashes running now.",
        h.running.load(std::sync::atomic::Ordering::Relaxed),
    );
    t.one(
        "pando_password_upgrades_total",
        "counter",
        "Stored password values rewritten in the configured scheme after a bind (passwords.upgrade_on_bind).",
        h.upgraded.load(std::sync::atomic::Ordering::Relaxed),
    );
    t.one(
        "pando_password_hashes_peak",
        "gauge",
        "Most slow password hashes ever running at once (passwords.max_concurrent_hashes bounds it).",
        h.peak.load(std::sync::atomic::Ordering::Relaxed),
    );
    t.one(
        "pando_search_threads_busy",
        "gauge",
        "Threads held by large searches now (limits.max_search_threads bounds it).",
        server.search_threads_busy(),
    );
    let w = server.rt.store.writer_stats();
    t.one(
        "pando_writer_batches_total",
        "counter",
        "Write batches committed.",
        w.batches,
    );
    t.one(
        "pando_writer_operations_total",
        "counter",
        "Write operations applied in batches.",
        w.operations,
    );
    t.one(
        "pando_writer_failed_operations_total",
        "counter",
        "Write operations that failed and were rolled back.",
        w.failed_operations,
    );
    t.one(
        "pando_writer_largest_batch",
        "gauge",
        "Most operations committed in one batch.",
        w.largest_batch,
    );
    t.one(
        "pando_writer_commit_seconds_total",
        "counter",
        "Time spent committing batches, fsync included.",
        secs(w.commit_micros),
    );
    t.one(
        "pando_writer_last_commit_seconds",
        "gauge",
        "Duration of the last commit.",
        secs(w.last_commit_micros),
    );
    t.one(
        "pando_writer_syncs_total",
        "counter",
        "fsyncs of the database.",
        w.syncs,
    );
}

/// The store's size, readers and databases.
fn store(t: &mut Text, server: &Server) {
    if let Ok(s) = server.rt.store.stats() {
        t.one(
            "pando_store_entries",
            "gauge",
            "Entries in the store.",
            s.entries,
        );
        t.one(
            "pando_store_disk_bytes",
            "gauge",
            "Size of the database file.",
            s.disk_bytes,
        );
        t.one(
            "pando_store_map_size_bytes",
            "gauge",
            "Configured map size.",
            s.map_size,
        );
        t.one(
            "pando_store_map_used_bytes",
            "gauge",
            "Map pages in use.",
            s.map_used_bytes,
        );
        t.one(
            "pando_store_reader_slots",
            "gauge",
            "LMDB reader table slots in use.",
            s.reader_slots_used,
        );
        t.one(
            "pando_store_readers_open",
            "gauge",
            "Read transactions open now.",
            s.readers_open,
        );
        t.one(
            "pando_store_oldest_reader_seconds",
            "gauge",
            "Age of the oldest open read transaction.",
            secs(s.oldest_reader_micros),
        );
        t.family(
            "pando_store_database_bytes",
            "gauge",
            "Size of each database (pages in use).",
        );
        for d in &s.databases {
            t.sample(
                "pando_store_database_bytes",
                &format!("db=\"{}\"", label_value(&d.name)),
                d.bytes,
            );
        }
        t.family(
            "pando_store_database_items",
            "gauge",
            "Items (keys) in each database.",
        );
        for d in &s.databases {
            t.sample(
                "pando_store_database_items",
                &format!("db=\"{}\"", label_value(&d.name)),
                d.items,
            );
        }
    }
    if let Some(r) = super::monitor::resident(server) {
        t.one(
            "pando_store_resident_ratio",
            "gauge",
            "Share of the database file in the page cache.",
            format!("{r:.4}"),
        );
    }
}

/// Log files and cn=accesslog.
fn logs(t: &mut Text, server: &Server) {
    t.one(
        "pando_access_log_dropped_total",
        "counter",
        "Access log lines dropped because the buffer was full.",
        server.logs.access_dropped(),
    );
    t.one(
        "pando_log_write_errors_total",
        "counter",
        "Log records that could not be written.",
        server.logs.write_errors(),
    );
    let a = &server.rt.metrics.accesslog;
    for (name, help, v) in [
        (
            "pando_accesslog_refused_anonymous_total",
            "Anonymous operations that did not succeed, counted instead of stored in cn=accesslog.",
            &a.refused_anonymous,
        ),
        (
            "pando_accesslog_dropped_total",
            "cn=accesslog records dropped because the queue to the writer was full.",
            &a.dropped,
        ),
        (
            "pando_accesslog_purged_total",
            "cn=accesslog records purged to keep the log within max_records and max_bytes.",
            &a.purged,
        ),
    ] {
        t.one(name, "counter", help, v.load(Ordering::Relaxed));
    }
}

/// The process: CPU, memory, threads, I/O.
fn process(t: &mut Text) {
    let p = ProcessFigures::read();
    t.one(
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time of the server process.",
        secs(p.cpu_micros),
    );
    t.one(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory of the server process.",
        p.rss_bytes,
    );
    t.one(
        "pando_process_threads",
        "gauge",
        "Threads of the server process.",
        p.threads,
    );
    t.one(
        "pando_process_read_bytes_total",
        "counter",
        "Bytes the server process read from storage (/proc/self/io read_bytes).",
        p.read_bytes,
    );
    t.one(
        "pando_process_write_bytes_total",
        "counter",
        "Bytes the server process wrote to storage (/proc/self/io write_bytes).",
        p.write_bytes,
    );
    t.one(
        "pando_process_read_syscalls_total",
        "counter",
        "read() system calls of the server process (/proc/self/io syscr).",
        p.syscr,
    );
    t.one(
        "pando_process_write_syscalls_total",
        "counter",
        "write() system calls of the server process (/proc/self/io syscw).",
        p.syscw,
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_and_samples() {
        let mut t = Text { out: String::new() };
        t.family("x_total", "counter", "Things.");
        t.sample("x_total", "op=\"a\"", 3);
        t.one("y", "gauge", "Y.", 1.5);
        assert_eq!(
            t.out,
            "# HELP x_total Things.\n# TYPE x_total counter\nx_total{op=\"a\"} 3\n# HELP y Y.\n# TYPE y gauge\ny 1.5\n"
        );
        assert_eq!(label_value("a\"b"), "a\\\"b");
    }
}
