//! The data directory: one Pando process at a time, and warm starts.

use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Instant;

/// Directory holding the LMDB files inside the data directory.
pub fn store_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("db")
}

/// Lock file inside the data directory; holds the owner's PID.
pub const LOCK_FILE: &str = "pando.lock";

/// An exclusive hold on a data directory, released when dropped.
#[derive(Debug)]
pub struct DirLock {
    _file: File,
    pub path: PathBuf,
}

/// Take the data directory for this process, or say who has it. Serving,
/// restoring and importing take it; reading commands (verify, backup,
/// export) do not need it, since LMDB readers coexist with a writer.
pub fn lock(data_dir: &Path) -> Result<DirLock, String> {
    let path = data_dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|e| format!("cannot open {}: {e}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let mut pid = String::new();
            let _ = file.read_to_string(&mut pid);
            let pid = pid.trim();
            return Err(format!(
                "data directory {} is in use by another pando process{} (lock {})",
                data_dir.display(),
                if pid.is_empty() {
                    String::new()
                } else {
                    format!(" (pid {pid})")
                },
                path.display()
            ));
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(format!("cannot lock {}: {e}", path.display()))
        }
    }
    // Record who holds it, for the message above.
    let _ = file.set_len(0);
    let _ = file.seek(SeekFrom::Start(0));
    let _ = write!(file, "{}", std::process::id());
    let _ = file.sync_all();
    Ok(DirLock { _file: file, path })
}

/// Read the database file once so its pages are in the page cache: after a
/// restart a directory is several times slower until its data is in memory.
/// Runs on its own thread; never blocks service.
pub fn warm_in_background(db_file: PathBuf) {
    let spawned = std::thread::Builder::new()
        .name("pando-warm".into())
        .spawn(move || {
            let started = Instant::now();
            let Ok(mut f) = File::open(&db_file) else {
                return;
            };
            advise_willneed(&f);
            let mut buf = vec![0u8; 1 << 20];
            let mut total: u64 = 0;
            loop {
                match f.read(&mut buf) {
                    Ok(0) => break,
                    Ok(n) => total += n as u64,
                    Err(_) => return,
                }
            }
            let resident = resident_fraction(&db_file)
                .map(|r| format!("{:.0}%", r * 100.0))
                .unwrap_or_else(|| "?".into());
            tracing::info!(
                mib = total >> 20,
                secs = format_args!("{:.2}", started.elapsed().as_secs_f64()),
                resident,
                "store warmed into the page cache"
            );
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start the warm-up thread");
    }
}

fn advise_willneed(f: &File) {
    use std::os::fd::AsRawFd;
    // SAFETY: a valid open descriptor; the call only gives the kernel a hint.
    unsafe {
        libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_WILLNEED);
    }
}

/// Fraction of the file's pages in the page cache (mincore), if measurable.
pub fn resident_fraction(path: &Path) -> Option<f64> {
    use std::os::fd::AsRawFd;
    let f = File::open(path).ok()?;
    let len = f.metadata().ok()?.len() as usize;
    if len == 0 {
        return Some(1.0);
    }
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    let page = usize::try_from(page).ok().filter(|p| *p > 0)?;
    // SAFETY: a read-only shared mapping of a file we hold open, of its
    // current length; unmapped below and never dereferenced.
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        )
    };
    if addr == libc::MAP_FAILED {
        return None;
    }
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: `vec` has one byte per page of the mapping.
    let rc = unsafe { libc::mincore(addr, len, vec.as_mut_ptr()) };
    // SAFETY: unmapping exactly what was mapped.
    unsafe { libc::munmap(addr, len) };
    if rc != 0 {
        return None;
    }
    let resident = vec.iter().filter(|b| **b & 1 == 1).count();
    Some(resident as f64 / pages as f64)
}

/// Create `dir` (and missing parents) and make it 0700: data, backups and
/// generated keys are for the service account only.
pub fn private_dir(dir: &Path) -> Result<(), String> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
        .map_err(|e| format!("{}: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn second_lock_is_refused_with_the_pid() {
        let dir = tempfile::tempdir().unwrap();
        let held = lock(dir.path()).unwrap();
        // flock locks belong to the open file description, so a second
        // open in the same process conflicts just like another process.
        let err = lock(dir.path()).unwrap_err();
        assert!(err.contains("in use by another pando process"), "{err}");
        assert!(err.contains(&std::process::id().to_string()), "{err}");
        drop(held);
        lock(dir.path()).unwrap();
    }

    #[test]
    fn resident_fraction_of_a_read_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        std::fs::write(&p, vec![7u8; 1 << 16]).unwrap();
        let _ = std::fs::read(&p).unwrap();
        let r = resident_fraction(&p).unwrap();
        assert!(r > 0.0 && r <= 1.0, "{r}");
    }
}
