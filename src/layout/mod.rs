//! The geometry of each parallel layout: per-rank shapes, the checkpoint shapes each shard expects,
//! and the block moves that fill a rank's tensor (vLLM 0.33 `layers/linear.py`, `layers/vocab_parallel_embedding.py`, `layers/fused_moe/`).
//!
//! [`Geometry`] and its dispatch are here; the types its answers are made of are in `types.rs`,
//! the dense layouts' geometry in `dense.rs`, the fused experts' in `experts.rs` and the
//! quantization scales' in `scales.rs`.

mod dense;
mod experts;
pub(crate) mod mxfp4;
mod packed_experts;
mod region;
mod scales;
mod strided;
mod transposed;
mod tuples;
pub(crate) mod types;
mod values;

// Named through this path by `exec/` (Block, ZeroRows: row padding) and by plan's `types.rs`, `assign.rs` and
// `validate.rs`.
pub use region::Region;
pub use types::{Block, ZeroRows};
pub(crate) use types::{Rank, Shape, SlotKey};

use crate::mapping::rules::ShardId;
use crate::mapping::{ExpertPart, GptOssPart};
use dense::{cat, merged_column, qkv, replicated, split, vocab_rows};
use experts::{expert_blocks, gpt_oss_experts, stacked_experts};
use packed_experts::{packed_expected, packed_experts, split_size};
use transposed::{head_rows, transposed_experts};
pub(crate) use tuples::merged_geometry;
use types::{RankLayout, name};
pub use values::KvScale;

/// A layout with its dimensions evaluated.
#[derive(Debug, Clone, PartialEq)]
pub enum Geometry {
    Replicated {
        shape: Vec<u64>,
    },
    Column {
        shape: Vec<u64>,
    },
    Row {
        shape: Vec<u64>,
    },
    MergedColumn {
        sizes: Vec<u64>,
        inner: Vec<u64>,
        /// Whole on every rank (vLLM's `disable_tp=True`).
        disable_tp: bool,
    },
    /// A merged column some of whose shards the checkpoint fills as one tensor (a tuple shard
    /// id, `tuples.rs`: Qwen3.5's GDN `in_proj_qkvz` from `in_proj_qkv` and `in_proj_z`).
    MergedTuples {
        sizes: Vec<u64>,
        inner: Vec<u64>,
        tuples: Vec<Vec<u64>>,
    },
    Qkv {
        heads: u64,
        kv_heads: u64,
        head_dim: u64,
        inner: Vec<u64>,
    },
    /// Rows of whole heads, split as `qkv`'s kv rows (MiniMax-M2's q/k norms).
    Heads {
        heads: u64,
        head_dim: u64,
        inner: Vec<u64>,
    },
    Vocab {
        vocab: u64,
        inner: Vec<u64>,
        padding: u64,
    },
    Experts {
        part: ExpertPart,
        experts: u64,
        intermediate: u64,
        hidden: u64,
    },
    /// A linear layer's per-tensor scales: one F32 per logical shard of the weight `of`, the
    /// same on every rank (`PerTensorScaleParameter`).
    TensorScale {
        of: Box<Geometry>,
    },
    /// Block scales of the linear weight `of`, `[block_n, block_k]` (`BlockQuantScaleParameter`).
    BlockScale {
        of: Box<Geometry>,
        block: [u64; 2],
    },
    /// Per-tensor scales of fused experts (`w13` `[E_loc, 2]`, or `[E_loc]` for `input`; `w2`
    /// `[E_loc]`).
    ExpertTensorScale {
        part: ExpertPart,
        experts: u64,
        input: bool,
    },
    /// Block scales of fused experts.
    ExpertBlockScale {
        part: ExpertPart,
        experts: u64,
        /// `[intermediate, hidden]` of the experts.
        dims: [u64; 2],
        block: [u64; 2],
    },
    /// `of`'s layout behind leading dimensions that are never split: each slice of `of` taken
    /// for every index of `leading`. GPTQ and AWQ store a linear weight input-major
    /// (`qweight [K/8, N]`), so its output parts are split on the last dim.
    WithLeading {
        leading: Vec<u64>,
        of: Box<Geometry>,
    },
    /// Fused experts stored input-major (GPTQ's and AWQ's MoE parameters, `packed_experts.rs`):
    /// one expert's source (one shard) is `dims`; `w13` holds gate then up on its last dim, `w2`
    /// is split on its first when `split` (else whole: channel scales, biases).
    PackedExperts {
        part: ExpertPart,
        experts: u64,
        dims: Vec<u64>,
        split: bool,
    },
    /// A value of `shape` each logical shard of the linear weight `of` writes whole, the same
    /// on every rank: the one loaded last stays (compressed-tensors `weight_shape`, INT8
    /// `input_scale`).
    LastShard {
        of: Box<Geometry>,
        shape: Vec<u64>,
    },
    /// A `[E_loc, width]` value per expert that each of its shards (w1 and w3, or w2) writes
    /// whole: the one loaded last stays (pack-quantized experts' `weight_shape`).
    ExpertLastShard {
        part: ExpertPart,
        experts: u64,
        width: u64,
    },
    /// An Attention layer's per-kv-head cache scale (`attn_head` strategy): the rank's kv
    /// heads, q reduced by amax over each query group.
    KvHeadScale {
        heads: u64,
        kv_heads: u64,
        which: KvScale,
    },
    /// gpt-oss's fused experts, from the stacked tensors of its HF checkpoint (`gate_up_proj`
    /// `[E, H, 2I]` with gate and up interleaved, `down_proj` `[E, I, H]`, and their biases).
    GptOssExperts {
        part: GptOssPart,
        experts: u64,
        intermediate: u64,
        hidden: u64,
    },
    /// Fused experts from one transposed tensor a layer, gate and up in halves (Llama 4's
    /// `gate_up_proj` `[E, H, 2I]`, `down_proj` `[E, I, H]`; `transposed.rs`).
    TransposedExperts {
        part: ExpertPart,
        experts: u64,
        intermediate: u64,
        hidden: u64,
    },
    /// gpt-oss's MXFP4 experts (`mxfp4.rs`): whole 32-element blocks per rank, the real slice
    /// in the leading corner of a parameter the MoE backend may pad.
    Mxfp4Experts {
        part: mxfp4::Mxfp4Part,
        dims: mxfp4::Mxfp4Dims,
    },
}

