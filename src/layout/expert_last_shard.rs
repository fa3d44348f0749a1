//! The `expert_last_shard` kind: a `[E_loc, width]` value per expert that each of its shards
//! writes whole, where the one loaded last stays (pack-quantized experts' `weight_shape`).

use super::experts::check_shard;
use super::types::{ExpertPart, RankLayout, Shape, Slice, SlotKey, name};
use super::{Kind, Rank, ShardId};

/// A `[E_loc, width]` value per expert that each of its shards (w1 and w3, or w2) writes
/// whole: the one loaded last stays.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertLastShard {
    pub part: ExpertPart,
    pub experts: u64,
    pub width: u64,
}

impl Kind for ExpertLastShard {
    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        check_shard(self.part, shard).map(|()| Shape::from_slice(&[self.width]))
    }

    /// Per expert only: a stacked tensor is the unquantized weight's alternative.
    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        (self.part.slots(self.experts), None)
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        expert_last_shard(self.part, self.experts, self.width, r)
    }

    fn expert_count(&self) -> Option<u64> {
        Some(self.experts)
    }
}

/// Per expert of rank `r`, each shard's `[width]` value written whole at the expert's row.
fn expert_last_shard(part: ExpertPart, experts: u64, width: u64, r: Rank) -> RankLayout {
    let local = r.experts(experts).local;
    let slices = (part.shards().iter())
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
