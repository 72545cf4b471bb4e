//! Each written entry's record in the store's change log (see
//! `pando_store::LoggedChange`), made in the writer's transaction, and the
//! log's retention.

use std::sync::atomic::{AtomicU64, Ordering};

use pando_model::{Attribute, Entry};
use pando_store::{LoggedChange, LoggedKind, LoggedMod, ModOp, StoreError, WriteTxn};

use super::Change;
use crate::feed::Kind;
use pando_config::ReplicationConfig;

/// On each write, up to this many records past their retention are
/// removed (so they go at least as fast as they come).
const PURGE_PER_WRITE: usize = 16;

/// The count bound (`changelog_max_changes`) is kept on every write; the
/// age bound (`changelog_days`), which reads the oldest record, on one
/// write in this many, removing as many records as the writes between
/// would have.
const AGE_CHECK_EVERY: u64 = 64;

/// Writes since the server started (all stores: it only spaces out the
/// age checks).
static WRITES: AtomicU64 = AtomicU64::new(0);

/// Log `c`, the operation's `seq`th entry written (from 0), made by `by`
/// (the requester's DN; "" for a received change).
pub(super) fn log(
    w: &mut WriteTxn<'_>,
    csn: &str,
    seq: u32,
    c: &Change,
    by: &str,
) -> Result<(), StoreError> {
    let (kind, mods) = match c.kind() {
        Kind::Add => (LoggedKind::Add, all_added(c.entry())),
        Kind::Delete => (LoggedKind::Delete, Vec::new()),
        Kind::Modify => (LoggedKind::Modify, diff(before_entry(c), c.entry())),
        Kind::ModDn => (LoggedKind::ModDn, diff(before_entry(c), c.entry())),
    };
    w.log_change(&LoggedChange {
        csn: csn.to_string(),
        seq,
        kind,
        uuid: c.uuid(),
        dn: c.entry().dn.to_string(),
        old_dn: c.previous_dn(),
        mods,
        by: by.to_string(),
    })
}

fn before_entry(c: &Change) -> &Entry {
    c.before.as_ref().map_or(c.entry(), |b| &b.entry)
}

/// Remove what is past the configured retention (called on every write):
/// records over the count at once, records past their age every
/// [`AGE_CHECK_EVERY`] writes.
pub(super) fn purge(w: &mut WriteTxn<'_>, cfg: &ReplicationConfig) -> Result<(), StoreError> {
    let age_check = WRITES
        .fetch_add(1, Ordering::Relaxed)
        .is_multiple_of(AGE_CHECK_EVERY);
    if age_check || cfg.changelog_days == 0 {
        return purge_up_to(w, cfg, PURGE_PER_WRITE * AGE_CHECK_EVERY as usize).map(|_| ());
    }
    if w.view().changelog_len()? > cfg.changelog_max_changes {
        purge_up_to(w, cfg, PURGE_PER_WRITE)?;
    }
    Ok(())
}

/// Remove at most `max` records past the retention; how many went.
pub fn purge_up_to(
    w: &mut WriteTxn<'_>,
    cfg: &ReplicationConfig,
    max: usize,
) -> Result<usize, StoreError> {
    let keep = match cfg.changelog_days {
        0 => 0,
        _ => cfg.changelog_max_changes,
    };
    w.purge_changes(&cutoff(cfg.changelog_days), keep, max)
}

/// Records older than this (a CSN prefix) have expired.
pub fn cutoff(days: u64) -> String {
    let now = pando_store::clock::now_micros();
    pando_store::clock::csn_floor(now.saturating_sub(days.saturating_mul(86_400_000_000)))
}

fn all_added(e: &Entry) -> Vec<LoggedMod> {
    e.attrs
        .iter()
        .map(|a| LoggedMod {
            op: ModOp::Add,
            desc: a.desc.clone(),
            values: a.values.clone(),
        })
        .collect()
}

