//! The engine's copies: a work item's source bytes read (or handed to the sink straight from
//! the file), converted and put, plus the fills; one place for the timing and counting every
//! copy shares.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use super::jobs::{Fill, Job};
use super::source::{AlignedBuf, SourceFile};
use super::timing::add_since;
use super::{ExecError, ExecOptions, Sink, Stats, convert, device, gather};
use crate::plan::SourceTensor;
use crate::progress::Progress;

/// What every source's copy shares: where bytes go, when to stop, what to count.
pub(super) struct Run<'a> {
    pub(super) sink: &'a dyn Sink,
    pub(super) cancel: &'a AtomicBool,
    pub(super) progress: &'a dyn Progress,
    pub(super) stats: &'a Stats,
    pub(super) opts: ExecOptions,
}

impl Run<'_> {
    /// Writes the fills, in order, after the copies.
    pub(super) fn fills(&self, fills: Vec<Fill>) -> Result<(), ExecError> {
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
pub(super) struct Buffers {
    read: AlignedBuf,
    converted: Vec<u8>,
    /// Elements of a transposed row gathered before conversion.
    gathered: Vec<u8>,
}

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
    pub(super) fn stopped(&self) -> Result<(), ExecError> {
        if self.cancel.load(Ordering::Relaxed) {
            Err(ExecError::Cancelled)
        } else {
            Ok(())
        }
    }

    /// Hands `bytes` to the sink, timed and counted.
    pub(super) fn put(&self, out: usize, offset: u64, bytes: &[u8]) -> Result<(), ExecError> {
        let t = Instant::now();
        self.sink.put(out, offset, bytes)?;
        add_since(&self.stats.put_ns, t);
        self.progress.advance(bytes.len() as u64);
        Ok(())
    }

    /// Bytes `[at, at + len)` of a dense unconverted job: straight from the file when the sink
    /// can take them so (file to file, or into a device's staging), else read and put.
    pub(super) fn copy_span(
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
    pub(super) fn read<'b>(
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
    pub(super) fn copy_chunk(
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
        // Padded rows are dense only with their padding, which the gather below writes.
        let dst_dense = (job.b.rows == 1 || job.b.dst_stride == job.b.row) && job.pad == 0;
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
        let one_put = dst_dense && !self.sink.cheap_small_puts();
        out.clear();
        if (one_put || job.pad > 0) && src.dtype == job.to {
            // Short rows (MXFP4, INT4 at a high TP), and rows followed by their zero padding
            // (`jobs::pads_rows`): one tight loop, one clock read.
            let t = Instant::now();
            let (b, pad) = (&job.b, job.pad);
            let first = gather::rows(b, (k_lo, k_hi), (c0, c1), (isz, pad), buf, out);
            add_since(&self.stats.convert_ns, t);
            return match first {
                Some(dst) => self.put(job.out, job.base + dst * osz, out),
                None => Ok(()),
            };
        }
        let mut first: Option<u64> = None;
        for k in k_lo..k_hi {
            let s = job.b.src_start + k * job.b.src_stride;
            let (a, e) = (s.max(c0), (s + job.b.row).min(c1));
            if a >= e {
                continue;
            }
            let bytes = &buf[((a - c0) * isz) as usize..((e - c0) * isz) as usize];
            let dst = job.b.dst_start + k * job.b.dst_stride + (a - s);
            if one_put {
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
