//! Room on the output's file system: checked before anything is written, and what a failed
//! write there means, said about OUT and its file system rather than about the hidden staging
//! file it happened in or the side file being copied.

use std::io;
use std::path::{Path, PathBuf};

use super::ShardError;
use crate::units::HumanBytes;

/// Kept free beyond the files' own bytes: what file systems spend on their own metadata
/// (indirect blocks, extents, journal) plus room for the rest of the system, so that a run that
/// fits does not leave the disk at a few megabytes either.
const MARGIN_FIXED: u64 = 16 << 20;
/// A further 1/128 (0.8 %) of the bytes written, for metadata that grows with the data.
const MARGIN_SHARE: u64 = 128;

/// What this run will write on the output's file system, and what was free there before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Space {
    /// The folder whose file system was measured (OUT's parent: the staging folder goes there).
    pub fs: PathBuf,
    /// Bytes of the part files, side files, config.json and manifest, summed.
    pub need: u64,
    /// Available to this user when the run started; `None` where the file system does not say.
    pub free: Option<u64>,
}

/// Checks that `bytes` in `files` new files (and margin) fit on the file system of `fs` before
/// anything is written there; `replacing`: OUT holds an earlier output, whose space is freed only
/// after the new one is published.
pub(super) fn check(
    out: &Path,
    fs: &Path,
    bytes: u64,
    files: u64,
    replacing: bool,
) -> Result<Space, ShardError> {
    let Some(st) = statvfs(fs) else {
        return Ok(Space {
            fs: fs.to_path_buf(),
            need: bytes,
            free: None,
        });
    };
    // Each file takes at least one block, and its last block whole.
    let rounding = files.saturating_mul(st.block);
    let margin = (bytes / MARGIN_SHARE)
        .saturating_add(MARGIN_FIXED)
        .saturating_add(rounding);
    let space = Space {
        fs: fs.to_path_buf(),
        need: bytes,
        free: Some(st.free),
    };
    if bytes.saturating_add(margin) > st.free {
        return Err(ShardError::NoSpace {
            out: out.to_path_buf(),
            fs: fs.to_path_buf(),
            need: bytes,
            margin,
            free: st.free,
            replacing,
        });
    }
    if let Some(inodes) = st.inodes
        && files > inodes
    {
        return Err(ShardError::NoInodes {
            out: out.to_path_buf(),
            fs: fs.to_path_buf(),
            files,
            free: inodes,
        });
    }
    Ok(space)
}

struct Statvfs {
    /// Bytes available to unprivileged users: the root-reserved blocks are not ours to fill.
    free: u64,
    block: u64,
    /// Files that can still be created; `None` where the file system has no fixed count.
    inodes: Option<u64>,
}

// The statvfs field types differ between platforms: `u64::from` is a no-op on some.
#[allow(clippy::useless_conversion)]
fn statvfs(dir: &Path) -> Option<Statvfs> {
    #[cfg(feature = "test-hooks")]
    if let Some(free) = free_bytes_for_tests() {
        return Some(Statvfs {
            free,
            block: 4096,
            inodes: None,
        });
    }
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    // SAFETY: an all-zero statvfs is a valid value for the call to fill in.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid NUL-terminated path and a buffer we own.
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return None;
    }
    // Some network and FUSE file systems report no size at all: nothing to check against.
    if st.f_blocks == 0 {
        return None;
    }
    let frsize = u64::from(st.f_frsize).max(1);
    Some(Statvfs {
        free: u64::from(st.f_bavail).saturating_mul(frsize),
        block: frsize,
        inodes: (st.f_files > 0).then_some(u64::from(st.f_favail)),
    })
}

/// Test hook (`WLOAD_TEST_FREE_BYTES=N`): the output's file system reports `N` bytes available,
/// so tests can check the refusal without filling a disk. Only with the `test-hooks` feature
/// (see src/exec/hooks.rs).
#[cfg(feature = "test-hooks")]
fn free_bytes_for_tests() -> Option<u64> {
    let v = std::env::var("WLOAD_TEST_FREE_BYTES").ok()?;
    match v.trim().parse::<u64>() {
        Ok(n) => Some(n),
        _ => panic!("WLOAD_TEST_FREE_BYTES={v:?}: expected a byte count"),
    }
}

