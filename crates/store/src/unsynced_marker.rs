//! The marker file saying the store was written without syncing.
//!
//! In durability `none` commits reach the disk when the OS decides, so a
//! power cut or OS crash can leave a damaged store. The writer creates this
//! file (synced, with its directory) before the first such commit and removes
//! it after the sync that ends the mode, including the one at a clean
//! shutdown. Found at start, it means the last run may have left damage
//! behind, and the whole store is checked before it is served.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

/// Name of the marker inside the store directory.
pub const FILE: &str = "unsynced-writes";

pub fn path(store_dir: &Path) -> PathBuf {
    store_dir.join(FILE)
}

/// Whether the last run left commits that were never synced.
pub fn present(store_dir: &Path) -> bool {
    path(store_dir).exists()
}

/// Create the marker and make it durable before any unsynced commit.
pub fn set(store_dir: &Path) -> std::io::Result<()> {
    write_private(
        &path(store_dir),
        b"This store was written with durability = none and was not synced since.\n\
          After a power cut or OS crash it may be damaged: Pando checks it whole at the next start.\n",
    )?;
    sync_dir(store_dir)
}

/// Remove the marker once everything written is on disk.
pub fn clear(store_dir: &Path) {
    let p = path(store_dir);
    match std::fs::remove_file(&p) {
        Ok(()) => {
            if let Err(e) = sync_dir(store_dir) {
                tracing::warn!(error = %e, path = %store_dir.display(), "cannot sync the store directory");
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            tracing::warn!(error = %e, path = %p.display(), "cannot remove the unsynced-writes marker")
        }
    }
}

/// Make a directory's entries (created, renamed, removed files) durable.
pub fn sync_dir(dir: &Path) -> std::io::Result<()> {
    File::open(dir)?.sync_all()
}

/// Write a file only its owner may read (mode 0600 from creation, so no
/// moment with wider rights) and sync its contents. Its directory entry
/// is the caller's to sync.
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut f = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}
