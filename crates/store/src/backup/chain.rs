//! A chain of backups (a full one, then incrementals each naming the one
//! before), checked link by link, and restored whole or up to a point.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use pando_model::Schema;

use super::incremental::{parent_dir, store_owned, Item, Records};
use super::replay::{self, ReplayError};
use super::{check_link, exchange, sha256_file, sync_dir, Kind, Manifest, CHANGES_FILE, DATA_FILE};
use crate::{IndexKind, IndexSpec, LoggedChange, Store, StoreError, StoreOptions};

/// Longest chain followed (a loop of links is refused, not followed).
const MAX_LINKS: usize = 10_000;
/// Records applied in one write transaction of a restore.
const BATCH: usize = 1024;

/// How far a restore goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Until {
    /// Everything the chain holds.
    End,
    /// Changes with a CSN at or before this one (point in time).
    Csn(String),
}

impl Until {
    /// Up to and including change `csn` (checked for form).
    pub fn csn(csn: &str) -> Result<Until, String> {
        crate::clock::parse_csn(csn).map_err(|e| format!("--to-csn: {e}"))?;
        Ok(Until::Csn(csn.to_string()))
    }

    /// Up to and including every change made at `time`: GeneralizedTime
    /// (`20261130120000Z`, fractions allowed) or RFC 3339 in UTC
    /// (`2026-11-30T12:00:00Z`).
    pub fn time(time: &str) -> Result<Until, String> {
        let bad = || {
            format!(
                "{time:?} is not a UTC time: give YYYYmmddHHMMSSZ (e.g. 20261130120000Z) or YYYY-mm-ddTHH:MM:SSZ"
            )
        };
        let compact: String = time
            .chars()
            .filter(|c| !matches!(c, '-' | ':' | 'T'))
            .collect();
        let body = compact.strip_suffix('Z').ok_or_else(bad)?;
        let (secs, frac) = body.split_once('.').unwrap_or((body, ""));
        let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
        if secs.len() != 14 || !digits(secs) || frac.len() > 6 || !digits(frac) {
            return Err(bad());
        }
        // The last CSN of that time: every CSN of the time (any counter,
        // server ID and modification number) sorts at or before it. A time
        // to the second takes in the whole second.
        let micros = match frac {
            "" => "999999".to_string(),
            f => format!("{f:0<6}"),
        };
        Ok(Until::Csn(format!("{secs}.{micros}Z#~")))
    }

    fn includes(&self, csn: &str) -> bool {
        match self {
            Until::End => true,
            Until::Csn(bound) => csn <= bound.as_str(),
        }
    }
}

/// One backup of a chain, checked.
#[derive(Debug, Clone)]
pub struct Link {
    pub dir: PathBuf,
    pub manifest: Manifest,
}

/// The chain ending with the backup in `src`, full backup first, every
/// link checked: each data file against its manifest, each parent's
/// manifest against what its child recorded of it. An error names the
/// link that fails.
pub fn chain(src: &Path) -> Result<Vec<Link>, String> {
    let mut links: Vec<Link> = Vec::new();
    let mut dir = src.to_path_buf();
    loop {
        let child = links.last();
        let (m, manifest_sha) = match check_link(&dir) {
            Ok(found) => found,
            Err(e) => {
                return Err(match child {
                    Some(c) => format!(
                        "{e}\n{} is the parent of {}: the chain is broken there",
                        dir.display(),
                        c.dir.display()
                    ),
                    None => e,
                })
            }
        };
        if let Some(link) = child.and_then(|c| c.manifest.parent.as_ref()) {
            if link.manifest_sha256 != manifest_sha || link.context_csns != m.context_csns {
                return Err(format!(
                    "{}: not the backup {} was made from (its manifest's sha256 is {manifest_sha}, {} recorded {}): the chain is broken there",
                    dir.display(),
                    links[links.len() - 1].dir.display(),
                    links[links.len() - 1].dir.display(),
                    link.manifest_sha256
                ));
            }
        }
        let next = m.parent.as_ref().map(|p| parent_dir(&dir, p));
        links.push(Link { dir, manifest: m });
        match next {
            None => break,
            Some(_) if links.len() >= MAX_LINKS => {
                return Err(format!(
                    "{}: more than {MAX_LINKS} backups in the chain (a loop of links?)",
                    src.display()
                ))
            }
            Some(p) if !p.join(super::MANIFEST).exists() => {
                return Err(format!(
                    "{}: its parent backup {} is missing: the chain cannot be restored (restore the last complete part, or take a full backup)",
                    links[links.len() - 1].dir.display(),
                    p.display()
                ))
            }
            Some(p) => dir = p,
        }
    }
    links.reverse();
    Ok(links)
}

