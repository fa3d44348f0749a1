//! The geometry of each parallel layout: per-rank shapes, the checkpoint shapes each shard expects,
//! and the block moves that fill a rank's tensor (vLLM 0.33 `layers/linear.py`, `layers/vocab_parallel_embedding.py`, `layers/fused_moe/`).

mod scales;

use crate::mapping::rules::ShardId;
use crate::mapping::{ExpertPart, GptOssPart};

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
    Qkv {
        heads: u64,
        kv_heads: u64,
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
    /// gpt-oss's fused experts, from the stacked tensors of its HF checkpoint (`gate_up_proj`
    /// `[E, H, 2I]` with gate and up interleaved, `down_proj` `[E, I, H]`, and their biases).
    GptOssExperts {
        part: GptOssPart,
        experts: u64,
        intermediate: u64,
        hidden: u64,
    },
}

/// Tensor-parallel placement of one rank.
#[derive(Debug, Clone, Copy)]
pub struct Rank {
    pub tp: u64,
    pub rank: u64,
    /// Expert parallelism: experts spread over the `tp` ranks instead of split.
    pub ep: bool,
}

impl Rank {
    /// Rank 0 of 1 when `whole`: a layer vLLM builds with `disable_tp=True`.
    pub fn without_tp_if(self, whole: bool) -> Rank {
        if whole {
            Rank {
                tp: 1,
                rank: 0,
                ..self
            }
        } else {
            self
        }
    }
}

/// Key of one source of a parameter: the shard id and expert id it was mapped with.
pub type SlotKey = (Option<ShardId>, Option<u64>);

/// A tensor shape that rarely has more than 4 dims.
pub type Shape = smallvec::SmallVec<[u64; 4]>;

/// A strided block move in elements: `rows` rows of `row` contiguous elements, from
/// `src_start + k·src_stride` to `dst_start + k·dst_stride`. The same description serves a file
/// write, a memcpy and a 2-D device copy.
///
/// With `src_elem_stride` other than 1 the move is a transposition: element `x` of destination
/// row `k` comes from `src_start + k·src_stride + x·src_elem_stride` (gpt-oss's fused experts are
/// stored `[E, in, out]` and vLLM holds them `[E, out, in]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Block {
    pub rows: u64,
    pub row: u64,
    pub src_start: u64,
    pub src_stride: u64,
    pub dst_start: u64,
    pub dst_stride: u64,
    pub src_elem_stride: u64,
}

impl Block {
    /// Whether a destination row's elements are apart in the source.
    pub fn transposed(&self) -> bool {
        self.src_elem_stride != 1
    }

    /// Source elements one destination row spans, first to last.
    pub fn src_row_span(&self) -> u64 {
        if self.row == 0 {
            0
        } else {
            (self.row - 1) * self.src_elem_stride + 1
        }
    }
}

/// Which region of a checkpoint tensor feeds which region of a rank's tensor, before it is
/// flattened into a [`Block`] (and before any permutation).
#[derive(Debug, Clone, PartialEq)]
pub struct Slice {
    pub slot: SlotKey,
    /// Source shape.
    pub src_shape: Vec<u64>,
    /// Dimension narrowed, and the range taken.
    pub dim: usize,
    pub from: u64,
    pub to: u64,
    /// Destination: shape of the sub-tensor written into (same rank as the source), the offset
    /// along `dim` there, and the element offset of that sub-tensor in the rank's tensor.
    pub dst_shape: Vec<u64>,
    pub dst_at: u64,
    pub dst_base: u64,
}

impl Slice {
    pub fn block(&self) -> Block {
        let inner: u64 = self.src_shape[self.dim + 1..].iter().product();
        let outer: u64 = self.src_shape[..self.dim].iter().product();
        Block {
            rows: outer,
            row: (self.to - self.from) * inner,
            src_start: self.from * inner,
            src_stride: self.src_shape[self.dim] * inner,
            dst_start: self.dst_base + self.dst_at * inner,
            dst_stride: self.dst_shape[self.dim] * inner,
            src_elem_stride: 1,
        }
    }

    pub fn region(&self) -> super::Region {
        let full = self.from == 0 && self.to == self.src_shape.get(self.dim).copied().unwrap_or(1);
        super::Region {
            range: (!full).then_some((usize::from(self.dim != 0), self.from, self.to)),
            ..super::Region::ALL
        }
    }
}

