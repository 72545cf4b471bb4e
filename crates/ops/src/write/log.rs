//! Each written entry's record in the store's change log (see
//! `pando_store::LoggedChange`), made in the writer's transaction, and the
//! log's retention.

use pando_model::{Attribute, Entry};
use pando_store::{LoggedChange, LoggedKind, LoggedMod, ModOp, StoreError, WriteTxn};

use super::Change;
use crate::feed::Kind;
use pando_config::ReplicationConfig;

/// On each write, up to this many records past their retention are
/// removed (so they go at least as fast as they come).
const PURGE_PER_WRITE: usize = 16;

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

/// Remove what is past the configured retention (at most a few records:
/// called on every write).
pub(super) fn purge(w: &mut WriteTxn<'_>, cfg: &ReplicationConfig) -> Result<(), StoreError> {
    purge_up_to(w, cfg, PURGE_PER_WRITE).map(|_| ())
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
        let removed: Vec<Vec<u8>> = old
            .iter()
            .filter(|v| !a.values.contains(v))
            .cloned()
            .collect();
        let added: Vec<Vec<u8>> = a
            .values
            .iter()
            .filter(|v| !old.contains(v))
            .cloned()
            .collect();
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
}
