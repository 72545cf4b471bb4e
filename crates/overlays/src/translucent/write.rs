//! Writes and compares below a translucent suffix.
//!
//! - A local entry (not a part) is written as any stored entry.
//! - A remote entry's attributes are changed here, in its local part, if
//!   the overlay keeps them locally (`local_attributes`, or every one
//!   with `remote_writes = "local"`); otherwise the change is refused.
//!   The modify goes through the write pipeline as the requester, with
//!   its controls (`pando_ops::seams::Partial`): access, the assertion
//!   and No-Op are judged on the merged entry, as the client sees it, and
//!   the part is made or changed in the same transaction (with its
//!   missing ancestors made as parts too).
//! - A remote entry cannot be deleted or renamed here.
//! - An add of a name the remote holds is entryAlreadyExists; a new local
//!   entry below a remote-only parent gets that parent (and its remote-only
//!   ancestors) as parts first.

use std::sync::Arc;

use pando_model::{Dn, Entry};
use pando_proto::{
    AddRequest, CompareRequest, ModifyDnRequest, ModifyRequest, PartialAttribute, ResultCode,
};

use super::{is_part, is_part_class, merge, Translucent};
use pando_access::Identity;
use pando_ops::controls::Requested;
use pando_ops::error::{LdapError, OpResult};
use pando_ops::state::Server;
use pando_ops::write::{self, WriteCtx, Written};

/// What the store holds under a name below a translucent suffix.
pub enum Stored {
    /// A local entry: written and read as usual.
    Local(Entry),
    /// The local part of a remote entry.
    Part(Entry),
    Absent,
}

/// Look `dn` up in the store.
pub fn stored(server: &Server, dn: &Dn) -> OpResult<Stored> {
    let rtxn = server.rt.store.read()?;
    let view = rtxn.view();
    let rdns = pando_ops::norm_rdns(&view, dn)?;
    match view.lookup_norm(&rdns)? {
        pando_store::Lookup::Found(id) => {
            let mut e = pando_ops::stored_entry(&view, id)?;
            e.dn = view.dn(id)?;
            if is_part(&e) {
                Ok(Stored::Part(e))
            } else {
                Ok(Stored::Local(e))
            }
        }
        _ => Ok(Stored::Absent),
    }
}

