//! Strided rows of a block gathered into one buffer in a tight loop: at TP 8 an MXFP4 or INT4
//! row-parallel weight is a column slice of rows of 6 to 192 bytes (gpt-oss-120b's
//! `w2_weight`: 368,640 rows per layer and rank), so anything done per row (a clock read, a
//! call through the conversion match) costs more than the bytes.

use crate::layout::Block;

/// Appends to `out` the bytes of rows `k_lo..k_hi` of `b` that lie in source elements
/// `[c0, c1)`, whose bytes from element `c0` on are in `buf` (`isz` bytes an element), and
/// returns the destination element of the first byte appended (`None`: nothing in range).
/// Each row whose end is in range is followed by `pad` zero elements (its padding, written with
/// it). The rows and their padding must follow one another in the destination
/// (`b.dst_stride == b.row + pad`, or one row), so that what is appended is one destination
/// span; the source layout is not converted.
pub(super) fn rows(
    b: &Block,
    (k_lo, k_hi): (u64, u64),
    (c0, c1): (u64, u64),
    (isz, pad): (u64, u64),
    buf: &[u8],
    out: &mut Vec<u8>,
) -> Option<u64> {
    debug_assert!(b.rows <= 1 || b.dst_stride == b.row + pad);
    let pad_bytes = (pad * isz) as usize;
    let at = |e: u64| ((e - c0) * isz) as usize;
    let clip = |k: u64| {
        let s = b.src_start + k * b.src_stride;
        (s, s.max(c0), (s + b.row).min(c1))
    };
    // Row `k`'s bytes `[a, e)` of its `[s, s + row)`, and its padding when they end it.
    let cut = |k: u64, (s, a, e): (u64, u64, u64), first: &mut Option<u64>, out: &mut Vec<u8>| {
        if a < e {
            first.get_or_insert(b.dst_start + k * b.dst_stride + (a - s));
            out.extend_from_slice(&buf[at(a)..at(e)]);
            if e == s + b.row {
                out.resize(out.len() + pad_bytes, 0);
            }
        }
    };
    let mut first = None;
    let mut k = k_lo;
    // Rows cut by the chunk's edges (at most the first and the last) one by one; the whole
    // rows between them in one loop of plain copies.
    while k < k_hi {
        let (s, a, e) = clip(k);
        if a == s && e == s + b.row && b.src_stride >= b.row {
            break;
        }
        cut(k, (s, a, e), &mut first, out);
        k += 1;
    }
    // Whole rows from `k` on: every row that starts at or after `c0` and ends by `c1`.
    let whole = if k < k_hi && b.src_stride > 0 {
        let s = b.src_start + k * b.src_stride;
        let fit = (c1 - s - b.row) / b.src_stride + 1;
        fit.min(k_hi - k)
    } else {
        0
    };
    if whole > 0 {
        let s = b.src_start + k * b.src_stride;
        first.get_or_insert(b.dst_start + k * b.dst_stride);
        let (row, stride) = ((b.row * isz) as usize, (b.src_stride * isz) as usize);
        let from = at(s);
        let n = whole as usize;
        out.reserve(n * (row + pad_bytes));
        let src = &buf[from..from + (n - 1) * stride + row];
        if row == 1 && pad_bytes == 0 {
            out.extend(src.iter().step_by(stride));
        } else {
            for r in src.chunks(stride) {
                out.extend_from_slice(&r[..row]);
                out.resize(out.len() + pad_bytes, 0);
            }
        }
        k += whole;
    }
    // What is left after the whole rows: the row the chunk's end cuts, if any.
    while k < k_hi {
        cut(k, clip(k), &mut first, out);
        k += 1;
    }
    first
}

#[cfg(test)]
mod tests {
    use super::*;

