//! Two layouts of late-2026 families: rows of whole heads (MiniMax-M2's TP-sharded q/k norms,
//! vLLM 0.33 `layers/minimax_rms_norm/rms_norm_tp.py`, `models/minimax_m2.py:215–233`) and fused
//! experts stored transposed in one tensor per layer with gate and up in halves (Llama 4,
//! `models/llama4.py` `load_moe_expert_weights`).

use super::Geometry;
use super::dense::{cat, whole_slot};
use super::experts::local_experts;
use super::types::{Block, Rank, RankLayout};
use crate::layout::Region;
use crate::mapping::ExpertPart;

/// Rank `r`'s heads of `heads`: `[r·n/tp, …)` when tp ≤ n, else head `r // (tp/n)` (the kv
/// head map of `QKVParallelLinear`, which MiniMax-M2 gives its k_norm through
/// `weight_shard_world_size = n`, `weight_shard_rank = r // (tp/n)`).
pub(super) fn head_range(heads: u64, r: Rank) -> (u64, u64) {
    if r.tp >= heads {
        let h = r.rank / (r.tp / heads);
        (h, h + 1)
    } else {
        let per = heads / r.tp;
        (r.rank * per, (r.rank + 1) * per)
    }
}

/// The rows of rank `r`'s heads, each `head_dim` rows of `inner`.
pub(super) fn head_rows(heads: u64, head_dim: u64, inner: &[u64], r: Rank) -> RankLayout {
    let (a, b) = head_range(heads, r);
    let out = cat((b - a) * head_dim, inner);
    let slice = whole_slot(
        cat(heads * head_dim, inner),
        0,
        a * head_dim,
        b * head_dim,
        out.clone(),
    );
    RankLayout::new(out, vec![slice], Vec::new())
}

/// The checkpoint tensor a `heads` or `transposed_experts` parameter reads: `[n·hd, inner…]`,
/// `gate_up_proj` `[E, H, 2I]` or `down_proj` `[E, I, H]`.
pub(super) fn source_shape(g: &Geometry) -> Vec<u64> {
    match g {
        Geometry::Heads {
            heads,
            head_dim,
            inner,
        } => cat(heads * head_dim, inner),
        Geometry::TransposedExperts {
            part: ExpertPart::W13,
            experts,
            intermediate,
            hidden,
        } => vec![*experts, *hidden, 2 * intermediate],
        Geometry::TransposedExperts {
            experts,
            intermediate,
            hidden,
            ..
        } => vec![*experts, *intermediate, *hidden],
        _ => Vec::new(),
    }
}

/// This rank's experts and its share of the intermediate size: with expert parallelism whole
/// experts placed linearly (the MoE runner's `expert_map`, which llama4.py indexes the stacked
/// tensor with), else every expert's `I / tp` rows at `rank`.
fn split(experts: u64, intermediate: u64, r: Rank) -> (std::ops::Range<u64>, u64, u64) {
    if r.ep {
        (local_experts(experts, r.tp, r.rank), intermediate, 0)
    } else {
        (0..experts, intermediate / r.tp, r.rank)
    }
}

