//! Writing part files: headers first, data regions filled by the engine with positioned writes.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use super::parts::PartFile;
use super::{ExecError, Progress, Sink, execute, placements_for};
use crate::plan::Plan;

struct FileSink {
    files: Vec<(PathBuf, File)>,
}

impl Sink for FileSink {
    fn put(&self, out: usize, offset: u64, bytes: &[u8]) -> Result<(), ExecError> {
        let (path, f) = &self.files[out];
        f.write_all_at(bytes, offset)
            .map_err(|e| ExecError::io("writing", path, e))
    }

    fn starts_zeroed(&self) -> bool {
        true
    }
}

/// Creates `files` in `dir` (which must be new and empty) and fills them from the checkpoint at
/// `root`. Files are sized up front, so what is never written reads as zeros.
pub fn write_parts(
    plan: &Plan,
    root: &Path,
    dir: &Path,
    files: &[PartFile],
    cancel: &AtomicBool,
    progress: &dyn Progress,
) -> Result<(), ExecError> {
    let mut opened = Vec::with_capacity(files.len());
    for f in files {
        let path = dir.join(&f.name);
        let file = OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| ExecError::io("creating", &path, e))?;
        file.write_all_at(&f.header, 0)
            .map_err(|e| ExecError::io("writing", &path, e))?;
        // Reserve the space now, so a full disk fails here rather than halfway through.
        allocate(&file, f.size).map_err(|e| ExecError::io("allocating", &path, e))?;
        progress.advance(f.header.len() as u64);
        opened.push((path, file));
    }
    let sink = FileSink { files: opened };
    // Like cp, no fsync: the data is in the page cache and the rename publishes it.
    execute(
        plan,
        root,
        &placements_for(plan, files),
        &sink,
        cancel,
        progress,
    )
}

/// Reserves the file's blocks (posix_fallocate), so that a full disk is reported before any data is
/// written; filesystems that cannot reserve get a sparse file of the right length instead.
fn allocate(f: &File, size: u64) -> std::io::Result<()> {
    use std::os::fd::AsRawFd;
    if size == 0 {
        return Ok(());
    }
    // SAFETY: plain syscall on a file descriptor we own, with in-range arguments.
    let rc = unsafe { libc::posix_fallocate(f.as_raw_fd(), 0, size as libc::off_t) };
    match rc {
        0 => Ok(()),
        libc::EOPNOTSUPP | libc::EINVAL => f.set_len(size),
        e => Err(std::io::Error::from_raw_os_error(e)),
    }
}
