//! The bytes of a store object that several processes of one node read (vLLM's workers, one
//! rank each: a row-parallel weight's column slices, replicated tensors), fetched from the store
//! once per node into a local file that the others then read through the page cache.
//!
//! A local folder shares such bytes through the page cache ([`crate::exec`]'s buffered twins);
//! an object has no page cache, so this file is one. It sits beside the object's header in the
//! source's cache folder, named by the object's etag, so that a replaced object is never served
//! from an older copy. Its unit is one tensor's whole data range, the same in every process
//! whatever part of it a rank reads: the first process to take the range's lock fetches it,
//! marks it done, and the others wait on the lock, then find it done. The locks are open file
//! description locks (`F_OFD_SETLKW`): per open, not per process, so two threads of one process
//! wait on each other as two processes do, and the kernel drops them with a process that dies
//! mid-fetch, whose range is then fetched again.
//!
//! The done marks are a second, sparse file of the object's length: the byte at a range's start
//! is 1 once the whole range is in the data file. A range is written before its mark, and both
//! through the page cache, which every process of the node sees alike.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::data::ObjectData;

/// Bytes per GET when a range is fetched: as the engine's chunks.
const PIECE: u64 = 16 << 20;

/// The node's copy of the shared ranges of one object.
#[derive(Debug)]
pub(crate) struct NodeCache {
    data: PathBuf,
    done: PathBuf,
    object: Arc<ObjectData>,
}

impl NodeCache {
    /// The node cache of `object`, whose weight file stands at `path` in the source's cache
    /// folder: its two files created (sparse, of the object's length) when they are not there.
    /// Copies kept for other etags of the same object are removed: that object was replaced.
    pub(crate) fn open(path: &Path, object: Arc<ObjectData>) -> io::Result<NodeCache> {
        let stem = format!(
            "{}.wload-node-{}",
            path.file_name().unwrap_or_default().to_string_lossy(),
            etag_name(&object.etag)
        );
        let dir = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(dir)?;
        remove_other_versions(dir, path, &stem);
        let cache = NodeCache {
            data: dir.join(&stem),
            done: dir.join(format!("{stem}.done")),
            object,
        };
        for p in [&cache.data, &cache.done] {
            let f = open_rw(p)?;
            // Every process sets the same length; once set, setting it again changes nothing.
            if f.metadata()?.len() != cache.object.size() {
                f.set_len(cache.object.size())?;
            }
        }
        Ok(cache)
    }

    /// The local file that holds the fetched ranges.
    pub(crate) fn path(&self) -> &Path {
        &self.data
    }

    /// Makes `[lo, hi)` of the object present in the local file: fetched from the store by the
    /// first process of the node to ask, waited for by the others. Returns the bytes this call
    /// fetched (0 when another process, or an earlier run, had).
    pub(crate) fn ensure(&self, lo: u64, hi: u64) -> io::Result<u64> {
        if hi <= lo {
            return Ok(0);
        }
        let data = open_rw(&self.data)?;
        let _lock = RangeLock::take(&data, lo, hi)?;
        let done = open_rw(&self.done)?;
        let mut mark = [0u8];
        done.read_exact_at(&mut mark, lo)?;
        if mark[0] == 1 {
            return Ok(0);
        }
        let mut buf = vec![0u8; PIECE.min(hi - lo) as usize];
        let mut at = lo;
        while at < hi {
            let n = PIECE.min(hi - at) as usize;
            self.object.read_exact_at(&mut buf[..n], at)?;
            data.write_all_at(&buf[..n], at)?;
            at += n as u64;
        }
        done.write_all_at(&[1], lo)?;
        Ok(hi - lo)
    }
}

fn open_rw(p: &Path) -> io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(p)
}

/// An etag as part of a file name: its letters, digits and dashes (S3's are hex, with quotes and
/// a part count; GCS's and Azure's are base64 or hex), at most 64 of them.
fn etag_name(etag: &str) -> String {
    let s: String = etag
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-')
        .take(64)
        .collect();
    if s.is_empty() { "none".into() } else { s }
}

/// Removes the node copies of `path` made for other etags than `stem`'s.
fn remove_other_versions(dir: &Path, path: &Path, stem: &str) {
    let Some(name) = path.file_name().map(|n| n.to_string_lossy().into_owned()) else {
        return;
    };
    let prefix = format!("{name}.wload-node-");
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let n = e.file_name().to_string_lossy().into_owned();
        let ours = n == stem || n.strip_suffix(".done") == Some(stem);
        if n.starts_with(&prefix) && !ours {
            // Best effort: a copy another process still reads stays readable through its handle.
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// An exclusive lock on `[lo, hi)` of a file, held until dropped (or the handle is closed).
struct RangeLock<'a> {
    file: &'a File,
    lo: u64,
    hi: u64,
}

impl<'a> RangeLock<'a> {
    fn take(file: &'a File, lo: u64, hi: u64) -> io::Result<RangeLock<'a>> {
        set_lock(file, libc::F_WRLCK, lo, hi)?;
        Ok(RangeLock { file, lo, hi })
    }
}

impl Drop for RangeLock<'_> {
    fn drop(&mut self) {
        let _ = set_lock(self.file, libc::F_UNLCK, self.lo, self.hi);
    }
}

fn set_lock(file: &File, kind: i32, lo: u64, hi: u64) -> io::Result<()> {
    // SAFETY: zeroed is a valid `flock` (OFD locks require l_pid 0), filled below.
    let mut l: libc::flock = unsafe { std::mem::zeroed() };
    l.l_type = kind as libc::c_short;
    l.l_whence = libc::SEEK_SET as libc::c_short;
    l.l_start = lo as libc::off_t;
    l.l_len = (hi - lo) as libc::off_t;
    loop {
        // SAFETY: a valid descriptor and a valid `flock`; F_OFD_SETLKW only reads it.
        let rc = unsafe { libc::fcntl(file.as_raw_fd(), libc::F_OFD_SETLKW, &l) };
        if rc == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn etag_names_keep_only_safe_characters() {
        assert_eq!(
            etag_name("\"9b2cf535f27731c974343645a3985328-3\""),
            "9b2cf535f27731c974343645a3985328-3"
        );
        assert_eq!(etag_name("\"/\""), "none");
        assert_eq!(etag_name(&"a".repeat(100)).len(), 64);
    }

    #[test]
    fn a_range_lock_waits_for_another_open_of_the_same_file() {
        let dir = tempfile::TempDir::new().unwrap();
        let p = dir.path().join("f");
        let (a, b) = (open_rw(&p).unwrap(), open_rw(&p).unwrap());
        let held = RangeLock::take(&a, 0, 10).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let t = std::thread::spawn(move || {
            let _l = RangeLock::take(&b, 5, 20).unwrap();
            tx.send(()).unwrap();
        });
        // The second open's lock waits while the first holds an overlapping range.
        assert!(
            rx.recv_timeout(std::time::Duration::from_millis(200))
                .is_err()
        );
        drop(held);
        rx.recv_timeout(std::time::Duration::from_secs(10)).unwrap();
        t.join().unwrap();
    }
}
