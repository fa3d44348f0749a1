//! The `mamba_split` kind: a Mamba2 mixer's fused `in_proj` (`[z; x; B; C; dt]`) and `conv1d`
//! (`[x; B; C]`), stored fused on disk and cut at the parts' global offsets (vLLM 0.33
//! `MambaMixer2`, layers/mamba/mamba_mixer2.py:202–260, 330–468). When TP divides the group
//! count, each part is TP-sliced (a `MergedColumnParallelLinear`); when there is one group and
//! more ranks, the mamba-v2 loader gives every rank the single group's B and C whole
//! (`duplicate_groups`) beside its slices of the other parts. Any other group count vLLM refuses
//! (`n_groups % tp == 0 or n_groups == 1`, mamba_mixer2.py:320).

use serde::Deserialize;

#[cfg(test)]
use super::Geometry;
use super::types::{RankLayout, Shape, Slice, cat, not_divisible, unstacked};
use super::{Eval, Kind, Rank, ShardId, all, size};

/// Parts of `sizes` rows, each row `inner`, stacked on dim 0; the parts listed in `groups` are
/// the SSM groups' B and C, `n_groups` groups wide.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, bound(deserialize = "D: Deserialize<'de>"))]
pub struct MambaSplit<D = u64> {
    pub sizes: Vec<D>,
    /// Indices into `sizes` of the group parts (B, C), written as numbers.
    pub groups: Vec<u64>,
    pub n_groups: D,
    #[serde(default)]
    pub inner: Vec<D>,
}

impl<D> MambaSplit<D> {
    pub(super) fn try_map<E, X>(&self, f: &mut Eval<D, E, X>) -> Result<MambaSplit<E>, X> {
        Ok(MambaSplit {
            sizes: all(&self.sizes, f)?,
            groups: self.groups.clone(),
            n_groups: f(&self.n_groups, super::Dim::Size)?,
            inner: all(&self.inner, f)?,
        })
    }
}

impl MambaSplit {
    /// Whether rank `r` holds the group parts whole (one group, replicated to follow the head
    /// shards) rather than its slice of them.
    fn duplicated(&self, r: Rank) -> bool {
        !self.n_groups.is_multiple_of(r.tp)
    }

    /// The rows of part `k` (of `s` rows) that each rank holds.
    fn share(&self, k: usize, s: u64, r: Rank) -> u64 {
        if self.duplicated(r) && self.groups.contains(&(k as u64)) {
            s
        } else {
            s / r.tp
        }
    }
}

impl Kind for MambaSplit {
    fn check(&self, r: Rank) -> Vec<String> {
        if self.duplicated(r) && self.n_groups != 1 {
            return vec![
                "If tensor parallel world size does not divide num_groups, then num_groups must equal 1."
                    .into(),
            ];
        }
        (self.sizes.iter().enumerate())
            .filter(|(k, _)| !self.duplicated(r) || !self.groups.contains(&(*k as u64)))
            .filter_map(|(_, s)| not_divisible("mamba output size", *s, r.tp))
            .collect()
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        unstacked(&cat(self.sizes.iter().sum(), &self.inner), shard)
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        let src = cat(self.sizes.iter().sum(), &self.inner);
        let total = (self.sizes.iter().enumerate())
            .map(|(k, s)| self.share(k, *s, r))
            .sum();
        let out = cat(total, &self.inner);
        let (mut at, mut global, mut slices) = (0, 0, Vec::new());
        for (k, &s) in self.sizes.iter().enumerate() {
            let n = self.share(k, s, r);
            // A whole group part is the same rows on every rank (vLLM's `rank = 0`).
            let from = global + if n == s { 0 } else { r.rank * n };
            slices.push(Slice {
                slot: (None, None),
                src_shape: src.clone(),
                dim: 0,
                from,
                to: from + n,
                dst_shape: out.clone(),
                dst_at: at,
                dst_base: 0,
            });
            at += n;
            global += s;
        }
        RankLayout::new(out, slices, Vec::new())
    }

    fn fits(&self) -> Result<(), Vec<u64>> {
        let all = [self.sizes.as_slice(), &self.inner].concat();
        size::rows_of(size::sum(&self.sizes), &self.inner, all)
    }

    #[cfg(test)]
    fn samples() -> Vec<Geometry> {
        vec![
            // Granite 4's in_proj (one group), Nemotron-H's conv1d (two groups).
            MambaSplit {
                sizes: vec![32, 32, 16, 16, 8],
                groups: vec![2, 3],
                n_groups: 1,
                inner: vec![4],
            }
            .into(),
            MambaSplit {
                sizes: vec![64, 32, 32],
                groups: vec![1, 2],
                n_groups: 2,
                inner: vec![1, 4],
            }
            .into(),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows(g: &MambaSplit, tp: u64, rank: u64) -> Vec<(u64, u64)> {
        let l = g.rank_layout(
            Rank {
                tp,
                rank,
                ep: false,
            },
            true,
        );
        l.slices.iter().map(|s| (s.from, s.to)).collect()
    }

    /// vLLM's `mamba_v2_sharded_weight_loader` on Granite-4.0-H-Tiny's shape (I 128, one group
    /// of N 16, 8 heads): rows `[z_r; x_r; B; C; dt_r]`, 164 at TP 2 and 98 at TP 4.
    #[test]
    fn one_group_is_whole_on_every_rank() {
        let g = MambaSplit {
            sizes: vec![128, 128, 16, 16, 8],
            groups: vec![2, 3],
            n_groups: 1,
            inner: vec![128],
        };
        let r = |tp, rank| Rank {
            tp,
            rank,
            ep: false,
        };
        assert_eq!(g.rank_layout(r(2, 1), true).shape, vec![164, 128]);
        assert_eq!(g.rank_layout(r(4, 3), true).shape, vec![98, 128]);
        assert_eq!(
            rows(&g, 2, 1),
            [(64, 128), (192, 256), (256, 272), (272, 288), (292, 296)]
        );
        assert_eq!(
            rows(&g, 4, 2),
            [(64, 96), (192, 224), (256, 272), (272, 288), (292, 294)]
        );
        // TP 1 is vLLM's merged path: the tensor as stored.
        assert_eq!(
            rows(&g, 1, 0),
            [(0, 128), (128, 256), (256, 272), (272, 288), (288, 296)]
        );
        assert!(g.check(r(8, 0)).is_empty());
    }

    /// Two groups at TP 2: every part sliced (MergedColumnParallelLinear); at TP 4 vLLM refuses.
    #[test]
    fn groups_split_when_tp_divides_them_and_are_refused_otherwise() {
        let g = MambaSplit {
            sizes: vec![128, 32, 32],
            groups: vec![1, 2],
            n_groups: 2,
            inner: vec![1, 4],
        };
        assert_eq!(rows(&g, 2, 1), [(64, 128), (144, 160), (176, 192)]);
        let refused = g.check(Rank {
            tp: 4,
            rank: 0,
            ep: false,
        });
        assert_eq!(
            refused,
            [
                "If tensor parallel world size does not divide num_groups, then num_groups must equal 1."
            ]
        );
    }
}