/// What a restore did.
#[derive(Debug, Clone)]
pub struct Restored {
    /// The chain's backups, full first, and how many of them were applied
    /// (the last one maybe only in part).
    pub links: Vec<Link>,
    pub applied_links: usize,
    /// Change records replayed.
    pub changes: u64,
    /// The newest change restored (None: the full backup had none).
    pub newest_csn: Option<String>,
    pub entries: u64,
}

/// Replace the store of the (stopped) server in `data_dir` with the chain
/// ending at `src`, up to `until`. The caller holds the data directory
/// lock. Nothing is replaced unless every link checks and every record
/// applies: the store is built beside the old one and exchanged with it
/// in one rename (`RENAME_EXCHANGE`).
pub fn restore(
    src: &Path,
    data_dir: &Path,
    schema: Arc<Schema>,
    opts: &StoreOptions,
    until: &Until,
) -> Result<Restored, String> {
    let db = crate::datadir::store_dir(data_dir);
    let staging = data_dir.join("db.restoring");
    let r = build(src, &staging, schema, opts, until);
    if r.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    let restored = r?;
    if db.exists() {
        exchange(&staging, &db)?;
    } else {
        std::fs::rename(&staging, &db)
            .map_err(|e| format!("cannot move {} into place: {e}", staging.display()))?;
    }
    sync_dir(data_dir)?;
    // After an exchange the replaced store is under the staging name.
    let _ = std::fs::remove_dir_all(&staging);
    Ok(restored)
}

/// Build the store the chain ending at `src` holds (up to `until`) in the
/// new directory `dir`.
pub fn build(
    src: &Path,
    dir: &Path,
    schema: Arc<Schema>,
    opts: &StoreOptions,
    until: &Until,
) -> Result<Restored, String> {
    let links = chain(src)?;
    check_bounds(&links, until)?;
    let _ = std::fs::remove_dir_all(dir);
    crate::datadir::private_dir(dir)?;
    let full = &links[0];
    let staged = dir.join(DATA_FILE);
    std::fs::copy(full.dir.join(DATA_FILE), &staged)
        .map_err(|e| format!("copy to {} failed: {e}", staged.display()))?;
    std::fs::File::open(&staged)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("{}: {e}", staged.display()))?;
    // The copy is checked again where it landed before it is used.
    let (sha, _) = sha256_file(&staged)?;
    if sha != full.manifest.sha256 {
        return Err(format!(
            "{}: the copied file does not match the backup's checksum",
            staged.display()
        ));
    }
    // Opened with the indexes the backup keeps (whatever the configuration
    // says: the server reconciles them when it starts), written without
    // syncs but synced at the end, its pages already checked by checksum.
    let opts = StoreOptions {
        durability: crate::Durability::None,
        indexes: kept_indexes(dir, &opts.indexes)?,
        check_all_pages: false,
        ..opts.clone()
    };
    let store = Store::open(dir, schema, &opts).map_err(|e| format!("{}: {e}", dir.display()))?;
    let replayed = replay_links(&store, &links[1..], until);
    let counted = store
        .write_blocking(|w| w.count_unlogged_write())
        .map_err(|e| e.to_string());
    let entries = store
        .read()
        .and_then(|r| r.view().entry_count())
        .map_err(|e| e.to_string());
    let synced = store.sync().map_err(|e| e.to_string());
    store.close();
    let (applied, changes, newest) = replayed?;
    counted?;
    synced?;
    let _ = std::fs::remove_file(dir.join("lock.mdb"));
    sync_dir(dir)?;
    Ok(Restored {
        newest_csn: newest.or_else(|| full.manifest.context_csn.clone()),
        applied_links: 1 + applied,
        links,
        changes,
        entries: entries?,
    })
}

