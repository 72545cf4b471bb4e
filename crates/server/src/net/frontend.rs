//! What the network frontend keeps across configurations: the TLS
//! context new connections use, the connection places (all and per
//! client address), the refusal budgets, and the accept loops.
//!
//! Owns the frontend's runtime; the operations never see it (they run
//! the same whether a request came over TCP, TLS or ldapi). Must not hold
//! anything the operations read: that is the configuration's `Server`.

use std::sync::Arc;

use arc_swap::ArcSwapOption;

use super::listener::{Listeners, PerIpLimit};
use super::refusals;
use super::tls::TlsContext;
use crate::capacity::Capacity;
use crate::state::Current;

pub struct Frontend {
    /// The certificate and TLS settings when `[tls]` is configured: serves
    /// ldaps:// listeners and StartTLS. Replaced when `[tls]` changes; its
    /// files are reloaded on SIGHUP (`tls::TlsContext::reload`).
    tls: ArcSwapOption<TlsContext>,
    /// Open connections (`limits.max_connections`).
    pub connections: Arc<Capacity>,
    /// Open connections per client address (`limits.max_connections_per_ip`).
    pub per_ip: Arc<PerIpLimit>,
    /// Refused work per client address (`net::refusals`).
    pub refusals: Arc<refusals::Table>,
    /// The accept loops running (listeners change with `listen`).
    pub listeners: Listeners,
}

impl Frontend {
    pub fn new(limits: &pando_config::Limits, tls: Option<Arc<TlsContext>>) -> Frontend {
        Frontend {
            tls: ArcSwapOption::new(tls),
            connections: Capacity::new(limits.max_connections),
            per_ip: PerIpLimit::new(limits.max_connections_per_ip),
            refusals: Default::default(),
            listeners: Listeners::default(),
        }
    }

    /// The TLS context new handshakes use; None without `[tls]`.
    pub fn tls(&self) -> Option<Arc<TlsContext>> {
        self.tls.load_full()
    }

    pub fn set_tls(&self, tls: Option<Arc<TlsContext>>) {
        self.tls.store(tls);
    }

    /// Apply changed `limits` to the connection places.
    pub fn set_limits(&self, limits: &pando_config::Limits) {
        self.connections.resize(limits.max_connections);
        self.per_ip.set_max(limits.max_connections_per_ip);
    }
}

/// The running server as the frontend sees it: the current configuration
/// (each operation takes it when it starts) and the frontend's runtime.
pub trait Serving: Current {
    fn frontend(&self) -> &Frontend;
}
