//! Pieces phase: per rank, the tensors vLLM holds in state_dict order, each with the pieces that
//! fill it — a copy of a block of a source tensor per slice of its layout, or a fill.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use rayon::prelude::*;

use super::assign::Assigned;
use super::params::Param;
use super::pieces::{Pieces, copy};
use super::slots::{Fed, Feed};
use super::stages::{OnStage, Stage, holds};
use super::{OutTensor, Piece, Planner, RankPlan, Region};
use crate::layout::types::{Block, PerExpert, PerExpertCopies, Rank, Slice};
use crate::layout::{ExpertLastShard, ExpertTensorScale, Geometry, LastShard};
use crate::mapping::Compute;
use crate::mapping::rules::ShardId;

impl Planner<'_> {
    /// Every rank's tensors, stage by stage (global rank `pp_rank * tp + tp_rank`). A stage holds
    /// its layers' parameters and the head and tail parameters built on it; each tensor is what
    /// the same TP rank holds without pipeline parallelism. Tied pairs present on a stage become
    /// one key, the smaller name, at the first one's place (ShardedStateLoader._filter_subtensors);
    /// a tied parameter alone on its stage keeps its own name.
    pub(super) fn ranks(
        &self,
        params: &[Param],
        a: &Assigned,
        fused: &[bool],
        stages: &[Stage],
        on: &[OnStage],
    ) -> Vec<RankPlan> {
        let mut out = Vec::new();
        let shared: Vec<SharedSources> = params.iter().map(|_| OnceLock::new()).collect();
        for stage in stages {
            let here: Vec<bool> = params
                .iter()
                .zip(on)
                .map(|(p, on)| holds(p, on, stage, stages.len()))
                .collect();
            let alias_name: HashMap<usize, String> = params
                .iter()
                .enumerate()
                .filter(|&(pi, _)| here[pi])
                .filter_map(|(_, p)| {
                    let a = p.alias_of?;
                    here[a].then(|| (a, params[a].name.clone().min(p.name.clone())))
                })
                .collect();
            // Ranks are independent: a large MoE has hundreds of thousands of pieces per stage.
            let plans: Vec<RankPlan> = (0..self.opts.tp)
                .into_par_iter()
                .map(|tp_rank| {
                    let r = Rank {
                        tp: self.opts.tp,
                        rank: tp_rank,
                        ep: self.opts.expert_parallel,
                    };
                    let tensors: Vec<OutTensor> = params
                        .iter()
                        .enumerate()
                        .filter(|&(pi, p)| here[pi] && p.alias_of.is_none_or(|a| !here[a]))
                        .filter_map(|(pi, p)| {
                            // A tied parameter without its partner on this stage is filled as the
                            // partner would be: they are one tensor.
                            let src = p.alias_of.unwrap_or(pi);
                            let name = alias_name.get(&pi).unwrap_or(&p.name);
                            let fed = (&a.fed[src], &shared[src]);
                            rank_tensor(&params[src], name, r, fed, fused[src])
                        })
                        .collect();
                    RankPlan {
                        rank: stage.pp_rank * self.opts.tp + tp_rank,
                        pp_rank: stage.pp_rank,
                        tp_rank,
                        bytes: tensors.iter().map(|t| t.bytes).sum(),
                        tensors,
                    }
                })
                .collect();
            out.extend(plans);
        }
        out
    }
}

/// A fused expert parameter's copy sources for all its experts, in [`Pieces::push_experts`]'
/// order, worked out by the first rank that needs them and shared by the others: at TP every
/// rank reads every expert (a DeepSeek-V3 plan looked the same 90,000 slots up on each of 8
/// ranks). Kept with the shard ids they were worked out for.
type SharedSources = OnceLock<(Vec<Option<ShardId>>, Option<Arc<[u32]>>)>;

