//! Hooks every write passes through, in the order of [`HOOKS`]: the seam
//! where controls act on writes today and overlays will plug in.
//!
//! - `on_target` runs when the operation has resolved the entry it names
//!   (for an add: the entry to add, once schema-checked), before it works
//!   out the change: checks that decide whether the operation may go
//!   ahead at all (the assertion control).
//! - `check` runs on the view the whole change was planned on, before
//!   anything is stamped or written.
//! - `related` runs in the writer's transaction before stamping, on the
//!   writer's view (what every earlier write left): it may add changes to
//!   other entries (`overlays::related`: referential integrity, memberOf)
//!   or refuse the operation (uniqueness). Not run for changes a
//!   replication consumer receives.
//! - `in_txn` runs in the writer's transaction after stamping, before the
//!   change is written: it may read or write other entries through the
//!   transaction, or add response controls.
//!
//! The built-in hooks run first, then the configured overlays in order
//! ([`all`]). An error from any of them undoes the whole operation.
//! Post-commit work (the audit log) is the operation's `WriteOp::audit`.

use pando_model::{Entry, Schema};
use pando_proto::{oid, Control};
use pando_store::{View, WriteTxn};

use super::{Change, WriteCtx};
use crate::controls::ReadEntry as ReadRequest;
use crate::error::{LdapError, OpResult};
use crate::seams::WriteHook;
use pando_access::acl::{self, Access};

/// The order built-in hooks run in.
const HOOKS: &[&dyn WriteHook] = &[&Assertion, &ReadEntry];

/// Every hook, in order: the built-in ones, then the server's overlays.
pub fn all(ctx: &WriteCtx) -> impl Iterator<Item = &dyn WriteHook> {
    HOOKS.iter().copied().chain(
        ctx.server
            .layers
            .write
            .iter()
            .map(|h| &**h as &dyn WriteHook),
    )
}

/// Every hook's `on_target`, in order: each operation's plan calls this
/// once it has resolved its target.
pub fn on_target(ctx: &WriteCtx, view: &View<'_>, norm: &str, entry: &Entry) -> OpResult<()> {
    for hook in all(ctx) {
        hook.on_target(ctx, view, norm, entry)?;
    }
    Ok(())
}

/// Every hook's `related`, in order, then the changes they added checked
/// ([`finish`]). Not asked for a received change (`WriteOp::related`):
/// its provider sends what its own overlays changed.
pub fn related(ctx: &WriteCtx, view: &View<'_>, changes: &mut Vec<Change>) -> OpResult<()> {
    if ctx.server.layers.is_empty() {
        return Ok(());
    }
    let first_added = changes.len();
    for hook in all(ctx) {
        hook.related(ctx, view, changes)?;
    }
    // Entries a replication consumer keeps belong to its provider, whose
    // overlays keep them: they are not changed here (unless every provider
    // takes writes).
    let mut i = first_added;
    while i < changes.len() && !ctx.server.multi_provider() {
        if ctx.server.rt.replicas.holding(changes[i].norm()).is_some() {
            changes.remove(i);
        } else {
            i += 1;
        }
    }
    finish(&ctx.server.schema, changes, first_added)
}

/// After the overlays: drop the modifies they added that change nothing,
/// and check the schema of those that do (an entry they changed must
/// still be valid: a group left without members is not).
fn finish(schema: &Schema, changes: &mut Vec<Change>, first_added: usize) -> OpResult<()> {
    let mut i = first_added;
    while i < changes.len() {
        let c = &changes[i];
        let unchanged =
            matches!((&c.before, &c.after), (Some(b), Some(a)) if b.entry.attrs == a.attrs);
        if unchanged {
            changes.remove(i);
            continue;
        }
        if let Some(after) = changes[i].after.as_mut() {
            let dn = after.dn.to_string();
            schema.check_entry(after).map_err(|e| {
                LdapError::new(
                    e.code,
                    format!("this change would leave {dn} invalid: {}", e.message),
                )
            })?;
        }
        i += 1;
    }
    Ok(())
}