/// Why a write on the output's file system failed, when it is about that file system rather than
/// the file: the same for a part file, a side file, config.json, the manifest or a folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DiskProblem {
    Full,
    Quota,
    ReadOnly,
    FileTooLarge,
}

impl DiskProblem {
    pub(super) fn of(e: &io::Error) -> Option<DiskProblem> {
        match e.raw_os_error()? {
            libc::ENOSPC => Some(DiskProblem::Full),
            libc::EDQUOT => Some(DiskProblem::Quota),
            libc::EROFS => Some(DiskProblem::ReadOnly),
            libc::EFBIG => Some(DiskProblem::FileTooLarge),
            _ => None,
        }
    }

    /// What it means and what to do, for the output's file system at `space.fs`.
    pub(super) fn explain(self, space: Option<&Space>, fs: &Path) -> String {
        let fs = fs.display();
        let need = space.map_or_else(String::new, |s| {
            let free = s.free.map_or_else(
                || " (the file system reports no free space figure)".to_string(),
                |f| format!(", and {} was free when it started", HumanBytes(f)),
            );
            format!("; this run needs {} there{free}", HumanBytes(s.need))
        });
        match self {
            DiskProblem::Full => format!(
                "the output's file system (the one holding {fs}) is full{need}: something else took the space meanwhile, or the file system holds less than it reports (compression, snapshots, thin provisioning); free some space or choose an output folder on another disk"
            ),
            DiskProblem::Quota => format!(
                "your disk quota on the output's file system (the one holding {fs}) is used up{need}: free space within your quota or choose an output folder elsewhere"
            ),
            DiskProblem::ReadOnly => format!(
                "the output's file system (the one holding {fs}) is read-only (remounted read-only after an error?): choose a writable output folder"
            ),
            DiskProblem::FileTooLarge => format!(
                "the output's file system (the one holding {fs}) cannot hold a file this large (FAT32 stops at 4 GiB): pass a smaller --max-part-size (e.g. 2GiB) or choose an output folder on another file system"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_output_disk_errno_says_what_it_means() {
        let cases = [
            (libc::ENOSPC, "is full"),
            (libc::EDQUOT, "quota"),
            (libc::EROFS, "read-only"),
            (libc::EFBIG, "--max-part-size"),
        ];
        let space = Space {
            fs: PathBuf::from("/models"),
            need: 3 << 30,
            free: Some(1 << 30),
        };
        for (errno, says) in cases {
            let p = DiskProblem::of(&io::Error::from_raw_os_error(errno)).unwrap();
            let msg = p.explain(Some(&space), Path::new("/models"));
            assert!(msg.contains(says) && msg.contains("/models"), "{msg}");
        }
        let full = DiskProblem::Full.explain(Some(&space), Path::new("/models"));
        assert!(
            full.contains("needs 3.0 GiB") && full.contains("1.0 GiB was free"),
            "{full}"
        );
        assert_eq!(
            DiskProblem::of(&io::Error::from_raw_os_error(libc::EIO)),
            None
        );
    }

    #[test]
    fn a_real_file_system_reports_its_free_space() {
        let dir = tempfile::TempDir::new().unwrap();
        let s = check(dir.path(), dir.path(), 1, 1, false);
        // The temp folder has room for one byte, unless the test hook says otherwise.
        if std::env::var_os("WLOAD_TEST_FREE_BYTES").is_none() {
            let s = s.unwrap();
            assert!(s.free.is_some_and(|f| f > 0), "{s:?}");
        }
        let e = check(dir.path(), dir.path(), u64::MAX, 1, true).unwrap_err();
        assert!(e.to_string().contains("only"), "{e}");
    }
}
