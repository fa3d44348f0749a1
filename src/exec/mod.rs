//! Execute: carry out a plan's block moves. One engine serves every destination (files being
//! written, files being verified, host memory): it reads each source tensor once, in bounded
//! chunks, and hands every destination its converted bytes through a [`Sink`].

#[cfg(test)]
mod chunk_tests;
pub mod convert;
pub mod cuda;
pub mod device;
pub(crate) mod hooks;
pub mod load;
pub mod parts;
mod sigbus;
pub mod storage;
pub mod verify;
pub mod write;

use std::fs::File;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use rayon::prelude::*;

use self::storage::{AlignedBuf, Busy, IoMode, SourceFile};
use crate::dtype::Dtype;
use crate::file_stamp::{Change, FileStamp};
use crate::plan::layout::Block;
use crate::plan::{Piece, Plan, SourceTensor};
use crate::progress::Progress;

/// Source bytes read per step; with one step in flight per thread this bounds memory.
pub const CHUNK_BYTES: u64 = 16 << 20;

/// Reads in flight with O_DIRECT at least: they wait on the storage, not on a core, and a disk
/// needs several queued to reach its sequential limit (measured on a 2-core VM: 0.50 GB/s with
/// 2 threads, 0.69 with 4, 0.86 with 8, which is what `dd bs=16M` reads).
pub const DIRECT_THREADS: usize = 8;

/// Worker threads for a run reading with `io`: one per core, and at least [`DIRECT_THREADS`]
/// for direct reads.
pub fn worker_threads(io: IoMode) -> usize {
    let cores = rayon::current_num_threads();
    match io {
        IoMode::Direct => cores.max(DIRECT_THREADS),
        _ => cores,
    }
}

/// How the engine moves bytes. Not user settings: the defaults are what wload runs with; tests
/// shrink the chunk so that tiny fixtures cross chunk boundaries everywhere.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExecOptions {
    /// Source bytes read per step (whole elements, at least one), and the most handed to one
    /// [`Sink::copy_from_file`] call.
    pub chunk_bytes: u64,
    /// Let the sink take dense unconverted spans straight from the file ([`Sink::copy_from_file`]);
    /// off, every byte passes through the read buffer.
    pub direct: bool,
    /// How source files are read (resolved: `auto` reads as buffered).
    pub io: IoMode,
}

impl Default for ExecOptions {
    fn default() -> ExecOptions {
        ExecOptions {
            chunk_bytes: CHUNK_BYTES,
            direct: true,
            io: IoMode::Buffered,
        }
    }
}

impl ExecOptions {
    /// The defaults, with the chunk size that test builds may set (`WLOAD_TEST_CHUNK_BYTES`),
    /// and no direct file-to-file copies when the user turned them off
    /// (`WLOAD_NO_COPY_FILE_RANGE`).
    pub fn for_run() -> ExecOptions {
        ExecOptions {
            chunk_bytes: hooks::chunk_bytes().unwrap_or(CHUNK_BYTES),
            direct: !write::copy_file_range_disabled(),
            io: IoMode::Buffered,
        }
    }
}

/// Where converted bytes go.
pub trait Sink: Sync {
    /// `bytes` belong at byte `offset` of output `out`.
    fn put(&self, out: usize, offset: u64, bytes: &[u8]) -> Result<(), ExecError>;
    /// Outputs start as zeros (fresh sparse files, zeroed memory): zero fills can be skipped.
    fn starts_zeroed(&self) -> bool;
    /// Small puts cost no more than large ones (host memory): strided rows are put one by one
    /// instead of being gathered first.
    fn cheap_small_puts(&self) -> bool {
        false
    }
    /// Copies `len` bytes of `src` from `src_offset` straight to `offset` of output `out`, when
    /// the sink can do that without the bytes passing through memory (files: copy_file_range).
    /// `Ok(false)`: not possible here; the caller reads and [`Sink::put`]s instead.
    fn copy_from_file(
        &self,
        _out: usize,
        _offset: u64,
        _src: &SourceFile,
        _src_offset: u64,
        _len: u64,
    ) -> Result<bool, ExecError> {
        Ok(false)
    }
    /// Copies `len` bytes of source `src` from `src_offset` to `offset` of output `out` without
    /// the engine's read buffer (into a device's staging, or file to file); `Ok(false)`: not
    /// possible, the caller reads and [`Sink::put`]s. By default, file to file, and only for
    /// buffered sources: a kernel copy goes through the page cache, which direct and mapped
    /// reads were chosen to measure or avoid.
    fn copy_from_source(
        &self,
        out: usize,
        offset: u64,
        src: &SourceFile,
        src_offset: u64,
        len: u64,
    ) -> Result<bool, ExecError> {
        if src.mode() != IoMode::Buffered {
            return Ok(false);
        }
        self.copy_from_file(out, offset, src, src_offset, len)
    }
}

