//! The `gpt_oss_experts` kind: gpt-oss's fused experts from the stacked tensors of its HF
//! checkpoint, whose weights are transposing copies (vLLM 0.33 `models/gpt_oss.py`
//! `_load_weights_other`).

use serde::Deserialize;

use super::dense::{replicated, whole_slot};
use super::types::{Block, RankLayout, Shape, Strided, not_divisible, unstacked};
use super::{Dim, Eval, Kind, Rank, Region, ShardId, size};

/// Which of gpt-oss's four fused expert tensors a [`GptOssExperts`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GptOssPart {
    W13Weight,
    W13Bias,
    W2Weight,
    W2Bias,
}

/// gpt-oss's fused experts: `w13_weight` [E_loc, 2·I_p, H] transposed from `gate_up_proj`
/// [E, H, 2I] (gate and up interleaved, kept so), `w2_weight` [E_loc, H, I_p] from `down_proj`
/// [E, I, H], and their biases; split by tp, or by expert with expert parallelism.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GptOssExperts<D = u64> {
    pub part: GptOssPart,
    pub experts: D,
    pub intermediate: D,
    pub hidden: D,
}

impl<D> GptOssExperts<D> {
    pub(super) fn try_map<E, X>(&self, f: &mut Eval<D, E, X>) -> Result<GptOssExperts<E>, X> {
        Ok(GptOssExperts {
            part: self.part,
            experts: f(&self.experts, Dim::Experts)?,
            intermediate: f(&self.intermediate, Dim::Size)?,
            hidden: f(&self.hidden, Dim::Size)?,
        })
    }
}

impl Kind for GptOssExperts {
    fn check(&self, r: Rank) -> Vec<String> {
        // MLPBlock asserts the first whatever the parallelism; with expert parallelism the
        // loader hands every rank E / tp experts (gpt_oss.py load_weights).
        let mut v: Vec<String> = not_divisible("expert intermediate size", self.intermediate, r.tp)
            .into_iter()
            .collect();
        if r.ep {
            v.extend(not_divisible("number of experts", self.experts, r.tp));
        }
        v
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        let (e, i, h) = (self.experts, self.intermediate, self.hidden);
        let shape = match self.part {
            GptOssPart::W13Weight => [e, h, 2 * i].to_vec(),
            GptOssPart::W13Bias => [e, 2 * i].to_vec(),
            GptOssPart::W2Weight => [e, i, h].to_vec(),
            GptOssPart::W2Bias => [e, h].to_vec(),
        };
        unstacked(&shape, shard)
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        gpt_oss_experts(self.part, self.experts, self.intermediate, self.hidden, r)
    }

    fn strided(&self, r: Rank) -> Vec<Strided> {
        gpt_oss_transposed(self.part, self.experts, self.intermediate, self.hidden, r)
            .into_iter()
            .map(|(b, region)| ((None, None), b, region))
            .collect()
    }

    fn fits(&self) -> Result<(), Vec<u64>> {
        size::experts(self.experts, self.intermediate, self.hidden)
    }

    #[cfg(test)]
    fn samples() -> Vec<super::Geometry> {
        [
            GptOssPart::W13Weight,
            GptOssPart::W13Bias,
            GptOssPart::W2Weight,
            GptOssPart::W2Bias,
        ]
        .map(|part| {
            GptOssExperts {
                part,
                experts: 8,
                intermediate: 16,
                hidden: 6,
            }
            .into()
        })
        .to_vec()
    }
}

