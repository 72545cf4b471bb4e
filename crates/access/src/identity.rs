//! Who is talking and over what: the transport facts of a connection
//! (`Session`) and the identity an operation runs as (`Identity`).

use crate::auth::AuthPolicy;

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
    /// empty when anonymous. Shared, not copied, by every operation's copy
    /// of the identity.
    dn: std::sync::Arc<str>,
    /// Normalised form of `dn`, for comparing with targets.
    norm: std::sync::Arc<str>,
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
        // Every bind builds one for its access check: the empty DN shared,
        // not allocated twice each time.
        thread_local! {
            static EMPTY: std::sync::Arc<str> = std::sync::Arc::from("");
        }
        let empty = EMPTY.with(std::sync::Arc::clone);
        Identity {
            dn: empty.clone(),
            norm: empty,
            admin: false,
            break_glass: false,
            proxied_by: None,
            restriction: None,
            session,
        }
    }

    /// An authenticated identity; `norm` is the normalised form of `dn`.
    pub fn authenticated(
        dn: impl Into<std::sync::Arc<str>>,
        norm: impl Into<std::sync::Arc<str>>,
        session: std::sync::Arc<Session>,
    ) -> Identity {
        Identity {
            dn: dn.into(),
            norm: norm.into(),
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
    /// DN (normalised; empty when there is none) and the `[auth]` policy,
    /// for this identity over its session.
    pub fn with_admin_from(mut self, root_dn_norm: &str, auth: &AuthPolicy) -> Identity {
        let root = !root_dn_norm.is_empty() && &*self.norm == root_dn_norm;
        self.admin = root || auth.is_admin(&self.norm, &self.session);
        self.break_glass = auth.is_break_glass(&self.norm, &self.session);
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
