//! Where `load` puts tensors: a device per rank, behind one small trait, so that everything but the
//! driver calls runs (and is tested) with the host-memory implementation.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::AtomicU64;

use super::source::{ALIGN, AlignedBuf, SourceFile};
use super::timing::Busy;

/// One rank's memory.
pub trait Device: Send + Sync {
    /// e.g. "cpu" or "cuda:3 (NVIDIA H200)".
    fn describe(&self) -> String;
    /// Allocates one zeroed buffer per size; buffers are then addressed by index.
    fn alloc(&mut self, sizes: &[u64]) -> Result<(), DeviceError>;
    /// [`Device::alloc`], with where in a block each buffer would best start: host memory
    /// starts it there, so that direct reads land in it without a copy (the source tensor's
    /// offset in its file, modulo the block).
    fn alloc_phased(&mut self, sizes: &[u64], _phases: &[u64]) -> Result<(), DeviceError> {
        self.alloc(sizes)
    }
    /// Copies `host` to `offset` of buffer `buf`. May be asynchronous: `host` is free to reuse when
    /// this returns, the data is in place after [`Device::synchronize`].
    fn upload(&self, buf: usize, offset: u64, host: &[u8]) -> Result<(), DeviceError>;
    /// Reads `len` bytes of `src` from `src_offset` straight into buffer `buf` at `offset` (host
    /// memory) or into the device's own staging and on (GPUs), without the engine's buffer.
    /// `Ok(false)`: it cannot; the caller reads and [`Device::upload`]s. Read errors come back as
    /// [`DeviceError::Read`].
    fn upload_from_file(
        &self,
        _buf: usize,
        _offset: u64,
        _src: &SourceFile,
        _src_offset: u64,
        _len: u64,
    ) -> Result<bool, DeviceError> {
        Ok(false)
    }
    /// Its buffers start as zeros (fresh allocations), so zero fills can be skipped; not so for
    /// memory a caller lends.
    fn starts_zeroed(&self) -> bool {
        true
    }
    /// Host memory: small uploads are as cheap as large ones.
    fn is_host(&self) -> bool {
        false
    }
    /// Waits until every upload has landed.
    fn synchronize(&self) -> Result<(), DeviceError>;
    /// A buffer's contents, copied back to the host (checksums, `--check`).
    fn download(&self, buf: usize) -> Result<Vec<u8>, DeviceError>;
    /// What this device's stages did: its own reads, and its copies.
    fn stages(&self) -> &Stages;
    /// Host memory held for staging (pinned, for GPUs): what bounds host memory, whatever the
    /// model's size.
    fn staging_bytes(&self) -> u64 {
        0
    }
}

/// A device's stage counters.
#[derive(Debug, Default)]
pub struct Stages {
    /// Storage to host: reads the device made itself (into staging or host memory).
    pub read: Busy,
    /// Host to device, as the host saw it: handing bytes over (for GPUs, staging and queueing).
    pub upload: Busy,
    /// Host to device as the device measured it (GPU copy time, from events), nanoseconds;
    /// zero where there is no such clock.
    pub device_copy_ns: AtomicU64,
    /// Waiting for a staging buffer to come free (the copies were the slower stage).
    pub wait_ns: AtomicU64,
}

impl Stages {
    pub fn device_copy_s(&self) -> f64 {
        crate::exec::Stats::secs(&self.device_copy_ns)
    }

