//! Each written entry's record in the store's change log (see
//! `pando_store::LoggedChange`), made in the writer's transaction, and the
//! log's retention.

use std::sync::atomic::{AtomicU64, Ordering};

use pando_model::{Attribute, Entry};
use pando_store::{ChangeToLog, LogValues, LoggedKind, ModOp, ModToLog, StoreError, WriteTxn};

use super::Change;
use crate::feed::Kind;
use pando_config::ReplicationConfig;

/// On each write, up to this many records past their retention are
/// removed (so they go at least as fast as they come).
const PURGE_PER_WRITE: usize = 16;

/// The count bound (`changelog_max_changes`) may be passed by this many
/// records, or a 64th of the bound when that is smaller, before the
/// surplus goes at once (one operation logging many entries, a tree
/// delete, or a small bound). Otherwise the bound is kept on the writes
/// that also check the age ([`AGE_CHECK_EVERY`]). Removing the oldest
/// record on every write, as before, rewrote the front pages of the log
/// and of its change numbers, and the floor, in each commit.
const PURGE_BATCH: u64 = 1024;

/// The age bound (`changelog_days`), which reads the oldest record, is
/// looked at on one write in this many, removing as many records as the
/// writes between would have, and every record over the count bound.
const AGE_CHECK_EVERY: u64 = 64;

/// Writes since the server started (all stores: it only spaces out the
/// age checks).
static WRITES: AtomicU64 = AtomicU64::new(0);

/// Log `c`, the operation's `seq`th entry written (from 0), made by `by`
/// (the requester's DN; "" for a received change). The record is encoded
/// from the entries the change holds, nothing copied first.
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
    let (dn, old_dn, uuid) = (c.entry().dn.to_string(), c.previous_dn(), c.uuid());
    w.log(&ChangeToLog {
        csn,
        seq,
        kind,
        uuid: &uuid,
        dn: &dn,
        old_dn: old_dn.as_deref(),
        mods,
        by,
    })
}

fn before_entry(c: &Change) -> &Entry {
    c.before.as_ref().map_or(c.entry(), |b| &b.entry)
}

