//! The state every operation runs on: one configuration compiled
//! (`Compiled`) plus the handles that outlive configurations (`Runtime`).
//! The layers above the operations are held here only as the operations'
//! traits (layers, policy, remote trees, virtual trees, replicas,
//! cn=config, the live configuration); the network frontend's runtime is
//! not here at all (`net::frontend` in the server).

use std::sync::{Arc, Weak};
use std::time::SystemTime;

use pando_model::{Dn, Schema};
use pando_proto::DecodeLimits;
use pando_store::Store;

use pando_config::Resolved;
use pando_store::clock::CsnClock;

/// Everything operations share, for one configuration: what was compiled
/// from it ([`Compiled`], reached through `Deref`: `server.schema`) and the
/// handles that outlive it ([`Runtime`], `server.rt`). Immutable: a
/// configuration change builds a new `Server` (see the server's live
/// configuration, `live`) with the same runtime.
pub struct Server {
    pub compiled: Compiled,
    pub rt: Runtime,
    /// Search bases as sent → parsed and normalised (a few distinct bases
    /// take most searches).
    pub base_cache: crate::BaseCache,
    /// The root DSE and the subschema entry, built once per configuration.
    pub special: crate::special::SpecialEntries,
    /// Sorted search results kept while the store does not change.
    pub sorted: crate::search::sort_cache::SortCache,
    /// Replica digest trees kept while the store does not change.
    pub digests: crate::digest::TreeCache,
    /// Where the current configuration is found.
    pub live: Weak<dyn Current>,
}

impl std::ops::Deref for Server {
    type Target = Compiled;

    fn deref(&self) -> &Compiled {
        &self.compiled
    }
}

/// The part of a [`Server`] that outlives configuration changes: handles
/// cloned into every new `Server`.
#[derive(Clone)]
pub struct Runtime {
    pub store: Store,
    pub csn: Arc<CsnClock>,
    pub throttle: Arc<crate::throttle::BindThrottle>,
    /// Threads large searches may hold (`limits.max_search_threads`).
    pub search_threads: Arc<crate::capacity::Capacity>,
    pub started: SystemTime,
    /// Counters and latency histograms (cn=Monitor, /metrics).
    pub metrics: Arc<pando_observe::metrics::Metrics>,
    /// Whether the store may hold subentries (RFC 3672).
    pub subentries: Arc<crate::Subentries>,
    /// Every committed change, in commit order (persistent searches).
    pub feed: Arc<crate::feed::Feed>,
    /// Places for persistent searches (`limits.max_persistent_searches`).
    pub persistent_searches: Arc<crate::capacity::Capacity>,
    /// Who holds those places (the per-connection and per-identity limits).
    pub persistent_holders: Arc<crate::search::holders::Holders>,
    /// The configured replication consumers.
    pub replicas: Arc<dyn crate::replicas::Replicas>,
    /// cn=config, served by the configuration layer (its entries, its
    /// changes applied to the running configuration).
    pub config_tree: Arc<dyn crate::seams::ConfigTree>,
}

/// The configuration running now, whichever it is: tasks that outlive a
/// configuration (replication consumers) ask it for the current server.
pub trait Current: Send + Sync {
    fn server(&self) -> Arc<Server>;
}

/// The part of a [`Server`] compiled from one configuration: made (and
/// failing, if it must) before anything changes.
pub struct Compiled {
    pub cfg: Resolved,
    /// The configuration as stored (cn=config shows it): `cfg.config`
    /// except for keys the server takes only at its next start.
    pub desired: Arc<pando_config::Config>,
    pub schema: Arc<Schema>,
    /// Normalised root DN: the administrator identity.
    pub root_dn_norm: String,
    /// Hash of the administrator password; None = no password bind for it.
    pub root_pw_hash: Option<String>,
    /// Configured suffixes with their normalised forms.
    pub suffixes: Vec<(Dn, String)>,
    pub decode_limits: DecodeLimits,
    pub auth: pando_access::auth::AuthPolicy,
    pub acl: pando_access::acl::Acl,
    /// `[[limits.by]]`, compiled.
    pub limits_by: Vec<(pando_access::acl::Who, pando_config::LimitsFor)>,
    /// Password hashing and bind verification, bounded (`[passwords]`;
    /// its figures carry over a change).
    pub passwords: Arc<crate::hashing::PasswordWork>,
    /// Access and audit logs (`[logs]`; the same files while `[logs]` is
    /// unchanged); reopened on SIGHUP.
    pub logs: Arc<pando_observe::Logs>,
    /// `[[overlay]]`, compiled, in order, as the operations run them.
    pub layers: Arc<crate::seams::Layers>,
    /// Trees searched like stored entries that other layers make
    /// (cn=Monitor, the logs); see `ops::search::virtual_tree`.
    pub trees: Vec<Arc<dyn crate::seams::VirtualTree>>,
    /// Suffixes another server holds (`ops::remote`).
    pub remotes: Vec<Arc<dyn crate::seams::RemoteTree>>,
    /// The password policy, when one is configured (`ops::policy`).
    pub policy: Option<Arc<dyn crate::seams::PasswordPolicy>>,
}

impl Server {
    pub fn assemble(compiled: Compiled, rt: Runtime, live: Weak<dyn Current>) -> Server {
        Server {
            compiled,
            rt,
            base_cache: Default::default(),
            special: Default::default(),
            sorted: Default::default(),
            digests: Default::default(),
            live,
        }
    }

    /// The configuration current now: this one, or the one that replaced
    /// it (for tasks that outlive configurations, such as consumers).
    pub fn current(self: &Arc<Self>) -> Arc<Server> {
        match self.live.upgrade() {
            Some(live) => live.server(),
            None => self.clone(),
        }
    }
}

impl Server {
    /// Threads large searches hold now.
    pub fn search_threads_busy(&self) -> u64 {
        self.rt.search_threads.in_use() as u64
    }
}

impl Server {
    /// Normalised suffix that `norm_dn` is within, if any (RDN by RDN: an
    /// escaped comma in an RDN does not end it).
    pub fn suffix_of(&self, norm_dn: &str) -> Option<&(Dn, String)> {
        self.suffixes
            .iter()
            .find(|(_, s)| crate::norm_dn::in_scope(s, pando_proto::Scope::Sub, norm_dn))
    }

    /// Every provider takes writes (`replication.multi_provider`).
    pub fn multi_provider(&self) -> bool {
        self.cfg.config.replication.multi_provider
    }

    pub fn is_suffix(&self, norm_dn: &str) -> bool {
        self.suffixes.iter().any(|(_, s)| s == norm_dn)
    }
}
