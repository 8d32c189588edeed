//! User and group database lookups (passwd, group) of any size.
//!
//! The reentrant libc calls write into a caller-supplied buffer and fail
//! with ERANGE when an entry does not fit — a group with thousands of
//! members easily outgrows any fixed size. Each lookup retries with a
//! doubled buffer until the entry fits; only an allocation failure ends it.
//! rustix has no passwd/group access, and nix's `User`/`Group` stop at
//! 1 MiB, so the libc calls are wrapped here.

use std::ffi::{CStr, CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

/// What one attempt with a buffer of a given size found.
#[derive(Debug)]
pub(crate) enum Attempt<T> {
    Found(T),
    /// No such entry.
    Missing,
    /// The entry exists but does not fit: retry with a bigger buffer.
    TooSmall,
    /// A database error other than ERANGE: no answer.
    Failed,
}

/// The first buffer size tried; big enough for almost every entry.
const INITIAL: usize = 4096;

/// Runs `attempt` with buffers of `initial` bytes, then twice, four times...
/// as long as it reports `TooSmall`.
pub(crate) fn with_growing_buffer<T>(
    initial: usize,
    mut attempt: impl FnMut(&mut [u8]) -> Attempt<T>,
) -> Option<T> {
    let mut len = initial.max(1);
    loop {
        let mut buf = Vec::new();
        // try_reserve instead of vec![]: an absurd size ends the lookup
        // instead of aborting the process.
        buf.try_reserve_exact(len).ok()?;
        buf.resize(len, 0u8);
        match attempt(&mut buf) {
            Attempt::Found(t) => return Some(t),
            Attempt::Missing | Attempt::Failed => return None,
            Attempt::TooSmall => len = len.checked_mul(2)?,
        }
    }
}

/// Maps a `get*_r` return code and result pointer to an [`Attempt`].
fn outcome<T>(rc: libc::c_int, found: bool, value: impl FnOnce() -> T) -> Attempt<T> {
    match rc {
        0 if found => Attempt::Found(value()),
        0 => Attempt::Missing,
        libc::ERANGE => Attempt::TooSmall,
        // Some NSS modules report "no such entry" as an errno.
        libc::ENOENT | libc::ESRCH | libc::EBADF | libc::EPERM => Attempt::Missing,
        _ => Attempt::Failed,
    }
}

/// The login name of `uid`, from the passwd database.
pub fn user_name(uid: u32) -> Option<String> {
    passwd_entry(Ok(uid)).map(|(name, ..)| name)
}

/// A user's primary group and every group the group database lists them
/// in, by uid; `None` for a uid the passwd database does not know.
pub fn user_groups(uid: u32) -> Option<(u32, Vec<u32>)> {
    let (name, _, _, gid) = passwd_entry(Ok(uid))?;
    let name = CString::new(name).ok()?;
    let mut len: libc::c_int = 32;
    loop {
        let mut groups = vec![0 as libc::gid_t; usize::try_from(len).ok()?];
        let mut n = len;
        // SAFETY: name is NUL-terminated; groups holds n entries and n is
        // passed by pointer, as getgrouplist(3) requires.
        let rc = unsafe { libc::getgrouplist(name.as_ptr(), gid, groups.as_mut_ptr(), &mut n) };
        if rc >= 0 {
            groups.truncate(usize::try_from(n).ok()?);
            return Some((gid, groups));
        }
        // Too small: n says how many there are (some versions leave it).
        len = n.max(len.checked_mul(2)?);
        if len > 1 << 20 {
            return None;
        }
    }
}

/// A user's uid and home directory, by login name or number.
pub fn user_home(user: &str) -> Option<(u32, PathBuf)> {
    passwd_entry(user.parse().map_err(|_| user)).map(|(_, uid, home, _)| (uid, home))
}

/// The uid of the user with login name `name` (never read as a number).
pub fn user_id(name: &str) -> Option<u32> {
    passwd_entry(Err(name)).map(|(_, uid, ..)| uid)
}

/// A passwd entry (login name, uid, home, primary group), by uid or by
/// name.
fn passwd_entry(user: Result<u32, &str>) -> Option<(String, u32, PathBuf, u32)> {
    let name = match user {
        Ok(_) => None,
        Err(name) => Some(CString::new(name).ok()?),
    };
    with_growing_buffer(INITIAL, |buf| {
        // SAFETY: zeroed passwd is a valid out-parameter.
        let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::passwd = std::ptr::null_mut();
        let rc = match (&user, &name) {
            // SAFETY: pwd, buf and result are valid for the call; buf's
            // length is passed.
            (Ok(uid), _) => unsafe {
                libc::getpwuid_r(
                    *uid,
                    &mut pwd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut result,
                )
            },
            // SAFETY: as above; name is NUL-terminated.
            (Err(_), Some(name)) => unsafe {
                libc::getpwnam_r(
                    name.as_ptr(),
                    &mut pwd,
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    &mut result,
                )
            },
            (Err(_), None) => return Attempt::Missing,
        };
        outcome(rc, !result.is_null(), || {
            // SAFETY: on success pw_name and pw_dir point to NUL-terminated
            // strings inside buf, which is still alive here.
            let (name, home) = unsafe { (CStr::from_ptr(pwd.pw_name), CStr::from_ptr(pwd.pw_dir)) };
            (
                name.to_string_lossy().into_owned(),
                pwd.pw_uid,
                PathBuf::from(OsStr::from_bytes(home.to_bytes())),
                pwd.pw_gid,
            )
        })
    })
}

/// The name of group `gid`, from the group database.
pub fn group_name(gid: u32) -> Option<String> {
    with_growing_buffer(INITIAL, |buf| {
        // SAFETY: zeroed group is a valid out-parameter.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        // SAFETY: grp, buf and result are valid for the call; buf's length
        // is passed.
        let rc = unsafe {
            libc::getgrgid_r(
                gid,
                &mut grp,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        outcome(rc, !result.is_null(), || {
            // SAFETY: on success gr_name points to a NUL-terminated string
            // inside buf, which is still alive here.
            let name = unsafe { CStr::from_ptr(grp.gr_name) };
            name.to_string_lossy().into_owned()
        })
    })
}

/// The gid of the group named `name`, from the group database.
pub fn group_id(name: &str) -> Option<u32> {
    let name = CString::new(name).ok()?;
    with_growing_buffer(INITIAL, |buf| {
        // SAFETY: zeroed group is a valid out-parameter.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut result: *mut libc::group = std::ptr::null_mut();
        // SAFETY: name is NUL-terminated; grp, buf and result are valid for
        // the call; buf's length is passed.
        let rc = unsafe {
            libc::getgrnam_r(
                name.as_ptr(),
                &mut grp,
                buf.as_mut_ptr().cast(),
                buf.len(),
                &mut result,
            )
        };
        outcome(rc, !result.is_null(), || grp.gr_gid)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An entry far bigger than the first buffer is found after doublings,
    /// and each attempt saw a buffer twice the size of the one before.
    #[test]
    fn grows_until_the_entry_fits() {
        let need = 3 << 20; // 3 MiB: beyond nix's 1 MiB ceiling too
        let mut sizes = Vec::new();
        let got = with_growing_buffer(INITIAL, |buf| {
            sizes.push(buf.len());
            if buf.len() < need {
                Attempt::TooSmall
            } else {
                Attempt::Found(buf.len())
            }
        });
        assert_eq!(got, Some(4 << 20));
        assert_eq!(sizes.first(), Some(&INITIAL));
        assert!(sizes.windows(2).all(|w| w[1] == 2 * w[0]));
    }

    #[test]
    fn missing_and_failed_end_the_lookup() {
        let mut calls = 0;
        let got: Option<()> = with_growing_buffer(16, |_| {
            calls += 1;
            Attempt::Missing
        });
        assert!(got.is_none());
        assert_eq!(calls, 1);
        assert!(with_growing_buffer::<()>(16, |_| Attempt::Failed).is_none());
    }

    #[test]
    fn an_impossible_size_ends_instead_of_aborting() {
        let got: Option<()> = with_growing_buffer(usize::MAX / 2, |_| Attempt::TooSmall);
        assert!(got.is_none());
    }

    #[test]
    fn return_codes_map_to_attempts() {
        assert!(matches!(outcome(0, true, || 7), Attempt::Found(7)));
        assert!(matches!(outcome(0, false, || 7), Attempt::Missing));
        assert!(matches!(
            outcome(libc::ERANGE, false, || 7),
            Attempt::TooSmall
        ));
        assert!(matches!(outcome(libc::EIO, false, || 7), Attempt::Failed));
    }

    #[test]
    fn root_is_found_by_number_and_name() {
        assert_eq!(user_name(0).as_deref(), Some("root"));
        assert_eq!(user_home("root").map(|(uid, _)| uid), Some(0));
        assert_eq!(user_home("0").map(|(uid, _)| uid), Some(0));
        assert!(group_name(0).is_some());
    }
}
