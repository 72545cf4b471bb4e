//! Hot backups, incremental backups, and restoring them.
//!
//! A **full** backup is a directory holding `data.mdb` — a compacted LMDB
//! copy made from one read transaction, so it is consistent while the
//! server keeps serving reads and writes — and `manifest.toml`, which says
//! what it holds and carries the copy's SHA-256.
//!
//! An **incremental** backup ([`incremental`]) holds `changes.zst`: the
//! change log's records committed since its parent (another backup, full
//! or incremental), per server ID past the parent's context CSN, and the
//! server's state kept beside the entries (its stored configuration,
//! replication cookies and positions, tombstones; see
//! [`incremental::STORE_OWNED`] for what is not copied). Its manifest names
//! the parent (its path, relative when they share a directory, and the
//! SHA-256 of the parent's manifest) and the parent's context CSNs.
//!
//! A **chain** is a full backup and the incrementals after it, each naming
//! the one before. [`chain::restore`] checks every link before it touches
//! anything (each file against its manifest, each manifest against the
//! child's record of it), builds the store beside the old one by copying
//! the full backup and replaying each incremental's records through the
//! store (optionally only up to a CSN: point-in-time restore), and puts it
//! in place in one rename.

use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::{Store, StoreOptions, FORMAT_VERSION, OLDEST_FORMAT};
use pando_model::Schema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

pub mod chain;
pub mod incremental;
mod replay;

pub use chain::{restore, Until};
pub use incremental::incremental;

/// Version of the backup layout (this directory and its manifest). 2:
/// incremental backups, and the count of writes around the change log in
/// every manifest; format 1 backups (full only) still restore.
pub const BACKUP_FORMAT: u32 = 2;
pub const MANIFEST: &str = "manifest.toml";
pub const DATA_FILE: &str = "data.mdb";
/// An incremental backup's records.
pub const CHANGES_FILE: &str = "changes.zst";

/// What a backup directory holds.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
pub enum Kind {
    /// The whole store (`data.mdb`).
    #[default]
    Full,
    /// What changed since its parent (`changes.zst`).
    Incremental,
}

/// The backup an incremental follows.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ParentLink {
    /// Its directory: relative to the incremental's own directory's
    /// parent when it is given relative, else absolute.
    pub path: String,
    /// SHA-256 of its `manifest.toml`.
    pub manifest_sha256: String,
    /// Its context CSNs: the incremental holds the changes past them.
    pub context_csns: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub backup_format: u32,
    #[serde(default)]
    pub kind: Kind,
    pub store_format: u32,
    pub pando_version: String,
    /// GeneralizedTime of the copy.
    pub created: String,
    /// Entries in the store at the copy (for an incremental: once applied).
    pub entries: u64,
    pub suffixes: Vec<String>,
    /// CSN of the newest change in the copy, if any change was made.
    pub context_csn: Option<String>,
    /// The newest CSN of each server ID (the suffixes' contextCSN).
    #[serde(default)]
    pub context_csns: Vec<String>,
    /// Size and SHA-256 of the data file (`data.mdb` or `changes.zst`).
    pub bytes: u64,
    pub sha256: String,
    /// Writes made around the change log by the time of the copy (format
    /// 2; absent in format 1 backups, which cannot be parents).
    #[serde(default)]
    pub unlogged_writes: Option<u64>,
    /// Change log records in an incremental.
    #[serde(default)]
    pub changes: u64,
    /// An incremental's parent.
    #[serde(default)]
    pub parent: Option<ParentLink>,
}

impl Manifest {
    /// The data file this kind of backup holds.
    pub fn data_file(&self) -> &'static str {
        match self.kind {
            Kind::Full => DATA_FILE,
            Kind::Incremental => CHANGES_FILE,
        }
    }
}

#[derive(Debug, Clone)]
pub struct BackupReport {
    pub manifest: Manifest,
    pub dest: PathBuf,
    pub copy_secs: f64,
    pub total_secs: f64,
}

pub(crate) fn sha256_bytes(b: &[u8]) -> String {
    hex(&Sha256::digest(b))
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}

