//! The `expert_block_scale` kind: block scales of fused experts (vLLM 0.33
//! `fused_moe/routed_experts.py`, `fused_moe/oracle/fp8.py`), on the checkpoint's grid or on
//! the finer one vLLM refines it to.

use super::experts::check_shard;
use super::types::{
    Block, ExpertPart, PerExpert, PerExpertCopies, RankLayout, Shape, Slice, SlotKey, Strided, name,
};
use super::{Kind, Rank, Region, ShardId};

/// Block scales of fused experts.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertBlockScale {
    pub part: ExpertPart,
    pub experts: u64,
    /// `[intermediate, hidden]` of the experts.
    pub dims: [u64; 2],
    pub block: [u64; 2],
}

impl Kind for ExpertBlockScale {
    fn check(&self, r: Rank) -> Vec<String> {
        expert_block_check(self.experts, self.dims, self.block, r)
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        check_shard(self.part, shard)
            .map(|()| expert_block_source(self.part, self.dims, self.block).into())
    }

    /// Per expert only: a stacked tensor is the unquantized weight's alternative.
    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        (self.part.slots(self.experts), None)
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        expert_block_scale(self.part, self.experts, self.dims, self.block, r)
    }

    fn expert_count(&self) -> Option<u64> {
        Some(self.experts)
    }

    fn strided_per_expert(&self, r: Rank) -> Option<PerExpertCopies> {
        expert_block_refined(self.part, self.experts, self.dims, self.block, r)
    }

    fn strided(&self, r: Rank) -> Vec<Strided> {
        self.strided_per_expert(r)
            .map(each_expert)
            .unwrap_or_default()
    }
}

/// The copies of [`ExpertBlockScale::strided_per_expert`] for every expert of the rank, one
/// after the other, each from its own slot.
fn each_expert((each, pe): PerExpertCopies) -> Vec<Strided> {
    (0..pe.count)
        .flat_map(|j| {
            each.iter().map(move |((shard, _), b, region)| {
                let b = Block {
                    dst_start: b.dst_start + j * pe.dst_step,
                    ..*b
                };
                ((shard.clone(), Some(pe.first + j)), b, *region)
            })
        })
        .collect()
}

/// Block scales of fused experts: `w13` `[E_loc, 2·ceil(I_p/bn), ceil(H/bk)]` (w1 blocks, then
/// w3), `w2` `[E_loc, ceil(H/bn), ceil(I_p/bk)]`, each expert's checkpoint scale sliced by whole
/// blocks of this rank's intermediate part.
fn expert_block_scale(
    part: ExpertPart,
    experts: u64,
    [intermediate, hidden]: [u64; 2],
    [bn, bk]: [u64; 2],
    r: Rank,
) -> RankLayout {
    let share = r.experts(experts);
    let (ip, moe_rank) = (share.of(intermediate), share.rank);
    let local = share.local;
    let e_loc = local.end - local.start;
    if let Some(g) = refined_grid([intermediate, hidden], [bn, bk], r, experts) {
        // Filled by expert_block_refined's repeating copies.
        let shape = match part {
            ExpertPart::W13 => vec![e_loc, 2 * ip.div_ceil(g), hidden.div_ceil(g)],
            ExpertPart::W2 => vec![e_loc, hidden.div_ceil(g), ip.div_ceil(g)],
        };
        return RankLayout::new(shape, vec![], vec![]);
    }
    let first = Some(local.start);
    match part {
        ExpertPart::W13 => {
            let (rows_b, cols) = (ip.div_ceil(bn), hidden.div_ceil(bk));
            let slices = ["w1", "w3"]
                .iter()
                .enumerate()
                .map(|(h, s)| Slice {
                    slot: (name(s), first),
                    src_shape: vec![intermediate.div_ceil(bn), cols],
                    dim: 0,
                    from: moe_rank * rows_b,
                    to: (moe_rank + 1) * rows_b,
                    dst_shape: vec![2 * rows_b, cols],
                    dst_at: h as u64 * rows_b,
                    dst_base: 0,
                })
                .collect();
            let shape = vec![e_loc, 2 * rows_b, cols];
            RankLayout::per_expert(shape, local, 2 * rows_b * cols, slices)
        }
        ExpertPart::W2 => {
            let (rows, cols_b) = (hidden.div_ceil(bn), ip.div_ceil(bk));
            let slice = Slice {
                slot: (name("w2"), first),
                src_shape: vec![rows, intermediate.div_ceil(bk)],
                dim: 1,
                from: moe_rank * cols_b,
                to: (moe_rank + 1) * cols_b,
                dst_shape: vec![rows, cols_b],
                dst_at: 0,
                dst_base: 0,
            };
            RankLayout::per_expert(vec![e_loc, rows, cols_b], local, rows * cols_b, vec![slice])
        }
    }
}

