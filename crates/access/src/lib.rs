//! Access (the crate `pando-access`): who is talking (`identity`), how an
//! identity is established and which roles it holds (`auth`: the `[auth]`
//! policy, SASL EXTERNAL mappings), and what it may do (`acl`: access
//! rules compiled from the configuration, evaluated against entries).
//!
//! Below the operations: it reads entries and the store's indexes it is
//! given, and must not name operations, overlays, replication, the
//! network or the server's state. Binding itself (checking a password)
//! is an operation, above.

pub mod acl;
pub mod auth;
pub mod identity;

pub use identity::{Identity, PeerCred, Restriction, Session};
