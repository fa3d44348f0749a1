//! The `tensor_scale` kind: a linear layer's per-tensor scales, one F32 per logical shard of the
//! weight, the same on every rank (vLLM 0.33 `parameter.py` `PerTensorScaleParameter`).

use super::types::{RankLayout, Shape, Slice, SlotKey, name};
use super::{Geometry, Kind, Rank, ShardId};
use super::{MergedColumn, MergedTuples, Qkv};

/// A linear layer's per-tensor scales: one F32 per logical shard of the weight `of`, the same
/// on every rank.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorScale {
    pub of: Box<Geometry>,
}

impl Kind for TensorScale {
    /// A scalar per slot; the shard id must be one the weight takes.
    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        self.of.expected_source(shard).map(|_| Shape::new())
    }

    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        self.of.required()
    }

    fn rank_layout(&self, _: Rank, fused: bool) -> RankLayout {
        tensor_scale(&self.of, fused)
    }
}

/// The logical shards of a linear weight, as slot keys (qkv: q, k, v; merged: 0, 1, …; else one).
pub(super) fn logical_shards(of: &Geometry) -> Vec<SlotKey> {
    match of {
        Geometry::Qkv(Qkv { .. }) => ["q", "k", "v"].iter().map(|s| (name(s), None)).collect(),
        Geometry::MergedColumn(MergedColumn { sizes, .. }) => (0..sizes.len() as u64)
            .map(|k| (Some(ShardId::Index(k)), None))
            .collect(),
        // A tuple's one checkpoint scale fills each of its shards' slots (the
        // `PerTensorScaleParameter` tuple branch, `linear.py:926–933`): Qwen3.5's NVFP4
        // `in_proj_qkvz` `[s_qkv, s_qkv, s_qkv, s_z]`.
        Geometry::MergedTuples(MergedTuples { sizes, tuples, .. }) => (0..sizes.len() as u64)
            .map(|k| match tuples.iter().find(|t| t.contains(&k)) {
                Some(t) => (Some(ShardId::Tuple(t.clone())), None),
                None => (Some(ShardId::Index(k)), None),
            })
            .collect(),
        _ => vec![(None, None)],
    }
}

/// Per-tensor scales: `[shards]` F32, the same on every rank; a fused checkpoint tensor's single
/// scale goes into every slot.
fn tensor_scale(of: &Geometry, fused: bool) -> RankLayout {
    let slots = logical_shards(of);
    let n = slots.len() as u64;
    let slices = slots
        .into_iter()
        .enumerate()
        .map(|(k, slot)| Slice {
            slot: if fused { (None, None) } else { slot },
            src_shape: vec![1],
            dim: 0,
            from: 0,
            to: 1,
            dst_shape: vec![n],
            dst_at: k as u64,
            dst_base: 0,
        })
        .collect();
    RankLayout::new(vec![n], slices, Vec::new())
}
