//! A rank tensor's pieces, in order. A fused expert tensor's copies repeat one expert's blocks
//! for every expert with only the source and the destination offset changing, so such a run is
//! kept as that template and its sources (a DeepSeek-V3 plan at TP 8 has 712,000 pieces, nearly
//! all of them in such runs); readers see the expanded pieces.

use serde::{Serialize, Serializer};

use crate::layout::Region;
use crate::layout::types::{Block, ZeroRows};

/// How part of a rank's tensor is filled: a copy of a [`Block`] from a source tensor, or a fill.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Piece {
    /// A [`Block`] (in elements) copied from a source tensor, converting dtype when they differ;
    /// its fields are the block's, flat, as the plan JSON has always had them.
    Copy {
        /// Index into [`Plan::sources`](super::Plan::sources).
        source: usize,
        /// Which part of the source (`rows [64, 128)`): a string in the plan JSON.
        region: Region,
        rows: u64,
        row: u64,
        src_start: u64,
        src_stride: u64,
        dst_start: u64,
        dst_stride: u64,
        /// Source elements between consecutive elements of a row: 1 (left out of the JSON) but
        /// for a transposing copy ([`Block::src_elem_stride`]).
        #[serde(skip_serializing_if = "crate::units::is_one")]
        src_elem_stride: u64,
    },
    /// `count` elements from `dst_start` set to `value`.
    Fill {
        dst_start: u64,
        count: u64,
        value: f64,
    },
}

impl Piece {
    /// The block a copy moves; `None` for a fill.
    pub(crate) fn block(&self) -> Option<Block> {
        match *self {
            Piece::Copy {
                rows,
                row,
                src_start,
                src_stride,
                dst_start,
                dst_stride,
                src_elem_stride,
                ..
            } => Some(Block {
                rows,
                row,
                src_start,
                src_stride,
                dst_start,
                dst_stride,
                src_elem_stride,
            }),
            Piece::Fill { .. } => None,
        }
    }
}

#[derive(Debug, Clone, Default)]
pub struct Pieces(Vec<Item>);

#[derive(Debug, Clone)]
enum Item {
    One(Piece),
    Experts(ExpertCopies),
    Zeros(ZeroRows),
}

/// One expert's copies (`each`) repeated expert by expert, the `j`-th expert's destination
/// shifted by `j * dst_step` and its `k`-th block read from `sources[j * each.len() + k]`.
#[derive(Debug, Clone)]
struct ExpertCopies {
    each: Vec<(Block, Region)>,
    dst_step: u64,
    /// Half the memory of `usize` indices (a plan has millions of expert copies); a plan with
    /// more sources than fit keeps its copies one by one. Shared by the ranks that read the
    /// same experts.
    sources: std::sync::Arc<[u32]>,
}

impl ExpertCopies {
    fn iter(&self) -> impl Iterator<Item = Piece> + '_ {
        let n = self.each.len().max(1);
        self.sources
            .chunks(n)
            .zip(0u64..)
            .flat_map(move |(srcs, j)| {
                let shift = j * self.dst_step;
                srcs.iter()
                    .zip(&self.each)
                    .map(move |(&source, &(b, region))| {
                        copy(
                            source as usize,
                            region,
                            Block {
                                dst_start: b.dst_start + shift,
                                ..b
                            },
                        )
                    })
            })
    }
}

impl Pieces {
    pub(crate) fn push(&mut self, p: Piece) {
        self.0.push(Item::One(p));
    }

    /// Copies of `each` for every expert, as [`ExpertCopies`] describes; `sources` holds
    /// `each.len()` sources per expert.
    pub(super) fn push_experts(
        &mut self,
        each: Vec<(Block, Region)>,
        dst_step: u64,
        sources: std::sync::Arc<[u32]>,
    ) {
        debug_assert!(each.is_empty() || sources.len().is_multiple_of(each.len()));
        if !sources.is_empty() {
            self.0.push(Item::Experts(ExpertCopies {
                each,
                dst_step,
                sources,
            }));
        }
    }