/// A rank's tensor: its shape, the slices of checkpoint tensors that fill it, and zero-filled
/// ranges.
#[derive(Debug, Clone, PartialEq)]
pub struct RankLayout {
    pub shape: Vec<u64>,
    /// With [`RankLayout::per_expert`], the slices of the rank's first expert only.
    pub slices: Vec<Slice>,
    /// (element offset, count) filled with zeros (vocab padding).
    pub zeros: Vec<(u64, u64)>,
    /// Fused expert tensors repeat one expert's slices for every local expert: a DeepSeek-V3
    /// rank holds 256 experts in each of 58 layers, and one expert's slices, built once, stand
    /// for them all.
    pub per_expert: Option<PerExpert>,
}

/// How [`RankLayout::slices`] repeat over a rank's experts: expert `first + j` is filled by the
/// same slices with that expert id, `j · dst_step` elements further into the rank's tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PerExpert {
    /// The global id of the rank's first expert (the one the slices name).
    pub first: u64,
    pub count: u64,
    pub dst_step: u64,
}

impl RankLayout {
    /// A layout whose slices are all there is.
    pub fn new(shape: Vec<u64>, slices: Vec<Slice>, zeros: Vec<(u64, u64)>) -> RankLayout {
        RankLayout {
            shape,
            slices,
            zeros,
            per_expert: None,
        }
    }

    /// One expert's `slices` (naming expert `local.start`) repeated over the rank's `local`
    /// experts, `dst_step` elements apart.
    pub fn per_expert(
        shape: Vec<u64>,
        local: std::ops::Range<u64>,
        dst_step: u64,
        slices: Vec<Slice>,
    ) -> RankLayout {
        RankLayout {
            shape,
            slices: if local.is_empty() { vec![] } else { slices },
            zeros: vec![],
            per_expert: Some(PerExpert {
                first: local.start,
                count: local.end - local.start,
                dst_step,
            }),
        }
    }

    /// Every slice, a fused expert tensor's expanded for each of its experts in order.
    pub fn all_slices(&self) -> Vec<Slice> {
        let Some(pe) = self.per_expert else {
            return self.slices.clone();
        };
        (0..pe.count)
            .flat_map(|j| {
                self.slices.iter().map(move |s| Slice {
                    slot: (s.slot.0.clone(), Some(pe.first + j)),
                    dst_base: s.dst_base + j * pe.dst_step,
                    ..s.clone()
                })
            })
            .collect()
    }
}

fn name(s: &'static str) -> Option<ShardId> {
    Some(ShardId::Name(std::borrow::Cow::Borrowed(s)))
}

/// Linear expert placement (vLLM's `determine_expert_map`): extra experts go to the first ranks.
pub fn local_experts(experts: u64, ep_size: u64, ep_rank: u64) -> std::ops::Range<u64> {
    let base = experts / ep_size;
    let rem = experts % ep_size;
    let count = base + u64::from(ep_rank < rem);
    let start = ep_rank * base + ep_rank.min(rem);
    start..start + count
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
            Geometry::MergedColumn { sizes, .. } => sizes
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
            Geometry::Experts { .. } => vec![],
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
            Geometry::TensorScale { .. } | Geometry::ExpertTensorScale { .. } => vec![],
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
                intermediate,
                hidden,
                ..
            } => match (part, shard.map(ShardId::text).as_deref()) {
                (ExpertPart::W13, Some("w1" | "w3")) => {
                    Ok(smallvec::smallvec![*intermediate, *hidden])
                }
                (ExpertPart::W2, Some("w2")) => Ok(smallvec::smallvec![*hidden, *intermediate]),
                (_, s) => Err(format!(
                    "shard_id must be ['w1','w2','w3'] matching the parameter, got {}",
                    s.unwrap_or("none")
                )),
            },
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
            Geometry::TensorScale { of } | Geometry::BlockScale { of, .. } => of.required(),
            Geometry::ExpertTensorScale { part, experts, .. }
            | Geometry::ExpertBlockScale { part, experts, .. } => Geometry::Experts {
                part: *part,
                experts: *experts,
                intermediate: 0,
                hidden: 0,
            }
            .required(),
            Geometry::MergedColumn { sizes, .. } => (
                (0..sizes.len() as u64)
                    .map(|k| (Some(ShardId::Index(k)), None))
                    .collect(),
                Some((None, None)),
            ),
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
                    None,
                )
            }
            _ => (vec![(None, None)], None),
        }
    }

    /// The experts of a fused expert layout whose rank layouts repeat per expert
    /// ([`RankLayout::per_expert`]); `None` for the others.
    pub fn expert_count(&self) -> Option<u64> {
        match self {
            Geometry::Experts { experts, .. }
            | Geometry::ExpertTensorScale { experts, .. }
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
            Geometry::Experts {
                part,
                experts,
                intermediate,
                hidden,
            } => expert_blocks(*part, *experts, *intermediate, *hidden, r),
            Geometry::TensorScale { of } => scales::tensor_scale(of, fused),
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
        }
    }

    /// Copies with a source element stride other than 1 that fill rank `r`'s tensor besides
    /// [`RankLayout::slices`], each with its slot and a description of the region it reads:
    /// gpt-oss's expert weights (transposed, from the whole checkpoint tensor) and expert block
    /// scales on vLLM's refined grid (each checkpoint scale repeated).
    pub fn strided(&self, r: Rank) -> Vec<(SlotKey, Block, super::Region)> {
        match self {
            Geometry::GptOssExperts {
                part,
                experts,
                intermediate,
                hidden,
            } => gpt_oss_transposed(*part, *experts, *intermediate, *hidden, r)
                .into_iter()
                .map(|(b, region)| ((None, None), b, region))
                .collect(),
            Geometry::ExpertBlockScale {
                part,
                experts,
                dims,
                block,
            } => scales::expert_block_refined(*part, *experts, *dims, *block, r),
            _ => Vec::new(),
        }
    }
}

