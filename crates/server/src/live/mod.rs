//! The running configuration, swapped whole.
//!
//! A [`Server`] is immutable: everything compiled from one configuration
//! (access rules, limits, the authentication policy, the root DN, TLS,
//! log files, password hashing, the schema) plus handles to what outlives
//! configurations (the store, counters, the change feed, listeners).
//! [`Live`] holds the current one. Each operation takes the current
//! `Arc<Server>` when it starts and keeps it to the end, so an operation
//! in flight finishes under the configuration it started with and the
//! next one sees a new configuration as soon as it is installed.
//!
//! A change is made in one order ([`Live::commit`]): check it (schema,
//! validation, what the store holds), build the new `Server` from it
//! (anything that can fail fails here, and nothing has changed yet),
//! store it, then install it. Changes are serialised by
//! [`Live::changing`].

mod keys;
mod steps;

use std::sync::Arc;

use arc_swap::ArcSwap;
use pando_model::Schema;

pub use keys::{at_next_start, changed_keys, leaves, shared, with_keys_from, AT_NEXT_START, LOCAL};

use crate::net::frontend::{Frontend, Serving};
use crate::settings::Validate;
use crate::state::Server;
use pando_config::{Config, Listener};

pub struct Live {
    current: ArcSwap<Server>,
    /// Held while a change is validated, stored and installed: two changes
    /// never build on the same old configuration.
    changing: Arc<tokio::sync::Mutex<()>>,
    /// This `Live` (its listeners are given it).
    me: std::sync::Weak<Live>,
    /// The network frontend's runtime (TLS, connection places, listeners).
    frontend: Frontend,
}

impl Serving for Live {
    fn frontend(&self) -> &Frontend {
        &self.frontend
    }
}

impl crate::state::Current for Live {
    fn server(&self) -> Arc<Server> {
        Live::server(self)
    }
}

impl Live {
    /// A `Live` whose first server is made by `first`, which gets the
    /// handle its servers keep to find the current one.
    pub fn new(
        frontend: Frontend,
        first: impl FnOnce(std::sync::Weak<Live>) -> Server,
    ) -> Arc<Live> {
        Arc::new_cyclic(|weak: &std::sync::Weak<Live>| Live {
            current: ArcSwap::from_pointee(first(weak.clone())),
            changing: Arc::new(tokio::sync::Mutex::new(())),
            me: weak.clone(),
            frontend,
        })
    }

    /// The configuration operations starting now run under.
    pub fn server(&self) -> Arc<Server> {
        self.current.load_full()
    }

    /// Serialise a change: hold the guard from reading the current
    /// configuration until the new one is installed.
    pub async fn changing(&self) -> tokio::sync::OwnedMutexGuard<()> {
        self.changing.clone().lock_owned().await
    }

    /// Make `server` the current configuration. Callers hold
    /// [`Live::changing`] (or are the only writer, as at start).
    pub fn install(&self, server: Server) -> Arc<Server> {
        let new = Arc::new(server);
        self.current.store(new.clone());
        new
    }
}

/// Why a configuration was not installed; nothing changed.
pub enum Refused {
    /// The schema it makes does not build.
    Schema(String),
    /// It removes or redefines schema that stored entries use, or removes
    /// a suffix that holds entries.
    InUse(String),
    /// It does not validate.
    Invalid(pando_config::ConfigError),
    /// It validates but cannot be applied (a certificate, a port, a file).
    NotApplied(String),
    /// It could not be stored.
    NotStored(crate::cn_config::stored::SaveError),
    /// The store could not be read (to find entries using the schema).
    Store(pando_store::StoreError),
}

/// The reason alone (cn=config answers add a result code per kind).
impl std::fmt::Display for Refused {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refused::Schema(e) | Refused::InUse(e) | Refused::NotApplied(e) => f.write_str(e),
            Refused::Invalid(e) => std::fmt::Display::fmt(e, f),
            Refused::NotStored(e) => std::fmt::Display::fmt(e, f),
            Refused::Store(e) => std::fmt::Display::fmt(e, f),
        }
    }
}

/// How a change's shared keys are stamped (see `cn_config::stored`'s
/// stamps): a server following another's configuration takes the keys
/// stamped later there than here.
pub enum Stamp {
    /// Made here: every shared key it changes is stamped with this CSN.
    New(String),
    /// Copied from another server: these keys take the stamps they had
    /// there.
    Copied(std::collections::BTreeMap<String, String>),
}

/// What [`Live::commit`] installed.
pub struct Installed {
    pub server: Arc<Server>,
    /// Keys changed now.
    pub changed: Vec<String>,
    /// Keys changed that the server takes at its next start.
    pub at_next_start: Vec<String>,
}

