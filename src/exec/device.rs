//! Where `load` puts tensors: a device per rank, behind one small trait, so that everything but the
//! driver calls runs (and is tested) with the host-memory implementation.

use std::sync::Mutex;

/// One rank's memory.
pub trait Device: Send + Sync {
    /// e.g. "cpu" or "cuda:3 (NVIDIA H200)".
    fn describe(&self) -> String;
    /// Allocates one zeroed buffer per size; buffers are then addressed by index.
    fn alloc(&mut self, sizes: &[u64]) -> Result<(), DeviceError>;
    /// Copies `host` to `offset` of buffer `buf`. May be asynchronous: `host` is free to reuse when
    /// this returns, the data is in place after [`Device::synchronize`].
    fn upload(&self, buf: usize, offset: u64, host: &[u8]) -> Result<(), DeviceError>;
    /// Reads `len` bytes of `file` from `src_offset` straight into buffer `buf` at `offset`, when
    /// the device can take them without an extra host copy. `Ok(false)`: it cannot; the caller
    /// reads and [`Device::upload`]s.
    fn upload_from_file(
        &self,
        _buf: usize,
        _offset: u64,
        _file: &std::fs::File,
        _src_offset: u64,
        _len: u64,
    ) -> Result<bool, DeviceError> {
        Ok(false)
    }
    /// Host memory: small uploads are as cheap as large ones.
    fn is_host(&self) -> bool {
        false
    }
    /// Waits until every upload has landed.
    fn synchronize(&self) -> Result<(), DeviceError>;
    /// A buffer's contents, copied back to the host (checksums, `--check`).
    fn download(&self, buf: usize) -> Result<Vec<u8>, DeviceError>;
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
}

/// Host memory: what tests and CPU-only machines use.
#[derive(Default)]
pub struct CpuDevice {
    bufs: Vec<Mutex<memmap2::MmapMut>>,
}

impl Device for CpuDevice {
    fn describe(&self) -> String {
        "cpu".into()
    }

    fn is_host(&self) -> bool {
        true
    }

    fn alloc(&mut self, sizes: &[u64]) -> Result<(), DeviceError> {
        // Anonymous maps are zero pages until written: allocating costs nothing. (Huge pages were
        // measured slower: with THP defrag on request, first writes stall in compaction.)
        let mut bufs = Vec::with_capacity(sizes.len());
        for &n in sizes {
            let map = memmap2::MmapMut::map_anon(n.max(1) as usize).map_err(|_| {
                DeviceError::OutOfMemory {
                    device: "cpu".into(),
                    bytes: n,
                }
            })?;
            bufs.push(Mutex::new(map));
        }
        self.bufs = bufs;
        Ok(())
    }

    fn upload(&self, buf: usize, offset: u64, host: &[u8]) -> Result<(), DeviceError> {
        let mut b = self.bufs[buf]
            .lock()
            .expect("no thread panics while holding a buffer");
        let at = offset as usize;
        b[at..at + host.len()].copy_from_slice(host);
        Ok(())
    }

    fn upload_from_file(
        &self,
        buf: usize,
        offset: u64,
        file: &std::fs::File,
        src_offset: u64,
        len: u64,
    ) -> Result<bool, DeviceError> {
        use std::os::unix::fs::FileExt;
        let mut b = self.bufs[buf]
            .lock()
            .expect("no thread panics while holding a buffer");
        let at = offset as usize;
        file.read_exact_at(&mut b[at..at + len as usize], src_offset)
            .map_err(|e| DeviceError::Driver {
                device: "cpu".into(),
                op: "reading into host memory",
                message: e.to_string(),
            })?;
        Ok(true)
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    fn download(&self, buf: usize) -> Result<Vec<u8>, DeviceError> {
        Ok(self.bufs[buf].lock().expect("buffer lock").to_vec())
    }
}
