//! The loader's sink: each output tensor goes to a buffer on a [`Device`], and the time spent in
//! device calls is counted per device. The writer ([`super::write`]) and the verifier
//! ([`super::verify`]) are the other sinks.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::device::{Device, DeviceError};
use super::source::SourceFile;
use super::{ExecError, Sink};

pub(crate) struct LoadSink<'a> {
    devices: &'a [Box<dyn Device>],
    /// out → (device, buffer)
    map: Vec<(usize, usize)>,
    /// Time spent in device calls, per device.
    pub copy_ns: Vec<AtomicU64>,
}

impl<'a> LoadSink<'a> {
    /// A sink onto `devices`, output `out` going to buffer `map[out].1` of device `map[out].0`.
    pub(crate) fn new(devices: &'a [Box<dyn Device>], map: Vec<(usize, usize)>) -> LoadSink<'a> {
        let copy_ns = (0..devices.len()).map(|_| AtomicU64::new(0)).collect();
        LoadSink {
            devices,
            map,
            copy_ns,
        }
    }

    /// Runs a device call for output `out`, timing it against that rank.
    fn on_device<T>(
        &self,
        out: usize,
        f: impl FnOnce(&dyn Device, usize) -> Result<T, DeviceError>,
    ) -> Result<T, ExecError> {
        let (d, b) = self.map[out];
        let t = Instant::now();
        let r = f(self.devices[d].as_ref(), b).map_err(ExecError::Device)?;
        self.copy_ns[d].fetch_add(t.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(r)
    }
}

impl Sink for LoadSink<'_> {
    fn put(&self, out: usize, offset: u64, bytes: &[u8]) -> Result<(), ExecError> {
        self.on_device(out, |d, b| d.upload(b, offset, bytes))
    }

    fn starts_zeroed(&self) -> bool {
        self.devices.iter().all(|d| d.starts_zeroed())
    }

    fn cheap_small_puts(&self) -> bool {
        self.devices.iter().all(|d| d.is_host())
    }

    fn copy_from_source(
        &self,
        out: usize,
        offset: u64,
        src: &SourceFile,
        src_offset: u64,
        len: u64,
    ) -> Result<bool, ExecError> {
        self.on_device(out, |d, b| {
            d.upload_from_file(b, offset, src, src_offset, len)
        })
    }
}
