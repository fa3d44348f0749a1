//! Execute: carry out a plan's block moves. One engine serves every destination (files being
//! written, files being verified, host memory): it reads each source tensor once, in bounded
//! chunks, and hands every destination its converted bytes through a [`Sink`].

pub(crate) mod convert;
mod copy;
pub mod cuda;
pub(crate) mod device;
mod fill;
mod gather;
pub(crate) mod hooks;
pub(crate) mod host_ptr;
pub mod io_choice;
pub(crate) mod jobs;
pub(crate) mod load;
mod node_shared;
#[cfg(test)]
mod pad_tests;
pub(crate) mod page_cache;
pub(crate) mod parts;
mod reduce;
pub(crate) mod shared;
mod sigbus;
pub(crate) mod source;
pub(crate) mod stamps;
#[cfg(test)]
mod tests;
pub(crate) mod timing;
mod transpose;
pub(crate) mod verify;
pub(crate) mod write;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use rayon::prelude::*;

use self::copy::{Buffers, Run};
use self::jobs::{Item, Job, jobs_and_fills, pads_rows, work_items};
use self::source::{IoMode, OpenError, SourceFile};
use self::stamps::{check_sources, open_sources};
use self::timing::Busy;
use crate::plan::Plan;
use crate::progress::Progress;

/// Source bytes read per step; with one step in flight per thread this bounds memory.
pub(crate) const CHUNK_BYTES: u64 = 16 << 20;

/// Reads in flight with O_DIRECT at least: they wait on the storage, not on a core, and a disk
/// needs several queued to reach its sequential limit (measured on a 2-core VM: 0.50 GB/s with
/// 2 threads, 0.69 with 4, 0.86 with 8, which is what `dd bs=16M` reads).
pub(crate) const DIRECT_THREADS: usize = 8;

/// Ranged GETs in flight when the source is in object storage: each is one 16 MiB chunk, so
/// this bounds memory at 256 MiB, and 16 streams reach a store's per-client limit.
pub(crate) const OBJECT_THREADS: usize = 16;

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
    /// With `io` direct, read the sources other ranks of the plan read too, and that this run
    /// does not read for them, through the page cache ([`shared`]): ranks loading in processes
    /// of their own (vLLM's workers) then take those bytes from storage once per node. `auto`'s
    /// choice; `--io direct` reads everything direct, as asked.
    pub share_reads: bool,
}

impl Default for ExecOptions {
    fn default() -> ExecOptions {
        ExecOptions {
            chunk_bytes: CHUNK_BYTES,
            direct: true,
            io: IoMode::Buffered,
            share_reads: false,
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
            share_reads: false,
        }
    }
}

/// Where converted bytes go.
pub(crate) trait Sink: Sync {
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
    /// Bytes of the sources read through the page cache for ranks outside the run
    /// ([`ExecOptions::share_reads`]), as planned.
    pub shared_bytes: AtomicU64,
    /// Of those, in object storage: the bytes this run fetched from the store into the node
    /// cache (the rest another process of the node, or an earlier run, had fetched).
    pub node_fetched_bytes: AtomicU64,
    /// The engine's own reads (into its buffers; a sink's reads are the sink's to count).
    pub read: Busy,
}

impl Stats {
    pub fn secs(v: &AtomicU64) -> f64 {
        v.load(Ordering::Relaxed) as f64 / 1e9
    }
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
    Open(#[from] OpenError),
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

    pub(crate) fn io(op: &'static str, path: &Path, source: io::Error) -> ExecError {
        ExecError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// Where one output tensor lives: output `out`, data starting at byte `offset`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placement {
    pub rank: usize,
    pub tensor: usize,
    pub out: usize,
    pub offset: u64,
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
pub(crate) fn execute(
    plan: &Plan,
    root: &Path,
    placements: &[Placement],
    sink: &dyn Sink,
    ctl: &Control,
) -> Result<(), ExecError> {
    let (cancel, progress, stats, opts) = (ctl.cancel, ctl.progress, &ctl.stats, ctl.opts);
    let (jobs, reduces, fills) =
        jobs_and_fills(plan, placements, sink.starts_zeroed(), pads_rows(sink));
    hooks::at(hooks::Point::Execute);
    let files = open_sources(plan, root, opts.io)?;
    // Reads from object storage wait on the network, each a round trip: as many in flight as
    // direct reads at least, and more.
    let threads = if node_shared::any_object(&files) {
        worker_threads(opts.io).max(OBJECT_THREADS)
    } else {
        worker_threads(opts.io)
    };
    let pool = Pool(
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .ok()
            .filter(|_| threads != rayon::current_num_threads()),
    );
    let (shared, twins) = shared_files(plan, placements, &files, ctl, &pool)?;
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
                let file = match shared.get(item.source()) {
                    Some(true) => twins[src.file_index].as_ref(),
                    _ => None,
                };
                let file = (file.or(files[src.file_index].as_ref())).expect("opened above");
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
    let copied = pool.run(copy);
    // Checked after every read, and after a failed one too: a source that changed meanwhile is
    // the cause to report, not the short read or the odd bytes it gave.
    let reduced = copied.and_then(|()| run.reduces(&plan.sources, &files, &reduces));
    check_sources(plan, &files)?;
    reduced?;
    run.fills(fills)
}

/// The engine's threads for one run: its own pool when the run wants another count than rayon's
/// global one, else the global pool.
struct Pool(Option<rayon::ThreadPool>);

impl Pool {
    /// Runs a phase of the engine on these threads.
    fn run<T: Send>(&self, f: impl FnOnce() -> T + Send) -> T {
        match &self.0 {
            Some(pool) => pool.install(f),
            None => f(),
        }
    }
}

/// Which sources to read from a second handle (by source index; empty for none), and those
/// handles (by file index): for sources that ranks outside the run read too, when ranks load in
/// processes of their own ([`ExecOptions::share_reads`]). A local file read direct is opened
/// again to read through the page cache; an object's shared sources are fetched once per node
/// into its node cache, on the engine's threads, and read from there.
fn shared_files(
    plan: &Plan,
    placements: &[Placement],
    files: &[Option<SourceFile>],
    ctl: &Control,
    pool: &Pool,
) -> Result<(Vec<bool>, Vec<Option<SourceFile>>), ExecError> {
    let (opts, stats) = (ctl.opts, &ctl.stats);
    let mut twins: Vec<Option<SourceFile>> = files.iter().map(|_| None).collect();
    let objects = node_shared::any_object(files);
    if !(opts.share_reads && (opts.io == IoMode::Direct || objects)) {
        return Ok((Vec::new(), twins));
    }
    let shared = shared::shared_reads(plan, &shared::ranks_of(placements));
    stats.shared_bytes.store(shared.bytes, Ordering::Relaxed);
    let shared = shared.sources;
    if objects {
        twins = pool.run(|| node_shared::object_twins(plan, files, &shared, ctl.cancel, stats))?;
    }
    for (s, _) in shared.iter().enumerate().filter(|(_, on)| **on) {
        let i = plan.sources[s].file_index;
        let f = files[i].as_ref().expect("every read file is open");
        if twins[i].is_none() && f.object().is_none() && opts.io == IoMode::Direct {
            twins[i] = Some(f.buffered_twin()?);
        }
    }
    Ok((shared, twins))
}

// Re-exports for callers outside `exec/` only, kept until they import from the defining files.
pub use self::fill::{Destinations, Filled, fill};
pub(crate) use self::jobs::phases;
pub use self::stamps::source_files;
pub(crate) use self::stamps::{planned_stamp, still_planned};