impl Geometry {
    /// Divisibility rules vLLM asserts for this TP size, as messages.
    pub fn check(&self, r: Rank) -> Vec<String> {
        let tp = r.tp;
        let div = |what: &str, v: u64| {
            (!v.is_multiple_of(tp)).then(|| format!("{what} ({v}) is not divisible by tp ({tp})"))
        };
        match self {
            Geometry::Replicated { .. } => vec![],
            Geometry::Column { shape } => div("output size", shape[0]).into_iter().collect(),
            Geometry::Row { shape } => div("input size", shape[1]).into_iter().collect(),
            Geometry::MergedColumn {
                disable_tp: true, ..
            } => vec![],
            Geometry::MergedColumn { sizes, .. } | Geometry::MergedTuples { sizes, .. } => sizes
                .iter()
                .filter_map(|s| div("merged output size", *s))
                .collect(),
            Geometry::Qkv {
                heads, kv_heads, ..
            } => {
                let mut v: Vec<String> = div("attention heads", *heads).into_iter().collect();
                if *kv_heads == 0 || (!kv_heads.is_multiple_of(tp) && !tp.is_multiple_of(*kv_heads))
                {
                    v.push(format!(
                        "kv heads ({kv_heads}) and tp ({tp}) must divide one another"
                    ));
                }
                v
            }
            Geometry::Heads { heads, .. } => {
                if *heads == 0 || (!heads.is_multiple_of(tp) && !tp.is_multiple_of(*heads)) {
                    vec![format!(
                        "heads ({heads}) and tp ({tp}) must divide one another"
                    )]
                } else {
                    vec![]
                }
            }
            Geometry::Vocab { vocab, padding, .. } => {
                let padded = vocab.div_ceil(*padding) * padding;
                div(
                    &format!("padded vocab (vocab {vocab} padded to {padded})"),
                    padded,
                )
                .into_iter()
                .collect()
            }
            Geometry::Experts { intermediate, .. } if !r.ep => {
                div("expert intermediate size", *intermediate)
                    .into_iter()
                    .collect()
            }
            Geometry::TransposedExperts { intermediate, .. } if !r.ep => {
                div("expert intermediate size", *intermediate)
                    .into_iter()
                    .collect()
            }
            Geometry::Experts { .. } | Geometry::TransposedExperts { .. } => vec![],
            Geometry::PackedExperts {
                part, dims, split, ..
            } if !r.ep => split_size(*part, dims, *split)
                .and_then(|n| div("expert intermediate size (packed or grouped)", n))
                .into_iter()
                .collect(),
            Geometry::PackedExperts { .. } => vec![],
            Geometry::GptOssExperts {
                experts,
                intermediate,
                ..
            } => {
                // MLPBlock asserts the first whatever the parallelism; with expert parallelism
                // the loader hands every rank E / tp experts (gpt_oss.py load_weights).
                let mut v: Vec<String> = div("expert intermediate size", *intermediate)
                    .into_iter()
                    .collect();
                if r.ep {
                    v.extend(div("number of experts", *experts));
                }
                v
            }
            Geometry::TensorScale { .. }
            | Geometry::ExpertTensorScale { .. }
            | Geometry::LastShard { .. }
            | Geometry::ExpertLastShard { .. }
            | Geometry::KvHeadScale { .. } => vec![],
            Geometry::Mxfp4Experts { dims, .. } => mxfp4::check(dims, r),
            Geometry::WithLeading { of, .. } => of.check(r),
            Geometry::BlockScale { of, block } => scales::block_scale_check(of, *block, r),
            Geometry::ExpertBlockScale {
                experts,
                dims,
                block,
                ..
            } => scales::expert_block_check(*experts, *dims, *block, r),
        }
    }

