//! Replication, the consumer's side (RFC 4533 with OpenLDAP's
//! conventions): a client of a provider (`client`) and the task that keeps
//! a subtree in step with it (`consumer`). The provider's side is a search
//! variant (`ops::search::sync_provider`); the received changes are applied
//! by `ops::write::replicated`.

pub mod client;
pub mod config;
pub mod consumer;
pub mod lag;

use std::sync::Mutex;

use pando_model::{Dn, Schema};

/// One configured consumer, as the rest of the server sees it: the subtree
/// it keeps (read-only for clients) and how it is doing.
pub struct Replica {
    pub rid: u16,
    /// The normalised search base.
    pub base: String,
    /// Where clients' writes to the subtree are referred.
    pub referral: String,
    pub status: Mutex<consumer::Status>,
    /// Received changes that met a different state here (see
    /// `ReplCtx::conflicts`), counted by the writer.
    pub conflicts: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

/// Every configured consumer.
#[derive(Default)]
pub struct Replicas(pub Vec<Replica>);

impl Replica {
    /// How the consumer is doing, conflicts included.
    pub fn snapshot(&self) -> Option<consumer::Status> {
        let mut s = self.status.lock().ok()?.clone();
        s.conflicts = self.conflicts.load(std::sync::atomic::Ordering::Relaxed);
        Some(s)
    }
}

impl Replicas {
    /// From the validated configuration (search bases were checked then).
    pub fn new(schema: &Schema, consumers: &[config::ConsumerConfig]) -> Replicas {
        Replicas(
            consumers
                .iter()
                .map(|c| Replica {
                    rid: c.rid,
                    base: Dn::parse(&c.search_base)
                        .ok()
                        .and_then(|d| schema.normalize_dn(&d).ok())
                        .unwrap_or_default(),
                    referral: c.referral(),
                    status: Mutex::new(consumer::Status::new(&c.provider)),
                    conflicts: Default::default(),
                })
                .collect(),
        )
    }

    /// The consumer whose subtree holds the entry `norm` (a normalised DN).
    pub fn holding(&self, norm: &str) -> Option<&Replica> {
        self.0
            .iter()
            .find(|r| crate::ops::norm_dn::in_scope(&r.base, pando_proto::Scope::Sub, norm))
    }
}