/// Rank `r`'s tensor of `p`, named `name`; `None` when it is empty (vLLM drops those: an EP rank
/// without experts).
fn rank_tensor(
    p: &Param,
    name: &str,
    r: Rank,
    (fed, shared): (&Fed, &SharedSources),
    fused: bool,
) -> Option<OutTensor> {
    let l = p.geometry.rank_layout(r, fused);
    let numel: u64 = l.shape.iter().product();
    if numel == 0 {
        return None;
    }
    let fill = p.fill;
    let mut pieces = Pieces::default();
    if p.buffer {
        pieces.push(Piece::Fill {
            dst_start: 0,
            count: numel,
            value: fill,
        });
    } else {
        match l.per_expert {
            None => {
                for slice in &l.slices {
                    match fed.get(&slice.slot) {
                        Some(feed) => push_copies(&mut pieces, feed, slice),
                        // An optional parameter the checkpoint leaves out keeps its fill value.
                        None => pieces.extend(unfilled(&slice.block(), fill)),
                    }
                }
            }
            Some(pe) => {
                let experts = p.geometry.expert_count().unwrap_or(pe.first + pe.count);
                let all = shared_sources(shared, &l.slices, experts, fed);
                push_experts(&mut pieces, &l.slices, pe, (fed, all), fill)
            }
        }
        match p.geometry.strided_per_expert(r) {
            Some(copies) => push_strided_experts(&mut pieces, copies, fed, fill),
            None => {
                for (slot, b, region) in p.geometry.strided(r) {
                    match fed.get(&slot) {
                        Some(feed) => {
                            let region = Region {
                                dequant: feed.dequant,
                                ..region
                            };
                            pieces.push(copy(feed.source, region, b))
                        }
                        None => pieces.extend(unfilled(&b, fill)),
                    }
                }
            }
        }
        pieces.extend(l.zeros.iter().map(|&(at, count)| Piece::Fill {
            dst_start: at,
            count,
            value: 0.0,
        }));
        for &z in &l.zero_rows {
            pieces.push_zero_rows(z);
        }
        let max_of = p.geometry.max_of(r);
        if max_of > 1 {
            pieces = reduced(&pieces, max_of);
        }
        if p.spec.compute == Some(Compute::NegExp) {
            pieces = negated_exps(&pieces);
        }
        if matches!(
            p.geometry,
            Geometry::ExpertTensorScale(ExpertTensorScale { input: true, .. })
                | Geometry::LastShard(LastShard { .. })
                | Geometry::ExpertLastShard(ExpertLastShard { .. })
        ) {
            let mut list: Vec<Piece> = pieces.iter().collect();
            keep_last_loaded(&mut list);
            pieces = list.into();
        }
    }
    Some(OutTensor {
        name: name.to_string(),
        dtype: p.dtype,
        shape: l.shape,
        bytes: p.dtype.byte_size(numel).unwrap_or(0),
        pieces,
    })
}

/// `pieces` with every copy turned into `-exp` of its elements (Mamba2's `A`, `compute:
/// neg_exp`): an engine reduction, since the value is computed, not copied.
fn negated_exps(pieces: &Pieces) -> Pieces {
    let list: Vec<Piece> = (pieces.iter())
        .map(|mut p| {
            if let Piece::Copy { region, .. } = &mut p {
                region.neg_exp = true;
            }
            p
        })
        .collect();
    list.into()
}

/// `pieces` with every copy turned into a reduction over groups of `max_of` source elements:
/// a destination row holds `row / max_of` elements.
fn reduced(pieces: &Pieces, max_of: u64) -> Pieces {
    let list: Vec<Piece> = (pieces.iter())
        .map(|p| match p {
            Piece::Copy {
                source,
                region,
                rows,
                row,
                src_start,
                src_stride,
                dst_start,
                dst_stride,
                src_elem_stride,
            } => Piece::Copy {
                source,
                region: Region { max_of, ..region },
                rows,
                row: row / max_of,
                src_start,
                src_stride,
                dst_start,
                dst_stride: dst_stride / max_of,
                src_elem_stride,
            },
            // The fill of a scale the checkpoint leaves out covers the source's span too.
            Piece::Fill {
                dst_start,
                count,
                value,
            } => Piece::Fill {
                dst_start: dst_start / max_of,
                count: count / max_of,
                value,
            },
        })
        .collect();
    list.into()
}

