//! The one step that publishes the staging folder as OUT, and only if OUT is still what
//! [`super::check`] found: on Linux `renameat2(RENAME_NOREPLACE)` for a new OUT and
//! `RENAME_EXCHANGE` (then a check of what came out) for a replaced one; elsewhere plain
//! `rename`, which refuses a non-empty folder.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::check::{Existing, FileId, Target, entry_names};
use super::names::{ASIDE_SUFFIX, OWNER_FILE};
use super::owned::Owned;
use super::stage::Staging;
use super::sweep::Owner;
use crate::commands::error::shard::OutProblem;
use crate::commands::shard::ShardError;

impl Staging {
    /// Moves the finished folder to OUT, as [`check`] allowed and only if OUT is still what it
    /// was then.
    pub(crate) fn publish(mut self, target: &Target) -> Result<(), ShardError> {
        let owner = self.path.join(OWNER_FILE);
        fs::remove_file(&owner).map_err(|e| ShardError::io("removing", &owner, e))?;
        match &target.existing {
            Existing::Missing => rename_noreplace(&self.path, &target.path)?,
            Existing::Empty(id) | Existing::Output(id, _) => self.replace(target, *id)?,
        }
        self.published = true;
        Ok(())
    }

    /// Swaps the staging folder with OUT, checks that what came out is what was checked, and
    /// removes it; if it is not, swaps back and reports the race.
    fn replace(&self, target: &Target, id: FileId) -> Result<(), ShardError> {
        let out = &target.path;
        if !exchange(&self.path, out)? {
            return fallback_replace(&self.path, target, id);
        }
        // `self.path` now holds what was at OUT.
        if !still_as_checked(&self.path, &target.existing, id) {
            let _ = exchange(&self.path, out);
            return Err(ShardError::Raced(out.clone()));
        }
        match &target.existing {
            Existing::Output(_, owned) => remove_replaced(&self.path, out, owned),
            _ => {
                if fs::remove_dir(&self.path).is_err() {
                    // Written into since `still_as_checked` looked.
                    let _ = exchange(&self.path, out);
                    return Err(ShardError::Raced(out.clone()));
                }
            }
        }
        Ok(())
    }
}

/// Removes the earlier output that publication replaced, now at `dir`: only what its manifest
/// listed when it was checked. Best effort: the new output is already in place, and failing the
/// run now would misreport it.
fn remove_replaced(dir: &Path, out: &Path, owned: &Owned) {
    // While the listed files go, the folder carries our owner record, so that a run killed
    // meanwhile leaves a leftover the next run sweeps.
    let recorded = Owner::me(out).write(dir).is_ok();
    let _ = owned.remove_listed(dir);
    if recorded {
        let _ = fs::remove_file(dir.join(OWNER_FILE));
    }
    // What is left was put there after the check (or could not be removed, as a file another
    // process holds open on a network file system): it is not provably ours, so it stays, without
    // an owner record, which the sweeper needs before it removes anything.
    let _ = fs::remove_dir(dir);
}

/// Whether a folder that was OUT is still what [`check`] found: the same folder, still empty or
/// still holding only what its manifest accounts for.
fn still_as_checked(dir: &Path, existing: &Existing, id: FileId) -> bool {
    if FileId::of(dir).ok() != Some(id) {
        return false;
    }
    match existing {
        Existing::Missing => false,
        Existing::Empty(_) => entry_names(dir).is_ok_and(|e| e.is_empty()),
        Existing::Output(_, owned) => owned.foreign(dir).is_ok_and(|f| f.is_empty()),
    }
}

/// Where `renameat2` is missing (not Linux, or a filesystem without it): move OUT aside, check it,
/// rename, then remove what was moved aside.
fn fallback_replace(staging: &Path, target: &Target, id: FileId) -> Result<(), ShardError> {
    let out = &target.path;
    let mut aside = staging.as_os_str().to_owned();
    aside.push(ASIDE_SUFFIX);
    let aside = PathBuf::from(aside);
    fs::rename(out, &aside).map_err(|e| rename_error(out, e))?;
    if !still_as_checked(&aside, &target.existing, id) {
        let _ = fs::rename(&aside, out);
        return Err(ShardError::Raced(out.clone()));
    }
    if let Err(e) = rename_noreplace(staging, out) {
        let _ = fs::rename(&aside, out);
        return Err(e);
    }
    match &target.existing {
        Existing::Output(_, owned) => remove_replaced(&aside, out, owned),
        _ => {
            let _ = fs::remove_dir(&aside);
        }
    }
    Ok(())
}

/// A rename into OUT that failed: a mount point (which [`check`] missed, or one mounted since)
/// is said as such; the rest names OUT.
fn rename_error(out: &Path, e: io::Error) -> ShardError {
    if e.raw_os_error() == Some(libc::EBUSY) {
        return ShardError::Out {
            path: out.to_path_buf(),
            problem: OutProblem::MountPoint,
        };
    }
    ShardError::io("renaming into", out, e)
}

/// Renames `from` to `to` unless `to` exists; a `to` that appeared is a lost race.
fn rename_noreplace(from: &Path, to: &Path) -> Result<(), ShardError> {
    match sys::rename_noreplace(from, to) {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ENOTEMPTY)) => {
            Err(ShardError::Raced(to.to_path_buf()))
        }
        Err(e) => Err(rename_error(to, e)),
    }
}

/// Atomically swaps two paths; `Ok(false)` where the system cannot.
fn exchange(a: &Path, b: &Path) -> Result<bool, ShardError> {
    match sys::exchange(a, b) {
        Ok(()) => Ok(true),
        Err(e) if sys::unsupported(&e) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ShardError::Raced(b.to_path_buf())),
        Err(e) => Err(rename_error(b, e)),
    }
}

#[cfg(target_os = "linux")]
mod sys {
    use std::ffi::CString;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    fn c(p: &Path) -> io::Result<CString> {
        CString::new(p.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput.into())
    }

    fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
        let (f, t) = (c(from)?, c(to)?);
        // SAFETY: both are valid NUL-terminated paths, relative to the current folder.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                f.as_ptr(),
                libc::AT_FDCWD,
                t.as_ptr(),
                flags,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    pub(super) fn unsupported(e: &io::Error) -> bool {
        matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS))
    }

    pub(super) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
        match renameat2(from, to, libc::RENAME_NOREPLACE) {
            Err(e) if unsupported(&e) => std::fs::rename(from, to),
            r => r,
        }
    }

    pub(super) fn exchange(a: &Path, b: &Path) -> io::Result<()> {
        renameat2(a, b, libc::RENAME_EXCHANGE)
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::io;
    use std::path::Path;

    pub(crate) fn unsupported(_: &io::Error) -> bool {
        true
    }

    /// `rename` refuses a non-empty folder, so only an empty folder that appeared meanwhile
    /// could be replaced.
    pub(crate) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    pub(crate) fn exchange(_: &Path, _: &Path) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
}
