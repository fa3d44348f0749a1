//! The layout kinds: how each kind of vLLM parameter is split over the ranks, the checkpoint
//! shapes each shard expects and the block moves that fill a rank's tensor (vLLM 0.33
//! `layers/linear.py`, `layers/vocab_parallel_embedding.py`, `layers/fused_moe/`).
//!
//! Each kind is one file holding its struct and its [`Kind`] implementation. [`Geometry`] is
//! the enum of every kind, evaluated; [`Layout`] the kinds a mapping names in YAML, generic over
//! their dimensions (`Layout<Expr>` as written, `Layout<u64>` evaluated), which become a
//! [`Geometry`] by [`Layout::into_geometry`]. The other kinds are made by the planner
//! (quantization scales, packed experts). The types the answers are made of are in `types.rs`.

mod block_scale;
mod column;
mod dense;
mod expert_block_scale;
mod expert_last_shard;
mod expert_tensor_scale;
mod experts;
mod gpt_oss_experts;
mod heads;
mod kv_head_scale;
mod last_shard;
mod mamba_split;
mod merged_column;
mod merged_tuples;
pub(crate) mod mxfp4;
mod packed_experts;
mod qkv;
mod region;
mod replicated;
mod row;
mod shard_id;
mod size;
mod tensor_scale;
mod transposed_experts;
pub(crate) mod types;
mod vocab;
mod with_leading;

use serde::Deserialize;

pub(crate) use block_scale::BlockScale;
pub(crate) use column::Column;
pub(crate) use expert_block_scale::ExpertBlockScale;
pub(crate) use expert_last_shard::ExpertLastShard;
pub(crate) use expert_tensor_scale::ExpertTensorScale;
pub(crate) use experts::Experts;
pub(crate) use gpt_oss_experts::{GptOssExperts, GptOssPart};
pub(crate) use heads::Heads;
pub(crate) use kv_head_scale::{KvHeadScale, KvScale};
pub(crate) use last_shard::LastShard;
pub(crate) use mamba_split::MambaSplit;
pub(crate) use merged_column::{MergedColumn, MergedColumnSpec};
pub(crate) use merged_tuples::MergedTuples;
pub(crate) use mxfp4::Mxfp4Experts;
pub(crate) use packed_experts::PackedExperts;
pub(crate) use qkv::Qkv;
pub(crate) use region::Region;
pub(crate) use replicated::Replicated;
pub(crate) use row::Row;
pub(crate) use shard_id::ShardId;
pub(crate) use tensor_scale::TensorScale;
pub(crate) use transposed_experts::TransposedExperts;
pub(crate) use types::{Block, ExpertPart, ZeroRows};
pub(crate) use types::{Rank, Shape, SlotKey};
pub(crate) use vocab::Vocab;
pub(crate) use with_leading::WithLeading;

use types::{PerExpertCopies, RankLayout, Strided};

/// What a layout kind answers. [`Geometry`] hands every question to its kind; the defaults are
/// those of a kind whole on every rank, filled by one unstacked tensor.
pub(crate) trait Kind: std::fmt::Debug {
    /// Divisibility rules vLLM asserts for this TP size, as messages.
    fn check(&self, _: Rank) -> Vec<String> {
        Vec::new()
    }

    /// The shard ids this layout accepts, and the checkpoint shape each must have (checked
    /// once per checkpoint tensor: kept inline).
    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String>;

    /// The sources a complete parameter needs, as alternatives: either every slot of `split`,
    /// or the single `fused` slot (a tensor already stacked on disk).
    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        (vec![(None, None)], None)
    }

    /// Rank `r`'s tensor and how to fill it. `fused` says the parameter is fed by one stacked
    /// tensor (shard id none) rather than by its shards.
    fn rank_layout(&self, r: Rank, fused: bool) -> RankLayout;

    /// How many consecutive source elements each destination element is the maximum of (the
    /// q scales of the `attn_head` KV cache); 1 for a copy.
    fn max_of(&self, _: Rank) -> u64 {
        1
    }

    /// The experts of a fused expert layout whose rank layouts repeat per expert
    /// ([`RankLayout::per_expert`]); `None` for the others.
    fn expert_count(&self) -> Option<u64> {
        None
    }

    /// Copies with a source element stride other than 1 that fill rank `r`'s tensor besides
    /// [`RankLayout::slices`], each with its slot and a description of the region it reads
    /// (transposed expert weights, repeated scales).
    fn strided(&self, _: Rank) -> Vec<Strided> {
        Vec::new()
    }

    /// Of [`Kind::strided`], the copies that repeat expert by expert, as the rank's first
    /// expert's and the step to the next; the pieces phase keeps them compact. `None` for the
    /// others.
    fn strided_per_expert(&self, _: Rank) -> Option<PerExpertCopies> {
        None
    }

    /// Whether the whole tensor, and every size the kind derives from it, is within the bound
    /// of `size.rs`; else the dimensions, for the message. Planner-made kinds derive from a
    /// weight checked first.
    fn fits(&self) -> Result<(), Vec<u64>> {
        Ok(())
    }

    /// The layout as vLLM builds it with `disable_tp=True`, the whole tensor on every rank
    /// (`layers/linear.py`: tp size 1); `None` when that is the layout itself.
    fn whole(&self) -> Option<Geometry> {
        None
    }

    /// A few layouts of the kind for the tiling test (none: the kind writes some elements
    /// more than once by design, or is covered by its own tests).
    #[cfg(test)]
    fn samples() -> Vec<Geometry>
    where
        Self: Sized,
    {
        Vec::new()
    }
}

