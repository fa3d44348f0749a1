//! The `mxfp4_experts` kind: gpt-oss's MXFP4 experts (vLLM 0.33 `models/gpt_oss.py` `_load_weights_mxfp4`,
//! `quantization/mxfp4.py` `GptOssMxfp4MoEMethod.create_weights`): each rank's share of the
//! intermediate size is whole 32-element blocks, `cdiv(I/32, tp)` of them, so the last ranks may
//! hold less or nothing; with expert parallelism whole experts, E / tp a rank. The real slice
//! goes into the leading corner of each expert's parameter, whose padding for the MoE backend
//! (if any) stays zero (`routed_experts.py:697–707`, `param[:, :dim1, :dim2]`).
//!
//! The checkpoint's blocks `[E, 2I, H/32, 16]` are read as `[E, 2I, H/2]` (the same bytes), so
//! every copy here is a plain strided block of whole bytes.

use std::ops::Range;

use super::types::{Block, RankLayout, Shape, Strided, ZeroRows, unstacked};
use super::{Kind, Rank, Region, ShardId};

/// MXFP4 groups 32 values under one E8M0 scale (`OCP_MX_BLOCK_SIZE`); two E2M1 values a byte.
pub(crate) const MX_BLOCK: u64 = 32;

/// Which of the six parameters of `GptOssMxfp4MoEMethod`, in its registration order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mxfp4Part {
    W13Weight,
    W13Scale,
    W2Weight,
    W2Scale,
    W13Bias,
    W2Bias,
}

impl Mxfp4Part {
    pub const ALL: [Mxfp4Part; 6] = [
        Mxfp4Part::W13Weight,
        Mxfp4Part::W13Scale,
        Mxfp4Part::W2Weight,
        Mxfp4Part::W2Scale,
        Mxfp4Part::W13Bias,
        Mxfp4Part::W2Bias,
    ];

    /// The parameter's name under `routed_experts.`.
    pub(crate) fn param(self) -> &'static str {
        match self {
            Mxfp4Part::W13Weight => "w13_weight",
            Mxfp4Part::W13Scale => "w13_weight_scale",
            Mxfp4Part::W2Weight => "w2_weight",
            Mxfp4Part::W2Scale => "w2_weight_scale",
            Mxfp4Part::W13Bias => "w13_bias",
            Mxfp4Part::W2Bias => "w2_bias",
        }
    }
}

/// The dimensions of gpt-oss's MXFP4 experts and the backend's `[hidden, intermediate]`
/// alignment (`[1, 1]`: no padding, the real slices).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mxfp4Dims {
    pub experts: u64,
    pub intermediate: u64,
    pub hidden: u64,
    pub align: [u64; 2],
}

/// gpt-oss's MXFP4 experts: whole 32-element blocks per rank, the real slice in the leading
/// corner of a parameter the MoE backend may pad.
#[derive(Debug, Clone, PartialEq)]
pub struct Mxfp4Experts {
    pub part: Mxfp4Part,
    pub dims: Mxfp4Dims,
}

impl Kind for Mxfp4Experts {
    fn check(&self, r: Rank) -> Vec<String> {
        check(&self.dims, r)
    }

    fn expected_source(&self, shard: Option<&ShardId>) -> Result<Shape, String> {
        unstacked(&source_shape(self.part, &self.dims), shard)
    }

    fn rank_layout(&self, r: Rank, _: bool) -> RankLayout {
        rank_layout(self.part, &self.dims, r)
    }

    fn strided(&self, r: Rank) -> Vec<Strided> {
        copies(self.part, &self.dims, r)
    }

    #[cfg(test)]
    fn samples() -> Vec<super::Geometry> {
        Mxfp4Part::ALL
            .into_iter()
            .flat_map(|part| {
                [[1, 1], [1, 64], [256, 128]].map(|align| {
                    Mxfp4Experts {
                        part,
                        dims: Mxfp4Dims {
                            experts: 8,
                            intermediate: 224,
                            hidden: 96,
                            align,
                        },
                    }
                    .into()
                })
            })
            .collect()
    }
}

/// Where rank `r`'s data comes from and what its parameters hold.
struct Split {
    local: Range<u64>,
    /// Intermediate range of the checkpoint this rank holds (`[start, end)`, maybe empty).
    start: u64,
    end: u64,
    /// The parameters' intermediate and hidden sizes.
    ip: u64,
    hp: u64,
}

