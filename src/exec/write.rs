//! Writing part files: headers first, data regions filled by the engine with positioned writes,
//! each file's checksum for the manifest summed from its blocks as they are written.

use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use super::jobs::{pads_rows, placements_for, zero_fills};
use super::parts::PartFile;
use super::source::SourceFile;
use super::{Control, ExecError, Sink, execute};
use crate::checksum;
use crate::plan::Plan;

/// The user's escape hatch from `copy_file_range`: filesystems have shipped bugs in it (OpenZFS
/// 2.2.0's block cloning returned wrong data), and then every byte should pass through memory.
pub(crate) const NO_COPY_FILE_RANGE: &str = "WLOAD_NO_COPY_FILE_RANGE";

/// Whether [`NO_COPY_FILE_RANGE`] is set to something other than empty or `0`.
pub(crate) fn copy_file_range_disabled() -> bool {
    std::env::var_os(NO_COPY_FILE_RANGE).is_some_and(|v| !v.is_empty() && v != "0")
}

/// The most one `pwrite` writes. The page cache sizes a file's folios by the write that creates
/// them, and on the 2-core VM of docs/benchmarks.md writes of 256 KiB to 2 MiB (the gathered
/// strided rows of a TP 8 MXFP4 shard) ran at a third to a tenth of the speed of 32–64 KiB ones
/// (system time 1.1–1.6 s against 2.5–5.7 s for the same 1.1 GB); each step's bytes are still
/// one put for the checksum.
const WRITE_STEP: u64 = 64 << 10;

/// One output file being written, and what is known of its bytes so far.
struct Output {
    path: PathBuf,
    file: File,
    size: u64,
    state: Mutex<OutState>,
    /// The sum of the digests of the blocks hashed so far ([`checksum`]).
    sum: AtomicU64,
}

#[derive(Default)]
struct OutState {
    written: Coverage,
    /// A byte was written twice, so a block may have been hashed before its final bytes: hash
    /// the whole file again at the end. The engine writes every byte once, so this is a guard,
    /// not a path that runs.
    stale: bool,
}

/// What a write put into a file, for its checksum: bytes in memory, zeros, or bytes the kernel
/// copied (`copy_file_range`), which only the file holds.
#[derive(Clone, Copy)]
enum Wrote<'a> {
    Bytes(&'a [u8]),
    Zeros(u64),
    OnDisk(u64),
}

impl Wrote<'_> {
    fn len(&self) -> u64 {
        match *self {
            Wrote::Bytes(b) => b.len() as u64,
            Wrote::Zeros(n) | Wrote::OnDisk(n) => n,
        }
    }
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

    /// Whether every byte of `[a, b)` is written.
    fn covers(&self, a: u64, b: u64) -> bool {
        self.spans
            .range(..=a)
            .next_back()
            .is_some_and(|(_, &e)| e >= b)
    }
}

/// The blocks a write of `[a, b)` to a file of `size` bytes holds whole (`[first, end)`, maybe
/// empty), and the at most two it holds in part.
fn blocks_of(a: u64, b: u64, size: u64) -> ((u64, u64), [Option<u64>; 2]) {
    let first = a.div_ceil(checksum::BLOCK);
    if a >= b {
        return ((first, first), [None, None]);
    }
    // The file's last block is whole when the write reaches the end of the file.
    let end = if b == size {
        size.div_ceil(checksum::BLOCK)
    } else {
        checksum::block_of(b)
    }
    .max(first);
    let (p, q) = (checksum::block_of(a), checksum::block_of(b - 1));
    let partial = |k: u64| !(first..end).contains(&k);
    (
        (first, end),
        [
            Some(p).filter(|&k| partial(k)),
            Some(q).filter(|&k| k != p && partial(k)),
        ],
    )
}

/// What the writing threads share for the checksums: when to stop, the time spent hashing.
struct Hashing<'a> {
    cancel: &'a AtomicBool,
    busy_ns: AtomicU64,
}

thread_local! {
    /// A thread's buffer for reading blocks back.
    static READ_BACK: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
}

