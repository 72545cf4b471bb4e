//! Shared server state and the identity of a connection.

use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use pando_model::{Dn, Schema};
use pando_proto::DecodeLimits;
use pando_store::Store;

use crate::clock::CsnClock;
use crate::config::Resolved;

/// Everything operations share. One per running server.
pub struct Server {
    pub cfg: Resolved,
    pub schema: Arc<Schema>,
    pub store: Store,
    /// Normalised root DN: the administrator identity.
    pub root_dn_norm: String,
    /// Hash of the administrator password; None = no password bind for it.
    pub root_pw_hash: RwLock<Option<String>>,
    /// Configured suffixes with their normalised forms.
    pub suffixes: Vec<(Dn, String)>,
    pub csn: CsnClock,
    pub decode_limits: DecodeLimits,
    pub started: SystemTime,
}

/// Who is talking. Fixed for the life of one operation: an operation takes a
/// copy when it starts, so a later bind does not change a running search.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Identity {
    Anonymous,
    /// The configured root DN.
    Root {
        dn: String,
    },
    /// An entry that authenticated with its userPassword.
    User {
        dn: String,
        norm: String,
    },
}

impl Identity {
    pub fn is_admin(&self) -> bool {
        matches!(self, Identity::Root { .. })
    }

    pub fn is_anonymous(&self) -> bool {
        matches!(self, Identity::Anonymous)
    }

    /// The DN as recorded in creatorsName/modifiersName and WhoAmI.
    pub fn dn(&self) -> &str {
        match self {
            Identity::Anonymous => "",
            Identity::Root { dn } | Identity::User { dn, .. } => dn,
        }
    }

    /// The normalised DN, for comparing with targets.
    pub fn norm<'a>(&'a self, server: &'a Server) -> &'a str {
        match self {
            Identity::Anonymous => "",
            Identity::Root { .. } => &server.root_dn_norm,
            Identity::User { norm, .. } => norm,
        }
    }
}

impl Server {
    /// Normalised suffix that `norm_dn` is within, if any.
    pub fn suffix_of(&self, norm_dn: &str) -> Option<&(Dn, String)> {
        self.suffixes
            .iter()
            .find(|(_, s)| norm_dn == s || norm_dn.ends_with(&format!(",{s}")))
    }

    pub fn is_suffix(&self, norm_dn: &str) -> bool {
        self.suffixes.iter().any(|(_, s)| s == norm_dn)
    }
}