fn split(d: &Mxfp4Dims, r: Rank) -> Split {
    let [ha, ia] = d.align;
    let hp = d.hidden.next_multiple_of(ha);
    if r.ep {
        // Every rank E / tp whole experts (the loader's slice; check() refuses a remainder).
        let local = r.experts(d.experts).local;
        let ip = d.intermediate.next_multiple_of(ia);
        return Split {
            local,
            start: 0,
            end: d.intermediate,
            ip,
            hp,
        };
    }
    let per = (d.intermediate / MX_BLOCK).div_ceil(r.tp) * MX_BLOCK;
    let start = (r.rank * per).min(d.intermediate);
    let end = (start + per).min(d.intermediate);
    // Padded: vLLM's `maybe_roundup_sizes(I // tp)`; unpadded: the real slice.
    let ip = if d.align == [1, 1] {
        // An empty slice still needs its key (vLLM's loader wants every parameter, and a
        // zero-size tensor is one it never writes): one block of zeros, which every backend's
        // parameter holds.
        (end - start).max(MX_BLOCK)
    } else {
        (d.intermediate / r.tp).next_multiple_of(ia)
    };
    Split {
        local: 0..d.experts,
        start,
        end,
        ip,
        hp,
    }
}

/// Divisibility and fit rules vLLM asserts, as messages.
fn check(d: &Mxfp4Dims, r: Rank) -> Vec<String> {
    let mut v = Vec::new();
    for (what, n) in [
        ("intermediate_size", d.intermediate),
        ("hidden_size", d.hidden),
    ] {
        if !n.is_multiple_of(MX_BLOCK) {
            v.push(format!(
                "MXFP4 experts: {what} ({n}) is not a multiple of the MXFP4 block size {MX_BLOCK} (the checkpoint's blocks and scales need whole blocks)"
            ));
        }
    }
    if !d.intermediate.is_multiple_of(r.tp) {
        v.push(format!(
            "expert intermediate size ({}) is not divisible by tp ({})",
            d.intermediate, r.tp
        ));
    }
    if r.ep && !d.experts.is_multiple_of(r.tp) {
        v.push(format!(
            "number of experts ({}) is not divisible by tp ({})",
            d.experts, r.tp
        ));
    }
    // With I divisible by tp, round_up(I / tp, 32) is cdiv(I / 32, tp) · 32: every backend's
    // parameter (aligned to 32 at least) holds the real slice.
    v
}

/// The checkpoint tensor's shape.
fn source_shape(part: Mxfp4Part, d: &Mxfp4Dims) -> Vec<u64> {
    let (e, i, h) = (d.experts, d.intermediate, d.hidden);
    match part {
        Mxfp4Part::W13Weight => vec![e, 2 * i, h / MX_BLOCK, 16],
        Mxfp4Part::W13Scale => vec![e, 2 * i, h / MX_BLOCK],
        Mxfp4Part::W2Weight => vec![e, h, i / MX_BLOCK, 16],
        Mxfp4Part::W2Scale => vec![e, h, i / MX_BLOCK],
        Mxfp4Part::W13Bias => vec![e, 2 * i],
        Mxfp4Part::W2Bias => vec![e, h],
    }
}

/// One expert's copy: the source and destination matrices `[rows, cols]` (per expert), and the
/// source rows and columns taken into the destination's leading corner.
struct Corner {
    src: [u64; 2],
    dst: [u64; 2],
    rows: Range<u64>,
    cols: Range<u64>,
}

