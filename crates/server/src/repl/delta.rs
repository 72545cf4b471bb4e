//! Delta-sync, the consumer's side: records of a provider's access log
//! (OpenLDAP's `syncdata=accesslog`; cn=accesslog on slapd or on Pando)
//! turned into the whole entries the write pipeline applies
//! (`ops::write::replicated`).
//!
//! A record names the operation (reqType), its target (reqDN), its
//! modifications (reqMod, `attr:<op> value` with op `+` add, `-` delete,
//! `=` replace, `#` increment; a value of just `:` ends a modification),
//! for a rename reqNewRDN, reqDeleteOldRDN and reqNewSuperior, and the
//! change's CSN (entryCSN). Applied to the entry held here, it gives the
//! provider's entry afterwards. As OpenLDAP's consumer applies them, an
//! add to a single-valued attribute replaces, and deletes of values that
//! are absent are skipped; what cannot be applied (the target missing, an
//! add where another entry is, an attribute this schema does not know)
//! means this replica lost step with the log: it refreshes whole.

use pando_model::{Dn, Entry, Schema};
use pando_proto::{Change, ModOp, PartialAttribute};

use crate::ops::write::apply_changes;

/// What one record asks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    Add,
    Delete,
    Modify,
    ModRdn,
}

/// One record of a provider's access log.
#[derive(Clone, Debug)]
pub struct LogRecord {
    pub kind: RecordKind,
    pub dn: Dn,
    pub mods: Vec<Change>,
    /// A rename's new RDN (as a one-RDN DN).
    pub new_rdn: Option<Dn>,
    pub delete_old_rdn: bool,
    pub new_superior: Option<Dn>,
    pub csn: Option<String>,
    /// reqEntryUUID, when the provider logs it.
    pub uuid: Option<String>,
}

/// The attributes a consumer asks of each record.
pub const RECORD_ATTRS: [&str; 8] = [
    "reqDN",
    "reqType",
    "reqMod",
    "reqNewRDN",
    "reqDeleteOldRDN",
    "reqNewSuperior",
    "reqEntryUUID",
    "entryCSN",
];

fn text(a: &PartialAttribute) -> Result<&str, String> {
    let v = a
        .values
        .first()
        .ok_or_else(|| format!("{} has no value", a.name))?;
    std::str::from_utf8(v).map_err(|_| format!("{} is not UTF-8", a.name))
}

fn dn(a: &PartialAttribute) -> Result<Dn, String> {
    let t = text(a)?;
    Dn::parse(t).map_err(|e| format!("{} '{t}' is not a DN: {e}", a.name))
}

/// A record from the attributes of its entry.
pub fn parse_record(attrs: &[PartialAttribute]) -> Result<LogRecord, String> {
    let (mut kind, mut target, mut mods) = (None, None, Vec::new());
    let mut rec = LogRecord {
        kind: RecordKind::Modify,
        dn: Dn { rdns: Vec::new() },
        mods: Vec::new(),
        new_rdn: None,
        delete_old_rdn: false,
        new_superior: None,
        csn: None,
        uuid: None,
    };
    for a in attrs {
        match a.name.to_ascii_lowercase().as_str() {
            "reqtype" => {
                // OpenLDAP writes extended operations as `extended…`.
                kind = Some(match text(a)? {
                    "add" => RecordKind::Add,
                    "delete" => RecordKind::Delete,
                    "modify" => RecordKind::Modify,
                    "modrdn" => RecordKind::ModRdn,
                    other => return Err(format!("reqType '{other}' is not a write")),
                })
            }
            "reqdn" => target = Some(dn(a)?),
            "reqmod" => mods = parse_mods(&a.values)?,
            "reqnewrdn" => rec.new_rdn = Some(dn(a)?),
            "reqdeleteoldrdn" => rec.delete_old_rdn = text(a)?.eq_ignore_ascii_case("TRUE"),
            "reqnewsuperior" => rec.new_superior = Some(dn(a)?),
            "entrycsn" => rec.csn = Some(text(a)?.to_string()),
            "reqentryuuid" => rec.uuid = Some(text(a)?.to_ascii_lowercase()),
            _ => {}
        }
    }
    rec.kind = kind.ok_or("no reqType")?;
    rec.dn = target.ok_or("no reqDN")?;
    rec.mods = mods;
    if rec.kind == RecordKind::ModRdn && rec.new_rdn.as_ref().is_none_or(|r| r.rdns.len() != 1) {
        return Err("a modrdn without a one-RDN reqNewRDN".into());
    }
    Ok(rec)
}

