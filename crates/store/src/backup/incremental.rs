//! Incremental backups: what was committed since a parent backup, taken
//! from the change log in one read transaction.
//!
//! `changes.zst` is one zstd stream holding:
//!
//! ```text
//! magic      "pando-incremental 1\n"
//! records    tag (1 byte), key length (LEB128), key, value length (LEB128), value
//!              tag 1: a change log record, as the log stores it, in key order
//!              tag 2: a meta record (the server's state kept beside the entries)
//! end        tag 0, then the count of change records and of meta records (LEB128)
//! ```
//!
//! The parent's context CSNs say where the incremental starts: per server
//! ID, the records with a greater CSN. It is exact when nothing the parent
//! holds is missing from the log since: the count of writes made around
//! the log (refresh, import, restore) must be the parent's, the log's
//! floor (raised by purging) must be at or below every parent position,
//! and a server ID the parent had not seen needs a log never purged.
//! Otherwise the backup is refused with the reason: a full one is needed.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use pando_model::Schema;

use super::{begin, finish, read_manifest, BackupReport, Kind, Manifest, ParentLink};
use crate::entry_codec::put_varint;
use crate::{csn_sid, Store, StoreError, StoreOptions, View};

pub(crate) const MAGIC: &[u8] = b"pando-incremental 1\n";
pub(crate) const TAG_END: u8 = 0;
pub(crate) const TAG_CHANGE: u8 = 1;
pub(crate) const TAG_META: u8 = 2;
/// No record of a backup is this long (a PDU is capped far below): a
/// longer length means damage, not a reason to allocate.
const MAX_RECORD: u64 = 1 << 30;

/// Meta records that belong to one store's files, not to the server's
/// state: an incremental does not carry them, and a restore keeps the
/// restored store's own (a key ending in ':' is a prefix).
pub const STORE_OWNED: &[&str] = &[
    "format",
    "next_id",
    "indexes",
    "indexes.dropped",
    "zstd_dict_current",
    "zstd_dict:",
    "zstd_dict_split:",
    "changelog_floor",
    "changelog_unlogged",
    "changenumber_next",
    "changenumbers_off",
    "import_in_progress",
];

pub(crate) fn store_owned(key: &[u8]) -> bool {
    STORE_OWNED.iter().any(|k| match k.strip_suffix(':') {
        Some(_) => key.starts_with(k.as_bytes()),
        None => key == k.as_bytes(),
    })
}

/// Back up what the store in `store_dir` committed since the backup in
/// `parent`, into the new directory `dest`, from another process (the
/// server may be running).
pub fn incremental(
    store_dir: &Path,
    dest: &Path,
    parent: &Path,
    schema: Arc<Schema>,
    opts: &StoreOptions,
) -> Result<BackupReport, String> {
    super::fresh(dest)?;
    let store = Store::open_read_only(store_dir, schema, opts)
        .map_err(|e| format!("{}: {e}", store_dir.display()))?;
    let r = incremental_store(&store, dest, parent);
    store.close();
    r
}

/// [`incremental`] of an open store.
pub fn incremental_store(
    store: &Store,
    dest: &Path,
    parent: &Path,
) -> Result<BackupReport, String> {
    let started = Instant::now();
    let (pm, parent_sha) = read_manifest(parent)?;
    let Some(parent_unlogged) = pm.unlogged_writes else {
        return Err(format!(
            "{}: a backup made by Pando before version 2 of the backup format cannot be the parent of an incremental one; take a full backup",
            parent.display()
        ));
    };
    let partial = begin(dest)?;
    let built = (|| {
        let r = store.read().map_err(|e| e.to_string())?;
        let v = r.view();
        let from = starting_points(&v, &pm, parent_unlogged)?;
        let mut m = super::describe(&v).map_err(|e| e.to_string())?;
        m.kind = Kind::Incremental;
        m.parent = Some(ParentLink {
            path: link_path(parent, dest)?,
            manifest_sha256: parent_sha,
            context_csns: pm.context_csns.clone(),
        });
        m.changes = write_changes(&v, &from, &partial.join(super::CHANGES_FILE))?;
        Ok::<Manifest, String>(m)
    })();
    let mut m = match built {
        Ok(m) => m,
        Err(e) => {
            let _ = std::fs::remove_dir_all(&partial);
            return Err(e);
        }
    };
    let manifest = finish(&partial, dest, &mut m)?;
    Ok(BackupReport {
        manifest,
        dest: dest.to_path_buf(),
        copy_secs: 0.0,
        total_secs: started.elapsed().as_secs_f64(),
    })
}

/// Where an incremental takes the log's records from: per server ID the
/// CSN after which it takes them (an ID not listed, from its start), and
/// where the log is read from (the smallest of those CSNs, or its start
/// when the store has changes of an ID the parent had none of).
struct Since {
    after: BTreeMap<u16, String>,
    scan: String,
}

