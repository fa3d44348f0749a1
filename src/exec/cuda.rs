//! CUDA devices through cudarc's driver calls, loaded dynamically: the binary builds and runs
//! without CUDA, and says so clearly when the driver is missing (cudarc would panic on the first
//! call).
//!
//! Bytes reach a GPU through a pool of pinned staging slots: a worker takes the slot whose copy
//! was queued longest ago, reads the source straight into it (one host copy: page cache or disk
//! to pinned memory), queues the copy to the device on the device's stream, and puts the slot
//! back. It waits on a slot's copy only when it takes that slot again, a whole pool later, so
//! reads on every thread overlap the copies in flight.

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::{Condvar, Mutex};
use std::time::Instant;

use cudarc::driver::DriverError;
use cudarc::driver::result;
use cudarc::driver::sys;

use super::device::{Device, DeviceError, Stages};
use super::source::{SourceFile, staging_len};

/// Bytes one slot carries per copy (plus O_DIRECT's alignment slack): large enough for the copy
/// engine to run at full speed, small enough that a pool per thread stays modest.
const SLOT_BYTES: usize = 16 << 20;
/// Slots per worker thread: one being filled while the other's copy is in flight.
const SLOTS_PER_THREAD: usize = 2;
/// Bounds on a device's pool, whatever the thread count.
const MIN_SLOTS: usize = 4;
const MAX_SLOTS: usize = 32;

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

/// The calling thread's current CUDA context, made current again when this is dropped: a
/// [`CudaDevice`] binds its own on every thread it runs on, and a caller such as torch (whose
/// `current_device()` is the current context's device) must find its thread as it left it.
pub struct ContextGuard(Option<sys::CUcontext>);

impl ContextGuard {
    pub fn save() -> ContextGuard {
        // SAFETY: only tries to dlopen libcuda; no driver call is made without it.
        if !unsafe { sys::is_culib_present() } {
            return ContextGuard(None);
        }
        let mut ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: writes one handle. Before cuInit it fails: then no context is current.
        if unsafe { sys::cuCtxGetCurrent(&mut ctx) }.result().is_err() {
            ctx = std::ptr::null_mut();
        }
        ContextGuard(Some(ctx))
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if let Some(ctx) = self.0 {
            // SAFETY: the context was current on this thread when saved (or none was: null
            // unbinds); the caller still holds it.
            let _ = unsafe { sys::cuCtxSetCurrent(ctx) };
        }
    }
}

/// How many staging slots each of `devices` GPUs gets when the engine runs `threads` workers:
/// the pool is shared out so that host memory stays bounded by the threads, not by the ranks;
/// and a device receiving `bytes` gets no more than those bytes fill.
pub fn slots_per_device(devices: usize, threads: usize, bytes: u64) -> usize {
    let fill = bytes.div_ceil(SLOT_BYTES as u64).max(1) as usize;
    (threads * SLOTS_PER_THREAD / devices.max(1))
        .clamp(MIN_SLOTS, MAX_SLOTS)
        .min(fill.max(MIN_SLOTS))
}

/// One pinned buffer, and the events around the last copy queued from it.
struct Slot {
    host: *mut u8,
    start: sys::CUevent,
    done: sys::CUevent,
    /// A copy was queued from `host` and not yet waited for.
    pending: bool,
}

// SAFETY: a slot belongs to one thread at a time (taken out of the pool's queue, put back after);
// its pointer is pinned memory owned by the device.
unsafe impl Send for Slot {}

/// The slots not in a worker's hands, oldest queued copy first.
struct Pool {
    free: Mutex<VecDeque<Slot>>,
    back: Condvar,
}

/// One GPU: its primary context, one stream (copies on it run one after another, so each
/// copy's event time is its own), device buffers, and the staging pool.
///
/// Made by [`CudaDevice::new`] it owns all of these. Made by [`CudaDevice::borrowing`] the
/// buffers and the stream are the caller's (the Python binding's torch tensors and torch's
/// stream): they are filled and waited on, never freed or destroyed, and not zeroed first.
pub struct CudaDevice {
    ordinal: usize,
    name: String,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    bufs: Vec<(sys::CUdeviceptr, u64)>,
    /// The buffers and the stream belong to the caller.
    borrowed: bool,
    pool: Pool,
    slots: usize,
    /// Bytes one slot carries ([`SLOT_BYTES`] but in tests).
    slot_bytes: usize,
    stages: Stages,
}

// SAFETY: the context, stream and events are driver handles usable from any thread once the
// context is current (every call below binds it first); device pointers are plain addresses.
unsafe impl Sync for CudaDevice {}
unsafe impl Send for CudaDevice {}