fn sha256_file(path: &Path) -> Result<(String, u64), String> {
    let f = File::open(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut r = BufReader::with_capacity(1 << 20, f);
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut n: u64 = 0;
    loop {
        let k = r
            .read(&mut buf)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        if k == 0 {
            break;
        }
        h.update(&buf[..k]);
        n += k as u64;
    }
    Ok((hex(&h.finalize()), n))
}

/// Copy the store in `store_dir` to the new directory `dest` (which must not
/// exist), from another process: works whether or not a server is running.
pub fn backup(
    store_dir: &Path,
    dest: &Path,
    schema: std::sync::Arc<Schema>,
    opts: &StoreOptions,
) -> Result<BackupReport, String> {
    fresh(dest)?;
    // Every page is checked before LMDB copies them all.
    crate::preflight(store_dir, false, true)
        .map_err(|e| format!("{}: {e}", store_dir.display()))?;
    let store = Store::open_read_only(store_dir, schema, opts)
        .map_err(|e| format!("{}: {e}", store_dir.display()))?;
    let r = backup_store(&store, dest);
    store.close();
    r
}

/// Copy an open store (the running server's, for the online backup
/// extended operation) to the new directory `dest`.
pub fn backup_store(store: &Store, dest: &Path) -> Result<BackupReport, String> {
    let started = Instant::now();
    let partial = begin(dest)?;
    let data = partial.join(DATA_FILE);
    let copy_started = Instant::now();
    store
        .copy_compacted(&data)
        .map_err(|e| format!("copy to {} failed: {e}", data.display()))?;
    let copy_secs = copy_started.elapsed().as_secs_f64();
    // Describe the copy itself (not the live store, which may have moved on).
    let copy = Store::open_read_only(
        &partial,
        std::sync::Arc::new(Schema::standard()),
        &StoreOptions::default(),
    )
    .map_err(|e| format!("the copy in {} does not open: {e}", partial.display()))?;
    let described = {
        let r = copy.read().map_err(|e| e.to_string())?;
        describe(&r.view()).map_err(|e| e.to_string())
    };
    copy.close();
    let mut manifest = described?;
    // LMDB recreates the lock file when needed; a backup does not carry one.
    let _ = std::fs::remove_file(partial.join("lock.mdb"));
    let manifest = finish(&partial, dest, &mut manifest)?;
    Ok(BackupReport {
        manifest,
        dest: dest.to_path_buf(),
        copy_secs,
        total_secs: started.elapsed().as_secs_f64(),
    })
}

/// A full backup's manifest for the store `v` shows (size and checksum
/// are filled in by [`finish`]).
pub(crate) fn describe(v: &crate::View<'_>) -> Result<Manifest, crate::StoreError> {
    let mut suffixes = Vec::new();
    for id in v.roots()? {
        suffixes.push(v.dn_string(id)?);
    }
    let csns = v.context_csns()?;
    Ok(Manifest {
        backup_format: BACKUP_FORMAT,
        kind: Kind::Full,
        store_format: FORMAT_VERSION,
        pando_version: env!("CARGO_PKG_VERSION").to_string(),
        created: crate::clock::generalized_time(crate::clock::now_micros()),
        entries: v.entry_count()?,
        suffixes,
        context_csn: csns.iter().max().cloned(),
        context_csns: csns,
        bytes: 0,
        sha256: String::new(),
        unlogged_writes: Some(v.unlogged_writes()?),
        changes: 0,
        parent: None,
    })
}

/// A backup goes into a new directory: never over anything.
pub(crate) fn fresh(dest: &Path) -> Result<(), String> {
    match dest.exists() {
        true => Err(format!(
            "{} already exists; a backup goes into a new directory",
            dest.display()
        )),
        false => Ok(()),
    }
}

/// Start a backup into `dest`: the directory it is built in, under a
/// temporary name, so that a directory with the backup's name is always a
/// complete backup.
pub(crate) fn begin(dest: &Path) -> Result<PathBuf, String> {
    fresh(dest)?;
    let partial = partial_name(dest);
    if partial.exists() {
        return Err(format!(
            "{} exists: an interrupted backup? Remove it and run the backup again",
            partial.display()
        ));
    }
    crate::datadir::private_dir(&partial)?;
    Ok(partial)
}

/// End a backup built in `partial`: its data file's size and checksum in
/// `m`, the manifest written, everything private and synced, and the
/// directory given its name `dest`.
pub(crate) fn finish(partial: &Path, dest: &Path, m: &mut Manifest) -> Result<Manifest, String> {
    let data = partial.join(m.data_file());
    let (sha256, bytes) = sha256_file(&data)?;
    m.sha256 = sha256;
    m.bytes = bytes;
    let text = toml::to_string(&m).map_err(|e| e.to_string())?;
    let mpath = partial.join(MANIFEST);
    crate::write_private(&mpath, text.as_bytes())
        .map_err(|e| format!("{}: {e}", mpath.display()))?;
    // A backup holds every password hash: readable by the service account only.
    for f in [&data, &mpath] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("{}: {e}", f.display()))?;
    }
    sync_dir(partial)?;
    std::fs::rename(partial, dest)
        .map_err(|e| format!("cannot name the backup {}: {e}", dest.display()))?;
    sync_dir(&parent_of(dest))?;
    Ok(m.clone())
}

