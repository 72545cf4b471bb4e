//! The pipeline's stages for a write made here, by a client or by the
//! server itself: the defaults of [`super::WriteOp`]. A change a
//! replication consumer received has its own (`replicated.rs`).
//!
//! - [`related`]: a change to a subtree a consumer keeps is referred to
//!   its provider; the overlays add their changes to other entries.
//! - [`stamp`]: a new CSN of this server, and the stamps every written
//!   entry gets ([`Stamps`], the same `pando import` and the first
//!   start's entries use).

use pando_model::Entry;
use pando_store::{View, WriteTxn};

use super::{hooks, Change, WriteCtx};
use crate::error::{LdapError, OpResult};
use crate::state::Server;

/// A write made here: referred when it touches a replica (unless every
/// provider takes writes), then the overlays' changes to other entries.
pub(super) fn related(ctx: &WriteCtx, view: &View<'_>, changes: &mut Vec<Change>) -> OpResult<()> {
    if !ctx.server.multi_provider() {
        refer_replicated(&ctx.server, changes)?;
    }
    hooks::related(ctx, view, changes)
}

/// A client's change to a subtree a consumer keeps is referred to the
/// provider (the consumer applies only what the provider sends).
fn refer_replicated(server: &Server, changes: &[Change]) -> OpResult<()> {
    for c in changes {
        let names = [Some(c.norm()), c.before.as_ref().map(|b| b.norm.as_str())];
        if let Some(r) = names
            .into_iter()
            .flatten()
            .find_map(|n| server.rt.replicas.holding(n))
        {
            return Err(LdapError::referral(
                r.referral.clone(),
                format!(
                    "this subtree is a replica (consumer rid {:03}); write to the provider",
                    r.rid
                ),
            ));
        }
    }
    Ok(())
}

/// Attributes the server maintains on every entry it writes. Under the
/// relax rules control an administrator's values for them are kept.
pub(super) const STAMPED: [&str; 6] = [
    "createTimestamp",
    "creatorsName",
    "entryUUID",
    "modifyTimestamp",
    "modifiersName",
    "entryCSN",
];

/// The server's own values for the [`STAMPED`] attributes of one write.
pub struct Stamps<'a> {
    /// creatorsName and modifiersName.
    pub who: &'a str,
    pub csn: &'a str,
    /// createTimestamp and modifyTimestamp (GeneralizedTime).
    pub now: &'a str,
}

impl Stamps<'_> {
    /// Stamp `entry`: the creation stamps too when it is `created` (a new
    /// entryUUID among them), the modification stamps always, except the
    /// attributes `keep` says keep the value they have. Every caller that
    /// writes entries stamps through here (the write pipeline, the first
    /// start's entries, `pando import`).
    pub fn put(&self, entry: &mut Entry, created: bool, keep: impl Fn(&str, &Entry) -> bool) {
        for name in STAMPED {
            let creation = matches!(name, "createTimestamp" | "creatorsName" | "entryUUID");
            if (creation && !created) || keep(name, entry) {
                continue;
            }
            let value = match name {
                "createTimestamp" | "modifyTimestamp" => self.now.to_string(),
                "creatorsName" | "modifiersName" => self.who.to_string(),
                "entryUUID" => super::random_uuid(),
                _ => self.csn.to_string(),
            };
            entry.remove(name);
            entry.add_values(name, vec![value.into_bytes()]);
        }
    }
}

/// One CSN for the whole operation: entryCSN of every entry written and
/// the store's newest change (the replication state a backup carries);
/// creation stamps on added entries, modification stamps on all.
pub(super) fn stamp(
    ctx: &WriteCtx,
    w: &mut WriteTxn<'_>,
    changes: &mut [Change],
) -> OpResult<String> {
    let csn = ctx.server.rt.csn.next();
    w.advance_context_csn(&csn)?;
    let now = pando_store::clock::generalized_time(pando_store::clock::now_micros());
    let relaxed = ctx.relaxed();
    let multi_provider = ctx.server.multi_provider();
    for c in changes.iter_mut() {
        let before = c.before.as_ref().map(|b| &b.entry);
        let Some(after) = c.after.as_mut() else {
            continue;
        };
        // Under relax, a value the client set (added, or changed from what
        // was stored) stays.
        let given = |name: &str, after: &Entry| {
            relaxed && {
                let v = after.get(name).map(|a| &a.values);
                v.is_some() && v != before.and_then(|b| b.get(name)).map(|a| &a.values)
            }
        };
        let stamps = Stamps {
            who: ctx.who.dn(),
            csn: &csn,
            now: &now,
        };
        stamps.put(after, before.is_none(), given);
        if multi_provider {
            crate::write::merge::record_write(before, after, &csn);
        }
    }
    Ok(csn)
}
