//! Parameters filled with whole small values rather than slices of a weight: a value every
//! shard of a fused layer writes in full, where the one loaded last stays (compressed-tensors
//! `weight_shape`, W8A8 INT8 `input_scale`), and the per-kv-head cache scales of
//! `CompressedTensorsKVCacheMethod`'s `attn_head` strategy (compressed_tensors.py:1187–1226).

use super::Geometry;
use super::scales::logical_shards;
use super::types::{RankLayout, Shape, Slice, SlotKey, name};
use crate::layout::Rank;
use crate::mapping::ExpertPart;
use crate::mapping::rules::ShardId;

/// Which of an Attention layer's cache scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvScale {
    K,
    V,
    /// Reduced by amax over each GQA group of query heads to one value per kv head.
    Q,
}

/// The checkpoint shape each shard of these geometries needs ([`Geometry::expected_source`]).
pub(super) fn expected_source(g: &Geometry, shard: Option<&ShardId>) -> Result<Shape, String> {
    match g {
        Geometry::LastShard { of, shape } => last_shard_source(of, shape, shard),
        Geometry::ExpertLastShard { part, width, .. } => Geometry::Experts {
            part: *part,
            experts: 0,
            intermediate: 0,
            hidden: 0,
        }
        .expected_source(shard)
        .map(|_| Shape::from_slice(&[*width])),
        Geometry::KvHeadScale {
            heads,
            kv_heads,
            which,
        } => match shard {
            None => Ok(kv_scale_source(*heads, *kv_heads, *which)),
            Some(s) => Err(format!(
                "shard id {s} given to a parameter that is not stacked"
            )),
        },
        other => Err(format!("{other:?} is not a whole-value layout")),
    }
}

/// The shape a checkpoint tensor of a last-shard value has: a one-element value takes any
/// one-element tensor (0-d or `[1]`), as the assign phase reads an empty shape.
fn last_shard_source(
    of: &Geometry,
    shape: &[u64],
    shard: Option<&ShardId>,
) -> Result<Shape, String> {
    of.expected_source(shard)?;
    Ok(if shape.iter().product::<u64>() == 1 {
        Shape::new()
    } else {
        Shape::from_slice(shape)
    })
}

/// Every shard's value written whole at the start of the rank's tensor: the build phase keeps
/// the one loaded last (`keep_last_loaded`).
pub(super) fn last_shard(of: &Geometry, shape: &[u64], fused: bool) -> RankLayout {
    let slots: Vec<SlotKey> = if fused {
        vec![(None, None)]
    } else {
        logical_shards(of)
    };
    let whole = |slot: SlotKey| Slice {
        slot,
        src_shape: shape.to_vec(),
        dim: 0,
        from: 0,
        to: shape.first().copied().unwrap_or(1),
        dst_shape: shape.to_vec(),
        dst_at: 0,
        dst_base: 0,
    };
    RankLayout::new(
        shape.to_vec(),
        slots.into_iter().map(whole).collect(),
        vec![],
    )
}

/// Per expert of rank `r`, each shard's `[width]` value written whole at the expert's row.
pub(super) fn expert_last_shard(part: ExpertPart, experts: u64, width: u64, r: Rank) -> RankLayout {
    let (local, _, _) = super::scales::expert_split(experts, r);
    let shards: &[&'static str] = match part {
        ExpertPart::W13 => &["w1", "w3"],
        ExpertPart::W2 => &["w2"],
    };
    let slices = (shards.iter())
        .map(|s| Slice {
            slot: (name(s), Some(local.start)),
            src_shape: vec![width],
            dim: 0,
            from: 0,
            to: width,
            dst_shape: vec![width],
            dst_at: 0,
            dst_base: 0,
        })
        .collect();
    let shape = vec![local.end - local.start, width];
    RankLayout::per_expert(shape, local, width, slices)
}

/// The kv heads rank `r` holds, as vLLM's `_tp_aware_loader` picks them: its share when there
/// are at least as many kv heads as ranks, otherwise kv head `r / (tp / kv_heads)`.
pub(super) fn kv_heads_of(kv_heads: u64, r: Rank) -> (u64, u64) {
    if r.tp >= kv_heads {
        let replicas = (r.tp / kv_heads.max(1)).max(1);
        let h = r.rank / replicas;
        (h, h + 1)
    } else {
        let n = kv_heads / r.tp;
        (r.rank * n, (r.rank + 1) * n)
    }
}

/// The checkpoint's `[heads, 1, 1]` (q) or `[kv_heads, 1, 1]` (k, v) scale.
fn kv_scale_source(heads: u64, kv_heads: u64, which: KvScale) -> Shape {
    let n = if which == KvScale::Q { heads } else { kv_heads };
    Shape::from_slice(&[n, 1, 1])
}

/// Rank `r`'s `[n_kv]` scales: its kv heads' k or v scales, or the q scales of those heads'
/// query groups, each group reduced to its maximum (the slice's `max_of`).
pub(super) fn kv_scale(heads: u64, kv_heads: u64, which: KvScale, r: Rank) -> (RankLayout, u64) {
    let (a, b) = kv_heads_of(kv_heads, r);
    let group = if which == KvScale::Q {
        (heads / kv_heads.max(1)).max(1)
    } else {
        1
    };
    let src = kv_scale_source(heads, kv_heads, which).to_vec();
    let slice = Slice {
        slot: (None, None),
        src_shape: src,
        dim: 0,
        from: a * group,
        to: b * group,
        dst_shape: vec![(b - a) * group, 1, 1],
        dst_at: 0,
        dst_base: 0,
    };
    (RankLayout::new(vec![b - a], vec![slice], vec![]), group)
}