/// Read a backup's manifest (known formats), without checking its data.
/// Returns it with the SHA-256 of the manifest file.
pub fn read_manifest(src: &Path) -> Result<(Manifest, String), String> {
    let mpath = src.join(MANIFEST);
    let text = std::fs::read(&mpath)
        .map_err(|e| format!("{}: {e} (not a Pando backup?)", mpath.display()))?;
    let sha = sha256_bytes(&text);
    let text = String::from_utf8(text)
        .map_err(|_| format!("{}: not UTF-8 (not a Pando backup?)", mpath.display()))?;
    let m: Manifest =
        toml::from_str(&text).map_err(|e| format!("{}: {}", mpath.display(), e.message()))?;
    if !(1..=BACKUP_FORMAT).contains(&m.backup_format) {
        return Err(format!(
            "{}: backup format {} is not supported (this Pando reads formats 1 to {BACKUP_FORMAT})",
            mpath.display(),
            m.backup_format
        ));
    }
    if !(OLDEST_FORMAT..=FORMAT_VERSION).contains(&m.store_format) {
        return Err(format!(
            "{}: the backup holds store format {}, this Pando reads formats {OLDEST_FORMAT} to {FORMAT_VERSION}",
            mpath.display(),
            m.store_format
        ));
    }
    if (m.kind == Kind::Incremental) != m.parent.is_some() {
        return Err(format!(
            "{}: an incremental backup names its parent, a full one does not",
            mpath.display()
        ));
    }
    Ok((m, sha))
}

/// Read and check one backup: manifest present and of known formats, data
/// file present with the recorded size and checksum.
pub fn check(src: &Path) -> Result<Manifest, String> {
    Ok(check_link(src)?.0)
}

/// [`check`], also returning the SHA-256 of the manifest file.
pub(crate) fn check_link(src: &Path) -> Result<(Manifest, String), String> {
    let (m, manifest_sha) = read_manifest(src)?;
    let data = src.join(m.data_file());
    let (sha, bytes) = sha256_file(&data)?;
    if bytes != m.bytes || sha != m.sha256 {
        return Err(format!(
            "{}: checksum mismatch ({bytes} bytes, sha256 {sha}; the manifest says {} bytes, sha256 {}): the backup is damaged",
            data.display(),
            m.bytes,
            m.sha256
        ));
    }
    Ok((m, manifest_sha))
}

/// Swap two directories in one step (Linux `renameat2`, RENAME_EXCHANGE).
pub(crate) fn exchange(a: &Path, b: &Path) -> Result<(), String> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).map_err(|e| e.to_string());
    let (ca, cb) = (c(a)?, c(b)?);
    // SAFETY: two valid NUL-terminated paths, relative to the working
    // directory when not absolute (AT_FDCWD).
    let r = unsafe {
        libc::renameat2(
            libc::AT_FDCWD,
            ca.as_ptr(),
            libc::AT_FDCWD,
            cb.as_ptr(),
            libc::RENAME_EXCHANGE,
        )
    };
    if r == 0 {
        Ok(())
    } else {
        Err(format!(
            "cannot exchange {} and {} in one rename: {} (the file system must support renameat2 \
             RENAME_EXCHANGE, as ext4, XFS, btrfs and tmpfs do); nothing was replaced",
            a.display(),
            b.display(),
            std::io::Error::last_os_error()
        ))
    }
}

/// Where a backup is built before it gets its name.
fn partial_name(dest: &Path) -> PathBuf {
    let mut name = dest.file_name().unwrap_or_default().to_os_string();
    name.push(".partial");
    dest.with_file_name(name)
}

pub(crate) fn parent_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

pub(crate) fn sync_dir(dir: &Path) -> Result<(), String> {
    crate::sync_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))
}
