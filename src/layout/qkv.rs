//! The `qkv` kind: q, k and v heads stacked on dim 0, the kv heads replicated when TP exceeds
//! them (vLLM 0.33 `QKVParallelLinear`).

use serde::Deserialize;

use super::merged_column::MergedColumn;
use super::types::{RankLayout, Shape, Slice, SlotKey, cat, name, not_divisible};
use super::{Eval, Geometry, Kind, Rank, ShardId, all, size};

/// q, k, v heads stacked on dim 0; kv heads replicated when tp ≥ kv heads.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "D: Deserialize<'de>"))]
pub struct Qkv<D = u64> {
    pub heads: D,
    pub kv_heads: D,
    pub head_dim: D,
    #[serde(default)]
    pub inner: Vec<D>,
}

impl<D> Qkv<D> {
    pub(super) fn try_map<E, X>(&self, f: &mut Eval<D, E, X>) -> Result<Qkv<E>, X> {
        Ok(Qkv {
            heads: f(&self.heads, super::Dim::Size)?,
            kv_heads: f(&self.kv_heads, super::Dim::Size)?,
            head_dim: f(&self.head_dim, super::Dim::Size)?,
            inner: all(&self.inner, f)?,
        })
    }
}

impl Kind for Qkv {
    fn check(&self, r: Rank) -> Vec<String> {
        let (tp, kv_heads) = (r.tp, self.kv_heads);
        let mut v: Vec<String> = not_divisible("attention heads", self.heads, tp)
            .into_iter()
            .collect();
        if kv_heads == 0 || (!kv_heads.is_multiple_of(tp) && !tp.is_multiple_of(kv_heads)) {
            v.push(format!(
                "kv heads ({kv_heads}) and tp ({tp}) must divide one another"
            ));
        }
        v
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        let Qkv {
            heads,
            kv_heads,
            head_dim,
            inner,
        } = self;
        match shard.map(ShardId::text).as_deref() {
            None => Ok(cat((heads + 2 * kv_heads) * head_dim, inner).into()),
            Some("q") => Ok(cat(heads * head_dim, inner).into()),
            Some("k") | Some("v") => Ok(cat(kv_heads * head_dim, inner).into()),
            Some(s) => Err(format!(
                "shard id for QKVParallelLinear should be 'q', 'k', or 'v', got shard id {s}"
            )),
        }
    }

    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        (
            ["q", "k", "v"].iter().map(|s| (name(s), None)).collect(),
            Some((None, None)),
        )
    }

    fn rank_layout(&self, r: Rank, fused: bool) -> RankLayout {
        qkv(
            [self.heads, self.kv_heads, self.head_dim],
            &self.inner,
            r,
            fused,
        )
    }

    fn fits(&self) -> Result<(), Vec<u64>> {
        let Qkv {
            heads,
            kv_heads,
            head_dim,
            inner,
        } = self;
        let heads_all = kv_heads.checked_mul(2).and_then(|k| k.checked_add(*heads));
        let all = [&[*heads, *kv_heads, *head_dim], inner.as_slice()].concat();
        let n =
            heads_all.and_then(|h| size::product(&[&[h, *head_dim], inner.as_slice()].concat()));
        size::within(n, all)
    }

    /// A fused qkv whole on every rank keeps its stored `[q; k; v]` rows.
    fn whole(&self) -> Option<Geometry> {
        let (heads, kv_heads, head_dim) = (self.heads, self.kv_heads, self.head_dim);
        Some(
            MergedColumn {
                sizes: vec![
                    heads.saturating_mul(head_dim),
                    kv_heads.saturating_mul(head_dim),
                    kv_heads.saturating_mul(head_dim),
                ],
                inner: self.inner.clone(),
                disable_tp: true,
            }
            .into(),
        )
    }

    #[cfg(test)]
    fn samples() -> Vec<Geometry> {
        vec![
            Qkv {
                heads: 8,
                kv_heads: 2,
                head_dim: 4,
                inner: vec![3],
            }
            .into(),
        ]
    }
}

/// q, k and v rows of this rank's heads; kv heads are replicated when `tp` exceeds them.
fn qkv([heads, kv_heads, head_dim]: [u64; 3], inner: &[u64], r: Rank, fused: bool) -> RankLayout {
    let (tp, rk) = (r.tp, r.rank);
    let q = heads / tp * head_dim;
    let (kv_local, replicas) = if tp >= kv_heads {
        (1, tp / kv_heads)
    } else {
        (kv_heads / tp, 1)
    };
    let k = kv_local * head_dim;
    let kr = rk / replicas;
    let out = cat(q + 2 * k, inner);
    let full = cat((heads + 2 * kv_heads) * head_dim, inner);
    let parts = [
        ("q", 0, rk * q, q, 0),
        ("k", heads * head_dim, kr * k, k, q),
        ("v", (heads + kv_heads) * head_dim, kr * k, k, q + k),
    ];
    let slices = parts
        .into_iter()
        .map(|(s, global, from, n, at)| {
            let (slot, src, off) = if fused {
                ((None, None), full.clone(), global)
            } else {
                let heads_here = if s == "q" { heads } else { kv_heads };
                ((name(s), None), cat(heads_here * head_dim, inner), 0)
            };
            Slice {
                slot,
                src_shape: src,
                dim: 0,
                from: off + from,
                to: off + from + n,
                dst_shape: out.clone(),
                dst_at: at,
                dst_base: 0,
            }
        })
        .collect();
    RankLayout::new(out, slices, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Geometry;

    #[test]
    fn kv_heads_are_replicated_when_tp_exceeds_them() {
        let g = Geometry::from(Qkv {
            heads: 8,
            kv_heads: 4,
            head_dim: 16,
            inner: vec![128],
        });
        let l = g.rank_layout(
            Rank {
                tp: 8,
                rank: 5,
                ep: false,
            },
            false,
        );
        assert_eq!(l.shape, vec![48, 128]);
        // rank 5 holds kv head 5 // 2 = 2
        assert_eq!((l.slices[1].from, l.slices[1].to), (32, 48));
    }
}
