//! Reductions: destination elements computed from source elements, on the host, after the
//! copies. Two kinds:
//! - the maximum of a group of consecutive source elements — the `attn_head` KV cache's q
//!   scales, vLLM's `torch.amax(q.view(-1, g), dim=1)` before the copy into the F32 parameter
//!   (compressed_tensors.py:1203–1210), one value per kv head;
//! - an FP8 E4M3 weight dequantized with its scale (a second source) — DeepSeek-V3.2's FP8
//!   `indexer.wk`, vLLM's `scaled_dequantize(w, s, group_shape, out_dtype=torch.bfloat16)`
//!   (deepseek_v2.py:857–913, quant_utils.py:494–505): `(w.float() * s.float()).to(bfloat16)`,
//!   each scale broadcast over a `[out / s0, in / s1]` block (a 1-D scale: one per row), then
//!   `param.copy_` into the destination dtype;
//! - `-exp(x)` of each element — Mamba2's `A`, which vLLM's composed loader computes from the
//!   checkpoint's `A_log` after the copy into the F32 parameter (`-torch.exp(param.float())`,
//!   mamba_mixer2.py:492–495, weight_utils.py:1610–1620) on the device the model is built on.
//!   No writer off that device can match its `expf` bit for bit (torch's CPU exp differs from a
//!   correctly rounded one in about 1 % of inputs, CUDA's is not correctly rounded either), so
//!   wload writes the correctly rounded value, within 1 ulp of any of them; vLLM's sharded
//!   loader then serves exactly the file's value (vllm-spec §13.4).

use super::copy::Run;
use super::jobs::Reduce;
use super::source::{AlignedBuf, SourceFile};
use super::{ExecError, convert};
use crate::dtype::Dtype;
use crate::plan::SourceTensor;

impl Run<'_> {
    /// Reads, reduces and puts every reduction.
    pub(super) fn reduces(
        &self,
        sources: &[SourceTensor],
        files: &[Option<SourceFile>],
        list: &[Reduce],
    ) -> Result<(), ExecError> {
        let mut buf = AlignedBuf::default();
        let file_of = |src: &SourceTensor| {
            files[src.file_index]
                .as_ref()
                .expect("opened with the sources")
        };
        for r in list {
            self.stopped()?;
            let src = &sources[r.source];
            let grid = match r.dequant {
                Some(s) => {
                    let scale = &sources[s];
                    let len = scale.shape.iter().product::<u64>() * (scale.dtype.bits() / 8);
                    let bytes = self.read(scale, file_of(scale), &mut buf, scale.offset, len)?;
                    Some(ScaleGrid::new(&src.shape, scale, bytes))
                }
                None => None,
            };
            let (isz, osz) = (src.dtype.bits() / 8, r.to.bits() / 8);
            let group = if grid.is_some() || r.neg_exp {
                1
            } else {
                r.max_of
            };
            for k in 0..r.b.rows {
                let first = r.b.src_start + k * r.b.src_stride;
                let start = src.offset + first * isz;
                let bytes = self.read(src, file_of(src), &mut buf, start, r.b.row * group * isz)?;
                let out = match &grid {
                    Some(g) => g.dequantize(bytes, first, r.to),
                    None if r.neg_exp => neg_exp(src.dtype, r.to, bytes),
                    None => group_max(src.dtype, r.to, bytes, r.max_of),
                };
                let at = r.base + (r.b.dst_start + k * r.b.dst_stride) * osz;
                self.put(r.out, at, &out)?;
            }
        }
        Ok(())
    }
}

/// A weight's scales as `scaled_dequantize` broadcasts them: F32 values, each over a block of
/// `rows × cols` elements of the `[out, inner]` weight, `per_row` blocks to a row of blocks.
pub(super) struct ScaleGrid {
    inner: u64,
    rows: u64,
    cols: u64,
    per_row: u64,
    values: Vec<f32>,
}

