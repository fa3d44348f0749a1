//! The geometry of quantization scales (vLLM 0.33 `parameter.py` `PerTensorScaleParameter`,
//! `BlockQuantScaleParameter`, `linear.py` `adjust_block_scale_shard`, `fused_moe/routed_experts.py`):
//! per rank, which elements of which checkpoint scale fill which part of the scale parameter.
//! Per-channel scales need no kind of their own: they are sliced like their weight's rows.

use super::Geometry;
use super::experts::local_experts;
use super::types::{Block, PerExpert, PerExpertCopies, Rank, RankLayout, Slice, SlotKey, name};
use crate::layout::Region;
use crate::mapping::ExpertPart;
use crate::mapping::rules::ShardId;

/// One output partition of a linear weight on one rank, in rows: where it sits in the rank's
/// tensor, where the checkpoint holds it, and which chunk of the checkpoint shard it takes.
struct Part {
    slot: SlotKey,
    local_off: u64,
    local_size: u64,
    global_off: u64,
    global_size: u64,
    /// The chunk index: the rank for q and split layers, `rank / replicas` for replicated kv heads.
    chunk: u64,
    /// For a shard a tuple fills: the sizes of the tuple's shards before it, and the tuple's rows
    /// (vLLM cuts the tuple's scale at its shards' block-rounded sizes).
    tuple: Option<(Vec<u64>, u64)>,
}

/// The logical shards of a linear weight, as slot keys (qkv: q, k, v; merged: 0, 1, …; else one).
pub(super) fn logical_shards(of: &Geometry) -> Vec<SlotKey> {
    match of {
        Geometry::Qkv { .. } => ["q", "k", "v"].iter().map(|s| (name(s), None)).collect(),
        Geometry::MergedColumn { sizes, .. } => (0..sizes.len() as u64)
            .map(|k| (Some(ShardId::Index(k)), None))
            .collect(),
        _ => vec![(None, None)],
    }
}

/// The output partitions of `of` on rank `r` and its input width (global, local), or `None` for
/// a layout that is not a linear weight.
fn partitions(of: &Geometry, r: Rank) -> Option<(Vec<Part>, u64, u64)> {
    let r = match of {
        Geometry::MergedColumn {
            disable_tp: true, ..
        } => r.without_tp_if(true),
        _ => r,
    };
    let (tp, rk) = (r.tp, r.rank);
    let whole = |out: u64, chunk: u64, local: u64| Part {
        slot: (None, None),
        local_off: 0,
        local_size: local,
        global_off: 0,
        global_size: out,
        chunk,
        tuple: None,
    };
    Some(match of {
        Geometry::Replicated { shape } if shape.len() == 2 => {
            (vec![whole(shape[0], 0, shape[0])], shape[1], shape[1])
        }
        Geometry::Column { shape } if shape.len() == 2 => {
            (vec![whole(shape[0], rk, shape[0] / tp)], shape[1], shape[1])
        }
        Geometry::Row { shape } => (vec![whole(shape[0], 0, shape[0])], shape[1], shape[1] / tp),
        Geometry::MergedColumn { sizes, inner, .. } if inner.len() == 1 => {
            let (mut local, mut global) = (0, 0);
            let parts = sizes
                .iter()
                .enumerate()
                .map(|(k, s)| {
                    let p = Part {
                        slot: (Some(ShardId::Index(k as u64)), None),
                        local_off: local,
                        local_size: s / tp,
                        global_off: global,
                        global_size: *s,
                        chunk: rk,
                        tuple: None,
                    };
                    local += s / tp;
                    global += s;
                    p
                })
                .collect();
            (parts, inner[0], inner[0])
        }
        Geometry::MergedTuples {
            sizes,
            inner,
            tuples,
        } if inner.len() == 1 => (tuple_parts(sizes, inner, tuples, r)?, inner[0], inner[0]),
        Geometry::Qkv {
            heads,
            kv_heads,
            head_dim,
            inner,
        } if inner.len() == 1 => {
            let q = heads / tp * head_dim;
            let (kv_local, replicas) = if tp >= *kv_heads {
                (1, tp / kv_heads.max(&1))
            } else {
                (kv_heads / tp, 1)
            };
            let kv = kv_local * head_dim;
            let part =
                |s: &'static str, local_off, local_size, global_off, global_size, chunk| Part {
                    slot: (name(s), None),
                    local_off,
                    local_size,
                    global_off,
                    global_size,
                    chunk,
                    tuple: None,
                };
            let (gq, gkv) = (heads * head_dim, kv_heads * head_dim);
            let parts = vec![
                part("q", 0, q, 0, gq, rk),
                part("k", q, kv, gq, gkv, rk / replicas.max(1)),
                part("v", q + kv, kv, gq + gkv, gkv, rk / replicas.max(1)),
            ];
            (parts, inner[0], inner[0])
        }
        _ => return None,
    })
}

