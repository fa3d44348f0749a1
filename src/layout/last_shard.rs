//! The `last_shard` kind: a value each logical shard of a linear weight writes whole, the same
//! on every rank, where the one loaded last stays (compressed-tensors `weight_shape`, W8A8 INT8
//! `input_scale`).

use super::tensor_scale::logical_shards;
use super::types::{RankLayout, Shape, Slice, SlotKey};
use super::{Geometry, Kind, Rank, ShardId};

/// A value of `shape` each logical shard of the linear weight `of` writes whole, the same on
/// every rank: the one loaded last stays.
#[derive(Debug, Clone, PartialEq)]
pub struct LastShard {
    pub of: Box<Geometry>,
    pub shape: Vec<u64>,
}

impl Kind for LastShard {
    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        last_shard_source(&self.of, &self.shape, shard)
    }

    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        self.of.required()
    }

    fn rank_layout(&self, _: Rank, fused: bool) -> RankLayout {
        last_shard(&self.of, &self.shape, fused)
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
fn last_shard(of: &Geometry, shape: &[u64], fused: bool) -> RankLayout {
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
