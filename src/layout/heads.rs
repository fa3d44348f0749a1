//! The `heads` kind: rows of whole heads, split as `qkv`'s kv rows (MiniMax-M2's TP-sharded q/k
//! norms, vLLM 0.33 `layers/minimax_rms_norm/rms_norm_tp.py`, `models/minimax_m2.py:215–233`).

use serde::Deserialize;

use super::dense::whole_slot;
use super::types::{RankLayout, Shape, cat, unstacked};
use super::{Dim, Eval, Kind, Rank, ShardId, all, size};

/// Rows of whole heads, split as the k rows of `qkv`: rank r holds heads `[r·n/tp, …)`, or
/// with tp > n head `r // (tp/n)`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "D: Deserialize<'de>"))]
pub struct Heads<D = u64> {
    pub heads: D,
    pub head_dim: D,
    #[serde(default)]
    pub inner: Vec<D>,
}

impl<D> Heads<D> {
    pub(super) fn try_map<E, X>(&self, f: &mut Eval<D, E, X>) -> Result<Heads<E>, X> {
        Ok(Heads {
            heads: f(&self.heads, Dim::Size)?,
            head_dim: f(&self.head_dim, Dim::Size)?,
            inner: all(&self.inner, f)?,
        })
    }
}

impl Kind for Heads {
    fn check(&self, r: Rank) -> Vec<String> {
        let (heads, tp) = (self.heads, r.tp);
        if heads == 0 || (!heads.is_multiple_of(tp) && !tp.is_multiple_of(heads)) {
            vec![format!(
                "heads ({heads}) and tp ({tp}) must divide one another"
            )]
        } else {
            vec![]
        }
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        unstacked(&cat(self.heads * self.head_dim, &self.inner), shard)
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        let (heads, head_dim, inner) = (self.heads, self.head_dim, &self.inner);
        let (a, b) = head_range(heads, r);
        let out = cat((b - a) * head_dim, inner);
        let slice = whole_slot(
            cat(heads * head_dim, inner),
            0,
            a * head_dim,
            b * head_dim,
            out.clone(),
        );
        RankLayout::new(out, vec![slice], Vec::new())
    }

    fn fits(&self) -> Result<(), Vec<u64>> {
        size::shape(&[&[self.heads, self.head_dim], self.inner.as_slice()].concat())
    }

    #[cfg(test)]
    fn samples() -> Vec<super::Geometry> {
        [(8, 2), (8, 8), (1, 1)]
            .map(|(heads, head_dim)| {
                Heads {
                    heads,
                    head_dim,
                    inner: vec![2],
                }
                .into()
            })
            .to_vec()
    }
}

/// Rank `r`'s heads of `heads`: `[r·n/tp, …)` when tp ≤ n, else head `r // (tp/n)` (the kv
/// head map of `QKVParallelLinear`, which MiniMax-M2 gives its k_norm through
/// `weight_shard_world_size = n`, `weight_shard_rank = r // (tp/n)`).
fn head_range(heads: u64, r: Rank) -> (u64, u64) {
    if r.tp >= heads {
        let h = r.rank / (r.tp / heads);
        (h, h + 1)
    } else {
        let per = heads / r.tp;
        (r.rank * per, (r.rank + 1) * per)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Geometry;
    use crate::layout::Qkv;
    use crate::layout::tests::rank_values;

    /// MiniMaxText01RMSNormTP over TP 1–16: the q norm `[nh·hd]` is slice r of `tp`; the k norm
    /// is slice r of `tp` when tp ≤ nkv, else slice `r // (tp/nkv)` of `nkv` (one head), so every
    /// rank holds the norm of exactly the k heads its `qkv_proj` rows hold.
    #[test]
    fn head_rows_follow_the_tp_norm_over_tp_1_to_16() {
        let hd = 4u64;
        for (nh, nkv) in [(16u64, 4u64), (16, 1), (16, 16), (16, 8)] {
            for tp in 1..=16u64 {
                if !nh.is_multiple_of(tp) || !(nkv.is_multiple_of(tp) || tp.is_multiple_of(nkv)) {
                    continue;
                }
                for rank in 0..tp {
                    let r = Rank {
                        tp,
                        rank,
                        ep: false,
                    };
                    let q = Geometry::Heads(Heads {
                        heads: nh,
                        head_dim: hd,
                        inner: vec![],
                    });
                    let (shape, got) = rank_values(&q, r);
                    let per = nh * hd / tp;
                    assert_eq!(shape, vec![per]);
                    let want: Vec<i64> = (rank * per..(rank + 1) * per).map(|x| x as i64).collect();
                    assert_eq!(got, want, "q nh{nh} tp{tp} r{rank}");
                    let k = Geometry::Heads(Heads {
                        heads: nkv,
                        head_dim: hd,
                        inner: vec![],
                    });
                    let (world, srank) = if tp <= nkv {
                        (tp, rank)
                    } else {
                        (nkv, rank / (tp / nkv))
                    };
                    let per = nkv * hd / world;
                    let want: Vec<i64> =
                        (srank * per..(srank + 1) * per).map(|x| x as i64).collect();
                    assert_eq!(rank_values(&k, r).1, want, "k nkv{nkv} tp{tp} r{rank}");
                    // The same heads as the k rows of qkv_proj.
                    let qkv = Geometry::Qkv(Qkv {
                        heads: nh,
                        kv_heads: nkv,
                        head_dim: hd,
                        inner: vec![],
                    });
                    let ks = &qkv.rank_layout(r, false).slices[1];
                    assert_eq!((ks.from, ks.to), (want[0] as u64, want[0] as u64 + per));
                }
            }
        }
        let g = Geometry::Heads(Heads {
            heads: 4,
            head_dim: 2,
            inner: vec![],
        });
        let r = Rank {
            tp: 3,
            rank: 0,
            ep: false,
        };
        assert_eq!(g.check(r), ["heads (4) and tp (3) must divide one another"]);
    }
}