/// Time spent per stage, summed over worker threads (nanoseconds), and bytes read.
#[derive(Debug, Default)]
pub struct Stats {
    pub read_ns: AtomicU64,
    pub convert_ns: AtomicU64,
    pub put_ns: AtomicU64,
    pub bytes_read: AtomicU64,
    /// The engine's own reads (into its buffers; a sink's reads are the sink's to count).
    pub read: Busy,
}

impl Stats {
    pub fn secs(v: &AtomicU64) -> f64 {
        v.load(Ordering::Relaxed) as f64 / 1e9
    }
}

fn add_since(v: &AtomicU64, t: Instant) {
    v.fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
}

#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path}: tensor '{tensor}' differs from what the plan computes, at byte {offset} of the file"
    )]
    Mismatch {
        path: PathBuf,
        tensor: String,
        offset: u64,
    },
    /// A device (GPU, host memory) failed.
    #[error(transparent)]
    Device(#[from] device::DeviceError),
    /// A checkpoint file is not what its header promises (truncated).
    #[error("{path}: {message}")]
    Corrupt { path: PathBuf, message: String },
    /// A written file does not read back as written.
    #[error("{path}: verification failed: {message}")]
    Verify { path: PathBuf, message: String },
    #[error(transparent)]
    Open(#[from] storage::OpenError),
    /// A source file is no longer the file whose header the plan was made from. Whatever was
    /// read of it is thrown away: the run stops before anything is published.
    #[error(
        "{path} changed since its header was read: {change}. Something is writing the \
         checkpoint (a download or a sync?); wload stops rather than use bytes it did not plan: \
         run again once nothing writes to it"
    )]
    SourceChanged {
        path: PathBuf,
        change: crate::file_stamp::Change,
    },
    #[error("interrupted")]
    Cancelled,
}

impl ExecError {
    pub fn exit_status(&self) -> crate::exit::ExitStatus {
        use crate::exit::ExitStatus;
        match self {
            ExecError::Corrupt { .. } => ExitStatus::Checkpoint,
            ExecError::Cancelled => ExitStatus::Interrupted,
            _ => ExitStatus::Runtime,
        }
    }

    pub fn io(op: &'static str, path: &Path, source: io::Error) -> ExecError {
        ExecError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Where one output tensor lives: output `out`, data starting at byte `offset`.
#[derive(Debug, Clone, Copy)]
pub struct Placement {
    pub rank: usize,
    pub tensor: usize,
    pub out: usize,
    pub offset: u64,
}

/// One copy piece, placed: output `out`, tensor data at byte `base`, converted to `to`.
struct Job {
    out: usize,
    base: u64,
    to: Dtype,
    b: Block,
}

/// How one engine run is steered: when to stop, whom to tell how far it got, how it reads; and
/// the time it spent per stage, for the caller to read afterwards.
pub struct Control<'a> {
    pub cancel: &'a AtomicBool,
    pub progress: &'a dyn Progress,
    pub opts: ExecOptions,
    pub stats: Stats,
}

impl<'a> Control<'a> {
    /// The default options ([`ExecOptions::for_run`]) and fresh stats.
    pub fn new(cancel: &'a AtomicBool, progress: &'a dyn Progress) -> Control<'a> {
        Control {
            cancel,
            progress,
            opts: ExecOptions::for_run(),
            stats: Stats::default(),
        }
    }

    pub fn with_options(self, opts: ExecOptions) -> Control<'a> {
        Control { opts, ..self }
    }
}