/// The indexes the store in `dir` keeps (`meta:indexes`), so that opening
/// it to replay changes neither empties nor builds one; for a store from
/// before that list, `configured`.
fn kept_indexes(dir: &Path, configured: &[IndexSpec]) -> Result<Vec<IndexSpec>, String> {
    let found =
        Store::peek_meta(dir, &["indexes"]).map_err(|e| format!("{}: {e}", dir.display()))?;
    let Some(list) = found.and_then(|v| v.into_iter().next().flatten()) else {
        return Ok(configured.to_vec());
    };
    let mut specs: Vec<IndexSpec> = Vec::new();
    for name in crate::parse_listed(&list) {
        let Some((attr, kind)) = name.strip_prefix("ix:").and_then(|n| n.rsplit_once(':')) else {
            continue;
        };
        let kind: IndexKind = kind.parse()?;
        match specs.iter_mut().find(|s| s.attr == attr) {
            Some(s) => s.kinds.push(kind),
            None => specs.push(IndexSpec {
                attr: attr.to_string(),
                kinds: vec![kind],
            }),
        }
    }
    Ok(specs)
}

/// A point in time must be inside the chain: not before what the full
/// backup already holds, not after the last backup.
fn check_bounds(links: &[Link], until: &Until) -> Result<(), String> {
    let Until::Csn(bound) = until else {
        return Ok(());
    };
    let (first, last) = (&links[0], &links[links.len() - 1]);
    if let Some(held) = first
        .manifest
        .context_csn
        .as_deref()
        .filter(|h| *h > bound.as_str())
    {
        return Err(format!(
            "{} (the chain's full backup) already holds changes up to {held}: the chain restores to that point or later, not to {}",
            first.dir.display(),
            shown(bound)
        ));
    }
    // What the last backup shows is the state until it was made.
    let known = format!("{}.999999Z#~", last.manifest.created.trim_end_matches('Z'));
    if bound.as_str() > known.as_str() {
        return Err(format!(
            "the chain ends with {}, made {}: nothing after it is known, so it cannot restore to {}",
            last.dir.display(),
            last.manifest.created,
            shown(bound)
        ));
    }
    Ok(())
}

fn shown(bound: &str) -> &str {
    bound.strip_suffix("#~").unwrap_or(bound)
}

/// Replay the incrementals in order up to `until`: how many were applied
/// (the last maybe in part), how many records, the newest CSN applied.
fn replay_links(
    store: &Store,
    links: &[Link],
    until: &Until,
) -> Result<(usize, u64, Option<String>), String> {
    let (mut applied, mut changes, mut newest) = (0, 0u64, None);
    for link in links {
        debug_assert_eq!(link.manifest.kind, Kind::Incremental);
        let (n, last, whole) = replay_one(store, link, until)?;
        applied += 1;
        changes += n;
        newest = last.or(newest);
        if !whole {
            break;
        }
    }
    Ok((applied, changes, newest))
}

/// Replay one incremental; whole = it was applied entirely (its server
/// state too), not cut short by `until`.
fn replay_one(
    store: &Store,
    link: &Link,
    until: &Until,
) -> Result<(u64, Option<String>, bool), String> {
    let path = link.dir.join(CHANGES_FILE);
    let mut records = Records::open(&path)?;
    let (mut batch, mut metas) = (Vec::new(), Vec::new());
    let (mut count, mut newest) = (0u64, None);
    loop {
        match records.next_item()? {
            Item::Change(k, v) => {
                let c = crate::changelog::decode(&k, &v)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                if !until.includes(&c.csn) {
                    apply_batch(store, &path, std::mem::take(&mut batch))?;
                    return Ok((count, newest, false));
                }
                count += 1;
                newest = Some(c.csn.clone());
                batch.push(c);
                if batch.len() == BATCH {
                    apply_batch(store, &path, std::mem::take(&mut batch))?;
                }
            }
            Item::Meta(k, v) => metas.push((k, v)),
            Item::End(changes, kept) if changes != count || kept != metas.len() as u64 => {
                return Err(format!(
                    "{}: holds {count} changes and {} state records, its end says {changes} and {kept}",
                    path.display(),
                    metas.len()
                ))
            }
            Item::End(..) => break,
        }
    }
    apply_batch(store, &path, batch)?;
    if count != link.manifest.changes {
        return Err(format!(
            "{}: holds {count} changes, its manifest says {}",
            path.display(),
            link.manifest.changes
        ));
    }
    set_state(store, metas).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok((count, newest, true))
}