fn remote_failed(t: &Translucent, who: &Identity, e: pando_client::ClientError) -> LdapError {
    tracing::warn!(remote = %t.remote.endpoint.url, error = %e, "translucent: the remote server could not be read");
    LdapError::new(ResultCode::UNAVAILABLE, t.failure_text(who.is_admin(), &e))
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
    who: &Identity,
    dn: &Dn,
    part: Option<&Entry>,
) -> OpResult<Option<Entry>> {
    let schema = &*server.schema;
    let remote = t
        .remote
        .read(schema, &dn.to_string())
        .await
        .map_err(|e| remote_failed(t, who, e))?;
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
    let missing = missing_ancestors(server, t, top)?;
    let schema = &*server.schema;
    for p in &missing {
        if t.remote
            .read(schema, &p.to_string())
            .await
            .map_err(|e| remote_failed(t, who, e))?
            .is_none()
        {
            return Err(LdapError::new(
                ResultCode::NO_SUCH_OBJECT,
                format!("{p} exists neither here nor on the remote server"),
            ));
        }
    }
    for p in missing.into_iter().rev() {
        let ctx = WriteCtx::new(server, &part_writer(who), Requested::default());
        match write::add(ctx, write::request_for(glue_part(&p))).await {
            Ok(_) => {}
            // Made meanwhile by another write: as good.
            Err(e) if e.code == ResultCode::ENTRY_ALREADY_EXISTS => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `top` and its ancestors below the suffix that the store lacks,
/// nearest first.
fn missing_ancestors(server: &Server, t: &Translucent, top: Option<Dn>) -> OpResult<Vec<Dn>> {
    let mut missing = Vec::new();
    let mut at = top;
    while let Some(p) = at {
        let norm = server
            .schema
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
    Ok(missing)
}

/// The part of a remote-only entry that only holds a place: its RDN's
/// values.
fn glue_part(dn: &Dn) -> Entry {
    let mut part = Entry::new(dn.clone());
    part.add_values(
        "objectClass",
        vec![
            b"top".to_vec(),
            b"glue".to_vec(),
            b"extensibleObject".to_vec(),
        ],
    );
    for a in rdn_values(dn) {
        part.add_values(&a.name, a.values);
    }
    part
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

/// Whether `who` has `right` on the entry `dn` (as it is, or as it
/// would be): checked before parts are made for it.
fn require(
    server: &Server,
    who: &Identity,
    dn: &Dn,
    entry: &Entry,
    right: pando_access::acl::Rights,
) -> OpResult<()> {
    let norm = server
        .schema
        .normalize_dn(dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN '{dn}': {e}")))?;
    let rtxn = server.rt.store.read()?;
    pando_ops::require(server, &rtxn.view(), who, &norm, entry, &[(None, right)])
}

/// Refuse a name the remote holds (it would hide the remote's entry).
async fn refuse_remote_name(
    t: &Translucent,
    server: &Server,
    who: &Identity,
    dn: &str,
) -> OpResult<()> {
    let held = t
        .remote
        .read(&server.schema, dn)
        .await
        .map_err(|e| remote_failed(t, who, e))?;
    if held.is_some() {
        return Err(LdapError::new(
            ResultCode::ENTRY_ALREADY_EXISTS,
            format!("{dn} exists on the remote server {}", t.remote.endpoint.url),
        ));
    }
    Ok(())
}

/// An add: refused when the remote holds the name; otherwise a local
/// entry, its remote-only ancestors made as parts first (once the
/// requester may add it).
pub async fn add(ctx: Arc<WriteCtx>, t: &Translucent, req: AddRequest) -> OpResult<Written> {
    let server = ctx.server.clone();
    let dn = pando_ops::parse_dn(&req.dn)?;
    if matches!(stored(&server, &dn)?, Stored::Absent) {
        refuse_remote_name(t, &server, &ctx.who, &req.dn).await?;
        let entry = Entry {
            dn: dn.clone(),
            attrs: req
                .attrs
                .iter()
                .map(|a| pando_model::Attribute {
                    desc: a.name.clone(),
                    values: a.values.clone(),
                })
                .collect(),
        };
        require(&server, &ctx.who, &dn, &entry, pando_access::acl::ADD)?;
        make_parents(&server, t, &ctx.who, &dn).await?;
    }
    write::add(ctx, req).await
}

/// A delete: of local entries only.
pub async fn delete(ctx: Arc<WriteCtx>, t: &Translucent, dn_text: String) -> OpResult<Written> {
    let dn = pando_ops::parse_dn(&dn_text)?;
    match stored(&ctx.server, &dn)? {
        Stored::Local(_) => write::delete(ctx, dn_text).await,
        Stored::Part(_) => Err(held_remotely(t, &dn_text, "deleted")),
        Stored::Absent => match merged(&ctx.server, t, &ctx.who, &dn, None).await? {
            Some(_) => Err(held_remotely(t, &dn_text, "deleted")),
            None => Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object")),
        },
    }
}

/// A rename: of local entries only, not to a name the remote holds (a
/// new parent that exists only remotely is made as a part first, once
/// the requester may move the entry there).
pub async fn modify_dn(
    ctx: Arc<WriteCtx>,
    t: &Translucent,
    req: ModifyDnRequest,
) -> OpResult<Written> {
    let dn = pando_ops::parse_dn(&req.dn)?;
    let current = match stored(&ctx.server, &dn)? {
        Stored::Local(e) => e,
        Stored::Part(_) => return Err(held_remotely(t, &req.dn, "renamed")),
        Stored::Absent => {
            return match merged(&ctx.server, t, &ctx.who, &dn, None).await? {
                Some(_) => Err(held_remotely(t, &req.dn, "renamed")),
                None => Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object")),
            }
        }
    };
    let new_rdn = pando_model::Rdn::parse(&req.new_rdn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid new RDN: {e}")))?;
    let new_parent = match &req.new_superior {
        Some(sup) => Some(pando_ops::parse_dn(sup)?),
        None => dn.parent(),
    };
    let new_dn = new_parent.clone().unwrap_or_else(Dn::root).child(new_rdn);
    let new_norm = ctx
        .server
        .schema
        .normalize_dn(&new_dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid new DN '{new_dn}': {e}")))?;
    if t.covers(&new_norm) {
        refuse_remote_name(t, &ctx.server, &ctx.who, &new_dn.to_string()).await?;
        if req.new_superior.is_some() {
            require(
                &ctx.server,
                &ctx.who,
                &dn,
                &current,
                pando_access::acl::DELETE,
            )?;
            require(
                &ctx.server,
                &ctx.who,
                &new_dn,
                &current,
                pando_access::acl::ADD,
            )?;
            make_parts_from(&ctx.server, t, &ctx.who, new_parent).await?;
        }
    }
    write::modify_dn(ctx, req).await
}

/// A modify: of a local entry as usual; of a remote entry, its local
/// attributes, through the write pipeline as the requester with its
/// controls: the pipeline plans the modify on the entry as the client
/// sees it (the remote's, merged with its part: access, the assertion,
/// No-Op) and stores the part [`RemoteEntry`] keeps of the result, with
/// the parts of remote-only ancestors when the entry has none yet.
/// Pre-read and post-read of a remote entry are refused when critical,
/// else not answered.
pub async fn modify(ctx: Arc<WriteCtx>, t: &Translucent, req: ModifyRequest) -> OpResult<Written> {
    let server = ctx.server.clone();
    let schema = &*server.schema;
    let dn = pando_ops::parse_dn(&req.dn)?;
    let part = match stored(&server, &dn)? {
        Stored::Local(_) => return write::modify(ctx, req).await,
        Stored::Part(_) => true,
        Stored::Absent => false,
    };
    let controls = &ctx.controls;
    if controls.pre_read.as_ref().is_some_and(|r| r.critical)
        || controls.post_read.as_ref().is_some_and(|r| r.critical)
    {
        return Err(LdapError::new(
            ResultCode::UNAVAILABLE_CRITICAL_EXTENSION,
            "pre-read and post-read are not answered for entries of a translucent suffix's remote server",
        ));
    }
    let touched = touched_types(schema, t, &dn, &req)?;
    let Some(remote) = t
        .remote
        .read(schema, &req.dn)
        .await
        .map_err(|e| remote_failed(t, &ctx.who, e))?
    else {
        return Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"));
    };
    // The remote holds the entry, so it holds its ancestors: those the
    // store lacks get parts if the entry gets its first one.
    let ancestors = match part {
        true => Vec::new(),
        false => missing_ancestors(&server, t, dn.parent())?
            .iter()
            .map(glue_part)
            .collect(),
    };
    let entry = RemoteEntry {
        dn,
        remote,
        touched,
        ancestors,
    };
    let ctx = Arc::new(WriteCtx {
        server: server.clone(),
        who: ctx.who.clone(),
        controls: Requested {
            pre_read: None,
            post_read: None,
            ..ctx.controls.clone()
        },
        partial: Some(Arc::new(entry)),
    });
    write::modify(ctx, req).await
}

/// A remote entry being modified: the remote's copy, read before the
/// write, and what of it the store keeps.
struct RemoteEntry {
    dn: Dn,
    remote: Entry,
    /// The attribute types the modify changes.
    touched: Vec<String>,
    /// Parts for the remote-only ancestors, nearest first.
    ancestors: Vec<Entry>,
}

impl pando_ops::seams::Partial for RemoteEntry {
    fn shown(&self, schema: &pando_model::Schema, part: Option<&Entry>) -> Entry {
        match part {
            Some(p) => merge(schema, self.remote.clone(), p),
            None => self.remote.clone(),
        }
    }

    fn kept(
        &self,
        schema: &pando_model::Schema,
        part: Option<&Entry>,
        before: &Entry,
        after: &Entry,
    ) -> Entry {
        let mut kept = part_after(schema, &self.dn, before, after, part, &self.touched);
        // The part's own operational attributes (its UUID, creation
        // stamps) stay: the pipeline stamps what a modify changes.
        for a in part.map(|p| p.attrs.as_slice()).unwrap_or(&[]) {
            let operational = schema
                .attribute(pando_model::desc::base(&a.desc))
                .is_some_and(|at| at.is_operational());
            if operational {
                kept.add_values(&a.desc, a.values.clone());
            }
        }
        kept
    }

    fn ancestors(&self) -> &[Entry] {
        &self.ancestors
    }
}

/// The attribute types a modify of a remote entry changes, as the schema
/// names them; refused when one names the entry (its RDN is the remote's)
/// or is not kept locally (`local_attributes`).
fn touched_types(
    schema: &pando_model::Schema,
    t: &Translucent,
    dn: &Dn,
    req: &ModifyRequest,
) -> OpResult<Vec<String>> {
    let naming: Vec<String> = rdn_values(dn)
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
        if !t.may_keep_locally(&name) {
            return Err(LdapError::unwilling(format!(
                "{name} of {} comes from the remote server {}: only the translucent overlay's local_attributes can be set here",
                req.dn, t.remote.endpoint.url
            )));
        }
        if !touched.iter().any(|n| n.eq_ignore_ascii_case(&name)) {
            touched.push(name);
        }
    }
    Ok(touched)
}

/// The part a modify leaves: the part's classes (and those the client
/// added that the remote lacks), the RDN's values, the attributes of
/// untouched types it held, and every description of the touched types
/// as the modify left the entry (options kept). A type emptied here is
/// left out: the remote's values show again.
fn part_after(
    schema: &pando_model::Schema,
    dn: &Dn,
    before: &Entry,
    after: &Entry,
    old: Option<&Entry>,
    touched: &[String],
) -> Entry {
    let type_of = |desc: &str| super::super::canonical(schema, pando_model::desc::base(desc));
    let is_touched = |desc: &str| {
        touched
            .iter()
            .any(|n| n.eq_ignore_ascii_case(&type_of(desc)))
    };
    let mut part = Entry::new(dn.clone());
    let same = |a: &[u8], b: &[u8]| a.eq_ignore_ascii_case(b);
    let old_shown: Vec<Vec<u8>> = old
        .map(|o| o.values("objectClass"))
        .unwrap_or(&[])
        .iter()
        .filter(|v| !is_part_class(v))
        .cloned()
        .collect();
    // The classes the part adds: those the modify left that the remote
    // lacks (a remote class cannot be taken away here).
    let shown: Vec<Vec<u8>> = if touched
        .iter()
        .any(|n| n.eq_ignore_ascii_case("objectClass"))
    {
        let remote: Vec<&Vec<u8>> = before
            .values("objectClass")
            .iter()
            .filter(|v| !old_shown.iter().any(|o| same(o, v)))
            .collect();
        after
            .values("objectClass")
            .iter()
            .filter(|v| !is_part_class(v) && !remote.iter().any(|r| same(r, v)))
            .cloned()
            .collect()
    } else {
        old_shown
    };
    let mut classes = vec![
        b"top".to_vec(),
        b"glue".to_vec(),
        b"extensibleObject".to_vec(),
    ];
    classes.extend(shown);
    part.add_values("objectClass", classes);
    for a in rdn_values(dn) {
        part.add_values(&a.name, a.values);
    }
    let naming: Vec<String> = part
        .attrs
        .iter()
        .skip(1)
        .map(|a| type_of(&a.desc))
        .collect();
    let keep = |desc: &str| {
        let ty = type_of(desc);
        !ty.eq_ignore_ascii_case("objectClass")
            && !naming.iter().any(|n| n.eq_ignore_ascii_case(&ty))
    };
    // Untouched types the part held (user attributes only: its own
    // operational ones are the store's).
    for a in old.map(|o| o.attrs.as_slice()).unwrap_or(&[]) {
        let user = schema
            .attribute(&type_of(&a.desc))
            .is_some_and(|at| !at.is_operational());
        if user && keep(&a.desc) && !is_touched(&a.desc) {
            part.add_values(&a.desc, a.values.clone());
        }
    }
    for a in &after.attrs {
        if keep(&a.desc) && is_touched(&a.desc) {
            part.add_values(&a.desc, a.values.clone());
        }
    }
    part
}

/// A compare: on the entry as clients see it.
pub async fn compare(
    server: &Arc<Server>,
    t: &Translucent,
    who: &Identity,
    controls: &Requested,
    req: &CompareRequest,
) -> OpResult<ResultCode> {
    let dn = pando_ops::parse_dn(&req.dn)?;
    let part = match stored(server, &dn)? {
        Stored::Local(_) => {
            let (server, who, controls, req) =
                (server.clone(), who.clone(), controls.clone(), req.clone());
            return tokio::task::spawn_blocking(move || {
                pando_ops::compare::compare(&server, &who, &controls, &req)
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
    let Some(entry) = merged(server, t, who, &dn, part.as_ref()).await? else {
        return Err(LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object"));
    };
    let norm = server
        .schema
        .normalize_dn(&dn)
        .map_err(LdapError::invalid_dn)?;
    let rtxn = server.rt.store.read()?;
    pando_ops::compare::compare_entry(server, &rtxn.view(), who, controls, &norm, &entry, req)
}