/// [`Since`], once the log is known to hold every change made since the
/// parent.
fn starting_points(v: &View<'_>, parent: &Manifest, parent_unlogged: u64) -> Result<Since, String> {
    let e = |e: StoreError| e.to_string();
    let unlogged = v.unlogged_writes().map_err(e)?;
    if unlogged != parent_unlogged {
        return Err(format!(
            "entries were written around the change log since the parent backup ({} time(s): a refresh from a provider, an import or a restore): an incremental backup would miss them; take a full backup",
            unlogged.saturating_sub(parent_unlogged).max(1)
        ));
    }
    let mut from = BTreeMap::new();
    for csn in &parent.context_csns {
        let sid =
            csn_sid(csn).ok_or_else(|| format!("the parent's context CSN {csn:?} is not a CSN"))?;
        from.insert(sid, csn.clone());
    }
    let live: BTreeMap<u16, String> = v
        .context_csns()
        .map_err(e)?
        .into_iter()
        .filter_map(|c| Some((csn_sid(&c)?, c)))
        .collect();
    for (sid, csn) in &from {
        if live.get(sid).is_none_or(|l| l < csn) {
            return Err(format!(
                "the parent backup holds changes of server ID {sid} up to {csn}, newer than this store's ({}): the parent is not a backup of this store",
                live.get(sid).map_or("none", String::as_str)
            ));
        }
    }
    let floor = v.changelog_floor().map_err(e)?;
    if let Some(oldest) = from.values().min().filter(|m| floor.as_str() > m.as_str()) {
        return Err(format!(
            "the change log no longer reaches back to the parent backup (it holds changes after {floor}, the parent ends at {oldest}: purged by changelog_max_changes or changelog_days); take a full backup"
        ));
    }
    let new_sid = live.keys().find(|s| !from.contains_key(s));
    if let Some(sid) = new_sid {
        if !floor.is_empty() {
            return Err(format!(
                "server ID {sid} has changes here that the parent backup has none of, and the change log was purged (it holds changes after {floor}): some of them may be gone; take a full backup"
            ));
        }
    }
    let scan = match new_sid {
        Some(_) => String::new(),
        None => from.values().min().cloned().unwrap_or_default(),
    };
    Ok(Since { after: from, scan })
}

/// The parent's path as the incremental records it: its name when both
/// are in one directory, else absolute.
fn link_path(parent: &Path, dest: &Path) -> Result<String, String> {
    let abs = |p: &Path| -> Result<PathBuf, String> {
        std::path::absolute(p).map_err(|e| format!("{}: {e}", p.display()))
    };
    let (parent_abs, dest_abs) = (abs(parent)?, abs(dest)?);
    if parent_abs.parent() == dest_abs.parent() {
        if let Some(name) = parent_abs.file_name() {
            return Ok(name.to_string_lossy().into_owned());
        }
    }
    Ok(parent_abs.to_string_lossy().into_owned())
}

/// Where the parent named in an incremental in `dir` is.
pub(crate) fn parent_dir(dir: &Path, link: &ParentLink) -> PathBuf {
    let p = Path::new(&link.path);
    match p.is_absolute() {
        true => p.to_path_buf(),
        false => super::parent_of(dir).join(p),
    }
}

/// Write `changes.zst`: the log's records past `from`, then the meta
/// records. Returns how many change records it holds.
fn write_changes(v: &View<'_>, from: &Since, path: &Path) -> Result<u64, String> {
    let io = |e: std::io::Error| format!("{}: {e}", path.display());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(io)?;
    let mut z = zstd::stream::Encoder::new(std::io::BufWriter::with_capacity(1 << 20, file), 3)
        .map_err(io)?;
    z.write_all(MAGIC).map_err(io)?;
    let mut buf = Vec::new();
    let (mut changes, mut metas) = (0u64, 0u64);
    for item in v.raw_changes_after(&from.scan).map_err(|e| e.to_string())? {
        let (k, val) = item.map_err(|e| e.to_string())?;
        let csn = std::str::from_utf8(&k[..k.iter().position(|&b| b == 0).unwrap_or(k.len())])
            .unwrap_or("");
        let past = match csn_sid(csn).and_then(|sid| from.after.get(&sid)) {
            Some(seen) => csn > seen.as_str(),
            None => true,
        };
        if past {
            record(&mut buf, TAG_CHANGE, k, val);
            z.write_all(&buf).map_err(io)?;
            changes += 1;
        }
    }
    for item in v.inner.meta.iter(v.txn).map_err(|e| e.to_string())? {
        let (k, val) = item.map_err(|e| e.to_string())?;
        if !store_owned(k) {
            record(&mut buf, TAG_META, k, val);
            z.write_all(&buf).map_err(io)?;
            metas += 1;
        }
    }
    buf.clear();
    buf.push(TAG_END);
    put_varint(&mut buf, changes);
    put_varint(&mut buf, metas);
    z.write_all(&buf).map_err(io)?;
    let mut w = z.finish().map_err(io)?;
    w.flush().map_err(io)?;
    w.get_ref().sync_all().map_err(io)?;
    Ok(changes)
}

