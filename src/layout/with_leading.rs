//! The `with_leading` kind: a layout behind leading dimensions that are never split. GPTQ and
//! AWQ store a linear weight input-major (`qweight [K/8, N]`), so its output parts are split on
//! the last dim.

use super::types::{RankLayout, Shape, Slice, SlotKey};
use super::{Geometry, Kind, Rank, ShardId};

/// `of`'s layout behind the dimensions `leading`: each slice of `of` taken for every index of
/// `leading`.
#[derive(Debug, Clone, PartialEq)]
pub struct WithLeading {
    pub leading: Vec<u64>,
    pub of: Box<Geometry>,
}

impl Kind for WithLeading {
    fn check(&self, r: Rank) -> Vec<String> {
        self.of.check(r)
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        self.of.expected_source(shard).map(|s| {
            let mut out = Shape::from_slice(&self.leading);
            out.extend_from_slice(&s);
            out
        })
    }

    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        self.of.required()
    }

    fn rank_layout(&self, r: Rank, fused: bool) -> RankLayout {
        with_leading(&self.leading, self.of.rank_layout(r, fused))
    }

    #[cfg(test)]
    fn samples() -> Vec<Geometry> {
        use super::{MergedColumn, Qkv};
        vec![
            WithLeading {
                leading: vec![3],
                of: Box::new(
                    Qkv {
                        heads: 8,
                        kv_heads: 2,
                        head_dim: 4,
                        inner: vec![],
                    }
                    .into(),
                ),
            }
            .into(),
            WithLeading {
                leading: vec![2],
                of: Box::new(
                    MergedColumn {
                        sizes: vec![16, 32],
                        inner: vec![],
                        disable_tp: false,
                    }
                    .into(),
                ),
            }
            .into(),
        ]
    }
}

/// `inner` (a layout without per-expert repeats or zero ranges) behind the dimensions `leading`.
fn with_leading(leading: &[u64], inner: RankLayout) -> RankLayout {
    debug_assert!(
        inner.per_expert.is_none() && inner.zeros.is_empty() && inner.zero_rows.is_empty()
    );
    let prepend = |s: &[u64]| leading.iter().chain(s).copied().collect::<Vec<u64>>();
    let slices = (inner.slices.iter())
        .map(|s| Slice {
            src_shape: prepend(&s.src_shape),
            dim: s.dim + leading.len(),
            dst_shape: prepend(&s.dst_shape),
            ..s.clone()
        })
        .collect();
    RankLayout::new(prepend(&inner.shape), slices, Vec::new())
}
