//! A file's identity and version as the file system states it (device, inode, size, modification
//! and change times): taken when a weight file's header is read, and compared again when its
//! tensor data is read, so that a run reads exactly the file it planned from.
//!
//! Why a stamp and not only the descriptor: stages are apart (headers are read by `open`, data by
//! `exec`, possibly after minutes of planning or downloading), and the engine opens files again
//! in the mode the run reads with (buffered, O_DIRECT, mapped). A checkpoint being re-downloaded
//! or synced meanwhile is replaced by rename (a new inode) or rewritten in place (new times, maybe
//! a new size); either shows in the stamp. The change time (`ctime`) cannot be set back by any
//! user tool (`touch -d` sets it to now), so a rewrite that restores `mtime` still shows. What a
//! stamp cannot see is a rewrite within the same tick of the file system's clock as the file's
//! previous change, with the same size: a writer finishing a file and then rewriting it within a
//! few milliseconds, before wload looked at it at all.

use std::fmt;
use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::MetadataExt;

/// What the file system says of a file at one moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FileStamp {
    pub dev: u64,
    pub ino: u64,
    pub size: u64,
    /// Modification time, nanoseconds since the epoch.
    pub mtime_ns: i128,
    /// Status change time, nanoseconds since the epoch.
    pub ctime_ns: i128,
}

impl FileStamp {
    pub(crate) fn of_metadata(m: &Metadata) -> FileStamp {
        let ns = |s: i64, n: i64| i128::from(s) * 1_000_000_000 + i128::from(n);
        FileStamp {
            dev: m.dev(),
            ino: m.ino(),
            size: m.len(),
            mtime_ns: ns(m.mtime(), m.mtime_nsec()),
            ctime_ns: ns(m.ctime(), m.ctime_nsec()),
        }
    }

    /// The stamp of an open file (fstat: the file this descriptor reads, whatever its path
    /// names now).
    pub(crate) fn of_file(f: &File) -> io::Result<FileStamp> {
        f.metadata().map(|m| FileStamp::of_metadata(&m))
    }

    /// How `now` differs from `self`, in words; `None` when it is the same file, unchanged.
    pub(crate) fn change_to(&self, now: &FileStamp) -> Option<Change> {
        if (self.dev, self.ino) != (now.dev, now.ino) {
            Some(Change::Replaced)
        } else if self.size != now.size {
            Some(Change::Resized {
                from: self.size,
                to: now.size,
            })
        } else if (self.mtime_ns, self.ctime_ns) != (now.mtime_ns, now.ctime_ns) {
            Some(Change::Rewritten)
        } else {
            None
        }
    }
}

/// How a file differs from the one whose header a run planned from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// The path now names another file (replaced by rename, or deleted and written anew).
    Replaced,
    /// Same file, another size (truncated, or written on).
    Resized { from: u64, to: u64 },
    /// Same file and size, but written to (its modification or change time moved).
    Rewritten,
}

impl fmt::Display for Change {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Change::Replaced => f.write_str("the path now names another file (replaced)"),
            Change::Resized { from, to } if to < from => {
                write!(f, "it shrank from {from} to {to} bytes")
            }
            Change::Resized { from, to } => write!(f, "it grew from {from} to {to} bytes"),
            Change::Rewritten => f.write_str("it was written to (its modification time moved)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    #[test]
    fn a_stamp_sees_replacement_resizing_and_rewriting() {
        let dir = tempfile::TempDir::new().unwrap();
        let p = dir.path().join("a");
        std::fs::write(&p, b"0123456789").unwrap();
        let before = FileStamp::of_file(&File::open(&p).unwrap()).unwrap();
        assert_eq!(before.change_to(&before), None);

        let mut f = std::fs::OpenOptions::new().append(true).open(&p).unwrap();
        f.write_all(b"x").unwrap();
        let grown = FileStamp::of_file(&f).unwrap();
        assert_eq!(
            before.change_to(&grown),
            Some(Change::Resized { from: 10, to: 11 })
        );

        let mut same_size = grown;
        same_size.mtime_ns += 1;
        assert_eq!(grown.change_to(&same_size), Some(Change::Rewritten));

        let q = dir.path().join("b");
        std::fs::write(&q, b"0123456789x").unwrap();
        std::fs::rename(&q, &p).unwrap();
        let replaced = FileStamp::of_file(&File::open(&p).unwrap()).unwrap();
        assert_eq!(grown.change_to(&replaced), Some(Change::Replaced));
    }
}