fn record(buf: &mut Vec<u8>, tag: u8, k: &[u8], v: &[u8]) {
    buf.clear();
    buf.push(tag);
    put_varint(buf, k.len() as u64);
    buf.extend_from_slice(k);
    put_varint(buf, v.len() as u64);
    buf.extend_from_slice(v);
}

/// One record read back from `changes.zst`.
pub(crate) enum Item {
    Change(Vec<u8>, Vec<u8>),
    Meta(Vec<u8>, Vec<u8>),
    /// The end, with the counts it states.
    End(u64, u64),
}

/// Reads `changes.zst` (whose checksum was checked) record by record.
pub(crate) struct Records<R: Read> {
    r: R,
    what: String,
}

impl Records<zstd::stream::Decoder<'static, std::io::BufReader<std::fs::File>>> {
    pub(crate) fn open(path: &Path) -> Result<Self, String> {
        let f = std::fs::File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
        let r = zstd::stream::Decoder::new(f).map_err(|e| format!("{}: {e}", path.display()))?;
        let mut records = Records {
            r,
            what: path.display().to_string(),
        };
        let mut magic = vec![0u8; MAGIC.len()];
        records.fill(&mut magic)?;
        if magic != MAGIC {
            return Err(format!(
                "{}: not an incremental backup's records",
                records.what
            ));
        }
        Ok(records)
    }
}

impl<R: Read> Records<R> {
    fn fill(&mut self, buf: &mut [u8]) -> Result<(), String> {
        self.r
            .read_exact(buf)
            .map_err(|e| format!("{}: {e} (the records end early)", self.what))
    }

    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let mut b = [0u8];
            self.fill(&mut b)?;
            v |= u64::from(b[0] & 0x7f) << shift;
            if b[0] & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err(format!("{}: a malformed length", self.what))
    }

    fn field(&mut self) -> Result<Vec<u8>, String> {
        let n = self.varint()?;
        if n > MAX_RECORD {
            return Err(format!("{}: a record of {n} bytes (damaged?)", self.what));
        }
        let mut b = vec![0u8; n as usize];
        self.fill(&mut b)?;
        Ok(b)
    }

    pub(crate) fn next_item(&mut self) -> Result<Item, String> {
        let mut tag = [0u8];
        self.fill(&mut tag)?;
        Ok(match tag[0] {
            TAG_END => Item::End(self.varint()?, self.varint()?),
            TAG_CHANGE => Item::Change(self.field()?, self.field()?),
            TAG_META => Item::Meta(self.field()?, self.field()?),
            t => return Err(format!("{}: unknown record tag {t}", self.what)),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_owned_keys_are_kept_apart_from_the_servers_state() {
        for k in [
            "format",
            "next_id",
            "zstd_dict:3",
            "zstd_dict_split:3",
            "changelog_floor",
            "indexes",
        ] {
            assert!(store_owned(k.as_bytes()), "{k}");
        }
        for k in [
            "config",
            "context_csn:001",
            "tomb:x",
            "syncrepl:001",
            "push:001",
            "formats",
        ] {
            assert!(!store_owned(k.as_bytes()), "{k}");
        }
    }

    #[test]
    fn records_read_back_as_written_and_a_cut_is_an_error() {
        let mut raw = Vec::new();
        raw.extend_from_slice(MAGIC);
        let mut buf = Vec::new();
        record(&mut buf, TAG_CHANGE, b"k1", b"v1");
        raw.extend_from_slice(&buf);
        record(&mut buf, TAG_META, b"config", &[7u8; 300]);
        raw.extend_from_slice(&buf);
        raw.push(TAG_END);
        put_varint(&mut raw, 1);
        put_varint(&mut raw, 1);
        let mut r = Records {
            r: &raw[MAGIC.len()..],
            what: "t".into(),
        };
        assert!(matches!(r.next_item().unwrap(), Item::Change(k, v) if k == b"k1" && v == b"v1"));
        assert!(
            matches!(r.next_item().unwrap(), Item::Meta(k, v) if k == b"config" && v.len() == 300)
        );
        assert!(matches!(r.next_item().unwrap(), Item::End(1, 1)));
        let cut = &raw[MAGIC.len()..raw.len() - 200];
        let mut r = Records {
            r: cut,
            what: "t".into(),
        };
        r.next_item().unwrap();
        assert!(matches!(r.next_item(), Err(e) if e.contains("end early")));
    }
}