/// Rank `r`'s gpt-oss expert tensor: with TP every expert's intermediate share (columns
/// `[2·I_r·r, 2·I_r·(r+1))` of the interleaved gate/up, so the interleaving is kept), with EP
/// whole experts. The weights are filled by [`gpt_oss_transposed`]; the biases are sliced, except
/// the down bias under TP: whole on rank 0 and zeros elsewhere, so that the all-reduce adds it
/// once.
fn gpt_oss_experts(
    part: GptOssPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> RankLayout {
    let share = r.experts(experts);
    let (ip, moe_rank) = (share.of(intermediate), share.rank);
    let local = share.local;
    let e_loc = local.end - local.start;
    let layout = RankLayout::new;
    let by_expert = |inner: u64, out: Vec<u64>| {
        let slice = whole_slot(vec![experts, inner], 0, local.start, local.end, out.clone());
        layout(out, vec![slice], vec![])
    };
    match part {
        GptOssPart::W13Weight => layout(vec![e_loc, 2 * ip, hidden], vec![], vec![]),
        GptOssPart::W2Weight => layout(vec![e_loc, hidden, ip], vec![], vec![]),
        GptOssPart::W13Bias if r.ep => by_expert(2 * intermediate, vec![e_loc, 2 * intermediate]),
        GptOssPart::W13Bias => {
            let out = vec![experts, 2 * ip];
            let slice = whole_slot(
                vec![experts, 2 * intermediate],
                1,
                2 * ip * moe_rank,
                2 * ip * (moe_rank + 1),
                out.clone(),
            );
            layout(out, vec![slice], vec![])
        }
        GptOssPart::W2Bias if r.ep => by_expert(hidden, vec![e_loc, hidden]),
        GptOssPart::W2Bias if r.rank == 0 => replicated(&[experts, hidden]),
        GptOssPart::W2Bias => layout(vec![experts, hidden], vec![], vec![(0, experts * hidden)]),
    }
}

/// The transposed copies of gpt-oss's expert weights, one per local expert (`permute(0, 2, 1)`
/// of the rank's slice): `w13[j][c][h] = gate_up_proj[e][h][2·I_r·r + c]` and
/// `w2[j][h][i] = down_proj[e][I_r·r + i][h]`.
fn gpt_oss_transposed(
    part: GptOssPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> Vec<(Block, Region)> {
    let share = r.experts(experts);
    let (ip, moe_rank) = (share.of(intermediate), share.rank);
    let local = share.local;
    // Per expert: destination rows and their length, the expert's source size, where row 0
    // starts in it, the source distance between a row's elements, and the intermediate range.
    let (rows, row, per_src, first, elem_stride) = match part {
        GptOssPart::W13Weight => (
            2 * ip,
            hidden,
            hidden * 2 * intermediate,
            2 * ip * moe_rank,
            2 * intermediate,
        ),
        GptOssPart::W2Weight => (
            hidden,
            ip,
            intermediate * hidden,
            ip * moe_rank * hidden,
            hidden,
        ),
        GptOssPart::W13Bias | GptOssPart::W2Bias => return Vec::new(),
    };
    // One description for every expert's copy: reports show the tensor's source region once.
    let region = Region {
        range: Some(match part {
            GptOssPart::W13Weight => (1, first, first + rows),
            _ => (0, ip * moe_rank, ip * (moe_rank + 1)),
        }),
        experts: Some((local.start, local.end)),
        rotary: false,
        transposed: true,
        max_of: 0,
        dequant: None,
        neg_exp: false,
    };
    local
        .enumerate()
        .map(|(j, e)| {
            let b = Block {
                rows,
                row,
                src_start: e * per_src + first,
                src_stride: 1,
                dst_start: j as u64 * rows * row,
                dst_stride: row,
                src_elem_stride: elem_stride,
            };
            (b, region)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Geometry;
    use crate::layout::types::Slice;

    /// Rank `r`'s gpt-oss expert tensor, computed element by element from the checkpoint
    /// tensor `src` (element i holds i) by moving its blocks and slices.
    fn gpt_oss_rank(g: &Geometry, r: Rank) -> (Vec<u64>, Vec<i64>) {
        let l = g.rank_layout(r, false);
        let mut out = vec![-1i64; l.shape.iter().product::<u64>() as usize];
        let blocks = l
            .slices
            .iter()
            .map(Slice::block)
            .chain(g.strided(r).into_iter().map(|(_, b, _)| b));
        for b in blocks {
            for k in 0..b.rows {
                for x in 0..b.row {
                    let s = b.src_start + k * b.src_stride + x * b.src_elem_stride;
                    out[(b.dst_start + k * b.dst_stride + x) as usize] = s as i64;
                }
            }
        }
        for (at, n) in l.zeros {
            out[at as usize..(at + n) as usize].fill(0);
        }
        (l.shape, out)
    }

    /// gpt_oss.py `_load_weights_other` on `arange` tensors: TP keeps the gate/up interleaving
    /// of each rank's columns and transposes; the down bias is rank 0's alone; EP takes whole
    /// experts and every rank its biases.
    #[test]
    fn gpt_oss_experts_follow_vllms_loader() {
        let (e, i, h) = (4u64, 6u64, 5u64);
        let g = |part| {
            Geometry::GptOssExperts(GptOssExperts {
                part,
                experts: e,
                intermediate: i,
                hidden: h,
            })
        };
        let at = |idx: &[u64], shape: &[u64]| -> i64 {
            idx.iter().zip(shape).fold(0, |acc, (x, n)| acc * n + x) as i64
        };
        for (tp, ep) in [(1, false), (2, false), (3, false), (2, true), (4, true)] {
            for rank in 0..tp {
                let r = Rank { tp, rank, ep };
                let (experts, ir, t) = if ep {
                    let n = e / tp;
                    ((rank * n..(rank + 1) * n).collect::<Vec<_>>(), i, 0)
                } else {
                    ((0..e).collect(), i / tp, rank)
                };
                let ctx = format!("tp{tp} r{rank} ep{ep}");
                let (shape, w13) = gpt_oss_rank(&g(GptOssPart::W13Weight), r);
                assert_eq!(shape, vec![experts.len() as u64, 2 * ir, h], "{ctx}");
                let (_, w2) = gpt_oss_rank(&g(GptOssPart::W2Weight), r);
                let (_, b13) = gpt_oss_rank(&g(GptOssPart::W13Bias), r);
                let (_, b2) = gpt_oss_rank(&g(GptOssPart::W2Bias), r);
                for (j, &ex) in experts.iter().enumerate() {
                    let j = j as u64;
                    for c in 0..2 * ir {
                        for hh in 0..h {
                            let want = at(&[ex, hh, 2 * ir * t + c], &[e, h, 2 * i]);
                            let got = w13[at(&[j, c, hh], &[e, 2 * ir, h]) as usize];
                            assert_eq!(got, want, "{ctx} w13 [{j}, {c}, {hh}]");
                        }
                        let want = at(&[ex, 2 * ir * t + c], &[e, 2 * i]);
                        assert_eq!(b13[at(&[j, c], &[e, 2 * ir]) as usize], want, "{ctx}");
                    }
                    for hh in 0..h {
                        for x in 0..ir {
                            let want = at(&[ex, ir * t + x], &[e, i]) * h as i64 + hh as i64;
                            let got = w2[at(&[j, hh, x], &[e, h, ir]) as usize];
                            assert_eq!(got, want, "{ctx} w2 [{j}, {hh}, {x}]");
                        }
                        let want = if ep || rank == 0 {
                            at(&[ex, hh], &[e, h])
                        } else {
                            0
                        };
                        assert_eq!(b2[at(&[j, hh], &[e, h]) as usize], want, "{ctx}");
                    }
                }
            }
        }
        // vLLM's loader gives each EP rank E / tp experts; a remainder would not load.
        let r = Rank {
            tp: 3,
            rank: 0,
            ep: true,
        };
        assert_eq!(
            g(GptOssPart::W13Weight).check(r),
            ["number of experts (4) is not divisible by tp (3)"]
        );
        // MLPBlock asserts the intermediate size divides, expert parallel or not.
        assert_eq!(
            g(GptOssPart::W2Bias).check(Rank { tp: 4, ..r }),
            ["expert intermediate size (6) is not divisible by tp (4)"]
        );
    }
}