/// A merged column's parts, those a tuple fills taking their rows from the tuple's tensor.
fn tuple_parts(sizes: &[u64], inner: &[u64], tuples: &[Vec<u64>], r: Rank) -> Option<Vec<Part>> {
    let plain = Geometry::MergedColumn {
        sizes: sizes.to_vec(),
        inner: inner.to_vec(),
        disable_tp: false,
    };
    let (mut parts, _, _) = partitions(&plain, r)?;
    for (k, p) in parts.iter_mut().enumerate() {
        if let Some(t) = tuples.iter().find(|t| t.contains(&(k as u64))) {
            let of = |j: &u64| sizes[*j as usize];
            let before = t.iter().take_while(|&&j| j != k as u64).map(of).collect();
            p.slot = (Some(ShardId::Tuple(t.clone())), None);
            p.tuple = Some((before, t.iter().map(of).sum()));
        }
    }
    Some(parts)
}

/// Per-tensor scales: `[shards]` F32, the same on every rank; a fused checkpoint tensor's single
/// scale goes into every slot.
pub(super) fn tensor_scale(of: &Geometry, fused: bool) -> RankLayout {
    let slots = logical_shards(of);
    let n = slots.len() as u64;
    let slices = slots
        .into_iter()
        .enumerate()
        .map(|(k, slot)| Slice {
            slot: if fused { (None, None) } else { slot },
            src_shape: vec![1],
            dim: 0,
            from: 0,
            to: 1,
            dst_shape: vec![n],
            dst_at: k as u64,
            dst_base: 0,
        })
        .collect();
    RankLayout::new(vec![n], slices, Vec::new())
}

/// The checkpoint shape of a block scale for a weight of `shape`.
pub(super) fn blocks_of(shape: &[u64], [bn, bk]: [u64; 2]) -> Vec<u64> {
    match shape {
        [rows, cols] => vec![rows.div_ceil(bn), cols.div_ceil(bk)],
        other => other.to_vec(),
    }
}

/// Block scales of a linear weight: each output partition's rows converted to blocks with vLLM's
/// ceil formulas (`adjust_block_scale_shard`), the checkpoint's rows taken from chunk
/// `chunk · size_b`; a row-parallel weight's scale takes its columns of blocks.
pub(super) fn block_scale(of: &Geometry, [bn, bk]: [u64; 2], r: Rank, fused: bool) -> RankLayout {
    let Some((parts, in_global, in_local)) = partitions(of, r) else {
        return RankLayout::new(vec![], vec![], vec![]);
    };
    let rows: u64 = parts.iter().map(|p| p.local_size).sum::<u64>().div_ceil(bn);
    let cols = in_local.div_ceil(bk);
    let shape = vec![rows, cols];
    if let Geometry::Row { shape: w } = of {
        let src = vec![w[0].div_ceil(bn), in_global.div_ceil(bk)];
        let slice = Slice {
            slot: (None, None),
            src_shape: src,
            dim: 1,
            from: r.rank * cols,
            to: (r.rank + 1) * cols,
            dst_shape: shape.clone(),
            dst_at: 0,
            dst_base: 0,
        };
        return RankLayout::new(shape, vec![slice], vec![]);
    }
    let total_global: u64 = parts.iter().map(|p| p.global_size).sum();
    let src_cols = in_global.div_ceil(bk);
    let slices = parts
        .iter()
        .map(|p| {
            let size_b = p.local_size.div_ceil(bn);
            let off_b = p.local_off.div_ceil(bn);
            let (slot, src_rows, base) = if fused {
                (
                    (None, None),
                    total_global.div_ceil(bn),
                    p.global_off.div_ceil(bn),
                )
            } else if let Some((before, rows)) = &p.tuple {
                // weight_loader_v2 with a tuple: the scale's parts by `adjust_block_scale_shard`
                // of each shard's size, then each part as a lone shard.
                let base = before.iter().map(|s| s.div_ceil(bn)).sum();
                (p.slot.clone(), rows.div_ceil(bn), base)
            } else {
                (p.slot.clone(), p.global_size.div_ceil(bn), 0)
            };
            let from = base + p.chunk * size_b;
            Slice {
                slot,
                src_shape: vec![src_rows, src_cols],
                dim: 0,
                from,
                to: from + size_b,
                dst_shape: shape.clone(),
                dst_at: off_b,
                dst_base: 0,
            }
        })
        .collect();
    RankLayout::new(shape, slices, vec![])
}

