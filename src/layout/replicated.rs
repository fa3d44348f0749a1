//! The `replicated` kind: the whole tensor on every rank (norms, routers, a row-parallel layer's
//! bias; vLLM 0.33 `ReplicatedLinear`).

use serde::Deserialize;

use super::dense::replicated;
use super::types::{RankLayout, Shape, unstacked};
use super::{Eval, Kind, Rank, ShardId, all, size};

/// Full copy on every rank.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Replicated<D = u64> {
    pub shape: Vec<D>,
}

impl<D> Replicated<D> {
    pub(super) fn try_map<E, X>(&self, f: &mut Eval<D, E, X>) -> Result<Replicated<E>, X> {
        Ok(Replicated {
            shape: all(&self.shape, f)?,
        })
    }
}

impl Kind for Replicated {
    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        unstacked(&self.shape, shard)
    }

    fn rank_layout(&self, _: Rank, _: bool) -> RankLayout {
        replicated(&self.shape)
    }

    fn fits(&self) -> Result<(), Vec<u64>> {
        size::shape(&self.shape)
    }

    #[cfg(test)]
    fn samples() -> Vec<super::Geometry> {
        vec![Replicated { shape: vec![5] }.into()]
    }
}
