//! The dense layouts' geometry: replicated, column- and row-parallel, merged column (gate/up), qkv
//! and vocab-parallel rows (vLLM 0.33 `layers/linear.py`, `layers/vocab_parallel_embedding.py`).

use super::types::{Rank, RankLayout, Slice, name};
use crate::mapping::rules::ShardId;

/// `[lead, inner...]`.
pub(super) fn cat(lead: u64, inner: &[u64]) -> Vec<u64> {
    let mut s = vec![lead];
    s.extend_from_slice(inner);
    s
}

/// A slice of the slot filled whole: `src_shape[dim]` narrowed to `from..to`, written at
/// `dst_at` along `dim` of `dst_shape`.
pub(super) fn whole_slot(
    src_shape: Vec<u64>,
    dim: usize,
    from: u64,
    to: u64,
    dst_shape: Vec<u64>,
) -> Slice {
    Slice {
        slot: (None, None),
        src_shape,
        dim,
        from,
        to,
        dst_shape,
        dst_at: 0,
        dst_base: 0,
    }
}

fn only(shape: Vec<u64>, slice: Slice) -> RankLayout {
    RankLayout::new(shape, vec![slice], Vec::new())
}

/// Every rank holds the whole tensor.
pub(super) fn replicated(shape: &[u64]) -> RankLayout {
    let slice = if shape.is_empty() {
        // A 0-d tensor: one element, expressed on a 1-element view.
        whole_slot(vec![1], 0, 0, 1, vec![1])
    } else {
        whole_slot(shape.to_vec(), 0, 0, shape[0], shape.to_vec())
    };
    only(shape.to_vec(), slice)
}

/// Column (`dim` 0: output rows) or row (`dim` 1: input columns) parallel: an equal part each.
pub(super) fn split(shape: &[u64], dim: usize, r: Rank) -> RankLayout {
    let n = shape[dim] / r.tp;
    let mut out = shape.to_vec();
    out[dim] = n;
    let slice = whole_slot(
        shape.to_vec(),
        dim,
        r.rank * n,
        (r.rank + 1) * n,
        out.clone(),
    );
    only(out, slice)
}

/// Stacked column-parallel parts (gate/up): each rank holds its rows of every part, in order.
pub(super) fn merged_column(sizes: &[u64], inner: &[u64], r: Rank, fused: bool) -> RankLayout {
    let (tp, rk) = (r.tp, r.rank);
    let total: u64 = sizes.iter().map(|s| s / tp).sum();
    let out = cat(total, inner);
    let mut slices = Vec::new();
    let mut at = 0;
    let mut global = 0;
    for (k, s) in sizes.iter().enumerate() {
        let n = s / tp;
        let (slot, src, off) = if fused {
            ((None, None), cat(sizes.iter().sum(), inner), global)
        } else {
            ((Some(ShardId::Index(k as u64)), None), cat(*s, inner), 0)
        };
        slices.push(Slice {
            slot,
            src_shape: src,
            dim: 0,
            from: off + rk * n,
            to: off + (rk + 1) * n,
            dst_shape: out.clone(),
            dst_at: at,
            dst_base: 0,
        });
        at += n;
        global += s;
    }
    RankLayout::new(out, slices, Vec::new())
}

/// q, k and v rows of this rank's heads; kv heads are replicated when `tp` exceeds them.
pub(super) fn qkv(
    [heads, kv_heads, head_dim]: [u64; 3],
    inner: &[u64],
    r: Rank,
    fused: bool,
) -> RankLayout {
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

/// Vocab-parallel embedding rows: the vocab padded to a multiple of `padding`, an equal part
/// each; rows past the real vocab are zeros.
pub(super) fn vocab_rows(vocab: u64, inner: &[u64], padding: u64, r: Rank) -> RankLayout {
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

#[cfg(test)]
mod tests {
    use super::super::Geometry;
    use super::*;

    #[test]
    fn kv_heads_are_replicated_when_tp_exceeds_them() {
        let g = Geometry::Qkv {
            heads: 8,
            kv_heads: 4,
            head_dim: 16,
            inner: vec![128],
        };
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
