//! The `vocab` kind: vocabulary rows padded to a multiple of `padding` and split by TP, the
//! padding rows zero (vLLM 0.33 `layers/vocab_parallel_embedding.py`).

use serde::Deserialize;

use super::dense::whole_slot;
use super::types::{RankLayout, Shape, cat, not_divisible, unstacked};
use super::{Dim, Eval, Geometry, Kind, Rank, ShardId, all, size};

/// Vocabulary rows padded to a multiple of `padding` (64) and split by tp; padding rows are zero.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "D: Deserialize<'de>"))]
pub struct Vocab<D = u64> {
    pub vocab: D,
    #[serde(default)]
    pub inner: Vec<D>,
    #[serde(default = "default_padding")]
    pub padding: u64,
    /// vLLM's `disable_tp=True` (`VLLM_REPLICATE_EMBED`, layers/fused_embed_norm.py:39–71): the
    /// whole padded table on every rank, as at TP 1.
    #[serde(default)]
    pub disable_tp: bool,
}

fn default_padding() -> u64 {
    64
}

impl<D> Vocab<D> {
    pub(super) fn try_map<E, X>(&self, f: &mut Eval<D, E, X>) -> Result<Vocab<E>, X> {
        Ok(Vocab {
            vocab: f(&self.vocab, Dim::Size)?,
            inner: all(&self.inner, f)?,
            padding: self.padding,
            disable_tp: self.disable_tp,
        })
    }
}

impl Vocab {
    /// The evaluated layout, its padding at least 1 (a number in the mapping, not a dimension).
    pub(super) fn checked(self) -> Geometry {
        Vocab {
            padding: self.padding.max(1),
            ..self
        }
        .into()
    }
}

impl Kind for Vocab {
    fn check(&self, r: Rank) -> Vec<String> {
        if self.disable_tp {
            return Vec::new();
        }
        let (vocab, padding) = (self.vocab, self.padding);
        let padded = vocab.div_ceil(padding) * padding;
        not_divisible(
            &format!("padded vocab (vocab {vocab} padded to {padded})"),
            padded,
            r.tp,
        )
        .into_iter()
        .collect()
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        unstacked(&cat(self.vocab, &self.inner), shard)
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        let r = if self.disable_tp {
            Rank {
                tp: 1,
                rank: 0,
                ..r
            }
        } else {
            r
        };
        vocab_rows(self.vocab, &self.inner, self.padding, r)
    }

    fn whole(&self) -> Option<Geometry> {
        Some(
            Vocab {
                disable_tp: true,
                ..self.clone()
            }
            .into(),
        )
    }

    fn fits(&self) -> Result<(), Vec<u64>> {
        let padded = self.vocab.checked_next_multiple_of(self.padding);
        let all = [&[self.vocab], self.inner.as_slice()].concat();
        size::rows_of(padded, &self.inner, all)
    }

    #[cfg(test)]
    fn samples() -> Vec<Geometry> {
        vec![
            Vocab {
                vocab: 1003,
                inner: vec![2],
                padding: 64,
                disable_tp: false,
            }
            .into(),
            Vocab {
                vocab: 1003,
                inner: vec![2],
                padding: 64,
                disable_tp: true,
            }
            .into(),
        ]
    }
}

/// Vocab-parallel embedding rows: the vocab padded to a multiple of `padding`, an equal part
/// each; rows past the real vocab are zeros.
fn vocab_rows(vocab: u64, inner: &[u64], padding: u64, r: Rank) -> RankLayout {
    let padded = vocab.div_ceil(padding) * padding;
    let per = padded / r.tp;
    let out = cat(per, inner);
    let (a, b) = ((r.rank * per).min(vocab), ((r.rank + 1) * per).min(vocab));
    let row: u64 = inner.iter().product();
    let mut slices = Vec::new();
    let mut zeros = Vec::new();
    if b > a {
        slices.push(whole_slot(cat(vocab, inner), 0, a, b, out.clone()));
    }
    if per > b - a {
        zeros.push(((b - a) * row, (per - (b - a)) * row));
    }
    RankLayout::new(out, slices, zeros)
}
