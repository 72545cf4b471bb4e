//! Suffixes whose entries another server holds (the translucent overlay):
//! a tree at the bottom of the stack beside the store. An operation whose
//! target (a search's base) such a suffix covers is that tree's to run:
//! the operations know it only as [`RemoteTree`].
//!
//! Must not name the overlay that implements it.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use pando_model::Entry;

use super::operation::{Operation, Response};
use super::search::{Finished, SearchJob};
use crate::error::OpResult;
use crate::state::Server;

/// Work a remote tree does, running to its end.
pub type Running<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

pub trait RemoteTree: Send + Sync {
    /// Whether the normalised DN `norm` is within this tree.
    fn covers(&self, norm: &str) -> bool;

    /// A search based in this tree (the job's controls already checked).
    fn search<'a>(&'a self, job: &'a Arc<SearchJob>) -> Running<'a, Finished>;

    /// An add, delete, modify, modify DN or compare naming an entry of
    /// this tree; None for other requests.
    fn perform<'a>(
        &'a self,
        server: &'a Arc<Server>,
        op: Operation,
    ) -> Running<'a, Option<Response>>;

    /// Whether a stored entry (given by its object classes) is only this
    /// server's part of a remote entry: a bind to it is the remote's to
    /// check.
    fn is_part(&self, classes: &Entry) -> bool;

    /// A simple bind passed to the remote server: whether it accepted the
    /// password.
    fn bind<'a>(&'a self, name: &'a str, password: Vec<u8>) -> Running<'a, OpResult<bool>>;
}

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
