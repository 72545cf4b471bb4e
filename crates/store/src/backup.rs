//! Hot backup and restore.
//!
//! A backup is a directory holding `data.mdb` — a compacted LMDB copy made
//! from one read transaction, so it is consistent while the server keeps
//! serving reads and writes — and `manifest.toml`, which says what it holds
//! and carries the copy's SHA-256. Restore refuses a backup whose checksum
//! or formats do not match, and replaces the store of a stopped server.

use std::fs::File;
use std::io::{BufReader, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

use crate::{Store, StoreOptions, FORMAT_VERSION, OLDEST_FORMAT};
use pando_model::Schema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Version of the backup layout (this directory and its manifest).
pub const BACKUP_FORMAT: u32 = 1;
pub const MANIFEST: &str = "manifest.toml";
pub const DATA_FILE: &str = "data.mdb";

#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Manifest {
    pub backup_format: u32,
    pub store_format: u32,
    pub pando_version: String,
    /// GeneralizedTime of the copy.
    pub created: String,
    pub entries: u64,
    pub suffixes: Vec<String>,
    /// CSN of the newest change in the copy, if any change was made.
    pub context_csn: Option<String>,
    /// The newest CSN of each server ID (the suffixes' contextCSN).
    #[serde(default)]
    pub context_csns: Vec<String>,
    pub bytes: u64,
    pub sha256: String,
}

#[derive(Debug, Clone)]
pub struct BackupReport {
    pub manifest: Manifest,
    pub dest: PathBuf,
    pub copy_secs: f64,
    pub total_secs: f64,
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
    Ok((h.finalize().iter().map(|b| format!("{b:02x}")).collect(), n))
}

/// Copy the store in `store_dir` to the new directory `dest` (which must not
/// exist), from another process: works whether or not a server is running.
pub fn backup(
    store_dir: &Path,
    dest: &Path,
    schema: std::sync::Arc<Schema>,
    opts: &StoreOptions,
) -> Result<BackupReport, String> {
    if dest.exists() {
        return Err(format!(
            "{} already exists; a backup goes into a new directory",
            dest.display()
        ));
    }
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
    if dest.exists() {
        return Err(format!(
            "{} already exists; a backup goes into a new directory",
            dest.display()
        ));
    }
    // Built under a temporary name and renamed when whole and synced: a
    // directory with the backup's name is always a complete backup.
    let final_dest = dest;
    let partial = partial_name(dest);
    if partial.exists() {
        return Err(format!(
            "{} exists: an interrupted backup? Remove it and run the backup again",
            partial.display()
        ));
    }
    let dest = partial.as_path();
    crate::datadir::private_dir(dest)?;
    let data = dest.join(DATA_FILE);
    let copy_started = Instant::now();
    store
        .copy_compacted(&data)
        .map_err(|e| format!("copy to {} failed: {e}", data.display()))?;
    let copy_secs = copy_started.elapsed().as_secs_f64();
    // Describe the copy itself (not the live store, which may have moved on).
    let copy = Store::open_read_only(
        dest,
        std::sync::Arc::new(Schema::standard()),
        &StoreOptions::default(),
    )
    .map_err(|e| format!("the copy in {} does not open: {e}", dest.display()))?;
    let (entries, suffixes, context_csn) = {
        let r = copy.read().map_err(|e| e.to_string())?;
        let v = r.view();
        let entries = v.entry_count().map_err(|e| e.to_string())?;
        let mut suffixes = Vec::new();
        for id in v.roots().map_err(|e| e.to_string())? {
            suffixes.push(v.dn_string(id).map_err(|e| e.to_string())?);
        }
        let csns = v.context_csns().map_err(|e| e.to_string())?;
        (entries, suffixes, csns)
    };
    copy.close();
    // LMDB recreates the lock file when needed; a backup does not carry one.
    let _ = std::fs::remove_file(dest.join("lock.mdb"));
    let (sha256, bytes) = sha256_file(&data)?;
    let manifest = Manifest {
        backup_format: BACKUP_FORMAT,
        store_format: FORMAT_VERSION,
        pando_version: env!("CARGO_PKG_VERSION").to_string(),
        created: crate::clock::generalized_time(crate::clock::now_micros()),
        entries,
        suffixes,
        context_csn: context_csn.iter().max().cloned(),
        context_csns: context_csn,
        bytes,
        sha256,
    };
    let text = toml::to_string(&manifest).map_err(|e| e.to_string())?;
    let mpath = dest.join(MANIFEST);
    crate::write_private(&mpath, text.as_bytes())
        .map_err(|e| format!("{}: {e}", mpath.display()))?;
    // A backup holds every password hash: readable by the service account only.
    for f in [&data, &mpath] {
        std::fs::set_permissions(f, std::fs::Permissions::from_mode(0o600))
            .map_err(|e| format!("{}: {e}", f.display()))?;
    }
    sync_dir(dest)?;
    std::fs::rename(dest, final_dest)
        .map_err(|e| format!("cannot name the backup {}: {e}", final_dest.display()))?;
    sync_dir(&parent_of(final_dest))?;
    Ok(BackupReport {
        manifest,
        dest: final_dest.to_path_buf(),
        copy_secs,
        total_secs: started.elapsed().as_secs_f64(),
    })
}

