//! The `merged_column` kind: several column-parallel outputs stacked on dim 0, each split by TP
//! (vLLM 0.33 `MergedColumnParallelLinear`: gate/up), and the YAML form that also names the
//! runs of shards a checkpoint fills with one tensor ([`MergedTuples`]).

use serde::Deserialize;

use super::merged_tuples::MergedTuples;
use super::types::{RankLayout, Shape, SlotKey, cat, merged_column, not_divisible};
use super::{Eval, Geometry, Kind, Rank, ShardId, all, size};

/// Stacked column-parallel outputs of `sizes` rows, each row `inner`; with `disable_tp` whole
/// on every rank (vLLM's `disable_tp=True`: DeepSeek's fused_qkv_a_proj).
#[derive(Debug, Clone, PartialEq)]
pub struct MergedColumn {
    pub sizes: Vec<u64>,
    pub inner: Vec<u64>,
    /// Whole on every rank (vLLM's `disable_tp=True`).
    pub disable_tp: bool,
}

/// A mapping's `merged_column`: a [`MergedColumn`], or with `tuples` a [`MergedTuples`].
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "D: Deserialize<'de>"))]
pub struct MergedColumnSpec<D> {
    pub sizes: Vec<D>,
    #[serde(default)]
    pub inner: Vec<D>,
    #[serde(default)]
    pub disable_tp: bool,
    /// Runs of consecutive shards the checkpoint fills with one tensor each (vLLM's tuple
    /// shard ids: Qwen3.5's `in_proj_qkv` fills `[0, 1, 2]` of `in_proj_qkvz`); every shard
    /// still TP-sliced by itself.
    #[serde(default)]
    pub tuples: Vec<Vec<u64>>,
}

impl<D> MergedColumnSpec<D> {
    pub(super) fn try_map<E, X>(&self, f: &mut Eval<D, E, X>) -> Result<MergedColumnSpec<E>, X> {
        Ok(MergedColumnSpec {
            sizes: all(&self.sizes, f)?,
            inner: all(&self.inner, f)?,
            disable_tp: self.disable_tp,
            tuples: self.tuples.clone(),
        })
    }
}

impl MergedColumnSpec<u64> {
    /// [`MergedTuples`] when the mapping lists tuples (each a run of at least two consecutive
    /// shards, ascending: vLLM cuts the tensor at the shards' offsets in that order), else a
    /// plain merged column.
    pub(super) fn into_geometry(self) -> Result<Geometry, String> {
        let MergedColumnSpec {
            sizes,
            inner,
            disable_tp,
            tuples,
        } = self;
        if tuples.is_empty() {
            return Ok(MergedColumn {
                sizes,
                inner,
                disable_tp,
            }
            .into());
        }
        if disable_tp {
            return Err("`tuples` and `disable_tp` do not go together".into());
        }
        let ok = |t: &[u64]| {
            t.len() >= 2
                && t.windows(2).all(|w| w[1] == w[0] + 1)
                && t.last().is_some_and(|&k| (k as usize) < sizes.len())
        };
        if let Some(bad) = tuples.iter().find(|t| !ok(t)) {
            return Err(format!(
                "tuple {bad:?} is not a run of consecutive shards among {}",
                sizes.len()
            ));
        }
        Ok(MergedTuples {
            sizes,
            inner,
            tuples,
        }
        .into())
    }
}

impl Kind for MergedColumn {
    fn check(&self, r: Rank) -> Vec<String> {
        if self.disable_tp {
            return vec![];
        }
        (self.sizes.iter())
            .filter_map(|s| not_divisible("merged output size", *s, r.tp))
            .collect()
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        let (sizes, inner) = (&self.sizes, &self.inner);
        match shard {
            None => Ok(cat(sizes.iter().sum(), inner).into()),
            Some(ShardId::Index(k)) if (*k as usize) < sizes.len() => {
                Ok(cat(sizes[*k as usize], inner).into())
            }
            Some(s) => Err(format!(
                "shard id should be between 0 and {}, got {s}",
                sizes.len() - 1
            )),
        }
    }

    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        (
            (0..self.sizes.len() as u64)
                .map(|k| (Some(ShardId::Index(k)), None))
                .collect(),
            Some((None, None)),
        )
    }

    fn rank_layout(&self, r: Rank, fused: bool) -> RankLayout {
        merged_column(
            &self.sizes,
            &self.inner,
            r.without_tp_if(self.disable_tp),
            fused,
        )
    }

    fn fits(&self) -> Result<(), Vec<u64>> {
        let all = [self.sizes.as_slice(), &self.inner].concat();
        size::rows_of(size::sum(&self.sizes), &self.inner, all)
    }

    fn whole(&self) -> Option<Geometry> {
        Some(
            MergedColumn {
                disable_tp: true,
                ..self.clone()
            }
            .into(),
        )
    }

    #[cfg(test)]
    fn samples() -> Vec<Geometry> {
        vec![
            MergedColumn {
                sizes: vec![32, 32],
                inner: vec![4],
                disable_tp: false,
            }
            .into(),
            // Whole on every rank.
            MergedColumn {
                sizes: vec![24, 40],
                inner: vec![4],
                disable_tp: true,
            }
            .into(),
        ]
    }
}