    /// The shard ids this layout accepts, and the checkpoint shape each must have (checked
    /// once per checkpoint tensor: kept inline).
    pub fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        let none = |shape: &[u64]| match shard {
            None => Ok(Shape::from_slice(shape)),
            Some(s) => Err(format!(
                "shard id {s} given to a parameter that is not stacked"
            )),
        };
        match self {
            Geometry::Replicated { shape }
            | Geometry::Column { shape }
            | Geometry::Row { shape } => none(shape),
            Geometry::Vocab { vocab, inner, .. } => none(&cat(*vocab, inner)),
            Geometry::Heads { .. } | Geometry::TransposedExperts { .. } => {
                none(&transposed::source_shape(self))
            }
            Geometry::MergedColumn { sizes, inner, .. } => match shard {
                None => Ok(cat(sizes.iter().sum(), inner).into()),
                Some(ShardId::Index(k)) if (*k as usize) < sizes.len() => {
                    Ok(cat(sizes[*k as usize], inner).into())
                }
                Some(s) => Err(format!(
                    "shard id should be between 0 and {}, got {s}",
                    sizes.len() - 1
                )),
            },
            Geometry::MergedTuples {
                sizes,
                inner,
                tuples,
            } => tuples::expected_source(sizes, inner, tuples, shard),
            Geometry::Qkv {
                heads,
                kv_heads,
                head_dim,
                inner,
            } => match shard.map(ShardId::text).as_deref() {
                None => Ok(cat((heads + 2 * kv_heads) * head_dim, inner).into()),
                Some("q") => Ok(cat(heads * head_dim, inner).into()),
                Some("k") | Some("v") => Ok(cat(kv_heads * head_dim, inner).into()),
                Some(s) => Err(format!(
                    "shard id for QKVParallelLinear should be 'q', 'k', or 'v', got shard id {s}"
                )),
            },
            Geometry::Experts {
                part,
                experts,
                intermediate,
                hidden,
            } => experts::expected_source(*part, [*experts, *intermediate, *hidden], shard),
            Geometry::PackedExperts { part, dims, .. } => packed_expected(*part, dims, shard),
            Geometry::GptOssExperts {
                part,
                experts,
                intermediate,
                hidden,
            } => none(&match part {
                GptOssPart::W13Weight => Shape::from_slice(&[*experts, *hidden, 2 * intermediate]),
                GptOssPart::W13Bias => Shape::from_slice(&[*experts, 2 * intermediate]),
                GptOssPart::W2Weight => Shape::from_slice(&[*experts, *intermediate, *hidden]),
                GptOssPart::W2Bias => Shape::from_slice(&[*experts, *hidden]),
            }),
            Geometry::Mxfp4Experts { part, dims } => none(&mxfp4::source_shape(*part, dims)),
            Geometry::WithLeading { leading, of } => of.expected_source(shard).map(|s| {
                let mut out = Shape::from_slice(leading);
                out.extend_from_slice(&s);
                out
            }),
            Geometry::LastShard { .. }
            | Geometry::ExpertLastShard { .. }
            | Geometry::KvHeadScale { .. } => values::expected_source(self, shard),
            // A scalar per slot; the shard id must be one the weight takes.
            Geometry::TensorScale { of } => of.expected_source(shard).map(|_| Shape::new()),
            Geometry::BlockScale { of, block } => of
                .expected_source(shard)
                .map(|s| scales::blocks_of(&s, *block).into()),
            Geometry::ExpertTensorScale { part, .. } => Geometry::Experts {
                part: *part,
                experts: 0,
                intermediate: 0,
                hidden: 0,
            }
            .expected_source(shard)
            .map(|_| Shape::new()),
            Geometry::ExpertBlockScale {
                part, dims, block, ..
            } => Geometry::Experts {
                part: *part,
                experts: 0,
                intermediate: dims[0],
                hidden: dims[1],
            }
            .expected_source(shard)
            .map(|_| scales::expert_block_source(*part, *dims, *block).into()),
        }
    }

    /// The sources a complete parameter needs, as alternatives: either every slot of `split`, or
    /// the single `fused` slot (a tensor already stacked on disk).
    pub fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        match self {
            Geometry::TensorScale { of }
            | Geometry::BlockScale { of, .. }
            | Geometry::WithLeading { of, .. }
            | Geometry::LastShard { of, .. } => of.required(),
            Geometry::ExpertTensorScale { part, experts, .. }
            | Geometry::ExpertLastShard { part, experts, .. }
            | Geometry::ExpertBlockScale { part, experts, .. }
            | Geometry::PackedExperts { part, experts, .. } => {
                // Per expert only: a stacked tensor is the unquantized weight's alternative.
                let per_expert = Geometry::Experts {
                    part: *part,
                    experts: *experts,
                    intermediate: 0,
                    hidden: 0,
                };
                (per_expert.required().0, None)
            }
            Geometry::MergedColumn { sizes, .. } => (
                (0..sizes.len() as u64)
                    .map(|k| (Some(ShardId::Index(k)), None))
                    .collect(),
                Some((None, None)),
            ),
            Geometry::MergedTuples { sizes, tuples, .. } => {
                (tuples::slots(sizes.len(), tuples), Some((None, None)))
            }
            Geometry::Qkv { .. } => (
                ["q", "k", "v"].iter().map(|s| (name(s), None)).collect(),
                Some((None, None)),
            ),
            Geometry::Experts { part, experts, .. } => {
                let shards: &[&str] = match part {
                    ExpertPart::W13 => &["w1", "w3"],
                    ExpertPart::W2 => &["w2"],
                };
                (
                    (0..*experts)
                        .flat_map(|e| shards.iter().map(move |s| (name(s), Some(e))))
                        .collect(),
                    Some((None, None)),
                )
            }
            _ => (vec![(None, None)], None),
        }
    }

    /// How many consecutive source elements each destination element is the maximum of (the
    /// q scales of the `attn_head` KV cache); 1 for a copy.
    pub fn max_of(&self, r: Rank) -> u64 {
        match self {
            Geometry::KvHeadScale {
                heads,
                kv_heads,
                which,
            } => values::kv_scale(*heads, *kv_heads, *which, r).1,
            _ => 1,
        }
    }

    /// The experts of a fused expert layout whose rank layouts repeat per expert
    /// ([`RankLayout::per_expert`]); `None` for the others.
    pub fn expert_count(&self) -> Option<u64> {
        match self {
            Geometry::Experts { experts, .. }
            | Geometry::PackedExperts { experts, .. }
            | Geometry::ExpertTensorScale { experts, .. }
            | Geometry::ExpertLastShard { experts, .. }
            | Geometry::ExpertBlockScale { experts, .. } => Some(*experts),
            _ => None,
        }
    }

    /// Rank `r`'s tensor and how to fill it. `fused` says the parameter is fed by one stacked
    /// tensor (shard id none) rather than by its shards.
    pub fn rank_layout(&self, r: Rank, fused: bool) -> RankLayout {
        match self {
            Geometry::Replicated { shape } => replicated(shape),
            Geometry::Column { shape } => split(shape, 0, r),
            Geometry::Row { shape } => split(shape, 1, r),
            Geometry::MergedColumn {
                sizes,
                inner,
                disable_tp,
            } => merged_column(sizes, inner, r.without_tp_if(*disable_tp), fused),
            Geometry::MergedTuples {
                sizes,
                inner,
                tuples,
            } if !fused => tuples::rank_layout(sizes, inner, tuples, r),
            Geometry::MergedTuples { sizes, inner, .. } => merged_column(sizes, inner, r, true),
            Geometry::Qkv {
                heads,
                kv_heads,
                head_dim,
                inner,
            } => qkv([*heads, *kv_heads, *head_dim], inner, r, fused),
            Geometry::Vocab {
                vocab,
                inner,
                padding,
            } => vocab_rows(*vocab, inner, *padding, r),
            Geometry::Heads {
                heads,
                head_dim,
                inner,
            } => head_rows(*heads, *head_dim, inner, r),
            Geometry::TransposedExperts {
                part,
                experts,
                intermediate,
                hidden,
            } => transposed_experts(*part, *experts, *intermediate, *hidden, r),
            Geometry::Experts {
                part,
                experts,
                intermediate,
                hidden,
            } if fused => stacked_experts(*part, *experts, *intermediate, *hidden, r),
            Geometry::Experts {
                part,
                experts,
                intermediate,
                hidden,
            } => expert_blocks(*part, *experts, *intermediate, *hidden, r),
            Geometry::PackedExperts {
                part,
                experts,
                dims,
                split,
            } => packed_experts(*part, *experts, dims, *split, r),
            Geometry::WithLeading { leading, of } => {
                with_leading(leading, of.rank_layout(r, fused))
            }
            Geometry::TensorScale { of } => scales::tensor_scale(of, fused),
            Geometry::LastShard { of, shape } => values::last_shard(of, shape, fused),
            Geometry::ExpertLastShard {
                part,
                experts,
                width,
            } => values::expert_last_shard(*part, *experts, *width, r),
            Geometry::KvHeadScale {
                heads,
                kv_heads,
                which,
            } => values::kv_scale(*heads, *kv_heads, *which, r).0,
            Geometry::BlockScale { of, block } => scales::block_scale(of, *block, r, fused),
            Geometry::ExpertTensorScale {
                part,
                experts,
                input,
            } => scales::expert_tensor_scale(*part, *experts, *input, r),
            Geometry::ExpertBlockScale {
                part,
                experts,
                dims,
                block,
            } => scales::expert_block_scale(*part, *experts, *dims, *block, r),
            Geometry::GptOssExperts {
                part,
                experts,
                intermediate,
                hidden,
            } => gpt_oss_experts(*part, *experts, *intermediate, *hidden, r),
            Geometry::Mxfp4Experts { part, dims } => mxfp4::rank_layout(*part, dims, r),
        }
    }
}