/// The finer block vLLM gives expert scales when a rank's share of the intermediate size is not
/// whole blocks (`refine_fp8_moe_block_shape`, fused_moe/oracle/fp8.py:292–318: the gcd of both
/// block sides, the share and the hidden size, used when at least 32), or `None` when the
/// checkpoint's blocks fit as they are or cannot be refined.
fn refined_grid(
    [intermediate, hidden]: [u64; 2],
    [bn, bk]: [u64; 2],
    r: Rank,
    experts: u64,
) -> Option<u64> {
    let moe_tp = r.experts(experts).tp;
    let ip = intermediate / moe_tp;
    if ip.is_multiple_of(bn) && (moe_tp == 1 || ip.is_multiple_of(bk)) {
        return None;
    }
    let g = gcd(gcd(bn, bk), gcd(ip, hidden));
    (g >= 32).then_some(g)
}

/// vLLM's checks on fused expert block scales (`validate_fp8_block_shape_moe`), after the
/// refinement that lets most shares through.
fn expert_block_check(
    experts: u64,
    [intermediate, hidden]: [u64; 2],
    [bn, bk]: [u64; 2],
    r: Rank,
) -> Vec<String> {
    let moe_tp = r.experts(experts).tp;
    let ip = intermediate / moe_tp;
    if ip.is_multiple_of(bn) && (moe_tp == 1 || ip.is_multiple_of(bk)) {
        return vec![];
    }
    if let Some(g) = refined_grid([intermediate, hidden], [bn, bk], r, experts) {
        // The repeated checkpoint grid must line up with the refined one exactly, which it does
        // when the full sizes are whole blocks (as in every released checkpoint).
        if !intermediate.is_multiple_of(bn)
            || !hidden.is_multiple_of(bn)
            || !hidden.is_multiple_of(bk)
        {
            return vec![format!(
                "the experts' scales would be refined to a {g}×{g} grid, but the intermediate size {intermediate} or hidden size {hidden} is not whole {bn}×{bk} blocks, so the repeated checkpoint scales do not line up"
            )];
        }
        return vec![];
    }
    if !ip.is_multiple_of(bn) {
        vec![format!(
            "The output_size of gate's and up's weight = {ip} is not divisible by weight quantization block_n = {bn}."
        )]
    } else {
        vec![format!(
            "The input_size of down's weight = {ip} is not divisible by weight quantization block_k = {bk}."
        )]
    }
}