/// An expert's w1 and w3 input scales (and pack-quantized `weight_shape`s), and a fused
/// layer's shards of a whole value, write one slot: vLLM keeps the one it loads last
/// (`_load_single_value`, routed_experts.py:827–861; `BasevLLMParameter`'s loader), and sources
/// are numbered in load order.
/// A copy beats a fill for the same slot.
fn keep_last_loaded(pieces: &mut Vec<Piece>) {
    let rank = |p: &Piece| match p {
        Piece::Copy { source, .. } => Some(*source),
        Piece::Fill { .. } => None,
    };
    let dst = |p: &Piece| match p {
        Piece::Copy { dst_start, .. } | Piece::Fill { dst_start, .. } => *dst_start,
    };
    let mut best: HashMap<u64, usize> = HashMap::new();
    for (k, p) in pieces.iter().enumerate() {
        let e = best.entry(dst(p)).or_insert(k);
        if rank(p) > rank(&pieces[*e]) {
            *e = k;
        }
    }
    let keep: std::collections::HashSet<usize> = best.into_values().collect();
    let mut k = 0;
    pieces.retain(|_| {
        k += 1;
        keep.contains(&(k - 1))
    });
}

/// The sources of `slices`' slots for experts `0..experts`, shared with the ranks before when
/// they were worked out for the same slots (`None` otherwise, or when some slot is not a plain
/// copy: the rank then works out its own).
fn shared_sources(
    shared: &SharedSources,
    slices: &[Slice],
    experts: u64,
    fed: &Fed,
) -> Option<Arc<[u32]>> {
    let (for_shards, sources) = shared.get_or_init(|| {
        (
            slices.iter().map(|s| s.slot.0.clone()).collect(),
            plain_sources(slices, 0..experts, fed).map(Arc::from),
        )
    });
    let same = for_shards.len() == slices.len()
        && for_shards.iter().zip(slices).all(|(a, s)| *a == s.slot.0);
    sources.clone().filter(|_| same)
}

/// For each expert of `experts` in turn, the source of each slice's slot, when every one is a
/// plain copy (no rotary rows, nothing missing); `None` otherwise.
fn plain_sources(slices: &[Slice], experts: std::ops::Range<u64>, fed: &Fed) -> Option<Vec<u32>> {
    let tables: Vec<_> = slices.iter().map(|s| fed.experts_of(&s.slot.0)).collect();
    let plain = |e: u64, k: usize| {
        (tables[k].as_ref()?.get(e))
            .filter(|f| f.rotary_heads.is_none())
            .and_then(|f| u32::try_from(f.source).ok())
    };
    experts
        .flat_map(|e| (0..slices.len()).map(move |k| (e, k)))
        .map(|(e, k)| plain(e, k))
        .collect()
}

/// Strided copies repeated expert by expert (`each`: the rank's first expert's), compact when
/// every expert's scale is a plain copy, as [`push_experts`] keeps slices.
fn push_strided_experts(out: &mut Pieces, (each, pe): PerExpertCopies, fed: &Fed, fill: f64) {
    let experts = pe.first..pe.first + pe.count;
    let plain = |e: u64, shard: &Option<ShardId>| {
        (fed.expert(shard, e))
            .filter(|f| f.rotary_heads.is_none())
            .and_then(|f| u32::try_from(f.source).ok())
    };
    let sources: Option<Vec<u32>> = (experts.clone())
        .flat_map(|e| each.iter().map(move |((shard, _), _, _)| (e, shard)))
        .map(|(e, shard)| plain(e, shard))
        .collect();
    if let Some(sources) = sources {
        let blocks = each.into_iter().map(|(_, b, region)| (b, region)).collect();
        out.push_experts(blocks, pe.dst_step, sources.into());
        return;
    }
    for (j, e) in (0..pe.count).zip(experts) {
        for ((shard, _), b, region) in &each {
            let b = Block {
                dst_start: b.dst_start + j * pe.dst_step,
                ..*b
            };
            match fed.expert(shard, e) {
                Some(feed) => out.push(copy(feed.source, *region, b)),
                None => out.extend(unfilled(&b, fill)),
            }
        }
    }
}