    pub fn wait_s(&self) -> f64 {
        crate::exec::Stats::secs(&self.wait_ns)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error(
        "no CUDA driver found (libcuda.so could not be loaded); use --device cpu, or run on a machine with an NVIDIA driver"
    )]
    NoDriver,
    #[error(
        "{needed} GPUs needed for ranks {ranks}, but only {found} visible; use --ranks, or fewer --tp per node"
    )]
    TooFewDevices {
        needed: usize,
        found: usize,
        ranks: String,
    },
    #[error("{device}: {op}: {message}")]
    Driver {
        device: String,
        op: &'static str,
        message: String,
    },
    #[error("{device}: out of memory allocating {bytes} bytes")]
    OutOfMemory { device: String, bytes: u64 },
    /// A source read made by the device itself (into its staging or memory).
    #[error("reading {path}: {source}")]
    Read {
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Host memory: what tests and CPU-only machines use.
#[derive(Default)]
pub(crate) struct CpuDevice {
    bufs: Vec<HostBuf>,
    stages: Stages,
}

/// One anonymous mapping and where it starts: written through the pointer by many threads at
/// once, each to its own bytes.
struct HostBuf {
    /// Kept for its lifetime: the bytes are reached through `ptr`.
    _map: memmap2::MmapMut,
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the engine writes each destination byte from exactly one piece (the plan's pieces of
// a tensor are disjoint), so concurrent writes through `ptr` never touch the same bytes, and
// buffers are read (download) only after every write has returned.
unsafe impl Send for CpuDevice {}
unsafe impl Sync for CpuDevice {}

thread_local! {
    /// O_DIRECT cannot read into arbitrary addresses: an aligned buffer per thread, reused.
    static BOUNCE: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::default());
}

impl CpuDevice {
    /// Bytes `[offset, offset + len)` of buffer `buf`, for writing.
    #[allow(clippy::mut_from_ref)]
    fn span(&self, buf: usize, offset: u64, len: usize) -> Result<&mut [u8], DeviceError> {
        let b = &self.bufs[buf];
        let end = (offset as usize).checked_add(len);
        if end.is_none_or(|e| e > b.len) {
            return Err(DeviceError::Driver {
                device: "cpu".into(),
                op: "writing host memory",
                message: format!(
                    "{len} bytes at {offset} do not fit a buffer of {} bytes",
                    b.len
                ),
            });
        }
        // SAFETY: in bounds (checked above); disjoint from every other live span (see the
        // Send/Sync note on CpuDevice).
        Ok(unsafe { std::slice::from_raw_parts_mut(b.ptr.as_ptr().add(offset as usize), len) })
    }
}

impl Device for CpuDevice {
    fn describe(&self) -> String {
        "cpu".into()
    }

    fn is_host(&self) -> bool {
        true
    }

    fn alloc(&mut self, sizes: &[u64]) -> Result<(), DeviceError> {
        self.alloc_phased(sizes, &[])
    }

    fn alloc_phased(&mut self, sizes: &[u64], phases: &[u64]) -> Result<(), DeviceError> {
        // Anonymous maps are zero pages until written: allocating costs nothing. (Huge pages were
        // measured slower: with THP defrag on request, first writes stall in compaction.)
        let mut bufs = Vec::with_capacity(sizes.len());
        for (i, &n) in sizes.iter().enumerate() {
            let phase = phases.get(i).map_or(0, |p| (p % ALIGN) as usize);
            let mut map = memmap2::MmapMut::map_anon(n.max(1) as usize + phase).map_err(|_| {
                DeviceError::OutOfMemory {
                    device: "cpu".into(),
                    bytes: n,
                }
            })?;
            // SAFETY: `phase` bytes into a map that is `phase` bytes longer than the buffer.
            let ptr = NonNull::new(unsafe { map.as_mut_ptr().add(phase) })
                .expect("a mapping is never at address 0");
            bufs.push(HostBuf {
                _map: map,
                ptr,
                len: n as usize,
            });
        }
        self.bufs = bufs;
        Ok(())
    }

    fn upload(&self, buf: usize, offset: u64, host: &[u8]) -> Result<(), DeviceError> {
        let dst = self.span(buf, offset, host.len())?;
        self.stages
            .upload
            .time(host.len() as u64, || dst.copy_from_slice(host));
        Ok(())
    }

    fn upload_from_file(
        &self,
        buf: usize,
        offset: u64,
        src: &SourceFile,
        src_offset: u64,
        len: u64,
    ) -> Result<bool, DeviceError> {
        let dst = self.span(buf, offset, len as usize)?;
        BOUNCE
            .with_borrow_mut(|bounce| {
                self.stages
                    .read
                    .time(len, || src.read_into_in_place(dst, src_offset, bounce))
            })
            .map_err(|e| DeviceError::Read {
                path: src.path.clone(),
                source: e,
            })?;
        Ok(true)
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    fn download(&self, buf: usize) -> Result<Vec<u8>, DeviceError> {
        let b = &self.bufs[buf];
        // SAFETY: `ptr` starts `len` bytes inside `map`; every write has returned (see the
        // Send/Sync note).
        Ok(unsafe { std::slice::from_raw_parts(b.ptr.as_ptr(), b.len) }.to_vec())
    }

    fn stages(&self) -> &Stages {
        &self.stages
    }
}
