//! The fused experts' geometry: vLLM's fused MoE weights, split over the ranks or spread whole
//! with expert parallelism, and gpt-oss's stacked experts, whose weights are transposing copies
//! (vLLM 0.33 `layers/fused_moe/`, `models/gpt_oss.py`).

use super::dense::{replicated, whole_slot};
use super::types::{Block, Rank, RankLayout, Slice, name};
use crate::mapping::{ExpertPart, GptOssPart};

/// Linear expert placement (vLLM's `determine_expert_map`): extra experts go to the first ranks.
pub(super) fn local_experts(experts: u64, ep_size: u64, ep_rank: u64) -> std::ops::Range<u64> {
    let base = experts / ep_size;
    let rem = experts % ep_size;
    let count = base + u64::from(ep_rank < rem);
    let start = ep_rank * base + ep_rank.min(rem);
    start..start + count
}

/// Fused expert weights: every expert's intermediate split over the ranks, or with expert
/// parallelism whole experts spread over them.
pub(super) fn expert_blocks(
    part: ExpertPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> RankLayout {
    let (local, moe_tp, moe_rank) = if r.ep {
        (local_experts(experts, r.tp, r.rank), 1, 0)
    } else {
        (0..experts, r.tp, r.rank)
    };
    let ip = intermediate / moe_tp;
    let e_loc = local.end - local.start;
    let (from, to) = (moe_rank * ip, (moe_rank + 1) * ip);
    let first = Some(local.start);
    match part {
        ExpertPart::W13 => {
            let slices = ["w1", "w3"]
                .iter()
                .enumerate()
                .map(|(h, s)| Slice {
                    slot: (name(s), first),
                    src_shape: vec![intermediate, hidden],
                    dim: 0,
                    from,
                    to,
                    dst_shape: vec![2 * ip, hidden],
                    dst_at: h as u64 * ip,
                    dst_base: 0,
                })
                .collect();
            RankLayout::per_expert(vec![e_loc, 2 * ip, hidden], local, 2 * ip * hidden, slices)
        }
        ExpertPart::W2 => {
            let slice = Slice {
                slot: (name("w2"), first),
                src_shape: vec![hidden, intermediate],
                dim: 1,
                from,
                to,
                dst_shape: vec![hidden, ip],
                dst_at: 0,
                dst_base: 0,
            };
            RankLayout::per_expert(vec![e_loc, hidden, ip], local, hidden * ip, vec![slice])
        }
    }
}

/// The checkpoint shape a fused expert parameter's shard expects: one expert's `w1`/`w3`
/// `[I, H]` or `w2` `[H, I]`, or, without a shard id, one stacked tensor for every expert
/// ([`stacked_experts`]).
pub(super) fn expected_source(
    part: ExpertPart,
    [experts, intermediate, hidden]: [u64; 3],
    shard: Option<&crate::mapping::rules::ShardId>,
) -> Result<super::types::Shape, String> {
    let shape = |s: &[u64]| Ok(super::types::Shape::from_slice(s));
    match (part, shard.map(|s| s.text()).as_deref()) {
        (ExpertPart::W13, Some("w1" | "w3")) => shape(&[intermediate, hidden]),
        (ExpertPart::W13, None) => shape(&[experts, 2 * intermediate, hidden]),
        (ExpertPart::W2, Some("w2")) => shape(&[hidden, intermediate]),
        (ExpertPart::W2, None) => shape(&[experts, hidden, intermediate]),
        (_, s) => Err(format!(
            "shard_id must be ['w1','w2','w3'] matching the parameter, got {}",
            s.unwrap_or("none")
        )),
    }
}

/// Fused expert weights from one stacked tensor a layer, stored as vLLM holds them: `w13` from
/// `gate_up_proj` `[E, 2I, H]` (per expert gate rows then up rows), `w2` from `down_proj`
/// `[E, H, I]` (transformers 5's fused Qwen3.5 experts). vLLM's `RoutedExperts.load_weights`
/// chunks the tensor in halves on dim 1 and loads every expert as if it came alone
/// (`fused_moe/routed_experts.py:1004–1075`), so the rank's tensor is the per-expert layout's:
/// `[gate_r; up_r]` / columns `I_r·rank…` of every expert, or whole experts with expert
/// parallelism (one run of the tensor's leading rows).
pub(super) fn stacked_experts(
    part: ExpertPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> RankLayout {
    let (i, h) = (intermediate, hidden);
    if r.ep {
        let local = local_experts(experts, r.tp, r.rank);
        let n = local.end - local.start;
        let per = 2 * i * h / if part == ExpertPart::W13 { 1 } else { 2 };
        let shape = match part {
            ExpertPart::W13 => vec![n, 2 * i, h],
            ExpertPart::W2 => vec![n, h, i],
        };
        let slice = whole_slot(vec![experts, per], 0, local.start, local.end, vec![n, per]);
        return RankLayout::new(shape, vec![slice], Vec::new());
    }
    let ip = i / r.tp;
    let (from, e) = (r.rank * ip, experts);
    let slices = match part {
        ExpertPart::W13 => [0, 1]
            .map(|half| Slice {
                slot: (None, None),
                src_shape: vec![e, 2 * i, h],
                dim: 1,
                from: half * i + from,
                to: half * i + from + ip,
                dst_shape: vec![e, 2 * ip, h],
                dst_at: half * ip,
                dst_base: 0,
            })
            .to_vec(),
        ExpertPart::W2 => vec![whole_slot(
            vec![e, h, i],
            2,
            from,
            from + ip,
            vec![e, h, ip],
        )],
    };
    let shape = slices[0].dst_shape.clone();
    RankLayout::new(shape, slices, Vec::new())
}

/// gpt-oss's expert placement (gpt_oss.py `_load_weights_other`): this rank's experts, its share of
/// the intermediate size, and its rank within the experts' tensor parallelism.
fn gpt_oss_split(experts: u64, intermediate: u64, r: Rank) -> (std::ops::Range<u64>, u64, u64) {
    if r.ep {
        // Every rank E / tp experts, as the loader slices them (check() refuses a remainder).
        let per = experts / r.tp;
        (r.rank * per..(r.rank + 1) * per, intermediate, 0)
    } else {
        (0..experts, intermediate / r.tp, r.rank)
    }
}

/// Rank `r`'s gpt-oss expert tensor: with TP every expert's intermediate share (columns
/// `[2·I_r·r, 2·I_r·(r+1))` of the interleaved gate/up, so the interleaving is kept), with EP
/// whole experts. The weights are filled by [`gpt_oss_transposed`]; the biases are sliced, except
/// the down bias under TP: whole on rank 0 and zeros elsewhere, so that the all-reduce adds it
/// once.
pub(super) fn gpt_oss_experts(
    part: GptOssPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> RankLayout {
    let (local, ip, moe_rank) = gpt_oss_split(experts, intermediate, r);
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
pub(super) fn gpt_oss_transposed(
    part: GptOssPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> Vec<(Block, crate::layout::Region)> {
    let (local, ip, moe_rank) = gpt_oss_split(experts, intermediate, r);
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
    let region = crate::layout::Region {
        range: Some(match part {
            GptOssPart::W13Weight => (1, first, first + rows),
            _ => (0, ip * moe_rank, ip * (moe_rank + 1)),
        }),
        experts: Some((local.start, local.end)),
        rotary: false,
        transposed: true,
        max_of: 0,
        dequant: None,
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
    use super::super::Geometry;
    use super::*;

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
        let g = |part| Geometry::GptOssExperts {
            part,
            experts: e,
            intermediate: i,
            hidden: h,
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

    #[test]
    fn extra_experts_go_to_the_first_ranks() {
        assert_eq!(local_experts(5, 2, 0), 0..3);
        assert_eq!(local_experts(5, 2, 1), 3..5);
        assert_eq!(local_experts(8, 8, 7), 7..8);
    }

    /// A fused 3-D expert tensor (`gate_up_proj` `[E, 2I, H]`, `down_proj` `[E, H, I]`) loads,
    /// over TP 1–16 with and without expert parallelism, exactly what the per-expert tensors
    /// load: vLLM's `RoutedExperts.load_weights` chunks it in halves on dim 1 and hands each
    /// expert to the per-expert loader (routed_experts.py:1004–1075).
    #[test]
    fn stacked_experts_load_what_per_expert_tensors_load_over_tp_1_to_16() {
        let (e, i, h) = (5u64, 16u64, 3u64);
        for part in [ExpertPart::W13, ExpertPart::W2] {
            let g = Geometry::Experts {
                part,
                experts: e,
                intermediate: i,
                hidden: h,
            };
            for tp in 1..=16u64 {
                for ep in [false, true] {
                    if !ep && !i.is_multiple_of(tp) {
                        continue;
                    }
                    for rank in 0..tp {
                        let r = Rank { tp, rank, ep };
                        let per = element_sources(&g.rank_layout(r, false));
                        let fused = element_sources(&g.rank_layout(r, true));
                        // Per expert (shard, e, row-major index in [I, H] or [H, I]) in the
                        // stacked tensor's terms.
                        let want: Vec<u64> = per
                            .iter()
                            .map(|(shard, ex, idx)| {
                                let half = u64::from(shard == "w3");
                                let per_expert =
                                    if part == ExpertPart::W13 { 2 } else { 1 } * i * h;
                                ex * per_expert + half * i * h + idx
                            })
                            .collect();
                        let got: Vec<u64> = fused.iter().map(|(_, _, idx)| *idx).collect();
                        assert_eq!(got, want, "{part:?} tp{tp} r{rank} ep{ep}");
                    }
                }
            }
        }
    }

    /// Each element of a rank tensor: the slot's shard id, expert id (0 for a stacked tensor)
    /// and source element index.
    fn element_sources(l: &RankLayout) -> Vec<(String, u64, u64)> {
        let n = l.shape.iter().product::<u64>() as usize;
        let mut out = vec![None; n];
        for s in l.all_slices() {
            let b = s.block();
            let shard = s.slot.0.as_ref().map_or(String::new(), |x| x.to_string());
            for k in 0..b.rows {
                for x in 0..b.row {
                    let d = (b.dst_start + k * b.dst_stride + x) as usize;
                    assert!(out[d].is_none(), "element {d} twice");
                    out[d] = Some((
                        shard.clone(),
                        s.slot.1.unwrap_or(0),
                        b.src_start + k * b.src_stride + x,
                    ));
                }
            }
        }
        out.into_iter().map(|x| x.expect("filled")).collect()
    }
}
