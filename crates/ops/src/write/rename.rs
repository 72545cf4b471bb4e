//! Modify DN (RFC 4511 4.9): rename and move, with the subtree.

use std::sync::Arc;

use pando_model::{Dn, Entry, Rdn};
use pando_proto::{ModifyDnRequest, ResultCode};
use pando_store::{Lookup, Placement, View};

use super::changes::{check_invariants, has_value};
use super::{Before, Change, WriteCtx, WriteOp, Written};
use crate::error::{LdapError, OpResult};
use pando_access::acl;

struct Rename {
    req: ModifyDnRequest,
    dn: Dn,
    norm: String,
    new_rdn: Rdn,
    new_superior: Option<Dn>,
}

pub async fn modify_dn(ctx: Arc<WriteCtx>, req: ModifyDnRequest) -> OpResult<Written> {
    super::check_controls(&ctx)?;
    let schema = &ctx.server.schema;
    let dn = crate::parse_dn(&req.dn)?;
    let norm = schema
        .normalize_dn(&dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN: {e}")))?;
    let new_rdn = Rdn::parse(&req.new_rdn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid new RDN '{}': {e}", req.new_rdn)))?;
    let new_superior = match &req.new_superior {
        Some(s) => Some(crate::parse_dn(s)?),
        None => None,
    };
    // The server's own stamps cannot name an entry (it rewrites them).
    for ava in &new_rdn.avas {
        super::checks::reject_maintained(schema, &ava.attr, false)?;
    }
    if ctx.server.is_suffix(&norm) {
        return Err(LdapError::unwilling("cannot rename a suffix entry"));
    }
    let op = Rename {
        req,
        dn,
        norm,
        new_rdn,
        new_superior,
    };
    super::run(ctx, Arc::new(op)).await
}

impl WriteOp for Rename {
    fn plan(&self, ctx: &WriteCtx, view: &View<'_>) -> OpResult<Vec<Change>> {
        let (server, who) = (&*ctx.server, &ctx.who);
        let schema = &*server.schema;
        let dn = &self.dn;
        let id = crate::resolve_for(server, view, who, dn)?;
        let parent_dn = match &self.new_superior {
            Some(d) => d.clone(),
            None => dn.parent().unwrap_or(Dn { rdns: Vec::new() }),
        };
        let parent_id = match view.lookup(&parent_dn)? {
            Ok(Lookup::Found(p)) => p,
            Ok(Lookup::Missing { matched }) => return Err(crate::no_such_object(view, matched)?),
            Err(e) => {
                return Err(LdapError::invalid_dn(format!(
                    "invalid new superior '{parent_dn}': {e}"
                )))
            }
        };
        if view.is_within(parent_id, id)? {
            return Err(LdapError::unwilling("cannot move an entry below itself"));
        }
        // Both names as stored (the request may spell them differently);
        // the new RDN as given.
        let stored_parent = match parent_id {
            0 => parent_dn.clone(),
            p => view.dn(p)?,
        };
        let new_dn = stored_parent.child(self.new_rdn.clone());
        let new_norm_rdn = schema
            .normalize_rdn(&self.new_rdn)
            .map_err(|e| LdapError::invalid_dn(format!("invalid new RDN: {e}")))?;
        let new_rdns = crate::norm_rdns(view, &new_dn)?;
        let new_norm = new_rdns.join(",");
        let current = crate::stored_entry(view, id)?;
        super::hooks::on_target(ctx, view, &self.norm, &current)?;
        // Moving is deleting here and adding there.
        crate::require(
            server,
            view,
            who,
            &self.norm,
            &current,
            &[(None, acl::DELETE)],
        )?;
        crate::require(server, view, who, &new_norm, &current, &[(None, acl::ADD)])?;
        match view.lookup_norm(&new_rdns)? {
            Lookup::Found(other) if other != id => {
                return Err(LdapError::new(
                    ResultCode::ENTRY_ALREADY_EXISTS,
                    "an entry with the new DN already exists",
                ))
            }
            _ => {}
        }
        let old = Entry {
            dn: view.dn(id)?,
            attrs: current.attrs,
        };
        let mut new = Entry {
            dn: new_dn,
            attrs: old.attrs.clone(),
        };
        if self.req.delete_old_rdn {
            remove_old_rdn_values(schema, dn, &mut new);
        }
        for ava in &self.new_rdn.avas {
            let Some(at) = schema.attribute(&ava.attr) else {
                return Err(LdapError::invalid_dn(format!(
                    "unknown attribute type '{}' in new RDN",
                    ava.attr
                )));
            };
            if !has_value(schema, &new, at, &ava.value) {
                new.add_values(at.name(), vec![ava.value.clone()]);
            }
        }
        schema.check_entry(&mut new)?;
        check_invariants(schema, &old, &new)?;
        let before = Before {
            id,
            entry: old,
            norm: self.norm.clone(),
            bytes: None,
        };
        let place = Placement {
            parent: parent_id,
            rdn: self.new_rdn.to_string(),
            norm_rdn: new_norm_rdn,
        };
        Ok(vec![Change::rename(before, new, new_norm, place)])
    }

    fn audit(&self, ctx: &WriteCtx, _changes: &[Change]) {
        crate::audit::write(
            &ctx.server,
            &ctx.who,
            pando_observe::audit::Record::ModDn {
                dn: &self.req.dn,
                new_rdn: &self.req.new_rdn,
                delete_old_rdn: self.req.delete_old_rdn,
                new_superior: self.req.new_superior.as_deref(),
            },
        );
    }
}

/// deleteoldrdn: the old RDN's values leave the entry (values the server
/// maintains stay).
fn remove_old_rdn_values(schema: &pando_model::Schema, dn: &Dn, new: &mut Entry) {
    let Some(old_rdn) = dn.rdn() else { return };
    for ava in &old_rdn.avas {
        let Some(at) = schema.attribute(&ava.attr) else {
            continue;
        };
        if at.no_user_modification {
            continue;
        }
        let want = schema
            .normalize(at, &ava.value)
            .unwrap_or_else(|_| ava.value.clone());
        for a in new.attrs.iter_mut().filter(|a| {
            schema
                .attribute(pando_model::desc::base(&a.desc))
                .is_some_and(|t| std::ptr::eq(t, at))
        }) {
            a.values
                .retain(|v| schema.normalize(at, v).unwrap_or_else(|_| v.clone()) != want);
        }
        new.attrs.retain(|a| !a.values.is_empty());
    }
}