impl CudaDevice {
    /// Device `ordinal`, with a pool of `slots` pinned staging slots.
    pub fn new(ordinal: usize, slots: usize) -> Result<CudaDevice, DeviceError> {
        let mut d = CudaDevice::open(ordinal)?;
        d.stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .map_err(|e| err(ordinal, "creating a stream", e))?;
        d.add_slots(slots)?;
        Ok(d)
    }

    /// Device `ordinal` filling the caller's buffers `bufs` (device address, bytes) by copies
    /// queued on the caller's `stream` (0: the legacy default stream), in the device's primary
    /// context: the one the CUDA runtime, and so torch and CuPy, allocate in.
    ///
    /// # Safety
    /// Each buffer must be device memory of this device valid for writes of its length (see
    /// [`CudaDevice::destination_problem`]), the buffers must not overlap, and nothing else may
    /// use them until the device has been synchronised; `stream` must be a stream of this
    /// device's primary context that outlives the device.
    pub unsafe fn borrowing(
        ordinal: usize,
        slots: usize,
        stream: u64,
        bufs: Vec<(u64, u64)>,
    ) -> Result<CudaDevice, DeviceError> {
        let mut d = CudaDevice::open(ordinal)?;
        d.borrowed = true;
        d.stream = stream as sys::CUstream;
        d.bufs = bufs;
        d.add_slots(slots)?;
        Ok(d)
    }

