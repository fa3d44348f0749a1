//! `Plan.load`'s engine run: one rank's tensors into memory the caller owns, given as addresses.
//! Host memory goes through [`HostPtrSink`] (the engine reads straight into it); CUDA memory
//! through a [`CudaDevice`] that borrows the caller's buffers and stream and stages through the
//! same pinned ring as `wload load --device cuda`.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use pyo3::prelude::*;

use wload::Plan;
use wload::Quiet;
use wload::engine::IoMode;
use wload::engine::cuda::{self, CudaDevice};
use wload::engine::{Control, ExecError, ExecOptions, Stats, io_choice};
use wload::engine::{Destinations, Filled, HostPtrSink, fill as fill_engine};
use wload::engine::{Device, DeviceError, Stages};

/// Where the destinations are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Target {
    Host,
    /// GPU `ordinal`; copies queued on the caller's `stream` (0: the legacy default stream).
    Cuda {
        ordinal: usize,
        stream: u64,
    },
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Target::Host => f.write_str("cpu"),
            Target::Cuda { ordinal, .. } => write!(f, "cuda:{ordinal}"),
        }
    }
}

/// What one load did, for the returned dict.
pub(crate) struct LoadDone {
    pub io: IoMode,
    /// Why `io`, and what was read through the page cache all the same (`IoChoice::why`).
    pub io_why: String,
    /// The engine's stages.
    pub stats: Stats,
    /// The sink's own work.
    pub sink: SinkStages,
    pub cache_s: f64,
    pub transfer_s: f64,
    /// Waiting for the last copies to land (GPUs).
    pub sync_s: f64,
}

/// What the sink did itself, from its [`Stages`].
pub(crate) struct SinkStages {
    /// Its own reads (straight into the destination or the staging ring).
    pub read_bytes: u64,
    pub read_s: f64,
    /// Host-side copies: into host destinations, or staging and queueing for a GPU.
    pub copy_bytes: u64,
    pub copy_s: f64,
    /// GPU copy time as the GPU's events measured it, and time spent waiting for a staging slot.
    pub device_copy_s: f64,
    pub wait_s: f64,
    /// Pinned memory held for staging.
    pub staging_bytes: u64,
}

impl SinkStages {
    fn of(st: &Stages, staging_bytes: u64) -> SinkStages {
        SinkStages {
            read_bytes: st.read.bytes(),
            read_s: st.read.busy_s(),
            copy_bytes: st.upload.bytes(),
            copy_s: st.upload.busy_s(),
            device_copy_s: st.device_copy_s(),
            wait_s: st.wait_s(),
            staging_bytes,
        }
    }
}

/// Why a load did not complete.
pub(crate) enum FillError {
    /// Destinations the driver says cannot be filled: (tensor index, why). Nothing was read.
    Destinations(Vec<(usize, String)>),
    /// Failed before a byte was written: sources that cannot be opened, no driver, no such GPU.
    NotStarted(ExecError),
    /// Failed while filling: the destinations hold partial data.
    Exec(ExecError),
    /// A signal (Ctrl-C) arrived: the engine was stopped, then Python's exception is raised.
    Interrupted(PyErr),
}

impl From<ExecError> for FillError {
    fn from(e: ExecError) -> FillError {
        match e {
            // The engine opens every source before it reads a byte (exec::stamps::open_sources).
            ExecError::Open(_) => FillError::NotStarted(e),
            e => FillError::Exec(e),
        }
    }
}

impl From<DeviceError> for FillError {
    fn from(e: DeviceError) -> FillError {
        FillError::Exec(ExecError::Device(e))
    }
}

/// Errors of the steps before any byte is written.
fn not_started(e: impl Into<ExecError>) -> FillError {
    FillError::NotStarted(e.into())
}