/// Runs every piece of the placed tensors: copies first, split into work items of at most one
/// chunk (so that one large tensor keeps every thread busy, not one), then fills.
pub fn execute(
    plan: &Plan,
    root: &Path,
    placements: &[Placement],
    sink: &dyn Sink,
    ctl: &Control,
) -> Result<(), ExecError> {
    let (cancel, progress, stats, opts) = (ctl.cancel, ctl.progress, &ctl.stats, ctl.opts);
    let (jobs, fills) = jobs_and_fills(plan, placements, sink.starts_zeroed());
    hooks::at(hooks::Point::Execute);
    let files = open_sources(plan, root, opts.io)?;
    hooks::at(hooks::Point::Read);
    let (items, rest) = work_items(plan, &jobs, opts);
    let run = Run {
        sink,
        cancel,
        progress,
        stats,
        opts,
    };
    let copy = || {
        items
            .par_iter()
            .try_for_each_init(Buffers::default, |bufs, item| {
                run.stopped()?;
                let src = &plan.sources[item.source()];
                let file = files[src.file_index].as_ref().expect("opened above");
                match *item {
                    Item::Span {
                        source,
                        job,
                        at,
                        len,
                    } => run.copy_span(src, file, &jobs[source][job], at, len, bufs),
                    Item::Chunk { source, c0, c1 } => {
                        let js: Vec<&Job> =
                            rest[source].iter().map(|&j| &jobs[source][j]).collect();
                        run.copy_chunk(src, file, &js, (c0, c1), bufs)
                    }
                }
            })
    };
    let threads = worker_threads(opts.io);
    let copied = match rayon::ThreadPoolBuilder::new().num_threads(threads).build() {
        Ok(pool) if threads != rayon::current_num_threads() => pool.install(copy),
        _ => copy(),
    };
    // Checked after every read, and after a failed one too: a source that changed meanwhile is
    // the cause to report, not the short read or the odd bytes it gave.
    check_sources(plan, &files)?;
    copied?;
    run.fills(fills)
}

/// `f`, opened at `path`, is still the file `planned` describes, unchanged.
pub fn unchanged(planned: &FileStamp, f: &File, path: &Path) -> Result<(), ExecError> {
    let now = FileStamp::of_file(f).map_err(|e| ExecError::io("reading", path, e))?;
    match planned.change_to(&now) {
        None => Ok(()),
        Some(change) => Err(ExecError::SourceChanged {
            path: path.to_path_buf(),
            change,
        }),
    }
}

/// `f`, opened at `path`, is still the file the plan read as `file_index`, unchanged: for readers
/// of source bytes outside the engine (tying checks, `--dry-run --read`).
pub fn still_planned(
    plan: &Plan,
    file_index: usize,
    f: &File,
    path: &Path,
) -> Result<(), ExecError> {
    unchanged(&planned_stamp(plan, file_index, path)?, f, path)
}

/// The plan's stamp of the file at `file_index`.
pub fn planned_stamp(plan: &Plan, file_index: usize, path: &Path) -> Result<FileStamp, ExecError> {
    plan.file_stamps.get(file_index).copied().ok_or_else(|| {
        ExecError::io(
            "reading",
            path,
            io::Error::other("the plan has no stamp for this file (a plan built by hand?)"),
        )
    })
}

/// Every opened source is still the file the plan was made from, unchanged, and no page of a
/// mapped one vanished while it was read.
fn check_sources(plan: &Plan, files: &[Option<SourceFile>]) -> Result<(), ExecError> {
    for (i, f) in files.iter().enumerate() {
        let Some(f) = f else { continue };
        let planned = planned_stamp(plan, i, &f.path)?;
        let now = FileStamp::of_file(&f.file).map_err(|e| ExecError::io("reading", &f.path, e))?;
        let change = planned.change_to(&now).or_else(|| {
            f.lost_pages().then_some(Change::Resized {
                from: planned.size,
                to: now.size.min(planned.size.saturating_sub(1)),
            })
        });
        if let Some(change) = change {
            return Err(ExecError::SourceChanged {
                path: f.path.clone(),
                change,
            });
        }
    }
    Ok(())
}

/// A fill the sink must write: output, byte offset, dtype, value, element count.
type Fill = (usize, u64, Dtype, f64, u64);

/// The copy pieces of the placed tensors as jobs per source, and the fills a sink must write
/// (zero fills are skipped on a sink whose files start zeroed).
fn jobs_and_fills(
    plan: &Plan,
    placements: &[Placement],
    starts_zeroed: bool,
) -> (Vec<Vec<Job>>, Vec<Fill>) {
    let mut jobs: Vec<Vec<Job>> = (0..plan.sources.len()).map(|_| Vec::new()).collect();
    let mut fills = Vec::new();
    for pl in placements {
        let t = &plan.ranks[pl.rank].tensors[pl.tensor];
        for piece in t.pieces.iter() {
            match &piece {
                Piece::Copy { source, .. } => jobs[*source].push(Job {
                    out: pl.out,
                    base: pl.offset,
                    to: t.dtype,
                    b: piece.block().expect("a copy piece has a block"),
                }),
                Piece::Fill {
                    dst_start,
                    count,
                    value,
                } => {
                    // By bits: -0.0 is not zero bytes (0x8000 in bf16), so it must be written.
                    if value.to_bits() != 0 || !starts_zeroed {
                        let item = t.dtype.bits() / 8;
                        fills.push((
                            pl.out,
                            pl.offset + dst_start * item,
                            t.dtype,
                            *value,
                            *count,
                        ));
                    }
                }
            }
        }
    }
    (jobs, fills)
}