impl Hashing<'_> {
    /// Adds to `out`'s checksum what the write `w` at `offset` completed: the blocks it holds
    /// whole, hashed from its bytes where it has them, and any block it finished in part, read
    /// back from the page cache (where another thread wrote the rest).
    fn wrote(&self, out: &Output, offset: u64, w: Wrote) -> Result<(), ExecError> {
        let end = offset + w.len();
        let ((first, last), parts) = blocks_of(offset, end, out.size);
        let finished = {
            let mut st = lock(&out.state);
            let before = st.written.covered;
            if st.written.add(offset, end) - before < end - offset {
                st.stale = true;
            }
            if st.stale {
                return Ok(());
            }
            parts.map(|p| {
                p.filter(|&b| {
                    let (s, e) = checksum::block_span(b, out.size);
                    st.written.covers(s, e)
                })
            })
        };
        let t = Instant::now();
        let mut sum = 0u64;
        match w {
            Wrote::Bytes(bytes) => {
                for b in first..last {
                    let (s, e) = checksum::block_span(b, out.size);
                    let bytes = &bytes[(s - offset) as usize..(e - offset) as usize];
                    sum = sum.wrapping_add(checksum::block(b, bytes));
                }
            }
            Wrote::Zeros(_) => {
                for b in first..last {
                    let (s, e) = checksum::block_span(b, out.size);
                    sum = sum.wrapping_add(checksum::zero_block(b, e - s));
                }
            }
            Wrote::OnDisk(_) => sum = self.read_back(out, (first, last))?,
        }
        for b in finished.into_iter().flatten() {
            sum = sum.wrapping_add(self.read_back(out, (b, b + 1))?);
        }
        out.sum.fetch_add(sum, Ordering::Relaxed);
        self.busy_ns
            .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    /// The digests of blocks `[first, end)` of `out`, read back.
    fn read_back(&self, out: &Output, blocks: (u64, u64)) -> Result<u64, ExecError> {
        if blocks.0 >= blocks.1 {
            return Ok(0);
        }
        let stop = || self.cancel.load(Ordering::Relaxed);
        READ_BACK
            .with_borrow_mut(|buf| checksum::read_blocks(&out.file, out.size, blocks, buf, &stop))
            .map_err(|e| read_back_error(out, e))
    }
}

fn read_back_error(out: &Output, e: std::io::Error) -> ExecError {
    if e.kind() == std::io::ErrorKind::Interrupted {
        ExecError::Cancelled
    } else {
        ExecError::io("reading back", &out.path, e)
    }
}

/// A poisoned lock only means another thread panicked while holding it; the data (spans) is
/// still whole.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

struct FileSink<'a, 'c> {
    outs: &'a [Output],
    hashing: &'a Hashing<'c>,
    /// Data bytes written so far, for [`fail_after`].
    total: AtomicU64,
    fail_after: Option<u64>,
}

impl FileSink<'_, '_> {
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
}

impl Sink for FileSink<'_, '_> {
    fn put(&self, out: usize, offset: u64, bytes: &[u8]) -> Result<(), ExecError> {
        self.budget(out, bytes.len() as u64)?;
        let o = &self.outs[out];
        // In steps that end on WRITE_STEP boundaries of the file: see there.
        let mut at = 0;
        while at < bytes.len() {
            let to = offset + at as u64;
            let n = ((to / WRITE_STEP + 1) * WRITE_STEP - to).min((bytes.len() - at) as u64);
            let piece = &bytes[at..at + n as usize];
            o.file
                .write_all_at(piece, to)
                .map_err(|e| ExecError::io("writing", &o.path, e))?;
            at += n as usize;
        }
        self.hashing.wrote(o, offset, Wrote::Bytes(bytes))
    }

    fn starts_zeroed(&self) -> bool {
        true
    }