/// vLLM's `validate_fp8_block_shape` for a linear weight on rank `r`, and the slices a misaligned
/// merged layer (which vLLM lets through, `_maybe_allow_fp8_block_shape_mismatch`) would take
/// beyond its checkpoint scale.
pub(super) fn block_scale_check(of: &Geometry, [bn, bk]: [u64; 2], r: Rank) -> Vec<String> {
    let Some((parts, _, in_local)) = partitions(of, r) else {
        return vec!["block scales need a 2-D linear weight".into()];
    };
    let mut out = Vec::new();
    if r.tp > 1 && matches!(of, Geometry::Row { .. }) && !in_local.is_multiple_of(bk) {
        out.push(format!(
            "Weight input_size_per_partition = {in_local} is not divisible by weight quantization block_k = {bk}."
        ));
    }
    let split = r.tp > 1 && matches!(of, Geometry::Column { .. });
    if split && !parts[0].local_size.is_multiple_of(bn) {
        out.push(format!(
            "Weight output_partition_size = {} is not divisible by weight quantization block_n = {bn}.",
            parts[0].local_size
        ));
    }
    // A tuple's part is narrowed out of the tuple's scale first (weight_loader_v2): a rank's
    // blocks past the part's own fail there, even inside the tuple's scale.
    for (k, p) in parts.iter().enumerate().filter(|(_, p)| p.tuple.is_some()) {
        let (size_b, part_b) = (p.local_size.div_ceil(bn), p.global_size.div_ceil(bn));
        if out.is_empty() && r.tp * size_b > part_b {
            out.push(format!(
                "its block scales do not align with this TP size: rank {} would read blocks [{}, {}) of shard {k}'s {part_b} in the tuple's scale (output partitions {:?} are not multiples of block_n = {bn}); vLLM's loader fails on this",
                r.tp - 1,
                (r.tp - 1) * size_b,
                r.tp * size_b,
                parts.iter().map(|p| p.local_size).collect::<Vec<_>>()
            ));
        }
    }
    // A misaligned layer vLLM lets through still cannot be cut: say so, unless a message above
    // already explains it.
    let layout = block_scale(of, [bn, bk], r, false);
    for s in &layout.slices {
        // A shard's blocks, rounded up on their own, can run past the rank's scale, which vLLM
        // sizes by the rounded-up sum (create_fp8_scale_parameter): its narrow() then fails.
        if out.is_empty() && s.dst_at + (s.to - s.from) > layout.shape[s.dim] {
            out.push(format!(
                "its block scales do not align: the rank's scale has {} block rows, but shard {} takes rows [{}, {}) (output partitions {:?} are not multiples of block_n = {bn}); vLLM's loader fails on this",
                layout.shape[s.dim],
                s.slot.0.as_ref().map_or("0".to_string(), |x| x.to_string()),
                s.dst_at,
                s.dst_at + (s.to - s.from),
                parts.iter().map(|p| p.local_size).collect::<Vec<_>>()
            ));
            break;
        }
        if out.is_empty() && s.to > s.src_shape[s.dim] {
            out.push(format!(
                "its block scales do not align with this TP size: rank {} would read blocks [{}, {}) of a scale with {} (output partitions {:?} are not multiples of block_n = {bn}); vLLM's loader fails on this",
                r.rank,
                s.from,
                s.to,
                s.src_shape[s.dim],
                parts.iter().map(|p| p.local_size).collect::<Vec<_>>()
            ));
            break;
        }
    }
    out
}

