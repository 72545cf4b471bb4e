//! The types of operations the server counts, and which thread slot a
//! thread writes its share of a per-thread structure to.

use std::sync::atomic::{AtomicUsize, Ordering};

/// Operation types, in the order the counters and the monitor list them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OpKind {
    Bind = 0,
    Search,
    Compare,
    Add,
    Delete,
    Modify,
    ModDn,
    Extended,
    Abandon,
    Unbind,
}

pub const OP_KINDS: [OpKind; 10] = [
    OpKind::Bind,
    OpKind::Search,
    OpKind::Compare,
    OpKind::Add,
    OpKind::Delete,
    OpKind::Modify,
    OpKind::ModDn,
    OpKind::Extended,
    OpKind::Abandon,
    OpKind::Unbind,
];

impl OpKind {
    /// Lower-case name used in metric labels, monitor RDNs and `pando stat`.
    pub fn name(self) -> &'static str {
        match self {
            OpKind::Bind => "bind",
            OpKind::Search => "search",
            OpKind::Compare => "compare",
            OpKind::Add => "add",
            OpKind::Delete => "delete",
            OpKind::Modify => "modify",
            OpKind::ModDn => "moddn",
            OpKind::Extended => "extended",
            OpKind::Abandon => "abandon",
            OpKind::Unbind => "unbind",
        }
    }

    pub fn from_name(s: &str) -> Option<OpKind> {
        OP_KINDS.iter().copied().find(|k| k.name() == s)
    }
}

thread_local! {
    /// This thread's slot, given out round robin on first use.
    static SLOT: usize = NEXT_SLOT.fetch_add(1, Ordering::Relaxed);
}
static NEXT_SLOT: AtomicUsize = AtomicUsize::new(0);

/// This thread's slot among `n`: which copy of a per-thread structure
/// (a histogram shard, a copy of the dashboard's buckets) it writes to.
pub(crate) fn slot(n: usize) -> usize {
    SLOT.with(|s| *s) % n
}
