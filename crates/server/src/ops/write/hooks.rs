//! Hooks every write passes through, in the order of [`HOOKS`]: the seam
//! where controls act on writes today and overlays will plug in.
//!
//! A hook's `check` runs on the view the change was planned on (refusing
//! the operation before anything is stamped or written); `in_txn` runs in
//! the writer's transaction after stamping, before the change is written,
//! and may read or write other entries through the transaction or add
//! response controls. An error from either undoes the whole operation.
//! Post-commit work (the audit log) is the operation's `audit`.

use pando_proto::{oid, Control, ResultCode};
use pando_store::{View, WriteTxn};

use super::{Change, WriteCtx};
use crate::acl::{self, Access};
use crate::error::{LdapError, OpResult};

pub trait Hook: Sync {
    fn check(&self, _ctx: &WriteCtx, _view: &View<'_>, _changes: &[Change]) -> OpResult<()> {
        Ok(())
    }

    fn in_txn(
        &self,
        _ctx: &WriteCtx,
        _w: &mut WriteTxn<'_>,
        _changes: &mut [Change],
        _controls: &mut Vec<Control>,
    ) -> OpResult<()> {
        Ok(())
    }
}

/// The order hooks run in.
pub const HOOKS: &[&dyn Hook] = &[&Assertion, &ReadEntry];

/// RFC 4528: the operation goes ahead only if the assertion is TRUE for
/// its target (for an add, the entry being added).
struct Assertion;

impl Hook for Assertion {
    fn check(&self, ctx: &WriteCtx, view: &View<'_>, changes: &[Change]) -> OpResult<()> {
        let (Some(filter), Some(target)) = (&ctx.controls.assertion, changes.first()) else {
            return Ok(());
        };
        let entry = match (&target.before, &target.after) {
            (Some(b), _) => &b.entry,
            (None, Some(a)) => a,
            (None, None) => return Ok(()),
        };
        if super::super::assertion_holds(
            &ctx.server,
            view,
            &ctx.who,
            target_norm(target),
            entry,
            filter,
        ) {
            Ok(())
        } else {
            Err(LdapError::new(
                ResultCode::ASSERTION_FAILED,
                "the assertion control's filter is not true for the entry",
            ))
        }
    }
}

/// The normalised DN the target has before the change (after, for an add).
fn target_norm(c: &Change) -> &str {
    match &c.before {
        Some(b) => &b.norm,
        None => c.norm(),
    }
}

/// RFC 4527 pre-read and post-read: the target entry before and after the
/// change, as a search by the requester would return it. A requester
/// without read access to the entry gets insufficientAccessRights and
/// nothing is changed (as slapd does); attributes it may not read are left
/// out.
struct ReadEntry;

impl Hook for ReadEntry {
    fn check(&self, ctx: &WriteCtx, view: &View<'_>, changes: &[Change]) -> OpResult<()> {
        let Some(target) = changes.first() else {
            return Ok(());
        };
        let mut access = Access::new(&ctx.server.acl, &ctx.who);
        if access.unrestricted() {
            return Ok(());
        }
        let schema = &ctx.server.schema;
        let sides = [
            (
                ctx.controls.pre_read.is_some(),
                target.before.as_ref().map(|b| (&b.entry, b.norm.as_str())),
            ),
            (
                ctx.controls.post_read.is_some(),
                target.after.as_ref().map(|a| (a, target.norm())),
            ),
        ];
        for (wanted, side) in sides {
            let (true, Some((entry, norm))) = (wanted, side) else {
                continue;
            };
            let rules = access.entry(schema, norm, entry);
            if !access.allows(Some(view), &rules, norm, None, acl::READ) {
                return Err(LdapError::access(
                    "no read access to the entry the read-entry control asks for",
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
        let Some(target) = changes.first() else {
            return Ok(());
        };
        let view = w.view();
        let schema = &ctx.server.schema;
        let mut access = Access::new(&ctx.server.acl, &ctx.who);
        let unrestricted = access.unrestricted();
        let sides = [
            (
                oid::PRE_READ,
                &ctx.controls.pre_read,
                target.before.as_ref().map(|b| (&b.entry, b.norm.as_str())),
            ),
            (
                oid::POST_READ,
                &ctx.controls.post_read,
                target.after.as_ref().map(|a| (a, target.norm())),
            ),
        ];
        for (oid, wanted, side) in sides {
            let (Some(attrs), Some((entry, norm))) = (wanted, side) else {
                continue;
            };
            let dn = entry.dn.to_string();
            let value = crate::ops::search::encode_read_entry(
                schema,
                &view,
                (!unrestricted).then_some(&mut access),
                norm,
                &dn,
                entry,
                attrs,
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
