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
    bufs: Vec<Mutex<Vec<u8>>>,
}

impl Device for CpuDevice {
    fn describe(&self) -> String {
        "cpu".into()
    }

    fn alloc(&mut self, sizes: &[u64]) -> Result<(), DeviceError> {
        let mut bufs = Vec::with_capacity(sizes.len());
        for &n in sizes {
            let mut v = Vec::new();
            v.try_reserve_exact(n as usize)
                .map_err(|_| DeviceError::OutOfMemory {
                    device: self.describe(),
                    bytes: n,
                })?;
            v.resize(n as usize, 0);
            bufs.push(Mutex::new(v));
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

    fn synchronize(&self) -> Result<(), DeviceError> {
        Ok(())
    }

    fn download(&self, buf: usize) -> Result<Vec<u8>, DeviceError> {
        Ok(self.bufs[buf].lock().expect("buffer lock").clone())
    }
}