/// Expert block scales on vLLM's refined grid of `g`: the checkpoint scales upsampled by
/// `repeat_interleave` (each one repeated `bn/g` times down and `bk/g` across,
/// routed_experts.py:950–960), then this rank's part taken as usual. Copies with a source element
/// stride of 0 repeat each checkpoint scale across a row.
///
/// The rank's first expert's copies, and the step to the next expert's: every local expert
/// repeats them from its own checkpoint scale, so the pieces phase keeps them compact (a
/// MiniMax-M2 FP8 rank at TP 8 holds 256 experts in each of 62 layers). `None` when the grid is
/// not refined.
fn expert_block_refined(
    part: ExpertPart,
    experts: u64,
    [intermediate, hidden]: [u64; 2],
    [bn, bk]: [u64; 2],
    r: Rank,
) -> Option<PerExpertCopies> {
    let g = refined_grid([intermediate, hidden], [bn, bk], r, experts)?;
    let share = r.experts(experts);
    let (ip, moe_rank) = (share.of(intermediate), share.rank);
    let local = share.local;
    let (fn_, fk) = (bn / g, bk / g);
    let first = Some(local.start);
    // `rows` rows of `len` copies of one checkpoint scale each, `src_stride` apart in the
    // checkpoint scale and `dst_stride` apart in the rank's tensor.
    let repeat = |src_start, rows, src_stride, len, dst_start, dst_stride| Block {
        rows,
        row: len,
        src_start,
        src_stride,
        dst_start,
        dst_stride,
        src_elem_stride: 0,
    };
    let region = |first: u64, rows: u64| Region {
        range: Some((0, first, first + rows)),
        ..Region::ALL
    };
    let mut each = Vec::new();
    let dst_step = match part {
        ExpertPart::W13 => {
            // [E, 2·I_p/g, H/g]: w1's rows, then w3's; a row repeats each of the checkpoint row's
            // H/bk scales bk/g times.
            let (rows, cols, src_cols) = (ip.div_ceil(g), hidden.div_ceil(g), hidden.div_ceil(bk));
            for (h, s) in ["w1", "w3"].iter().enumerate() {
                for i in 0..rows {
                    let src_row = (moe_rank * rows + i) / fn_;
                    let dst = (h as u64 * rows + i) * cols;
                    let b = repeat(src_row * src_cols, src_cols, 1, fk, dst, fk);
                    each.push(((name(s), first), b, region(src_row, 1)));
                }
            }
            2 * rows * cols
        }
        ExpertPart::W2 => {
            // [E, H/g, I_p/g]: this rank's columns of the upsampled grid; a run of them may start
            // or end inside a checkpoint scale's repeats. Destination row i reads checkpoint row
            // i / (bn/g): the rows of one residue modulo bn/g step through the checkpoint rows
            // one by one, so each (residue, run) is one block down all of them.
            let (rows, cols, src_cols) = (
                hidden.div_ceil(g),
                ip.div_ceil(g),
                intermediate.div_ceil(bk),
            );
            for a in 0..fn_.min(rows) {
                let count = (rows - a).div_ceil(fn_);
                let mut c = 0;
                while c < cols {
                    let global = moe_rank * cols + c;
                    let (src_col, len) = (global / fk, (fk - global % fk).min(cols - c));
                    let b = repeat(src_col, count, src_cols, len, a * cols + c, fn_ * cols);
                    each.push(((name("w2"), first), b, region(0, count)));
                    c += len;
                }
            }
            rows * cols
        }
    };
    let count = local.end - local.start;
    Some((
        each,
        PerExpert {
            first: local.start,
            count,
            dst_step,
        },
    ))
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Shapes checkpoint expert block scales must have.
fn expert_block_source(
    part: ExpertPart,
    [intermediate, hidden]: [u64; 2],
    [bn, bk]: [u64; 2],
) -> Vec<u64> {
    match part {
        ExpertPart::W13 => vec![intermediate.div_ceil(bn), hidden.div_ceil(bk)],
        ExpertPart::W2 => vec![hidden.div_ceil(bn), intermediate.div_ceil(bk)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::types::SlotKey;

    fn rank(tp: u64, rank: u64) -> Rank {
        Rank {
            tp,
            rank,
            ep: false,
        }
    }

    /// Applies `blocks` to a source whose element k holds k, into a destination of `n` elements.
    fn apply(blocks: &[(SlotKey, Block, Region)], n: u64) -> Vec<i64> {
        let mut out = vec![-1i64; n as usize];
        for (_, b, _) in blocks {
            for k in 0..b.rows {
                for x in 0..b.row {
                    let src = b.src_start + k * b.src_stride + x * b.src_elem_stride;
                    let dst = b.dst_start + k * b.dst_stride + x;
                    assert_eq!(out[dst as usize], -1, "element {dst} written twice");
                    out[dst as usize] = src as i64;
                }
            }
        }
        out
    }

    fn expand(c: Option<PerExpertCopies>) -> Vec<(SlotKey, Block, Region)> {
        each_expert(c.expect("a refined grid"))
    }

    /// vllm-spec §6.3: Qwen3-30B-A3B-FP8 at TP 8 has I_p = 96, refined to 32×32 (×4): w13 scales
    /// [128, 6, 64], w2 [128, 64, 3], each element the checkpoint scale upsampled by
    /// repeat_interleave then sliced for the rank.
    #[test]
    fn qwen3_30b_moe_at_tp8_gets_vllms_refined_grid() {
        let (e, i, h, b) = (128, 768, 2048, [128, 128]);
        assert!(expert_block_check(e, [i, h], b, rank(8, 0)).is_empty());
        for rk in [0, 3, 7] {
            let r = rank(8, rk);
            let w13 = expert_block_scale(ExpertPart::W13, e, [i, h], b, r);
            let w2 = expert_block_scale(ExpertPart::W2, e, [i, h], b, r);
            assert_eq!(
                (w13.shape.clone(), w2.shape.clone()),
                (vec![128, 6, 64], vec![128, 64, 3])
            );
            // Expert 5's w3 half and its w2 columns, against repeat_interleave by hand: the
            // checkpoint scale is [6, 16] for w1/w3 and [16, 6] for w2.
            let got = apply(
                &expand(expert_block_refined(ExpertPart::W13, e, [i, h], b, r)),
                128 * 6 * 64,
            );
            for row in 0..3 {
                for c in 0..64 {
                    let want = ((rk * 3 + row) / 4) * 16 + c / 4;
                    assert_eq!(got[((5 * 6 + 3 + row) * 64 + c) as usize], want as i64);
                }
            }
            let got = apply(
                &expand(expert_block_refined(ExpertPart::W2, e, [i, h], b, r)),
                128 * 64 * 3,
            );
            for row in 0..64 {
                for c in 0..3 {
                    let want = (row / 4) * 6 + (rk * 3 + c) / 4;
                    assert_eq!(got[((5 * 64 + row) * 3 + c) as usize], want as i64);
                }
            }
            assert!(got.iter().all(|&x| x >= 0), "every element written");
        }
        // 768 / 4 = 192 refines to 64; 768 / 2 = 384 is three whole blocks.
        assert_eq!(refined_grid([i, h], b, rank(4, 0), e), Some(64));
        assert_eq!(refined_grid([i, h], b, rank(2, 0), e), None);
        // A grid vLLM cannot refine (gcd < 32) gets vLLM's own error.
        let msgs = expert_block_check(8, [48, 128], [32, 32], rank(2, 0));
        assert_eq!(
            msgs,
            vec![
                "The output_size of gate's and up's weight = 24 is not divisible by weight quantization block_n = 32."
            ]
        );
    }
}
