//! The change feed: every committed write, published by the writer thread
//! right after its batch commits (before any of the batch is answered), so
//! listeners see changes in commit order, which is CSN order. Persistent
//! searches follow it; replication and incremental backup will.
//!
//! The feed is a bounded ring ([`tokio::sync::broadcast`]): publishing never
//! waits, so no listener can slow the writer. A listener that falls more
//! than the ring's capacity behind learns it lost changes (`Lagged`) and
//! must start over (a persistent search is ended with a clear result).
//! With no listener, nothing is kept.
//!
//! Deletes also leave a tombstone in the store, written in the deleting
//! transaction and kept for `store.keep_tombstones_days` (see
//! `pando_store::Tombstone`): the feed is for those listening now, the
//! tombstones for those who come back later.

use std::sync::Arc;

use pando_model::Entry;
use pando_proto::control_values::change_type;
use tokio::sync::{broadcast, watch};

use crate::write::change::Change;

/// One committed write operation: one CSN, one or more entries (a tree
/// delete's subtree, children before parents, as written).
pub struct Committed {
    pub csn: String,
    pub changes: Vec<Change>,
    /// Applied from a consumer's refresh: its CSN may be older than
    /// changes of its server ID committed before it.
    pub out_of_order: bool,
}

/// What a change did to its entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Add,
    Delete,
    Modify,
    /// Renamed or moved (its attributes may have changed too).
    ModDn,
}

impl Kind {
    /// The persistent search / entry change notification code.
    pub fn code(self) -> u8 {
        match self {
            Kind::Add => change_type::ADD,
            Kind::Delete => change_type::DELETE,
            Kind::Modify => change_type::MODIFY,
            Kind::ModDn => change_type::MOD_DN,
        }
    }
}

impl Change {
    pub fn kind(&self) -> Kind {
        match (&self.before, &self.after, &self.place) {
            (None, _, _) => Kind::Add,
            (Some(_), None, _) => Kind::Delete,
            (Some(_), Some(_), Some(_)) => Kind::ModDn,
            (Some(_), Some(_), None) => Kind::Modify,
        }
    }

    /// The entry as it is after the change, or as it was for a delete.
    pub fn entry(&self) -> &Entry {
        match (&self.after, &self.before) {
            (Some(after), _) => after,
            (None, Some(before)) => &before.entry,
            // Never planned (an add always has its entry).
            (None, None) => unreachable!("a change without an entry"),
        }
    }

    /// The entry's UUID (entryUUID), empty when it has none.
    pub fn uuid(&self) -> String {
        crate::write::change::entry_uuid(self.entry()).unwrap_or_default()
    }

    /// The DN before a rename.
    pub fn previous_dn(&self) -> Option<String> {
        match self.kind() {
            Kind::ModDn => self.before.as_ref().map(|b| b.entry.dn.to_string()),
            _ => None,
        }
    }
}

/// The sending side of the feed (the receiving side is
/// [`Feed::subscribe`]).
pub struct Feed {
    tx: broadcast::Sender<Arc<Committed>>,
    /// Turns true when the server shuts down: listeners end then.
    closing: watch::Sender<bool>,
}

impl Feed {
    /// A feed whose listeners may fall at most `backlog` operations behind.
    pub fn new(backlog: usize) -> Feed {
        Feed {
            tx: broadcast::channel(backlog.max(1)).0,
            closing: watch::channel(false).0,
        }
    }

    /// Tell every listener the server is shutting down.
    pub fn close(&self) {
        self.closing.send_replace(true);
    }

    /// Changes to true when the server shuts down.
    pub fn closing(&self) -> watch::Receiver<bool> {
        self.closing.subscribe()
    }

    /// Changes committed from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Arc<Committed>> {
        self.tx.subscribe()
    }

    /// On the writer thread, after the commit: never waits.
    pub fn publish(&self, c: Arc<Committed>) {
        // No listener: the change is simply not kept.
        let _ = self.tx.send(c);
    }
}