/// RFC 4528: the operation goes ahead only if the assertion is TRUE for
/// its target (for an add, the entry being added). Tested, as slapd does,
/// before the modification itself is checked.
struct Assertion;

impl WriteHook for Assertion {
    fn on_target(
        &self,
        ctx: &WriteCtx,
        view: &View<'_>,
        norm: &str,
        entry: &Entry,
    ) -> OpResult<()> {
        let Some(filter) = &ctx.controls.assertion else {
            return Ok(());
        };
        if crate::assertion_holds(&ctx.server, view, &ctx.who, norm, entry, filter) {
            Ok(())
        } else {
            Err(crate::assertion_failed())
        }
    }
}

/// RFC 4527 pre-read and post-read: the target entry before and after the
/// change, as a search by the requester would return it, less the
/// attributes it may not read. A requester that may not read the entry
/// gets no response control, or, when the control is critical, has the
/// whole operation refused (insufficientAccessRights) as slapd does.
struct ReadEntry;

/// One side of a read-entry request: the response control's OID, the
/// request (if made), and the entry with its normalised DN (if there is
/// one on that side: no pre-read of an add, no post-read of a delete).
type Side<'c> = (
    &'static str,
    Option<&'c ReadRequest>,
    Option<(&'c Entry, &'c str)>,
);

/// The pre-read and post-read sides of a change.
fn sides<'c>(ctx: &'c WriteCtx, target: &'c Change) -> [Side<'c>; 2] {
    [
        (
            oid::PRE_READ,
            ctx.controls.pre_read.as_ref(),
            target.before.as_ref().map(|b| (&b.entry, b.norm.as_str())),
        ),
        (
            oid::POST_READ,
            ctx.controls.post_read.as_ref(),
            target.after.as_ref().map(|a| (a, target.norm())),
        ),
    ]
}

fn may_read_entry(
    ctx: &WriteCtx,
    view: &View<'_>,
    access: &mut Access<'_>,
    entry: &Entry,
    norm: &str,
) -> bool {
    if access.unrestricted() {
        return true;
    }
    let rules = access.entry(&ctx.server.schema, norm, entry);
    access.allows(Some(view), &rules, norm, None, acl::READ)
}

impl WriteHook for ReadEntry {
    fn check(&self, ctx: &WriteCtx, view: &View<'_>, changes: &[Change]) -> OpResult<()> {
        let c = &ctx.controls;
        let (true, Some(target)) = (
            c.pre_read.is_some() || c.post_read.is_some(),
            changes.first(),
        ) else {
            return Ok(());
        };
        let mut access = Access::new(&ctx.server.acl, &ctx.who);
        for (_, wanted, side) in sides(ctx, target) {
            let (Some(req), Some((entry, norm))) = (wanted, side) else {
                continue;
            };
            if req.critical && !may_read_entry(ctx, view, &mut access, entry, norm) {
                return Err(LdapError::access(
                    "no read access to the entry the critical read-entry control asks for",
                ));
            }
        }
        Ok(())
    }

    fn in_txn(
        &self,
        ctx: &WriteCtx,
        w: &mut WriteTxn<'_>,
        changes: &mut [Change],
        controls: &mut Vec<Control>,
    ) -> OpResult<()> {
        let c = &ctx.controls;
        let (true, Some(target)) = (
            c.pre_read.is_some() || c.post_read.is_some(),
            changes.first(),
        ) else {
            return Ok(());
        };
        let view = w.view();
        let mut access = Access::new(&ctx.server.acl, &ctx.who);
        for (oid, wanted, side) in sides(ctx, target) {
            let (Some(req), Some((entry, norm))) = (wanted, side) else {
                continue;
            };
            if !may_read_entry(ctx, &view, &mut access, entry, norm) {
                continue;
            }
            let unrestricted = access.unrestricted();
            let value = crate::search::encode_read_entry(
                &ctx.server.schema,
                Some(&view),
                (!unrestricted).then_some(&mut access),
                norm,
                &entry.dn.to_string(),
                entry,
                &req.attrs,
            )?;
            controls.push(Control {
                oid: oid.to_string(),
                critical: false,
                value: Some(value),
            });
        }
        Ok(())
    }
}