/// The modifications that turn `before`'s attributes into `after`'s:
/// per attribute description, the values removed and added, or all its
/// values replaced when that is shorter; a description gone is deleted
/// whole.
pub fn diff(before: &Entry, after: &Entry) -> Vec<LoggedMod> {
    let find = |attrs: &'_ [Attribute], desc: &str| -> Option<usize> {
        attrs.iter().position(|a| a.desc.eq_ignore_ascii_case(desc))
    };
    let mut out = Vec::new();
    // Entries keep their attributes' order through a write: most are found
    // at the same place, equal.
    let same_place =
        |attrs: &'_ [Attribute], i: usize, desc: &str| attrs.get(i).is_some_and(|a| a.desc == desc);
    for (i, b) in before.attrs.iter().enumerate() {
        if same_place(&after.attrs, i, &b.desc) {
            continue;
        }
        if find(&after.attrs, &b.desc).is_none() {
            out.push(LoggedMod {
                op: ModOp::Delete,
                desc: b.desc.clone(),
                values: Vec::new(),
            });
        }
    }
    for (j, a) in after.attrs.iter().enumerate() {
        if same_place(&before.attrs, j, &a.desc) && before.attrs[j].values == a.values {
            continue;
        }
        let i = match same_place(&before.attrs, j, &a.desc) {
            true => Some(j),
            false => find(&before.attrs, &a.desc),
        };
        let Some(i) = i else {
            out.push(LoggedMod {
                op: ModOp::Add,
                desc: a.desc.clone(),
                values: a.values.clone(),
            });
            continue;
        };
        let old = &before.attrs[i].values;
        let removed = minus(old, &a.values);
        let added = minus(&a.values, old);
        if removed.is_empty() && added.is_empty() {
            continue;
        }
        if removed.len() + added.len() >= a.values.len() {
            out.push(LoggedMod {
                op: ModOp::Replace,
                desc: a.desc.clone(),
                values: a.values.clone(),
            });
            continue;
        }
        if !removed.is_empty() {
            out.push(LoggedMod {
                op: ModOp::Delete,
                desc: a.desc.clone(),
                values: removed,
            });
        }
        if !added.is_empty() {
            out.push(LoggedMod {
                op: ModOp::Add,
                desc: a.desc.clone(),
                values: added,
            });
        }
    }
    out
}

/// The values of `xs` not in `ys`, in `xs`'s order. A set for long lists:
/// one member added to a group of 10,000 compares 10,000 values, not 10^8.
fn minus(xs: &[Vec<u8>], ys: &[Vec<u8>]) -> Vec<Vec<u8>> {
    if ys.len() <= 16 {
        return xs.iter().filter(|v| !ys.contains(v)).cloned().collect();
    }
    let ys: std::collections::HashSet<&[u8]> = ys.iter().map(Vec::as_slice).collect();
    xs.iter()
        .filter(|v| !ys.contains(v.as_slice()))
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_model::Dn;

    fn entry(attrs: &[(&str, &[&str])]) -> Entry {
        Entry {
            dn: Dn::parse("cn=x").unwrap(),
            attrs: attrs
                .iter()
                .map(|(d, vs)| Attribute {
                    desc: d.to_string(),
                    values: vs.iter().map(|v| v.as_bytes().to_vec()).collect(),
                })
                .collect(),
        }
    }

    fn m(op: ModOp, desc: &str, values: &[&str]) -> LoggedMod {
        LoggedMod {
            op,
            desc: desc.into(),
            values: values.iter().map(|v| v.as_bytes().to_vec()).collect(),
        }
    }

    #[test]
    fn diff_names_what_changed_and_nothing_else() {
        let members: Vec<String> = (0..10).map(|i| format!("m{i}")).collect();
        let many: Vec<&str> = members.iter().map(String::as_str).collect();
        let mut more = many.clone();
        more.push("m10");
        let before = entry(&[
            ("cn", &["x"]),
            ("description", &["gone"]),
            ("member", &many),
            ("sn", &["old"]),
        ]);
        let after = entry(&[
            ("cn", &["x"]),
            ("member", &more),
            ("sn", &["new"]),
            ("mail", &["x@example.com"]),
        ]);
        assert_eq!(
            diff(&before, &after),
            vec![
                m(ModOp::Delete, "description", &[]),
                m(ModOp::Add, "member", &["m10"]),
                m(ModOp::Replace, "sn", &["new"]),
                m(ModOp::Add, "mail", &["x@example.com"]),
            ]
        );
        assert!(diff(&after, &after).is_empty());
    }

    #[test]
    fn long_value_lists_diff_the_same_through_a_set() {
        let members: Vec<String> = (0..5000).map(|i| format!("uid=u{i}")).collect();
        let many: Vec<&str> = members.iter().map(String::as_str).collect();
        let mut changed: Vec<&str> = many[1..].to_vec();
        changed.push("uid=new");
        let before = entry(&[("member", &many)]);
        let after = entry(&[("member", &changed)]);
        assert_eq!(
            diff(&before, &after),
            vec![
                m(ModOp::Delete, "member", &["uid=u0"]),
                m(ModOp::Add, "member", &["uid=new"]),
            ]
        );
    }
}