fn apply_batch(store: &Store, path: &Path, batch: Vec<LoggedChange>) -> Result<(), String> {
    if batch.is_empty() {
        return Ok(());
    }
    store
        .write_blocking(move |w| -> Result<(), ReplayError> {
            for c in &batch {
                replay::apply(w, c)?;
            }
            Ok(())
        })
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// The server's state kept beside the entries becomes the backup's: meta
/// records other than the store's own (see `STORE_OWNED`).
fn set_state(store: &Store, metas: Vec<(Vec<u8>, Vec<u8>)>) -> Result<(), StoreError> {
    store.write_blocking(move |w| {
        let mut gone = Vec::new();
        for item in w.inner.meta.iter(&w.txn)? {
            let (k, _) = item?;
            if !store_owned(k) {
                gone.push(k.to_vec());
            }
        }
        for k in gone {
            w.inner.meta.delete(&mut w.txn, &k)?;
        }
        for (k, v) in &metas {
            w.inner.meta.put(&mut w.txn, k, v)?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Opening a backup to replay changes keeps its indexes whatever the
    /// configuration the restore runs with lists (none here): it neither
    /// empties nor builds one.
    #[test]
    fn a_restore_keeps_the_indexes_the_backup_has() {
        let dir = tempfile::tempdir().unwrap();
        let schema = Arc::new(Schema::standard());
        let spec = |attr: &str, kinds: &[IndexKind]| IndexSpec {
            attr: attr.into(),
            kinds: kinds.to_vec(),
        };
        let indexes = vec![
            spec("uid", &[IndexKind::Eq]),
            spec("cn", &[IndexKind::Eq, IndexKind::Sub]),
        ];
        let opts = StoreOptions {
            indexes: indexes.clone(),
            ..StoreOptions::default()
        };
        Store::open(dir.path(), schema, &opts).unwrap().close();
        let mut kept = kept_indexes(dir.path(), &[]).unwrap();
        kept.sort_by(|a, b| a.attr.cmp(&b.attr));
        let mut want = indexes;
        want.sort_by(|a, b| a.attr.cmp(&b.attr));
        for s in kept.iter_mut().chain(want.iter_mut()) {
            s.kinds.sort_by_key(|k| k.as_str());
        }
        assert_eq!(kept, want);
    }

    #[test]
    fn a_time_takes_in_its_whole_second_and_a_fraction_is_exact() {
        let Until::Csn(b) = Until::time("2026-11-30T12:00:00Z").unwrap() else {
            panic!()
        };
        assert!(Until::Csn(b.clone()).includes("20261130120000.999999Z#00000f#001#000000"));
        assert!(!Until::Csn(b).includes("20261130120001.000000Z#000000#001#000000"));
        let Until::Csn(b) = Until::time("20261130120000.5Z").unwrap() else {
            panic!()
        };
        assert!(Until::Csn(b.clone()).includes("20261130120000.500000Z#000003#002#000000"));
        assert!(!Until::Csn(b).includes("20261130120000.500001Z#000000#001#000000"));
        for bad in [
            "yesterday",
            "20261130120000",
            "2026113012000Z",
            "20261130120000.1234567Z",
        ] {
            assert!(Until::time(bad).is_err(), "{bad}");
        }
        assert!(Until::csn("20261130120000.000000Z#000000#001#000000").is_ok());
        assert!(Until::csn("20261130").is_err());
    }
}