/// Every checkpoint file the plan reads, opened once and shared (pread needs no seeking),
/// indexed by the sources' `file_index`.
fn open_sources(
    plan: &Plan,
    root: &Path,
    io: IoMode,
) -> Result<Vec<Option<SourceFile>>, ExecError> {
    let mut files: Vec<Option<SourceFile>> = Vec::new();
    for s in &plan.sources {
        if files.len() <= s.file_index {
            files.resize_with(s.file_index + 1, || None);
        }
        if files[s.file_index].is_none() {
            let path = root.join(&*s.file);
            let planned = planned_stamp(plan, s.file_index, &path)?;
            let f = SourceFile::open(&path, io).map_err(ExecError::Open)?;
            unchanged(&planned, &f.file, &path)?;
            files[s.file_index] = Some(f);
        }
    }
    Ok(files)
}

/// The parallel work, in file order: every source with jobs split into items, and per source the
/// jobs its chunk items serve.
fn work_items(plan: &Plan, jobs: &[Vec<Job>], opts: ExecOptions) -> (Vec<Item>, Vec<Vec<usize>>) {
    let mut order: Vec<usize> = (0..plan.sources.len())
        .filter(|&s| !jobs[s].is_empty())
        .collect();
    order.sort_by_key(|&s| (plan.sources[s].file_index, plan.sources[s].offset));
    let mut rest: Vec<Vec<usize>> = (0..plan.sources.len()).map(|_| Vec::new()).collect();
    let mut items = Vec::new();
    for &s in &order {
        split_source(
            s,
            &plan.sources[s],
            &jobs[s],
            opts,
            &mut items,
            &mut rest[s],
        );
    }
    (items, rest)
}

/// One unit of parallel work: a dense, unconverted span of one job (bytes `[at, at + len)` of
/// it), or one chunk of a source (elements `[c0, c1)`) for every other job of that source.
#[derive(Debug, Clone, Copy)]
enum Item {
    Span {
        source: usize,
        job: usize,
        at: u64,
        len: u64,
    },
    Chunk {
        source: usize,
        c0: u64,
        c1: u64,
    },
}

impl Item {
    fn source(&self) -> usize {
        match *self {
            Item::Span { source, .. } | Item::Chunk { source, .. } => source,
        }
    }
}

/// A source's work items: its dense unconverted jobs as spans of at most a chunk each, and the
/// rest (converted, strided, transposed) as chunks of the source read once for all of them.
fn split_source(
    source: usize,
    src: &SourceTensor,
    jobs: &[Job],
    opts: ExecOptions,
    items: &mut Vec<Item>,
    rest: &mut Vec<usize>,
) {
    let isz = src.dtype.bits() / 8;
    let step = opts.chunk_bytes.max(1);
    for (j, job) in jobs.iter().enumerate() {
        let dense = !job.b.transposed()
            && (job.b.rows == 1
                || (job.b.src_stride == job.b.row && job.b.dst_stride == job.b.row));
        if !opts.direct || !dense || job.to != src.dtype || job.b.rows * job.b.row == 0 {
            rest.push(j);
            continue;
        }
        let len = job.b.rows * job.b.row * isz;
        let from = src.offset + job.b.src_start * isz;
        let mut at = 0;
        while at < len {
            let mut n = step.min(len - at);
            // Spans end on block boundaries of the file, so that direct reads of neighbouring
            // spans never share a block.
            // Rounded down, so that a span stays within a chunk (and a GPU staging slot).
            if step >= storage::ALIGN && n < len - at {
                let end = (from + at + n) / storage::ALIGN * storage::ALIGN;
                if end > from + at {
                    n = end - from - at;
                }
            }
            items.push(Item::Span {
                source,
                job: j,
                at,
                len: n,
            });
            at += n;
        }
    }
    if rest.is_empty() {
        return;
    }
    let total: u64 = src.shape.iter().product();
    let chunk = (opts.chunk_bytes / isz).max(1);
    let refs: Vec<&Job> = rest.iter().map(|&j| &jobs[j]).collect();
    let spans = transposed_spans(&refs);
    let mut c0 = 0;
    while c0 < total {
        let c1 = chunk_end(c0, chunk, total, &spans);
        items.push(Item::Chunk { source, c0, c1 });
        c0 = c1;
    }
}