/// Remove what is past the configured retention (called on every write):
/// on one write in [`AGE_CHECK_EVERY`], records past their age and over
/// the count; on the others, records over the count only once they pass
/// it by its slack ([`PURGE_BATCH`]).
pub(super) fn purge(w: &mut WriteTxn<'_>, cfg: &ReplicationConfig) -> Result<(), StoreError> {
    let age_check = WRITES
        .fetch_add(1, Ordering::Relaxed)
        .is_multiple_of(AGE_CHECK_EVERY);
    if age_check || cfg.changelog_days == 0 {
        return purge_up_to(w, cfg, PURGE_PER_WRITE * AGE_CHECK_EVERY as usize).map(|_| ());
    }
    let max = cfg.changelog_max_changes;
    let slack = (max / 64).min(PURGE_BATCH);
    let len = w.view().changelog_len()?;
    if len > max.saturating_add(slack) {
        let over = (len - max).min(PURGE_BATCH + PURGE_PER_WRITE as u64);
        purge_up_to(w, cfg, over as usize)?;
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

fn all_added(e: &Entry) -> Vec<ModToLog<'_>> {
    e.attrs
        .iter()
        .map(|a| ModToLog {
            op: ModOp::Add,
            desc: &a.desc,
            values: LogValues::All(&a.values),
        })
        .collect()
}

/// The modifications that turn `before`'s attributes into `after`'s:
/// per attribute description, the values removed and added, or all its
/// values replaced when that is shorter; a description gone is deleted
/// whole. Borrowed from the two entries.
pub fn diff<'a>(before: &'a Entry, after: &'a Entry) -> Vec<ModToLog<'a>> {
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
            out.push(ModToLog {
                op: ModOp::Delete,
                desc: &b.desc,
                values: LogValues::Picked(Vec::new()),
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
            out.push(ModToLog {
                op: ModOp::Add,
                desc: &a.desc,
                values: LogValues::All(&a.values),
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
            out.push(ModToLog {
                op: ModOp::Replace,
                desc: &a.desc,
                values: LogValues::All(&a.values),
            });
            continue;
        }
        for (op, values) in [(ModOp::Delete, removed), (ModOp::Add, added)] {
            if !values.is_empty() {
                out.push(ModToLog {
                    op,
                    desc: &a.desc,
                    values: LogValues::Picked(values),
                });
            }
        }
    }
    out
}

/// The values of `xs` not in `ys`, in `xs`'s order. A set for long lists:
/// one member added to a group of 10,000 compares 10,000 values, not 10^8.
fn minus<'a>(xs: &'a [Vec<u8>], ys: &[Vec<u8>]) -> Vec<&'a [u8]> {
    if ys.len() <= 16 {
        return xs
            .iter()
            .filter(|v| !ys.contains(v))
            .map(Vec::as_slice)
            .collect();
    }
    let ys: std::collections::HashSet<&[u8]> = ys.iter().map(Vec::as_slice).collect();
    xs.iter()
        .map(Vec::as_slice)
        .filter(|v| !ys.contains(v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use pando_model::Dn;
    use pando_store::LoggedMod;

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

    fn logged(mods: Vec<ModToLog<'_>>) -> Vec<LoggedMod> {
        mods.iter().map(ModToLog::to_logged).collect()
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
            logged(diff(&before, &after)),
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
            logged(diff(&before, &after)),
            vec![
                m(ModOp::Delete, "member", &["uid=u0"]),
                m(ModOp::Add, "member", &["uid=new"]),
            ]
        );
    }

    /// The count bound is kept in batches: over 1,000 writes past a full
    /// log of 640 records (slack 10), the log never holds more than the
    /// bound and its slack, always keeps the newest records, its floor
    /// covers what went, and the front of the log is rewritten on about
    /// one write in 11 (every write before).
    #[test]
    fn the_count_bound_is_kept_in_batches() {
        use pando_store::{LoggedChange, Store, StoreOptions};
        let dir = tempfile::tempdir().unwrap();
        let schema = std::sync::Arc::new(pando_model::Schema::standard());
        let opts = StoreOptions {
            durability: pando_store::Durability::None,
            ..StoreOptions::default()
        };
        let store = Store::open(dir.path(), schema, &opts).unwrap();
        let cfg = ReplicationConfig {
            changelog_max_changes: 640,
            ..ReplicationConfig::default()
        };
        let day = pando_store::clock::csn_floor(pando_store::clock::now_micros());
        let record = move |i: u32| LoggedChange {
            csn: format!("{day}.000000Z#{i:06x}#000#000000"),
            seq: 0,
            kind: LoggedKind::Modify,
            uuid: format!("uuid-{i}"),
            dn: format!("cn=e{i}"),
            old_dn: None,
            mods: Vec::new(),
            by: String::new(),
        };
        let (mut purges, mut last_len) = (0, 0);
        for i in 0..1640u32 {
            let (c, cfg) = (record(i), cfg.clone());
            let len = store
                .write_blocking(move |w| {
                    w.log_change(&c)?;
                    purge(w, &cfg)?;
                    w.view().changelog_len()
                })
                .unwrap();
            assert!(len <= 640 + 10, "{len} records after write {i}");
            if len < last_len + 1 {
                purges += 1;
                assert!(len >= 640, "purged below the bound: {len}");
            }
            last_len = len;
        }
        assert!(purges <= 1000 / 11 + 1000 / 64 + 2, "{purges} purges");
        assert!(purges >= 1000 / 65, "{purges} purges");
        let r = store.read().unwrap();
        let v = r.view();
        let oldest = v.changes_after("").unwrap().next().unwrap().unwrap();
        let newest = v.changes_at(&record(1639).csn).unwrap();
        assert_eq!(newest.len(), 1);
        let first_kept: u32 = oldest.dn[4..].parse().unwrap();
        assert_eq!(first_kept as u64, 1640 - v.changelog_len().unwrap());
        assert!(v.changelog_floor().unwrap() >= record(first_kept - 1).csn);
    }
}
