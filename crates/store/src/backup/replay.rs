//! Applying an incremental backup's change log records to a restored
//! store, one record at a time, as the write that logged it changed the
//! entries: an add stores the entry its record lists, a delete removes
//! the entry (a tree delete's records come children first), a modify
//! applies the logged difference, a modify DN moves the entry and applies
//! its difference. Each record is logged again in the restored store and
//! advances its context CSN, so the store comes out as the backed-up one
//! was, change log included.
//!
//! A record that does not fit the store (a modify of a missing entry, an
//! add whose DN is taken) means the chain is not what its links say: the
//! restore stops with the record's CSN and DN.

use pando_model::{Attribute, Dn};

use crate::{EntryId, LoggedChange, LoggedKind, Lookup, ModOp, Placement, StoreError, WriteTxn};

/// Why a record could not be applied.
#[derive(Debug)]
pub(crate) enum ReplayError {
    Store(StoreError),
    /// The record does not fit the store it is applied to.
    Mismatch(String),
}

impl From<StoreError> for ReplayError {
    fn from(e: StoreError) -> Self {
        ReplayError::Store(e)
    }
}

impl std::fmt::Display for ReplayError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReplayError::Store(e) => e.fmt(f),
            ReplayError::Mismatch(s) => f.write_str(s),
        }
    }
}

/// Apply `c` to the store and log it there.
pub(crate) fn apply(w: &mut WriteTxn<'_>, c: &LoggedChange) -> Result<(), ReplayError> {
    let mismatch = |what: &str| {
        ReplayError::Mismatch(format!(
            "change {} ({:?} of '{}') does not fit the restored store: {what}",
            c.csn, c.kind, c.dn
        ))
    };
    let dn = Dn::parse(&c.dn).map_err(|e| mismatch(&format!("its DN does not parse: {e}")))?;
    match c.kind {
        LoggedKind::Add => {
            let attrs = added(c);
            if find(w, &dn)?.is_some() {
                return Err(mismatch("an entry with that DN exists"));
            }
            let place = placement(w, &dn).map_err(|e| mismatch(&e))?;
            w.add(&place, &attrs)?;
        }
        LoggedKind::Delete => {
            let (id, old) = existing(w, &dn).ok_or_else(|| mismatch("no such entry"))??;
            if w.view().has_children(id)? {
                return Err(mismatch("the entry has children"));
            }
            w.delete(id, &old)?;
        }
        LoggedKind::Modify => {
            let (id, old) = existing(w, &dn).ok_or_else(|| mismatch("no such entry"))??;
            let new = modified(&old, c);
            w.replace(id, &old, &new)?;
        }
        LoggedKind::ModDn => {
            let from = c
                .old_dn
                .as_deref()
                .ok_or_else(|| mismatch("it names no former DN"))?;
            let from = Dn::parse(from).map_err(|e| mismatch(&format!("former DN: {e}")))?;
            let (id, old) =
                existing(w, &from).ok_or_else(|| mismatch("no entry at its former DN"))??;
            let place = placement(w, &dn).map_err(|e| mismatch(&e))?;
            w.rename(id, &place)?;
            let new = modified(&old, c);
            w.replace(id, &old, &new)?;
        }
    }
    w.log_change(c)?;
    w.advance_context_csn(&c.csn)?;
    Ok(())
}

/// The entry `dn` names, if any.
fn find(w: &WriteTxn<'_>, dn: &Dn) -> Result<Option<EntryId>, ReplayError> {
    match w.view().lookup(dn)? {
        Ok(Lookup::Found(id)) => Ok(Some(id)),
        Ok(Lookup::Missing { .. }) => Ok(None),
        Err(e) => Err(ReplayError::Mismatch(format!("'{dn}': {e}"))),
    }
}

/// The entry `dn` names and its stored attributes (None: no such entry).
fn existing(w: &WriteTxn<'_>, dn: &Dn) -> Option<Result<(EntryId, Vec<Attribute>), ReplayError>> {
    let id = match find(w, dn) {
        Ok(Some(id)) => id,
        Ok(None) => return None,
        Err(e) => return Some(Err(e)),
    };
    match w.view().entry(id) {
        Ok(Some(e)) => Some(Ok((id, e.attrs))),
        Ok(None) => None,
        Err(e) => Some(Err(e.into())),
    }
}

