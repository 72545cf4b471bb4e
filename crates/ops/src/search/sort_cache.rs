//! Sorted lists kept between searches: the state's cache of the sort
//! control's results, keyed by what makes a list valid. Plain data: the
//! sort itself (`search::sort`) fills and reads it.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::Mutex;

use pando_store::EntryId;

/// Sorted lists kept for reuse (a client scrolling a virtual list view asks
/// for the same list again and again), at most [`CACHED_LISTS`] of them,
/// the oldest dropped first. An entry is valid only for the store's
/// content generation it was computed at (any commit changes it), the same
/// request (base, scope, filter, attributes, sort keys) and the same
/// requester (DN, roles and transport facts, which access rules may use).
#[derive(Default)]
pub struct SortCache {
    lists: Mutex<VecDeque<(CacheKey, Arc<Vec<EntryId>>)>>,
}

/// Most sorted lists kept, and the longest kept: 4 × 250,000 IDs = 8 MB
/// at most, whatever `limits.max_sort_entries` allows.
const CACHED_LISTS: usize = 4;
const CACHED_LIST_MAX: usize = 250_000;

#[derive(PartialEq, Eq)]
pub(super) struct CacheKey {
    pub(super) generation: u64,
    /// The subentries control changes which entries are candidates.
    pub(super) subentries: Option<bool>,
    pub(super) request: u64,
    pub(super) who: String,
}

impl SortCache {
    pub(super) fn get(&self, key: &CacheKey) -> Option<Arc<Vec<EntryId>>> {
        let lists = self.lists.lock().ok()?;
        lists
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, ids)| ids.clone())
    }

    pub(super) fn put(&self, key: CacheKey, ids: Arc<Vec<EntryId>>) {
        if ids.len() > CACHED_LIST_MAX {
            return;
        }
        if let Ok(mut lists) = self.lists.lock() {
            // A search that ran on an older snapshot does not displace
            // lists of a newer one.
            if lists.iter().any(|(k, _)| k.generation > key.generation) {
                return;
            }
            // Lists of older generations can never be used again.
            lists.retain(|(k, _)| k.generation == key.generation);
            if lists.len() >= CACHED_LISTS {
                lists.pop_front();
            }
            lists.push_back((key, ids));
        }
    }
}
