//! The `transposed_experts` kind: fused experts stored transposed in one tensor a layer, gate
//! and up in halves (Llama 4, vLLM 0.33 `models/llama4.py` `load_moe_expert_weights`).

use serde::Deserialize;

use super::types::{Block, ExpertPart, RankLayout, Shape, Strided, not_divisible, unstacked};
use super::{Dim, Eval, Kind, Rank, Region, ShardId, size};

/// Fused experts from one transposed tensor a layer: `w13_weight` [E_loc, 2·I_p, H] from
/// `gate_up_proj` [E, H, 2I] (gate the first I columns, up the last), `w2_weight` [E_loc, H, I_p]
/// from `down_proj` [E, I, H]; split by tp, or by expert with expert parallelism (whole experts
/// placed linearly: the MoE runner's `expert_map`, which llama4.py indexes the stacked tensor
/// with).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TransposedExperts<D = u64> {
    pub part: ExpertPart,
    pub experts: D,
    pub intermediate: D,
    pub hidden: D,
}

impl<D> TransposedExperts<D> {
    pub(super) fn try_map<E, X>(&self, f: &mut Eval<D, E, X>) -> Result<TransposedExperts<E>, X> {
        Ok(TransposedExperts {
            part: self.part,
            experts: f(&self.experts, Dim::Experts)?,
            intermediate: f(&self.intermediate, Dim::Size)?,
            hidden: f(&self.hidden, Dim::Size)?,
        })
    }
}

impl Kind for TransposedExperts {
    fn check(&self, r: Rank) -> Vec<String> {
        if r.ep {
            return vec![];
        }
        not_divisible("expert intermediate size", self.intermediate, r.tp)
            .into_iter()
            .collect()
    }

    /// `gate_up_proj` `[E, H, 2I]` or `down_proj` `[E, I, H]`.
    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        let (e, i, h) = (self.experts, self.intermediate, self.hidden);
        let shape = match self.part {
            ExpertPart::W13 => [e, h, 2 * i],
            ExpertPart::W2 => [e, i, h],
        };
        unstacked(&shape, shard)
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        transposed_experts(self.part, self.experts, self.intermediate, self.hidden, r)
    }

    fn strided(&self, r: Rank) -> Vec<Strided> {
        transposed_copies(self.part, self.experts, self.intermediate, self.hidden, r)
            .into_iter()
            .map(|(b, region)| ((None, None), b, region))
            .collect()
    }

    fn fits(&self) -> Result<(), Vec<u64>> {
        size::experts(self.experts, self.intermediate, self.hidden)
    }

    #[cfg(test)]
    fn samples() -> Vec<super::Geometry> {
        [ExpertPart::W13, ExpertPart::W2]
            .map(|part| {
                TransposedExperts {
                    part,
                    experts: 5,
                    intermediate: 16,
                    hidden: 3,
                }
                .into()
            })
            .to_vec()
    }
}