/// The enum of the kinds, its one delegation to them, and a `From` for each: adding a kind is
/// its file and one line here.
macro_rules! geometry {
    ($($(#[$doc:meta])* $kind:ident,)*) => {
        /// A layout with its dimensions evaluated: one variant per kind.
        #[derive(Clone, PartialEq)]
        pub enum Geometry {
            $($(#[$doc])* $kind($kind),)*
        }

        impl Geometry {
            /// The kind, which answers every question about the layout.
            fn kind(&self) -> &dyn Kind {
                match self {
                    $(Geometry::$kind(k) => k,)*
                }
            }

            #[cfg(test)]
            fn samples() -> Vec<Geometry> {
                [$(<$kind as Kind>::samples(),)*].concat()
            }
        }

        $(impl From<$kind> for Geometry {
            fn from(k: $kind) -> Geometry {
                Geometry::$kind(k)
            }
        })*
    };
}

geometry! {
    Replicated,
    Column,
    Row,
    MergedColumn,
    MergedTuples,
    Qkv,
    Heads,
    Vocab,
    Experts,
    TensorScale,
    BlockScale,
    ExpertTensorScale,
    ExpertBlockScale,
    WithLeading,
    PackedExperts,
    LastShard,
    ExpertLastShard,
    KvHeadScale,
    GptOssExperts,
    TransposedExperts,
    Mxfp4Experts,
    MambaSplit,
}

/// As the kind's struct prints (`Qkv { heads: 32, .. }`): messages show a geometry so.
impl std::fmt::Debug for Geometry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.kind().fmt(f)
    }
}

impl Geometry {
    /// [`Kind::check`].
    pub(crate) fn check(&self, r: Rank) -> Vec<String> {
        self.kind().check(r)
    }

    /// [`Kind::expected_source`].
    pub(crate) fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        self.kind().expected_source(shard)
    }

    /// [`Kind::required`].
    pub(crate) fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        self.kind().required()
    }

    /// [`Kind::rank_layout`].
    pub(crate) fn rank_layout(&self, r: Rank, fused: bool) -> RankLayout {
        self.kind().rank_layout(r, fused)
    }

    /// [`Kind::max_of`].
    pub(crate) fn max_of(&self, r: Rank) -> u64 {
        self.kind().max_of(r)
    }

    /// [`Kind::expert_count`].
    pub(crate) fn expert_count(&self) -> Option<u64> {
        self.kind().expert_count()
    }

    /// [`Kind::strided`].
    pub(crate) fn strided(&self, r: Rank) -> Vec<Strided> {
        self.kind().strided(r)
    }

    /// [`Kind::strided_per_expert`].
    pub(crate) fn strided_per_expert(&self, r: Rank) -> Option<PerExpertCopies> {
        self.kind().strided_per_expert(r)
    }

    /// [`Kind::fits`], the dimensions that do not written `a × b × …`.
    pub(crate) fn fits(&self) -> Result<(), String> {
        self.kind().fits().map_err(|values| {
            (values.iter())
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(" × ")
        })
    }

    /// [`Kind::whole`]: the geometry whole on every rank.
    pub(crate) fn whole(self) -> Geometry {
        self.kind().whole().unwrap_or(self)
    }
}

/// The layout kinds a mapping names (`layout: {kind: qkv, …}`), generic over their dimensions:
/// expressions as written (`Layout<Expr>`), numbers once evaluated (`Layout<u64>`,
/// [`Layout::try_map`]).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Layout<D> {
    Replicated(Replicated<D>),
    Column(Column<D>),
    Row(Row<D>),
    MergedColumn(MergedColumnSpec<D>),
    Qkv(Qkv<D>),
    Heads(Heads<D>),
    Vocab(Vocab<D>),
    Experts(Experts<D>),
    GptOssExperts(GptOssExperts<D>),
    TransposedExperts(TransposedExperts<D>),
    MambaSplit(MambaSplit<D>),
}

/// What a layout's dimension is, for whoever maps it: the expert count has a bound of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dim {
    Size,
    Experts,
}

/// A function over a layout's dimensions, called on each in the order the mapping writes them.
pub(crate) type Eval<'f, D, E, X> = dyn FnMut(&D, Dim) -> Result<E, X> + 'f;

/// `f` over every dimension of `v`.
fn all<D, E, X>(v: &[D], f: &mut Eval<D, E, X>) -> Result<Vec<E>, X> {
    v.iter().map(|d| f(d, Dim::Size)).collect()
}

