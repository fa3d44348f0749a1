//! The `expert_tensor_scale` kind: per-tensor scales of fused experts (vLLM 0.33
//! `fused_moe/routed_experts.py`), one F32 per expert and shard.

use super::experts::check_shard;
use super::types::{ExpertPart, RankLayout, Shape, Slice, SlotKey, name};
use super::{Kind, Rank, ShardId};

/// Per-tensor scales of fused experts (`w13` `[E_loc, 2]`, or `[E_loc]` for `input`; `w2`
/// `[E_loc]`); with `global`, every expert's on every rank (`[E, 2]`, `[E]`), by global id.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertTensorScale {
    pub part: ExpertPart,
    pub experts: u64,
    pub input: bool,
    /// Sized for all the model's experts whatever the rank holds: NVFP4 input scales on
    /// FlashInfer backends (`use_global_sf`), which the loader fills by global expert id for
    /// every expert on every rank (`fused_moe/routed_experts.py:730-735, 831-861`).
    pub global: bool,
}

impl Kind for ExpertTensorScale {
    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        check_shard(self.part, shard).map(|()| Shape::new())
    }

    /// Per expert only: a stacked tensor is the unquantized weight's alternative.
    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        (self.part.slots(self.experts), None)
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        expert_tensor_scale(self, r)
    }

    fn expert_count(&self) -> Option<u64> {
        Some(self.experts)
    }
}

/// Per-tensor expert scales: `w13` `[E_loc, 2]` (w1, w3), or with `input` one slot per expert
/// that w1 and w3 both write (the later-loaded wins: see pieces.rs); `w2` `[E_loc]`.
fn expert_tensor_scale(k: &ExpertTensorScale, r: Rank) -> RankLayout {
    let (part, experts, input) = (k.part, k.experts, k.input);
    let local = if k.global {
        0..experts
    } else {
        r.experts(experts).local
    };
    let e_loc = local.end - local.start;
    let (shards, width): (&[&str], u64) = match (part, input) {
        (ExpertPart::W13, false) => (&["w1", "w3"], 2),
        (ExpertPart::W13, true) => (&["w1", "w3"], 1),
        (ExpertPart::W2, _) => (&["w2"], 1),
    };
    let first = Some(local.start);
    let slices = shards
        .iter()
        .enumerate()
        .map(|(h, s)| Slice {
            slot: (name(s), first),
            src_shape: vec![1],
            dim: 0,
            from: 0,
            to: 1,
            dst_shape: vec![1],
            dst_at: 0,
            dst_base: if width == 2 { h as u64 } else { 0 },
        })
        .collect();
    let shape = if width == 2 {
        vec![e_loc, 2]
    } else {
        vec![e_loc]
    };
    RankLayout::per_expert(shape, local, width, slices)
}
