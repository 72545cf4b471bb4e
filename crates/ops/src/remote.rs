//! Suffixes whose entries another server holds (the translucent overlay):
//! a tree at the bottom of the stack beside the store. An operation whose
//! target (a search's base) such a suffix covers is that tree's to run:
//! the operations know it only as [`RemoteTree`].
//!
//! Must not name the overlay that implements it.

use std::sync::Arc;

use crate::seams::RemoteTree;
use crate::state::Server;

/// The remote tree holding the entry named `dn` (as given), if any.
pub fn serving(server: &Server, dn: &str) -> Option<Arc<dyn RemoteTree>> {
    if server.remotes.is_empty() {
        return None;
    }
    let norm = pando_model::Dn::parse(dn)
        .ok()
        .and_then(|d| server.schema.normalize_dn(&d).ok())?;
    server.remotes.iter().find(|t| t.covers(&norm)).cloned()
}
