//! The `kv_head_scale` kind: an Attention layer's per-kv-head cache scales, the `attn_head`
//! strategy of `CompressedTensorsKVCacheMethod` (vLLM 0.33 compressed_tensors.py:1187–1226): the
//! rank's kv heads, q reduced by amax over each query group.

use super::types::{RankLayout, Shape, Slice, unstacked};
use super::{Kind, Rank, ShardId};

/// Which of an Attention layer's cache scales.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvScale {
    K,
    V,
    /// Reduced by amax over each GQA group of query heads to one value per kv head.
    Q,
}

/// An Attention layer's per-kv-head cache scale: the rank's kv heads, q reduced by amax over
/// each query group.
#[derive(Debug, Clone, PartialEq)]
pub struct KvHeadScale {
    pub heads: u64,
    pub kv_heads: u64,
    pub which: KvScale,
}

impl Kind for KvHeadScale {
    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        unstacked(
            &kv_scale_source(self.heads, self.kv_heads, self.which),
            shard,
        )
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        kv_scale(self.heads, self.kv_heads, self.which, r).0
    }

    /// The q scales' query groups, each reduced to its maximum.
    fn max_of(&self, r: Rank) -> u64 {
        kv_scale(self.heads, self.kv_heads, self.which, r).1
    }
}

/// The kv heads rank `r` holds, as vLLM's `_tp_aware_loader` picks them: its share when there
/// are at least as many kv heads as ranks, otherwise kv head `r / (tp / kv_heads)`.
fn kv_heads_of(kv_heads: u64, r: Rank) -> (u64, u64) {
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
fn kv_scale(heads: u64, kv_heads: u64, which: KvScale, r: Rank) -> (RankLayout, u64) {
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