/// What every source's copy shares: where bytes go, when to stop, what to count.
struct Run<'a> {
    sink: &'a dyn Sink,
    cancel: &'a AtomicBool,
    progress: &'a dyn Progress,
    stats: &'a Stats,
    opts: ExecOptions,
}

impl Run<'_> {
    /// Writes the fills, in order, after the copies.
    fn fills(&self, fills: Vec<Fill>) -> Result<(), ExecError> {
        for (out, offset, dtype, value, count) in fills {
            if self.cancel.load(Ordering::Relaxed) {
                return Err(ExecError::Cancelled);
            }
            let bytes = convert::fill_bytes(dtype, value, count);
            let t = Instant::now();
            self.sink.put(out, offset, &bytes)?;
            add_since(&self.stats.put_ns, t);
            self.progress.advance(bytes.len() as u64);
        }
        Ok(())
    }
}

/// A worker thread's read and conversion buffers, reused from one item to the next.
#[derive(Default)]
struct Buffers {
    read: AlignedBuf,
    converted: Vec<u8>,
    /// Elements of a transposed row gathered before conversion.
    gathered: Vec<u8>,
}

/// A chunk is stretched to hold a whole transposed block of at most this many chunks, so that
/// the block goes out in one put (one gpt-oss expert: 33 MB for gpt-oss-120b's `gate_up_proj`).
const TRANSPOSED_CHUNKS: u64 = 4;

/// A failed source read, named: a short read is a truncated checkpoint.
fn read_error(src: &SourceTensor, path: &Path, e: io::Error) -> ExecError {
    if e.kind() == io::ErrorKind::UnexpectedEof {
        ExecError::Corrupt {
            path: path.to_path_buf(),
            message: format!("tensor '{}' is cut short: the file is truncated", src.name),
        }
    } else {
        ExecError::io("reading", path, e)
    }
}

