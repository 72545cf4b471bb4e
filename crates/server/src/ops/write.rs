//! Add, delete, modify and modify DN (RFC 4511 4.6–4.9, RFC 4525).
//!
//! Each runs as one job on the store's writer thread: the checks that depend
//! on stored state (existence, schema, values present) run inside the same
//! transaction that applies the change, so a failing operation changes
//! nothing. Slow work (password hashing) happens before the job is queued.

use std::sync::Arc;

use pando_model::{Attribute, Dn, Entry, Schema};
use pando_proto::{AddRequest, Change, ModOp, ModifyDnRequest, ModifyRequest, ResultCode};
use pando_store::{Lookup, Placement, WriteTxn};

use super::{is_password, names_password};
use crate::acl;
use crate::backup::META_CONTEXT_CSN;
use crate::error::{LdapError, OpResult};
use crate::password;
use crate::state::{Identity, Server};

/// Attributes the server maintains; clients may not set them.
const MAINTAINED: &[&str] = &[
    "createTimestamp",
    "modifyTimestamp",
    "creatorsName",
    "modifiersName",
    "entryUUID",
    "entryCSN",
    "structuralObjectClass",
    "entryDN",
    "subschemaSubentry",
    "hasSubordinates",
    "numSubordinates",
];

fn base_of(desc: &str) -> &str {
    desc.split(';').next().unwrap_or(desc)
}

/// Refuse an add or modify carrying more than `limits.max_values_per_operation`
/// values, unless from an administrator; checked before any schema, access
/// or store work.
fn check_value_count(
    server: &Server,
    who: &Identity,
    counts: impl Iterator<Item = usize>,
) -> OpResult<()> {
    let max = server.cfg.config.limits.max_values_per_operation;
    if max == 0 || who.is_admin() {
        return Ok(());
    }
    let n: usize = counts.sum();
    if n > max {
        return Err(LdapError::new(
            ResultCode::ADMIN_LIMIT_EXCEEDED,
            format!("{n} attribute values in one operation; at most {max} are accepted"),
        ));
    }
    Ok(())
}

/// Check userPassword values a client sends and count the clear-text ones
/// (`clear`: counted so far in the operation). Each clear-text value costs
/// a slow hash, so an operation may carry at most
/// `passwords.max_clear_values`; a value hashed with a key-stretching
/// scheme is taken as given only from administrators, because each bind
/// against it costs what its parameters say (up to a minute and a gigabyte
/// for argon2's accepted maximum), which a user could set to tie up the
/// hashing queue. Checked before anything is hashed or looked up.
fn check_password_values(
    server: &Server,
    who: &Identity,
    clear: usize,
    values: &[Vec<u8>],
) -> OpResult<usize> {
    let clear = clear + values.iter().filter(|v| !password::is_hashed(v)).count();
    let max = server.cfg.config.passwords.max_clear_values;
    if clear > max {
        return Err(LdapError::new(
            ResultCode::CONSTRAINT_VIOLATION,
            format!("userPassword: at most {max} clear-text values per operation"),
        ));
    }
    let costly = |v: &Vec<u8>| password::is_hashed(v) && !password::is_cheap_to_verify(v);
    if !who.is_admin() && values.iter().any(costly) {
        return Err(LdapError::new(
            ResultCode::CONSTRAINT_VIOLATION,
            "userPassword: only administrators may store values hashed with a \
             key-stretching scheme; send the password in clear and the server hashes it",
        ));
    }
    Ok(clear)
}

