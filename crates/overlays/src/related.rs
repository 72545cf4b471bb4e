//! Changes an overlay makes to entries other than the ones an operation
//! names (a group losing a deleted member, a member gaining memberOf),
//! made in the same writer transaction as the operation itself.
//!
//! Overlays run on the writer's view, before anything of the operation
//! is written: the view holds every entry as it was before the operation.
//! An entry the operation (or an earlier overlay) already changes is
//! edited in place, in its `after`; any other is added to the changes as
//! a modify that changes nothing yet. Added modifies that end up changing
//! nothing are dropped, and the others are checked against the schema
//! ([`finish`]). They are written before the operation's own changes and
//! go to the change log and to replication with its CSN.

use pando_model::{Dn, Entry, Schema};
use pando_proto::{Ava, Filter, ResultCode};
use pando_store::{Candidates, EntryId, Lookup, View};
use roaring::RoaringTreemap;

use pando_ops::error::{LdapError, OpResult};
use pando_ops::write::{Before, Change};

/// An entry whose name the operation changes: a renamed entry, or one
/// below it (its name changes with its ancestor's).
pub struct Move {
    pub id: EntryId,
    pub old_norm: String,
    pub new_norm: String,
    /// The new DN as written.
    pub new_dn: String,
    /// Whether the entry is itself in the changes (the renamed one).
    pub in_changes: bool,
}

/// Every name the operation changes, descendants of renamed entries
/// included. A rename of a subtree larger than `limit` is refused: each
/// entry of it costs index lookups in the writer.
pub fn moves(view: &View<'_>, changes: &[Change], limit: u64) -> OpResult<Vec<Move>> {
    let mut out = Vec::new();
    for c in changes {
        let (Some(before), Some(after), Some(new_norm)) = (&c.before, &c.after, &c.after_norm)
        else {
            continue;
        };
        if *new_norm == before.norm {
            continue;
        }
        let new_dn = after.dn.to_string();
        out.push(Move {
            id: before.id,
            old_norm: before.norm.clone(),
            new_norm: new_norm.clone(),
            new_dn: new_dn.clone(),
            in_changes: true,
        });
        if !view.has_children(before.id)? {
            continue;
        }
        let Some(ids) = view.subtree(before.id, limit)? else {
            return Err(LdapError::new(
                ResultCode::ADMIN_LIMIT_EXCEEDED,
                format!(
                    "renaming a subtree of more than {limit} entries while overlays keep references (limits.max_tree_delete)"
                ),
            ));
        };
        let (old_dn, _) = view.dn_pair(before.id)?;
        for id in ids.iter().filter(|id| *id != before.id) {
            let (dn, norm) = view.dn_pair(id)?;
            let (Some(dn_head), Some(norm_head)) = (
                dn.strip_suffix(old_dn.as_str()),
                norm.strip_suffix(before.norm.as_str()),
            ) else {
                continue;
            };
            out.push(Move {
                id,
                old_norm: norm.clone(),
                new_norm: format!("{norm_head}{new_norm}"),
                new_dn: format!("{dn_head}{new_dn}"),
                in_changes: false,
            });
        }
    }
    Ok(out)
}

/// Whether `norm` is `base` or below it.
pub fn within(norm: &str, base: &str) -> bool {
    base.is_empty()
        || norm == base
        || (norm.len() > base.len()
            && norm.ends_with(base)
            && norm.as_bytes()[norm.len() - base.len() - 1] == b',')
}

/// The position in `changes` of the entry named `norm` as the operation
/// leaves it, loading a stored entry (as a modify that changes nothing
/// yet) when the operation does not touch it. None: no entry has that
/// name once the operation is done (never had, deleted, renamed away).
pub fn resolve(
    view: &View<'_>,
    changes: &mut Vec<Change>,
    moved: &[Move],
    norm: &str,
) -> OpResult<Option<usize>> {
    if let Some(i) = changes
        .iter()
        .position(|c| c.after.is_some() && c.norm() == norm)
    {
        return Ok(Some(i));
    }
    if changes
        .iter()
        .any(|c| c.before.as_ref().is_some_and(|b| b.norm == norm))
    {
        return Ok(None);
    }
    // Below a renamed entry: the stored name is the old one.
    let mut stored = norm.to_string();
    for m in moved.iter().filter(|m| m.in_changes) {
        if within(norm, &m.new_norm) {
            stored = format!("{}{}", &norm[..norm.len() - m.new_norm.len()], m.old_norm);
        } else if within(norm, &m.old_norm) {
            return Ok(None);
        }
    }
    let Ok(dn) = Dn::parse(&stored) else {
        return Ok(None);
    };
    let Ok(rdns) = view.normalize_rdns(&dn) else {
        return Ok(None);
    };
    let Lookup::Found(id) = view.lookup_norm(&rdns)? else {
        return Ok(None);
    };
    edit_index(view, changes, id)
}

