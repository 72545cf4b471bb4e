//! Replication, the consumer's side (RFC 4533 with OpenLDAP's
//! conventions): the task that keeps a subtree in step with a provider
//! (`consumer`, talking through `pando_client`), and with `config = true`
//! the provider's shared configuration (`config_sync`); pushes of a
//! subtree to servers that cannot pull (`push`). The provider's side is a search
//! variant (`ops::search::sync_provider`); the received changes are applied
//! by `ops::write::replicated`.

pub mod check;
pub mod config_sync;
pub mod consumer;
pub mod delta;
pub mod lag;
pub mod push;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use arc_swap::ArcSwap;
use pando_model::{Dn, Schema};
use tokio::sync::watch;

use crate::state::Server;

/// One configured consumer, as the rest of the server sees it: the subtree
/// it keeps (read-only for clients) and how it is doing.
pub struct Replica {
    pub rid: u16,
    /// Its configuration (a changed one is a new `Replica`).
    pub cfg: pando_config::consumer::ConsumerConfig,
    /// The normalised search base.
    pub base: String,
    /// Where clients' writes to the subtree are referred.
    pub referral: String,
    pub status: Mutex<consumer::Status>,
    /// Received changes that met a different state here (see
    /// `ReplCtx::conflicts`), counted by the writer.
    pub conflicts: Arc<std::sync::atomic::AtomicU64>,
    /// Its tasks (the consumer, the counting of changes behind, the
    /// comparison by content, the configuration followed).
    tasks: Tasks,
}

/// The tasks of a consumer or a push, and the signal that ends them when
/// it is removed or replaced.
pub(crate) struct Tasks {
    stop: watch::Sender<bool>,
    handles: Mutex<Vec<tokio::task::JoinHandle<()>>>,
}

impl Default for Tasks {
    fn default() -> Self {
        Tasks {
            stop: watch::channel(false).0,
            handles: Mutex::new(Vec::new()),
        }
    }
}

impl Tasks {
    pub(crate) fn add(&self, handles: impl IntoIterator<Item = tokio::task::JoinHandle<()>>) {
        if let Ok(mut t) = self.handles.lock() {
            t.extend(handles);
        }
    }

    /// Resolves once the owner is removed or replaced.
    pub(crate) async fn stopped(&self) {
        let mut rx = self.stop.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Signal the tasks to end and wait (at most 10 s each) for them.
    pub(crate) async fn end(&self, rid: u16) {
        let _ = self.stop.send(true);
        let tasks: Vec<_> = self
            .handles
            .lock()
            .map(|mut t| t.drain(..).collect())
            .unwrap_or_default();
        for t in tasks {
            if tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .is_err()
            {
                tracing::warn!(rid, "a replication task did not end within 10 s");
            }
        }
    }
}

/// Every configured consumer and push; the lists change with the
/// configuration.
pub struct Replicas {
    list: ArcSwap<Vec<Arc<Replica>>>,
    pushes: ArcSwap<Vec<Arc<push::Pusher>>>,
}

impl Replica {
    fn new(schema: &Schema, c: &pando_config::consumer::ConsumerConfig) -> Replica {
        Replica {
            rid: c.rid,
            cfg: c.clone(),
            base: Dn::parse(&c.search_base)
                .ok()
                .and_then(|d| schema.normalize_dn(&d).ok())
                .unwrap_or_default(),
            referral: c.referral(),
            status: Mutex::new(consumer::Status::new(&c.provider)),
            conflicts: Default::default(),
            tasks: Tasks::default(),
        }
    }

    /// How the consumer is doing, conflicts included.
    pub fn snapshot(&self) -> Option<consumer::Status> {
        let mut s = self.status.lock().ok()?.clone();
        s.conflicts = self.conflicts.load(std::sync::atomic::Ordering::Relaxed);
        Some(s)
    }

    /// Resolves once the consumer is removed or replaced.
    pub async fn stopped(&self) {
        self.tasks.stopped().await
    }

    /// Start its tasks.
    fn start(self: &Arc<Self>, server: &Arc<Server>) {
        self.tasks.add([
            tokio::spawn(lag::follow(server.clone(), self.clone())),
            tokio::spawn(check::follow(server.clone(), self.clone())),
            tokio::spawn(consumer::run(server.clone(), self.clone())),
            tokio::spawn(config_sync::follow(server.clone(), self.clone())),
        ]);
    }

    /// Stop its tasks and wait (at most 10 s) for them to end.
    async fn end(&self) {
        self.tasks.end(self.rid).await
    }
}

impl Replicas {
    /// From the validated configuration (search bases were checked then).
    pub fn new(schema: &Schema, cfg: &pando_config::ReplicationConfig) -> Replicas {
        Replicas {
            list: ArcSwap::from_pointee(
                cfg.consumer
                    .iter()
                    .map(|c| Arc::new(Replica::new(schema, c)))
                    .collect(),
            ),
            pushes: ArcSwap::from_pointee(
                cfg.push
                    .iter()
                    .map(|p| Arc::new(push::Pusher::new(schema, p)))
                    .collect(),
            ),
        }
    }

