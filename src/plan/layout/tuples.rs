//! A merged column whose shards the checkpoint fills partly as runs (vLLM's tuple shard ids,
//! `layers/linear.py` `MergedColumnParallelLinear.weight_loader`): Qwen3.5's GDN `in_proj_qkvz`
//! has the output sizes `[key, key, value, value]` (`layers/mamba/gdn/qwen_gdn_linear_attn.py:
//! 803–827`) and is filled by `in_proj_qkv` as shards `(0, 1, 2)` and `in_proj_z` as shard 3
//! (`models/qwen3_5.py:225–233`). vLLM cuts a tuple's tensor at its shards' offsets and slices
//! each shard by itself, so rank r holds `[q_r; k_r; v_r; z_r]`, exactly as if every shard came
//! alone.

use super::Rank;
use super::dense::cat;
use super::types::{RankLayout, Shape, Slice, SlotKey};
use crate::mapping::rules::ShardId;

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
pub(super) fn slots(n: usize, tuples: &[Vec<u64>]) -> Vec<SlotKey> {
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
pub(super) fn expected_source(
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
pub(super) fn rank_layout(
    sizes: &[u64],
    inner: &[u64],
    tuples: &[Vec<u64>],
    r: Rank,
) -> RankLayout {
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