/// The experts a rank holds and the TP split of their intermediate size: `(local experts, moe tp,
/// moe rank)`.
pub(super) fn expert_split(experts: u64, r: Rank) -> (std::ops::Range<u64>, u64, u64) {
    if r.ep {
        (local_experts(experts, r.tp, r.rank), 1, 0)
    } else {
        (0..experts, r.tp, r.rank)
    }
}

/// Per-tensor expert scales: `w13` `[E_loc, 2]` (w1, w3), or with `input` one slot per expert
/// that w1 and w3 both write (the later-loaded wins: see pieces.rs); `w2` `[E_loc]`.
pub(super) fn expert_tensor_scale(
    part: ExpertPart,
    experts: u64,
    input: bool,
    r: Rank,
) -> RankLayout {
    let (local, _, _) = expert_split(experts, r);
    let e_loc = local.end - local.start;
    let (shards, width): (&[&str], u64) = match (part, input) {
        (ExpertPart::W13, false) => (&["w1", "w3"], 2),
        (ExpertPart::W13, true) => (&["w1", "w3"], 1),
        (ExpertPart::W2, _) => (&["w2"], 1),
    };
    let first = Some(local.start);
    let slices = shards
        .iter()
        .enumerate()
        .map(|(h, s)| Slice {
            slot: (name(s), first),
            src_shape: vec![1],
            dim: 0,
            from: 0,
            to: 1,
            dst_shape: vec![1],
            dst_at: 0,
            dst_base: if width == 2 { h as u64 } else { 0 },
        })
        .collect();
    let shape = if width == 2 {
        vec![e_loc, 2]
    } else {
        vec![e_loc]
    };
    RankLayout::per_expert(shape, local, width, slices)
}

/// Block scales of fused experts: `w13` `[E_loc, 2·ceil(I_p/bn), ceil(H/bk)]` (w1 blocks, then
/// w3), `w2` `[E_loc, ceil(H/bn), ceil(I_p/bk)]`, each expert's checkpoint scale sliced by whole
/// blocks of this rank's intermediate part.
pub(super) fn expert_block_scale(
    part: ExpertPart,
    experts: u64,
    [intermediate, hidden]: [u64; 2],
    [bn, bk]: [u64; 2],
    r: Rank,
) -> RankLayout {
    let (local, moe_tp, moe_rank) = expert_split(experts, r);
    let ip = intermediate / moe_tp;
    let e_loc = local.end - local.start;
    if let Some(g) = refined_grid([intermediate, hidden], [bn, bk], r, experts) {
        // Filled by expert_block_refined's repeating copies.
        let shape = match part {
            ExpertPart::W13 => vec![e_loc, 2 * ip.div_ceil(g), hidden.div_ceil(g)],
            ExpertPart::W2 => vec![e_loc, hidden.div_ceil(g), ip.div_ceil(g)],
        };
        return RankLayout::new(shape, vec![], vec![]);
    }
    let first = Some(local.start);
    match part {
        ExpertPart::W13 => {
            let (rows_b, cols) = (ip.div_ceil(bn), hidden.div_ceil(bk));
            let slices = ["w1", "w3"]
                .iter()
                .enumerate()
                .map(|(h, s)| Slice {
                    slot: (name(s), first),
                    src_shape: vec![intermediate.div_ceil(bn), cols],
                    dim: 0,
                    from: moe_rank * rows_b,
                    to: (moe_rank + 1) * rows_b,
                    dst_shape: vec![2 * rows_b, cols],
                    dst_at: h as u64 * rows_b,
                    dst_base: 0,
                })
                .collect();
            let shape = vec![e_loc, 2 * rows_b, cols];
            RankLayout::per_expert(shape, local, 2 * rows_b * cols, slices)
        }
        ExpertPart::W2 => {
            let (rows, cols_b) = (hidden.div_ceil(bn), ip.div_ceil(bk));
            let slice = Slice {
                slot: (name("w2"), first),
                src_shape: vec![rows, intermediate.div_ceil(bk)],
                dim: 1,
                from: moe_rank * cols_b,
                to: (moe_rank + 1) * cols_b,
                dst_shape: vec![rows, cols_b],
                dst_at: 0,
                dst_base: 0,
            };
            RankLayout::per_expert(vec![e_loc, rows, cols_b], local, rows * cols_b, vec![slice])
        }
    }
}

