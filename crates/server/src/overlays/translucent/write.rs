//! Writes and compares below a translucent suffix.
//!
//! - A local entry (not a part) is written as any stored entry.
//! - A remote entry's attributes are changed here, in its local part, if
//!   the overlay keeps them locally (`local_attributes`, or every one
//!   with `remote_writes = "local"`); otherwise the change is refused.
//!   Access is checked on the merged entry, as the client sees it; the
//!   part is then written past the access rules (made, or changed, with
//!   its missing ancestors made as parts too).
//! - A remote entry cannot be deleted or renamed here.
//! - An add of a name the remote holds is entryAlreadyExists; a new local
//!   entry below a remote-only parent gets that parent (and its remote-only
//!   ancestors) as parts first.

use std::sync::Arc;

use pando_model::{Dn, Entry};
use pando_proto::{
    AddRequest, CompareRequest, ModOp, ModifyDnRequest, ModifyRequest, PartialAttribute, ResultCode,
};

use super::{is_part, merge, Translucent};
use crate::error::{LdapError, OpResult};
use crate::ops::controls::Requested;
use crate::ops::write::{self, WriteCtx, Written};
use crate::state::{Identity, Server};

/// What the store holds under a name below a translucent suffix.
pub enum Stored {
    /// A local entry: written and read as usual.
    Local,
    /// The local part of a remote entry.
    Part(Entry),
    Absent,
}

/// Look `dn` up in the store.
pub fn stored(server: &Server, dn: &Dn) -> OpResult<Stored> {
    let rtxn = server.store.read()?;
    let view = rtxn.view();
    let rdns = crate::ops::norm_rdns(&view, dn)?;
    match view.lookup_norm(&rdns)? {
        pando_store::Lookup::Found(id) => {
            let mut e = crate::ops::stored_entry(&view, id)?;
            if is_part(&e) {
                e.dn = view.dn(id)?;
                Ok(Stored::Part(e))
            } else {
                Ok(Stored::Local)
            }
        }
        _ => Ok(Stored::Absent),
    }
}

fn remote_failed(t: &Translucent, e: crate::net::client::ClientError) -> LdapError {
    tracing::warn!(remote = %t.remote.endpoint.url, error = %e, "translucent: the remote server could not be read");
    LdapError::new(
        ResultCode::UNAVAILABLE,
        format!("the remote server of {} could not be read: {e}", t.suffix),
    )
}

fn held_remotely(t: &Translucent, dn: &str, what: &str) -> LdapError {
    LdapError::unwilling(format!(
        "{dn} is held by the remote server {} and cannot be {what} here (only its local attributes can be changed)",
        t.remote.endpoint.url
    ))
}

/// The entry as clients see it: the remote's merged with its part, or
/// None when the remote has none (a part alone is not shown).
pub async fn merged(
    server: &Server,
    t: &Translucent,
    dn: &Dn,
    part: Option<&Entry>,
) -> OpResult<Option<Entry>> {
    let schema = &*server.schema;
    let remote = t
        .remote
        .read(schema, &dn.to_string())
        .await
        .map_err(|e| remote_failed(t, e))?;
    Ok(remote.map(|r| match part {
        Some(p) => merge(schema, r, p),
        None => r,
    }))
}

/// Who writes a part: the requester, past the access rules (they were
/// checked on the merged entry).
fn part_writer(who: &Identity) -> Identity {
    who.clone().with_roles(who.is_admin(), true)
}

/// Make the ancestors of `dn` (below the suffix) that exist only remotely,
/// as parts holding their RDN's values.
async fn make_parents(
    server: &Arc<Server>,
    t: &Translucent,
    who: &Identity,
    dn: &Dn,
) -> OpResult<()> {
    make_parts_from(server, t, who, dn.parent()).await
}

