//! A modify of an entry the store holds only part of
//! (`seams::Partial`: a translucent suffix's remote entry). Planned like
//! any modify, on the entry as the requester sees it: the assertion,
//! access to every changed attribute and the changes are judged there
//! (`modify`; that entry's schema is its holder's). What the store then
//! keeps is the part the layer makes of the result, schema-checked,
//! written as a modify of the stored part, or, when there is none yet,
//! added with the parts of the ancestors the store lacks, in the same
//! transaction.

use pando_model::{Dn, Entry};
use pando_store::{Lookup, Placement, View};

use super::change::GLUE_PARENT;
use super::{Before, Change, WriteCtx};
use crate::error::{LdapError, OpResult};
use crate::seams::Partial;

/// The changes that store the part `p` keeps of the entry `dn`
/// (normalised `norm`) once `applied` made the modify of it as the
/// requester sees it (every check of a modify but the schema's): the
/// target's first.
pub(super) fn plan(
    ctx: &WriteCtx,
    view: &View<'_>,
    p: &dyn Partial,
    (dn, norm): (&Dn, &str),
    applied: &dyn Fn(&Entry) -> OpResult<Entry>,
) -> OpResult<Vec<Change>> {
    let schema = &*ctx.server.schema;
    let rdns = crate::norm_rdns(view, dn)?;
    let stored = match view.lookup_norm(&rdns)? {
        Lookup::Found(id) => Some(Before::planned(view, id, norm)?),
        Lookup::Missing { .. } => None,
    };
    let part = stored.as_ref().map(|b| &b.entry);
    let before = p.shown(schema, part);
    let after = applied(&before)?;
    let mut kept = p.kept(schema, part, &before, &after);
    super::changes::check_schema_keeping(schema, &mut kept, part)?;
    if let Some(b) = stored {
        return Ok(vec![Change::modify(b, kept)]);
    }
    let (place, glue) = places(ctx, view, dn, &rdns, p.ancestors())?;
    let mut changes = vec![Change::add(kept, norm.to_string(), place)];
    changes.extend(glue);
    Ok(changes)
}

/// Where the new part of `dn` (normalised RDNs `rdns`) goes, and the
/// adds of its ancestors' parts the store lacks (changes 1, 2… of the
/// operation, nearest first), taken from `ancestors`.
fn places(
    ctx: &WriteCtx,
    view: &View<'_>,
    dn: &Dn,
    rdns: &[String],
    ancestors: &[Entry],
) -> OpResult<(Placement, Vec<Change>)> {
    let server = &ctx.server;
    // The nearest ancestor the store holds, at level `k` (1: the parent),
    // or 0 when the missing ones reach up to the suffix.
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
            Lookup::Missing { matched } if k > ancestors.len() => {
                return Err(crate::no_such_object(view, matched)?);
            }
            Lookup::Missing { .. } => {}
        }
    };
    // Levels 0 (the target) to `top` are added; `top`'s parent exists.
    let top = if existing == 0 { k } else { k - 1 };
    let place = |level: usize| {
        let parent = if level < top {
            GLUE_PARENT - (level + 1) as u64
        } else {
            existing
        };
        let norm_rdn = if parent == 0 {
            rdns[level..].join(",")
        } else {
            rdns[level].clone()
        };
        let rdn = Dn {
            rdns: if parent == 0 {
                dn.rdns[level..].to_vec()
            } else {
                vec![dn.rdns[level].clone()]
            },
        };
        Placement {
            parent,
            rdn: rdn.to_string(),
            norm_rdn,
        }
    };
    let mut glue = Vec::with_capacity(top);
    for level in 1..=top {
        let entry = ancestors[level - 1].clone();
        glue.push(Change::add(entry, rdns[level..].join(","), place(level)));
    }
    Ok((place(0), glue))
}
