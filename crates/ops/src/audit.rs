//! The audit log's side of the operations: each committed change is
//! recorded once, by the operation that made it, after its commit.

use pando_access::Identity;
use pando_observe::{audit, OP};

use crate::state::Server;

/// Record a committed change in the audit log (when configured).
pub fn write(server: &Server, who: &Identity, record: audit::Record<'_>) {
    let Some(a) = &server.logs.audit else { return };
    let ctx = OP.try_with(|c| *c).unwrap_or_default();
    a.write(
        &server.schema,
        &audit::Origin {
            time_micros: pando_store::clock::now_micros(),
            who: who.dn(),
            proxied_by: who.proxy_requester(),
            conn: ctx.conn,
            op: ctx.op,
        },
        &record,
    );
}

/// Is the audit log on? (Callers skip copying data for it otherwise.)
pub fn on(server: &Server) -> bool {
    server.logs.audit.is_some()
}
