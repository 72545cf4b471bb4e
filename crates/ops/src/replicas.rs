//! The subtrees this server keeps as a replication consumer, as the
//! operations see them: read-only for clients (their writes are referred
//! to the provider) and left alone by the overlays' upkeep. The consumers
//! themselves (their tasks, their state) are replication's; the state
//! holds them only as [`Replicas`].
//!
//! Must not name replication.

use std::any::Any;

/// A subtree a consumer keeps.
pub struct Held {
    /// The consumer's replica ID.
    pub rid: u16,
    /// Where clients' writes to it are referred.
    pub referral: String,
    /// The consumer's settings (its provider, how it binds there).
    pub cfg: pando_config::consumer::ConsumerConfig,
}

pub trait Replicas: Send + Sync {
    /// The consumer whose subtree holds the entry `norm` (normalised).
    fn holding(&self, norm: &str) -> Option<Held>;

    /// The consumers as their layer knows them (replication, cn=Monitor
    /// and the metrics read their state through it).
    fn as_any(&self) -> &dyn Any;
}
