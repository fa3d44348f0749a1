//! Writing part files: headers first, data regions filled by the engine with positioned writes,
//! each file hashed for the manifest as soon as it is complete.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use super::parts::PartFile;
use super::{Control, ExecError, Placement, Sink, execute, placements_for};
use crate::plan::{Piece, Plan};

/// The user's escape hatch from `copy_file_range`: filesystems have shipped bugs in it (OpenZFS
/// 2.2.0's block cloning returned wrong data), and then every byte should pass through memory.
pub const NO_COPY_FILE_RANGE: &str = "WLOAD_NO_COPY_FILE_RANGE";

/// Whether [`NO_COPY_FILE_RANGE`] is set to something other than empty or `0`.
pub fn copy_file_range_disabled() -> bool {
    std::env::var_os(NO_COPY_FILE_RANGE).is_some_and(|v| !v.is_empty() && v != "0")
}

/// One output file being written, and what is known of its bytes so far.
struct Output {
    path: PathBuf,
    file: File,
    size: u64,
    state: Mutex<OutState>,
    /// Its XXH3, once hashed; `None` also after a failed hash (the error is in [`Hashing`]).
    hash: Mutex<Option<String>>,
}

#[derive(Default)]
struct OutState {
    written: Coverage,
    /// Its hash was started: every byte had been written.
    hashing: bool,
    /// A write came after that, so the hash may not be of the final bytes: hash again at the end.
    /// The engine writes every byte once, so this is a guard, not a path that runs.
    stale: bool,
}

/// The byte ranges of a file written so far, merged: `start → end`.
#[derive(Default)]
struct Coverage {
    spans: BTreeMap<u64, u64>,
    covered: u64,
}

impl Coverage {
    /// Adds `[a, b)`; returns how many bytes are now covered. Rewriting bytes counts them once.
    fn add(&mut self, mut a: u64, mut b: u64) -> u64 {
        if a >= b {
            return self.covered;
        }
        if let Some((&s, &e)) = self.spans.range(..=a).next_back()
            && e >= a
        {
            if e >= b {
                return self.covered;
            }
            self.spans.remove(&s);
            self.covered -= e - s;
            a = s;
        }
        while let Some((&s, &e)) = self.spans.range(a..=b).next() {
            self.spans.remove(&s);
            self.covered -= e - s;
            b = b.max(e);
        }
        self.spans.insert(a, b);
        self.covered += b - a;
        self.covered
    }
}

/// What the hashes running beside the writes share: when to stop, the first error, the time.
struct Hashing<'a> {
    cancel: &'a AtomicBool,
    /// Set when the write failed: the output is discarded, its hashes are not needed.
    failed: AtomicBool,
    error: Mutex<Option<ExecError>>,
    busy_ns: AtomicU64,
}

impl Hashing<'_> {
    fn stopped(&self) -> bool {
        self.cancel.load(Ordering::Relaxed) || self.failed.load(Ordering::Relaxed)
    }

    /// Hashes `out` from the page cache, where it was just written.
    fn hash(&self, out: &Output) {
        let t = Instant::now();
        match crate::manifest::hash_open(&out.file, &|| self.stopped()) {
            Ok(h) => *lock(&out.hash) = Some(h),
            Err(e) => {
                let e = if e.kind() == std::io::ErrorKind::Interrupted {
                    ExecError::Cancelled
                } else {
                    ExecError::io("reading back", &out.path, e)
                };
                lock(&self.error).get_or_insert(e);
            }
        }
        self.busy_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
    }
}

/// A poisoned lock only means another thread panicked while holding it; the data (spans, a
/// hash string) is still whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct FileSink<'s, 'scope, 'c> {
    outs: &'scope [Output],
    hashing: &'scope Hashing<'c>,
    scope: &'s rayon::Scope<'scope>,
    /// Data bytes written so far, for [`fail_after`].
    total: AtomicU64,
    fail_after: Option<u64>,
}

impl<'scope> FileSink<'_, 'scope, '_> {
    /// Records that `[offset, offset + len)` of output `out` is written; once the whole file is,
    /// hashes it beside the remaining writes (on the thread pool, which runs it when a thread is
    /// free), while its pages are still in the page cache.
    fn wrote(&self, out: usize, offset: u64, len: u64) {
        let o = &self.outs[out];
        let complete = {
            let mut st = lock(&o.state);
            if st.hashing {
                st.stale = true;
                return;
            }
            st.hashing = st.written.add(offset, offset + len) == o.size;
            st.hashing
        };
        if complete {
            self.spawn_hash(o);
        }
    }

