//! What a layout's geometry is made of: a rank's placement ([`Rank`]) and its share of fused
//! experts ([`ExpertShare`]), slot keys, shapes, the slices of checkpoint tensors that fill a
//! rank's tensor and the strided [`Block`] moves they flatten into.

use std::ops::Range;

use serde::Deserialize;

use super::ShardId;

/// Tensor-parallel placement of one rank.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rank {
    pub tp: u64,
    pub rank: u64,
    /// Expert parallelism: experts spread over the `tp` ranks instead of split.
    pub ep: bool,
}

impl Rank {
    /// Rank 0 of 1 when `whole`: a layer vLLM builds with `disable_tp=True`.
    pub(crate) fn without_tp_if(self, whole: bool) -> Rank {
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

    /// The experts this rank holds of `n` fused experts, and its slice of each one's
    /// intermediate size: with expert parallelism whole experts placed linearly (vLLM's
    /// `determine_expert_map`: the first `n % tp` ranks one more), else every expert, split by
    /// TP. The one placement rule of every expert layout (gpt-oss's loader hands each rank
    /// `n / tp`, the same ranges: its kinds' `check` refuses a remainder, and no rank layout is
    /// built once a check has failed).
    pub(crate) fn experts(self, n: u64) -> ExpertShare {
        if self.ep {
            let (base, rem) = (n / self.tp, n % self.tp);
            let start = self.rank * base + self.rank.min(rem);
            let count = base + u64::from(self.rank < rem);
            ExpertShare {
                local: start..start + count,
                tp: 1,
                rank: 0,
            }
        } else {
            ExpertShare {
                local: 0..n,
                tp: self.tp,
                rank: self.rank,
            }
        }
    }
}

/// A rank's experts and its place in the experts' tensor parallelism ([`Rank::experts`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExpertShare {
    /// The global ids of the experts the rank holds.
    pub local: Range<u64>,
    /// The TP size the experts' intermediate size is split by (1 with expert parallelism), and
    /// the rank's index in it.
    pub tp: u64,
    pub rank: u64,
}

impl ExpertShare {
    /// How many experts the rank holds.
    pub(crate) fn count(&self) -> u64 {
        self.local.end - self.local.start
    }

    /// The rank's share of an intermediate size.
    pub(crate) fn of(&self, intermediate: u64) -> u64 {
        intermediate / self.tp
    }
}

/// Which of a fused expert layer's two weights: `w13` (gate and up, from `w1` and `w3`) or `w2`
/// (down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ExpertPart {
    W13,
    W2,
}

impl ExpertPart {
    /// The shard ids that fill one expert of this part.
    pub(super) fn shards(self) -> &'static [&'static str] {
        match self {
            ExpertPart::W13 => &["w1", "w3"],
            ExpertPart::W2 => &["w2"],
        }
    }

    /// One slot per shard of every expert: what a fused expert parameter needs when filled
    /// expert by expert.
    pub(super) fn slots(self, experts: u64) -> Vec<SlotKey> {
        (0..experts)
            .flat_map(|e| self.shards().iter().map(move |s| (name(s), Some(e))))
            .collect()
    }
}

/// Key of one source of a parameter: the shard id and expert id it was mapped with.
pub(crate) type SlotKey = (Option<ShardId>, Option<u64>);

/// A copy with its slot and the region of the checkpoint tensor it reads.
pub(crate) type Strided = (SlotKey, Block, crate::layout::Region);

/// The rank's first expert's copies, repeated by every local expert `dst_step` further on.
pub(crate) type PerExpertCopies = (Vec<Strided>, PerExpert);

/// A tensor shape that rarely has more than 4 dims.
pub(crate) type Shape = smallvec::SmallVec<[u64; 4]>;