/// Where `dn` goes: below its parent when the store holds it, else as a
/// suffix entry (a parent of 0, its whole DN as RDN), as the server places
/// suffix entries.
fn placement(w: &WriteTxn<'_>, dn: &Dn) -> Result<Placement, String> {
    let v = w.view();
    let rdns = v.normalize_rdns(dn).map_err(|e| format!("'{dn}': {e}"))?;
    if rdns.len() > 1 {
        if let Ok(Lookup::Found(parent)) = v.lookup_norm(&rdns[1..]) {
            return Ok(Placement {
                parent,
                rdn: dn.rdn().map(|r| r.to_string()).unwrap_or_default(),
                norm_rdn: rdns[0].clone(),
            });
        }
    }
    Ok(Placement {
        parent: 0,
        rdn: dn.to_string(),
        norm_rdn: rdns.join(","),
    })
}

/// An add's entry: every attribute its record lists, in order.
fn added(c: &LoggedChange) -> Vec<Attribute> {
    c.mods
        .iter()
        .map(|m| Attribute {
            desc: m.desc.clone(),
            values: m.values.clone(),
        })
        .collect()
}

/// `old` with the record's modifications applied as the log's difference
/// states them (`write::log::diff`): values compared byte for byte, a
/// delete without values removes the attribute, a replace sets its values
/// where it stands.
pub(crate) fn modified(old: &[Attribute], c: &LoggedChange) -> Vec<Attribute> {
    let mut attrs = old.to_vec();
    for m in &c.mods {
        let at = attrs
            .iter()
            .position(|a| a.desc.eq_ignore_ascii_case(&m.desc));
        match (m.op, at) {
            (ModOp::Add, Some(i)) => {
                for v in &m.values {
                    if !attrs[i].values.contains(v) {
                        attrs[i].values.push(v.clone());
                    }
                }
            }
            (ModOp::Add | ModOp::Replace, None) if !m.values.is_empty() => {
                attrs.push(Attribute {
                    desc: m.desc.clone(),
                    values: m.values.clone(),
                });
            }
            (ModOp::Replace, Some(i)) if !m.values.is_empty() => {
                attrs[i].values = m.values.clone();
            }
            (ModOp::Delete, Some(i)) if !m.values.is_empty() => {
                attrs[i].values.retain(|v| !m.values.contains(v));
                if attrs[i].values.is_empty() {
                    attrs.remove(i);
                }
            }
            (ModOp::Delete | ModOp::Replace, Some(i)) => {
                attrs.remove(i);
            }
            _ => {}
        }
    }
    attrs
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::LoggedMod;

    fn attr(desc: &str, vs: &[&str]) -> Attribute {
        Attribute {
            desc: desc.into(),
            values: vs.iter().map(|v| v.as_bytes().to_vec()).collect(),
        }
    }

    fn m(op: ModOp, desc: &str, vs: &[&str]) -> LoggedMod {
        LoggedMod {
            op,
            desc: desc.into(),
            values: vs.iter().map(|v| v.as_bytes().to_vec()).collect(),
        }
    }

    #[test]
    fn a_logged_difference_applies_as_the_writer_computed_it() {
        let old = vec![
            attr("cn", &["x"]),
            attr("description", &["gone"]),
            attr("member", &["a", "b", "c"]),
            attr("sn", &["old"]),
        ];
        let c = LoggedChange {
            csn: "20261130000000.000000Z#000000#001#000000".into(),
            seq: 0,
            kind: LoggedKind::Modify,
            uuid: "u".into(),
            dn: "cn=x".into(),
            old_dn: None,
            mods: vec![
                m(ModOp::Delete, "description", &[]),
                m(ModOp::Delete, "member", &["b"]),
                m(ModOp::Add, "member", &["d"]),
                m(ModOp::Replace, "SN", &["new"]),
                m(ModOp::Add, "mail", &["x@example.com"]),
            ],
            by: String::new(),
        };
        assert_eq!(
            modified(&old, &c),
            vec![
                attr("cn", &["x"]),
                attr("member", &["a", "c", "d"]),
                attr("sn", &["new"]),
                attr("mail", &["x@example.com"]),
            ]
        );
    }
}
