//! Modify (RFC 4511 4.6, RFC 4525 increment), planned on a snapshot.

use std::sync::Arc;

use pando_model::{Dn, Entry};
use pando_proto::{ModOp, ModifyRequest, ResultCode};
use pando_store::View;

use super::changes::{apply_changes, check_invariants, check_schema_keeping};
use super::checks::{check_password_values, check_value_count, reject_maintained};
use super::{Before, Change, WriteCtx, WriteOp, Written};
use crate::error::{LdapError, OpResult};
use pando_access::acl;

struct Modify {
    dn_text: String,
    dn: Dn,
    norm: String,
    changes: Vec<pando_proto::Change>,
}

pub async fn modify(ctx: Arc<WriteCtx>, req: ModifyRequest) -> OpResult<Written> {
    let (server, who) = (&ctx.server, &ctx.who);
    let schema = &server.schema;
    super::check_controls(&ctx)?;
    let dn = crate::parse_dn(&req.dn)?;
    let norm = schema
        .normalize_dn(&dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN: {e}")))?;
    // As slapd answers both (they exist, but are made, not stored).
    if norm.is_empty() {
        return Err(LdapError::unwilling(
            "modify upon the root DSE not supported",
        ));
    }
    if norm == crate::special::SUBSCHEMA_NORM {
        return Err(LdapError::unwilling(
            "modification of the subschema subentry not supported: schema is added under cn=schema,cn=config or in schema files",
        ));
    }
    check_value_count(server, who, req.changes.iter().map(|c| c.attr.values.len()))?;
    let mut clear = 0;
    for ch in &req.changes {
        reject_maintained(schema, &ch.attr.name, ctx.relaxed())?;
        // Each clear-text value costs a slow hash: users changing their
        // own password get one value, not thousands.
        let password = schema.names_password(&ch.attr.name);
        if password && !who.is_admin() && ch.attr.values.len() > 1 {
            return Err(LdapError::new(
                ResultCode::CONSTRAINT_VIOLATION,
                "userPassword: one value at a time",
            ));
        }
        if password && matches!(ch.op, ModOp::Add | ModOp::Replace) {
            clear = check_password_values(server, who, clear, &ch.attr.values)?;
        }
    }
    if let Some(p) = &server.policy {
        check_policy(&ctx, &**p, &norm, &req.changes).await?;
    }
    let mut op = Modify {
        dn_text: req.dn,
        dn,
        norm,
        changes: req.changes,
    };
    if clear > 0 {
        // Access and the modification's validity are settled on a snapshot
        // before any hashing (planned again by the pipeline, on the hashed
        // values).
        {
            let rtxn = server.rt.store.read()?;
            super::plan_and_check(&ctx, &op, &rtxn.view())?;
        }
        for ch in &mut op.changes {
            if schema.names_password(&ch.attr.name) && matches!(ch.op, ModOp::Add | ModOp::Replace)
            {
                ch.attr.values = server
                    .passwords
                    .hash_all(std::mem::take(&mut ch.attr.values))
                    .await?;
            }
        }
    }
    super::run(ctx, Arc::new(op)).await
}

/// The password policy's checks of a modify that sets a password, on the
/// values as sent (before hashing).
async fn check_policy(
    ctx: &WriteCtx,
    p: &dyn crate::seams::PasswordPolicy,
    norm: &str,
    changes: &[pando_proto::Change],
) -> OpResult<()> {
    let schema = &ctx.server.schema;
    let pw = |c: &&pando_proto::Change| schema.names_password(&c.attr.name);
    let new: Vec<&Vec<u8>> = changes
        .iter()
        .filter(pw)
        .filter(|c| matches!(c.op, ModOp::Add | ModOp::Replace))
        .flat_map(|c| c.attr.values.iter())
        .collect();
    if new.is_empty() {
        return Ok(());
    }
    let old_given = changes
        .iter()
        .filter(pw)
        .any(|c| c.op == ModOp::Delete && !c.attr.values.is_empty());
    if new.len() > 1 {
        return Err(LdapError::new(
            ResultCode::CONSTRAINT_VIOLATION,
            "the password policy allows one password value",
        ));
    }
    let clear = (!pando_password::is_hashed(new[0])).then_some(new[0].as_slice());
    p.check_change(
        &ctx.server,
        &ctx.who,
        norm,
        clear,
        old_given,
        ctx.controls.ppolicy,
    )
    .await
}

impl Modify {
    /// The entry `old` after the modify: [`Modify::applied`], then the
    /// schema checked.
    fn changed(&self, ctx: &WriteCtx, view: &View<'_>, old: &Entry) -> OpResult<Entry> {
        let mut new = self.applied(ctx, view, old)?;
        check_schema_keeping(&ctx.server.schema, &mut new, Some(old))?;
        Ok(new)
    }

    /// The entry `old` (as the requester sees it) with the modify
    /// applied: the hooks on the target (the assertion), write access to
    /// every changed attribute, the changes, the RDN's values kept.
    fn applied(&self, ctx: &WriteCtx, view: &View<'_>, old: &Entry) -> OpResult<Entry> {
        let (server, who) = (&*ctx.server, &ctx.who);
        let schema = &*server.schema;
        super::hooks::on_target(ctx, view, &self.norm, old)?;
        let mut checks = Vec::with_capacity(self.changes.len());
        for ch in &self.changes {
            let (_, at) = schema.canonical_desc(&ch.attr.name)?;
            checks.push((Some(at), acl::WRITE));
        }
        crate::require(server, view, who, &self.norm, old, &checks)?;
        let mut new = old.clone();
        apply_changes(
            schema,
            &mut new,
            &self.changes,
            ctx.controls.permissive_modify,
        )?;
        // RDN values first: removing one is notAllowedOnRDN (RFC 4511 4.6),
        // even when it empties the attribute (slapd then says
        // namingViolation). Schema checks apply to user attributes;
        // maintained ones ride along.
        check_invariants(schema, old, &new)?;
        Ok(new)
    }
}

impl WriteOp for Modify {
    const ON_SNAPSHOT: bool = true;

    /// Read the entry, check write access to every changed attribute, apply
    /// the changes and check the schema.
    fn plan(&self, ctx: &WriteCtx, view: &View<'_>) -> OpResult<Vec<Change>> {
        if let Some(p) = &ctx.partial {
            // The entry as the requester sees it, whose schema is its
            // holder's (the part stored is checked).
            let applied = |old: &Entry| self.applied(ctx, view, old);
            return super::partial::plan(ctx, view, &**p, (&self.dn, &self.norm), &applied);
        }
        let (server, who) = (&*ctx.server, &ctx.who);
        let id = crate::resolve_for(server, view, who, &self.dn)?;
        let before = Before::planned(view, id, &self.norm)?;
        let new = self.changed(ctx, view, &before.entry)?;
        Ok(vec![Change::modify(before, new)])
    }

    fn audit(&self, ctx: &WriteCtx, changes: &[Change]) {
        if !crate::audit::on(&ctx.server) {
            return;
        }
        // userPassword is logged as the values stored after the change.
        let schema = &ctx.server.schema;
        let touched = self
            .changes
            .iter()
            .any(|c| schema.names_password(&c.attr.name));
        let passwords: Option<Vec<Vec<u8>>> = touched.then(|| {
            changes
                .first()
                .and_then(|c| c.after.as_ref())
                .map(|e| crate::password_values(&e.attrs))
                .unwrap_or_default()
        });
        crate::audit::write(
            &ctx.server,
            &ctx.who,
            pando_observe::audit::Record::Modify {
                dn: &self.dn_text,
                changes: &self.changes,
                passwords: passwords.as_deref(),
            },
        );
    }
}