impl Live {
    /// Make `desired` the configuration (cn=config changes and SIGHUP come
    /// here; callers hold [`Live::changing`]). In order: the schema it
    /// makes, when its schema files or documents changed (refused while
    /// stored entries use what it removes, unless `relax_schema`); it is
    /// validated whole and compiled; it is stored, with `file` (the
    /// configuration file as read) when given, in one transaction; it is
    /// installed. Until the store write commits nothing has changed; from
    /// then on a crash restarts with the new configuration. The shared
    /// keys it changes are stamped as `stamp` says, in the same
    /// transaction.
    pub async fn commit(
        &self,
        desired: Config,
        file: Option<&Config>,
        relax_schema: bool,
        stamp: Stamp,
    ) -> Result<Installed, Refused> {
        let current = self.server();
        let prepared = self.checked(&current, &desired, relax_schema).await?;
        // The store takes the new schema and indexes in the transaction
        // that stores the configuration naming them.
        let catalog = steps::catalog_change(&current, &prepared.server);
        let stamps = match stamp {
            Stamp::New(csn) => changed_keys(&current.desired, &desired)
                .into_iter()
                .filter(|k| shared(k))
                .map(|k| (k, csn.clone()))
                .collect(),
            Stamp::Copied(stamps) => stamps,
        };
        crate::cn_config::stored::save(&current.rt.store, &desired, file, catalog, stamps)
            .await
            .map_err(Refused::NotStored)?;
        let (changed, at_next_start) = (prepared.changed.clone(), prepared.at_next_start.clone());
        let server = self.install_prepared(prepared);
        steps::follow(&server, &current).await;
        Ok(Installed {
            server,
            changed,
            at_next_start,
        })
    }

    /// Everything [`Live::commit`] checks and builds for `desired`, short
    /// of storing and installing it (the No-Op control): the running
    /// configuration it would make. What was built is dropped (listeners
    /// bound for it close again).
    pub async fn rehearse(&self, desired: &Config, relax_schema: bool) -> Result<Config, Refused> {
        let current = self.server();
        let prepared = self.checked(&current, desired, relax_schema).await?;
        Ok(prepared.server.cfg.config.clone())
    }

    /// The checks of a change, in order, and the server it builds.
    async fn checked(
        &self,
        current: &Server,
        desired: &Config,
        relax_schema: bool,
    ) -> Result<Prepared, Refused> {
        let schema = steps::schema_for(current, desired, relax_schema).await?;
        let resolved = desired
            .clone()
            .validate(&schema)
            .map_err(Refused::Invalid)?;
        steps::check_suffixes(current, &resolved, &schema).await?;
        self.prepare(desired.clone(), schema)
            .map_err(Refused::NotApplied)
    }
}

/// A configuration compiled and ready to install: nothing has changed yet.
struct Prepared {
    server: Server,
    /// The TLS context new connections use.
    tls: Option<Arc<crate::net::tls::TlsContext>>,
    durability: pando_store::Durability,
    /// Listeners added, already bound (dropped, and closed, if this is
    /// never installed), and listeners removed.
    bound: Vec<(Listener, crate::net::listener::Bound)>,
    unbound: Vec<Listener>,
    /// The metrics endpoint when `metrics.listen` changed: None = unchanged,
    /// Some(None) = turned off, Some(Some(..)) = bound at its new address.
    metrics: Option<Option<(std::net::SocketAddr, tokio::net::TcpListener)>>,
    /// Keys that changed and are taken at the next start (the running
    /// server keeps their old values).
    at_next_start: Vec<String>,
    /// Keys changed now.
    changed: Vec<String>,
}

