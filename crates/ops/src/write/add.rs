//! Add (RFC 4511 4.7).

use std::sync::Arc;

use pando_model::{Dn, Entry};
use pando_proto::AddRequest;
use pando_store::View;

use super::checks::{check_password_values, check_value_count, placement_for, reject_maintained};
use super::{Change, WriteCtx, WriteOp, Written};
use crate::error::{LdapError, OpResult};
use pando_access::acl;

struct Add {
    dn_text: String,
    dn: Dn,
    norm: String,
    /// The entry as sent (clear-text passwords already hashed).
    entry: Entry,
}

/// The add request for `entry` (the server's own adds: first entries,
/// translucent parts).
pub fn request_for(entry: Entry) -> AddRequest {
    AddRequest {
        dn: entry.dn.to_string(),
        attrs: entry
            .attrs
            .into_iter()
            .map(|a| pando_proto::PartialAttribute {
                name: a.desc,
                values: a.values,
            })
            .collect(),
    }
}

pub async fn add(ctx: Arc<WriteCtx>, req: AddRequest) -> OpResult<Written> {
    let (server, who) = (&ctx.server, &ctx.who);
    let schema = &server.schema;
    super::check_controls(&ctx)?;
    let dn = crate::parse_dn(&req.dn)?;
    if dn.is_root() {
        return Err(LdapError::unwilling("cannot add the root DSE"));
    }
    let norm = schema
        .normalize_dn(&dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN '{dn}': {e}")))?;
    check_value_count(server, who, req.attrs.iter().map(|a| a.values.len()))?;
    let mut entry = Entry::new(dn.clone());
    let mut clear = 0;
    for a in req.attrs {
        if a.values.is_empty() {
            return Err(LdapError::protocol(format!("{}: no values given", a.name)));
        }
        reject_maintained(schema, &a.name, ctx.relaxed())?;
        if schema.names_password(&a.name) {
            clear = check_password_values(server, who, clear, &a.values)?;
        }
        entry.add_values(&a.name, a.values);
    }
    if let Some(p) = &server.policy {
        p.check_add(server, who, &entry, ctx.controls.ppolicy)?;
    }
    let mut op = Add {
        dn_text: req.dn,
        dn,
        norm,
        entry,
    };
    if clear > 0 {
        // Access, place, schema and controls are settled on a snapshot
        // before any hashing, so a refused client costs one lookup, not a
        // hash per value. The writer checks again.
        {
            let rtxn = server.rt.store.read()?;
            super::plan_and_check(&ctx, &op, &rtxn.view())?;
        }
        for a in op
            .entry
            .attrs
            .iter_mut()
            .filter(|a| schema.names_password(&a.desc))
        {
            a.values = server
                .passwords
                .hash_all(std::mem::take(&mut a.values))
                .await?;
        }
    }
    super::run(ctx, Arc::new(op)).await
}

impl WriteOp for Add {
    fn plan(&self, ctx: &WriteCtx, view: &View<'_>) -> OpResult<Vec<Change>> {
        let server = &*ctx.server;
        crate::require(
            server,
            view,
            &ctx.who,
            &self.norm,
            &self.entry,
            &[(None, acl::ADD)],
        )?;
        let place = placement_for(server, view, &self.dn)?;
        let mut entry = self.entry.clone();
        // Named as it will be stored: the parent's DN as stored, the RDN
        // as given.
        if let (true, Some(rdn)) = (place.parent != 0, self.dn.rdn()) {
            entry.dn = view.dn(place.parent)?.child(rdn.clone());
        }
        // The RDN's values belong to the entry whether or not the client
        // listed them (RFC 4511 4.7), as slapd adds them.
        server.schema.add_rdn_values(&mut entry);
        let structural = server.schema.check_entry(&mut entry)?;
        super::hooks::on_target(ctx, view, &self.norm, &entry)?;
        entry.remove("structuralObjectClass");
        entry.add_values("structuralObjectClass", vec![structural.into_bytes()]);
        Ok(vec![Change::add(entry, self.norm.clone(), place)])
    }

    fn audit(&self, ctx: &WriteCtx, changes: &[Change]) {
        if let Some(after) = changes.first().and_then(|c| c.after.as_ref()) {
            crate::audit::write(
                &ctx.server,
                &ctx.who,
                pando_observe::audit::Record::Add {
                    dn: &self.dn_text,
                    attrs: &after.attrs,
                },
            );
        }
    }
}
