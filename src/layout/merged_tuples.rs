//! The merged column whose shards the checkpoint fills partly as runs (vLLM's tuple shard ids,
//! `layers/linear.py` `MergedColumnParallelLinear.weight_loader`): Qwen3.5's GDN `in_proj_qkvz`
//! has the output sizes `[key, key, value, value]` (`layers/mamba/gdn/qwen_gdn_linear_attn.py:
//! 803–827`) and is filled by `in_proj_qkv` as shards `(0, 1, 2)` and `in_proj_z` as shard 3
//! (`models/qwen3_5.py:225–233`). vLLM cuts a tuple's tensor at its shards' offsets and slices
//! each shard by itself, so rank r holds `[q_r; k_r; v_r; z_r]`, exactly as if every shard came
//! alone.

use super::types::merged_column;
use super::types::{RankLayout, Shape, Slice, SlotKey, cat, not_divisible};
use super::{Kind, Rank, ShardId, size};

/// A merged column some of whose shards the checkpoint fills as one tensor (a tuple shard id:
/// Qwen3.5's GDN `in_proj_qkvz` from `in_proj_qkv` and `in_proj_z`). Made from a mapping's
/// `merged_column` that lists `tuples` ([`super::MergedColumnSpec`]).
#[derive(Debug, Clone, PartialEq)]
pub struct MergedTuples {
    pub sizes: Vec<u64>,
    pub inner: Vec<u64>,
    pub tuples: Vec<Vec<u64>>,
}

impl Kind for MergedTuples {
    fn check(&self, r: Rank) -> Vec<String> {
        (self.sizes.iter())
            .filter_map(|s| not_divisible("merged output size", *s, r.tp))
            .collect()
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        expected_source(&self.sizes, &self.inner, &self.tuples, shard)
    }

    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        (slots(self.sizes.len(), &self.tuples), Some((None, None)))
    }

    fn rank_layout(&self, r: Rank, fused: bool) -> RankLayout {
        if fused {
            merged_column(&self.sizes, &self.inner, r, true)
        } else {
            rank_layout(&self.sizes, &self.inner, &self.tuples, r)
        }
    }

    fn fits(&self) -> Result<(), Vec<u64>> {
        let all = [self.sizes.as_slice(), &self.inner].concat();
        size::rows_of(size::sum(&self.sizes), &self.inner, all)
    }

    #[cfg(test)]
    fn samples() -> Vec<super::Geometry> {
        // Qwen3.5's in_proj_qkvz: shards 0–2 from one tensor, 3 from another.
        vec![
            MergedTuples {
                sizes: vec![16, 16, 32, 32],
                inner: vec![2],
                tuples: vec![vec![0, 1, 2]],
            }
            .into(),
        ]
    }
}

/// The tuple holding shard `k`, and `k`'s row offset inside that tuple's tensor.
fn tuple_of<'a>(k: u64, sizes: &[u64], tuples: &'a [Vec<u64>]) -> Option<(&'a Vec<u64>, u64)> {
    let t = tuples.iter().find(|t| t.contains(&k))?;
    let before: u64 = t
        .iter()
        .take_while(|&&j| j != k)
        .map(|&j| sizes[j as usize])
        .sum();
    Some((t, before))
}

/// The slots a complete parameter needs when filled shard by shard: each tuple once, and every
/// shard no tuple covers.
fn slots(n: usize, tuples: &[Vec<u64>]) -> Vec<SlotKey> {
    let mut out: Vec<SlotKey> = Vec::new();
    for k in 0..n as u64 {
        match tuples.iter().find(|t| t.contains(&k)) {
            Some(t) if t[0] == k => out.push((Some(ShardId::Tuple(t.clone())), None)),
            Some(_) => {}
            None => out.push((Some(ShardId::Index(k)), None)),
        }
    }
    out
}

