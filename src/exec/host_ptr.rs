//! A sink into host memory that the caller owns, given as raw pointers: what the Python binding
//! loads into (numpy arrays, CPU torch tensors). Unlike [`super::device::CpuDevice`] the memory
//! is not fresh, so nothing is assumed zeroed: every fill is written, every byte of each
//! destination is the plan's.

use std::cell::RefCell;

use super::device::Stages;
use super::source::{AlignedBuf, SourceFile};
use super::{ExecError, Sink};

/// Caller-owned host buffers, output `out` being `dests[out]`.
pub struct HostPtrSink {
    dests: Vec<(*mut u8, usize)>,
    stages: Stages,
}

// SAFETY: the engine writes each destination byte from exactly one piece (the plan's pieces of a
// tensor are disjoint), so concurrent writes through the pointers never touch the same bytes;
// `HostPtrSink::new`'s caller guarantees that nothing else uses the memory meanwhile.
unsafe impl Send for HostPtrSink {}
unsafe impl Sync for HostPtrSink {}

thread_local! {
    /// O_DIRECT cannot read into arbitrary addresses: an aligned buffer per thread, reused.
    static BOUNCE: RefCell<AlignedBuf> = RefCell::new(AlignedBuf::default());
}

impl HostPtrSink {
    /// A sink writing output `out` into the `dests[out].1` bytes at `dests[out].0`.
    ///
    /// # Safety
    /// Each pointer must be valid for writes of its length, the buffers must not overlap, and
    /// nothing else may read or write them until the sink is dropped.
    pub unsafe fn new(dests: Vec<(*mut u8, usize)>) -> HostPtrSink {
        HostPtrSink {
            dests,
            stages: Stages::default(),
        }
    }

    /// What the sink did: its own reads (straight into the buffers) and its copies.
    pub fn stages(&self) -> &Stages {
        &self.stages
    }

    /// Bytes `[offset, offset + len)` of output `out`, for writing.
    #[allow(clippy::mut_from_ref)]
    fn span(&self, out: usize, offset: u64, len: usize) -> Result<&mut [u8], ExecError> {
        let (ptr, size) = self.dests[out];
        let end = usize::try_from(offset)
            .ok()
            .and_then(|o| o.checked_add(len));
        if end.is_none_or(|e| e > size) {
            return Err(ExecError::Device(super::device::DeviceError::Driver {
                device: "host memory".into(),
                op: "writing a destination",
                message: format!("{len} bytes at {offset} do not fit a buffer of {size} bytes"),
            }));
        }
        // SAFETY: in bounds (checked above) of a buffer valid for writes (`new`'s contract);
        // disjoint from every other live span (see the Send/Sync note).
        Ok(unsafe { std::slice::from_raw_parts_mut(ptr.add(offset as usize), len) })
    }
}

impl Sink for HostPtrSink {
    fn put(&self, out: usize, offset: u64, bytes: &[u8]) -> Result<(), ExecError> {
        let dst = self.span(out, offset, bytes.len())?;
        self.stages
            .upload
            .time(bytes.len() as u64, || dst.copy_from_slice(bytes));
        Ok(())
    }

    fn starts_zeroed(&self) -> bool {
        false
    }

    fn cheap_small_puts(&self) -> bool {
        true
    }

    fn copy_from_source(
        &self,
        out: usize,
        offset: u64,
        src: &SourceFile,
        src_offset: u64,
        len: u64,
    ) -> Result<bool, ExecError> {
        let dst = self.span(out, offset, len as usize)?;
        BOUNCE
            .with_borrow_mut(|bounce| {
                self.stages
                    .read
                    .time(len, || src.read_into_in_place(dst, src_offset, bounce))
            })
            .map_err(|e| ExecError::io("reading", &src.path, e))?;
        Ok(true)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::AtomicBool;

    use super::super::source::IoMode;
    use super::super::tests::{Rng, SEED, problem, reference_tensor};
    use super::super::{Control, ExecOptions, Placement, execute};
    use super::*;
    use crate::progress::Quiet;

    /// Random plans into buffers full of garbage: every byte ends up the reference's (zero fills
    /// included), read buffered, direct and mapped, at chunk sizes that split elements.
    #[test]
    fn fills_every_byte_of_caller_memory() {
        let mut rng = Rng(SEED ^ 0x0070_7472);
        for round in 0..4 {
            let root = tempfile::TempDir::new().unwrap();
            let (plan, srcs) = problem(&mut rng, root.path());
            for (chunk_bytes, io) in [
                (7, IoMode::Buffered),
                (4096, IoMode::Direct),
                (super::super::CHUNK_BYTES, IoMode::Mmap),
            ] {
                let mut placements = Vec::new();
                let mut bufs: Vec<Vec<u8>> = Vec::new();
                for (ri, r) in plan.ranks.iter().enumerate() {
                    for (ti, t) in r.tensors.iter().enumerate() {
                        placements.push(Placement {
                            rank: ri,
                            tensor: ti,
                            out: bufs.len(),
                            offset: 0,
                        });
                        bufs.push(vec![0xA5; t.bytes as usize]);
                    }
                }
                let dests = bufs.iter_mut().map(|b| (b.as_mut_ptr(), b.len())).collect();
                // SAFETY: each Vec outlives the sink and is used by nothing else meanwhile.
                let sink = unsafe { HostPtrSink::new(dests) };
                let cancel = AtomicBool::new(false);
                let opts = ExecOptions {
                    chunk_bytes,
                    direct: true,
                    io,
                    share_reads: false,
                };
                let ctl = Control::new(&cancel, &Quiet).with_options(opts);
                execute(&plan, root.path(), &placements, &sink, &ctl)
                    .unwrap_or_else(|e| panic!("round {round} {io:?}: {e}"));
                drop(sink);
                for pl in &placements {
                    let t = &plan.ranks[pl.rank].tensors[pl.tensor];
                    let want = reference_tensor(t, &srcs);
                    assert!(
                        bufs[pl.out] == want,
                        "round {round} {io:?} chunk {chunk_bytes}: {} differs",
                        t.name
                    );
                }
            }
        }
    }

    /// A put past a destination's end is an error naming the sizes, not a write out of bounds.
    #[test]
    fn out_of_bounds_puts_are_refused() {
        let mut buf = vec![0u8; 4];
        // SAFETY: `buf` outlives the sink.
        let sink = unsafe { HostPtrSink::new(vec![(buf.as_mut_ptr(), buf.len())]) };
        let err = sink.put(0, 2, &[1, 2, 3]).unwrap_err().to_string();
        assert!(
            err.contains("3 bytes at 2") && err.contains("4 bytes"),
            "{err}"
        );
        sink.put(0, 1, &[1, 2, 3]).unwrap();
        drop(sink);
        assert_eq!(buf, [0, 1, 2, 3]);
    }
}