/// The finer block vLLM gives expert scales when a rank's share of the intermediate size is not
/// whole blocks (`refine_fp8_moe_block_shape`, fused_moe/oracle/fp8.py:292–318: the gcd of both
/// block sides, the share and the hidden size, used when at least 32), or `None` when the
/// checkpoint's blocks fit as they are or cannot be refined.
fn refined_grid(
    [intermediate, hidden]: [u64; 2],
    [bn, bk]: [u64; 2],
    r: Rank,
    experts: u64,
) -> Option<u64> {
    let (_, moe_tp, _) = expert_split(experts, r);
    let ip = intermediate / moe_tp;
    if ip.is_multiple_of(bn) && (moe_tp == 1 || ip.is_multiple_of(bk)) {
        return None;
    }
    let g = gcd(gcd(bn, bk), gcd(ip, hidden));
    (g >= 32).then_some(g)
}

/// vLLM's checks on fused expert block scales (`validate_fp8_block_shape_moe`), after the
/// refinement that lets most shares through.
pub(super) fn expert_block_check(
    experts: u64,
    [intermediate, hidden]: [u64; 2],
    [bn, bk]: [u64; 2],
    r: Rank,
) -> Vec<String> {
    let (_, moe_tp, _) = expert_split(experts, r);
    let ip = intermediate / moe_tp;
    if ip.is_multiple_of(bn) && (moe_tp == 1 || ip.is_multiple_of(bk)) {
        return vec![];
    }
    if let Some(g) = refined_grid([intermediate, hidden], [bn, bk], r, experts) {
        // The repeated checkpoint grid must line up with the refined one exactly, which it does
        // when the full sizes are whole blocks (as in every released checkpoint).
        if !intermediate.is_multiple_of(bn)
            || !hidden.is_multiple_of(bn)
            || !hidden.is_multiple_of(bk)
        {
            return vec![format!(
                "the experts' scales would be refined to a {g}×{g} grid, but the intermediate size {intermediate} or hidden size {hidden} is not whole {bn}×{bk} blocks, so the repeated checkpoint scales do not line up"
            )];
        }
        return vec![];
    }
    if !ip.is_multiple_of(bn) {
        vec![format!(
            "The output_size of gate's and up's weight = {ip} is not divisible by weight quantization block_n = {bn}."
        )]
    } else {
        vec![format!(
            "The input_size of down's weight = {ip} is not divisible by weight quantization block_k = {bk}."
        )]
    }
}

/// Expert block scales on vLLM's refined grid of `g`: the checkpoint scales upsampled by
/// `repeat_interleave` (each one repeated `bn/g` times down and `bk/g` across,
/// routed_experts.py:950–960), then this rank's part taken as usual. Copies with a source element
/// stride of 0 repeat each checkpoint scale across a row.
///
/// The rank's first expert's copies, and the step to the next expert's: every local expert
/// repeats them from its own checkpoint scale, so the pieces phase keeps them compact (a
/// MiniMax-M2 FP8 rank at TP 8 holds 256 experts in each of 62 layers). `None` when the grid is
/// not refined.
pub(super) fn expert_block_refined(
    part: ExpertPart,
    experts: u64,
    [intermediate, hidden]: [u64; 2],
    [bn, bk]: [u64; 2],
    r: Rank,
) -> Option<PerExpertCopies> {
    let g = refined_grid([intermediate, hidden], [bn, bk], r, experts)?;
    let (local, moe_tp, moe_rank) = expert_split(experts, r);
    let ip = intermediate / moe_tp;
    let (fn_, fk) = (bn / g, bk / g);
    let first = Some(local.start);
    // `rows` rows of `len` copies of one checkpoint scale each, `src_stride` apart in the
    // checkpoint scale and `dst_stride` apart in the rank's tensor.
    let repeat = |src_start, rows, src_stride, len, dst_start, dst_stride| Block {
        rows,
        row: len,
        src_start,
        src_stride,
        dst_start,
        dst_stride,
        src_elem_stride: 0,
    };
    let region = |first: u64, rows: u64| Region {
        range: Some((0, first, first + rows)),
        ..Region::ALL
    };
    let mut each = Vec::new();
    let dst_step = match part {
        ExpertPart::W13 => {
            // [E, 2·I_p/g, H/g]: w1's rows, then w3's; a row repeats each of the checkpoint row's
            // H/bk scales bk/g times.
            let (rows, cols, src_cols) = (ip.div_ceil(g), hidden.div_ceil(g), hidden.div_ceil(bk));
            for (h, s) in ["w1", "w3"].iter().enumerate() {
                for i in 0..rows {
                    let src_row = (moe_rank * rows + i) / fn_;
                    let dst = (h as u64 * rows + i) * cols;
                    let b = repeat(src_row * src_cols, src_cols, 1, fk, dst, fk);
                    each.push(((name(s), first), b, region(src_row, 1)));
                }
            }
            2 * rows * cols
        }
        ExpertPart::W2 => {
            // [E, H/g, I_p/g]: this rank's columns of the upsampled grid; a run of them may start
            // or end inside a checkpoint scale's repeats. Destination row i reads checkpoint row
            // i / (bn/g): the rows of one residue modulo bn/g step through the checkpoint rows
            // one by one, so each (residue, run) is one block down all of them.
            let (rows, cols, src_cols) = (
                hidden.div_ceil(g),
                ip.div_ceil(g),
                intermediate.div_ceil(bk),
            );
            for a in 0..fn_.min(rows) {
                let count = (rows - a).div_ceil(fn_);
                let mut c = 0;
                while c < cols {
                    let global = moe_rank * cols + c;
                    let (src_col, len) = (global / fk, (fk - global % fk).min(cols - c));
                    let b = repeat(src_col, count, src_cols, len, a * cols + c, fn_ * cols);
                    each.push(((name("w2"), first), b, region(0, count)));
                    c += len;
                }
            }
            rows * cols
        }
    };
    let count = local.end - local.start;
    Some((
        each,
        PerExpert {
            first: local.start,
            count,
            dst_step,
        },
    ))
}

