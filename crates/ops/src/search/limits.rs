//! The size, time and unindexed-search limits that apply to a requester.

use pando_store::View;

use crate::state::Server;
use pando_access::Identity;

/// The stricter of two limits where 0 means unlimited.
pub fn smaller_limit(a: u32, b: u32) -> u32 {
    match (a, b) {
        (0, x) | (x, 0) => x,
        (a, b) => a.min(b),
    }
}

/// Search limits for one requester (0 = unlimited; unindexed: most
/// entries an unindexed search may examine).
pub struct Limits {
    pub size: u32,
    pub time: u32,
    pub unindexed: u64,
}

impl Limits {
    /// The first `[[limits.by]]` matching the requester, over the general
    /// limits (administrators: none).
    pub fn for_requester(server: &Server, who: &Identity, view: &View<'_>) -> Limits {
        let l = &server.cfg.config.limits;
        let base = if who.is_admin() || who.is_break_glass() {
            Limits {
                size: 0,
                time: 0,
                unindexed: u64::MAX,
            }
        } else if who.is_anonymous() {
            Limits {
                size: smaller_limit(l.size_limit, l.anonymous.size_limit),
                time: smaller_limit(l.time_limit, l.anonymous.time_limit),
                unindexed: l.unindexed_search_limit,
            }
        } else {
            Limits {
                size: l.size_limit,
                time: l.time_limit,
                unindexed: l.unindexed_search_limit,
            }
        };
        match server.limits_by.iter().find(|(w, _)| w.holds(who, view)) {
            None => base,
            Some((_, o)) => Limits {
                size: o.size_limit.unwrap_or(base.size),
                time: o.time_limit.unwrap_or(base.time),
                unindexed: o.unindexed_search_limit.unwrap_or(base.unindexed),
            },
        }
    }
}
