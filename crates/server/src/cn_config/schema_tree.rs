//! Schema changed while serving: `cn=schema,cn=config` and one entry below
//! it per `[[schema]]` document, `cn={n}<name>,cn=schema,cn=config`, whose
//! values are definitions in RFC 4512 form: the shape of the `cn=schema`
//! LDIF files OpenLDAP ships, so `ldapadd -f /etc/ldap/schema/x.ldif`
//! works as it does against slapd.

use pando_model::{Dn, Entry, Schema};
use pando_proto::{Change, PartialAttribute, ResultCode};

use super::{change_values, split_ordinal};
use crate::error::LdapError;
use pando_config::{Config, SchemaDoc};

pub const SCHEMA_DN: &str = "cn=schema,cn=config";
pub const SCHEMA_NORM: &str = "cn=schema,cn=config";

/// The attributes of a document entry, in the order they are applied.
pub const ATTRS: [(&str, &str); 4] = [
    ("olcObjectIdentifier", "OID macros: name oid"),
    ("olcLdapSyntaxes", "syntax descriptions"),
    ("olcAttributeTypes", "attribute type descriptions"),
    ("olcObjectClasses", "object class descriptions"),
];

fn lists(doc: &SchemaDoc) -> [&Vec<String>; 4] {
    [
        &doc.object_identifiers,
        &doc.ldap_syntaxes,
        &doc.attribute_types,
        &doc.object_classes,
    ]
}

fn lists_mut(doc: &mut SchemaDoc) -> [&mut Vec<String>; 4] {
    [
        &mut doc.object_identifiers,
        &mut doc.ldap_syntaxes,
        &mut doc.attribute_types,
        &mut doc.object_classes,
    ]
}

fn attr_index(name: &str) -> Option<usize> {
    // Without the `olc` prefix too, as schema LDIF files may write them.
    ATTRS
        .iter()
        .position(|(a, _)| a.eq_ignore_ascii_case(name) || a[3..].eq_ignore_ascii_case(name))
}

/// The container and one entry per document.
pub fn entries(docs: &[SchemaDoc]) -> Vec<(String, Entry)> {
    let mut out = Vec::new();
    let mut top = Entry::new(Dn::parse(SCHEMA_DN).unwrap_or(Dn { rdns: Vec::new() }));
    top.add_values(
        "objectClass",
        vec![b"top".to_vec(), b"olcSchemaConfig".to_vec()],
    );
    top.add_values("cn", vec![b"schema".to_vec()]);
    out.push((SCHEMA_DN.to_string(), top));
    for (i, doc) in docs.iter().enumerate() {
        let dn = format!("cn={{{i}}}{},{SCHEMA_DN}", doc.name);
        let Ok(parsed) = Dn::parse(&dn) else { continue };
        let mut e = Entry::new(parsed);
        e.add_values(
            "objectClass",
            vec![b"top".to_vec(), b"olcSchemaConfig".to_vec()],
        );
        e.add_values("cn", vec![format!("{{{i}}}{}", doc.name).into_bytes()]);
        for ((attr, _), values) in ATTRS.iter().zip(lists(doc)) {
            if !values.is_empty() {
                e.add_values(
                    attr,
                    values
                        .iter()
                        .enumerate()
                        .map(|(j, v)| format!("{{{j}}}{v}").into_bytes())
                        .collect(),
                );
            }
        }
        out.push((dn, e));
    }
    out
}

/// The document a normalised DN below cn=schema,cn=config names: its
/// position. `cn={n}name` must name the document at n; `cn=name` any.
fn find(docs: &[SchemaDoc], norm: &str) -> Result<usize, LdapError> {
    let no_such = || LdapError::new(ResultCode::NO_SUCH_OBJECT, "no such object");
    let rdn = norm
        .strip_suffix(&format!(",{SCHEMA_NORM}"))
        .ok_or_else(no_such)?;
    let value = rdn.strip_prefix("cn=").ok_or_else(no_such)?;
    let (at, name) = split_ordinal(value);
    let i = docs
        .iter()
        .position(|d| d.name.eq_ignore_ascii_case(name))
        .ok_or_else(no_such)?;
    match at {
        Some(n) if n != i => Err(no_such()),
        _ => Ok(i),
    }
}

fn utf8(attr: &str, values: &[Vec<u8>]) -> Result<Vec<String>, LdapError> {
    values
        .iter()
        .map(|v| {
            String::from_utf8(v.clone())
                .map_err(|_| LdapError::invalid_syntax(format!("{attr}: a value is not UTF-8")))
        })
        .collect()
}

/// The configuration with the document `dn` (normalised `norm`) added from
/// an add request's attributes.
pub fn add(
    desired: &Config,
    dn: &Dn,
    norm: &str,
    attrs: &[PartialAttribute],
) -> Result<Config, LdapError> {
    let (at, name) = super::added_name(
        dn,
        norm,
        SCHEMA_NORM,
        "cn",
        format!("schema is added as cn=<name>,{SCHEMA_DN}"),
    )?;
    let name = name.as_str();
    if name.is_empty() || name.contains(['{', '}']) {
        return Err(LdapError::invalid_dn(format!(
            "'{name}' is not a schema name"
        )));
    }
    if desired
        .schema
        .iter()
        .any(|d| d.name.eq_ignore_ascii_case(name))
    {
        return Err(LdapError::new(
            ResultCode::ENTRY_ALREADY_EXISTS,
            format!("cn={name},{SCHEMA_DN} exists already"),
        ));
    }
    let mut doc = SchemaDoc {
        name: name.to_string(),
        object_identifiers: Vec::new(),
        ldap_syntaxes: Vec::new(),
        attribute_types: Vec::new(),
        object_classes: Vec::new(),
    };
    for a in attrs {
        if a.name.eq_ignore_ascii_case("objectClass") || a.name.eq_ignore_ascii_case("cn") {
            continue;
        }
        let Some(k) = attr_index(&a.name) else {
            return Err(LdapError::new(
                ResultCode::UNDEFINED_ATTRIBUTE_TYPE,
                format!(
                    "{}: not an attribute of schema entries ({})",
                    a.name,
                    names()
                ),
            ));
        };
        let values = utf8(ATTRS[k].0, &a.values)?;
        let list = &mut lists_mut(&mut doc)[k];
        **list = strip_all(&change_values(
            ATTRS[k].0,
            true,
            false,
            list,
            pando_proto::ModOp::Add,
            &values,
        )?);
    }
    let mut cfg = desired.clone();
    let at = at.unwrap_or(cfg.schema.len()).min(cfg.schema.len());
    cfg.schema.insert(at, doc);
    Ok(cfg)
}

