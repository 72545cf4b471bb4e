//! Shared server state and the identity of a connection.

use std::sync::{Arc, Weak};
use std::time::SystemTime;

use pando_model::{Dn, Schema};
use pando_proto::DecodeLimits;
use pando_store::Store;

use crate::clock::CsnClock;
use pando_config::Resolved;

/// Everything operations share, for one configuration. Immutable: a
/// configuration change builds a new `Server` (see [`crate::live`]) that
/// shares the runtime handles (store, counters, feed, listeners) of the old one.
pub struct Server {
    // Compiled from the configuration.
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
    pub auth: crate::auth::AuthPolicy,
    pub acl: crate::acl::Acl,
    /// `[[limits.by]]`, compiled.
    pub limits_by: Vec<(crate::acl::Who, pando_config::LimitsFor)>,
    /// The certificate and TLS settings when `[tls]` is configured: serves
    /// ldaps:// listeners and StartTLS. Reloaded on SIGHUP.
    pub tls: Option<Arc<crate::net::tls::TlsContext>>,
    /// Search bases as sent → parsed and normalised (a few distinct bases
    /// take most searches).
    pub base_cache: crate::ops::BaseCache,
    /// The root DSE and the subschema entry, built once per configuration.
    pub special: crate::ops::special::SpecialEntries,
    /// Sorted search results kept while the store does not change.
    pub sorted: crate::ops::search::SortCache,
    /// Password hashing and bind verification, bounded (`[passwords]`;
    /// its figures carry over a change).
    pub passwords: Arc<crate::hashing::PasswordWork>,
    /// Access and audit logs (`[logs]`; the same files while `[logs]` is
    /// unchanged); reopened on SIGHUP.
    pub logs: Arc<crate::observe::Logs>,
    /// `[[overlay]]`, compiled, in order.
    pub overlays: Arc<crate::overlays::Overlays>,

    // What outlives configurations ([`Runtime`]).
    pub store: Store,
    pub csn: Arc<CsnClock>,
    pub throttle: Arc<crate::throttle::BindThrottle>,
    /// Open connections (`limits.max_connections`).
    pub connections: Arc<crate::capacity::Capacity>,
    /// Open connections per client address (`limits.max_connections_per_ip`).
    pub per_ip: Arc<crate::net::listener::PerIpLimit>,
    /// Refused work per client address (`net::refusals`).
    pub refusals: Arc<crate::net::refusals::Table>,
    /// Threads large searches may hold (`limits.max_search_threads`).
    pub search_threads: Arc<crate::capacity::Capacity>,
    pub started: SystemTime,
    /// Counters and latency histograms (cn=Monitor, /metrics).
    pub metrics: Arc<crate::observe::metrics::Metrics>,
    /// Whether the store may hold subentries (RFC 3672).
    pub subentries: Arc<crate::ops::Subentries>,
    /// Every committed change, in commit order (persistent searches).
    pub feed: Arc<crate::ops::feed::Feed>,
    /// Places for persistent searches (`limits.max_persistent_searches`).
    pub persistent_searches: Arc<crate::capacity::Capacity>,
    /// Who holds those places (the per-connection and per-identity limits).
    pub persistent_holders: Arc<crate::ops::search::PersistentHolders>,
    /// The configured replication consumers.
    pub replicas: Arc<crate::repl::Replicas>,
    /// The accept loops running (listeners change with `listen`).
    pub listeners: Arc<crate::net::listener::Listeners>,
    /// Where the current configuration is found (to change it).
    pub live: Weak<crate::live::Live>,
}

/// The part of a [`Server`] that outlives configuration changes: handles
/// cloned into every new `Server`.
#[derive(Clone)]
pub struct Runtime {
    pub store: Store,
    pub csn: Arc<CsnClock>,
    pub throttle: Arc<crate::throttle::BindThrottle>,
    pub connections: Arc<crate::capacity::Capacity>,
    pub per_ip: Arc<crate::net::listener::PerIpLimit>,
    pub refusals: Arc<crate::net::refusals::Table>,
    pub search_threads: Arc<crate::capacity::Capacity>,
    pub started: SystemTime,
    pub metrics: Arc<crate::observe::metrics::Metrics>,
    pub subentries: Arc<crate::ops::Subentries>,
    pub feed: Arc<crate::ops::feed::Feed>,
    pub persistent_searches: Arc<crate::capacity::Capacity>,
    pub persistent_holders: Arc<crate::ops::search::PersistentHolders>,
    pub replicas: Arc<crate::repl::Replicas>,
    pub listeners: Arc<crate::net::listener::Listeners>,
}