/// A strided block move in elements: `rows` rows of `row` contiguous elements, from
/// `src_start + k·src_stride` to `dst_start + k·dst_stride`. The same description serves a file
/// write, a memcpy and a 2-D device copy.
///
/// With `src_elem_stride` other than 1 the move is a transposition: element `x` of destination
/// row `k` comes from `src_start + k·src_stride + x·src_elem_stride` (gpt-oss's fused experts are
/// stored `[E, in, out]` and vLLM holds them `[E, out, in]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Block {
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
    pub(crate) fn transposed(&self) -> bool {
        self.src_elem_stride != 1
    }

    /// Source elements one destination row spans, first to last.
    pub(crate) fn src_row_span(&self) -> u64 {
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
pub(crate) struct Slice {
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
    pub(crate) fn block(&self) -> Block {
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

    pub(crate) fn region(&self) -> crate::layout::Region {
        let full = self.from == 0 && self.to == self.src_shape.get(self.dim).copied().unwrap_or(1);
        crate::layout::Region {
            range: (!full).then_some((usize::from(self.dim != 0), self.from, self.to)),
            ..crate::layout::Region::ALL
        }
    }
}

/// A rank's tensor: its shape, the slices of checkpoint tensors that fill it, and zero-filled
/// ranges.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct RankLayout {
    pub shape: Vec<u64>,
    /// With [`RankLayout::per_expert`], the slices of the rank's first expert only.
    pub slices: Vec<Slice>,
    /// (element offset, count) filled with zeros (vocab padding).
    pub zeros: Vec<(u64, u64)>,
    /// Evenly spaced zero runs (the padded tail of every row of an MXFP4 expert parameter):
    /// millions of rows, kept as one description each.
    pub zero_rows: Vec<ZeroRows>,
    /// Fused expert tensors repeat one expert's slices for every local expert: a DeepSeek-V3
    /// rank holds 256 experts in each of 58 layers, and one expert's slices, built once, stand
    /// for them all.
    pub per_expert: Option<PerExpert>,
}

/// `rows` runs of `count` zeros, the `k`-th at element `start + k · stride`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ZeroRows {
    pub start: u64,
    pub count: u64,
    pub stride: u64,
    pub rows: u64,
}

/// How [`RankLayout::slices`] repeat over a rank's experts: expert `first + j` is filled by the
/// same slices with that expert id, `j · dst_step` elements further into the rank's tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PerExpert {
    /// The global id of the rank's first expert (the one the slices name).
    pub first: u64,
    pub count: u64,
    pub dst_step: u64,
}

impl RankLayout {
    /// A layout whose slices are all there is.
    pub(crate) fn new(shape: Vec<u64>, slices: Vec<Slice>, zeros: Vec<(u64, u64)>) -> RankLayout {
        RankLayout {
            shape,
            slices,
            zeros,
            zero_rows: Vec::new(),
            per_expert: None,
        }
    }

    /// One expert's `slices` (naming expert `local.start`) repeated over the rank's `local`
    /// experts, `dst_step` elements apart.
    pub(crate) fn per_expert(
        shape: Vec<u64>,
        local: std::ops::Range<u64>,
        dst_step: u64,
        slices: Vec<Slice>,
    ) -> RankLayout {
        RankLayout {
            shape,
            slices: if local.is_empty() { vec![] } else { slices },
            zeros: vec![],
            zero_rows: Vec::new(),
            per_expert: Some(PerExpert {
                first: local.start,
                count: local.end - local.start,
                dst_step,
            }),
        }
    }

    #[cfg(test)]
    /// Every slice, a fused expert tensor's expanded for each of its experts in order.
    pub(crate) fn all_slices(&self) -> Vec<Slice> {
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

/// The slot key's shard id of a shard named `s`.
pub(super) fn name(s: &'static str) -> Option<ShardId> {
    Some(ShardId::Name(std::borrow::Cow::Borrowed(s)))
}

/// `[lead, inner...]`.
pub(super) fn cat(lead: u64, inner: &[u64]) -> Vec<u64> {
    let mut s = vec![lead];
    s.extend_from_slice(inner);
    s
}

/// The expected source of a parameter that is not stacked: `shape`, without a shard id.
pub(super) fn unstacked(shape: &[u64], shard: Option<&ShardId>) -> Result<Shape, String> {
    match shard {
        None => Ok(Shape::from_slice(shape)),
        Some(s) => Err(format!(
            "shard id {s} given to a parameter that is not stacked"
        )),
    }
}

/// vLLM's divisibility assert on `v`, as a message when it fails.
pub(super) fn not_divisible(what: &str, v: u64, tp: u64) -> Option<String> {
    (!v.is_multiple_of(tp)).then(|| format!("{what} ({v}) is not divisible by tp ({tp})"))
}

/// Stacked column-parallel parts (gate/up): each rank holds its rows of every part, in order
/// (the `merged_column` kind's layout, and that of `merged_tuples` read fused).
pub(super) fn merged_column(sizes: &[u64], inner: &[u64], r: Rank, fused: bool) -> RankLayout {
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