pub fn random_uuid() -> String {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40; // version 4
    b[8] = (b[8] & 0x3f) | 0x80; // RFC 4122 variant
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

fn set_attr(entry: &mut Entry, desc: &str, value: String) {
    entry.remove(desc);
    entry.attrs.push(Attribute {
        desc: desc.to_string(),
        values: vec![value.into_bytes()],
    });
}

/// Stamp modifyTimestamp, modifiersName and entryCSN.
/// Stamp modifyTimestamp, modifiersName and entryCSN, and record the CSN as
/// the store's newest change (the replication state a backup carries).
fn stamp_modified(
    server: &Server,
    w: &mut WriteTxn<'_>,
    who: &Identity,
    entry: &mut Entry,
) -> OpResult<()> {
    let now = crate::clock::generalized_time(crate::clock::now_micros());
    let csn = server.csn.next();
    w.meta_put(META_CONTEXT_CSN, csn.as_bytes())?;
    set_attr(entry, "modifyTimestamp", now);
    set_attr(entry, "modifiersName", who.dn().to_string());
    set_attr(entry, "entryCSN", csn);
    Ok(())
}

fn reject_maintained(schema: &Schema, desc: &str) -> OpResult<()> {
    let Some(at) = schema.attribute(base_of(desc)) else {
        return Ok(());
    };
    if at.no_user_modification || MAINTAINED.iter().any(|m| at.has_name(m)) {
        return Err(LdapError::new(
            ResultCode::CONSTRAINT_VIOLATION,
            format!("{}: no user modification allowed", at.name()),
        ));
    }
    Ok(())
}

/// Where a new entry with DN `dn` goes: its parent must exist (or the DN is
/// a configured suffix) and the DN must be free.
fn placement_for(server: &Server, w: &WriteTxn<'_>, dn: &Dn) -> OpResult<Placement> {
    let view = w.view();
    let rdns = super::norm_rdns(&view, dn)?;
    let norm_dn = rdns.join(",");
    if server.suffix_of(&norm_dn).is_none() {
        return Err(LdapError::unwilling(format!(
            "no global superior knowledge: '{dn}' is outside every suffix"
        )));
    }
    if let Lookup::Found(_) = view.lookup_norm(&rdns)? {
        return Err(LdapError::new(
            ResultCode::ENTRY_ALREADY_EXISTS,
            "entry already exists",
        ));
    }
    if server.is_suffix(&norm_dn) {
        return Ok(Placement {
            parent: 0,
            rdn: dn.to_string(),
            norm_rdn: norm_dn,
        });
    }
    // The parent itself must exist; otherwise matchedDN names the deepest
    // existing ancestor.
    let rdn = dn.rdn().map(|r| r.to_string()).unwrap_or_default();
    match view.lookup_norm(&rdns[1..])? {
        Lookup::Found(parent) => Ok(Placement {
            parent,
            rdn,
            norm_rdn: rdns[0].clone(),
        }),
        Lookup::Missing { matched } => Err(super::no_such_object(&view, matched)?),
    }
}

pub async fn add(server: &Arc<Server>, who: &Identity, req: AddRequest) -> OpResult<()> {
    let schema = &server.schema;
    let dn = super::parse_dn(&req.dn)?;
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
        reject_maintained(schema, &a.name)?;
        if names_password(schema, &a.name) {
            clear = check_password_values(server, who, clear, &a.values)?;
        }
        entry.add_values(&a.name, a.values);
    }
    if clear > 0 {
        // Access is settled before any hashing, so a refused client costs
        // one lookup, not a hash per value. The writer checks again.
        {
            let rtxn = server.store.read()?;
            let view = rtxn.view();
            super::require(server, &view, who, &norm, &entry, &[(None, acl::ADD)])?;
        }
        for a in entry
            .attrs
            .iter_mut()
            .filter(|a| names_password(schema, &a.desc))
        {
            a.values = server
                .passwords
                .hash_all(std::mem::take(&mut a.values))
                .await?;
        }
    }
    let server2 = server.clone();
    let who2 = who.clone();
    // The audit record holds the user attributes as stored (hashed passwords).
    let audited = crate::observe::auditing(server).then(|| entry.attrs.clone());
    server
        .store
        .write(move |w: &mut WriteTxn<'_>| -> OpResult<()> {
            let server = &*server2;
            let who = &who2;
            super::require(server, &w.view(), who, &norm, &entry, &[(None, acl::ADD)])?;
            let place = placement_for(server, w, &dn)?;
            let structural = server.schema.check_entry(&mut entry)?;
            let now = crate::clock::generalized_time(crate::clock::now_micros());
            set_attr(&mut entry, "structuralObjectClass", structural);
            set_attr(&mut entry, "entryUUID", random_uuid());
            set_attr(&mut entry, "creatorsName", who.dn().to_string());
            set_attr(&mut entry, "createTimestamp", now);
            stamp_modified(server, w, who, &mut entry)?;
            w.add(&place, &entry.attrs)?;
            Ok(())
        })
        .await?;
    if let Some(attrs) = audited {
        crate::observe::audit(
            server,
            who,
            crate::observe::audit::Record::Add {
                dn: &req.dn,
                attrs: &attrs,
            },
        );
    }
    Ok(())
}