    /// The test hook's failure ([`fail_after`]): the write that would take the run past its
    /// budget fails as on a full disk.
    fn budget(&self, out: usize, len: u64) -> Result<(), ExecError> {
        let Some(limit) = self.fail_after else {
            return Ok(());
        };
        if self.total.fetch_add(len, Ordering::Relaxed) + len > limit {
            let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
            return Err(ExecError::io("writing", &self.outs[out].path, e));
        }
        Ok(())
    }

    /// Hashes `o` on the pool; its `hashing` flag is already set.
    fn spawn_hash(&self, o: &'scope Output) {
        let hashing = self.hashing;
        self.scope.spawn(move |_| hashing.hash(o));
    }
}

impl Sink for FileSink<'_, '_, '_> {
    fn put(&self, out: usize, offset: u64, bytes: &[u8]) -> Result<(), ExecError> {
        self.budget(out, bytes.len() as u64)?;
        let o = &self.outs[out];
        o.file
            .write_all_at(bytes, offset)
            .map_err(|e| ExecError::io("writing", &o.path, e))?;
        self.wrote(out, offset, bytes.len() as u64);
        Ok(())
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
        self.budget(out, len)?;
        let Output { path, file: f, .. } = &self.outs[out];
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
        self.wrote(out, offset, len);
        Ok(true)
    }
}

/// What [`write_parts`] produced besides the files.
#[derive(Debug, Clone)]
pub struct Written {
    /// XXH3-64 of each file as written, hex, in the order of the `files` given.
    pub hashes: Vec<String>,
    /// Seconds from the engine's last write to the last hash: what hashing added to the write.
    pub hash_tail_s: f64,
    /// Seconds the hashing threads spent on it, summed (beside the writes for the files that
    /// completed before the last write).
    pub hash_busy_s: f64,
}

/// Creates `files` in `dir` (which must be new and empty), fills them from the checkpoint at
/// `root`, and hashes each one (XXH3-64, for the manifest) as soon as its last byte is written,
/// while the others are still being written. Files are sized up front, so what is never written
/// reads as zeros.
pub fn write_parts(
    plan: &Plan,
    root: &Path,
    dir: &Path,
    files: &[PartFile],
    ctl: &Control,
) -> Result<Written, ExecError> {
    let placements = placements_for(plan, files);
    let mut outs = Vec::with_capacity(files.len());
    for f in files {
        let path = dir.join(&f.name);
        // Readable too: the file is hashed through the same descriptor.
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .map_err(|e| ExecError::io("creating", &path, e))?;
        file.write_all_at(&f.header, 0)
            .map_err(|e| ExecError::io("writing", &path, e))?;
        // Reserve the space now, so a full disk fails here rather than halfway through.
        allocate(&file, f.size).map_err(|e| ExecError::io("allocating", &path, e))?;
        ctl.progress.advance(f.header.len() as u64);
        let mut written = Coverage::default();
        written.add(0, f.header.len() as u64);
        outs.push(Output {
            path,
            file,
            size: f.size,
            state: Mutex::new(OutState {
                written,
                ..Default::default()
            }),
            hash: Mutex::new(None),
        });
    }
    for (out, start, end) in zero_fills(plan, &placements) {
        lock(&outs[out].state).written.add(start, end);
    }
    let hashing = Hashing {
        cancel: ctl.cancel,
        failed: AtomicBool::new(false),
        error: Mutex::new(None),
        busy_ns: AtomicU64::new(0),
    };
    let mut last_write = Instant::now();
    // Like cp, no fsync: the data is in the page cache and the rename publishes it.
    rayon::in_place_scope(|scope| {
        let sink = FileSink {
            outs: &outs,
            hashing: &hashing,
            scope,
            total: AtomicU64::new(0),
            fail_after: fail_after(),
        };
        // Files with nothing for the engine to write (no tensors, or zeros only) are complete.
        for o in &outs {
            let complete = {
                let mut st = lock(&o.state);
                st.hashing = st.written.covered == o.size;
                st.hashing
            };
            if complete {
                sink.spawn_hash(o);
            }
        }
        let r = execute(plan, root, &placements, &sink, ctl);
        last_write = Instant::now();
        if r.is_err() {
            hashing.failed.store(true, Ordering::Relaxed);
        }
        r
    })?;
    if let Some(e) = lock(&hashing.error).take() {
        return Err(e);
    }
    let hashes = finish_hashes(&outs, &hashing)?;
    Ok(Written {
        hashes,
        hash_tail_s: last_write.elapsed().as_secs_f64(),
        hash_busy_s: crate::exec::Stats::secs(&hashing.busy_ns),
    })
}