/// reqMod values as modifications, in order: consecutive values of one
/// attribute and operation make one modification.
pub fn parse_mods(values: &[Vec<u8>]) -> Result<Vec<Change>, String> {
    let mut out: Vec<Change> = Vec::new();
    // The last modification may take more values.
    let mut open = false;
    for v in values {
        if v.as_slice() == b":" {
            open = false;
            continue;
        }
        let colon = v
            .iter()
            .position(|&b| b == b':')
            .ok_or_else(|| format!("reqMod '{}' has no ':'", String::from_utf8_lossy(v)))?;
        let desc = std::str::from_utf8(&v[..colon])
            .map_err(|_| "a reqMod attribute name is not UTF-8".to_string())?;
        let op = match v.get(colon + 1) {
            Some(b'+') => ModOp::Add,
            Some(b'-') => ModOp::Delete,
            Some(b'=') => ModOp::Replace,
            Some(b'#') => ModOp::Increment,
            // OpenLDAP skips an operation it does not know.
            _ => continue,
        };
        let value = match v.get(colon + 2) {
            None => None,
            Some(b' ') => Some(v[colon + 3..].to_vec()),
            Some(_) => {
                return Err(format!(
                    "reqMod '{}' is malformed",
                    String::from_utf8_lossy(v)
                ))
            }
        };
        let same = open
            && out
                .last()
                .is_some_and(|m| m.op == op && m.attr.name.eq_ignore_ascii_case(desc));
        match (same, value) {
            (true, Some(value)) => {
                if let Some(m) = out.last_mut() {
                    m.attr.values.push(value);
                }
            }
            (_, value) => {
                out.push(Change {
                    op,
                    attr: PartialAttribute {
                        name: desc.to_string(),
                        values: value.into_iter().collect(),
                    },
                });
                // A modification without values takes no more.
                open = out.last().is_some_and(|m| !m.attr.values.is_empty());
            }
        }
    }
    Ok(out)
}

/// The modifications as applied here: an add to a single-valued
/// attribute replaces it; an add without values is nothing.
fn as_applied(schema: &Schema, mods: &[Change]) -> Vec<Change> {
    mods.iter()
        .filter(|m| !(m.op == ModOp::Add && m.attr.values.is_empty()))
        .map(|m| {
            let base = pando_model::desc::base(&m.attr.name);
            let single = schema.attribute(base).is_some_and(|at| at.single_value);
            let op = if m.op == ModOp::Add && single {
                ModOp::Replace
            } else {
                m.op
            };
            Change {
                op,
                attr: m.attr.clone(),
            }
        })
        .collect()
}

/// Why a record cannot be applied to what is held here.
#[derive(Debug, PartialEq, Eq)]
pub struct Lost(pub String);

/// The entry an add record creates (its entryUUID from its values, else
/// from reqEntryUUID).
pub fn added_entry(schema: &Schema, rec: &LogRecord) -> Result<Entry, Lost> {
    let mut e = Entry::new(rec.dn.clone());
    let adds: Vec<Change> = as_applied(schema, &rec.mods)
        .into_iter()
        .filter(|m| m.op != ModOp::Delete)
        .collect();
    apply_changes(schema, &mut e, &adds, true).map_err(|err| {
        Lost(format!(
            "the add of '{}' does not apply: {}",
            rec.dn, err.message
        ))
    })?;
    if e.get("entryUUID").is_none() {
        let uuid = rec
            .uuid
            .clone()
            .ok_or_else(|| Lost(format!("the add of '{}' carries no entryUUID", rec.dn)))?;
        e.add_values("entryUUID", vec![uuid.into_bytes()]);
    }
    stamp_csn(&mut e, rec);
    Ok(e)
}