/// Per part: the expert matrices and the corner rank `r` copies (rows: w13's interleaved
/// gate/up rows, w2's hidden rows; a bias is one row an expert).
fn corner(part: Mxfp4Part, d: &Mxfp4Dims, r: Rank) -> (Split, Corner) {
    let s = split(d, r);
    let (i, h) = (d.intermediate, d.hidden);
    let (a, b) = (s.start, s.end);
    let c = match part {
        Mxfp4Part::W13Weight | Mxfp4Part::W13Scale => {
            let per = if part == Mxfp4Part::W13Weight {
                2
            } else {
                MX_BLOCK
            };
            Corner {
                src: [2 * i, h / per],
                dst: [2 * s.ip, s.hp / per],
                rows: 2 * a..2 * b,
                cols: 0..h / per,
            }
        }
        Mxfp4Part::W2Weight | Mxfp4Part::W2Scale => {
            let per = if part == Mxfp4Part::W2Weight {
                2
            } else {
                MX_BLOCK
            };
            Corner {
                src: [h, i / per],
                dst: [s.hp, s.ip / per],
                rows: 0..h,
                cols: a / per..b / per,
            }
        }
        Mxfp4Part::W13Bias => Corner {
            src: [1, 2 * i],
            dst: [1, 2 * s.ip],
            rows: 0..1,
            cols: 2 * a..2 * b,
        },
        // TP: whole on rank 0, zeros elsewhere (the loader zeroes it: the all-reduce adds it
        // once); EP: every rank its experts'.
        Mxfp4Part::W2Bias => Corner {
            src: [1, h],
            dst: [1, s.hp],
            rows: 0..1,
            cols: 0..if r.ep || r.rank == 0 { h } else { 0 },
        },
    };
    (s, c)
}

/// Rank `r`'s tensor: its shape and the zeros around every expert's corner (the copies are
/// [`copies`]).
fn rank_layout(part: Mxfp4Part, d: &Mxfp4Dims, r: Rank) -> RankLayout {
    let (s, c) = corner(part, d, r);
    let e_loc = s.local.end - s.local.start;
    let shape = match part {
        Mxfp4Part::W13Bias | Mxfp4Part::W2Bias => vec![e_loc, c.dst[1]],
        _ => vec![e_loc, c.dst[0], c.dst[1]],
    };
    let (nr, nc) = (c.rows.end - c.rows.start, c.cols.end - c.cols.start);
    let [dr, dc] = c.dst;
    // Rows with data have a zero tail when the columns are padded; the rows after them are
    // zero throughout. With every row filled, the tails of all experts are one run.
    let filled_rows = if nc == 0 { 0 } else { nr };
    let tail = |start, rows| ZeroRows {
        start,
        count: dc - nc,
        stride: dc,
        rows,
    };
    let mut zeros: Vec<(u64, u64)> = Vec::new();
    let mut zero_rows = Vec::new();
    if filled_rows == dr {
        zero_rows.push(tail(nc, e_loc * dr));
    } else {
        for j in 0..e_loc {
            let base = j * dr * dc;
            zero_rows.push(tail(base + nc, filled_rows));
            zeros.push((base + filled_rows * dc, (dr - filled_rows) * dc));
        }
    }
    zero_rows.retain(|z| z.rows > 0 && z.count > 0);
    zeros.retain(|z| z.1 > 0);
    let mut l = RankLayout::new(shape, Vec::new(), zeros);
    l.zero_rows = zero_rows;
    l
}

