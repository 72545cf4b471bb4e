//! Read transactions kept open between readers while nothing is committed.
//!
//! Opening an LMDB read transaction takes a reader slot under LMDB's
//! mutex, allocates and zeroes a table sized by the most databases the
//! environment may hold, and makes the first use of each database look its
//! root up again in the main database; ending it gives all that back. While
//! no commit happens, a snapshot opened earlier holds exactly what a new one
//! would. So a reader that ends hands its transaction here, tagged with the
//! content generation it holds ([`dn_cache::Generation`]), and the next
//! reader takes it if the generation is still current.
//!
//! Every commit empties the pool right after the generation moves
//! ([`crate::Inner::commit`]): a pooled snapshot is never handed out once
//! something newer was committed, and keeps no page from reuse longer than
//! until the next commit. A transaction given back after that is dropped,
//! its generation being old. Only snapshots whose generation is known are
//! pooled (never during a commit, never for a store another process may
//! write).

use std::sync::Mutex;

use heed::RoTxn;

use crate::dn_cache::Snapshot;

/// At most this many idle transactions (each holds an LMDB reader slot).
const MAX_IDLE: usize = 8;

/// An idle read transaction and what its snapshot is known to hold.
pub(crate) struct Pooled {
    pub txn: RoTxn<'static>,
    /// The content generation it holds.
    pub content: Snapshot,
    /// The DN generation it was opened under, if it could use the DN cache.
    pub dn: Option<Snapshot>,
}

#[derive(Default)]
pub(crate) struct TxnPool {
    idle: Mutex<Vec<Pooled>>,
}

impl TxnPool {
    /// An idle transaction holding content generation `current`, if there
    /// is one; older ones met on the way are dropped.
    pub fn take(&self, current: u64) -> Option<Pooled> {
        let mut stale = Vec::new();
        let found = {
            let Ok(mut idle) = self.idle.lock() else {
                return None;
            };
            loop {
                match idle.pop() {
                    Some(p) if p.content.generation() == current => break Some(p),
                    Some(p) => stale.push(p),
                    None => break None,
                }
            }
        };
        // Ended outside the lock: aborting a transaction takes LMDB's.
        drop(stale);
        found
    }

    /// Keep `p` for the next reader if its generation is still `current`
    /// and there is room; otherwise it ends here.
    pub fn give(&self, p: Pooled, current: u64) {
        if p.content.generation() != current {
            return;
        }
        let Ok(mut idle) = self.idle.lock() else {
            return;
        };
        if idle.len() < MAX_IDLE {
            idle.push(p);
        }
    }

    /// End every idle transaction (a commit made them old, or the store
    /// is closing).
    pub fn clear(&self) {
        let idle = match self.idle.lock() {
            Ok(mut idle) => std::mem::take(&mut *idle),
            Err(_) => return,
        };
        drop(idle);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.idle.lock().map_or(0, |i| i.len())
    }
}
