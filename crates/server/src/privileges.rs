//! Least privilege: give up root after binding privileged ports.
//!
//! Started as root with `user` (and optionally `group`) configured, the
//! server binds its listeners, then switches to that user and group for
//! good (supplementary groups cleared, real, effective and saved IDs all
//! set) before it opens the data directory, so every file it creates
//! belongs to the service account. The switch is verified: if root could
//! be regained, the server refuses to run.

use std::ffi::CString;

/// Resolved target identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    pub uid: u32,
    pub gid: u32,
}

/// Look up `user` (name or numeric ID) and `group` (default: the user's
/// primary group).
pub fn resolve(user: &str, group: Option<&str>) -> Result<Target, String> {
    let (uid, primary) = lookup_user(user)?;
    let gid = match group {
        None => primary,
        Some(g) => lookup_group(g)?,
    };
    Ok(Target { uid, gid })
}

fn lookup_user(user: &str) -> Result<(u32, u32), String> {
    let name = CString::new(user).map_err(|_| format!("user '{user}': contains NUL"))?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: all-zero is a valid passwd value; it is filled in by getpwnam_r.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: pointers are valid for the call; buf outlives pwd's use below.
    let rc = unsafe {
        libc::getpwnam_r(
            name.as_ptr(),
            &mut pwd,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        )
    };
    if rc == 0 && !out.is_null() {
        return Ok((pwd.pw_uid, pwd.pw_gid));
    }
    // A numeric ID with no passwd entry is accepted as is (containers).
    match user.parse::<u32>() {
        Ok(uid) => Ok((uid, uid)),
        Err(_) => Err(format!("user '{user}' does not exist")),
    }
}

fn lookup_group(group: &str) -> Result<u32, String> {
    let name = CString::new(group).map_err(|_| format!("group '{group}': contains NUL"))?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: as in lookup_user.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::group = std::ptr::null_mut();
    // SAFETY: pointers are valid for the call.
    let rc = unsafe {
        libc::getgrnam_r(
            name.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut out,
        )
    };
    if rc == 0 && !out.is_null() {
        return Ok(grp.gr_gid);
    }
    group
        .parse::<u32>()
        .map_err(|_| format!("group '{group}' does not exist"))
}

/// Create the data directory (0700) if needed and, when running as root,
/// give it to the service account, so the server can use it after the switch.
pub fn prepare_data_dir(dir: &std::path::Path, owner: Option<Target>) -> Result<(), String> {
    crate::datadir::private_dir(dir).map_err(|e| format!("data directory: {e}"))?;
    let Some(t) = owner else { return Ok(()) };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        std::os::unix::fs::chown(dir, Some(t.uid), Some(t.gid))
            .map_err(|e| format!("cannot give {} to uid {}: {e}", dir.display(), t.uid))?;
    }
    Ok(())
}

/// Switch to `t` for good. Must run before any other thread could be
/// relying on the old credentials; the Tokio runtime's threads share the
/// process credentials on Linux through the C library's setxid broadcast.
pub fn drop_to(t: Target) -> Result<(), String> {
    // SAFETY: plain system calls on the process's own credentials.
    unsafe {
        let euid = libc::geteuid();
        if euid != 0 {
            if euid == t.uid {
                return Ok(()); // already that user: nothing to give up
            }
            return Err(format!(
                "cannot switch to uid {}: not started as root (running as uid {euid})",
                t.uid
            ));
        }
        let groups = [t.gid as libc::gid_t];
        if libc::setgroups(1, groups.as_ptr()) != 0 {
            return Err(format!("setgroups: {}", std::io::Error::last_os_error()));
        }
        if libc::setresgid(t.gid, t.gid, t.gid) != 0 {
            return Err(format!(
                "setresgid({}): {}",
                t.gid,
                std::io::Error::last_os_error()
            ));
        }
        if libc::setresuid(t.uid, t.uid, t.uid) != 0 {
            return Err(format!(
                "setresuid({}): {}",
                t.uid,
                std::io::Error::last_os_error()
            ));
        }
        if t.uid != 0 && (libc::setuid(0) == 0 || libc::geteuid() == 0) {
            return Err(
                "root privileges could be regained after the switch; refusing to run".into(),
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_root_and_numbers() {
        assert_eq!(resolve("root", None).unwrap(), Target { uid: 0, gid: 0 });
        assert_eq!(
            resolve("4242", Some("4343")).unwrap(),
            Target {
                uid: 4242,
                gid: 4343
            }
        );
        assert!(resolve("no-such-user-here", None)
            .unwrap_err()
            .contains("does not exist"));
        assert!(resolve("root", Some("no-such-group-here"))
            .unwrap_err()
            .contains("does not exist"));
    }
}
