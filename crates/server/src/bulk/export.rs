//! `pando export`: the store (or a subtree) as LDIF.
//!
//! Export walks the tree parents-first inside one read transaction, so it
//! is consistent and works while the server runs.

use std::io::Write;

use pando_model::Dn;
use pando_store::{EntryId, Lookup, Store};

#[derive(Debug, Clone, Default)]
pub struct ExportOptions {
    /// Only this subtree (default: every suffix).
    pub base: Option<Dn>,
    pub filter: Option<pando_proto::Filter>,
    /// Include stored operational attributes (entryUUID, timestamps…).
    pub operational: bool,
    pub wrap: Option<usize>,
}

/// Write LDIF for the store's entries, parents before children, from one
/// read transaction. Returns the number of entries written.
pub fn export<W: Write>(store: &Store, out: &mut W, opts: &ExportOptions) -> Result<u64, String> {
    let schema = store.schema().clone();
    let rtxn = store.read().map_err(|e| e.to_string())?;
    let view = rtxn.view();
    let starts: Vec<EntryId> = match &opts.base {
        Some(base) => match view.lookup(base).map_err(|e| e.to_string())? {
            Ok(Lookup::Found(id)) => vec![id],
            Ok(Lookup::Missing { .. }) => return Err(format!("no entry '{base}' in the store")),
            Err(e) => return Err(format!("invalid base '{base}': {e}")),
        },
        None => view.roots().map_err(|e| e.to_string())?,
    };
    let filter = opts.filter.as_ref().map(|f| schema.compile_filter(f));
    let mut n = 0;
    let mut stack: Vec<EntryId> = starts.into_iter().rev().collect();
    while let Some(id) = stack.pop() {
        let mut kids = view.children(id).map_err(|e| e.to_string())?;
        kids.reverse();
        stack.extend(kids);
        let Some(entry) = view.entry(id).map_err(|e| e.to_string())? else {
            continue;
        };
        if let Some(f) = &filter {
            if f.matches(&schema, &entry) != pando_model::Ternary::True {
                continue;
            }
        }
        let dn = view.dn_string(id).map_err(|e| e.to_string())?;
        let pairs = entry.attrs.iter().filter(|a| {
            opts.operational
                || schema
                    .attribute(pando_model::desc::base(&a.desc))
                    .is_none_or(|t| !t.is_operational())
        });
        let flat = pairs.flat_map(|a| {
            a.values
                .iter()
                .map(move |v| (a.desc.as_str(), v.as_slice()))
        });
        pando_ldif::write_entry(out, &dn, flat, opts.wrap)
            .map_err(|e| format!("write failed: {e}"))?;
        n += 1;
    }
    Ok(n)
}
