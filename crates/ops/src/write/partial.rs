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

use super::{ancestry, Before, Change, WriteCtx};
use crate::error::OpResult;
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
/// adds of its ancestors' parts the store lacks, taken from `ancestors`
/// (nearest first); an ancestor beyond them is missing for good.
fn places(
    ctx: &WriteCtx,
    view: &View<'_>,
    dn: &Dn,
    rdns: &[String],
    ancestors: &[Entry],
) -> OpResult<(Placement, Vec<Change>)> {
    let may_make = |level: usize, _: &str, matched| match level > ancestors.len() {
        true => Err(crate::no_such_object(view, matched)?),
        false => Ok(()),
    };
    let make = |level: usize, _: &str| Ok(ancestors[level - 1].clone());
    let missing = ancestry::Missing {
        may_make: &may_make,
        make: &make,
    };
    ancestry::place(&ctx.server, view, dn, rdns, missing)
}
