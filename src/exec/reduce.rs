//! Reductions: destination elements that are each the maximum of a group of consecutive source
//! elements — the `attn_head` KV cache's q scales, vLLM's `torch.amax(q.view(-1, g), dim=1)`
//! before the copy into the F32 parameter (compressed_tensors.py:1203–1210). They are one value
//! per kv head, so each is read whole and reduced on the host, after the copies.

use super::copy::Run;
use super::source::{AlignedBuf, SourceFile};
use super::{ExecError, convert};
use crate::dtype::Dtype;
use crate::plan::SourceTensor;
use crate::plan::layout::Block;

/// One reducing piece, placed: output `out`, tensor data at byte `base`, in dtype `to`; each
/// of the block's `row` destination elements is the maximum of `max_of` source elements.
pub(super) struct Reduce {
    pub(super) out: usize,
    pub(super) base: u64,
    pub(super) to: Dtype,
    pub(super) source: usize,
    pub(super) b: Block,
    pub(super) max_of: u64,
}

impl Run<'_> {
    /// Reads, reduces and puts every reduction.
    pub(super) fn reduces(
        &self,
        sources: &[SourceTensor],
        files: &[Option<SourceFile>],
        list: &[Reduce],
    ) -> Result<(), ExecError> {
        let mut buf = AlignedBuf::default();
        for r in list {
            self.stopped()?;
            let src = &sources[r.source];
            let file = files[src.file_index]
                .as_ref()
                .expect("opened with the sources");
            let (isz, osz) = (src.dtype.bits() / 8, r.to.bits() / 8);
            for k in 0..r.b.rows {
                let start = src.offset + (r.b.src_start + k * r.b.src_stride) * isz;
                let bytes = self.read(src, file, &mut buf, start, r.b.row * r.max_of * isz)?;
                let out = group_max(src.dtype, r.to, bytes, r.max_of);
                let at = r.base + (r.b.dst_start + k * r.b.dst_stride) * osz;
                self.put(r.out, at, &out)?;
            }
        }
        Ok(())
    }
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

    #[test]
    fn a_nan_in_a_group_is_its_maximum() {
        let src = bf16s(&[1.0, f32::NAN, 0.5, 0.25]);
        let got = f32s(&group_max(Dtype::Bf16, Dtype::F32, &src, 2));
        assert!(got[0].is_nan());
        assert_eq!(got[1], 0.5);
    }
}