    /// Copies with copy_file_range, in steps of [`checksum::READ_STEP`] (on the output's step
    /// boundaries): each step's blocks are read back for the checksum right after the kernel's
    /// copy, while they are still in the core's cache, rather than from memory later.
    fn copy_from_file(
        &self,
        out: usize,
        offset: u64,
        src: &SourceFile,
        src_offset: u64,
        len: u64,
    ) -> Result<bool, ExecError> {
        if src.object().is_some() {
            return Ok(false);
        }
        self.budget(out, len)?;
        let o = &self.outs[out];
        let step = checksum::READ_STEP as u64;
        let mut at = 0;
        while at < len {
            let to = offset + at;
            let n = ((to / step + 1) * step - to).min(len - at);
            if !kernel_copy(o, src, (src_offset + at, to, n), at == 0)? {
                // This filesystem pair cannot: the caller reads and writes instead.
                return Ok(false);
            }
            self.hashing.wrote(o, to, Wrote::OnDisk(n))?;
            at += n;
        }
        Ok(true)
    }
}

/// Copies `len` bytes from `src_offset` of `src` to `offset` of `o` with copy_file_range;
/// `Ok(false)` when the filesystems cannot and `first` (no byte of the span copied yet), else
/// that is an error.
fn kernel_copy(
    o: &Output,
    src: &SourceFile,
    (src_offset, offset, len): (u64, u64, u64),
    first: bool,
) -> Result<bool, ExecError> {
    use std::os::fd::AsRawFd;
    // An object in a store has no descriptor: its bytes come through the read buffer.
    let Some(src_file) = &src.file else {
        return Ok(false);
    };
    let (mut off_in, mut off_out) = (src_offset as libc::loff_t, offset as libc::loff_t);
    let mut left = len as usize;
    while left > 0 {
        // SAFETY: valid descriptors we own, offsets passed by pointer as the syscall wants.
        let n = unsafe {
            libc::copy_file_range(
                src_file.as_raw_fd(),
                &mut off_in,
                o.file.as_raw_fd(),
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
            if unsupported && first && left == len as usize {
                return Ok(false);
            }
            return Err(ExecError::io("writing", &o.path, e));
        }
        if n == 0 {
            // The source, not the part file being written: it ends before the bytes its header
            // promised (the engine's check after reading says whether it shrank meanwhile).
            return Err(ExecError::Corrupt {
                path: src.path.clone(),
                message: format!(
                    "the file ends before byte {} that its header promises (truncated?)",
                    off_in as u64 + left as u64
                ),
            });
        }
        left -= n as usize;
    }
    Ok(true)
}

/// What [`write_parts`] produced besides the files.
#[derive(Debug, Clone)]
pub(crate) struct Written {
    /// Each file's checksum ([`checksum`]), in the order of the `files` given.
    pub hashes: Vec<String>,
    /// Seconds from the engine's last write to the last checksum: what hashing added after the
    /// write (about nothing, unless a file had to be read back whole).
    pub hash_tail_s: f64,
    /// Seconds the writing threads spent hashing and reading blocks back, summed.
    pub hash_busy_s: f64,
}

/// Creates `files` in `dir` (which must be new and empty), fills them from the checkpoint at
/// `root`, and computes each one's checksum for the manifest ([`checksum`]) as its blocks are
/// written. Files are sized up front, so what is never written reads as zeros.
pub(crate) fn write_parts(
    plan: &Plan,
    root: &Path,
    dir: &Path,
    files: &[PartFile],
    ctl: &Control,
) -> Result<Written, ExecError> {
    let placements = placements_for(plan, files);
    let hashing = Hashing {
        cancel: ctl.cancel,
        busy_ns: AtomicU64::new(0),
    };
    let outs = create(dir, files, &hashing, ctl)?;
    let sink = FileSink {
        outs: &outs,
        hashing: &hashing,
        total: AtomicU64::new(0),
        fail_after: fail_after(),
    };
    // The engine skips the zero fills (the files start zeroed): their blocks are hashed now,
    // but for the row padding that copies write with their rows (and so hash).
    for (out, start, end) in zero_fills(plan, &placements, pads_rows(&sink)) {
        hashing.wrote(&outs[out], start, Wrote::Zeros(end - start))?;
    }
    // Like cp, no fsync: the data is in the page cache and the rename publishes it.
    execute(plan, root, &placements, &sink, ctl)?;
    let last_write = Instant::now();
    let hashes = finish_hashes(&outs, &hashing)?;
    Ok(Written {
        hashes,
        hash_tail_s: last_write.elapsed().as_secs_f64(),
        hash_busy_s: crate::exec::Stats::secs(&hashing.busy_ns),
    })
}

/// The output files, created with their headers written (and hashed) and their space reserved.
fn create(
    dir: &Path,
    files: &[PartFile],
    hashing: &Hashing,
    ctl: &Control,
) -> Result<Vec<Output>, ExecError> {
    let mut outs = Vec::with_capacity(files.len());
    for f in files {
        let path = dir.join(&f.name);
        // Readable too: blocks are read back through the same descriptor.
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
        let out = Output {
            path,
            file,
            size: f.size,
            state: Mutex::new(OutState::default()),
            sum: AtomicU64::new(0),
        };
        hashing.wrote(&out, 0, Wrote::Bytes(&f.header))?;
        outs.push(out);
    }
    Ok(outs)
}

/// Every file's checksum: the sum of its blocks' digests, or, for a file with a byte written
/// twice or never, the whole file read back (in parallel). Neither happens with an engine that
/// writes each planned byte once, but the manifest must hold the checksum of the bytes on disk,
/// so this does not rely on it.
fn finish_hashes(outs: &[Output], hashing: &Hashing) -> Result<Vec<String>, ExecError> {
    use rayon::prelude::*;
    outs.par_iter()
        .map(|o| {
            let whole = {
                let st = lock(&o.state);
                !st.stale && st.written.covered == o.size
            };
            if whole {
                return Ok(checksum::text(o.sum.load(Ordering::Relaxed)));
            }
            let t = Instant::now();
            let stop = || hashing.cancel.load(Ordering::Relaxed);
            let r = checksum::of_open(&o.file, &stop).map_err(|e| read_back_error(o, e));
            hashing
                .busy_ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            r
        })
        .collect()
}

/// Test hook (`WLOAD_TEST_WRITE_FAILS_AFTER=N`): the write that takes the run past `N` data bytes
/// fails with "No space left on device", so that tests can fail a run partway, with some blocks
/// already hashed. Only in builds with the `test-hooks` feature (see src/exec/hooks.rs).
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
    use super::{Coverage, blocks_of};
    use crate::checksum::BLOCK;

    /// The blocks a write holds whole and in part, against a block-by-block count, around
    /// block edges and the end of the file.
    #[test]
    fn blocks_of_splits_writes_into_whole_and_partial_blocks() {
        let edges = [
            0,
            1,
            BLOCK - 1,
            BLOCK,
            BLOCK + 1,
            2 * BLOCK,
            3 * BLOCK - 5,
            3 * BLOCK,
        ];
        for size in [BLOCK / 2, BLOCK, 2 * BLOCK + 7, 3 * BLOCK] {
            for &a in edges.iter().filter(|&&a| a <= size) {
                for &b in edges
                    .iter()
                    .chain([&size])
                    .filter(|&&b| b >= a && b <= size)
                {
                    let ((first, end), parts) = blocks_of(a, b, size);
                    let mut whole = Vec::new();
                    let mut part = Vec::new();
                    for k in 0..size.div_ceil(BLOCK) {
                        let (s, e) = (k * BLOCK, ((k + 1) * BLOCK).min(size));
                        let (lo, hi) = (a.max(s), b.min(e));
                        if lo >= hi {
                            continue;
                        }
                        if lo == s && hi == e {
                            whole.push(k);
                        } else {
                            part.push(k);
                        }
                    }
                    let got: Vec<u64> = (first..end).collect();
                    assert_eq!(got, whole, "whole blocks of {a}..{b} in {size}");
                    let got: Vec<u64> = parts.into_iter().flatten().collect();
                    assert_eq!(got, part, "partial blocks of {a}..{b} in {size}");
                }
            }
        }
    }

    #[test]
    fn coverage_knows_when_a_range_is_written() {
        let mut c = Coverage::default();
        c.add(10, 20);
        c.add(30, 40);
        assert!(c.covers(10, 20) && c.covers(12, 18) && !c.covers(5, 15) && !c.covers(15, 35));
        c.add(20, 30);
        assert!(c.covers(10, 40) && !c.covers(10, 41));
    }

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
