//! The copies a layout makes besides its slices: those with a source element stride other than
//! 1 (transposed expert weights, repeated scales), and the ones among them that repeat expert by
//! expert.

use super::experts::gpt_oss_transposed;
use super::transposed::transposed_copies;
use super::types::{PerExpertCopies, Rank, Strided};
use super::{Block, Geometry, mxfp4, scales};

impl Geometry {
    /// Of [`Geometry::strided`], the copies that repeat expert by expert (expert block scales on
    /// vLLM's refined grid), as the rank's first expert's and the step to the next; the pieces
    /// phase keeps them compact. `None` for the others.
    pub fn strided_per_expert(&self, r: Rank) -> Option<PerExpertCopies> {
        match self {
            Geometry::ExpertBlockScale {
                part,
                experts,
                dims,
                block,
            } => scales::expert_block_refined(*part, *experts, *dims, *block, r),
            _ => None,
        }
    }

    /// Copies with a source element stride other than 1 that fill rank `r`'s tensor besides
    /// [`RankLayout::slices`], each with its slot and a description of the region it reads:
    /// gpt-oss's expert weights (transposed, from the whole checkpoint tensor) and expert block
    /// scales on vLLM's refined grid (each checkpoint scale repeated).
    pub fn strided(&self, r: Rank) -> Vec<Strided> {
        match self {
            Geometry::GptOssExperts {
                part,
                experts,
                intermediate,
                hidden,
            } => gpt_oss_transposed(*part, *experts, *intermediate, *hidden, r)
                .into_iter()
                .map(|(b, region)| ((None, None), b, region))
                .collect(),
            Geometry::ExpertBlockScale { .. } => self
                .strided_per_expert(r)
                .map(each_expert)
                .unwrap_or_default(),
            Geometry::TransposedExperts {
                part,
                experts,
                intermediate,
                hidden,
            } => transposed_copies(*part, *experts, *intermediate, *hidden, r)
                .into_iter()
                .map(|(b, region)| ((None, None), b, region))
                .collect(),
            Geometry::Mxfp4Experts { part, dims } => mxfp4::copies(*part, dims, r),
            _ => Vec::new(),
        }
    }
}

/// The copies of [`Geometry::strided_per_expert`] for every expert of the rank, one after the
/// other, each from its own slot.
pub(super) fn each_expert((each, pe): PerExpertCopies) -> Vec<Strided> {
    (0..pe.count)
        .flat_map(|j| {
            each.iter().map(move |((shard, _), b, region)| {
                let b = Block {
                    dst_start: b.dst_start + j * pe.dst_step,
                    ..*b
                };
                ((shard.clone(), Some(pe.first + j)), b, *region)
            })
        })
        .collect()
}