/// The part of a [`Server`] compiled from one configuration: made (and
/// failing, if it must) before anything changes.
pub struct Compiled {
    pub cfg: Resolved,
    pub desired: Arc<pando_config::Config>,
    pub schema: Arc<Schema>,
    pub root_dn_norm: String,
    pub root_pw_hash: Option<String>,
    pub suffixes: Vec<(Dn, String)>,
    pub decode_limits: DecodeLimits,
    pub auth: crate::auth::AuthPolicy,
    pub acl: crate::acl::Acl,
    pub limits_by: Vec<(crate::acl::Who, pando_config::LimitsFor)>,
    pub tls: Option<Arc<crate::net::tls::TlsContext>>,
    pub passwords: Arc<crate::hashing::PasswordWork>,
    pub logs: Arc<crate::observe::Logs>,
    pub overlays: Arc<crate::overlays::Overlays>,
}

impl Server {
    pub fn assemble(c: Compiled, rt: Runtime, live: Weak<crate::live::Live>) -> Server {
        Server {
            cfg: c.cfg,
            desired: c.desired,
            schema: c.schema,
            root_dn_norm: c.root_dn_norm,
            root_pw_hash: c.root_pw_hash,
            suffixes: c.suffixes,
            decode_limits: c.decode_limits,
            auth: c.auth,
            acl: c.acl,
            limits_by: c.limits_by,
            tls: c.tls,
            passwords: c.passwords,
            logs: c.logs,
            overlays: c.overlays,
            base_cache: Default::default(),
            special: Default::default(),
            sorted: Default::default(),
            store: rt.store,
            csn: rt.csn,
            throttle: rt.throttle,
            connections: rt.connections,
            per_ip: rt.per_ip,
            refusals: rt.refusals,
            search_threads: rt.search_threads,
            started: rt.started,
            metrics: rt.metrics,
            subentries: rt.subentries,
            feed: rt.feed,
            persistent_searches: rt.persistent_searches,
            persistent_holders: rt.persistent_holders,
            replicas: rt.replicas,
            listeners: rt.listeners,
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

    /// The handles a new configuration's `Server` shares with this one.
    pub fn runtime(&self) -> Runtime {
        Runtime {
            store: self.store.clone(),
            csn: self.csn.clone(),
            throttle: self.throttle.clone(),
            connections: self.connections.clone(),
            per_ip: self.per_ip.clone(),
            refusals: self.refusals.clone(),
            search_threads: self.search_threads.clone(),
            started: self.started,
            metrics: self.metrics.clone(),
            subentries: self.subentries.clone(),
            feed: self.feed.clone(),
            persistent_searches: self.persistent_searches.clone(),
            persistent_holders: self.persistent_holders.clone(),
            replicas: self.replicas.clone(),
            listeners: self.listeners.clone(),
        }
    }
}

impl Server {
    /// Threads large searches hold now.
    pub fn search_threads_busy(&self) -> u64 {
        self.search_threads.in_use() as u64
    }
}

/// Facts about the transport a connection runs over, used by authentication
/// (SASL EXTERNAL) and access control. Replaced, not mutated, when they
/// change (StartTLS), so a running operation keeps the facts it started with.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Session {
    /// Remote address of a TCP connection; None over ldapi.
    pub peer_ip: Option<std::net::IpAddr>,
    /// Peer credentials of an ldapi (Unix socket) connection.
    pub peer_cred: Option<PeerCred>,
    /// LDAPS, or StartTLS completed.
    pub tls: bool,
    /// Subject DN (RFC 4514 string) of a verified TLS client certificate.
    pub client_cert_dn: Option<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PeerCred {
    pub uid: u32,
    pub gid: u32,
}

/// Who is talking. Fixed for the life of one operation: an operation takes a
/// copy when it starts, so a later bind does not change a running search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    /// The DN as bound (recorded in creatorsName/modifiersName, WhoAmI);
    /// empty when anonymous.
    dn: String,
    /// Normalised form of `dn`, for comparing with targets.
    norm: String,
    /// Holds the administrator role (the root DN, or an identity mapped to
    /// it). Administrators are subject to access rules like anyone else.
    admin: bool,
    /// The configured break-glass identity: access rules do not apply.
    break_glass: bool,
    /// The DN that authenticated, when this identity was taken on with the
    /// proxied authorization control (kept for the audit log).
    proxied_by: Option<String>,
    /// Set by a bind the password policy answered changeAfterReset: until
    /// the password is changed, nothing else may run. Shared by every copy
    /// of the identity, so the change lifts it for the connection.
    restriction: Option<std::sync::Arc<Restriction>>,
    pub session: std::sync::Arc<Session>,
}

/// A connection's restriction to changing its password (see
/// [`Identity::is_restricted`]).
#[derive(Debug, Default)]
pub struct Restriction(std::sync::atomic::AtomicBool);

impl PartialEq for Restriction {
    fn eq(&self, other: &Self) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        self.0.load(Relaxed) == other.0.load(Relaxed)
    }
}