/// The position in `changes` of the stored entry `id`, added as a modify
/// that changes nothing yet when the operation does not touch it. None
/// when it is gone or the operation deletes it.
pub fn edit_index(
    view: &View<'_>,
    changes: &mut Vec<Change>,
    id: EntryId,
) -> OpResult<Option<usize>> {
    if let Some(i) = changes
        .iter()
        .position(|c| c.before.as_ref().is_some_and(|b| b.id == id))
    {
        return Ok(changes[i].after.is_some().then_some(i));
    }
    let Some(entry) = view.entry(id)? else {
        return Ok(None);
    };
    let (_, norm) = view.dn_pair(id)?;
    let after = entry.clone();
    changes.push(Change::modify(
        Before {
            id,
            entry,
            norm,
            bytes: None,
        },
        after,
    ));
    Ok(Some(changes.len() - 1))
}

/// The entry at `i` as the operation leaves it.
pub fn after_mut(changes: &mut [Change], i: usize) -> &mut Entry {
    changes[i]
        .after
        .as_mut()
        .expect("resolve and edit_index give changes with an after")
}

/// Entries that may hold a value of one of `attrs` equal to the DN
/// `norm`, from the equality indexes (a superset: callers compare the
/// values). Without a usable index (one being built) every entry is.
pub fn referrers(view: &View<'_>, attrs: &[String], norm: &str) -> OpResult<RoaringTreemap> {
    let filter = Filter::Or(
        attrs
            .iter()
            .map(|a| {
                Filter::Equality(Ava {
                    attr: a.clone(),
                    value: norm.as_bytes().to_vec(),
                })
            })
            .collect(),
    );
    match view.candidates(&filter)? {
        Candidates::Ids(ids) => Ok(ids),
        Candidates::All => {
            let mut all = RoaringTreemap::new();
            for root in view.roots()? {
                if let Some(ids) = view.subtree(root, u64::MAX)? {
                    all |= ids;
                }
            }
            Ok(all)
        }
    }
}

/// The normalised DN a value of `attr` names (None: not a DN). A
/// name-and-optional-UID value (uniqueMember) names the DN before its
/// `#'…'B` UID.
pub fn value_norm(schema: &Schema, value: &[u8]) -> Option<String> {
    let text = std::str::from_utf8(value).ok()?;
    let dn_part = match text.rfind("#'") {
        Some(at) if text.ends_with("'B") => &text[..at],
        _ => text,
    };
    let dn = Dn::parse(dn_part).ok()?;
    schema.normalize_dn(&dn).ok()
}

/// Remove the values of `attr` naming `norm`; whether any went. An
/// attribute left without values is removed.
pub fn remove_dn(schema: &Schema, entry: &mut Entry, attr: &str, norm: &str) -> bool {
    let Some(a) = entry.get_mut(attr) else {
        return false;
    };
    let before = a.values.len();
    a.values
        .retain(|v| value_norm(schema, v).as_deref() != Some(norm));
    let removed = a.values.len() != before;
    if a.values.is_empty() {
        entry.remove(attr);
    }
    removed
}

/// Add `dn` (normalised `norm`) to `attr` unless a value names it already.
pub fn add_dn(schema: &Schema, entry: &mut Entry, attr: &str, dn: &str, norm: &str) -> bool {
    if entry
        .values(attr)
        .iter()
        .any(|v| value_norm(schema, v).as_deref() == Some(norm))
    {
        return false;
    }
    entry.add_values(attr, vec![dn.as_bytes().to_vec()]);
    true
}

/// Values of `attr` naming `old` now name `new_dn` (a UID part is kept);
/// whether any changed.
pub fn rename_dn(
    schema: &Schema,
    entry: &mut Entry,
    attr: &str,
    old: &str,
    new_dn: &str,
    new_norm: &str,
) -> bool {
    let Some(a) = entry.get(attr) else {
        return false;
    };
    let mut changed = false;
    let mut values: Vec<Vec<u8>> = Vec::with_capacity(a.values.len());
    for v in &a.values {
        if value_norm(schema, v).as_deref() != Some(old) {
            values.push(v.clone());
            continue;
        }
        changed = true;
        let text = String::from_utf8_lossy(v);
        let uid = match text.rfind("#'") {
            Some(at) if text.ends_with("'B") => text[at..].to_string(),
            _ => String::new(),
        };
        let renamed = format!("{new_dn}{uid}").into_bytes();
        let exists = values
            .iter()
            .any(|x| value_norm(schema, x).as_deref() == Some(new_norm));
        if !exists {
            values.push(renamed);
        }
    }
    if changed {
        if let Some(a) = entry.get_mut(attr) {
            a.values = values;
        }
    }
    changed
}

/// The (normalised DN, DN as written) of each value of the attributes
/// `attrs` of `entry`.
pub fn dn_values(schema: &Schema, entry: &Entry, attrs: &[String]) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for attr in attrs {
        for v in entry.values(attr) {
            if let Some(n) = value_norm(schema, v) {
                if !out.iter().any(|(x, _)| *x == n) {
                    out.push((n, String::from_utf8_lossy(v).into_owned()));
                }
            }
        }
    }
    out
}
