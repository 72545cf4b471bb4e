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

/// The answer to a request under `/dashboard` (authorised already).
pub fn answer(server: &Server, req: &pando_web::Request) -> Vec<u8> {
    let (ctype, body): (&str, &[u8]) = match req.path.as_str() {
        "/dashboard" | "/dashboard/" => ("text/html; charset=utf-8", PAGE),
        "/dashboard/app.js" => ("text/javascript; charset=utf-8", SCRIPT),
        "/dashboard/data" => {
            let since = req.param("since").and_then(|v| v.parse().ok()).unwrap_or(0);
            return pando_web::response(200, "application/json", data(server, since).as_bytes());
        }
        path => match pando_web::shared_asset(path) {
            Some(found) => found,
            None => return pando_web::response(404, "text/plain", b"not found: try /dashboard\n"),
        },
    };
    pando_web::response(200, ctype, body)
}

/// `{"now": T, "seconds": [...]}`: the seconds kept after `since` (unix
/// time; 0: all of the last hour).
pub fn data(server: &Server, since: u64) -> String {
    let seconds = server.rt.metrics.station.since(since);
    serde_json::json!({ "now": pando_web::unix_now(), "seconds": seconds }).to_string()
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
    m.station.tick(&m.seconds, pando_web::unix_now(), inputs);
}

/// Whether the request carries the root DN and its password
/// (`Authorization: Basic`). Nothing of it is logged.
pub async fn authorized(server: &Server, req: &pando_web::Request) -> bool {
    let Some((dn, pw)) = req.basic_credentials() else {
        return false;
    };
    let Some(hash) = server.root_pw_hash.clone() else {
        return false;
    };
    let norm = pando_model::Dn::parse(&dn)
        .ok()
        .and_then(|d| server.schema.normalize_dn(&d).ok());
    if server.root_dn_norm.is_empty() || norm.as_deref() != Some(server.root_dn_norm.as_str()) {
        return false;
    }
    server.passwords.verify(pw, vec![hash.into_bytes()]).await
}
