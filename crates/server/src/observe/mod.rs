//! Observability: counters and latency histograms ([`metrics`]), the
//! access and audit logs, the `cn=Monitor` subtree, the Prometheus
//! endpoint and the live dashboard beside it.
//!
//! The network calls [`conn_opened`]/[`conn_closed`]; a request is
//! observed by the operations' stack (`ops::stack::observed`).

pub mod dashboard;
pub mod monitor;
mod monitor_slapd;
pub mod prometheus;

use crate::state::Server;
use pando_observe::access_log::ConnEvent;

pub fn conn_opened(server: &Server, conn: u64, peer: &str, tls: bool) {
    server.rt.metrics.conn_opened();
    if let Some(a) = &server.logs.access {
        a.conn(conn, ConnEvent::Accept { peer, tls });
    }
}

pub fn conn_closed(server: &Server, conn: u64, reason: &str) {
    server.rt.metrics.conn_closed();
    if let Some(a) = &server.logs.access {
        a.conn(conn, ConnEvent::Closed { reason });
    }
}