/// Rank `r`'s tensor: `w13` `[E_loc, 2·I_r, H]`, `w2` `[E_loc, H, I_r]`, every element filled by
/// [`transposed_copies`].
pub(super) fn transposed_experts(
    part: ExpertPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> RankLayout {
    let (local, ip, _) = split(experts, intermediate, r);
    let e_loc = local.end - local.start;
    let shape = match part {
        ExpertPart::W13 => vec![e_loc, 2 * ip, hidden],
        ExpertPart::W2 => vec![e_loc, hidden, ip],
    };
    RankLayout::new(shape, Vec::new(), Vec::new())
}

/// The transposing copies, per local expert `e` at `j`: `w13[j][h·I_r + c][x] =
/// gate_up_proj[e][x][h·I + I_r·rank + c]` (h 0 gate, 1 up: `transpose(-1, -2).chunk(2, dim=-2)`,
/// then each half's rows of this rank), and `w2[j][x][c] = down_proj[e][I_r·rank + c][x]`.
pub(super) fn transposed_copies(
    part: ExpertPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> Vec<(Block, Region)> {
    let (local, ip, moe_rank) = split(experts, intermediate, r);
    // Per expert, for reports: the columns (w13) or rows (w2) of its slice that are read.
    let region = |range| Region {
        range: Some(range),
        experts: Some((local.start, local.end)),
        rotary: false,
        transposed: true,
        max_of: 0,
        dequant: None,
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

    /// Rank `r`'s tensor computed element by element from a source whose element i holds i.
    fn rank_values(g: &Geometry, r: Rank) -> (Vec<u64>, Vec<i64>) {
        let l = g.rank_layout(r, false);
        let mut out = vec![-1i64; l.shape.iter().product::<u64>() as usize];
        let blocks =
            (l.slices.iter().map(|s| s.block())).chain(g.strided(r).into_iter().map(|(_, b, _)| b));
        for b in blocks {
            for k in 0..b.rows {
                for x in 0..b.row {
                    let s = b.src_start + k * b.src_stride + x * b.src_elem_stride;
                    let d = (b.dst_start + k * b.dst_stride + x) as usize;
                    assert_eq!(out[d], -1, "element {d} written twice");
                    out[d] = s as i64;
                }
            }
        }
        (l.shape, out)
    }

    /// Flat index of `idx` in `shape`.
    fn at(idx: &[u64], shape: &[u64]) -> i64 {
        idx.iter().zip(shape).fold(0, |acc, (x, n)| acc * n + x) as i64
    }

    /// MiniMaxText01RMSNormTP over TP 1–16: the q norm `[nh·hd]` is slice r of `tp`; the k norm
    /// is slice r of `tp` when tp ≤ nkv, else slice `r // (tp/nkv)` of `nkv` (one head), so every
    /// rank holds the norm of exactly the k heads its `qkv_proj` rows hold.
    #[test]
    fn head_rows_follow_the_tp_norm_over_tp_1_to_16() {
        let hd = 4u64;
        for (nh, nkv) in [(16u64, 4u64), (16, 1), (16, 16), (16, 8)] {
            for tp in 1..=16u64 {
                if !nh.is_multiple_of(tp) || !(nkv.is_multiple_of(tp) || tp.is_multiple_of(nkv)) {
                    continue;
                }
                for rank in 0..tp {
                    let r = Rank {
                        tp,
                        rank,
                        ep: false,
                    };
                    let q = Geometry::Heads {
                        heads: nh,
                        head_dim: hd,
                        inner: vec![],
                    };
                    let (shape, got) = rank_values(&q, r);
                    let per = nh * hd / tp;
                    assert_eq!(shape, vec![per]);
                    let want: Vec<i64> = (rank * per..(rank + 1) * per).map(|x| x as i64).collect();
                    assert_eq!(got, want, "q nh{nh} tp{tp} r{rank}");
                    let k = Geometry::Heads {
                        heads: nkv,
                        head_dim: hd,
                        inner: vec![],
                    };
                    let (world, srank) = if tp <= nkv {
                        (tp, rank)
                    } else {
                        (nkv, rank / (tp / nkv))
                    };
                    let per = nkv * hd / world;
                    let want: Vec<i64> =
                        (srank * per..(srank + 1) * per).map(|x| x as i64).collect();
                    assert_eq!(rank_values(&k, r).1, want, "k nkv{nkv} tp{tp} r{rank}");
                    // The same heads as the k rows of qkv_proj.
                    let qkv = Geometry::Qkv {
                        heads: nh,
                        kv_heads: nkv,
                        head_dim: hd,
                        inner: vec![],
                    };
                    let ks = &qkv.rank_layout(r, false).slices[1];
                    assert_eq!((ks.from, ks.to), (want[0] as u64, want[0] as u64 + per));
                }
            }
        }
        let g = Geometry::Heads {
            heads: 4,
            head_dim: 2,
            inner: vec![],
        };
        let r = Rank {
            tp: 3,
            rank: 0,
            ep: false,
        };
        assert_eq!(g.check(r), ["heads (4) and tp (3) must divide one another"]);
    }

    /// llama4.py `load_moe_expert_weights` on `arange` tensors over TP 1–16, with and without
    /// expert parallelism: every element of each rank's w13 / w2 is the checkpoint element vLLM
    /// puts there, and every element is written once.
    #[test]
    fn transposed_experts_follow_llama4s_loader_over_tp_1_to_16() {
        let (e, i, h) = (5u64, 16u64, 3u64);
        let g = |part| Geometry::TransposedExperts {
            part,
            experts: e,
            intermediate: i,
            hidden: h,
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