impl Eq for Restriction {}

impl Identity {
    pub fn anonymous(session: std::sync::Arc<Session>) -> Identity {
        Identity {
            dn: String::new(),
            norm: String::new(),
            admin: false,
            break_glass: false,
            proxied_by: None,
            restriction: None,
            session,
        }
    }

    /// An authenticated identity; `norm` is the normalised form of `dn`.
    pub fn authenticated(dn: String, norm: String, session: std::sync::Arc<Session>) -> Identity {
        Identity {
            dn,
            norm,
            admin: false,
            break_glass: false,
            proxied_by: None,
            restriction: None,
            session,
        }
    }

    /// This identity restricted to changing its password.
    pub fn restricted_to_password_change(mut self) -> Identity {
        let r = Restriction::default();
        r.0.store(true, std::sync::atomic::Ordering::Relaxed);
        self.restriction = Some(std::sync::Arc::new(r));
        self
    }

    /// Whether only a password change may run (password policy).
    pub fn is_restricted(&self) -> bool {
        self.restriction
            .as_ref()
            .is_some_and(|r| r.0.load(std::sync::atomic::Ordering::Relaxed))
    }

    /// The password was changed: the connection is no longer restricted.
    pub fn lift_restriction(&self) {
        if let Some(r) = &self.restriction {
            r.0.store(false, std::sync::atomic::Ordering::Relaxed);
        }
    }

    pub fn with_session(mut self, session: std::sync::Arc<Session>) -> Identity {
        self.session = session;
        self
    }

    /// Set the roles directly (tests and internal callers).
    pub fn with_roles(mut self, admin: bool, break_glass: bool) -> Identity {
        self.admin = admin;
        self.break_glass = break_glass;
        self
    }

    /// Settle the administrator role and break-glass status from the root
    /// DN and the `[auth]` policy, for this identity over its session.
    pub fn with_admin_from(mut self, server: &Server) -> Identity {
        let root = !server.root_dn_norm.is_empty() && self.norm == server.root_dn_norm;
        self.admin = root || server.auth.is_admin(&self.norm, &self.session);
        self.break_glass = server.auth.is_break_glass(&self.norm, &self.session);
        self
    }

    /// This identity, taken on by `requester` (proxied authorization).
    pub fn proxied_by(mut self, requester: &Identity) -> Identity {
        self.proxied_by = Some(requester.dn().to_string());
        self
    }

    /// Who took this identity on, if it was proxied.
    pub fn proxy_requester(&self) -> Option<&str> {
        self.proxied_by.as_deref()
    }

    pub fn is_admin(&self) -> bool {
        self.admin
    }

    pub fn is_break_glass(&self) -> bool {
        self.break_glass
    }

    pub fn is_anonymous(&self) -> bool {
        self.dn.is_empty()
    }

    /// The DN as recorded in creatorsName/modifiersName and WhoAmI.
    pub fn dn(&self) -> &str {
        &self.dn
    }

    /// The normalised DN ("" when anonymous).
    pub fn norm(&self) -> &str {
        &self.norm
    }
}

impl Server {
    /// Normalised suffix that `norm_dn` is within, if any (RDN by RDN: an
    /// escaped comma in an RDN does not end it).
    pub fn suffix_of(&self, norm_dn: &str) -> Option<&(Dn, String)> {
        self.suffixes
            .iter()
            .find(|(_, s)| crate::ops::norm_dn::in_scope(s, pando_proto::Scope::Sub, norm_dn))
    }

    /// Every provider takes writes (`replication.multi_provider`).
    pub fn multi_provider(&self) -> bool {
        self.cfg.config.replication.multi_provider
    }

    pub fn is_suffix(&self, norm_dn: &str) -> bool {
        self.suffixes.iter().any(|(_, s)| s == norm_dn)
    }
}