fn gcd(a: u64, b: u64) -> u64 {
    if b == 0 { a } else { gcd(b, a % b) }
}

/// Shapes checkpoint expert block scales must have.
pub(super) fn expert_block_source(
    part: ExpertPart,
    [intermediate, hidden]: [u64; 2],
    [bn, bk]: [u64; 2],
) -> Vec<u64> {
    match part {
        ExpertPart::W13 => vec![intermediate.div_ceil(bn), hidden.div_ceil(bk)],
        ExpertPart::W2 => vec![hidden.div_ceil(bn), intermediate.div_ceil(bk)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rank(tp: u64, rank: u64) -> Rank {
        Rank {
            tp,
            rank,
            ep: false,
        }
    }

    /// vllm-spec §6.2's Qwen3-8B-FP8 table (H 4096, 32/8 heads of 128, I 12288, block 128).
    #[test]
    fn qwen3_8b_block_scales_match_the_spec_table() {
        let qkv = Geometry::Qkv {
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            inner: vec![4096],
        };
        let gate_up = Geometry::MergedColumn {
            sizes: vec![12288, 12288],
            inner: vec![4096],
            disable_tp: false,
        };
        let down = Geometry::Row {
            shape: vec![4096, 12288],
        };
        let o = Geometry::Row {
            shape: vec![4096, 4096],
        };
        let b = [128, 128];
        let ranges = |l: &RankLayout| -> Vec<(u64, u64, u64)> {
            l.slices.iter().map(|s| (s.from, s.to, s.dst_at)).collect()
        };
        // TP2, rank 1: q rows 0–15 ← [16, 32), k 16–19 ← [4, 8), v 20–23 ← [4, 8).
        let l = block_scale(&qkv, b, rank(2, 1), false);
        assert_eq!(l.shape, vec![24, 32]);
        assert_eq!(ranges(&l), vec![(16, 32, 0), (4, 8, 16), (4, 8, 20)]);
        assert_eq!(
            block_scale(&gate_up, b, rank(2, 1), false).shape,
            vec![96, 32]
        );
        assert_eq!(block_scale(&down, b, rank(2, 1), false).shape, vec![32, 48]);
        assert_eq!(block_scale(&o, b, rank(2, 1), false).shape, vec![32, 16]);
        // TP16, rank 5: q 0–1 ← [10, 12), k 2 ← row 5 // 2 = 2, v 3 ← row 2.
        let l = block_scale(&qkv, b, rank(16, 5), false);
        assert_eq!(l.shape, vec![4, 32]);
        assert_eq!(ranges(&l), vec![(10, 12, 0), (2, 3, 2), (2, 3, 3)]);
        assert_eq!(block_scale(&down, b, rank(8, 0), false).shape, vec![32, 12]);
        for g in [&qkv, &gate_up, &down, &o] {
            assert!(block_scale_check(g, b, rank(16, 3)).is_empty());
        }
    }

    #[test]
    fn a_row_parallel_shard_smaller_than_a_block_is_refused_with_vllms_message() {
        let down = Geometry::Row {
            shape: vec![128, 256],
        };
        let msgs = block_scale_check(&down, [32, 32], rank(16, 0));
        assert_eq!(
            msgs,
            vec![
                "Weight input_size_per_partition = 16 is not divisible by weight quantization block_k = 32."
            ]
        );
    }

    /// Applies `blocks` to a source whose element k holds k, into a destination of `n` elements.
    fn apply(blocks: &[(SlotKey, Block, Region)], n: u64) -> Vec<i64> {
        let mut out = vec![-1i64; n as usize];
        for (_, b, _) in blocks {
            for k in 0..b.rows {
                for x in 0..b.row {
                    let src = b.src_start + k * b.src_stride + x * b.src_elem_stride;
                    let dst = b.dst_start + k * b.dst_stride + x;
                    assert_eq!(out[dst as usize], -1, "element {dst} written twice");
                    out[dst as usize] = src as i64;
                }
            }
        }
        out
    }

    fn expand(c: Option<PerExpertCopies>) -> Vec<(SlotKey, Block, Region)> {
        super::super::strided::each_expert(c.expect("a refined grid"))
    }

    /// vllm-spec §6.3: Qwen3-30B-A3B-FP8 at TP 8 has I_p = 96, refined to 32×32 (×4): w13 scales
    /// [128, 6, 64], w2 [128, 64, 3], each element the checkpoint scale upsampled by
    /// repeat_interleave then sliced for the rank.
    #[test]
    fn qwen3_30b_moe_at_tp8_gets_vllms_refined_grid() {
        let (e, i, h, b) = (128, 768, 2048, [128, 128]);
        assert!(expert_block_check(e, [i, h], b, rank(8, 0)).is_empty());
        for rk in [0, 3, 7] {
            let r = rank(8, rk);
            let w13 = expert_block_scale(ExpertPart::W13, e, [i, h], b, r);
            let w2 = expert_block_scale(ExpertPart::W2, e, [i, h], b, r);
            assert_eq!(
                (w13.shape.clone(), w2.shape.clone()),
                (vec![128, 6, 64], vec![128, 64, 3])
            );
            // Expert 5's w3 half and its w2 columns, against repeat_interleave by hand: the
            // checkpoint scale is [6, 16] for w1/w3 and [16, 6] for w2.
            let got = apply(
                &expand(expert_block_refined(ExpertPart::W13, e, [i, h], b, r)),
                128 * 6 * 64,
            );
            for row in 0..3 {
                for c in 0..64 {
                    let want = ((rk * 3 + row) / 4) * 16 + c / 4;
                    assert_eq!(got[((5 * 6 + 3 + row) * 64 + c) as usize], want as i64);
                }
            }
            let got = apply(
                &expand(expert_block_refined(ExpertPart::W2, e, [i, h], b, r)),
                128 * 64 * 3,
            );
            for row in 0..64 {
                for c in 0..3 {
                    let want = (row / 4) * 6 + (rk * 3 + c) / 4;
                    assert_eq!(got[((5 * 64 + row) * 3 + c) as usize], want as i64);
                }
            }
            assert!(got.iter().all(|&x| x >= 0), "every element written");
        }
        // 768 / 4 = 192 refines to 64; 768 / 2 = 384 is three whole blocks.
        assert_eq!(refined_grid([i, h], b, rank(4, 0), e), Some(64));
        assert_eq!(refined_grid([i, h], b, rank(2, 0), e), None);
        // A grid vLLM cannot refine (gcd < 32) gets vLLM's own error.
        let msgs = expert_block_check(8, [48, 128], [32, 32], rank(2, 0));
        assert_eq!(
            msgs,
            vec![
                "The output_size of gate's and up's weight = 24 is not divisible by weight quantization block_n = 32."
            ]
        );
    }
}
