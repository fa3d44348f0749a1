//! Copies of transposed blocks: a destination row's elements lie a stride apart in the source,
//! so they are gathered in tiles of rows that share cache lines; apart from the plain copies
//! because the index arithmetic is its own.

use std::time::Instant;

use super::ExecError;
use super::convert;
use super::copy::Run;
use super::jobs::Job;
use super::timing::add_since;
use crate::layout::Block;
use crate::plan::SourceTensor;

impl Run<'_> {
    /// The elements of transposed `job` that lie in source elements `[c0, c1)`, held in
    /// `read`: per destination row a run of consecutive elements, gathered (then converted)
    /// into one buffer while the runs follow one another in the destination, and put.
    pub(super) fn put_transposed(
        &self,
        src: &SourceTensor,
        job: &Job,
        (c0, c1): (u64, u64),
        read: &[u8],
        out: &mut Vec<u8>,
        gathered: &mut Vec<u8>,
    ) -> Result<(), ExecError> {
        let b = job.b;
        let (isz, osz) = (src.dtype.bits() / 8, job.to.bits() / 8);
        let span = b.src_row_span();
        if b.rows == 0 || span == 0 || b.src_start >= c1 {
            return Ok(());
        }
        let stride = b.src_stride.max(1);
        if b.src_start + (b.rows - 1) * b.src_stride + span <= c0 {
            return Ok(());
        }
        // Rows k whose span [s_k, s_k + span) meets [c0, c1).
        let k_lo = if c0 < b.src_start + span {
            0
        } else {
            (c0 - b.src_start - span) / stride + 1
        };
        let k_hi = if b.rows == 1 {
            1
        } else {
            (c1 - b.src_start).div_ceil(stride).min(b.rows)
        };
        let es = b.src_elem_stride;
        out.clear();
        // Destination element where the gathered run starts, and where it ends.
        let mut run: Option<(u64, u64)> = None;
        let elems = |k: u64| elems_in(b.src_start + k * b.src_stride, es, b.row, (c0, c1));
        let mut k = k_lo;
        while k < k_hi {
            let (x_lo, x_hi) = elems(k);
            if x_lo >= x_hi {
                k += 1;
                continue;
            }
            // Whole rows that follow one another in the destination are gathered together, in
            // tiles (see Tile).
            let mut k_end = k + 1;
            if (x_lo, x_hi) == (0, b.row) && b.dst_stride == b.row {
                while k_end < k_hi && elems(k_end) == (0, b.row) {
                    k_end += 1;
                }
            }
            let dst = b.dst_start + k * b.dst_stride + x_lo;
            if let Some((first, end)) = run
                && (end != dst || out.len() as u64 >= self.opts.chunk_bytes)
            {
                self.put(job.out, job.base + first * osz, out)?;
                out.clear();
                run = None;
            }
            let t = Instant::now();
            let tile = Tile {
                b: &b,
                c0,
                rows: (k, k_end),
                elems: (x_lo, x_hi),
            };
            if src.dtype == job.to {
                tile.gather(read, isz as usize, out);
            } else {
                gathered.clear();
                tile.gather(read, isz as usize, gathered);
                convert::convert_into(src.dtype, job.to, gathered, out);
            }
            add_since(&self.stats.convert_ns, t);
            run = Some((run.map_or(dst, |r| r.0), dst + (k_end - k) * (x_hi - x_lo)));
            k = k_end;
        }
        if let Some((first, _)) = run {
            self.put(job.out, job.base + first * osz, out)?;
        }
        Ok(())
    }
}

/// The elements `x` of a row starting at source element `s`, `es` apart, with `c0 <= s + x·es <
/// c1`: a range, since the row runs forward through the source.
fn elems_in(s: u64, es: u64, row: u64, (c0, c1): (u64, u64)) -> (u64, u64) {
    if es == 0 {
        return if (c0..c1).contains(&s) {
            (0, row)
        } else {
            (0, 0)
        };
    }
    let lo = if c0 > s { (c0 - s).div_ceil(es) } else { 0 };
    let hi = (c1.saturating_sub(s)).div_ceil(es).min(row);
    (lo, hi)
}

/// Elements `elems` of rows `rows` of transposed block `b`, whose source from element `c0` is
/// in a buffer.
struct Tile<'a> {
    b: &'a Block,
    c0: u64,
    rows: (u64, u64),
    elems: (u64, u64),
}

impl Tile<'_> {
    /// Rows read together: their elements at one `x` are neighbours in the source (one cache
    /// line for 32 bf16 rows), so that each source line is fetched once rather than once per row.
    const ROWS: u64 = 32;

    /// Appends the tile's elements (`size` bytes each) from `buf`, row after row.
    fn gather(&self, buf: &[u8], size: usize, out: &mut Vec<u8>) {
        match size {
            1 => self.gather_n::<1>(buf, out),
            2 => self.gather_n::<2>(buf, out),
            4 => self.gather_n::<4>(buf, out),
            8 => self.gather_n::<8>(buf, out),
            _ => self.each(
                size,
                out.len(),
                |s, d, o: &mut Vec<u8>| o[d..d + size].copy_from_slice(&buf[s..s + size]),
                out,
            ),
        }
    }

    fn gather_n<const N: usize>(&self, buf: &[u8], out: &mut Vec<u8>) {
        self.each(
            N,
            out.len(),
            |s, d, o: &mut Vec<u8>| {
                let e: [u8; N] = buf[s..s + N].try_into().expect("N bytes");
                o[d..d + N].copy_from_slice(&e);
            },
            out,
        );
    }

    /// Calls `copy(source byte, destination byte, out)` for every element, tile by tile, with
    /// `out` grown to hold them after its first `start` bytes.
    fn each(
        &self,
        size: usize,
        start: usize,
        mut copy: impl FnMut(usize, usize, &mut Vec<u8>),
        out: &mut Vec<u8>,
    ) {
        let (b, (k0, k1), (x0, x1)) = (self.b, self.rows, self.elems);
        let w = (x1 - x0) as usize;
        out.resize(start + (k1 - k0) as usize * w * size, 0);
        let (s_row, d_row) = (b.src_stride as usize * size, w * size);
        let mut kt = k0;
        while kt < k1 {
            let n = (Self::ROWS.min(k1 - kt)) as usize;
            for x in x0..x1 {
                let s =
                    (b.src_start + kt * b.src_stride + x * b.src_elem_stride - self.c0) as usize;
                let d = start + ((kt - k0) as usize * w + (x - x0) as usize) * size;
                for t in 0..n {
                    copy(s * size + t * s_row, d + t * d_row, out);
                }
            }
            kt += n as u64;
        }
    }
}