impl Run<'_> {
    fn stopped(&self) -> Result<(), ExecError> {
        if self.cancel.load(Ordering::Relaxed) {
            Err(ExecError::Cancelled)
        } else {
            Ok(())
        }
    }

    /// Hands `bytes` to the sink, timed and counted.
    fn put(&self, out: usize, offset: u64, bytes: &[u8]) -> Result<(), ExecError> {
        let t = Instant::now();
        self.sink.put(out, offset, bytes)?;
        add_since(&self.stats.put_ns, t);
        self.progress.advance(bytes.len() as u64);
        Ok(())
    }

    /// Bytes `[at, at + len)` of a dense unconverted job: straight from the file when the sink
    /// can take them so (file to file, or into a device's staging), else read and put.
    fn copy_span(
        &self,
        src: &SourceTensor,
        file: &SourceFile,
        job: &Job,
        at: u64,
        len: u64,
        bufs: &mut Buffers,
    ) -> Result<(), ExecError> {
        let isz = src.dtype.bits() / 8;
        let from = src.offset + job.b.src_start * isz + at;
        let to = job.base + job.b.dst_start * isz + at;
        let t = Instant::now();
        if self
            .sink
            .copy_from_source(job.out, to, file, from, len)
            .map_err(|e| match e {
                ExecError::Device(device::DeviceError::Read { source, .. }) => {
                    read_error(src, &file.path, source)
                }
                e => e,
            })?
        {
            add_since(&self.stats.put_ns, t);
            self.stats.bytes_read.fetch_add(len, Ordering::Relaxed);
            self.progress.advance(len);
            return Ok(());
        }
        let bytes = self.read(src, file, &mut bufs.read, from, len)?;
        self.put(job.out, to, bytes)
    }

    /// Source bytes `[from, from + len)`, timed and counted.
    fn read<'b>(
        &self,
        src: &SourceTensor,
        file: &'b SourceFile,
        buf: &'b mut AlignedBuf,
        from: u64,
        len: u64,
    ) -> Result<&'b [u8], ExecError> {
        let t = Instant::now();
        let bytes = self
            .stats
            .read
            .time(len, || file.read(buf, from, len as usize))
            .map_err(|e| read_error(src, &file.path, e))?;
        add_since(&self.stats.read_ns, t);
        self.stats.bytes_read.fetch_add(len, Ordering::Relaxed);
        Ok(bytes)
    }

    /// Reads source elements `[c0, c1)` once and hands each job its rows of them.
    fn copy_chunk(
        &self,
        src: &SourceTensor,
        file: &SourceFile,
        jobs: &[&Job],
        (c0, c1): (u64, u64),
        bufs: &mut Buffers,
    ) -> Result<(), ExecError> {
        let isz = src.dtype.bits() / 8;
        let Buffers {
            read,
            converted,
            gathered,
        } = bufs;
        let data = self.read(src, file, read, src.offset + c0 * isz, (c1 - c0) * isz)?;
        for job in jobs {
            if job.b.transposed() {
                self.put_transposed(src, job, (c0, c1), data, converted, gathered)?;
            } else {
                self.put_chunk(src, job, (c0, c1), data, converted)?;
            }
        }
        Ok(())
    }

    /// The rows of `job` that meet source elements `[c0, c1)`, held in `buf`.
    fn put_chunk(
        &self,
        src: &SourceTensor,
        job: &Job,
        (c0, c1): (u64, u64),
        buf: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<(), ExecError> {
        let isz = src.dtype.bits() / 8;
        let osz = job.to.bits() / 8;
        let stride = job.b.src_stride.max(1);
        // Empty blocks first: `rows - 1` below must not underflow.
        if job.b.rows == 0 || job.b.row == 0 {
            return Ok(());
        }
        let last_end = job.b.src_start + (job.b.rows - 1) * job.b.src_stride + job.b.row;
        if last_end <= c0 || job.b.src_start >= c1 {
            return Ok(());
        }
        // Rows k whose span [s_k, s_k + row) meets [c0, c1).
        let k_lo = if c0 < job.b.src_start + job.b.row {
            0
        } else {
            (c0 - job.b.src_start - job.b.row) / stride + 1
        };
        let k_hi = if job.b.rows == 1 {
            1
        } else {
            (c1 - job.b.src_start).div_ceil(stride).min(job.b.rows)
        };
        let dst_dense = job.b.rows == 1 || job.b.dst_stride == job.b.row;
        let src_dense = job.b.rows == 1 || job.b.src_stride == job.b.row;
        if dst_dense && src_dense && src.dtype == job.to {
            // One span, no conversion: hand the read buffer over without a copy.
            let s = job.b.src_start + k_lo * job.b.src_stride;
            let a = s.max(c0);
            let e = (job.b.src_start + (k_hi - 1) * job.b.src_stride + job.b.row).min(c1);
            if a < e {
                let dst = job.b.dst_start + k_lo * job.b.dst_stride + (a - s);
                let bytes = &buf[((a - c0) * isz) as usize..((e - c0) * isz) as usize];
                self.put(job.out, job.base + dst * osz, bytes)?;
            }
            return Ok(());
        }
        // Memory sinks take strided rows one by one without a gather buffer; for files and
        // devices one large put beats many small ones.
        let gather = dst_dense && !self.sink.cheap_small_puts();
        out.clear();
        let mut first: Option<u64> = None;
        for k in k_lo..k_hi {
            let s = job.b.src_start + k * job.b.src_stride;
            let (a, e) = (s.max(c0), (s + job.b.row).min(c1));
            if a >= e {
                continue;
            }
            let bytes = &buf[((a - c0) * isz) as usize..((e - c0) * isz) as usize];
            let dst = job.b.dst_start + k * job.b.dst_stride + (a - s);
            if gather {
                first.get_or_insert(dst);
                let t = Instant::now();
                convert::convert_into(src.dtype, job.to, bytes, out);
                add_since(&self.stats.convert_ns, t);
            } else if src.dtype == job.to {
                self.put(job.out, job.base + dst * osz, bytes)?;
            } else {
                out.clear();
                let t = Instant::now();
                convert::convert_into(src.dtype, job.to, bytes, out);
                add_since(&self.stats.convert_ns, t);
                self.put(job.out, job.base + dst * osz, out)?;
            }
        }
        if let Some(dst) = first {
            self.put(job.out, job.base + dst * osz, out)?;
        }
        Ok(())
    }
}