/// The copies that fill rank `r`'s tensor from the checkpoint tensor, as few blocks as the
/// shapes allow: one for the whole tensor when rows and columns are all taken, one per run of
/// rows that are evenly spaced in both.
fn copies(part: Mxfp4Part, d: &Mxfp4Dims, r: Rank) -> Vec<Strided> {
    let (s, c) = corner(part, d, r);
    let (nr, nc) = (c.rows.end - c.rows.start, c.cols.end - c.cols.start);
    if nr == 0 || nc == 0 || s.local.is_empty() {
        return Vec::new();
    }
    let (src_e, dst_e) = (c.src[0] * c.src[1], c.dst[0] * c.dst[1]);
    let whole_rows = nc == c.src[1] && nc == c.dst[1];
    let all_rows = nr == c.src[0] && nr == c.dst[0];
    let e_loc = s.local.end - s.local.start;
    let first = s.local.start * src_e + c.rows.start * c.src[1] + c.cols.start;
    let block = |rows, row, src_start, src_stride, dst_start, dst_stride| Block {
        rows,
        row,
        src_start,
        src_stride,
        dst_start,
        dst_stride,
        src_elem_stride: 1,
    };
    let blocks: Vec<Block> = if whole_rows {
        // Each expert's rows are one contiguous run, in the source and in the destination.
        vec![block(e_loc, nr * nc, first, src_e, 0, dst_e)]
    } else if all_rows {
        // Every row of every expert: one run of evenly spaced rows.
        vec![block(e_loc * nr, nc, first, c.src[1], 0, c.dst[1])]
    } else {
        (0..e_loc)
            .map(|j| block(nr, nc, first + j * src_e, c.src[1], j * dst_e, c.dst[1]))
            .collect()
    };
    let range = match part {
        _ if r.ep => None,
        Mxfp4Part::W13Weight | Mxfp4Part::W13Scale => Some((0, c.rows.start, c.rows.end)),
        Mxfp4Part::W2Bias => None,
        _ => Some((1, c.cols.start, c.cols.end)),
    };
    let region = Region {
        range,
        experts: r.ep.then_some((s.local.start, s.local.end)),
        ..Region::ALL
    };
    blocks
        .into_iter()
        .map(|b| ((None, None), b, region))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dims(align: [u64; 2]) -> Mxfp4Dims {
        Mxfp4Dims {
            experts: 4,
            intermediate: 224,
            hidden: 192,
            align,
        }
    }

    fn shape(part: Mxfp4Part, d: &Mxfp4Dims, tp: u64, rank: u64, ep: bool) -> Vec<u64> {
        rank_layout(part, d, Rank { tp, rank, ep }).shape
    }

    /// The shapes real vLLM 0.33 held on the SM90 default (TRITON) backend (spec §10.1 item 1).
    #[test]
    fn triton_padding_matches_what_vllm_held() {
        let d = dims([1, 64]);
        for (tp, ep, w13, w2, w2s) in [
            (1, false, [4, 512, 96], [4, 192, 128], [4, 192, 8]),
            (2, false, [4, 256, 96], [4, 192, 64], [4, 192, 4]),
            (4, false, [4, 128, 96], [4, 192, 32], [4, 192, 2]),
            (2, true, [2, 512, 96], [2, 192, 128], [2, 192, 8]),
        ] {
            for rank in 0..tp {
                assert_eq!(shape(Mxfp4Part::W13Weight, &d, tp, rank, ep), w13);
                assert_eq!(shape(Mxfp4Part::W2Weight, &d, tp, rank, ep), w2);
                assert_eq!(shape(Mxfp4Part::W2Scale, &d, tp, rank, ep), w2s);
            }
        }
    }

    /// Unpadded, each rank holds its cdiv slice: 128 and 96 rows of 224 at tp 2; at tp 8 the
    /// last rank starts at 224 and holds one block of zeros.
    #[test]
    fn real_slices_follow_the_cdiv_split() {
        let d = dims([1, 1]);
        assert_eq!(shape(Mxfp4Part::W13Weight, &d, 2, 0, false), [4, 256, 96]);
        assert_eq!(shape(Mxfp4Part::W13Weight, &d, 2, 1, false), [4, 192, 96]);
        assert_eq!(shape(Mxfp4Part::W2Scale, &d, 2, 1, false), [4, 192, 3]);
        assert_eq!(shape(Mxfp4Part::W2Weight, &d, 8, 6, false), [4, 192, 16]);
        assert_eq!(shape(Mxfp4Part::W2Weight, &d, 8, 7, false), [4, 192, 16]);
        assert_eq!(shape(Mxfp4Part::W13Bias, &d, 8, 7, false), [4, 64]);
        assert!(
            copies(
                Mxfp4Part::W13Weight,
                &d,
                Rank {
                    tp: 8,
                    rank: 7,
                    ep: false
                }
            )
            .is_empty()
        );
        let marlin = dims([256, 128]);
        assert_eq!(shape(Mxfp4Part::W2Bias, &marlin, 2, 1, false), [4, 256]);
        assert_eq!(
            shape(Mxfp4Part::W13Scale, &marlin, 2, 1, false),
            [4, 256, 8]
        );
    }

    #[test]
    fn refusals_name_the_rule() {
        let r = Rank {
            tp: 4,
            rank: 0,
            ep: true,
        };
        let d = Mxfp4Dims {
            experts: 6,
            intermediate: 200,
            hidden: 96,
            align: [1, 1],
        };
        let got = check(&d, r);
        assert!(
            got[0].contains("intermediate_size (200) is not a multiple of the MXFP4 block size 32"),
            "{got:?}"
        );
        assert!(
            got.iter()
                .any(|m| m.contains("number of experts (6) is not divisible by tp (4)")),
            "{got:?}"
        );
    }
}
