//! Reading the small text files of a checkpoint or the command line (config.json, params.json,
//! the index, a mapping, a manifest) without hanging or exhausting memory: a named pipe, a device
//! such as /dev/zero or a multi-gigabyte file under one of these names is refused by name.

use std::fs::{self, File};
use std::io::{self, Read};
use std::path::Path;

/// Larger than any real config, index or mapping (a 400B model's index is about 5 MB).
pub(crate) const LIMIT: u64 = 64 << 20;

/// Whether `path` is a regular file (following links), so that opening it cannot block (a
/// named pipe waits for a writer) and reading it ends.
pub(crate) fn check_regular(path: &Path) -> io::Result<fs::Metadata> {
    let meta = fs::metadata(path)?;
    if meta.is_file() {
        return Ok(meta);
    }
    let what = if meta.is_dir() {
        "a folder"
    } else {
        use std::os::unix::fs::FileTypeExt;
        let t = meta.file_type();
        if t.is_fifo() {
            "a named pipe"
        } else if t.is_char_device() || t.is_block_device() {
            "a device"
        } else {
            "a socket or other special file"
        }
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("is {what}, not a regular file"),
    ))
}

/// A file past the limit it was read under: carried inside the `io::Error` [`read`] and
/// [`read_at_most`] return (kind `FileTooLarge`), so that a caller can tell the file's fault (a
/// checkpoint's config or index that no real model has) from a failure to read it
/// ([`is_too_large`]).
#[derive(Debug)]
pub(crate) struct TooLarge {
    limit: u64,
    /// Read by [`read`], for a checkpoint's or the command line's files: the message says how
    /// far real ones are from the limit.
    checkpoint_file: bool,
}

impl std::fmt::Display for TooLarge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.checkpoint_file {
            write!(
                f,
                "is larger than {} MiB, the limit for such a file (a 400B model's index is about 5 MB)",
                LIMIT >> 20
            )
        } else {
            write!(
                f,
                "is larger than {}, wload's limit",
                crate::units::human_bytes(self.limit)
            )
        }
    }
}

impl std::error::Error for TooLarge {}

/// Whether [`read`] or [`read_at_most`] refused the file for its size: the file's fault, not an
/// I/O failure.
pub(crate) fn is_too_large(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<TooLarge>())
}

/// The whole file, if it is a regular file of at most [`LIMIT`] bytes.
pub(crate) fn read(path: &Path) -> io::Result<Vec<u8>> {
    read_capped(path, LIMIT, true)
}

/// The whole file, if it is a regular file of at most `limit` bytes: for files smaller than
/// [`LIMIT`] by nature (a ref, a cache record), whose size cap is theirs.
pub(crate) fn read_at_most(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    read_capped(path, limit, false)
}

fn read_capped(path: &Path, limit: u64, checkpoint_file: bool) -> io::Result<Vec<u8>> {
    check_regular(path)?;
    let mut buf = Vec::new();
    File::open(path)?.take(limit + 1).read_to_end(&mut buf)?;
    if buf.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            TooLarge {
                limit,
                checkpoint_file,
            },
        ));
    }
    Ok(buf)
}

/// [`read`] as UTF-8 text.
pub(crate) fn read_to_string(path: &Path) -> io::Result<String> {
    String::from_utf8(read(path)?)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "is not UTF-8 text"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn special_files_are_refused_without_blocking() {
        let e = read(Path::new("/dev/zero")).unwrap_err();
        assert_eq!(e.to_string(), "is a device, not a regular file");
        let dir = tempfile::TempDir::new().unwrap();
        let fifo = dir.path().join("config.json");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = read_to_string(&fifo).unwrap_err();
        assert_eq!(e.to_string(), "is a named pipe, not a regular file");
        assert!(
            read(dir.path())
                .unwrap_err()
                .to_string()
                .contains("a folder")
        );
    }

    #[test]
    fn oversized_files_are_refused() {
        let dir = tempfile::TempDir::new().unwrap();
        let big = dir.path().join("big.json");
        File::create(&big).unwrap().set_len(LIMIT + 1).unwrap();
        let e = read(&big).unwrap_err();
        assert!(e.to_string().contains("larger than 64 MiB"), "{e}");
        assert!(is_too_large(&e));
        assert!(!is_too_large(&read(Path::new("/dev/zero")).unwrap_err()));
        let ok = dir.path().join("ok.json");
        fs::write(&ok, b"{}").unwrap();
        assert_eq!(read_to_string(&ok).unwrap(), "{}");
    }
}
