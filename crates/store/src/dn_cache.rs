//! DNs of entries that have children, remembered across read transactions.
//!
//! An entry stores only its RDN and its parent's ID; its DN is the walk up
//! to the suffix. Searches and binds walk the same few parents over and over
//! (every user under `ou=People` shares it), so each thread keeps what it
//! learnt: parent ID and DN (as stored and normalised) of the entries seen as
//! parents, and the IDs of normalised DNs resolved to such entries.
//!
//! Validity. Only renames and deletes change what is remembered (IDs are
//! never reused, adds create new DNs). The writer makes the store's
//! generation odd when a batch renames or deletes, and even again once that
//! batch committed (or failed). A read transaction takes the generation
//! before and after it opens: equal and even means no such batch committed
//! in between, so its snapshot shows exactly the DNs of that generation, and
//! it uses (and fills) only what was learnt under the same generation.
//! Otherwise (a rename in flight, write transactions) nothing is cached.
//!
//! Adds do not change the generation, so two snapshots of one generation
//! may differ by the entries added between them: what a newer one learnt
//! names entries an older one lacks. Every entry an older snapshot holds
//! has the DN and parent a newer one learnt (nothing was renamed or
//! deleted), so facts about an entry a reader holds are valid; but a DN
//! resolved to an ID through the cache is used only once the reader's
//! snapshot is seen to hold that ID (`View::lookup_norm`).
//!
//! Per thread, not shared: lookups take no lock and touch no cache line
//! another core writes.

use std::cell::RefCell;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::EntryId;

/// At most this many entries per map and thread; a full map starts over.
const MAX_NODES: usize = 16 * 1024;

/// The generation seen by a read transaction, if it may use the cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Snapshot {
    store: u64,
    generation: u64,
}

impl Snapshot {
    /// The generation's value (even).
    pub fn generation(&self) -> u64 {
        self.generation
    }
}

/// A store's generation of DNs (see the module documentation).
pub(crate) struct Generation {
    /// Tells stores in one process apart (tests open many).
    store: u64,
    value: AtomicU64,
    /// False for stores another process may change.
    enabled: bool,
}

impl Generation {
    pub fn new() -> Generation {
        static NEXT_STORE: AtomicU64 = AtomicU64::new(1);
        Generation {
            store: NEXT_STORE.fetch_add(1, Ordering::Relaxed),
            value: AtomicU64::new(0),
            enabled: true,
        }
    }

    /// For a store opened read-only: never cached.
    pub fn disabled() -> Generation {
        Generation {
            enabled: false,
            ..Generation::new()
        }
    }

    /// Call before opening a read transaction; pass the result to
    /// [`Generation::after_open`].
    pub fn before_open(&self) -> u64 {
        self.value.load(Ordering::SeqCst)
    }

    pub fn after_open(&self, before: u64) -> Option<Snapshot> {
        let after = self.value.load(Ordering::SeqCst);
        (self.enabled && after == before && after.is_multiple_of(2)).then_some(Snapshot {
            store: self.store,
            generation: after,
        })
    }

    /// Writer thread: a rename or delete is about to be committed.
    pub fn changing(&self) {
        if self.value.load(Ordering::SeqCst).is_multiple_of(2) {
            self.value.fetch_add(1, Ordering::SeqCst);
        }
    }