/// `inner` (a layout without per-expert repeats or zero ranges) behind the dimensions `leading`.
fn with_leading(leading: &[u64], inner: RankLayout) -> RankLayout {
    debug_assert!(
        inner.per_expert.is_none() && inner.zeros.is_empty() && inner.zero_rows.is_empty()
    );
    let prepend = |s: &[u64]| leading.iter().chain(s).copied().collect::<Vec<u64>>();
    let slices = (inner.slices.iter())
        .map(|s| types::Slice {
            src_shape: prepend(&s.src_shape),
            dim: s.dim + leading.len(),
            dst_shape: prepend(&s.dst_shape),
            ..s.clone()
        })
        .collect();
    RankLayout::new(prepend(&inner.shape), slices, Vec::new())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One geometry of each layout kind the tiling test covers.
    fn tiling_layouts() -> Vec<Geometry> {
        [
            Geometry::Column { shape: vec![64, 8] },
            Geometry::Row { shape: vec![8, 64] },
            Geometry::Replicated { shape: vec![5] },
            Geometry::MergedColumn {
                sizes: vec![32, 32],
                inner: vec![4],
                disable_tp: false,
            },
            Geometry::Qkv {
                heads: 8,
                kv_heads: 2,
                head_dim: 4,
                inner: vec![3],
            },
            Geometry::Vocab {
                vocab: 1003,
                inner: vec![2],
                padding: 64,
            },
            Geometry::WithLeading {
                leading: vec![3],
                of: Box::new(Geometry::Qkv {
                    heads: 8,
                    kv_heads: 2,
                    head_dim: 4,
                    inner: vec![],
                }),
            },
            Geometry::WithLeading {
                leading: vec![2],
                of: Box::new(Geometry::MergedColumn {
                    sizes: vec![16, 32],
                    inner: vec![],
                    disable_tp: false,
                }),
            },
            Geometry::Experts {
                part: ExpertPart::W13,
                experts: 4,
                intermediate: 16,
                hidden: 4,
            },
            Geometry::Experts {
                part: ExpertPart::W2,
                experts: 5,
                intermediate: 16,
                hidden: 4,
            },
        ]
        .into_iter()
        .chain(packed_layouts())
        .chain(merged_layouts())
        .chain(
            [
                GptOssPart::W13Weight,
                GptOssPart::W13Bias,
                GptOssPart::W2Weight,
                GptOssPart::W2Bias,
            ]
            .map(|part| Geometry::GptOssExperts {
                part,
                experts: 8,
                intermediate: 16,
                hidden: 6,
            }),
        )
        .chain(
            [ExpertPart::W13, ExpertPart::W2].map(|part| Geometry::TransposedExperts {
                part,
                experts: 5,
                intermediate: 16,
                hidden: 3,
            }),
        )
        .chain(
            [(8, 2), (8, 8), (1, 1)].map(|(heads, head_dim)| Geometry::Heads {
                heads,
                head_dim,
                inner: vec![2],
            }),
        )
        .chain(mxfp4::Mxfp4Part::ALL.into_iter().flat_map(|part| {
            [[1, 1], [1, 64], [256, 128]].map(|align| Geometry::Mxfp4Experts {
                part,
                dims: mxfp4::Mxfp4Dims {
                    experts: 8,
                    intermediate: 224,
                    hidden: 96,
                    align,
                },
            })
        }))
        .collect::<Vec<_>>()
    }

    /// Merged columns whole on every rank, and Qwen3.5's in_proj_qkvz (shards 0–2 from one
    /// tensor, 3 from another).
    fn merged_layouts() -> [Geometry; 2] {
        [
            Geometry::MergedColumn {
                sizes: vec![24, 40],
                inner: vec![4],
                disable_tp: true,
            },
            Geometry::MergedTuples {
                sizes: vec![16, 16, 32, 32],
                inner: vec![2],
                tuples: vec![vec![0, 1, 2]],
            },
        ]
    }

    /// The packed formats' own layouts: GPTQ/AWQ experts stored input-major.
    fn packed_layouts() -> [Geometry; 3] {
        [
            Geometry::PackedExperts {
                part: ExpertPart::W13,
                experts: 5,
                dims: vec![2, 16],
                split: true,
            },
            Geometry::PackedExperts {
                part: ExpertPart::W2,
                experts: 5,
                dims: vec![16, 3],
                split: true,
            },
            Geometry::PackedExperts {
                part: ExpertPart::W2,
                experts: 5,
                dims: vec![6],
                split: false,
            },
        ]
    }

    /// Every element of every rank's tensor is written exactly once, and the slices stay inside
    /// their sources — for each layout and a range of TP sizes.
    #[test]
    fn pieces_tile_every_rank_exactly() {
        let layouts = tiling_layouts();
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