/// The entry after a modify or modrdn record, from the one held.
pub fn changed_entry(schema: &Schema, held: &Entry, rec: &LogRecord) -> Result<Entry, Lost> {
    let lost = |err: crate::error::LdapError| {
        Lost(format!(
            "the {} of '{}' does not apply here: {}",
            if rec.kind == RecordKind::ModRdn {
                "rename"
            } else {
                "modify"
            },
            rec.dn,
            err.message
        ))
    };
    let mut e = held.clone();
    e.remove(crate::ops::write::merge::STATE_ATTR);
    if rec.kind == RecordKind::ModRdn {
        let new_rdn = rec.new_rdn.as_ref().and_then(|r| r.rdns.first()).cloned();
        let new_rdn = new_rdn.ok_or_else(|| Lost("a rename without a new RDN".into()))?;
        let ava_change = |op: ModOp, rdn: &pando_model::dn::Rdn| -> Vec<Change> {
            rdn.avas
                .iter()
                .map(|a| Change {
                    op,
                    attr: PartialAttribute {
                        name: a.attr.clone(),
                        values: vec![a.value.clone()],
                    },
                })
                .collect()
        };
        let mut rdn_mods = Vec::new();
        if rec.delete_old_rdn {
            if let Some(old) = rec.dn.rdn() {
                rdn_mods.extend(ava_change(ModOp::Delete, old));
            }
        }
        rdn_mods.extend(ava_change(ModOp::Add, &new_rdn));
        let rdn_mods = as_applied(schema, &rdn_mods);
        apply_changes(schema, &mut e, &rdn_mods, true).map_err(lost)?;
        let parent = match &rec.new_superior {
            Some(p) => p.clone(),
            None => rec.dn.parent().unwrap_or(Dn { rdns: Vec::new() }),
        };
        let mut rdns = vec![new_rdn];
        rdns.extend(parent.rdns);
        e.dn = Dn { rdns };
    }
    apply_changes(schema, &mut e, &as_applied(schema, &rec.mods), true).map_err(lost)?;
    stamp_csn(&mut e, rec);
    Ok(e)
}

