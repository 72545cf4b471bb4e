//! What `pando repl check` finds: entries that differ between servers,
//! what each server holds of them, and the attributes two copies differ
//! in (read with searches). Shared by the check and its repair.

use std::collections::{BTreeMap, BTreeSet};

use pando_proto::{Control, Scope};
use pando_server::ops::digest::{self, Deleted, Listed, Uuid};

use crate::ldap_client::{search_request as search, BindArgs};

pub(crate) fn manage_dsa_it() -> Control {
    Control {
        oid: pando_proto::oid::MANAGE_DSA_IT.into(),
        critical: false,
        value: None,
    }
}

/// What one server holds of one entry.
#[derive(Clone, Debug)]
pub enum Held {
    Entry(Listed),
    Deleted(Deleted),
    Missing,
}

/// An entry that is not the same everywhere: what each server holds.
pub struct Differing {
    pub uuid: Uuid,
    pub held: Vec<Held>,
}

impl Differing {
    /// The DN to name it by: the newest copy's, else a delete's.
    pub(crate) fn dn(&self) -> String {
        self.newest()
            .map(|(_, l)| l.dn.clone())
            .or_else(|| {
                self.held.iter().find_map(|h| match h {
                    Held::Deleted(d) => Some(d.dn.clone()),
                    _ => None,
                })
            })
            .unwrap_or_default()
    }

    /// The copy with the newest entryCSN and its server (the first listed
    /// among equals).
    pub(crate) fn newest(&self) -> Option<(usize, &Listed)> {
        let mut best: Option<(usize, &Listed)> = None;
        for (i, h) in self.held.iter().enumerate() {
            if let Held::Entry(l) = h {
                if best.is_none_or(|(_, b)| l.csn > b.csn) {
                    best = Some((i, l));
                }
            }
        }
        best
    }

    /// The newest delete remembered anywhere.
    pub(crate) fn newest_delete(&self) -> Option<&Deleted> {
        self.held
            .iter()
            .filter_map(|h| match h {
                Held::Deleted(d) => Some(d),
                _ => None,
            })
            .max_by(|a, b| a.at.cmp(&b.at))
    }
}

/// The entry with UUID `uuid` as `url` holds it: DN and attributes.
pub(crate) fn fetch(
    bind: &BindArgs,
    base: &str,
    url: &str,
    uuid: &Uuid,
) -> Result<Option<pando_proto::SearchResultEntry>, String> {
    let mut l = bind.open(url)?;
    let filter = format!("(entryUUID={})", digest::uuid_text(uuid));
    let req = search(base, Scope::Sub, &filter, &["*", "entryUUID", "entryCSN"])?;
    let (_, mut found) = l.request(
        pando_proto::ProtocolOp::SearchRequest(req),
        vec![manage_dsa_it()],
    )?;
    Ok(found.pop())
}

/// The attributes whose values differ between two copies.
pub(crate) fn differing_attrs(
    schema: &pando_model::Schema,
    a: &pando_proto::SearchResultEntry,
    b: &pando_proto::SearchResultEntry,
) -> Vec<String> {
    let values = |e: &pando_proto::SearchResultEntry| -> BTreeMap<String, BTreeSet<Vec<u8>>> {
        let mut m: BTreeMap<String, BTreeSet<Vec<u8>>> = BTreeMap::new();
        for attr in &e.attrs {
            let name = digest::canonical_name(schema, &attr.name);
            // Their difference is shown beside each copy.
            if digest::digested(schema, &attr.name) && name != "entrycsn" && name != "entryuuid" {
                m.entry(name)
                    .or_default()
                    .extend(attr.values.iter().cloned());
            }
        }
        m
    };
    let (va, vb) = (values(a), values(b));
    let names: BTreeSet<&String> = va.keys().chain(vb.keys()).collect();
    let mut out: Vec<String> = names
        .into_iter()
        .filter(|n| va.get(*n) != vb.get(*n))
        .cloned()
        .collect();
    let names = &mut digest::Names::new(schema);
    if digest::dn_key(names, &a.dn) != digest::dn_key(names, &b.dn) {
        out.insert(0, "the DN".into());
    }
    out
}

/// How `held` reads in the report.
pub(crate) fn shown(h: &Held) -> String {
    match h {
        Held::Entry(l) => format!("entryCSN {} as {}", or_none(&l.csn), l.dn),
        Held::Deleted(d) => format!("deleted at {}", d.at),
        Held::Missing => "missing".into(),
    }
}

fn or_none(s: &str) -> &str {
    if s.is_empty() {
        "(none)"
    } else {
        s
    }
}