/// Copies for every expert of a fused expert tensor: `slices` (the first expert's) repeated
/// expert by expert, as [`crate::layout::types::RankLayout::all_slices`] would list them, each block
/// and region worked out once. `all` holds the sources for all the parameter's experts when
/// every one is a plain copy: the copies are then kept compact.
fn push_experts(
    out: &mut Pieces,
    slices: &[Slice],
    pe: PerExpert,
    (fed, all): (&Fed, Option<Arc<[u32]>>),
    fill: f64,
) {
    let each: Vec<(Block, Region)> = slices.iter().map(|s| (s.block(), s.region())).collect();
    let n = slices.len() as u64;
    let range = usize::try_from(pe.first * n)
        .ok()
        .zip(usize::try_from((pe.first + pe.count) * n).ok());
    if let Some(all) = all
        && let Some((from, to)) = range
        && let Some(part) = all.get(from..to)
    {
        // At TP every rank holds every expert: one list for all of them.
        let sources = if part.len() == all.len() {
            all.clone()
        } else {
            Arc::from(part)
        };
        out.push_experts(each, pe.dst_step, sources);
        return;
    }
    let experts = pe.first..pe.first + pe.count;
    if let Some(sources) = plain_sources(slices, experts.clone(), fed) {
        out.push_experts(each, pe.dst_step, sources.into());
        return;
    }
    for (j, e) in (0..pe.count).zip(experts) {
        let shift = j * pe.dst_step;
        for (slice, &(b, region)) in slices.iter().zip(&each) {
            let b = Block {
                dst_start: b.dst_start + shift,
                ..b
            };
            match fed.expert(&slice.slot.0, e) {
                Some(feed) if feed.rotary_heads.is_none() => out.push(copy(feed.source, region, b)),
                Some(feed) => {
                    let slice = Slice {
                        slot: (slice.slot.0.clone(), Some(e)),
                        dst_base: slice.dst_base + shift,
                        ..slice.clone()
                    };
                    push_copies(out, feed, &slice);
                }
                None => out.extend(unfilled(&b, fill)),
            }
        }
    }
}

/// Copies for one slice; with a rotary permutation (Mistral-native q/k) each head's even rows go
/// to its first half and odd rows to its second half.
fn push_copies(out: &mut Pieces, feed: &Feed, slice: &Slice) {
    let b = slice.block();
    let region = Region {
        dequant: feed.dequant,
        ..slice.region()
    };
    let source = feed.source;
    // The checkpoint tensor's shape, as the assign phase checked it (a 0-d tensor is viewed as
    // one element, so there is always a dim 0).
    let src_shape = &slice.src_shape;
    match feed.rotary_heads {
        Some(h) if slice.dim == 0 && h > 0 && src_shape[0].is_multiple_of(h) => {
            let hd = src_shape[0] / h;
            let inner: u64 = src_shape[1..].iter().product();
            let mut dst = b.dst_start;
            let mut row = slice.from;
            while row < slice.to {
                let head_start = row / hd * hd;
                for half in 0..2 {
                    out.push(Piece::Copy {
                        source,
                        region: Region {
                            rotary: true,
                            ..region
                        },
                        rows: hd / 2,
                        row: inner,
                        src_start: (head_start + half) * inner,
                        src_stride: 2 * inner,
                        dst_start: dst + half * (hd / 2) * inner,
                        dst_stride: inner,
                        src_elem_stride: 1,
                    });
                }
                dst += hd * inner;
                row = head_start + hd;
            }
        }
        _ => out.push(copy(source, region, b)),
    }
}

/// Fills for the destination rows of `b`, which no checkpoint tensor fills.
fn unfilled(b: &Block, value: f64) -> impl Iterator<Item = Piece> + '_ {
    (0..b.rows).map(move |k| Piece::Fill {
        dst_start: b.dst_start + k * b.dst_stride,
        count: b.row,
        value,
    })
}
