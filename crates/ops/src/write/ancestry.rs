//! Where a new entry goes when ancestors of it may be missing here: the
//! one walk up a DN that a received entry (replication's glue entries)
//! and the first part of a partial entry (a translucent remote's
//! ancestors) share. The caller says which missing ancestor may be made,
//! and what entry stands for it; the walk finds the nearest ancestor the
//! store holds (or the suffix, which then goes at the top) and places
//! every entry it adds.
//!
//! The adds are changes 1, 2… of the operation (nearest first, after the
//! entry itself, change 0); a parent still to be added is named by
//! `GLUE_PARENT - k`, resolved as the pipeline writes.

use pando_model::{Dn, Entry};
use pando_store::{EntryId, Lookup, Placement, View};

use super::change::GLUE_PARENT;
use super::Change;
use crate::error::{LdapError, OpResult};
use crate::state::Server;

/// Whether the ancestor `level` above the entry (1: its parent),
/// normalised `norm`, which is not here (`matched`: the nearest one that
/// is), may be made: Ok, or the refusal.
pub(super) type MayMake<'a> = &'a dyn Fn(usize, &str, Option<EntryId>) -> OpResult<()>;

/// What the caller says of the ancestors the store lacks.
pub(super) struct Missing<'a> {
    pub may_make: MayMake<'a>,
    /// The entry that stands for the ancestor at `level`, `norm`.
    pub make: &'a dyn Fn(usize, &str) -> OpResult<Entry>,
}

/// Where the entry `dn` (its normalised RDNs `rdns`) goes, and the adds
/// of the ancestors the store lacks, nearest first.
pub(super) fn place(
    server: &Server,
    view: &View<'_>,
    dn: &Dn,
    rdns: &[String],
    missing: Missing<'_>,
) -> OpResult<(Placement, Vec<Change>)> {
    // The nearest ancestor the store holds, at level `k` (1: the parent),
    // or 0 when the entry, or the missing ancestors, reach up to a suffix.
    let mut k = 0;
    let existing = loop {
        if server.is_suffix(&rdns[k..].join(",")) {
            break 0;
        }
        k += 1;
        if k >= rdns.len() {
            return Err(LdapError::unwilling(format!(
                "no global superior knowledge: '{dn}' is outside every suffix"
            )));
        }
        match view.lookup_norm(&rdns[k..])? {
            Lookup::Found(id) => break id,
            Lookup::Missing { matched } => (missing.may_make)(k, &rdns[k..].join(","), matched)?,
        }
    };
    // Levels 0 (the entry) to `top` are added; `top`'s parent exists.
    let top = if existing == 0 { k } else { k - 1 };
    let place = |level: usize| {
        let parent = if level < top {
            GLUE_PARENT - (level + 1) as u64
        } else {
            existing
        };
        // A suffix is placed at the top under its whole DN.
        let (rdn, norm_rdn) = if parent == 0 {
            (dn.rdns[level..].to_vec(), rdns[level..].join(","))
        } else {
            (vec![dn.rdns[level].clone()], rdns[level].clone())
        };
        Placement {
            parent,
            rdn: Dn { rdns: rdn }.to_string(),
            norm_rdn,
        }
    };
    let mut added = Vec::with_capacity(top);
    for level in 1..=top {
        let norm = rdns[level..].join(",");
        let entry = (missing.make)(level, &norm)?;
        added.push(Change::add(entry, norm, place(level)));
    }
    Ok((place(0), added))
}
