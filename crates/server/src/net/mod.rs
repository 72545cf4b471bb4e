//! The network frontend: listeners and per-connection protocol handling;
//! and the client the server talks to other servers with.

pub mod connection;
pub mod frontend;
pub mod listener;
pub mod refusals;
pub mod running;
pub mod shards;
pub mod tls;
pub mod wire;