/// The configuration without the document `norm`.
pub fn delete(desired: &Config, norm: &str) -> Result<Config, LdapError> {
    if norm == SCHEMA_NORM {
        return Err(LdapError::unwilling(format!("{SCHEMA_DN} itself stays")));
    }
    let i = find(&desired.schema, norm)?;
    let mut cfg = desired.clone();
    cfg.schema.remove(i);
    Ok(cfg)
}

/// The configuration with `changes` applied to the document `norm`.
pub fn modify(desired: &Config, norm: &str, changes: &[Change]) -> Result<Config, LdapError> {
    if norm == SCHEMA_NORM {
        return Err(LdapError::unwilling(format!(
            "{SCHEMA_DN} holds no definitions: add an entry cn=<name>,{SCHEMA_DN} (as ldapadd -f of a schema LDIF file does)"
        )));
    }
    let i = find(&desired.schema, norm)?;
    let mut cfg = desired.clone();
    let doc = &mut cfg.schema[i];
    for ch in changes {
        let Some(k) = attr_index(&ch.attr.name) else {
            let code = if ["cn", "objectClass"]
                .iter()
                .any(|n| n.eq_ignore_ascii_case(&ch.attr.name))
            {
                ResultCode::CONSTRAINT_VIOLATION
            } else {
                ResultCode::UNDEFINED_ATTRIBUTE_TYPE
            };
            return Err(LdapError::new(
                code,
                format!("{}: cannot be changed here ({})", ch.attr.name, names()),
            ));
        };
        let values = utf8(ATTRS[k].0, &ch.attr.values)?;
        let list = &mut lists_mut(doc)[k];
        let current: Vec<String> = list
            .iter()
            .enumerate()
            .map(|(j, v)| format!("{{{j}}}{v}"))
            .collect();
        **list = strip_all(&change_values(
            ATTRS[k].0, true, false, &current, ch.op, &values,
        )?);
    }
    Ok(cfg)
}

fn strip_all(values: &[String]) -> Vec<String> {
    values
        .iter()
        .map(|v| split_ordinal(v).1.to_string())
        .collect()
}

fn names() -> String {
    ATTRS.iter().map(|(a, _)| *a).collect::<Vec<_>>().join(", ")
}

/// Why the schema `new` cannot replace `old` while entries use what it
/// removes or redefines (None: nothing stored uses it). Reads every entry.
pub fn still_used(
    store: &pando_store::Store,
    old: &Schema,
    new: &Schema,
) -> Result<Option<String>, pando_store::StoreError> {
    let gone_types: Vec<&pando_model::AttributeType> = old
        .attributes()
        .filter(|a| {
            new.attribute(&a.oid)
                .is_none_or(|n| n.definition != a.definition)
        })
        .collect();
    let gone_classes: Vec<&pando_model::ObjectClass> = old
        .object_classes()
        .filter(|c| {
            new.object_class(&c.oid)
                .is_none_or(|n| n.definition != c.definition)
        })
        .collect();
    if gone_types.is_empty() && gone_classes.is_empty() {
        return Ok(None);
    }
    let rtxn = store.read()?;
    let view = rtxn.view();
    // What is used: by how many entries, and the first one's DN.
    let mut uses: Vec<(String, u64, String)> = Vec::new();
    let mut note =
        |what: String, id: pando_store::EntryId| -> Result<(), pando_store::StoreError> {
            match uses.iter_mut().find(|(w, _, _)| *w == what) {
                Some(u) => u.1 += 1,
                None => uses.push((what, 1, view.dn_string(id)?)),
            }
            Ok(())
        };
    for root in view.roots()? {
        let Some(ids) = view.subtree(root, u64::MAX)? else {
            continue;
        };
        for id in ids {
            let Some(attrs) = view.attrs(id)? else {
                continue;
            };
            for a in &attrs {
                let base = pando_model::desc::base(&a.desc);
                if let Some(t) = gone_types
                    .iter()
                    .find(|t| t.has_name(base) || t.oid == base)
                {
                    note(format!("attribute type {}", t.name()), id)?;
                }
                if a.desc.eq_ignore_ascii_case("objectClass") {
                    for v in &a.values {
                        let v = String::from_utf8_lossy(v);
                        if let Some(c) = gone_classes.iter().find(|c| c.has_name(&v) || c.oid == v)
                        {
                            note(format!("object class {}", c.name()), id)?;
                        }
                    }
                }
            }
        }
    }
    Ok(uses.first().map(|(what, n, example)| {
        format!(
            "{what} is used by {n} entr{} (e.g. {}); change or delete {} first, or send the relax rules control (administrators) to remove it anyway",
            if *n == 1 { "y" } else { "ies" },
            example,
            if *n == 1 { "it" } else { "them" },
        )
    }))
}