pub async fn delete(server: &Arc<Server>, who: &Identity, dn_text: String) -> OpResult<()> {
    let dn = super::parse_dn(&dn_text)?;
    let norm = server
        .schema
        .normalize_dn(&dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN: {e}")))?;
    let server2 = server.clone();
    let who2 = who.clone();
    let dn2 = dn.clone();
    server
        .store
        .write(move |w: &mut WriteTxn<'_>| -> OpResult<()> {
            let server = &*server2;
            let who = &who2;
            let dn = &dn2;
            let view = w.view();
            let id = super::resolve_for(server, &view, who, dn)?;
            let entry = super::stored_entry(&view, id)?;
            super::require(server, &view, who, &norm, &entry, &[(None, acl::DELETE)])?;
            if view.has_children(id)? {
                return Err(LdapError::new(
                    ResultCode::NOT_ALLOWED_ON_NON_LEAF,
                    "subordinate objects must be deleted first",
                ));
            }
            w.delete(id, &entry.attrs)?;
            w.meta_put(META_CONTEXT_CSN, server.csn.next().as_bytes())?;
            Ok(())
        })
        .await?;
    crate::observe::audit(
        server,
        who,
        crate::observe::audit::Record::Delete {
            dn: &dn.to_string(),
        },
    );
    Ok(())
}

/// Apply RFC 4511 modifications to `entry` in order; all-or-nothing is
/// guaranteed by the caller's transaction.
pub fn apply_changes(schema: &Schema, entry: &mut Entry, changes: &[Change]) -> OpResult<()> {
    for ch in changes {
        let (desc, at) = schema.canonical_desc(&ch.attr.name)?;
        let name = at.name().to_string();
        let mut norm_values = Vec::with_capacity(ch.attr.values.len());
        for v in &ch.attr.values {
            if ch.op != ModOp::Delete || at.equality.is_none() {
                schema.validate(at, v).map_err(|e| {
                    LdapError::new(
                        ResultCode::INVALID_ATTRIBUTE_SYNTAX,
                        format!(
                            "{name}: value #{} invalid per syntax: {e}",
                            norm_values.len()
                        ),
                    )
                })?;
            }
            norm_values.push(schema.normalize(at, v).unwrap_or_else(|_| v.clone()));
        }
        match ch.op {
            ModOp::Add => {
                if ch.attr.values.is_empty() {
                    return Err(LdapError::protocol(format!(
                        "{name}: modify/add with no values"
                    )));
                }
                let existing: Vec<Vec<u8>> = entry
                    .get(&desc)
                    .map(|a| {
                        a.values
                            .iter()
                            .map(|v| schema.normalize(at, v).unwrap_or_else(|_| v.clone()))
                            .collect()
                    })
                    .unwrap_or_default();
                for (i, n) in norm_values.iter().enumerate() {
                    if existing.contains(n) || norm_values[..i].contains(n) {
                        return Err(LdapError::new(
                            ResultCode::ATTRIBUTE_OR_VALUE_EXISTS,
                            format!("modify/add: {name}: value #{i} already exists"),
                        ));
                    }
                }
                entry.add_values(&desc, ch.attr.values.clone());
            }
            ModOp::Delete => {
                let Some(attr) = entry.get_mut(&desc) else {
                    return Err(LdapError::new(
                        ResultCode::NO_SUCH_ATTRIBUTE,
                        format!("modify/delete: {name}: no such attribute"),
                    ));
                };
                if ch.attr.values.is_empty() {
                    entry.remove(&desc);
                    continue;
                }
                for (i, n) in norm_values.iter().enumerate() {
                    let pos = attr
                        .values
                        .iter()
                        .position(|v| schema.normalize(at, v).unwrap_or_else(|_| v.clone()) == *n);
                    match pos {
                        Some(p) => {
                            attr.values.remove(p);
                        }
                        None => {
                            return Err(LdapError::new(
                                ResultCode::NO_SUCH_ATTRIBUTE,
                                format!("modify/delete: {name}: value #{i} not present"),
                            ))
                        }
                    }
                }
                if attr.values.is_empty() {
                    entry.remove(&desc);
                }
            }
            ModOp::Replace => {
                entry.remove(&desc);
                if !ch.attr.values.is_empty() {
                    for (i, n) in norm_values.iter().enumerate() {
                        if norm_values[..i].contains(n) {
                            return Err(LdapError::new(
                                ResultCode::ATTRIBUTE_OR_VALUE_EXISTS,
                                format!("modify/replace: {name}: value #{i} given twice"),
                            ));
                        }
                    }
                    entry.add_values(&desc, ch.attr.values.clone());
                }
            }
            ModOp::Increment => {
                let [delta] = ch.attr.values.as_slice() else {
                    return Err(LdapError::protocol(format!(
                        "modify/increment: {name}: exactly one value needed"
                    )));
                };
                let delta: i128 = std::str::from_utf8(delta)
                    .ok()
                    .and_then(|s| s.parse().ok())
                    .ok_or_else(|| {
                        LdapError::new(
                            ResultCode::INVALID_ATTRIBUTE_SYNTAX,
                            format!("modify/increment: {name}: value is not an integer"),
                        )
                    })?;
                let Some(attr) = entry.get_mut(&desc) else {
                    return Err(LdapError::new(
                        ResultCode::NO_SUCH_ATTRIBUTE,
                        format!("modify/increment: {name}: no such attribute"),
                    ));
                };
                for v in attr.values.iter_mut() {
                    let cur: i128 = std::str::from_utf8(v)
                        .ok()
                        .and_then(|s| s.parse().ok())
                        .ok_or_else(|| {
                            LdapError::new(
                                ResultCode::CONSTRAINT_VIOLATION,
                                format!("modify/increment: {name}: stored value is not an integer"),
                            )
                        })?;
                    let next = cur.checked_add(delta).ok_or_else(|| {
                        LdapError::new(
                            ResultCode::CONSTRAINT_VIOLATION,
                            format!("modify/increment: {name}: overflow"),
                        )
                    })?;
                    *v = next.to_string().into_bytes();
                }
            }
        }
    }
    Ok(())
}

