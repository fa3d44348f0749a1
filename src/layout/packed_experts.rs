//! The `packed_experts` kind: fused experts stored input-major, as GPTQ's and AWQ's MoE methods create them
//! (`is_transposed=True`, vLLM 0.33 `layers/fused_moe/routed_experts.py:766–803`): each expert's
//! `w13` tensor `[rows, 2·cols_r]` holds gate then up with the intermediate on the **last** dim,
//! and `w2` `[rows_r, cols]` has it on the first. With expert parallelism each rank holds whole
//! experts ([`Rank::experts`]).

use super::types::{ExpertPart, RankLayout, Shape, Slice, SlotKey, name, not_divisible};
use super::{Kind, Rank, ShardId};

/// Fused experts stored input-major (GPTQ's and AWQ's MoE parameters): one expert's source (one
/// shard) is `dims`; `w13` holds gate then up on its last dim, `w2` is split on its first when
/// `split` (else whole: channel scales, biases).
#[derive(Debug, Clone, PartialEq)]
pub struct PackedExperts {
    pub part: ExpertPart,
    pub experts: u64,
    pub dims: Vec<u64>,
    pub split: bool,
}

impl Kind for PackedExperts {
    fn check(&self, r: Rank) -> Vec<String> {
        if r.ep {
            return vec![];
        }
        split_size(self.part, &self.dims, self.split)
            .and_then(|n| not_divisible("expert intermediate size (packed or grouped)", n, r.tp))
            .into_iter()
            .collect()
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        packed_expected(self.part, &self.dims, shard)
    }

    /// Per expert only: a stacked tensor is the unquantized weight's alternative.
    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        (self.part.slots(self.experts), None)
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        packed_experts(self.part, self.experts, &self.dims, self.split, r)
    }

    fn expert_count(&self) -> Option<u64> {
        Some(self.experts)
    }

    #[cfg(test)]
    fn samples() -> Vec<super::Geometry> {
        [
            (ExpertPart::W13, vec![2, 16], true),
            (ExpertPart::W2, vec![16, 3], true),
            (ExpertPart::W2, vec![6], false),
        ]
        .map(|(part, dims, split)| {
            PackedExperts {
                part,
                experts: 5,
                dims,
                split,
            }
            .into()
        })
        .to_vec()
    }
}

/// The size split over the ranks of one expert's source `dims` (its last for `w13`, its first
/// for a split `w2`), if any.
fn split_size(part: ExpertPart, dims: &[u64], split: bool) -> Option<u64> {
    match part {
        ExpertPart::W13 => dims.last().copied(),
        ExpertPart::W2 if split => dims.first().copied(),
        ExpertPart::W2 => None,
    }
}

/// The checkpoint shape of one expert's shard: `dims`, for the shard ids the part takes.
fn packed_expected(
    part: ExpertPart,
    dims: &[u64],
    shard: Option<&ShardId>,
) -> Result<Shape, String> {
    match (part, shard.map(ShardId::text).as_deref()) {
        (ExpertPart::W13, Some("w1" | "w3")) | (ExpertPart::W2, Some("w2")) => {
            Ok(Shape::from_slice(dims))
        }
        (_, s) => Err(format!(
            "shard_id must be ['w1','w2','w3'] matching the parameter, got {}",
            s.unwrap_or("none")
        )),
    }
}

/// Rank `r`'s tensor of an input-major expert parameter whose per-expert source (one shard,
/// gate, up or down) is `dims`: `w13` takes columns `[r·c/tp, (r+1)·c/tp)` of gate and of up on
/// the last dim; `w2` takes rows `[r·b/tp, …)` when `split`, else all of it (channel scales and
/// biases vLLM copies whole).
fn packed_experts(
    part: ExpertPart,
    experts: u64,
    dims: &[u64],
    split: bool,
    r: Rank,
) -> RankLayout {
    let share = r.experts(experts);
    let (tp, rank, e_loc) = (share.tp, share.rank, share.count());
    let local = share.local;
    let first = Some(local.start);
    let last = dims.len() - 1;
    let per: u64;
    let slices = match part {
        ExpertPart::W13 => {
            let c = dims[last] / tp;
            let mut dst = dims.to_vec();
            dst[last] = 2 * c;
            per = dst.iter().product();
            ["w1", "w3"]
                .iter()
                .enumerate()
                .map(|(h, s)| Slice {
                    slot: (name(s), first),
                    src_shape: dims.to_vec(),
                    dim: last,
                    from: rank * c,
                    to: (rank + 1) * c,
                    dst_shape: dst.clone(),
                    dst_at: h as u64 * c,
                    dst_base: 0,
                })
                .collect()
        }
        ExpertPart::W2 => {
            let (b, from) = if split {
                (dims[0] / tp, rank * (dims[0] / tp))
            } else {
                (dims[0], 0)
            };
            let mut dst = dims.to_vec();
            dst[0] = b;
            per = dst.iter().product();
            vec![Slice {
                slot: (name("w2"), first),
                src_shape: dims.to_vec(),
                dim: 0,
                from,
                to: from + b,
                dst_shape: dst,
                dst_at: 0,
                dst_base: 0,
            }]
        }
    };
    let one = slices[0].dst_shape.clone();
    let shape = std::iter::once(e_loc).chain(one).collect();
    RankLayout::per_expert(shape, local, per, slices)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Geometry;

    /// GPTQ's `w13_qweight [E, H/8, 2·I_r]` at TP 2 and `w2_qzeros [E, I_r/g, H/8]`, and whole
    /// experts with EP.
    #[test]
    fn the_intermediate_is_split_on_the_last_dim_of_w13_and_the_first_of_w2() {
        let w13 = Geometry::PackedExperts(PackedExperts {
            part: ExpertPart::W13,
            experts: 3,
            dims: vec![16, 64],
            split: true,
        });
        let r = |rank, ep| Rank { tp: 2, rank, ep };
        let l = w13.rank_layout(r(1, false), false);
        assert_eq!(l.shape, vec![3, 16, 64]);
        let s: Vec<(u64, u64, u64)> = l.slices.iter().map(|s| (s.from, s.to, s.dst_at)).collect();
        assert_eq!(s, vec![(32, 64, 0), (32, 64, 32)]);
        let w2 = Geometry::PackedExperts(PackedExperts {
            part: ExpertPart::W2,
            experts: 3,
            dims: vec![4, 16],
            split: true,
        });
        assert_eq!(w2.rank_layout(r(1, false), false).shape, vec![3, 2, 16]);
        let ep = w2.rank_layout(r(1, true), false);
        assert_eq!(ep.shape, vec![1, 4, 16]);
        assert_eq!(ep.per_expert.map(|p| p.first), Some(2));
        assert_eq!(
            w13.expected_source(Some(&name("w3").unwrap()))
                .unwrap()
                .to_vec(),
            vec![16, 64]
        );
    }
}