    /// The pushes now.
    pub fn pushes(&self) -> Arc<Vec<Arc<push::Pusher>>> {
        self.pushes.load_full()
    }

    /// The consumers now.
    pub fn list(&self) -> Arc<Vec<Arc<Replica>>> {
        self.list.load_full()
    }

    /// Start every consumer's and push's tasks (at start).
    pub fn start_all(&self, server: &Arc<Server>) {
        for r in self.list().iter() {
            r.start(server);
        }
        for p in self.pushes().iter() {
            p.start(server);
        }
    }

    /// Stop every push, each writing its place (at shutdown, before the
    /// store closes: a clean restart pushes nothing twice).
    pub async fn end_pushes(&self) {
        for p in self.pushes().iter() {
            p.end().await;
        }
    }

    /// Make the pushes those of `server`'s configuration, as
    /// [`Replicas::follow_configuration`] does the consumers (a changed
    /// push starts again from the place stored for its rid).
    pub async fn follow_pushes(&self, server: &Arc<Server>) {
        let wanted = &server.cfg.config.replication.push;
        let old = self.pushes();
        let new: Vec<Arc<push::Pusher>> = wanted
            .iter()
            .map(|c| {
                old.iter()
                    .find(|p| p.cfg == *c)
                    .cloned()
                    .unwrap_or_else(|| Arc::new(push::Pusher::new(&server.schema, c)))
            })
            .collect();
        for p in old
            .iter()
            .filter(|o| !new.iter().any(|n| Arc::ptr_eq(n, o)))
        {
            tracing::info!(rid = p.rid, target = %p.cfg.target, "push stopped (configuration changed)");
            p.end().await;
        }
        self.pushes.store(Arc::new(new.clone()));
        for p in new
            .iter()
            .filter(|n| !old.iter().any(|o| Arc::ptr_eq(o, n)))
        {
            tracing::info!(rid = p.rid, target = %p.cfg.target, "push started (configuration changed)");
            p.start(server);
        }
    }

    /// Make the consumers those of `server`'s configuration: one whose
    /// settings are unchanged goes on; one removed or changed stops (a
    /// changed one then starts again with its new settings, from the
    /// cookie stored for its rid); a new one starts.
    pub async fn follow_configuration(&self, server: &Arc<Server>) {
        let wanted = &server.cfg.config.replication.consumer;
        let old = self.list();
        let kept =
            |c: &pando_config::consumer::ConsumerConfig| old.iter().find(|r| r.cfg == *c).cloned();
        let new: Vec<Arc<Replica>> = wanted
            .iter()
            .map(|c| kept(c).unwrap_or_else(|| Arc::new(Replica::new(&server.schema, c))))
            .collect();
        let ending: Vec<Arc<Replica>> = old
            .iter()
            .filter(|r| !new.iter().any(|n| Arc::ptr_eq(n, r)))
            .cloned()
            .collect();
        for r in &ending {
            tracing::info!(rid = r.rid, provider = %r.cfg.provider, "replication consumer stopped (configuration changed)");
            r.end().await;
        }
        self.list.store(Arc::new(new.clone()));
        for r in new
            .iter()
            .filter(|n| !old.iter().any(|o| Arc::ptr_eq(o, n)))
        {
            tracing::info!(rid = r.rid, provider = %r.cfg.provider, "replication consumer started (configuration changed)");
            r.start(server);
        }
    }

    /// The consumers of `server` (created with it by `Replicas::new`).
    pub fn of(server: &Server) -> &Replicas {
        server
            .rt
            .replicas
            .as_any()
            .downcast_ref()
            .expect("the server's replicas are replication's consumers")
    }

    /// The consumer whose subtree holds the entry `norm` (a normalised DN).
    pub fn holding(&self, norm: &str) -> Option<Arc<Replica>> {
        self.list()
            .iter()
            .find(|r| crate::ops::norm_dn::in_scope(&r.base, pando_proto::Scope::Sub, norm))
            .cloned()
    }
}

/// The consumers as the operations see them (`ops::replicas`).
impl crate::ops::replicas::Replicas for Replicas {
    fn holding(&self, norm: &str) -> Option<crate::ops::replicas::Held> {
        Replicas::holding(self, norm).map(|r| crate::ops::replicas::Held {
            rid: r.rid,
            referral: r.referral.clone(),
            cfg: r.cfg.clone(),
        })
    }

    fn as_any(&self) -> &dyn std::any::Any {
        self
    }
}