impl Live {
    /// Compile the configuration `new` (valid against `schema`) against
    /// the current one: keys in [`AT_NEXT_START`] keep their running
    /// values (and are listed), the rest is validated and compiled.
    /// Nothing changes; callers hold [`Live::changing`] until they install
    /// it or drop it.
    fn prepare(&self, new: Config, schema: Arc<Schema>) -> Result<Prepared, String> {
        let old = self.server();
        let all = changed_keys(&old.cfg.config, &new);
        let (later, now): (Vec<String>, Vec<String>) =
            all.into_iter().partition(|k| at_next_start(k));
        let mut later = later;
        let mut running = with_keys_from(&new, &old.cfg.config, &later);
        let mut resolved = running
            .clone()
            .validate(&schema)
            .map_err(|e| format!("the new configuration is not valid: {e}"))?;
        // Listeners: new ones are bound now (a port in use fails the
        // change); one the OS refuses to a server that gave up root (a
        // port below 1024) waits for the next start.
        let mut bound = Vec::new();
        let mut unbound = Vec::new();
        if resolved.listeners != old.cfg.listeners {
            let added: Vec<&Listener> = resolved
                .listeners
                .iter()
                .filter(|l| !old.cfg.listeners.contains(l))
                .collect();
            let mut refused_by_os = !self.frontend.listeners.managed();
            for l in added {
                match crate::net::listener::bind_one(l) {
                    Ok(b) => bound.push((l.clone(), b)),
                    Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                        refused_by_os = true;
                        break;
                    }
                    Err(e) => return Err(format!("listen: {e}")),
                }
            }
            if refused_by_os {
                bound.clear();
                later.push("listen".into());
                running.listen = old.cfg.config.listen.clone();
                resolved = running
                    .validate(&schema)
                    .map_err(|e| format!("the new configuration is not valid: {e}"))?;
            } else {
                unbound = old
                    .cfg
                    .listeners
                    .iter()
                    .filter(|l| !resolved.listeners.contains(l))
                    .cloned()
                    .collect();
            }
        }
        let tls = self.tls_for(&resolved, &old)?;
        // The dashboard switch is read per request: only a new address
        // binds again.
        let metrics = if resolved.config.metrics.listen == old.cfg.config.metrics.listen {
            None
        } else {
            match resolved.config.metrics.addr().map_err(|e| e.to_string())? {
                Some(addr) => Some(Some((addr, crate::observe::prometheus::bind(addr)?))),
                None => Some(None),
            }
        };
        let durability = resolved
            .config
            .store
            .durability()
            .map_err(|e| e.to_string())?;
        let passwords = if resolved.config.passwords == old.cfg.config.passwords {
            old.passwords.clone()
        } else {
            let p = &resolved.config.passwords;
            Arc::new(old.passwords.with_policy(
                p.policy().map_err(|e| e.to_string())?,
                p.max_concurrent_hashes,
            ))
        };
        // New log files are opened before anything changes; the old ones
        // close when the last operation using them ends.
        let logs = if resolved.config.logs == old.cfg.config.logs {
            old.logs.clone()
        } else {
            Arc::new(pando_observe::Logs::open(&resolved.config.logs)?)
        };
        let mut compiled =
            crate::compile(resolved, schema, old.root_pw_hash.clone(), passwords, logs)
                .map_err(|e| e.to_string())?;
        compiled.desired = Arc::new(new);
        Ok(Prepared {
            server: Server::assemble(compiled, old.rt.clone(), old.live.clone()),
            tls,
            durability,
            bound,
            unbound,
            metrics,
            at_next_start: later,
            changed: now,
        })
    }

    /// The TLS context `resolved` makes: the running one when `[tls]` is
    /// unchanged, else its files loaded now.
    fn tls_for(
        &self,
        resolved: &pando_config::Resolved,
        old: &Server,
    ) -> Result<Option<Arc<crate::net::tls::TlsContext>>, String> {
        if resolved.tls == old.cfg.tls {
            return Ok(self.frontend.tls());
        }
        match &resolved.tls {
            Some(t) => crate::net::tls::TlsContext::load(t.clone())
                .map(|c| Some(Arc::new(c)))
                .map_err(|e| e.to_string()),
            None => Ok(None),
        }
    }

    /// Install what [`Live::prepare`] made, with the side effects that
    /// cannot fail (durability mode, log level).
    fn install_prepared(&self, p: Prepared) -> Arc<Server> {
        let old = self.server();
        let (was, now) = (&old.cfg.config.store, &p.server.cfg.config.store);
        if (&was.compression, was.compression_level) != (&now.compression, now.compression_level) {
            old.rt
                .store
                .codec()
                .set_level(crate::store_options(&p.server.cfg).compression);
        }
        let batch = p.server.cfg.config.store.max_write_batch;
        if batch != old.cfg.config.store.max_write_batch {
            old.rt.store.set_max_batch(batch);
        }
        if p.durability != old.rt.store.durability() {
            old.rt.store.set_durability(p.durability);
            tracing::info!(durability = ?p.durability, "durability changed");
        }
        let limits = &p.server.cfg.config.limits;
        if old.cfg.config.limits != *limits {
            old.rt.throttle.set_limits(limits);
            self.frontend.set_limits(limits);
            old.rt.search_threads.resize(crate::search_threads(limits));
            old.rt
                .persistent_searches
                .resize(limits.max_persistent_searches);
        }
        if old.cfg.config.log_level != p.server.cfg.config.log_level {
            pando_observe::set_log_level(&p.server.cfg.config.log_level);
        }
        self.frontend.set_tls(p.tls);
        let listeners = &self.frontend.listeners;
        let installed = self.install(p.server);
        if let Some(live) = self.me.upgrade() {
            let live: Arc<dyn Serving> = live;
            for (l, b) in p.bound {
                listeners.spawn(&live, Some(l), b);
            }
            if let Some(endpoint) = p.metrics {
                listeners.set_metrics(&live, endpoint);
            }
        }
        for l in &p.unbound {
            listeners.stop(l);
        }
        installed
    }
}