    /// Zero fills of `z`'s rows, kept as that description.
    pub(crate) fn push_zero_rows(&mut self, z: ZeroRows) {
        if z.rows > 0 && z.count > 0 {
            self.0.push(Item::Zeros(z));
        }
    }

    /// The zero rows kept as descriptions ([`Pieces::push_zero_rows`]), whose fills
    /// [`Pieces::iter`] yields one by one: the engine writes a copy's row padding with its rows.
    pub(crate) fn zero_rows(&self) -> impl Iterator<Item = &ZeroRows> + '_ {
        self.0.iter().filter_map(|item| match item {
            Item::Zeros(z) => Some(z),
            _ => None,
        })
    }

    /// Every piece, in order. Plain pieces are yielded as they are; an expert run's pieces are
    /// made as they are read (no allocation per item: the engine walks every piece).
    pub(crate) fn iter(&self) -> impl Iterator<Item = Piece> + '_ {
        self.0.iter().flat_map(|item| {
            let (one, run, zeros) = match item {
                Item::One(p) => (Some(p.clone()), None, None),
                Item::Experts(run) => (None, Some(run.iter()), None),
                Item::Zeros(z) => (None, None, Some(*z)),
            };
            let zeros = zeros.into_iter().flat_map(|z| {
                (0..z.rows).map(move |k| Piece::Fill {
                    dst_start: z.start + k * z.stride,
                    count: z.count,
                    value: 0.0,
                })
            });
            one.into_iter()
                .chain(run.into_iter().flatten())
                .chain(zeros)
        })
    }
}

impl Extend<Piece> for Pieces {
    fn extend<I: IntoIterator<Item = Piece>>(&mut self, iter: I) {
        self.0.extend(iter.into_iter().map(Item::One));
    }
}

impl From<Vec<Piece>> for Pieces {
    fn from(v: Vec<Piece>) -> Pieces {
        Pieces(v.into_iter().map(Item::One).collect())
    }
}

/// The plan JSON lists every piece, as it always has.
impl Serialize for Pieces {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.iter())
    }
}

/// As [`Serialize`] writes it: every piece, the runs expanded.
impl schemars::JsonSchema for Pieces {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Pieces".into()
    }

    fn json_schema(g: &mut schemars::SchemaGenerator) -> schemars::Schema {
        g.subschema_for::<Vec<Piece>>()
    }
}

/// A copy of block `b` of source `source`.
pub(super) fn copy(source: usize, region: Region, b: Block) -> Piece {
    Piece::Copy {
        source,
        region,
        rows: b.rows,
        row: b.row,
        src_start: b.src_start,
        src_stride: b.src_stride,
        dst_start: b.dst_start,
        dst_stride: b.dst_stride,
        src_elem_stride: b.src_elem_stride,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(dst_start: u64) -> Block {
        Block {
            rows: 2,
            row: 3,
            src_start: 1,
            src_stride: 4,
            dst_start,
            dst_stride: 3,
            src_elem_stride: 1,
        }
    }

    #[test]
    fn an_expert_run_expands_expert_by_expert_between_the_pieces_around_it() {
        let mut p = Pieces::default();
        p.push(Piece::Fill {
            dst_start: 0,
            count: 1,
            value: 0.0,
        });
        let each = vec![(block(10), Region::ALL), (block(16), Region::ALL)];
        p.push_experts(each, 100, vec![7, 8, 9, 10, 11, 12].into());
        p.extend([copy(3, Region::ALL, block(400))]);
        let got: Vec<(Option<usize>, u64)> = p
            .iter()
            .map(|x| match x {
                Piece::Copy {
                    source, dst_start, ..
                } => (Some(source), dst_start),
                Piece::Fill { dst_start, .. } => (None, dst_start),
            })
            .collect();
        assert_eq!(
            got,
            [
                (None, 0),
                (Some(7), 10),
                (Some(8), 16),
                (Some(9), 110),
                (Some(10), 116),
                (Some(11), 210),
                (Some(12), 216),
                (Some(3), 400),
            ]
        );
        assert_eq!(p.iter().count(), 8);
        assert_eq!(
            serde_json::to_value(&p)
                .expect("json")
                .as_array()
                .map(Vec::len),
            Some(8)
        );
    }
}
