//! The `row` kind: input columns split over the ranks (vLLM 0.33 `RowParallelLinear`).

use serde::Deserialize;

use super::dense::split;
use super::replicated::Replicated;
use super::types::{RankLayout, Shape, not_divisible, unstacked};
use super::{Eval, Geometry, Kind, Rank, ShardId, all, size};

/// Split along dim 1 (of a 2-D shape).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Row<D = u64> {
    pub shape: Vec<D>,
}

impl<D> Row<D> {
    pub(super) fn try_map<E, X>(&self, f: &mut Eval<D, E, X>) -> Result<Row<E>, X> {
        Ok(Row {
            shape: all(&self.shape, f)?,
        })
    }
}

impl Row {
    /// The evaluated layout, refused unless 2-D.
    pub(super) fn checked(self) -> Result<Geometry, String> {
        if self.shape.len() != 2 {
            return Err("a row-parallel parameter needs a 2-D shape".into());
        }
        Ok(self.into())
    }
}

impl Kind for Row {
    fn check(&self, r: Rank) -> Vec<String> {
        not_divisible("input size", self.shape[1], r.tp)
            .into_iter()
            .collect()
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        unstacked(&self.shape, shard)
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        split(&self.shape, 1, r)
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
        vec![Row { shape: vec![8, 64] }.into()]
    }
}
