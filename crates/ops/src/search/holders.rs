//! Who holds the places for searches that follow changes: the counts by
//! connection and by identity that `search::follow_places` checks and
//! updates under one lock, and the place a running search holds. Plain
//! data held by the state.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::OwnedSemaphorePermit;

/// Live places of ordinary requesters, by connection and by identity.
#[derive(Default)]
pub struct Holders {
    pub(super) counts: Mutex<HashMap<Holder, usize>>,
}

#[derive(Clone, Hash, PartialEq, Eq)]
pub(super) enum Holder {
    Connection(u64),
    /// The normalised DN ("" for anonymous clients, who share one count).
    Identity(String),
}

/// A place held while the search runs; given back when dropped.
pub struct Place {
    pub(super) _permit: OwnedSemaphorePermit,
    /// Where this place is counted (ordinary requesters only).
    pub(super) counted: Option<(Arc<Holders>, [Holder; 2])>,
}

impl Drop for Place {
    fn drop(&mut self) {
        let Some((holders, keys)) = &self.counted else {
            return;
        };
        let mut counts = holders.counts.lock().unwrap_or_else(|p| p.into_inner());
        for k in keys {
            if let Some(n) = counts.get_mut(k) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    counts.remove(k);
                }
            }
        }
    }
}
