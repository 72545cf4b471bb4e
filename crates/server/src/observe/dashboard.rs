//! The live dashboard (`[metrics] dashboard = true`), on the metrics
//! listener: `GET /dashboard` is one page whose assets (its script, and
//! uPlot for the charts) are in this binary, so it works with no internet
//! access; the page asks `GET /dashboard/data?since=T` every second for
//! the seconds after T that the station (`pando_observe::station`) kept.
//!
//! Once a second [`tick`] hands the station what else the server did:
//! connections, bytes, CPU and I/O of the process, the writer's batches
//! and commits, each consumer's phase, delay, applied changes and
//! conflicts, the indexes being built.
//!
//! On a non-loopback address the endpoint speaks TLS and the dashboard
//! asks for the root DN and its password (HTTP Basic, checked as a bind of
//! the root DN is): [`authorized`].

use std::sync::atomic::Ordering;

use crate::state::Server;
use pando_observe::metrics::ProcessFigures;
use pando_observe::station::{ConsumerInput, Inputs};

const PAGE: &[u8] = include_bytes!("../../assets/dashboard/index.html");
const SCRIPT: &[u8] = include_bytes!("../../assets/dashboard/app.js");
const UPLOT_JS: &[u8] = include_bytes!("../../assets/dashboard/uPlot.iife.min.js");
const UPLOT_CSS: &[u8] = include_bytes!("../../assets/dashboard/uPlot.min.css");
const UPLOT_LICENSE: &[u8] = include_bytes!("../../assets/dashboard/LICENSE.uPlot");
const ICON: &[u8] = include_bytes!("../../assets/dashboard/favicon.svg");

/// The embedded file at `path`, with its content type.
pub fn asset(path: &str) -> Option<(&'static str, &'static [u8])> {
    Some(match path {
        "/dashboard" | "/dashboard/" => ("text/html; charset=utf-8", PAGE),
        "/dashboard/app.js" => ("text/javascript; charset=utf-8", SCRIPT),
        "/dashboard/uPlot.iife.min.js" => ("text/javascript; charset=utf-8", UPLOT_JS),
        "/dashboard/uPlot.min.css" => ("text/css; charset=utf-8", UPLOT_CSS),
        "/dashboard/LICENSE.uPlot" => ("text/plain; charset=utf-8", UPLOT_LICENSE),
        "/dashboard/favicon.svg" => ("image/svg+xml", ICON),
        _ => return None,
    })
}

/// `{"now": T, "seconds": [...]}`: the seconds kept after `since` (from
/// the query `since=T`; all of the last hour without it).
pub fn data(server: &Server, query: &str) -> String {
    let since = query
        .split('&')
        .find_map(|p| p.strip_prefix("since="))
        .and_then(|v| v.parse::<u64>().ok())
        .unwrap_or(0);
    let seconds = server.rt.metrics.station.since(since);
    let now = unix_now();
    serde_json::json!({ "now": now, "seconds": seconds }).to_string()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// Close one second on the station.
pub fn tick(server: &Server) {
    let m = &server.rt.metrics;
    let p = ProcessFigures::read();
    let w = server.rt.store.writer_stats();
    let consumers = crate::repl::Replicas::of(server)
        .list()
        .iter()
        .filter_map(|r| {
            let s = r.snapshot()?;
            Some(ConsumerInput {
                rid: r.rid,
                phase: s.phase,
                delay_ms: s.delay.values().max().copied().unwrap_or(0) / 1000,
                applied: s.applied + s.deleted,
                conflicts: s.conflicts,
            })
        })
        .collect();
    let index_builds = server
        .rt
        .store
        .indexes()
        .into_iter()
        .filter(|i| i.building.is_some())
        .map(|i| format!("{} {}", i.attr, i.kind))
        .collect();
    let inputs = Inputs {
        conns_current: m.conns_current.load(Ordering::Relaxed),
        conns_total: m.conns_total.load(Ordering::Relaxed),
        bytes_in: m.bytes_in.load(Ordering::Relaxed),
        bytes_out: m.bytes_out.load(Ordering::Relaxed),
        cpu_micros: p.cpu_micros,
        read_bytes: p.read_bytes,
        write_bytes: p.write_bytes,
        batches: w.batches,
        batch_ops: w.operations,
        commit_micros: w.commit_micros,
        consumers,
        index_builds,
    };
    m.station.tick(&m.seconds, unix_now(), inputs);
}

/// Whether the request head `head` carries the root DN and its password
/// (`Authorization: Basic`). Nothing of it is logged.
pub async fn authorized(server: &Server, head: &str) -> bool {
    use base64::Engine;
    let Some(value) = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.trim()
            .eq_ignore_ascii_case("authorization")
            .then(|| value.trim().to_string())
    }) else {
        return false;
    };
    let Some(b64) = value
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("basic"))
        .map(|(_, v)| v.trim())
    else {
        return false;
    };
    let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(b64) else {
        return false;
    };
    // The user ID of Basic cannot hold ':' (RFC 7617); the password can.
    let Some(at) = raw.iter().position(|&b| b == b':') else {
        return false;
    };
    let (dn, pw) = (&raw[..at], raw[at + 1..].to_vec());
    let Some(hash) = server.root_pw_hash.clone() else {
        return false;
    };
    let norm = std::str::from_utf8(dn)
        .ok()
        .and_then(|d| pando_model::Dn::parse(d).ok())
        .and_then(|d| server.schema.normalize_dn(&d).ok());
    if norm.as_deref() != Some(server.root_dn_norm.as_str()) || server.root_dn_norm.is_empty() {
        return false;
    }
    server.passwords.verify(pw, vec![hash.into_bytes()]).await
}