/// Make `top` and its ancestors (below the suffix) that exist only
/// remotely, as parts holding their RDN's values.
async fn make_parts_from(
    server: &Arc<Server>,
    t: &Translucent,
    who: &Identity,
    top: Option<Dn>,
) -> OpResult<()> {
    let schema = &*server.schema;
    let mut missing = Vec::new();
    let mut at = top;
    while let Some(p) = at {
        let norm = schema
            .normalize_dn(&p)
            .map_err(|e| LdapError::invalid_dn(format!("invalid DN '{p}': {e}")))?;
        if !t.covers(&norm) {
            break;
        }
        match stored(server, &p)? {
            Stored::Absent => missing.push(p.clone()),
            _ => break,
        }
        at = p.parent();
    }
    for p in missing.into_iter().rev() {
        if t.remote
            .read(schema, &p.to_string())
            .await
            .map_err(|e| remote_failed(t, e))?
            .is_none()
        {
            return Err(LdapError::new(
                ResultCode::NO_SUCH_OBJECT,
                format!("{p} exists neither here nor on the remote server"),
            ));
        }
        let mut attrs = vec![PartialAttribute {
            name: "objectClass".into(),
            values: vec![
                b"top".to_vec(),
                b"glue".to_vec(),
                b"extensibleObject".to_vec(),
            ],
        }];
        attrs.extend(rdn_values(&p));
        let ctx = WriteCtx::new(server, &part_writer(who), Requested::default());
        let req = AddRequest {
            dn: p.to_string(),
            attrs,
        };
        match write::add(ctx, req).await {
            Ok(_) => {}
            // Made meanwhile by another write: as good.
            Err(e) if e.code == ResultCode::ENTRY_ALREADY_EXISTS => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// The values of a DN's own RDN, as attributes.
fn rdn_values(dn: &Dn) -> Vec<PartialAttribute> {
    let mut out: Vec<PartialAttribute> = Vec::new();
    for ava in dn.rdn().map(|r| r.avas.as_slice()).unwrap_or(&[]) {
        match out
            .iter_mut()
            .find(|a| a.name.eq_ignore_ascii_case(&ava.attr))
        {
            Some(a) => a.values.push(ava.value.clone()),
            None => out.push(PartialAttribute {
                name: ava.attr.clone(),
                values: vec![ava.value.clone()],
            }),
        }
    }
    out
}

/// An add: refused when the remote holds the name; otherwise a local
/// entry, its remote-only ancestors made as parts first.
pub async fn add(ctx: Arc<WriteCtx>, t: &Translucent, req: AddRequest) -> OpResult<Written> {
    let server = ctx.server.clone();
    let dn = crate::ops::parse_dn(&req.dn)?;
    if matches!(stored(&server, &dn)?, Stored::Absent) {
        let schema = &*server.schema;
        if t.remote
            .read(schema, &req.dn)
            .await
            .map_err(|e| remote_failed(t, e))?
            .is_some()
        {
            return Err(LdapError::new(
                ResultCode::ENTRY_ALREADY_EXISTS,
                format!(
                    "{} exists on the remote server {}",
                    req.dn, t.remote.endpoint.url
                ),
            ));
        }
        make_parents(&server, t, &ctx.who, &dn).await?;
    }
    write::add(ctx, req).await
}

/// A delete: of local entries only.
pub async fn delete(ctx: Arc<WriteCtx>, t: &Translucent, dn_text: String) -> OpResult<Written> {
    let dn = crate::ops::parse_dn(&dn_text)?;
    match stored(&ctx.server, &dn)? {
        Stored::Local => write::delete(ctx, dn_text).await,
        Stored::Part(_) => Err(held_remotely(t, &dn_text, "deleted")),
        Stored::Absent => match merged(&ctx.server, t, &dn, None).await? {
            Some(_) => Err(held_remotely(t, &dn_text, "deleted")),
            None => Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object")),
        },
    }
}

/// A rename: of local entries only (a new parent that exists only
/// remotely is made as a part first).
pub async fn modify_dn(
    ctx: Arc<WriteCtx>,
    t: &Translucent,
    req: ModifyDnRequest,
) -> OpResult<Written> {
    let dn = crate::ops::parse_dn(&req.dn)?;
    match stored(&ctx.server, &dn)? {
        Stored::Local => {
            if let Some(sup) = &req.new_superior {
                let sup = crate::ops::parse_dn(sup)?;
                let norm = ctx
                    .server
                    .schema
                    .normalize_dn(&sup)
                    .map_err(LdapError::invalid_dn)?;
                if t.covers(&norm) {
                    make_parts_from(&ctx.server, t, &ctx.who, Some(sup)).await?;
                }
            }
            write::modify_dn(ctx, req).await
        }
        Stored::Part(_) => Err(held_remotely(t, &req.dn, "renamed")),
        Stored::Absent => match merged(&ctx.server, t, &dn, None).await? {
            Some(_) => Err(held_remotely(t, &req.dn, "renamed")),
            None => Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object")),
        },
    }
}

/// A modify: of a local entry as usual; of a remote entry, its local
/// attributes.
pub async fn modify(ctx: Arc<WriteCtx>, t: &Translucent, req: ModifyRequest) -> OpResult<Written> {
    let server = ctx.server.clone();
    let schema = &*server.schema;
    let dn = crate::ops::parse_dn(&req.dn)?;
    let part = match stored(&server, &dn)? {
        Stored::Local => return write::modify(ctx, req).await,
        Stored::Part(p) => Some(p),
        Stored::Absent => None,
    };
    let norm = schema.normalize_dn(&dn).map_err(LdapError::invalid_dn)?;
    let naming: Vec<String> = rdn_values(&dn)
        .iter()
        .map(|a| super::super::canonical(schema, &a.name).to_ascii_lowercase())
        .collect();
    let mut touched: Vec<String> = Vec::new();
    for ch in &req.changes {
        let (_, at) = schema.canonical_desc(&ch.attr.name)?;
        let name = at.name().to_string();
        if naming.contains(&name.to_ascii_lowercase()) {
            return Err(LdapError::new(
                ResultCode::NOT_ALLOWED_ON_RDN,
                format!(
                    "{name} names {} on the remote server: it cannot be changed here",
                    req.dn
                ),
            ));
        }
        if !at.is_operational() && !t.may_keep_locally(&name) {
            return Err(LdapError::unwilling(format!(
                "{name} of {} comes from the remote server {}: only the translucent overlay's local_attributes can be set here",
                req.dn, t.remote.endpoint.url
            )));
        }
        if !touched.iter().any(|n| n.eq_ignore_ascii_case(&name)) {
            touched.push(name);
        }
    }
    let Some(before) = merged(&server, t, &dn, part.as_ref()).await? else {
        return Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"));
    };
    // Access as for a stored entry: to each attribute changed, on the
    // entry the client sees.
    {
        let rtxn = server.store.read()?;
        let view = rtxn.view();
        let mut checks = Vec::with_capacity(req.changes.len());
        for ch in &req.changes {
            let (_, at) = schema.canonical_desc(&ch.attr.name)?;
            checks.push((Some(at), crate::acl::WRITE));
        }
        crate::ops::require(&server, &view, &ctx.who, &norm, &before, &checks)?;
    }
    let mut after = before.clone();
    write::apply_changes(
        schema,
        &mut after,
        &req.changes,
        ctx.controls.permissive_modify,
    )?;
    let values_of = |e: &Entry, name: &str| -> Vec<Vec<u8>> {
        e.attrs
            .iter()
            .filter(|a| {
                let base = a.desc.split(';').next().unwrap_or("");
                super::super::canonical(schema, base).eq_ignore_ascii_case(name)
            })
            .flat_map(|a| a.values.iter().cloned())
            .collect()
    };
    // objectClass: the part holds only the classes the remote lacks.
    let part_values = |name: &str| -> Vec<Vec<u8>> {
        let mut vs = values_of(&after, name);
        if name.eq_ignore_ascii_case("objectClass") {
            let theirs = values_of(&before, name);
            vs.retain(|v| !theirs.iter().any(|r| r.eq_ignore_ascii_case(v)));
            let mut classes = vec![
                b"top".to_vec(),
                b"glue".to_vec(),
                b"extensibleObject".to_vec(),
            ];
            classes.extend(vs);
            return classes;
        }
        vs
    };
    let writer = WriteCtx::new(&server, &part_writer(&ctx.who), ctx.controls.clone());
    if part.is_some() {
        let changes = touched
            .iter()
            .map(|name| pando_proto::Change {
                op: ModOp::Replace,
                attr: PartialAttribute {
                    name: name.clone(),
                    values: part_values(name),
                },
            })
            .collect();
        return write::modify(
            writer,
            ModifyRequest {
                dn: req.dn,
                changes,
            },
        )
        .await;
    }
    make_parents(&server, t, &ctx.who, &dn).await?;
    let mut attrs = vec![PartialAttribute {
        name: "objectClass".into(),
        values: part_values("objectClass"),
    }];
    attrs.extend(rdn_values(&dn));
    for name in touched
        .iter()
        .filter(|n| !n.eq_ignore_ascii_case("objectClass"))
    {
        let values = part_values(name);
        if !values.is_empty() {
            attrs.push(PartialAttribute {
                name: name.clone(),
                values,
            });
        }
    }
    write::add(writer, AddRequest { dn: req.dn, attrs }).await
}

/// A compare: on the entry as clients see it.
pub async fn compare(
    server: &Arc<Server>,
    t: &Translucent,
    who: &Identity,
    controls: &Requested,
    req: &CompareRequest,
) -> OpResult<ResultCode> {
    let dn = crate::ops::parse_dn(&req.dn)?;
    let part = match stored(server, &dn)? {
        Stored::Local => {
            let (server, who, controls, req) =
                (server.clone(), who.clone(), controls.clone(), req.clone());
            return tokio::task::spawn_blocking(move || {
                crate::ops::compare::compare(&server, &who, &controls, &req)
            })
            .await
            .unwrap_or_else(|_| {
                Err(LdapError::new(
                    ResultCode::OTHER,
                    "compare failed unexpectedly",
                ))
            });
        }
        Stored::Part(p) => Some(p),
        Stored::Absent => None,
    };
    let Some(entry) = merged(server, t, &dn, part.as_ref()).await? else {
        return Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"));
    };
    let norm = server
        .schema
        .normalize_dn(&dn)
        .map_err(LdapError::invalid_dn)?;
    let rtxn = server.store.read()?;
    crate::ops::compare::compare_entry(server, &rtxn.view(), who, controls, &norm, &entry, req)
}