    /// Why buffer `buf` cannot be filled from this device (it is not device memory, or it is
    /// another GPU's), in words; `None` when it can. Asked of the driver, so that a wrong
    /// address is refused before a byte is read instead of failing a copy halfway.
    pub fn destination_problem(&self, buf: usize) -> Option<String> {
        let (ptr, len) = self.bufs[buf];
        if len == 0 {
            return None;
        }
        if let Err(e) = self.bind() {
            return Some(e.to_string());
        }
        let attr = |a: sys::CUpointer_attribute| -> Result<u32, DriverError> {
            let mut v = 0u32;
            // SAFETY: both attributes asked are 32-bit values written to `v`; any address may be
            // asked about.
            unsafe {
                sys::cuPointerGetAttribute((&raw mut v).cast(), a, ptr).result()?;
            }
            Ok(v)
        };
        use sys::CUpointer_attribute::{
            CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        };
        let kind = match attr(CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
            Ok(k) => k,
            Err(e) => {
                return Some(format!(
                    "address {ptr:#x} is not memory CUDA knows ({e}); pass a CUDA tensor's data_ptr()"
                ));
            }
        };
        if kind != sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
            return Some(format!(
                "address {ptr:#x} is host memory, not device memory; load it with device=\"cpu\""
            ));
        }
        match attr(CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL) {
            Ok(o) if o as usize == self.ordinal => None,
            Ok(o) => Some(format!(
                "address {ptr:#x} is memory of cuda:{o}, not cuda:{}; pass device_index={o}",
                self.ordinal
            )),
            Err(e) => Some(format!("address {ptr:#x}: asking its device: {e}")),
        }
    }

    /// The device's primary context, bound to this thread; no stream, buffers or slots yet.
    fn open(ordinal: usize) -> Result<CudaDevice, DeviceError> {
        let e = |op| move |e: DriverError| err(ordinal, op, e);
        result::init().map_err(e("initialising the driver"))?;
        let dev = result::device::get(ordinal as i32).map_err(e("opening the device"))?;
        // SAFETY: `dev` came from device::get.
        let ctx = unsafe { result::primary_ctx::retain(dev) }.map_err(e("creating a context"))?;
        let d = CudaDevice {
            ordinal,
            name: result::device::get_name(dev).unwrap_or_else(|_| "GPU".into()),
            dev,
            ctx,
            stream: std::ptr::null_mut(),
            bufs: Vec::new(),
            borrowed: false,
            pool: Pool {
                free: Mutex::new(VecDeque::new()),
                back: Condvar::new(),
            },
            slots: 0,
            slot_bytes: super::hooks::slot_bytes().unwrap_or(SLOT_BYTES),
            stages: Stages::default(),
        };
        // From here on Drop releases whatever was made.
        d.bind()?;
        Ok(d)
    }

    /// Allocates the staging pool: `slots` pinned buffers.
    fn add_slots(&mut self, slots: usize) -> Result<(), DeviceError> {
        let free = self.pool.free.get_mut().expect("staging pool lock");
        for _ in 0..slots {
            // Pushed one by one, so that Drop frees those made before a failure.
            let slot = CudaDevice::new_slot_in(self.ordinal, self.slot_bytes)?;
            free.push_back(slot);
            self.slots += 1;
        }
        Ok(())
    }

    fn new_slot_in(ordinal: usize, slot_bytes: usize) -> Result<Slot, DeviceError> {
        let e = |op| move |e: DriverError| err(ordinal, op, e);
        // SAFETY: pinned allocation in the bound context; page-aligned, as O_DIRECT needs.
        let host = unsafe { result::malloc_host(staging_len(slot_bytes), 0) }
            .map_err(e("allocating pinned memory"))? as *mut u8;
        let start = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let done = result::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT);
        match (start, done) {
            (Ok(start), Ok(done)) => Ok(Slot {
                host,
                start,
                done,
                pending: false,
            }),
            (a, b) => {
                // SAFETY: just made, never used.
                unsafe {
                    let _ = result::free_host(host as *mut std::ffi::c_void);
                    for ev in [a.as_ref().ok(), b.as_ref().ok()].into_iter().flatten() {
                        let _ = result::event::destroy(*ev);
                    }
                }
                Err(err(
                    ordinal,
                    "creating an event",
                    a.err().or(b.err()).expect("one failed"),
                ))
            }
        }
    }

    fn bind(&self) -> Result<(), DeviceError> {
        // SAFETY: the context was retained in `new` and is released only in Drop.
        unsafe { result::ctx::set_current(self.ctx) }
            .map_err(|e| err(self.ordinal, "binding the context", e))
    }

    /// Takes the slot whose copy was queued longest ago, once that copy is done; runs `f` with
    /// it and puts it back, whatever `f` returns (a lost slot would stall the other workers).
    fn with_slot<T>(
        &self,
        f: impl FnOnce(&mut Slot) -> Result<T, DeviceError>,
    ) -> Result<T, DeviceError> {
        let t = Instant::now();
        let mut slot = {
            let mut q = self.pool.free.lock().expect("staging pool lock");
            loop {
                if let Some(s) = q.pop_front() {
                    break s;
                }
                q = self.pool.back.wait(q).expect("staging pool lock");
            }
        };
        let r = self.settle(&mut slot).and_then(|()| {
            self.stages
                .wait_ns
                .fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
            f(&mut slot)
        });
        self.pool
            .free
            .lock()
            .expect("staging pool lock")
            .push_back(slot);
        self.pool.back.notify_one();
        r
    }

    /// Waits for the slot's last copy and counts how long the device took for it.
    fn settle(&self, slot: &mut Slot) -> Result<(), DeviceError> {
        if !slot.pending {
            return Ok(());
        }
        slot.pending = false;
        self.bind()?;
        // SAFETY: both events were recorded on this device's stream (see `send`).
        let ms = unsafe {
            result::event::synchronize(slot.done)
                .map_err(|e| err(self.ordinal, "waiting for a copy", e))?;
            result::event::elapsed(slot.start, slot.done)
                .map_err(|e| err(self.ordinal, "timing a copy", e))?
        };
        self.stages
            .device_copy_ns
            .fetch_add((ms as f64 * 1e6) as u64, Ordering::Relaxed);
        Ok(())
    }

    /// Queues the copy of `len` staged bytes from `at` in the slot to `dst`, between the slot's
    /// two events.
    fn send(
        &self,
        slot: &mut Slot,
        dst: sys::CUdeviceptr,
        at: usize,
        len: usize,
    ) -> Result<(), DeviceError> {
        let e = |op| move |e: DriverError| err(self.ordinal, op, e);
        self.bind()?;
        // SAFETY: `host[at..at + len]` is inside the slot's pinned buffer and stays untouched
        // until `settle` has waited for `done`; `dst` lies inside a buffer of this device (the
        // callers check the bounds).
        unsafe {
            result::event::record(slot.start, self.stream).map_err(e("recording an event"))?;
            let staged = std::slice::from_raw_parts(slot.host.add(at), len);
            result::memcpy_htod_async(dst, staged, self.stream)
                .map_err(e("copying to the device"))?;
            result::event::record(slot.done, self.stream).map_err(e("recording an event"))?;
        }
        slot.pending = true;
        Ok(())
    }

    /// The device address of bytes `[offset, offset + len)` of buffer `buf`.
    fn target(&self, buf: usize, offset: u64, len: u64) -> Result<sys::CUdeviceptr, DeviceError> {
        let (base, size) = self.bufs[buf];
        if offset.checked_add(len).is_none_or(|end| end > size) {
            return Err(DeviceError::Driver {
                device: format!("cuda:{}", self.ordinal),
                op: "copying to the device",
                message: format!("{len} bytes at {offset} do not fit a buffer of {size} bytes"),
            });
        }
        Ok(base + offset)
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
        assert!(!self.borrowed, "a borrowing CudaDevice allocates nothing");
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
            self.bufs.push((ptr, n));
            // SAFETY: zero the fresh allocation (vocab padding and skipped zero fills rely on it).
            unsafe { result::memset_d8_sync(ptr, 0, n.max(1) as usize) }
                .map_err(|e| err(self.ordinal, "zeroing device memory", e))?;
        }
        Ok(())
    }

    fn upload(&self, buf: usize, offset: u64, host: &[u8]) -> Result<(), DeviceError> {
        let dst = self.target(buf, offset, host.len() as u64)?;
        let step = self.slot_bytes;
        for (k, piece) in host.chunks(step).enumerate() {
            self.with_slot(|slot| {
                self.stages.upload.time(piece.len() as u64, || {
                    // SAFETY: the slot is ours and its last copy is done (with_slot); the piece
                    // fits (chunks of the slot size).
                    unsafe {
                        std::ptr::copy_nonoverlapping(piece.as_ptr(), slot.host, piece.len())
                    };
                    self.send(slot, dst + (k * step) as u64, 0, piece.len())
                })
            })?;
        }
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
        let dst = self.target(buf, offset, len)?;
        let mut done = 0u64;
        while done < len {
            let n = (self.slot_bytes as u64).min(len - done);
            self.with_slot(|slot| {
                // SAFETY: the slot's buffer holds staging_len(slot_bytes) bytes, is ours, and no
                // copy from it is in flight (with_slot).
                let room = unsafe {
                    std::slice::from_raw_parts_mut(slot.host, staging_len(self.slot_bytes))
                };
                let at = self
                    .stages
                    .read
                    .time(n, || src.read_staged(room, src_offset + done, n as usize))
                    .map_err(|e| DeviceError::Read {
                        path: src.path.clone(),
                        source: e,
                    })?;
                self.stages
                    .upload
                    .time(n, || self.send(slot, dst + done, at, n as usize))
            })?;
            done += n;
        }
        Ok(true)
    }

    fn synchronize(&self) -> Result<(), DeviceError> {
        self.bind()?;
        // SAFETY: the stream is this device's, alive until Drop.
        unsafe { result::stream::synchronize(self.stream) }
            .map_err(|e| err(self.ordinal, "synchronising", e))?;
        // Slots still holding a finished copy: count their device time.
        let mut q = self.pool.free.lock().expect("staging pool lock");
        for slot in q.iter_mut() {
            self.settle(slot)?;
        }
        Ok(())
    }

    fn download(&self, buf: usize) -> Result<Vec<u8>, DeviceError> {
        // A synchronous copy back does not wait for a non-blocking stream: drain it first.
        self.synchronize()?;
        let (ptr, n) = self.bufs[buf];
        let mut out = vec![0u8; n as usize];
        // SAFETY: `ptr` holds `n` bytes; the copy is synchronous.
        unsafe { result::memcpy_dtoh_sync(&mut out, ptr) }
            .map_err(|e| err(self.ordinal, "copying back", e))?;
        Ok(out)
    }

    fn starts_zeroed(&self) -> bool {
        !self.borrowed
    }

    fn stages(&self) -> &Stages {
        &self.stages
    }

    fn staging_bytes(&self) -> u64 {
        (self.slots * staging_len(self.slot_bytes)) as u64
    }
}

impl Drop for CudaDevice {
    fn drop(&mut self) {
        if self.bind().is_err() {
            return;
        }
        // SAFETY: every handle below was made by this device (the borrowed buffers and stream
        // are left alone) and is used by nothing after this; the stream is drained first, so no
        // copy reads a slot or writes a buffer being freed.
        unsafe {
            if self.borrowed || !self.stream.is_null() {
                let _ = result::stream::synchronize(self.stream);
            }
            if !self.borrowed {
                for (ptr, _) in self.bufs.drain(..) {
                    let _ = result::free_sync(ptr);
                }
            }
            let q = self
                .pool
                .free
                .get_mut()
                .map(std::mem::take)
                .unwrap_or_default();
            for slot in q {
                let _ = result::free_host(slot.host as *mut std::ffi::c_void);
                let _ = result::event::destroy(slot.start);
                let _ = result::event::destroy(slot.done);
            }
            if !self.borrowed && !self.stream.is_null() {
                let _ = result::stream::destroy(self.stream);
            }
            let _ = result::primary_ctx::release(self.dev);
        }
    }
}