    /// Writer thread: the batch is committed (or abandoned).
    pub fn settled(&self) {
        if !self.value.load(Ordering::SeqCst).is_multiple_of(2) {
            self.value.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// What is known of an entry that has children.
#[derive(Clone)]
pub(crate) struct Node {
    /// 0 for a suffix entry.
    pub parent: EntryId,
    pub dn: String,
    pub norm: String,
}

struct Cache {
    snapshot: Option<Snapshot>,
    nodes: HashMap<EntryId, Node>,
    /// Normalised RDNs (leftmost first) of entries in `nodes`, with the
    /// content generation of the snapshot that resolved them, when known.
    ids: HashMap<Vec<String>, (EntryId, Option<u64>)>,
}

thread_local! {
    static CACHE: RefCell<Cache> = RefCell::new(Cache {
        snapshot: None,
        nodes: HashMap::new(),
        ids: HashMap::new(),
    });
}

/// Run `f` on this thread's cache for `snap`: emptied first when it holds
/// another store's or another generation's DNs. None (nothing cached) when
/// this transaction may not use it.
///
/// The cache is borrowed while `f` runs; callers pass closures that only
/// touch the cache (and format strings), never the store. Should a use
/// nest all the same, the nested one sees no cache rather than panicking.
fn with<R>(snap: Option<Snapshot>, f: impl FnOnce(&mut Cache) -> R) -> Option<R> {
    let snap = snap?;
    CACHE.with(|c| {
        let mut c = c.try_borrow_mut().ok()?;
        if c.snapshot != Some(snap) {
            // An older transaction must not evict a newer generation's DNs.
            if c.snapshot
                .is_some_and(|s| s.store == snap.store && s.generation > snap.generation)
            {
                return None;
            }
            c.nodes.clear();
            c.ids.clear();
            c.snapshot = Some(snap);
        }
        Some(f(&mut c))
    })
}

pub(crate) fn node(snap: Option<Snapshot>, id: EntryId) -> Option<Node> {
    with_node(snap, id, Node::clone)
}

/// `f` of a remembered entry, without copying its DNs.
pub(crate) fn with_node<R>(
    snap: Option<Snapshot>,
    id: EntryId,
    f: impl FnOnce(&Node) -> R,
) -> Option<R> {
    with(snap, |c| c.nodes.get(&id).map(f)).flatten()
}

/// Parent of a remembered entry, without cloning its DNs.
pub(crate) fn parent(snap: Option<Snapshot>, id: EntryId) -> Option<EntryId> {
    with(snap, |c| c.nodes.get(&id).map(|n| n.parent)).flatten()
}

pub(crate) fn remember(snap: Option<Snapshot>, id: EntryId, node: Node) {
    with(snap, |c| {
        if c.nodes.len() >= MAX_NODES {
            c.nodes.clear();
            c.ids.clear();
        }
        c.nodes.insert(id, node);
    });
}

/// The ID of a normalised DN resolved before, if it is a remembered entry,
/// and the content generation of the snapshot that resolved it (a snapshot
/// of the same DN generation whose content generation is known and not
/// older holds that entry).
pub(crate) fn id_of(
    snap: Option<Snapshot>,
    norm_rdns: &[String],
) -> Option<(EntryId, Option<u64>)> {
    with(snap, |c| c.ids.get(norm_rdns).copied()).flatten()
}

/// Remember that `norm_rdns` names `id`, when `id` is a remembered entry
/// (an entry with children: the bases of searches, not every user), as
/// resolved by a snapshot of content generation `content`.
pub(crate) fn remember_id(
    snap: Option<Snapshot>,
    norm_rdns: &[String],
    id: EntryId,
    content: Option<u64>,
) {
    with(snap, |c| {
        if c.nodes.contains_key(&id) {
            if c.ids.len() >= MAX_NODES {
                c.ids.clear();
            }
            c.ids.insert(norm_rdns.to_vec(), (id, content));
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_is_usable_only_when_even_and_unchanged() {
        let g = Generation::new();
        let b = g.before_open();
        assert!(g.after_open(b).is_some());
        g.changing();
        assert!(
            g.after_open(g.before_open()).is_none(),
            "odd: a rename in flight"
        );
        let b = g.before_open();
        g.settled();
        assert!(g.after_open(b).is_none(), "changed while opening");
        let b = g.before_open();
        let s = g.after_open(b).unwrap();
        assert_eq!(s.generation, 2);
        // Idempotent: a batch with several renames bumps once each way.
        g.changing();
        g.changing();
        g.settled();
        g.settled();
        assert_eq!(g.before_open(), 4);
        let d = Generation::disabled();
        assert!(d.after_open(d.before_open()).is_none());
    }

    #[test]
    fn a_newer_generation_empties_the_cache_and_an_older_one_leaves_it() {
        let g = Generation::new();
        let s0 = g.after_open(g.before_open());
        let node = |dn: &str| Node {
            parent: 0,
            dn: dn.into(),
            norm: dn.into(),
        };
        remember(s0, 7, node("o=a"));
        remember_id(s0, &["o=a".to_string()], 7, None);
        assert_eq!(node_dn(s0, 7).as_deref(), Some("o=a"));
        assert_eq!(id_of(s0, &["o=a".to_string()]), Some((7, None)));
        g.changing();
        g.settled();
        let s1 = g.after_open(g.before_open());
        assert_eq!(node_dn(s1, 7), None, "renamed or deleted since: forgotten");
        remember(s1, 7, node("o=b"));
        // A transaction still on the old generation sees nothing cached
        // and does not disturb the newer DNs.
        assert_eq!(node_dn(s0, 7), None);
        remember(s0, 7, node("o=a"));
        assert_eq!(node_dn(s1, 7).as_deref(), Some("o=b"));
        // Without a snapshot nothing is kept.
        remember(None, 8, node("o=c"));
        assert_eq!(node_dn(None, 8), None);
        // Only remembered entries get their DN resolved from the cache.
        remember_id(s1, &["o=x".to_string()], 99, None);
        assert_eq!(id_of(s1, &["o=x".to_string()]), None);
    }

    fn node_dn(s: Option<Snapshot>, id: EntryId) -> Option<String> {
        node(s, id).map(|n| n.dn)
    }
}