/// Read and check a backup: manifest present and of known formats, data
/// file present with the recorded size and checksum.
pub fn check(src: &Path) -> Result<Manifest, String> {
    let mpath = src.join(MANIFEST);
    let text = std::fs::read_to_string(&mpath)
        .map_err(|e| format!("{}: {e} (not a Pando backup?)", mpath.display()))?;
    let m: Manifest =
        toml::from_str(&text).map_err(|e| format!("{}: {}", mpath.display(), e.message()))?;
    if m.backup_format != BACKUP_FORMAT {
        return Err(format!(
            "{}: backup format {} is not supported (this Pando reads {BACKUP_FORMAT})",
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
    let data = src.join(DATA_FILE);
    let (sha, bytes) = sha256_file(&data)?;
    if bytes != m.bytes || sha != m.sha256 {
        return Err(format!(
            "{}: checksum mismatch ({bytes} bytes, sha256 {sha}; the manifest says {} bytes, sha256 {}): the backup is damaged",
            data.display(),
            m.bytes,
            m.sha256
        ));
    }
    Ok(m)
}

/// Replace the store of the (stopped) server in `data_dir` with the backup
/// in `src`. The caller holds the data directory lock.
///
/// Atomic against a cut: the backup is copied and synced beside the store,
/// then the two directories are exchanged in one rename (`RENAME_EXCHANGE`),
/// so `db` is always either the old store or the new one.
pub fn restore(src: &Path, data_dir: &Path) -> Result<Manifest, String> {
    let m = check(src)?;
    let db = crate::datadir::store_dir(data_dir);
    let staging = data_dir.join("db.restoring");
    let _ = std::fs::remove_dir_all(&staging);
    crate::datadir::private_dir(&staging)?;
    let staged = staging.join(DATA_FILE);
    std::fs::copy(src.join(DATA_FILE), &staged)
        .map_err(|e| format!("copy to {} failed: {e}", staged.display()))?;
    File::open(&staged)
        .and_then(|f| f.sync_all())
        .map_err(|e| format!("{}: {e}", staged.display()))?;
    sync_dir(&staging)?;
    // The copy is checked again where it landed before it replaces anything.
    let (sha, _) = sha256_file(&staged)?;
    if sha != m.sha256 {
        let _ = std::fs::remove_dir_all(&staging);
        return Err(format!(
            "{}: the copied file does not match the backup's checksum",
            staged.display()
        ));
    }
    if db.exists() {
        exchange(&staging, &db)?;
    } else {
        std::fs::rename(&staging, &db)
            .map_err(|e| format!("cannot move {} into place: {e}", staging.display()))?;
    }
    sync_dir(data_dir)?;
    // After an exchange the replaced store is under the staging name.
    let _ = std::fs::remove_dir_all(&staging);
    Ok(m)
}

/// Swap two directories in one step (Linux `renameat2`, RENAME_EXCHANGE).
fn exchange(a: &Path, b: &Path) -> Result<(), String> {
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

fn parent_of(p: &Path) -> PathBuf {
    match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

fn sync_dir(dir: &Path) -> Result<(), String> {
    crate::sync_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))
}