impl ScaleGrid {
    /// The grid of `scale` (`bytes`: all its data) over a weight of `shape`, the group shape
    /// inferred as vLLM infers it (deepseek_v2.py:892–901): a 1-D scale is one per row, a 2-D
    /// one of `[s0, s1]` covers `[out / s0, in / s1]` blocks. The planner checked the division.
    pub(super) fn new(shape: &[u64], scale: &SourceTensor, bytes: &[u8]) -> ScaleGrid {
        let (out, inner) = (shape[0], shape[1..].iter().product::<u64>());
        let (s0, s1) = match scale.shape[..] {
            [s0] => (s0, 1),
            [s0, s1] => (s0, s1),
            _ => unreachable!("the planner takes 1-D and 2-D scales only"),
        };
        let mut wide = Vec::new();
        convert::convert_into(scale.dtype, Dtype::F32, bytes, &mut wide);
        let values = (wide.chunks_exact(4))
            .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
            .collect();
        ScaleGrid {
            inner,
            rows: out / s0.max(1),
            cols: inner / s1.max(1),
            per_row: s1,
            values,
        }
    }

    /// The E4M3 elements `w`, the first at flat index `first` of the weight, times their scales
    /// in F32, rounded to BF16 as `.to(torch.bfloat16)` rounds a tensor on the CPU (nearest
    /// even, a NaN → 0xFFFF), then converted to `to`.
    pub(super) fn dequantize(&self, w: &[u8], first: u64, to: Dtype) -> Vec<u8> {
        let mut bf = Vec::with_capacity(w.len() * 2);
        for (e, &b) in (first..).zip(w) {
            let (row, col) = (e / self.inner, e % self.inner);
            let s = self.values[((row / self.rows) * self.per_row + col / self.cols) as usize];
            let x = convert::e4m3_to_f32(b) * s;
            bf.extend_from_slice(&convert::f32_to_bf16_vectorized(x).to_le_bytes());
        }
        let mut out = Vec::new();
        convert::convert_into(Dtype::Bf16, to, &bf, &mut out);
        out
    }
}

/// `-exp(x)` of each element of `src` (dtype `from`) in dtype `to`: the element widened to F32
/// first (vLLM copies it into the F32 parameter before the exp), its exp correctly rounded to F32
/// ([`expf`]), negated (exact), then converted to `to`.
pub(super) fn neg_exp(from: Dtype, to: Dtype, src: &[u8]) -> Vec<u8> {
    let mut wide = Vec::new();
    convert::convert_into(from, Dtype::F32, src, &mut wide);
    let vals: Vec<u8> = (wide.chunks_exact(4))
        .map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes")))
        .flat_map(|x| (-expf(x)).to_le_bytes())
        .collect();
    let mut out = Vec::new();
    convert::convert_into(Dtype::F32, to, &vals, &mut out);
    out
}

/// `e^x` correctly rounded to F32: the F64 exponential (the platform's `exp`, under 1 ulp of
/// F64), rounded to nearest even. The double rounding can only go wrong where the exact value lies
/// within a few F64 ulps (about 2^-52 relative) of a point halfway between two F32 values: a value
/// of exp is never exactly there, and that close for about one F32 input in 2^27. Hard cases are
/// therefore not evaluated at higher precision: over every F32 with |x| in [2^-4, 4) and every
/// BF16 in [-8, 8] (100 million inputs, Mamba2's A_log = log(1..16) among them) glibc's `exp`
/// comes within 4 F64 ulps of a midpoint for one input only, -2^-25, whose exact exp is 2^-51
/// past it and rounds right. Overflow gives infinity, as `expf` does.
pub(super) fn expf(x: f32) -> f32 {
    f64::from(x).exp() as f32
}