/// Reads rank index `j` of `plan` into `dests` (address, bytes; in the rank's tensor order),
/// read as `wload load --io IO` does. Python signals are checked while the engine runs: Ctrl-C
/// stops it within a chunk instead of after the whole rank.
pub(crate) fn fill(
    py: Python<'_>,
    plan: &Plan,
    root: &Path,
    j: usize,
    dests: Vec<(usize, usize)>,
    io: IoMode,
    target: Target,
) -> Result<LoadDone, FillError> {
    // Phase 1: how to read (the files' residency decides `auto`).
    let t = Instant::now();
    let files = wload::engine::source_files(plan, root);
    let (_, mut choice) = py
        .detach(|| io_choice::prepare(&files, io, false))
        .map_err(ExecError::from)?;
    let cache_s = t.elapsed().as_secs_f64();
    let opts = ExecOptions {
        io: choice.used,
        share_reads: choice.shares_reads(),
        ..ExecOptions::for_run()
    };
    // Phase 2: the destination, and the engine run.
    let cancel = AtomicBool::new(false);
    let ctl = Control::new(&cancel, &Quiet).with_options(opts);
    let (sink, filled) = match target {
        Target::Host => {
            let dests = dests.into_iter().map(|(p, n)| (p as *mut u8, n)).collect();
            // SAFETY: the caller of `Plan.load` guarantees each address is writable for the
            // tensor's nbytes and untouched until the load returns (the API's contract).
            let sink = unsafe { HostPtrSink::new(dests) };
            let filled = run(py, &ctl, || {
                fill_engine(plan, root, &[j], Destinations::Host(&sink), &ctl)
            })?;
            (SinkStages::of(sink.stages(), 0), filled)
        }
        Target::Cuda { ordinal, stream } => {
            // Declared first, dropped last: the device's Drop binds its context here too.
            let _caller = cuda::ContextGuard::save();
            let slots = cuda::slots_per_device(
                1,
                wload::engine::worker_threads(choice.used),
                plan.ranks[j].bytes,
            );
            let gpu = open_gpu(ordinal, slots, stream, dests)?;
            let devices: Vec<Box<dyn Device>> = vec![Box::new(gpu)];
            let filled = run(py, &ctl, || {
                fill_engine(plan, root, &[j], Destinations::Devices(&devices), &ctl)
            })?;
            let d = &devices[0];
            (SinkStages::of(d.stages(), d.staging_bytes()), filled)
        }
    };
    choice.note_shared(ctl.stats.shared_bytes.load(Ordering::Relaxed));
    Ok(LoadDone {
        io: choice.used,
        io_why: choice.why,
        stats: ctl.stats,
        sink,
        cache_s,
        transfer_s: filled.transfer_s,
        sync_s: filled.sync_s,
    })
}

/// GPU `ordinal` borrowing `dests` and `stream`, once the driver has confirmed that every
/// destination is that GPU's memory.
fn open_gpu(
    ordinal: usize,
    slots: usize,
    stream: u64,
    dests: Vec<(usize, usize)>,
) -> Result<CudaDevice, FillError> {
    let found = cuda::device_count().map_err(not_started)?;
    if ordinal >= found {
        return Err(not_started(DeviceError::Driver {
            device: format!("cuda:{ordinal}"),
            op: "opening the device",
            message: format!(
                "only {found} GPU{} visible (CUDA_VISIBLE_DEVICES counts)",
                if found == 1 { " is" } else { "s are" }
            ),
        }));
    }
    let bufs = dests.iter().map(|&(p, n)| (p as u64, n as u64)).collect();
    // SAFETY: the caller of `Plan.load` guarantees the buffers (see `fill`) and that `stream` is
    // a live stream of the device's primary context (torch's current stream is); the driver
    // confirms below that each address is this GPU's memory before anything is copied.
    let gpu =
        unsafe { CudaDevice::borrowing(ordinal, slots, stream, bufs) }.map_err(not_started)?;
    let problems: Vec<(usize, String)> = (0..dests.len())
        .filter_map(|i| gpu.destination_problem(i).map(|p| (i, p)))
        .collect();
    if problems.is_empty() {
        Ok(gpu)
    } else {
        Err(FillError::Destinations(problems))
    }
}

/// Runs `work` (the engine, and for a GPU the wait for its copies) on a thread of its own while
/// this one waits without the GIL, checking Python's signals every tenth of a second: Ctrl-C
/// sets `ctl`'s cancel flag, and the engine stops within a chunk.
fn run(
    py: Python<'_>,
    ctl: &Control,
    work: impl FnOnce() -> Result<Filled, ExecError> + Send,
) -> Result<Filled, FillError> {
    std::thread::scope(|s| {
        let (tx, mut rx) = mpsc::channel();
        s.spawn(move || {
            let _ = tx.send(work());
        });
        loop {
            // The receiver travels into the GIL-free closure and back (it is Send, not Sync).
            let got;
            (rx, got) = py.detach(move || {
                let got = rx.recv_timeout(Duration::from_millis(100));
                (rx, got)
            });
            match got {
                Ok(r) => return r.map_err(Into::into),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Err(e) = py.check_signals() {
                        ctl.cancel.store(true, Ordering::Relaxed);
                        // The engine stops within a chunk; no byte is written after this returns.
                        let _ = py.detach(move || rx.recv());
                        return Err(FillError::Interrupted(e));
                    }
                }
                // Only a panic ends the engine's thread unsent; the scope re-raises it.
                Err(mpsc::RecvTimeoutError::Disconnected) => panic!("the engine's thread panicked"),
            }
        }
    })
}
