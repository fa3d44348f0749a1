//! Slices the dense kinds share: a slot filled whole, the whole tensor on every rank and an
//! equal part each along one dimension (vLLM 0.33 `layers/linear.py`).

use super::types::{Rank, RankLayout, Slice};

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