/// Every file's hash: those taken during the write, and again, in parallel, any file that was
/// never seen complete or was written after its hash began. Neither happens with an engine that
/// writes each planned byte once, but the manifest must hold the hash of the bytes on disk, so
/// this does not rely on it.
fn finish_hashes(outs: &[Output], hashing: &Hashing) -> Result<Vec<String>, ExecError> {
    use rayon::prelude::*;
    outs.par_iter()
        .map(|o| {
            let (stale, known) = (lock(&o.state).stale, lock(&o.hash).take());
            match known {
                Some(h) if !stale => Ok(h),
                _ => {
                    hashing.hash(o);
                    match lock(&o.hash).take() {
                        Some(h) => Ok(h),
                        None => Err(lock(&hashing.error).take().unwrap_or(ExecError::Cancelled)),
                    }
                }
            }
        })
        .collect()
}

/// The byte ranges `(out, start, end)` of zero fills, which the engine skips on files that
/// start zeroed (as these do): they count as written from the start. The condition mirrors the
/// engine's (`execute`), which writes a fill when its value is not zero.
fn zero_fills(plan: &Plan, placements: &[Placement]) -> Vec<(usize, u64, u64)> {
    let mut v = Vec::new();
    for pl in placements {
        let t = &plan.ranks[pl.rank].tensors[pl.tensor];
        let item = t.dtype.bits() / 8;
        for piece in t.pieces.iter() {
            if let Piece::Fill {
                dst_start,
                count,
                value,
            } = piece
                && value.to_bits() == 0
            {
                let start = pl.offset + dst_start * item;
                v.push((pl.out, start, start + count * item));
            }
        }
    }
    v
}

/// Test hook (`WLOAD_TEST_WRITE_FAILS_AFTER=N`): the write that takes the run past `N` data bytes
/// fails with "No space left on device", so that tests can fail a run while the files completed
/// before are being hashed. Only in builds with the `test-hooks` feature (see src/exec/hooks.rs).
#[cfg(feature = "test-hooks")]
fn fail_after() -> Option<u64> {
    let v = std::env::var("WLOAD_TEST_WRITE_FAILS_AFTER").ok()?;
    // A typo must not quietly run the test without the failure.
    match v.trim().parse::<u64>() {
        Ok(n) => Some(n),
        _ => panic!("WLOAD_TEST_WRITE_FAILS_AFTER={v:?}: expected a byte count"),
    }
}

#[cfg(not(feature = "test-hooks"))]
fn fail_after() -> Option<u64> {
    None
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

#[cfg(test)]
mod tests {
    use super::Coverage;

    /// Covered bytes after each added range, checked against a byte map.
    fn check(ranges: &[(u64, u64)]) {
        let mut c = Coverage::default();
        let mut map = [false; 64];
        for &(a, b) in ranges {
            map[a as usize..b as usize]
                .iter_mut()
                .for_each(|x| *x = true);
            let want = map.iter().filter(|&&x| x).count() as u64;
            assert_eq!(c.add(a, b), want, "after {ranges:?} up to {a}..{b}");
        }
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (i, &x) in map.iter().enumerate() {
            let i = i as u64;
            match merged.last_mut() {
                Some(last) if x && last.1 == i => last.1 = i + 1,
                _ if x => merged.push((i, i + 1)),
                _ => {}
            }
        }
        let spans: Vec<(u64, u64)> = c.spans.iter().map(|(&a, &b)| (a, b)).collect();
        assert_eq!(spans, merged, "spans after {ranges:?}");
    }

    #[test]
    fn coverage_merges_and_counts_rewrites_once() {
        check(&[(0, 8), (8, 16)]); // adjacent
        check(&[(8, 16), (0, 8)]); // adjacent, backwards
        check(&[(0, 8), (0, 8), (2, 5)]); // rewrites, inside
        check(&[(10, 20), (30, 40), (5, 50)]); // one range over two
        check(&[(10, 20), (15, 35), (30, 40)]); // overlapping chains
        check(&[(10, 20), (20, 20), (25, 25)]); // empty ranges
        check(&[(40, 48), (0, 4), (20, 24), (4, 20), (24, 40)]); // out of order, then whole
        check(&[(5, 10), (0, 6), (9, 12)]); // overlaps on both sides
    }
}
