//! The network frontend: listeners and per-connection protocol handling.

pub mod connection;
pub mod listener;
pub mod running;
pub mod tls;
pub mod wire;
