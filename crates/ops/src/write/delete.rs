//! Delete (RFC 4511 4.8), and with the tree delete control a whole subtree.

use std::sync::Arc;

use pando_model::Dn;
use pando_proto::ResultCode;
use pando_store::View;

use super::{Before, Change, WriteCtx, WriteOp, Written};
use crate::error::{LdapError, OpResult};
use pando_access::acl;

struct Delete {
    dn: Dn,
    norm: String,
}

pub async fn delete(ctx: Arc<WriteCtx>, dn_text: String) -> OpResult<Written> {
    super::check_controls(&ctx)?;
    let dn = crate::parse_dn(&dn_text)?;
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
        let id = crate::resolve_for(server, view, who, &self.dn)?;
        let target = crate::stored_entry(view, id)?;
        super::hooks::on_target(ctx, view, &self.norm, &target)?;
        // Access first: a requester who may not delete the entry learns
        // nothing of its children (slapd answers 50 before 66).
        crate::require(
            server,
            view,
            who,
            &self.norm,
            &target,
            &[(None, acl::DELETE)],
        )?;
        let mut targets = vec![(id, self.norm.clone())];
        if view.has_children(id)? {
            if !ctx.controls.tree_delete {
                return Err(LdapError::new(
                    ResultCode::NOT_ALLOWED_ON_NON_LEAF,
                    "subordinate objects must be deleted first",
                ));
            }
            let max = server.cfg.config.limits.max_tree_delete;
            let limit = if max == 0 { u64::MAX } else { max };
            if view.subtree(id, limit)?.is_none() {
                return Err(LdapError::new(
                    ResultCode::ADMIN_LIMIT_EXCEEDED,
                    format!(
                        "the subtree has more than {max} entries (limits.max_tree_delete); \
                         delete it in parts"
                    ),
                ));
            }
            let mut stack = view.children(id)?;
            stack.reverse();
            while let Some(kid) = stack.pop() {
                targets.push((kid, crate::norm_dn_of(view, kid)?));
                let mut grandchildren = view.children(kid)?;
                grandchildren.reverse();
                stack.extend(grandchildren);
            }
        }
        let mut changes = Vec::with_capacity(targets.len());
        let mut first = Some(target);
        for (id, norm) in targets {
            let (entry, below) = match first.take() {
                Some(mut target) => {
                    // As stored (the request may spell it differently).
                    target.dn = view.dn(id)?;
                    (target, false)
                }
                None => {
                    let mut e = crate::stored_entry(view, id)?;
                    e.dn = view.dn(id)?;
                    (e, true)
                }
            };
            let allowed = crate::require(server, view, who, &norm, &entry, &[(None, acl::DELETE)]);
            if let (Err(e), true) = (&allowed, below) {
                // The target exists: an entry below it that the requester
                // may not delete (or see) refuses the whole tree delete
                // without revealing which.
                if matches!(
                    e.code,
                    ResultCode::NO_SUCH_OBJECT | ResultCode::INSUFFICIENT_ACCESS_RIGHTS
                ) {
                    return Err(LdapError::access(
                        "the subtree holds entries this identity may not delete",
                    ));
                }
            }
            allowed?;
            changes.push(Change::delete(Before {
                id,
                entry,
                norm,
                bytes: None,
            }));
        }
        Ok(changes)
    }

    fn audit(&self, ctx: &WriteCtx, changes: &[Change]) {
        // In the order deleted: children first.
        for b in changes.iter().filter_map(|c| c.before.as_ref()) {
            crate::audit::write(
                &ctx.server,
                &ctx.who,
                pando_observe::audit::Record::Delete {
                    dn: &b.entry.dn.to_string(),
                },
            );
        }
    }
}