impl Run<'_> {
    /// The elements of transposed `job` that lie in source elements `[c0, c1)`, held in
    /// `read`: per destination row a run of consecutive elements, gathered (then converted)
    /// into one buffer while the runs follow one another in the destination, and put.
    fn put_transposed(
        &self,
        src: &SourceTensor,
        job: &Job,
        (c0, c1): (u64, u64),
        read: &[u8],
        out: &mut Vec<u8>,
        gathered: &mut Vec<u8>,
    ) -> Result<(), ExecError> {
        let b = job.b;
        let (isz, osz) = (src.dtype.bits() / 8, job.to.bits() / 8);
        let span = b.src_row_span();
        if b.rows == 0 || span == 0 || b.src_start >= c1 {
            return Ok(());
        }
        let stride = b.src_stride.max(1);
        if b.src_start + (b.rows - 1) * b.src_stride + span <= c0 {
            return Ok(());
        }
        // Rows k whose span [s_k, s_k + span) meets [c0, c1).
        let k_lo = if c0 < b.src_start + span {
            0
        } else {
            (c0 - b.src_start - span) / stride + 1
        };
        let k_hi = if b.rows == 1 {
            1
        } else {
            (c1 - b.src_start).div_ceil(stride).min(b.rows)
        };
        let es = b.src_elem_stride;
        out.clear();
        // Destination element where the gathered run starts, and where it ends.
        let mut run: Option<(u64, u64)> = None;
        let elems = |k: u64| elems_in(b.src_start + k * b.src_stride, es, b.row, (c0, c1));
        let mut k = k_lo;
        while k < k_hi {
            let (x_lo, x_hi) = elems(k);
            if x_lo >= x_hi {
                k += 1;
                continue;
            }
            // Whole rows that follow one another in the destination are gathered together, in
            // tiles (see Tile).
            let mut k_end = k + 1;
            if (x_lo, x_hi) == (0, b.row) && b.dst_stride == b.row {
                while k_end < k_hi && elems(k_end) == (0, b.row) {
                    k_end += 1;
                }
            }
            let dst = b.dst_start + k * b.dst_stride + x_lo;
            if let Some((first, end)) = run
                && (end != dst || out.len() as u64 >= self.opts.chunk_bytes)
            {
                self.put(job.out, job.base + first * osz, out)?;
                out.clear();
                run = None;
            }
            let t = Instant::now();
            let tile = Tile {
                b: &b,
                c0,
                rows: (k, k_end),
                elems: (x_lo, x_hi),
            };
            if src.dtype == job.to {
                tile.gather(read, isz as usize, out);
            } else {
                gathered.clear();
                tile.gather(read, isz as usize, gathered);
                convert::convert_into(src.dtype, job.to, gathered, out);
            }
            add_since(&self.stats.convert_ns, t);
            run = Some((run.map_or(dst, |r| r.0), dst + (k_end - k) * (x_hi - x_lo)));
            k = k_end;
        }
        if let Some((first, _)) = run {
            self.put(job.out, job.base + first * osz, out)?;
        }
        Ok(())
    }
}

/// The elements `x` of a row starting at source element `s`, `es` apart, with `c0 <= s + x·es <
/// c1`: a range, since the row runs forward through the source.
fn elems_in(s: u64, es: u64, row: u64, (c0, c1): (u64, u64)) -> (u64, u64) {
    if es == 0 {
        return if (c0..c1).contains(&s) {
            (0, row)
        } else {
            (0, 0)
        };
    }
    let lo = if c0 > s { (c0 - s).div_ceil(es) } else { 0 };
    let hi = (c1.saturating_sub(s)).div_ceil(es).min(row);
    (lo, hi)
}

/// Elements `elems` of rows `rows` of transposed block `b`, whose source from element `c0` is
/// in a buffer.
struct Tile<'a> {
    b: &'a Block,
    c0: u64,
    rows: (u64, u64),
    elems: (u64, u64),
}

