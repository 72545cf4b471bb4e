//! Delete (RFC 4511 4.8), and with the tree delete control a whole subtree.

use std::sync::Arc;

use pando_model::Dn;
use pando_proto::ResultCode;
use pando_store::View;

use super::{Before, Change, WriteCtx, WriteOp, Written};
use crate::acl;
use crate::error::{LdapError, OpResult};
use crate::ops;

struct Delete {
    dn: Dn,
    norm: String,
}

pub async fn delete(ctx: Arc<WriteCtx>, dn_text: String) -> OpResult<Written> {
    super::check_controls(&ctx)?;
    let dn = ops::parse_dn(&dn_text)?;
    let norm = ctx
        .server
        .schema
        .normalize_dn(&dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN: {e}")))?;
    super::run(ctx, Arc::new(Delete { dn, norm })).await
}

impl WriteOp for Delete {
    /// The target first; with the tree delete control, its subtree after it
    /// in pre-order (the pipeline writes in reverse: children first). Every
    /// entry removed needs delete access.
    fn plan(&self, ctx: &WriteCtx, view: &View<'_>) -> OpResult<Vec<Change>> {
        let (server, who) = (&*ctx.server, &ctx.who);
        let id = ops::resolve_for(server, view, who, &self.dn)?;
        let mut targets = vec![(id, self.norm.clone())];
        if view.has_children(id)? {
            if !ctx.controls.tree_delete {
                return Err(LdapError::new(
                    ResultCode::NOT_ALLOWED_ON_NON_LEAF,
                    "subordinate objects must be deleted first",
                ));
            }
            let mut stack = view.children(id)?;
            stack.reverse();
            while let Some(kid) = stack.pop() {
                targets.push((kid, ops::norm_dn_of(view, kid)?));
                let mut grandchildren = view.children(kid)?;
                grandchildren.reverse();
                stack.extend(grandchildren);
            }
        }
        let mut changes = Vec::with_capacity(targets.len());
        for (i, (id, norm)) in targets.into_iter().enumerate() {
            let mut entry = ops::stored_entry(view, id)?;
            ops::require(server, view, who, &norm, &entry, &[(None, acl::DELETE)])?;
            entry.dn = if i == 0 {
                self.dn.clone()
            } else {
                view.dn(id)?
            };
            changes.push(Change {
                before: Some(Before {
                    id,
                    entry,
                    norm,
                    bytes: None,
                }),
                after: None,
                after_norm: None,
                place: None,
            });
        }
        Ok(changes)
    }

    fn audit(&self, ctx: &WriteCtx, changes: &[Change]) {
        for b in changes.iter().rev().filter_map(|c| c.before.as_ref()) {
            crate::observe::audit(
                &ctx.server,
                &ctx.who,
                crate::observe::audit::Record::Delete {
                    dn: &b.entry.dn.to_string(),
                },
            );
        }
    }
}
