//! The `block_scale` kind: block scales of a linear weight, `[block_n, block_k]` (vLLM 0.33
//! `parameter.py` `BlockQuantScaleParameter`, `linear.py` `adjust_block_scale_shard`): per rank,
//! which blocks of which checkpoint scale fill which part of the scale parameter.

use super::types::{RankLayout, Shape, Slice, SlotKey, name};
use super::{
    Column, Geometry, Kind, MergedColumn, MergedTuples, Qkv, Rank, Replicated, Row, ShardId,
};

/// Block scales of the linear weight `of`, `[block_n, block_k]`.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockScale {
    pub of: Box<Geometry>,
    pub block: [u64; 2],
}

impl Kind for BlockScale {
    fn check(&self, r: Rank) -> Vec<String> {
        block_scale_check(&self.of, self.block, r)
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        (self.of.expected_source(shard)).map(|s| blocks_of(&s, self.block).into())
    }

    fn required(&self) -> (Vec<SlotKey>, Option<SlotKey>) {
        self.of.required()
    }

    fn rank_layout(&self, r: Rank, fused: bool) -> RankLayout {
        block_scale(&self.of, self.block, r, fused)
    }
}

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

/// The output partitions of `of` on rank `r` and its input width (global, local), or `None` for
/// a layout that is not a linear weight.
fn partitions(of: &Geometry, r: Rank) -> Option<(Vec<Part>, u64, u64)> {
    let r = match of {
        Geometry::MergedColumn(MergedColumn {
            disable_tp: true, ..
        }) => r.without_tp_if(true),
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
        Geometry::Replicated(Replicated { shape }) if shape.len() == 2 => {
            (vec![whole(shape[0], 0, shape[0])], shape[1], shape[1])
        }
        Geometry::Column(Column { shape }) if shape.len() == 2 => {
            (vec![whole(shape[0], rk, shape[0] / tp)], shape[1], shape[1])
        }
        Geometry::Row(Row { shape }) => {
            (vec![whole(shape[0], 0, shape[0])], shape[1], shape[1] / tp)
        }
        Geometry::MergedColumn(MergedColumn { sizes, inner, .. }) if inner.len() == 1 => {
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
        Geometry::MergedTuples(MergedTuples {
            sizes,
            inner,
            tuples,
        }) if inner.len() == 1 => (tuple_parts(sizes, inner, tuples, r)?, inner[0], inner[0]),
        Geometry::Qkv(Qkv {
            heads,
            kv_heads,
            head_dim,
            inner,
        }) if inner.len() == 1 => {
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
    let plain = Geometry::MergedColumn(MergedColumn {
        sizes: sizes.to_vec(),
        inner: inner.to_vec(),
        disable_tp: false,
    });
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

/// The checkpoint shape of a block scale for a weight of `shape`.
fn blocks_of(shape: &[u64], [bn, bk]: [u64; 2]) -> Vec<u64> {
    match shape {
        [rows, cols] => vec![rows.div_ceil(bn), cols.div_ceil(bk)],
        other => other.to_vec(),
    }
}

/// Block scales of a linear weight: each output partition's rows converted to blocks with vLLM's
/// ceil formulas (`adjust_block_scale_shard`), the checkpoint's rows taken from chunk
/// `chunk · size_b`; a row-parallel weight's scale takes its columns of blocks.
fn block_scale(of: &Geometry, [bn, bk]: [u64; 2], r: Rank, fused: bool) -> RankLayout {
    let Some((parts, in_global, in_local)) = partitions(of, r) else {
        return RankLayout::new(vec![], vec![], vec![]);
    };
    let rows: u64 = parts.iter().map(|p| p.local_size).sum::<u64>().div_ceil(bn);
    let cols = in_local.div_ceil(bk);
    let shape = vec![rows, cols];
    if let Geometry::Row(Row { shape: w }) = of {
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
fn block_scale_check(of: &Geometry, [bn, bk]: [u64; 2], r: Rank) -> Vec<String> {
    let Some((parts, _, in_local)) = partitions(of, r) else {
        return vec!["block scales need a 2-D linear weight".into()];
    };
    let mut out = Vec::new();
    if r.tp > 1 && matches!(of, Geometry::Row(_)) && !in_local.is_multiple_of(bk) {
        out.push(format!(
            "Weight input_size_per_partition = {in_local} is not divisible by weight quantization block_k = {bk}."
        ));
    }
    let split = r.tp > 1 && matches!(of, Geometry::Column(_));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Geometry;

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
        let qkv = Geometry::Qkv(Qkv {
            heads: 32,
            kv_heads: 8,
            head_dim: 128,
            inner: vec![4096],
        });
        let gate_up = Geometry::MergedColumn(MergedColumn {
            sizes: vec![12288, 12288],
            inner: vec![4096],
            disable_tp: false,
        });
        let down = Geometry::Row(Row {
            shape: vec![4096, 12288],
        });
        let o = Geometry::Row(Row {
            shape: vec![4096, 4096],
        });
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
        let down = Geometry::Row(Row {
            shape: vec![128, 256],
        });
        let msgs = block_scale_check(&down, [32, 32], rank(16, 0));
        assert_eq!(
            msgs,
            vec![
                "Weight input_size_per_partition = 16 is not divisible by weight quantization block_k = 32."
            ]
        );
    }
}