impl<D> Layout<D> {
    /// The layout with `f` applied to every dimension, in the order they are written; the first
    /// error stops it.
    pub(crate) fn try_map<E, X>(&self, f: &mut Eval<D, E, X>) -> Result<Layout<E>, X> {
        Ok(match self {
            Layout::Replicated(k) => Layout::Replicated(k.try_map(f)?),
            Layout::Column(k) => Layout::Column(k.try_map(f)?),
            Layout::Row(k) => Layout::Row(k.try_map(f)?),
            Layout::MergedColumn(k) => Layout::MergedColumn(k.try_map(f)?),
            Layout::Qkv(k) => Layout::Qkv(k.try_map(f)?),
            Layout::Heads(k) => Layout::Heads(k.try_map(f)?),
            Layout::Vocab(k) => Layout::Vocab(k.try_map(f)?),
            Layout::Experts(k) => Layout::Experts(k.try_map(f)?),
            Layout::GptOssExperts(k) => Layout::GptOssExperts(k.try_map(f)?),
            Layout::TransposedExperts(k) => Layout::TransposedExperts(k.try_map(f)?),
            Layout::MambaSplit(k) => Layout::MambaSplit(k.try_map(f)?),
        })
    }
}

impl Layout<u64> {
    /// The evaluated layout as the planner takes it, or why the mapping's layout is not one
    /// (a row-parallel shape not 2-D, tuples that are not runs of shards).
    pub(crate) fn into_geometry(self) -> Result<Geometry, String> {
        Ok(match self {
            Layout::Replicated(k) => k.into(),
            Layout::Column(k) => k.into(),
            Layout::Row(k) => k.checked()?,
            Layout::MergedColumn(k) => k.into_geometry()?,
            Layout::Qkv(k) => k.into(),
            Layout::Heads(k) => k.into(),
            Layout::Vocab(k) => k.checked(),
            Layout::Experts(k) => k.into(),
            Layout::GptOssExperts(k) => k.into(),
            Layout::TransposedExperts(k) => k.into(),
            Layout::MambaSplit(k) => k.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rank `r`'s tensor computed element by element from a source whose element i holds i.
    pub(super) fn rank_values(g: &Geometry, r: Rank) -> (Vec<u64>, Vec<i64>) {
        let l = g.rank_layout(r, false);
        let mut out = vec![-1i64; l.shape.iter().product::<u64>() as usize];
        let blocks =
            (l.slices.iter().map(|s| s.block())).chain(g.strided(r).into_iter().map(|(_, b, _)| b));
        for b in blocks {
            for k in 0..b.rows {
                for x in 0..b.row {
                    let s = b.src_start + k * b.src_stride + x * b.src_elem_stride;
                    let d = (b.dst_start + k * b.dst_stride + x) as usize;
                    assert_eq!(out[d], -1, "element {d} written twice");
                    out[d] = s as i64;
                }
            }
        }
        (l.shape, out)
    }

    /// Flat index of `idx` in `shape`.
    pub(super) fn at(idx: &[u64], shape: &[u64]) -> i64 {
        idx.iter().zip(shape).fold(0, |acc, (x, n)| acc * n + x) as i64
    }

    /// Every element of every rank's tensor is written exactly once, and the slices stay inside
    /// their sources — for each layout and a range of TP sizes.
    #[test]
    fn pieces_tile_every_rank_exactly() {
        let layouts = Geometry::samples();
        for g in &layouts {
            for tp in [1, 2, 4, 8] {
                for ep in [false, true] {
                    for rank in 0..tp {
                        let r = Rank { tp, rank, ep };
                        if !g.check(r).is_empty() {
                            continue;
                        }
                        for fused in [false, true] {
                            let l = g.rank_layout(r, fused);
                            let n: u64 = l.shape.iter().product();
                            let mut hits = vec![0u8; n as usize];
                            for t in &l.all_slices() {
                                let b = t.block();
                                let src_n: u64 = t.src_shape.iter().product();
                                for k in 0..b.rows {
                                    let s = b.src_start + k * b.src_stride;
                                    assert!(s + b.row <= src_n, "{g:?} tp{tp} r{rank}");
                                    let d = b.dst_start + k * b.dst_stride;
                                    for x in d..d + b.row {
                                        hits[x as usize] += 1;
                                    }
                                }
                            }
                            let src_n: u64 =
                                g.expected_source(None).map_or(0, |s| s.iter().product());
                            for (_, b, _) in g.strided(r) {
                                for k in 0..b.rows {
                                    let s = b.src_start + k * b.src_stride;
                                    assert!(s + b.src_row_span() <= src_n, "{g:?} tp{tp} r{rank}");
                                    let d = b.dst_start + k * b.dst_stride;
                                    for x in d..d + b.row {
                                        hits[x as usize] += 1;
                                    }
                                }
                            }
                            for (at, count) in &l.zeros {
                                for x in *at..at + count {
                                    hits[x as usize] += 1;
                                }
                            }
                            for z in &l.zero_rows {
                                for k in 0..z.rows {
                                    let at = z.start + k * z.stride;
                                    for x in at..at + z.count {
                                        hits[x as usize] += 1;
                                    }
                                }
                            }
                            assert!(hits.iter().all(|&h| h == 1), "{g:?} tp{tp} r{rank} ep{ep}");
                        }
                    }
                }
            }
        }
    }
}
