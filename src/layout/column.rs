//! The `column` kind: output rows split over the ranks (vLLM 0.33 `ColumnParallelLinear`).

use serde::Deserialize;

use super::dense::split;
use super::replicated::Replicated;
use super::types::{RankLayout, Shape, not_divisible, unstacked};
use super::{Eval, Geometry, Kind, Rank, ShardId, all, size};

/// Split along dim 0.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Column<D = u64> {
    pub shape: Vec<D>,
}

impl<D> Column<D> {
    pub(super) fn try_map<E, X>(&self, f: &mut Eval<D, E, X>) -> Result<Column<E>, X> {
        Ok(Column {
            shape: all(&self.shape, f)?,
        })
    }
}

impl Kind for Column {
    fn check(&self, r: Rank) -> Vec<String> {
        not_divisible("output size", self.shape[0], r.tp)
            .into_iter()
            .collect()
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        unstacked(&self.shape, shard)
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        split(&self.shape, 0, r)
    }

    fn fits(&self) -> Result<(), Vec<u64>> {
        size::shape(&self.shape)
    }

    fn whole(&self) -> Option<Geometry> {
        Some(
            Replicated {
                shape: self.shape.clone(),
            }
            .into(),
        )
    }

    #[cfg(test)]
    fn samples() -> Vec<Geometry> {
        vec![Column { shape: vec![64, 8] }.into()]
    }
}
