//! CUDA devices through cudarc, loaded dynamically: the binary builds and runs without CUDA, and
//! says so clearly when the driver is missing (cudarc would panic on the first call).

use std::sync::{Arc, Mutex};

use cudarc::driver::result;
use cudarc::driver::sys;
use cudarc::driver::{CudaContext, CudaEvent, CudaStream, DriverError};

use super::device::{Device, DeviceError};

/// Pinned staging buffers per rank, and their size: copies from them overlap the next reads.
const RING: usize = 4;
const SLOT_BYTES: usize = 32 << 20;

/// Checks that a driver is present and returns how many devices it sees.
pub fn device_count() -> Result<usize, DeviceError> {
    // SAFETY: only tries to dlopen libcuda; no driver call is made.
    if !unsafe { sys::is_culib_present() } {
        return Err(DeviceError::NoDriver);
    }
    let drv = |e: DriverError| DeviceError::Driver {
        device: "cuda".into(),
        op: "initialising the driver",
        message: e.to_string(),
    };
    result::init().map_err(drv)?;
    Ok(result::device::get_count().map_err(drv)? as usize)
}

struct Slot {
    host: *mut u8,
    done: Option<CudaEvent>,
}

// SAFETY: a slot's host pointer is pinned memory owned by the device and only touched under the
// slot's mutex.
unsafe impl Send for Slot {}

/// One GPU: a context, a stream, device buffers, and a ring of pinned staging buffers.
pub struct CudaDevice {
    ordinal: usize,
    name: String,
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    bufs: Vec<(sys::CUdeviceptr, u64)>,
    ring: Vec<Mutex<Slot>>,
    next: std::sync::atomic::AtomicUsize,
}

// SAFETY: device pointers are plain addresses; all driver calls bind the context first.
unsafe impl Sync for CudaDevice {}
unsafe impl Send for CudaDevice {}

impl CudaDevice {
    pub fn new(ordinal: usize) -> Result<CudaDevice, DeviceError> {
        let ctx = CudaContext::new(ordinal).map_err(|e| err(ordinal, "creating a context", e))?;
        let name = ctx.name().unwrap_or_else(|_| "GPU".into());
        let stream = ctx
            .new_stream()
            .map_err(|e| err(ordinal, "creating a stream", e))?;
        let mut ring = Vec::with_capacity(RING);
        for _ in 0..RING {
            // SAFETY: allocation of pinned host memory in the bound context.
            let host = unsafe { result::malloc_host(SLOT_BYTES, 0) }
                .map_err(|e| err(ordinal, "allocating pinned memory", e))?;
            ring.push(Mutex::new(Slot {
                host: host as *mut u8,
                done: None,
            }));
        }
        Ok(CudaDevice {
            ordinal,
            name,
            ctx,
            stream,
            bufs: Vec::new(),
            ring,
            next: std::sync::atomic::AtomicUsize::new(0),
        })
    }

    fn bind(&self) -> Result<(), DeviceError> {
        self.ctx
            .bind_to_thread()
            .map_err(|e| err(self.ordinal, "binding the context", e))
    }
}

fn err(ordinal: usize, op: &'static str, e: DriverError) -> DeviceError {
    DeviceError::Driver {
        device: format!("cuda:{ordinal}"),
        op,
        message: e.to_string(),
    }
}

impl Device for CudaDevice {
    fn describe(&self) -> String {
        format!("cuda:{} ({})", self.ordinal, self.name)
    }

    fn alloc(&mut self, sizes: &[u64]) -> Result<(), DeviceError> {
        self.bind()?;
        for &n in sizes {
            // SAFETY: plain allocation in the bound context; freed in Drop.
            let ptr = unsafe { result::malloc_sync(n.max(1) as usize) }.map_err(|e| {
                if e.0 == sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY {
                    DeviceError::OutOfMemory {
                        device: format!("cuda:{}", self.ordinal),
                        bytes: n,
                    }
                } else {
                    err(self.ordinal, "allocating device memory", e)
                }
            })?;
            // SAFETY: zero the fresh allocation (vocab padding and skipped zero fills rely on it).
            unsafe { result::memset_d8_sync(ptr, 0, n.max(1) as usize) }
                .map_err(|e| err(self.ordinal, "zeroing device memory", e))?;
            self.bufs.push((ptr, n));
        }
        Ok(())
    }

    fn upload(&self, buf: usize, offset: u64, host: &[u8]) -> Result<(), DeviceError> {
        self.bind()?;
        let (base, _) = self.bufs[buf];
        for (k, piece) in host.chunks(SLOT_BYTES).enumerate() {
            let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % self.ring.len();
            let mut slot = self.ring[i].lock().expect("staging slot lock");
            if let Some(ev) = slot.done.take() {
                ev.synchronize()
                    .map_err(|e| err(self.ordinal, "waiting for a copy", e))?;
            }
            // SAFETY: the slot's earlier copy has completed, so its pinned buffer is free; the
            // piece fits (chunks of SLOT_BYTES).
            unsafe {
                std::ptr::copy_nonoverlapping(piece.as_ptr(), slot.host, piece.len());
                let staged = std::slice::from_raw_parts(slot.host, piece.len());
                result::memcpy_htod_async(
                    base + offset + (k * SLOT_BYTES) as u64,
                    staged,
                    self.stream.cu_stream(),
                )
                .map_err(|e| err(self.ordinal, "copying to the device", e))?;
            }
            slot.done = Some(
                self.stream
                    .record_event(None)
                    .map_err(|e| err(self.ordinal, "recording an event", e))?,
            );
        }
        Ok(())
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        self.bind()?;
        self.stream
            .synchronize()
            .map_err(|e| err(self.ordinal, "synchronising", e))
    }

    fn download(&self, buf: usize) -> Result<Vec<u8>, DeviceError> {
        self.bind()?;
        let (ptr, n) = self.bufs[buf];
        let mut out = vec![0u8; n as usize];
        // SAFETY: `ptr` holds `n` bytes; the copy is synchronous.
        unsafe { result::memcpy_dtoh_sync(&mut out, ptr) }
            .map_err(|e| err(self.ordinal, "copying back", e))?;
        Ok(out)
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        let _ = self.stream.synchronize();
        for (ptr, _) in self.bufs.drain(..) {
            // SAFETY: allocated by malloc_sync in this context and not used after this.
            let _ = unsafe { result::free_sync(ptr) };
        }
        for slot in &self.ring {
            let s = slot.lock().expect("staging slot lock");
            // SAFETY: allocated by malloc_host; every copy from it has completed (synchronised).
            let _ = unsafe { result::free_host(s.host as *mut std::ffi::c_void) };
        }
    }
}