/// Whether `entry` holds `value` in attribute `at` (any options), compared
/// with the attribute's equality rule.
fn has_value(
    schema: &Schema,
    entry: &Entry,
    at: &pando_model::AttributeType,
    value: &[u8],
) -> bool {
    let norm = |v: &[u8]| schema.normalize(at, v).unwrap_or_else(|_| v.to_vec());
    let want = norm(value);
    entry.attrs.iter().any(|a| {
        schema
            .attribute(base_of(&a.desc))
            .is_some_and(|t| std::ptr::eq(t, at))
            && a.values.iter().any(|v| norm(v) == want)
    })
}

/// The structural object class may not change, and RDN values must stay.
pub(super) fn check_invariants(schema: &Schema, old: &Entry, new: &Entry) -> OpResult<()> {
    let soc = |e: &Entry| {
        e.get("structuralObjectClass")
            .and_then(|a| a.values.first().cloned())
    };
    if let (Some(before), Some(after)) = (soc(old), soc(new)) {
        if before != after {
            return Err(LdapError::new(
                ResultCode::OBJECT_CLASS_MODS_PROHIBITED,
                "structural object class modification not allowed",
            ));
        }
    }
    if let Some(rdn) = new.dn.rdn() {
        for ava in &rdn.avas {
            let Some(at) = schema.attribute(&ava.attr) else {
                continue;
            };
            if !has_value(schema, new, at, &ava.value) {
                return Err(LdapError::new(
                    ResultCode::NOT_ALLOWED_ON_RDN,
                    format!("{}: cannot remove the naming value", at.name()),
                ));
            }
        }
    }
    Ok(())
}

