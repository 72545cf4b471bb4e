//! Modifications applied to an entry (RFC 4511 4.6, RFC 4525 increment,
//! permissive modify), and the rules a changed entry must keep.

use pando_model::{AttributeType, Entry, Schema};
use pando_proto::{Change, ModOp, ResultCode};

use crate::error::{LdapError, OpResult};

/// Apply RFC 4511 modifications to `entry` in order; all-or-nothing is
/// guaranteed by the caller's transaction.
///
/// `permissive` (the permissive modify control): adding a value already
/// present, or deleting one (or an attribute) that is absent, is skipped
/// instead of failing the operation.
pub fn apply_changes(
    schema: &Schema,
    entry: &mut Entry,
    changes: &[Change],
    permissive: bool,
) -> OpResult<()> {
    for ch in changes {
        let (desc, at) = schema.canonical_desc(&ch.attr.name)?;
        let one = One {
            schema,
            at,
            name: at.name().to_string(),
            desc: &desc,
            values: &ch.attr.values,
            norm_values: normalized_values(schema, at, ch)?,
            permissive,
        };
        match ch.op {
            ModOp::Add => one.add(entry)?,
            ModOp::Delete => one.delete(entry)?,
            ModOp::Replace => one.replace(entry)?,
            ModOp::Increment => one.increment(entry)?,
        }
    }
    Ok(())
}

/// The values of one change, each checked against the attribute's syntax
/// (but those a delete compares with an equality rule: they need only
/// match) and normalised.
fn normalized_values(schema: &Schema, at: &AttributeType, ch: &Change) -> OpResult<Vec<Vec<u8>>> {
    let mut norm_values = Vec::with_capacity(ch.attr.values.len());
    for v in &ch.attr.values {
        if ch.op != ModOp::Delete || at.equality.is_none() {
            schema.validate(at, v).map_err(|e| {
                LdapError::new(
                    ResultCode::INVALID_ATTRIBUTE_SYNTAX,
                    format!(
                        "{}: value #{} invalid per syntax: {e}",
                        at.name(),
                        norm_values.len()
                    ),
                )
            })?;
        }
        norm_values.push(schema.normalize(at, v).unwrap_or_else(|_| v.clone()));
    }
    Ok(norm_values)
}

/// One change of one attribute, its values normalised.
struct One<'a> {
    schema: &'a Schema,
    at: &'a AttributeType,
    /// The attribute's name as the schema spells it (for messages).
    name: String,
    /// The attribute description the entry holds it under.
    desc: &'a str,
    values: &'a [Vec<u8>],
    norm_values: Vec<Vec<u8>>,
    /// The permissive modify control: adding a value present or deleting
    /// one absent is not an error.
    permissive: bool,
}

impl One<'_> {
    fn normalize(&self, v: &[u8]) -> Vec<u8> {
        self.schema
            .normalize(self.at, v)
            .unwrap_or_else(|_| v.to_vec())
    }

    fn add(&self, entry: &mut Entry) -> OpResult<()> {
        let name = &self.name;
        if self.values.is_empty() {
            return Err(LdapError::protocol(format!(
                "{name}: modify/add with no values"
            )));
        }
        let existing: Vec<Vec<u8>> = entry
            .get(self.desc)
            .map(|a| a.values.iter().map(|v| self.normalize(v)).collect())
            .unwrap_or_default();
        let mut fresh = Vec::with_capacity(self.values.len());
        for (i, n) in self.norm_values.iter().enumerate() {
            if existing.contains(n) || self.norm_values[..i].contains(n) {
                if self.permissive {
                    continue;
                }
                return Err(LdapError::new(
                    ResultCode::ATTRIBUTE_OR_VALUE_EXISTS,
                    format!("modify/add: {name}: value #{i} already exists"),
                ));
            }
            fresh.push(self.values[i].clone());
        }
        if !fresh.is_empty() {
            entry.add_values(self.desc, fresh);
        }
        Ok(())
    }

    fn delete(&self, entry: &mut Entry) -> OpResult<()> {
        let name = &self.name;
        let Some(attr) = entry.get_mut(self.desc) else {
            if self.permissive {
                return Ok(());
            }
            return Err(LdapError::new(
                ResultCode::NO_SUCH_ATTRIBUTE,
                format!("modify/delete: {name}: no such attribute"),
            ));
        };
        if self.values.is_empty() {
            entry.remove(self.desc);
            return Ok(());
        }
        for (i, n) in self.norm_values.iter().enumerate() {
            match attr.values.iter().position(|v| self.normalize(v) == *n) {
                Some(p) => {
                    attr.values.remove(p);
                }
                None if self.permissive => {}
                None => {
                    return Err(LdapError::new(
                        ResultCode::NO_SUCH_ATTRIBUTE,
                        format!("modify/delete: {name}: value #{i} not present"),
                    ))
                }
            }
        }
        if attr.values.is_empty() {
            entry.remove(self.desc);
        }
        Ok(())
    }

    fn replace(&self, entry: &mut Entry) -> OpResult<()> {
        entry.remove(self.desc);
        if self.values.is_empty() {
            return Ok(());
        }
        for (i, n) in self.norm_values.iter().enumerate() {
            if self.norm_values[..i].contains(n) {
                return Err(LdapError::new(
                    ResultCode::ATTRIBUTE_OR_VALUE_EXISTS,
                    format!("modify/replace: {}: value #{i} given twice", self.name),
                ));
            }
        }
        entry.add_values(self.desc, self.values.to_vec());
        Ok(())
    }

    fn increment(&self, entry: &mut Entry) -> OpResult<()> {
        let name = &self.name;
        let [delta] = self.values else {
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
        let Some(attr) = entry.get_mut(self.desc) else {
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
        Ok(())
    }
}

/// Whether `entry` holds `value` in attribute `at` (any options), compared
/// with the attribute's equality rule.
pub(super) fn has_value(
    schema: &Schema,
    entry: &Entry,
    at: &pando_model::AttributeType,
    value: &[u8],
) -> bool {
    let norm = |v: &[u8]| schema.normalize(at, v).unwrap_or_else(|_| v.to_vec());
    let want = norm(value);
    entry.attrs.iter().any(|a| {
        schema
            .attribute(pando_model::desc::base(&a.desc))
            .is_some_and(|t| std::ptr::eq(t, at))
            && a.values.iter().any(|v| norm(v) == want)
    })
}

/// `new` checked against the schema, its structural object class the one
/// `old` records (RFC 4512 2.4.2): removing inetOrgPerson from a person
/// leaves organizationalPerson, a different class.
pub fn check_schema_keeping(schema: &Schema, new: &mut Entry, old: Option<&Entry>) -> OpResult<()> {
    let stored = old
        .and_then(|e| e.get("structuralObjectClass"))
        .and_then(|a| a.values.first())
        .map(|v| String::from_utf8_lossy(v).into_owned());
    schema.check_entry_keeping(new, stored.as_deref(), old)?;
    Ok(())
}

/// The structural object class may not change, and RDN values must stay.
pub fn check_invariants(schema: &Schema, old: &Entry, new: &Entry) -> OpResult<()> {
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