/// The entry carries the record's CSN (reqMod names it too, from OpenLDAP).
fn stamp_csn(e: &mut Entry, rec: &LogRecord) {
    if let Some(csn) = &rec.csn {
        e.remove("entryCSN");
        e.add_values("entryCSN", vec![csn.clone().into_bytes()]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn attr(name: &str, values: &[&str]) -> PartialAttribute {
        PartialAttribute {
            name: name.into(),
            values: values.iter().map(|v| v.as_bytes().to_vec()).collect(),
        }
    }

    fn vals(e: &Entry, a: &str) -> Vec<String> {
        let mut v: Vec<String> = e
            .get(a)
            .map(|a| {
                a.values
                    .iter()
                    .map(|v| String::from_utf8_lossy(v).into())
                    .collect()
            })
            .unwrap_or_default();
        v.sort();
        v
    }

    #[test]
    fn req_mod_values_group_into_modifications_as_openldap_writes_them() {
        let values: Vec<Vec<u8>> = [
            "description:+ a",
            "description:+ b",
            // The separator: the next value starts a new modification.
            ":",
            "description:+ c",
            "mail:-",
            "mail:= x@y",
            "cn;lang-de:= Müller",
            "uidNumber:# 5",
            "sn:? skipped",
        ]
        .iter()
        .map(|v| v.as_bytes().to_vec())
        .collect();
        let mods = parse_mods(&values).unwrap();
        let shape: Vec<(ModOp, &str, usize)> = mods
            .iter()
            .map(|m| (m.op, m.attr.name.as_str(), m.attr.values.len()))
            .collect();
        assert_eq!(
            shape,
            [
                (ModOp::Add, "description", 2),
                (ModOp::Add, "description", 1),
                (ModOp::Delete, "mail", 0),
                (ModOp::Replace, "mail", 1),
                (ModOp::Replace, "cn;lang-de", 1),
                (ModOp::Increment, "uidNumber", 1),
            ]
        );
        // Binary values are kept as they are.
        let bin = parse_mods(&[b"jpegPhoto:+ \x00\xff:".to_vec()]).unwrap();
        assert_eq!(bin[0].attr.values, [b"\x00\xff:".to_vec()]);
        assert!(parse_mods(&[b"no colon".to_vec()]).is_err());
        assert!(parse_mods(&[b"cn:+x".to_vec()]).is_err());
    }

    #[test]
    fn records_apply_to_the_entry_held() {
        let schema = Schema::standard();
        let csn = "20261127000000.000000Z#000000#001#000000";
        let add = parse_record(&[
            attr("reqType", &["add"]),
            attr("reqDN", &["uid=a,ou=People,dc=x"]),
            attr(
                "reqMod",
                &[
                    "objectClass:+ inetOrgPerson",
                    "uid:+ a",
                    "cn:+ A",
                    "sn:+ A",
                    "entryUUID:+ 0a1b2c3d-0000-4000-8000-000000000001",
                    "entryCSN:+ 20261127000000.000000Z#000000#001#000000",
                ],
            ),
            attr("entryCSN", &[csn]),
        ])
        .unwrap();
        let e = added_entry(&schema, &add).unwrap();
        assert_eq!(
            vals(&e, "entryUUID"),
            ["0a1b2c3d-0000-4000-8000-000000000001"]
        );
        assert_eq!(vals(&e, "cn"), ["A"]);
        // A modify: soft deletes, a single-valued add replaces.
        let later = "20261127000001.000000Z#000000#001#000000";
        let modify = parse_record(&[
            attr("reqType", &["modify"]),
            attr("reqDN", &["uid=a,ou=People,dc=x"]),
            attr(
                "reqMod",
                &[
                    "cn:+ B",
                    "cn:- Z",
                    "displayName:+ One",
                    ":",
                    "displayName:+ Two",
                    "entryCSN:= 20261127000001.000000Z#000000#001#000000",
                ],
            ),
            attr("entryCSN", &[later]),
        ])
        .unwrap();
        let m = changed_entry(&schema, &e, &modify).unwrap();
        assert_eq!(vals(&m, "cn"), ["A", "B"]);
        assert_eq!(vals(&m, "displayName"), ["Two"]);
        assert_eq!(vals(&m, "entryCSN"), [later]);
        // A rename with the old RDN value deleted, to a new parent.
        let rename = parse_record(&[
            attr("reqType", &["modrdn"]),
            attr("reqDN", &["uid=a,ou=People,dc=x"]),
            attr("reqNewRDN", &["uid=b"]),
            attr("reqDeleteOldRDN", &["TRUE"]),
            attr("reqNewSuperior", &["ou=Old,dc=x"]),
            attr("entryCSN", &[later]),
        ])
        .unwrap();
        let r = changed_entry(&schema, &m, &rename).unwrap();
        assert_eq!(r.dn.to_string(), "uid=b,ou=Old,dc=x");
        assert_eq!(vals(&r, "uid"), ["b"]);
        // An attribute this schema does not know: lost step.
        let unknown = parse_record(&[
            attr("reqType", &["modify"]),
            attr("reqDN", &["uid=a,ou=People,dc=x"]),
            attr("reqMod", &["frobnicate:+ x"]),
        ])
        .unwrap();
        assert!(changed_entry(&schema, &e, &unknown).is_err());
        // Records without a type or target, or a type that is no write.
        assert!(parse_record(&[attr("reqDN", &["dc=x"])]).is_err());
        assert!(parse_record(&[attr("reqType", &["add"])]).is_err());
        assert!(parse_record(&[attr("reqType", &["bind"]), attr("reqDN", &["dc=x"])]).is_err());
    }
}