/// The maximum of each `group` consecutive elements of `src` (dtype `from`), in dtype `to`. A
/// NaN in a group makes its maximum NaN, as `torch.amax` propagates it; the maximum of
/// representable values is exact, so only the conversion to `to` rounds.
pub(super) fn group_max(from: Dtype, to: Dtype, src: &[u8], group: u64) -> Vec<u8> {
    let mut wide = Vec::new();
    convert::convert_into(from, Dtype::F64, src, &mut wide);
    let vals: Vec<f64> = (wide.chunks_exact(8))
        .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")))
        .collect();
    let maxes: Vec<u8> = (vals.chunks(group.max(1) as usize))
        .map(|g| {
            g.iter().copied().fold(f64::NEG_INFINITY, |m, x| {
                if m.is_nan() || x.is_nan() {
                    f64::NAN
                } else {
                    m.max(x)
                }
            })
        })
        .flat_map(f64::to_le_bytes)
        .collect();
    let mut out = Vec::new();
    convert::convert_into(Dtype::F64, to, &maxes, &mut out);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::convert::f32_to_bf16;

    fn bf16s(v: &[f32]) -> Vec<u8> {
        v.iter()
            .flat_map(|x| f32_to_bf16(*x).to_le_bytes())
            .collect()
    }

    fn f32s(b: &[u8]) -> Vec<f32> {
        (b.chunks_exact(4))
            .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    #[test]
    fn each_group_becomes_its_maximum() {
        let src = bf16s(&[0.5, -1.0, 0.25, 2.0, -3.0, -0.125, 0.0, -7.0]);
        let got = f32s(&group_max(Dtype::Bf16, Dtype::F32, &src, 4));
        assert_eq!(got, vec![2.0, 0.0]);
        let got = f32s(&group_max(Dtype::Bf16, Dtype::F32, &src, 2));
        assert_eq!(got, vec![0.5, 2.0, -0.125, 0.0]);
        let got = f32s(&group_max(Dtype::Bf16, Dtype::F32, &src, 1));
        assert_eq!(got.len(), 8);
    }

    /// E4M3 by bits: a normal code's exponent and mantissa moved into an f32's fields, a
    /// subnormal `m · 2^-9` (independent of `convert::e4m3_to_f32`).
    fn e4m3_by_bits(b: u8) -> f32 {
        let (sign, e, m) = (
            u32::from(b >> 7),
            u32::from((b >> 3) & 15),
            u32::from(b & 7),
        );
        if e == 15 && m == 7 {
            return f32::NAN;
        }
        let mag = if e == 0 {
            m as f32 / 512.0
        } else {
            f32::from_bits(((e + 120) << 23) | (m << 20))
        };
        if sign == 1 { -mag } else { mag }
    }

    fn scale_tensor(dtype: Dtype, shape: &[u64]) -> SourceTensor {
        SourceTensor {
            name: "s".into(),
            file: "f".into(),
            file_index: 0,
            offset: 0,
            dtype,
            shape: shape.into(),
        }
    }

    fn bf16_values(b: &[u8]) -> Vec<u16> {
        (b.chunks_exact(2))
            .map(|c| u16::from_le_bytes([c[0], c[1]]))
            .collect()
    }

    #[test]
    fn every_e4m3_code_times_each_scale_rounds_to_bf16_as_torch() {
        let codes: Vec<u8> = (0..=255).collect();
        for scale in [1.0f32, 0.5, 3.0, 2f32.powi(-10), 1e-3, 448.0, 1.0 / 3.0] {
            // One scale for the whole [16, 16] weight: a [1, 1] grid.
            let s = scale_tensor(Dtype::F32, &[1, 1]);
            let grid = ScaleGrid::new(&[16, 16], &s, &scale.to_le_bytes());
            let got = bf16_values(&grid.dequantize(&codes, 0, Dtype::Bf16));
            for (&c, &g) in codes.iter().zip(&got) {
                let x = e4m3_by_bits(c) * scale;
                let want = if x.is_nan() { 0xFFFF } else { f32_to_bf16(x) };
                assert_eq!(g, want, "code {c:#04x} × {scale}");
            }
        }
        // The codes' values themselves: exact, signed zero, the extremes, NaN.
        let one = ScaleGrid::new(
            &[16, 16],
            &scale_tensor(Dtype::F32, &[1, 1]),
            &1f32.to_le_bytes(),
        );
        let got = bf16_values(&one.dequantize(
            &[0x00, 0x80, 0x01, 0x08, 0x38, 0x7E, 0xFE, 0x7F, 0xFF],
            0,
            Dtype::Bf16,
        ));
        assert_eq!(
            got,
            [
                0x0000, 0x8000, 0x3B00, 0x3C80, 0x3F80, 0x43E0, 0xC3E0, 0xFFFF, 0xFFFF
            ]
        );
    }

    #[test]
    fn products_on_a_tie_round_to_even() {
        // 1.0 × (1 + 2^-8): halfway between bf16 1.0 (even) and 1 + 2^-7 → 1.0;
        // 1.0 × (1 + 3·2^-8): halfway between 1 + 2^-7 (odd) and 1 + 2^-6 → 1 + 2^-6.
        for (scale, want) in [
            (1.0 + 2f32.powi(-8), 0x3F80),
            (1.0 + 3.0 * 2f32.powi(-8), 0x3F82),
        ] {
            let grid = ScaleGrid::new(
                &[1, 1],
                &scale_tensor(Dtype::F32, &[1]),
                &scale.to_le_bytes(),
            );
            assert_eq!(
                bf16_values(&grid.dequantize(&[0x38], 0, Dtype::Bf16)),
                [want]
            );
        }
    }

    #[test]
    fn scales_broadcast_over_their_blocks() {
        // A [4, 4] weight of 1.0 (0x38); a [2, 2] scale grid: 2×2 blocks.
        let s: Vec<u8> = [1.0f32, 2.0, 4.0, 8.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let grid = ScaleGrid::new(&[4, 4], &scale_tensor(Dtype::F32, &[2, 2]), &s);
        let got = f32s(&grid.dequantize(&[0x38; 16], 0, Dtype::F32));
        let want = [
            1., 1., 2., 2., 1., 1., 2., 2., 4., 4., 8., 8., 4., 4., 8., 8.,
        ];
        assert_eq!(got, want);
        // Rows 2..4 alone, from flat element 8: the same values.
        assert_eq!(f32s(&grid.dequantize(&[0x38; 8], 8, Dtype::F32)), want[8..]);
        // A 1-D scale: one per row; E8M0 (U8) 2^(x-127) (0: the subnormal 2^-127), 255 NaN.
        let grid = ScaleGrid::new(&[4, 2], &scale_tensor(Dtype::U8, &[4]), &[127, 128, 0, 255]);
        let got = bf16_values(&grid.dequantize(&[0x38; 8], 0, Dtype::Bf16));
        assert_eq!(
            got,
            [
                0x3F80, 0x3F80, 0x4000, 0x4000, 0x0040, 0x0040, 0xFFFF, 0xFFFF
            ]
        );
    }

    /// Correctly rounded values, by bits: e = 0x402DF854 (2.71828175), e^-1 = 0x3EBC5AB2, the
    /// one near-midpoint input of the measured ranges (-2^-25: 1 - 2^-25 + 2^-51, so 1.0),
    /// overflow and the ends.
    #[test]
    fn neg_exp_is_correctly_rounded() {
        let cases: [(f32, u32); 6] = [
            (0.0, 0xBF80_0000),
            (1.0, 0xC02D_F854),
            (-1.0, 0xBEBC_5AB2),
            (-(2f32.powi(-25)), 0xBF80_0000),
            (89.0, 0xFF80_0000),
            (f32::NEG_INFINITY, 0x8000_0000),
        ];
        let src: Vec<u8> = cases.iter().flat_map(|c| c.0.to_le_bytes()).collect();
        let got = f32s(&neg_exp(Dtype::F32, Dtype::F32, &src));
        for ((x, want), g) in cases.iter().zip(got) {
            assert_eq!(g.to_bits(), *want, "-exp({x})");
        }
        // A BF16 source is widened first: log(2) in BF16 is 0.69140625, e^that 1.9964...
        let got = f32s(&neg_exp(
            Dtype::Bf16,
            Dtype::F32,
            &bf16s(&[std::f32::consts::LN_2]),
        ));
        assert_eq!(got, [-(f64::from(0.691_406_25f32).exp() as f32)]);
    }

    #[test]
    fn a_nan_in_a_group_is_its_maximum() {
        let src = bf16s(&[1.0, f32::NAN, 0.5, 0.25]);
        let got = f32s(&group_max(Dtype::Bf16, Dtype::F32, &src, 2));
        assert!(got[0].is_nan());
        assert_eq!(got[1], 0.5);
    }
}