pub async fn modify(server: &Arc<Server>, who: &Identity, mut req: ModifyRequest) -> OpResult<()> {
    let schema = &server.schema;
    let dn = super::parse_dn(&req.dn)?;
    let norm = schema
        .normalize_dn(&dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN: {e}")))?;
    check_value_count(server, who, req.changes.iter().map(|c| c.attr.values.len()))?;
    let mut clear = 0;
    for ch in &req.changes {
        reject_maintained(schema, &ch.attr.name)?;
        // Each clear-text value costs a slow hash: users changing their
        // own password get one value, not thousands.
        let password = names_password(schema, &ch.attr.name);
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
    if clear > 0 {
        // Access and the modification's validity are settled on a snapshot
        // before any hashing (worked out again below, on the hashed values).
        prepare(server, who, &dn, &norm, &req.changes)?;
        for ch in &mut req.changes {
            if names_password(schema, &ch.attr.name) && matches!(ch.op, ModOp::Add | ModOp::Replace)
            {
                ch.attr.values = server
                    .passwords
                    .hash_all(std::mem::take(&mut ch.attr.values))
                    .await?;
            }
        }
    }
    // The modification is worked out on a snapshot, outside the writer:
    // read the entry, apply the changes, check the schema. The writer then
    // only confirms that the stored entry is still the one read and writes
    // it, so the single writer's time per modify is short and preparation
    // overlaps the previous batch's fsync. If the entry changed in between,
    // the whole thing is redone on fresh data (serialising it after that
    // change), a bounded number of times.
    let changes = req.changes;
    for _ in 0..64 {
        let Prepared {
            id,
            old_bytes,
            old_attrs,
            mut new,
        } = prepare(server, who, &dn, &norm, &changes)?;
        let server2 = server.clone();
        let who2 = who.clone();
        // userPassword is audited as the values stored after the change.
        let passwords: Option<Vec<Vec<u8>>> = (crate::observe::auditing(server)
            && changes.iter().any(|c| names_password(schema, &c.attr.name)))
        .then(|| {
            new.attrs
                .iter()
                .filter(|a| is_password(&a.desc))
                .flat_map(|a| a.values.iter().cloned())
                .collect()
        });
        let written = server
            .store
            .write(move |w: &mut WriteTxn<'_>| -> OpResult<bool> {
                if w.view().entry_bytes(id)? != Some(old_bytes.as_slice()) {
                    return Ok(false);
                }
                stamp_modified(&server2, w, &who2, &mut new)?;
                w.replace(id, &old_attrs, &new.attrs)?;
                Ok(true)
            })
            .await?;
        if written {
            crate::observe::audit(
                server,
                who,
                crate::observe::audit::Record::Modify {
                    dn: &req.dn,
                    changes: &changes,
                    passwords: passwords.as_deref(),
                },
            );
            return Ok(());
        }
    }
    Err(LdapError::new(
        ResultCode::BUSY,
        "the entry kept changing under this modification; try again",
    ))
}

/// A modification worked out on a read snapshot: the entry as read (its
/// stored bytes and attributes) and as it will be.
struct Prepared {
    id: pando_store::EntryId,
    old_bytes: Vec<u8>,
    old_attrs: Vec<Attribute>,
    new: Entry,
}

/// Read the entry, check write access to every changed attribute, apply
/// the changes and check the schema, on a snapshot.
fn prepare(
    server: &Server,
    who: &Identity,
    dn: &Dn,
    norm: &str,
    changes: &[Change],
) -> OpResult<Prepared> {
    let schema = &server.schema;
    let rtxn = server.store.read()?;
    let view = rtxn.view();
    let id = super::resolve_for(server, &view, who, dn)?;
    let old_bytes = view
        .entry_bytes(id)?
        .map(<[u8]>::to_vec)
        .unwrap_or_default();
    let old_attrs = view.decode_attrs(id, &old_bytes)?;
    let old = Entry {
        dn: dn.clone(),
        attrs: old_attrs,
    };
    let mut checks = Vec::with_capacity(changes.len());
    for ch in changes {
        let (_, at) = schema.canonical_desc(&ch.attr.name)?;
        checks.push((Some(at), acl::WRITE));
    }
    super::require(server, &view, who, norm, &old, &checks)?;
    let mut new = old.clone();
    apply_changes(schema, &mut new, changes)?;
    // Schema checks apply to user attributes; maintained ones ride along.
    schema.check_entry(&mut new)?;
    check_invariants(schema, &old, &new)?;
    Ok(Prepared {
        id,
        old_bytes,
        old_attrs: old.attrs,
        new,
    })
}

pub async fn modify_dn(server: &Arc<Server>, who: &Identity, req: ModifyDnRequest) -> OpResult<()> {
    let schema = &server.schema;
    let dn = super::parse_dn(&req.dn)?;
    let norm = schema
        .normalize_dn(&dn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid DN: {e}")))?;
    let new_rdn = pando_model::Rdn::parse(&req.new_rdn)
        .map_err(|e| LdapError::invalid_dn(format!("invalid new RDN '{}': {e}", req.new_rdn)))?;
    let new_superior = match &req.new_superior {
        Some(s) => Some(super::parse_dn(s)?),
        None => None,
    };
    if server.is_suffix(&norm) {
        return Err(LdapError::unwilling("cannot rename a suffix entry"));
    }
    let server2 = server.clone();
    let who2 = who.clone();
    let delete_old = req.delete_old_rdn;
    server
        .store
        .write(move |w: &mut WriteTxn<'_>| -> OpResult<()> {
            let who = &who2;
            let server = &*server2;
            let schema = &*server.schema;
            let view = w.view();
            let id = super::resolve_for(server, &view, who, &dn)?;
            let parent_dn = match new_superior {
                Some(d) => d,
                None => dn.parent().unwrap_or(Dn { rdns: Vec::new() }),
            };
            let parent_id = match view.lookup(&parent_dn)? {
                Ok(Lookup::Found(p)) => p,
                Ok(Lookup::Missing { matched }) => {
                    return Err(super::no_such_object(&view, matched)?)
                }
                Err(e) => {
                    return Err(LdapError::invalid_dn(format!(
                        "invalid new superior '{parent_dn}': {e}"
                    )))
                }
            };
            if view.is_within(parent_id, id)? {
                return Err(LdapError::unwilling("cannot move an entry below itself"));
            }
            let new_dn = parent_dn.child(new_rdn.clone());
            let new_norm_rdn = schema
                .normalize_rdn(&new_rdn)
                .map_err(|e| LdapError::invalid_dn(format!("invalid new RDN: {e}")))?;
            let new_rdns = super::norm_rdns(&view, &new_dn)?;
            let current = super::stored_entry(&view, id)?;
            // Moving is deleting here and adding there.
            super::require(server, &view, who, &norm, &current, &[(None, acl::DELETE)])?;
            super::require(
                server,
                &view,
                who,
                &new_rdns.join(","),
                &current,
                &[(None, acl::ADD)],
            )?;
            match view.lookup_norm(&new_rdns)? {
                Lookup::Found(other) if other != id => {
                    return Err(LdapError::new(
                        ResultCode::ENTRY_ALREADY_EXISTS,
                        "an entry with the new DN already exists",
                    ))
                }
                _ => {}
            }
            let old_attrs = current.attrs;
            let old = Entry {
                dn: dn.clone(),
                attrs: old_attrs.clone(),
            };
            let mut new = Entry {
                dn: new_dn.clone(),
                attrs: old_attrs.clone(),
            };
            // Old RDN values go first (when asked), then new RDN values come in.
            if delete_old {
                if let Some(old_rdn) = dn.rdn() {
                    for ava in &old_rdn.avas {
                        let Some(at) = schema.attribute(&ava.attr) else {
                            continue;
                        };
                        let want = schema
                            .normalize(at, &ava.value)
                            .unwrap_or_else(|_| ava.value.clone());
                        if at.no_user_modification {
                            continue;
                        }
                        for a in new.attrs.iter_mut().filter(|a| {
                            schema
                                .attribute(base_of(&a.desc))
                                .is_some_and(|t| std::ptr::eq(t, at))
                        }) {
                            a.values.retain(|v| {
                                schema.normalize(at, v).unwrap_or_else(|_| v.clone()) != want
                            });
                        }
                        new.attrs.retain(|a| !a.values.is_empty());
                    }
                }
            }
            for ava in &new_rdn.avas {
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
            stamp_modified(server, w, who, &mut new)?;
            w.rename(
                id,
                &Placement {
                    parent: parent_id,
                    rdn: new_rdn.to_string(),
                    norm_rdn: new_norm_rdn,
                },
            )?;
            w.replace(id, &old_attrs, &new.attrs)?;
            Ok(())
        })
        .await?;
    crate::observe::audit(
        server,
        who,
        crate::observe::audit::Record::ModDn {
            dn: &req.dn,
            new_rdn: &req.new_rdn,
            delete_old_rdn: req.delete_old_rdn,
            new_superior: req.new_superior.as_deref(),
        },
    );
    Ok(())
}
