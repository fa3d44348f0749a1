//! Writing part files: headers first, data regions filled by the engine with positioned writes.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::parts::PartFile;
use super::{Control, ExecError, Sink, execute, placements_for};
use crate::plan::Plan;

/// The user's escape hatch from `copy_file_range`: filesystems have shipped bugs in it (OpenZFS
/// 2.2.0's block cloning returned wrong data), and then every byte should pass through memory.
pub const NO_COPY_FILE_RANGE: &str = "WLOAD_NO_COPY_FILE_RANGE";

/// Whether [`NO_COPY_FILE_RANGE`] is set to something other than empty or `0`.
pub fn copy_file_range_disabled() -> bool {
    std::env::var_os(NO_COPY_FILE_RANGE).is_some_and(|v| !v.is_empty() && v != "0")
}

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

    fn copy_from_file(
        &self,
        out: usize,
        offset: u64,
        src: &File,
        src_offset: u64,
        len: u64,
    ) -> Result<bool, ExecError> {
        use std::os::fd::AsRawFd;
        let (path, f) = &self.files[out];
        let (mut off_in, mut off_out) = (src_offset as libc::loff_t, offset as libc::loff_t);
        let mut left = len as usize;
        while left > 0 {
            // SAFETY: valid descriptors we own, offsets passed by pointer as the syscall wants.
            let n = unsafe {
                libc::copy_file_range(
                    src.as_raw_fd(),
                    &mut off_in,
                    f.as_raw_fd(),
                    &mut off_out,
                    left,
                    0,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                let unsupported = matches!(
                    e.raw_os_error(),
                    Some(libc::EXDEV | libc::ENOSYS | libc::EOPNOTSUPP | libc::EINVAL)
                );
                if unsupported && left == len as usize {
                    // This filesystem pair cannot: the caller reads and writes instead.
                    return Ok(false);
                }
                return Err(ExecError::io("writing", path, e));
            }
            if n == 0 {
                return Err(ExecError::Corrupt {
                    path: path.clone(),
                    message: "source ended early (truncated?)".into(),
                });
            }
            left -= n as usize;
        }
        Ok(true)
    }
}

/// Creates `files` in `dir` (which must be new and empty) and fills them from the checkpoint at
/// `root`. Files are sized up front, so what is never written reads as zeros.
pub fn write_parts(
    plan: &Plan,
    root: &Path,
    dir: &Path,
    files: &[PartFile],
    ctl: &Control,
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
        ctl.progress.advance(f.header.len() as u64);
        opened.push((path, file));
    }
    let sink = FileSink { files: opened };
    // Like cp, no fsync: the data is in the page cache and the rename publishes it.
    execute(plan, root, &placements_for(plan, files), &sink, ctl)
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