/// `[lead, inner...]`.
fn cat(lead: u64, inner: &[u64]) -> Vec<u64> {
    let mut s = vec![lead];
    s.extend_from_slice(inner);
    s
}

/// A slice of the slot filled whole: `src_shape[dim]` narrowed to `from..to`, written at
/// `dst_at` along `dim` of `dst_shape`.
fn whole_slot(src_shape: Vec<u64>, dim: usize, from: u64, to: u64, dst_shape: Vec<u64>) -> Slice {
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
fn replicated(shape: &[u64]) -> RankLayout {
    let slice = if shape.is_empty() {
        // A 0-d tensor: one element, expressed on a 1-element view.
        whole_slot(vec![1], 0, 0, 1, vec![1])
    } else {
        whole_slot(shape.to_vec(), 0, 0, shape[0], shape.to_vec())
    };
    only(shape.to_vec(), slice)
}

/// Column (`dim` 0: output rows) or row (`dim` 1: input columns) parallel: an equal part each.
fn split(shape: &[u64], dim: usize, r: Rank) -> RankLayout {
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
fn merged_column(sizes: &[u64], inner: &[u64], r: Rank, fused: bool) -> RankLayout {
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

/// Fused expert weights: every expert's intermediate split over the ranks, or with expert
/// parallelism whole experts spread over them.
fn expert_blocks(
    part: ExpertPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> RankLayout {
    let (local, moe_tp, moe_rank) = if r.ep {
        (local_experts(experts, r.tp, r.rank), 1, 0)
    } else {
        (0..experts, r.tp, r.rank)
    };
    let ip = intermediate / moe_tp;
    let e_loc = local.end - local.start;
    let (from, to) = (moe_rank * ip, (moe_rank + 1) * ip);
    let first = Some(local.start);
    match part {
        ExpertPart::W13 => {
            let slices = ["w1", "w3"]
                .iter()
                .enumerate()
                .map(|(h, s)| Slice {
                    slot: (name(s), first),
                    src_shape: vec![intermediate, hidden],
                    dim: 0,
                    from,
                    to,
                    dst_shape: vec![2 * ip, hidden],
                    dst_at: h as u64 * ip,
                    dst_base: 0,
                })
                .collect();
            RankLayout::per_expert(vec![e_loc, 2 * ip, hidden], local, 2 * ip * hidden, slices)
        }
        ExpertPart::W2 => {
            let slice = Slice {
                slot: (name("w2"), first),
                src_shape: vec![hidden, intermediate],
                dim: 1,
                from,
                to,
                dst_shape: vec![hidden, ip],
                dst_at: 0,
                dst_base: 0,
            };
            RankLayout::per_expert(vec![e_loc, hidden, ip], local, hidden * ip, vec![slice])
        }
    }
}

/// gpt-oss's expert placement (gpt_oss.py `_load_weights_other`): this rank's experts, its share of
/// the intermediate size, and its rank within the experts' tensor parallelism.
fn gpt_oss_split(experts: u64, intermediate: u64, r: Rank) -> (std::ops::Range<u64>, u64, u64) {
    if r.ep {
        // Every rank E / tp experts, as the loader slices them (check() refuses a remainder).
        let per = experts / r.tp;
        (r.rank * per..(r.rank + 1) * per, intermediate, 0)
    } else {
        (0..experts, intermediate / r.tp, r.rank)
    }
}

/// Rank `r`'s gpt-oss expert tensor: with TP every expert's intermediate share (columns
/// `[2·I_r·r, 2·I_r·(r+1))` of the interleaved gate/up, so the interleaving is kept), with EP
/// whole experts. The weights are filled by [`gpt_oss_transposed`]; the biases are sliced, except
/// the down bias under TP: whole on rank 0 and zeros elsewhere, so that the all-reduce adds it
/// once.
fn gpt_oss_experts(
    part: GptOssPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> RankLayout {
    let (local, ip, moe_rank) = gpt_oss_split(experts, intermediate, r);
    let e_loc = local.end - local.start;
    let layout = RankLayout::new;
    let by_expert = |inner: u64, out: Vec<u64>| {
        let slice = whole_slot(vec![experts, inner], 0, local.start, local.end, out.clone());
        layout(out, vec![slice], vec![])
    };
    match part {
        GptOssPart::W13Weight => layout(vec![e_loc, 2 * ip, hidden], vec![], vec![]),
        GptOssPart::W2Weight => layout(vec![e_loc, hidden, ip], vec![], vec![]),
        GptOssPart::W13Bias if r.ep => by_expert(2 * intermediate, vec![e_loc, 2 * intermediate]),
        GptOssPart::W13Bias => {
            let out = vec![experts, 2 * ip];
            let slice = whole_slot(
                vec![experts, 2 * intermediate],
                1,
                2 * ip * moe_rank,
                2 * ip * (moe_rank + 1),
                out.clone(),
            );
            layout(out, vec![slice], vec![])
        }
        GptOssPart::W2Bias if r.ep => by_expert(hidden, vec![e_loc, hidden]),
        GptOssPart::W2Bias if r.rank == 0 => replicated(&[experts, hidden]),
        GptOssPart::W2Bias => layout(vec![experts, hidden], vec![], vec![(0, experts * hidden)]),
    }
}

/// The transposed copies of gpt-oss's expert weights, one per local expert (`permute(0, 2, 1)`
/// of the rank's slice): `w13[j][c][h] = gate_up_proj[e][h][2·I_r·r + c]` and
/// `w2[j][h][i] = down_proj[e][I_r·r + i][h]`.
fn gpt_oss_transposed(
    part: GptOssPart,
    experts: u64,
    intermediate: u64,
    hidden: u64,
    r: Rank,
) -> Vec<(Block, super::Region)> {
    let (local, ip, moe_rank) = gpt_oss_split(experts, intermediate, r);
    // Per expert: destination rows and their length, the expert's source size, where row 0
    // starts in it, the source distance between a row's elements, and the intermediate range.
    let (rows, row, per_src, first, elem_stride) = match part {
        GptOssPart::W13Weight => (
            2 * ip,
            hidden,
            hidden * 2 * intermediate,
            2 * ip * moe_rank,
            2 * intermediate,
        ),
        GptOssPart::W2Weight => (
            hidden,
            ip,
            intermediate * hidden,
            ip * moe_rank * hidden,
            hidden,
        ),
        GptOssPart::W13Bias | GptOssPart::W2Bias => return Vec::new(),
    };
    // One description for every expert's copy: reports show the tensor's source region once.
    let region = super::Region {
        range: Some(match part {
            GptOssPart::W13Weight => (1, first, first + rows),
            _ => (0, ip * moe_rank, ip * (moe_rank + 1)),
        }),
        experts: Some((local.start, local.end)),
        rotary: false,
        transposed: true,
    };
    local
        .enumerate()
        .map(|(j, e)| {
            let b = Block {
                rows,
                row,
                src_start: e * per_src + first,
                src_stride: 1,
                dst_start: j as u64 * rows * row,
                dst_stride: row,
                src_elem_stride: elem_stride,
            };
            (b, region)
        })
        .collect()
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
            Geometry::MergedColumn {
                sizes: vec![24, 40],
                inner: vec![4],
                disable_tp: true,
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
        .collect::<Vec<_>>()
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
                            assert!(hits.iter().all(|&h| h == 1), "{g:?} tp{tp} r{rank} ep{ep}");
                        }
                    }
                }
            }
        }
    }

    /// Rank `r`'s gpt-oss expert tensor, computed element by element from the checkpoint
    /// tensor `src` (element i holds i) by moving its blocks and slices.
    fn gpt_oss_rank(g: &Geometry, r: Rank) -> (Vec<u64>, Vec<i64>) {
        let l = g.rank_layout(r, false);
        let mut out = vec![-1i64; l.shape.iter().product::<u64>() as usize];
        let blocks = l
            .slices
            .iter()
            .map(Slice::block)
            .chain(g.strided(r).into_iter().map(|(_, b, _)| b));
        for b in blocks {
            for k in 0..b.rows {
                for x in 0..b.row {
                    let s = b.src_start + k * b.src_stride + x * b.src_elem_stride;
                    out[(b.dst_start + k * b.dst_stride + x) as usize] = s as i64;
                }
            }
        }
        for (at, n) in l.zeros {
            out[at as usize..(at + n) as usize].fill(0);
        }
        (l.shape, out)
    }

    /// gpt_oss.py `_load_weights_other` on `arange` tensors: TP keeps the gate/up interleaving
    /// of each rank's columns and transposes; the down bias is rank 0's alone; EP takes whole
    /// experts and every rank its biases.
    #[test]
    fn gpt_oss_experts_follow_vllms_loader() {
        let (e, i, h) = (4u64, 6u64, 5u64);
        let g = |part| Geometry::GptOssExperts {
            part,
            experts: e,
            intermediate: i,
            hidden: h,
        };
        let at = |idx: &[u64], shape: &[u64]| -> i64 {
            idx.iter().zip(shape).fold(0, |acc, (x, n)| acc * n + x) as i64
        };
        for (tp, ep) in [(1, false), (2, false), (3, false), (2, true), (4, true)] {
            for rank in 0..tp {
                let r = Rank { tp, rank, ep };
                let (experts, ir, t) = if ep {
                    let n = e / tp;
                    ((rank * n..(rank + 1) * n).collect::<Vec<_>>(), i, 0)
                } else {
                    ((0..e).collect(), i / tp, rank)
                };
                let ctx = format!("tp{tp} r{rank} ep{ep}");
                let (shape, w13) = gpt_oss_rank(&g(GptOssPart::W13Weight), r);
                assert_eq!(shape, vec![experts.len() as u64, 2 * ir, h], "{ctx}");
                let (_, w2) = gpt_oss_rank(&g(GptOssPart::W2Weight), r);
                let (_, b13) = gpt_oss_rank(&g(GptOssPart::W13Bias), r);
                let (_, b2) = gpt_oss_rank(&g(GptOssPart::W2Bias), r);
                for (j, &ex) in experts.iter().enumerate() {
                    let j = j as u64;
                    for c in 0..2 * ir {
                        for hh in 0..h {
                            let want = at(&[ex, hh, 2 * ir * t + c], &[e, h, 2 * i]);
                            let got = w13[at(&[j, c, hh], &[e, 2 * ir, h]) as usize];
                            assert_eq!(got, want, "{ctx} w13 [{j}, {c}, {hh}]");
                        }
                        let want = at(&[ex, 2 * ir * t + c], &[e, 2 * i]);
                        assert_eq!(b13[at(&[j, c], &[e, 2 * ir]) as usize], want, "{ctx}");
                    }
                    for hh in 0..h {
                        for x in 0..ir {
                            let want = at(&[ex, ir * t + x], &[e, i]) * h as i64 + hh as i64;
                            let got = w2[at(&[j, hh, x], &[e, h, ir]) as usize];
                            assert_eq!(got, want, "{ctx} w2 [{j}, {hh}, {x}]");
                        }
                        let want = if ep || rank == 0 {
                            at(&[ex, hh], &[e, h])
                        } else {
                            0
                        };
                        assert_eq!(b2[at(&[j, hh], &[e, h]) as usize], want, "{ctx}");
                    }
                }
            }
        }
        // vLLM's loader gives each EP rank E / tp experts; a remainder would not load.
        let r = Rank {
            tp: 3,
            rank: 0,
            ep: true,
        };
        assert_eq!(
            g(GptOssPart::W13Weight).check(r),
            ["number of experts (4) is not divisible by tp (3)"]
        );
        // MLPBlock asserts the intermediate size divides, expert parallel or not.
        assert_eq!(
            g(GptOssPart::W2Bias).check(Rank { tp: 4, ..r }),
            ["expert intermediate size (6) is not divisible by tp (4)"]
        );
    }

    #[test]
    fn extra_experts_go_to_the_first_ranks() {
        assert_eq!(local_experts(5, 2, 0), 0..3);
        assert_eq!(local_experts(5, 2, 1), 3..5);
        assert_eq!(local_experts(8, 8, 7), 7..8);
    }

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