impl Tile<'_> {
    /// Rows read together: their elements at one `x` are neighbours in the source (one cache
    /// line for 32 bf16 rows), so that each source line is fetched once rather than once per row.
    const ROWS: u64 = 32;

    /// Appends the tile's elements (`size` bytes each) from `buf`, row after row.
    fn gather(&self, buf: &[u8], size: usize, out: &mut Vec<u8>) {
        match size {
            1 => self.gather_n::<1>(buf, out),
            2 => self.gather_n::<2>(buf, out),
            4 => self.gather_n::<4>(buf, out),
            8 => self.gather_n::<8>(buf, out),
            _ => self.each(
                size,
                out.len(),
                |s, d, o: &mut Vec<u8>| o[d..d + size].copy_from_slice(&buf[s..s + size]),
                out,
            ),
        }
    }

    fn gather_n<const N: usize>(&self, buf: &[u8], out: &mut Vec<u8>) {
        self.each(
            N,
            out.len(),
            |s, d, o: &mut Vec<u8>| {
                let e: [u8; N] = buf[s..s + N].try_into().expect("N bytes");
                o[d..d + N].copy_from_slice(&e);
            },
            out,
        );
    }

    /// Calls `copy(source byte, destination byte, out)` for every element, tile by tile, with
    /// `out` grown to hold them after its first `start` bytes.
    fn each(
        &self,
        size: usize,
        start: usize,
        mut copy: impl FnMut(usize, usize, &mut Vec<u8>),
        out: &mut Vec<u8>,
    ) {
        let (b, (k0, k1), (x0, x1)) = (self.b, self.rows, self.elems);
        let w = (x1 - x0) as usize;
        out.resize(start + (k1 - k0) as usize * w * size, 0);
        let (s_row, d_row) = (b.src_stride as usize * size, w * size);
        let mut kt = k0;
        while kt < k1 {
            let n = (Self::ROWS.min(k1 - kt)) as usize;
            for x in x0..x1 {
                let s =
                    (b.src_start + kt * b.src_stride + x * b.src_elem_stride - self.c0) as usize;
                let d = start + ((kt - k0) as usize * w + (x - x0) as usize) * size;
                for t in 0..n {
                    copy(s * size + t * s_row, d + t * d_row, out);
                }
            }
            kt += n as u64;
        }
    }
}

/// The source ranges `[first, last + 1)` of the transposed jobs, by start.
fn transposed_spans(jobs: &[&Job]) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = jobs
        .iter()
        .filter(|j| j.b.transposed() && j.b.rows > 0)
        .map(|j| {
            let b = j.b;
            (
                b.src_start,
                b.src_start + (b.rows - 1) * b.src_stride + b.src_row_span(),
            )
        })
        .collect();
    v.sort_unstable();
    v
}

/// Where the chunk from `c0` ends: `chunk` elements on, stretched over a transposed block that
/// starts in it when the chunk then stays within [`TRANSPOSED_CHUNKS`] chunks. A transposed block
/// cut by a chunk boundary still copies right, as row pieces.
fn chunk_end(c0: u64, chunk: u64, total: u64, spans: &[(u64, u64)]) -> u64 {
    let mut c1 = (c0 + chunk).min(total);
    let limit = c0.saturating_add(chunk.saturating_mul(TRANSPOSED_CHUNKS));
    let first = spans.partition_point(|&(a, _)| a < c0);
    for &(a, b) in &spans[first..] {
        if a >= c1 {
            break;
        }
        if b > c1 && b <= limit {
            c1 = b.min(total);
        }
    }
    c1
}

/// Every tensor of the given part files, placed at its data offset in file `out`.
pub fn placements_for(plan: &Plan, files: &[parts::PartFile]) -> Vec<Placement> {
    let mut v = Vec::new();
    for (out, f) in files.iter().enumerate() {
        let rank = plan
            .ranks
            .iter()
            .position(|r| r.rank == f.rank)
            .expect("part files come from the plan's ranks");
        for &(tensor, offset) in &f.tensors {
            v.push(Placement {
                rank,
                tensor,
                out,
                offset,
            });
        }
    }
    v
}

/// The files a plan reads, once each, in name order.
pub fn source_files(plan: &Plan, root: &Path) -> Vec<PathBuf> {
    let names: std::collections::BTreeSet<&str> = plan.sources.iter().map(|s| &*s.file).collect();
    names.into_iter().map(|f| root.join(f)).collect()
}

/// Where in a block each tensor of `rank` would best start in memory: the file offset, modulo
/// [`storage::ALIGN`], of the source bytes that land at its start, by its largest unconverted
/// dense copy (0 when it has none). Host memory placed so takes direct reads without a copy.
pub fn phases(plan: &Plan, rank: usize) -> Vec<u64> {
    plan.ranks[rank]
        .tensors
        .iter()
        .map(|t| {
            let osz = t.dtype.bits() / 8;
            t.pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Copy { source, .. } => Some((&plan.sources[source], p.block()?)),
                    Piece::Fill { .. } => None,
                })
                .filter(|(s, b)| s.dtype == t.dtype && !b.transposed())
                .max_by_key(|(_, b)| b.rows * b.row)
                .map_or(0, |(s, b)| {
                    let isz = s.dtype.bits() / 8;
                    let src = (s.offset + b.src_start * isz) % storage::ALIGN;
                    let dst = (b.dst_start * osz) % storage::ALIGN;
                    (src + storage::ALIGN - dst) % storage::ALIGN
                })
        })
        .collect()
}