/// Rank `r`'s tensor: `w13` `[E_loc, 2·I_r, H]`, `w2` `[E_loc, H, I_r]`, every element filled by
/// [`transposed_copies`].
fn transposed_experts(
    part: ExpertPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> RankLayout {
    let share = r.experts(experts);
    let (ip, e_loc) = (share.of(intermediate), share.count());
    let shape = match part {
        ExpertPart::W13 => vec![e_loc, 2 * ip, hidden],
        ExpertPart::W2 => vec![e_loc, hidden, ip],
    };
    RankLayout::new(shape, Vec::new(), Vec::new())
}

/// The transposing copies, per local expert `e` at `j`: `w13[j][h·I_r + c][x] =
/// gate_up_proj[e][x][h·I + I_r·rank + c]` (h 0 gate, 1 up: `transpose(-1, -2).chunk(2, dim=-2)`,
/// then each half's rows of this rank), and `w2[j][x][c] = down_proj[e][I_r·rank + c][x]`.
fn transposed_copies(
    part: ExpertPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> Vec<(Block, Region)> {
    let share = r.experts(experts);
    let (ip, moe_rank) = (share.of(intermediate), share.rank);
    let local = share.local;
    // Per expert, for reports: the columns (w13) or rows (w2) of its slice that are read.
    let region = |range| Region {
        range: Some(range),
        experts: Some((local.start, local.end)),
        rotary: false,
        transposed: true,
        max_of: 0,
        dequant: None,
        neg_exp: false,
    };
    let mut out = Vec::new();
    for (j, e) in local.clone().enumerate() {
        let j = j as u64;
        match part {
            ExpertPart::W13 => {
                for half in 0..2 {
                    let col = half * intermediate + ip * moe_rank;
                    let b = Block {
                        rows: ip,
                        row: hidden,
                        src_start: e * hidden * 2 * intermediate + col,
                        src_stride: 1,
                        dst_start: (j * 2 + half) * ip * hidden,
                        dst_stride: hidden,
                        src_elem_stride: 2 * intermediate,
                    };
                    out.push((b, region((1, col, col + ip))));
                }
            }
            ExpertPart::W2 => {
                let first = ip * moe_rank;
                let b = Block {
                    rows: hidden,
                    row: ip,
                    src_start: e * intermediate * hidden + first * hidden,
                    src_stride: 1,
                    dst_start: j * hidden * ip,
                    dst_stride: ip,
                    src_elem_stride: hidden,
                };
                out.push((b, region((0, first, first + ip))));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Geometry;
    use crate::layout::tests::{at, rank_values};

    /// llama4.py `load_moe_expert_weights` on `arange` tensors over TP 1–16, with and without
    /// expert parallelism: every element of each rank's w13 / w2 is the checkpoint element vLLM
    /// puts there, and every element is written once.
    #[test]
    fn transposed_experts_follow_llama4s_loader_over_tp_1_to_16() {
        let (e, i, h) = (5u64, 16u64, 3u64);
        let g = |part| {
            Geometry::TransposedExperts(TransposedExperts {
                part,
                experts: e,
                intermediate: i,
                hidden: h,
            })
        };
        for tp in 1..=16u64 {
            for ep in [false, true] {
                if !ep && !i.is_multiple_of(tp) {
                    assert!(
                        !g(ExpertPart::W13)
                            .check(Rank { tp, rank: 0, ep })
                            .is_empty()
                    );
                    continue;
                }
                for rank in 0..tp {
                    let r = Rank { tp, rank, ep };
                    let (experts, ir, t) = if ep {
                        // determine_expert_map, linear: the first E % tp ranks one more.
                        let (base, rem) = (e / tp, e % tp);
                        let start = rank * base + rank.min(rem);
                        let n = base + u64::from(rank < rem);
                        ((start..start + n).collect::<Vec<_>>(), i, 0)
                    } else {
                        ((0..e).collect(), i / tp, rank)
                    };
                    let el = experts.len() as u64;
                    let ctx = format!("tp{tp} r{rank} ep{ep}");
                    let (shape, w13) = rank_values(&g(ExpertPart::W13), r);
                    assert_eq!(shape, vec![el, 2 * ir, h], "{ctx}");
                    let (shape, w2) = rank_values(&g(ExpertPart::W2), r);
                    assert_eq!(shape, vec![el, h, ir], "{ctx}");
                    for (j, &ex) in experts.iter().enumerate() {
                        let j = j as u64;
                        for c in 0..2 * ir {
                            // gate rows [0, I_r), then up rows, each this rank's share of I.
                            let col = (c / ir) * i + t * ir + c % ir;
                            for x in 0..h {
                                let want = at(&[ex, x, col], &[e, h, 2 * i]);
                                let got = w13[at(&[j, c, x], &[el, 2 * ir, h]) as usize];
                                assert_eq!(got, want, "{ctx} w13 [{j}, {c}, {x}]");
                            }
                        }
                        for x in 0..h {
                            for c in 0..ir {
                                let want = at(&[ex, t * ir + c, x], &[e, i, h]);
                                let got = w2[at(&[j, x, c], &[el, h, ir]) as usize];
                                assert_eq!(got, want, "{ctx} w2 [{j}, {x}, {c}]");
                            }
                        }
                    }
                }
            }
        }
    }
}