/// The checkpoint shape each shard id must have: a tuple's shards stacked, a lone shard its own
/// size, no shard id the whole fused tensor.
fn expected_source(
    sizes: &[u64],
    inner: &[u64],
    tuples: &[Vec<u64>],
    shard: Option<&ShardId>,
) -> Result<Shape, String> {
    let covered = |k: u64| tuples.iter().any(|t| t.contains(&k));
    match shard {
        None => Ok(cat(sizes.iter().sum(), inner).into()),
        Some(ShardId::Tuple(t)) if tuples.contains(t) => {
            Ok(cat(t.iter().map(|&k| sizes[k as usize]).sum(), inner).into())
        }
        Some(ShardId::Index(k)) if (*k as usize) < sizes.len() && !covered(*k) => {
            Ok(cat(sizes[*k as usize], inner).into())
        }
        Some(s) => {
            let want: Vec<String> = slots(sizes.len(), tuples)
                .into_iter()
                .filter_map(|(s, _)| s.map(|s| s.to_string()))
                .collect();
            Err(format!(
                "shard id {s} does not fill this merged column: its shards come as {}",
                want.join(", ")
            ))
        }
    }
}

/// Rank `r`'s rows: for each shard its `1/tp` part, read from the tuple's tensor at the shard's
/// offset there, or from the shard's own tensor.
fn rank_layout(sizes: &[u64], inner: &[u64], tuples: &[Vec<u64>], r: Rank) -> RankLayout {
    let total: u64 = sizes.iter().map(|s| s / r.tp).sum();
    let out = cat(total, inner);
    let mut at = 0;
    let slices = (sizes.iter().enumerate())
        .map(|(k, s)| {
            let n = s / r.tp;
            let (slot, src_rows, off) = match tuple_of(k as u64, sizes, tuples) {
                Some((t, before)) => {
                    let rows = t.iter().map(|&j| sizes[j as usize]).sum();
                    ((Some(ShardId::Tuple(t.clone())), None), rows, before)
                }
                None => ((Some(ShardId::Index(k as u64)), None), *s, 0),
            };
            let slice = Slice {
                slot,
                src_shape: cat(src_rows, inner),
                dim: 0,
                from: off + r.rank * n,
                to: off + (r.rank + 1) * n,
                dst_shape: out.clone(),
                dst_at: at,
                dst_base: 0,
            };
            at += n;
            slice
        })
        .collect();
    RankLayout::new(out, slices, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::types::merged_column;
    use crate::layout::{BlockScale, Geometry, MergedColumn};

    /// For each element of rank `r`'s tensor, the slot and source element (row-major) that fills
    /// it; every element filled exactly once.
    fn sources(g: &Geometry, r: Rank, fused: bool) -> Vec<(SlotKey, u64)> {
        let l = g.rank_layout(r, fused);
        let mut out: Vec<Option<(SlotKey, u64)>> =
            vec![None; l.shape.iter().product::<u64>() as usize];
        for s in l.all_slices() {
            let b = s.block();
            for k in 0..b.rows {
                for x in 0..b.row {
                    let d = (b.dst_start + k * b.dst_stride + x) as usize;
                    assert!(
                        out[d].is_none(),
                        "{g:?} tp{} r{}: element {d} twice",
                        r.tp,
                        r.rank
                    );
                    out[d] = Some((s.slot.clone(), b.src_start + k * b.src_stride + x));
                }
            }
        }
        out.into_iter()
            .map(|e| e.expect("every element filled"))
            .collect()
    }

    /// MergedColumnParallelLinear.weight_loader with Qwen3.5's shard ids over TP 1–16:
    /// `in_proj_qkv` as `(0, 1, 2)` is cut at the q, k, v offsets and each part sliced by
    /// itself, `in_proj_z` as shard 3, so rank r's row `o` of part k is row `off_k + r·s_k/tp + o`
    /// of the tuple's tensor (or of z). The fused on-disk form reads the same rows at the global
    /// offsets, and every element of both checkpoint tensors lands on exactly one rank's rows
    /// (each part is split, never replicated).
    #[test]
    fn in_proj_qkvz_follows_vllms_tuple_loader_over_tp_1_to_16() {
        let (key, value, h) = (32u64, 64u64, 3u64);
        let sizes = vec![key, key, value, value];
        let g = Geometry::MergedTuples(MergedTuples {
            sizes: sizes.clone(),
            inner: vec![h],
            tuples: vec![vec![0, 1, 2]],
        });
        let qkv = (Some(ShardId::Tuple(vec![0, 1, 2])), None);
        let z = (Some(ShardId::Index(3)), None);
        assert_eq!(g.required().0, vec![qkv.clone(), z.clone()]);
        for tp in 1..=16u64 {
            if sizes.iter().any(|s| !s.is_multiple_of(tp)) {
                assert!(
                    !g.check(Rank {
                        tp,
                        rank: 0,
                        ep: false
                    })
                    .is_empty(),
                    "tp{tp}"
                );
                continue;
            }
            let mut seen_qkv = vec![0u8; ((2 * key + value) * h) as usize];
            let mut seen_z = vec![0u8; (value * h) as usize];
            for rank in 0..tp {
                let r = Rank {
                    tp,
                    rank,
                    ep: false,
                };
                let got = sources(&g, r, false);
                let mut want = Vec::new();
                let offsets = [0, key, 2 * key, 0];
                for (k, s) in sizes.iter().enumerate() {
                    let n = s / tp;
                    for o in 0..n {
                        let slot = if k < 3 { &qkv } else { &z };
                        let row = offsets[k] + rank * n + o;
                        want.extend((0..h).map(|x| (slot.clone(), row * h + x)));
                    }
                }
                assert_eq!(got, want, "tp{tp} r{rank}");
                for (slot, i) in &got {
                    let seen = if *slot == qkv {
                        &mut seen_qkv
                    } else {
                        &mut seen_z
                    };
                    seen[*i as usize] += 1;
                }
                // Fused on disk ([q; k; v; z] in one tensor): the merged column's global cut.
                let fused = sources(&g, r, true);
                let plain = merged_column(&sizes, &[h], r, true);
                assert_eq!(fused.len() as u64, plain.shape.iter().product::<u64>());
            }
            assert!(seen_qkv.iter().chain(&seen_z).all(|&n| n == 1), "tp{tp}");
        }
        let bad = g.expected_source(Some(&ShardId::Index(1))).unwrap_err();
        assert_eq!(
            bad,
            "shard id 1 does not fill this merged column: its shards come as (0, 1, 2), 3"
        );
        assert_eq!(
            g.expected_source(Some(&qkv.0.unwrap())).unwrap().to_vec(),
            vec![2 * key + value, h]
        );
    }

    /// weight_loader_v2 with Qwen3.5's shard ids on a `BlockQuantScaleParameter` over TP 1–16:
    /// `in_proj_qkv`'s scale `[(2key + value)/bn, H/bk]` is cut at the block-rounded sizes
    /// `[key/bn, key/bn, value/bn]` (`adjust_block_scale_shard(size, 0)`) and each part loaded as
    /// shard k: rank r's block row `o` of part k is row `off_k + r·s_k/tp/bn + o` of the tuple's
    /// scale (or of z's). Where a part per rank is not whole blocks, the layout is refused.
    #[test]
    fn in_proj_qkvz_block_scales_follow_vllms_tuple_loader_over_tp_1_to_16() {
        let (key, value, h, bn) = (128u64, 256u64, 64u64, 16u64);
        let sizes = vec![key, key, value, value];
        let of = Geometry::MergedTuples(MergedTuples {
            sizes: sizes.clone(),
            inner: vec![h],
            tuples: vec![vec![0, 1, 2]],
        });
        let g = Geometry::BlockScale(BlockScale {
            of: Box::new(of.clone()),
            block: [bn, bn],
        });
        let qkv = (Some(ShardId::Tuple(vec![0, 1, 2])), None);
        let z = (Some(ShardId::Index(3)), None);
        assert_eq!(
            g.expected_source(qkv.0.as_ref()).unwrap().to_vec(),
            vec![(2 * key + value) / bn, h / bn]
        );
        let cols = h / bn;
        for tp in 1..=16u64 {
            let r0 = Rank {
                tp,
                rank: 0,
                ep: false,
            };
            // Not divisible: the weight is refused; divisible but not whole blocks (tp 16: 8
            // rows of a key part): the scale is.
            if sizes.iter().any(|s| !s.is_multiple_of(tp)) {
                assert!(!of.check(r0).is_empty(), "tp{tp}");
                continue;
            }
            if sizes.iter().any(|s| !s.is_multiple_of(tp * bn)) {
                assert!(!g.check(r0).is_empty(), "tp{tp}");
                continue;
            }
            assert!(g.check(r0).is_empty(), "tp{tp}");
            let mut seen_qkv = vec![0u8; ((2 * key + value) / bn * cols) as usize];
            let mut seen_z = vec![0u8; (value / bn * cols) as usize];
            for rank in 0..tp {
                let r = Rank { rank, ..r0 };
                let mut want = Vec::new();
                let offsets = [0, key / bn, 2 * key / bn, 0];
                for (k, s) in sizes.iter().enumerate() {
                    let n = s / tp / bn;
                    for o in 0..n {
                        let slot = if k < 3 { &qkv } else { &z };
                        let row = offsets[k] + rank * n + o;
                        want.extend((0..cols).map(|x| (slot.clone(), row * cols + x)));
                    }
                }
                let got = sources(&g, r, false);
                assert_eq!(got, want, "tp{tp} r{rank}");
                for (slot, i) in &got {
                    let seen = if *slot == qkv {
                        &mut seen_qkv
                    } else {
                        &mut seen_z
                    };
                    seen[*i as usize] += 1;
                }
            }
            assert!(seen_qkv.iter().chain(&seen_z).all(|&n| n == 1), "tp{tp}");
        }
    }

    /// mamba_v2_sharded_weight_loader (mamba_mixer2.py:202–260) with the GDN's shard spec
    /// `[(key, 0, False), (key, 0, False), (value, 0, False)]` (qwen_gdn_linear_attn.py:632–640),
    /// ported line by line, over TP 1–16: the conv1d weight `[conv_dim, 1, K]` as a merged column
    /// of `[key, key, value]` filled by the fused checkpoint tensor holds the same channels.
    #[test]
    fn conv1d_follows_the_mamba_v2_loader_over_tp_1_to_16() {
        let (key, value, kernel) = (48u64, 96u64, 4u64);
        let g = Geometry::MergedColumn(MergedColumn {
            sizes: vec![key, key, value],
            inner: vec![1, kernel],
            disable_tp: false,
        });
        for tp in 1..=16u64 {
            if !key.is_multiple_of(tp) || !value.is_multiple_of(tp) {
                continue;
            }
            for rank in 0..tp {
                let r = Rank {
                    tp,
                    rank,
                    ep: false,
                };
                // The loader: param rows [boundary, boundary + take) from loaded rows
                // [loaded_boundary + rank·shard_size, …).
                let (mut boundary, mut loaded_boundary) = (0u64, 0u64);
                let mut want = vec![u64::MAX; ((2 * key + value) / tp * kernel) as usize];
                for full_dim in [key, key, value] {
                    let shard_size = full_dim / tp;
                    let start = loaded_boundary + rank * shard_size;
                    let take = shard_size.min(full_dim - rank * shard_size);
                    for o in 0..take {
                        for x in 0..kernel {
                            want[((boundary + o) * kernel + x) as usize] = (start + o) * kernel + x;
                        }
                    }
                    boundary += shard_size;
                    loaded_boundary += full_dim;
                }
                let got: Vec<u64> = sources(&g, r, true).into_iter().map(|(_, i)| i).collect();
                assert_eq!(got, want, "tp{tp} r{rank}");
            }
        }
    }
}