    /// splitmix64, as the engine's other tests use.
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        fn range(&mut self, lo: u64, hi: u64) -> u64 {
            lo + self.next() % (hi - lo + 1)
        }
    }

    /// The per-row reference: every row clipped to `[c0, c1)`, appended in order, as the engine
    /// copied them before the gather, each row's `pad` zero elements after its last byte.
    fn per_row(
        b: &Block,
        c: (u64, u64),
        (isz, pad): (u64, u64),
        buf: &[u8],
    ) -> (Option<u64>, Vec<u8>) {
        let (mut first, mut out) = (None, Vec::new());
        for k in 0..b.rows {
            let s = b.src_start + k * b.src_stride;
            let (a, e) = (s.max(c.0), (s + b.row).min(c.1));
            if a < e {
                first.get_or_insert(b.dst_start + k * b.dst_stride + (a - s));
                out.extend_from_slice(&buf[((a - c.0) * isz) as usize..((e - c.0) * isz) as usize]);
                if e == s + b.row {
                    out.extend(std::iter::repeat_n(0, (pad * isz) as usize));
                }
            }
        }
        (first, out)
    }

    /// The rows of `b` that meet `[c0, c1)`, as the engine computes them (none when the block
    /// lies wholly before or after the chunk: the engine skips the job then).
    fn row_range(b: &Block, (c0, c1): (u64, u64)) -> (u64, u64) {
        let last_end = b.src_start + (b.rows - 1) * b.src_stride + b.row;
        if last_end <= c0 || b.src_start >= c1 {
            return (0, 0);
        }
        let stride = b.src_stride.max(1);
        let lo = if c0 < b.src_start + b.row {
            0
        } else {
            (c0 - b.src_start - b.row) / stride + 1
        };
        let hi = if b.rows == 1 {
            1
        } else {
            (c1 - b.src_start).div_ceil(stride).min(b.rows)
        };
        (lo, hi)
    }

    fn check(b: Block, isz: u64, chunk: u64, data: &[u8]) {
        check_padded(b, (isz, 0), chunk, data);
    }

    /// Every chunk's gather against the per-row reference; and, with padding, the chunks' spans
    /// put together: they write the block's destination `[dst_start, dst_start + rows ·
    /// dst_stride)` whole, each byte once, rows from the source and padding zero.
    fn check_padded(b: Block, (isz, pad): (u64, u64), chunk: u64, data: &[u8]) {
        let total = data.len() as u64 / isz;
        let span = ((b.rows * b.dst_stride) * isz) as usize;
        let mut dst: Vec<Option<u8>> = vec![None; span];
        let mut c0 = 0;
        while c0 < total {
            let c1 = (c0 + chunk).min(total);
            let buf = &data[(c0 * isz) as usize..(c1 * isz) as usize];
            let want = per_row(&b, (c0, c1), (isz, pad), buf);
            let mut got = vec![0xEE];
            let first = rows(
                &b,
                row_range(&b, (c0, c1)),
                (c0, c1),
                (isz, pad),
                buf,
                &mut got,
            );
            assert_eq!(got[0], 0xEE, "what was in the buffer stays");
            assert_eq!(
                (first, &got[1..]),
                (want.0, &want.1[..]),
                "{b:?} isz {isz} pad {pad} chunk [{c0}, {c1})"
            );
            if let Some(f) = first.filter(|_| pad > 0) {
                let at = ((f - b.dst_start) * isz) as usize;
                for (i, &x) in got[1..].iter().enumerate() {
                    assert_eq!(dst[at + i].replace(x), None, "{b:?} byte {} twice", at + i);
                }
            }
            c0 = c1;
        }
        if pad > 0 {
            for k in 0..b.rows {
                let (s, d) = (
                    (b.src_start + k * b.src_stride) * isz,
                    k * b.dst_stride * isz,
                );
                let (s, d, row) = (s as usize, d as usize, (b.row * isz) as usize);
                let want: Vec<Option<u8>> = (data[s..s + row].iter().copied())
                    .chain(std::iter::repeat_n(0, (pad * isz) as usize))
                    .map(Some)
                    .collect();
                assert_eq!(dst[d..d + want.len()], want[..], "{b:?} row {k}");
            }
        }
    }

    /// Rows with zero padding after each (MXFP4 `w2_weight` padded for vLLM's TRITON backend),
    /// in chunks of every size: one dense span in all, rows and zeros each written once.
    #[test]
    fn padded_rows_write_their_span_once() {
        let mut rng = Rng(0x9ad_9ad);
        for _ in 0..300 {
            let isz = [1, 2, 4][rng.range(0, 2) as usize];
            let rows_n = rng.range(1, 30);
            let width = rng.range(1, 24);
            let row = rng.range(1, width);
            let col = rng.range(0, width - row);
            let pad = rng.range(1, 9);
            let total = rows_n * width + rng.range(0, 5);
            let data: Vec<u8> = (0..total * isz).map(|_| rng.next() as u8).collect();
            let b = Block {
                rows: rows_n,
                row,
                src_start: col,
                src_stride: width,
                dst_start: rng.range(0, 100),
                dst_stride: row + pad,
                src_elem_stride: 1,
            };
            for chunk in [1, 2, 3, row, width, width + 1, rng.range(1, total), total] {
                check_padded(b, (isz, pad), chunk, &data);
            }
        }
    }

    /// Random column slices (1-byte rows to wide ones, 1 to 4-byte elements) read in chunks of
    /// every size from one element to the whole tensor: the gathered bytes and where they go
    /// are those of the per-row copy, so a wrong offset, a lost or a doubled row fails.
    #[test]
    fn gathered_rows_are_the_per_row_copy() {
        let mut rng = Rng(0x6a7e_4e25);
        for _ in 0..300 {
            let isz = [1, 2, 4][rng.range(0, 2) as usize];
            let rows_n = rng.range(1, 40);
            let width = rng.range(1, 24);
            let row = rng.range(1, width);
            let col = rng.range(0, width - row);
            let total = rows_n * width + rng.range(0, 5);
            let data: Vec<u8> = (0..total * isz).map(|_| rng.next() as u8).collect();
            let b = Block {
                rows: rows_n,
                row,
                src_start: col,
                src_stride: width,
                dst_start: rng.range(0, 100),
                dst_stride: row,
                src_elem_stride: 1,
            };
            for chunk in [1, 2, 3, row, width, width + 1, rng.range(1, total), total] {
                check(b, isz, chunk, &data);
            }
        }
    }

    /// A million 1-byte rows (MXFP4 scales at a high TP are this narrow) and 192-byte rows of
    /// gpt-oss-120b's `w2_weight` at TP 8, in chunks that cut rows and ones that do not.
    #[test]
    fn huge_row_counts_gather_exactly() {
        let mut rng = Rng(0x1e55_0b0b);
        for (rows_n, width, row, col, isz) in [
            (1_000_000u64, 3u64, 1u64, 2u64, 1u64),
            (20_000, 1440, 192, 1248, 1),
            (50_000, 90, 12, 84, 1),
            (30_000, 7, 2, 5, 2),
        ] {
            let total = rows_n * width;
            let data: Vec<u8> = (0..total * isz).map(|_| rng.next() as u8).collect();
            let b = Block {
                rows: rows_n,
                row,
                src_start: col,
                src_stride: width,
                dst_start: 5,
                dst_stride: row,
                src_elem_stride: 1,
            };
            for chunk in [total, 1 << 20, 1_000_003, 4096 * 3 + 1] {
                check(b, isz, chunk, &data);
            }
        }
    }
}
