//! A linear layer's weight geometry read as vLLM's quantized linear parameters see it: its output
//! parts, its input width and how it is parallel. Every packed or grouped parameter of the
//! INT4/INT8/NVFP4 methods is the weight's layout with the two sizes changed (`K/8` packed
//! columns, `K/g` groups, `N/8` packed rows), and with the output on dim 0 (compressed-tensors,
//! ModelOpt: `[N, K']`) or on dim 1 (GPTQ, AWQ: `[K', N]`).

use crate::layout::{
    Column, Geometry, MergedColumn, MergedTuples, Qkv, Replicated, Row, WithLeading,
};

/// The output parts of a linear weight.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Out {
    /// `QKVParallelLinear`.
    Qkv {
        heads: u64,
        kv_heads: u64,
        head_dim: u64,
    },
    /// `MergedColumnParallelLinear` (gate/up); `tuples`: the runs of shards one checkpoint
    /// tensor fills (Qwen3.5's GDN `in_proj_qkvz`, shards `(0, 1, 2)`), each shard still
    /// sliced by itself (`linear.py:922–960`).
    Merged {
        sizes: Vec<u64>,
        disable_tp: bool,
        tuples: Vec<Vec<u64>>,
    },
    /// One output of `n` rows.
    Single(u64),
}

/// How a linear layer is split over the ranks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Style {
    /// Output rows split (`ColumnParallelLinear` and its fused kinds).
    Column,
    /// Input columns split (`RowParallelLinear`).
    Row,
    /// Whole on every rank (`ReplicatedLinear`).
    Replicated,
}

/// A linear weight `[N, K]`: its output parts, `K`, and its parallel style.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct LinearShape {
    pub(super) out: Out,
    pub(super) k: u64,
    pub(super) style: Style,
}

impl LinearShape {
    /// The linear layer a 2-D weight geometry describes; `None` for anything else (an
    /// embedding, experts, a norm).
    pub(super) fn of(g: &Geometry) -> Option<LinearShape> {
        let single = |shape: &[u64], style| match shape {
            [n, k] => Some(LinearShape {
                out: Out::Single(*n),
                k: *k,
                style,
            }),
            _ => None,
        };
        match g {
            Geometry::Qkv(Qkv {
                heads,
                kv_heads,
                head_dim,
                inner,
            }) => match inner[..] {
                [k] => Some(LinearShape {
                    out: Out::Qkv {
                        heads: *heads,
                        kv_heads: *kv_heads,
                        head_dim: *head_dim,
                    },
                    k,
                    style: Style::Column,
                }),
                _ => None,
            },
            Geometry::MergedColumn(MergedColumn {
                sizes,
                inner,
                disable_tp,
            }) => match inner[..] {
                [k] => Some(LinearShape {
                    out: Out::Merged {
                        sizes: sizes.clone(),
                        disable_tp: *disable_tp,
                        tuples: vec![],
                    },
                    k,
                    style: Style::Column,
                }),
                _ => None,
            },
            Geometry::MergedTuples(MergedTuples {
                sizes,
                inner,
                tuples,
            }) => match inner[..] {
                [k] => Some(LinearShape {
                    out: Out::Merged {
                        sizes: sizes.clone(),
                        disable_tp: false,
                        tuples: tuples.clone(),
                    },
                    k,
                    style: Style::Column,
                }),
                _ => None,
            },
            Geometry::Column(Column { shape }) => single(shape, Style::Column),
            Geometry::Row(Row { shape }) => single(shape, Style::Row),
            Geometry::Replicated(Replicated { shape }) => single(shape, Style::Replicated),
            _ => None,
        }
    }

    /// The total output size `N`.
    pub(super) fn n(&self) -> u64 {
        match &self.out {
            Out::Qkv {
                heads,
                kv_heads,
                head_dim,
            } => (heads + 2 * kv_heads) * head_dim,
            Out::Merged { sizes, .. } => sizes.iter().sum(),
            Out::Single(n) => *n,
        }
    }

    /// Whether every output part's size is a multiple of `d` (a packing factor on the output).
    pub(super) fn out_divisible_by(&self, d: u64) -> bool {
        match &self.out {
            Out::Qkv { head_dim, .. } => head_dim.is_multiple_of(d),
            Out::Merged { sizes, .. } => sizes.iter().all(|s| s.is_multiple_of(d)),
            Out::Single(n) => n.is_multiple_of(d),
        }
    }

    /// The output parts with every size divided by `d` (packed rows).
    fn out_over(&self, d: u64) -> Out {
        match &self.out {
            Out::Qkv {
                heads,
                kv_heads,
                head_dim,
            } => Out::Qkv {
                heads: *heads,
                kv_heads: *kv_heads,
                head_dim: head_dim / d,
            },
            Out::Merged {
                sizes,
                disable_tp,
                tuples,
            } => Out::Merged {
                sizes: sizes.iter().map(|s| s / d).collect(),
                disable_tp: *disable_tp,
                tuples: tuples.clone(),
            },
            Out::Single(n) => Out::Single(n / d),
        }
    }

    /// A parameter `[N/out_div, cols]` laid out as the weight: output parts on dim 0 split like
    /// the weight's rows, and `cols` split like its input for a row-parallel layer.
    pub(super) fn rows_first(&self, out_div: u64, cols: u64) -> Geometry {
        let inner = vec![cols];
        match (self.style, self.out_over(out_div)) {
            (
                Style::Column,
                Out::Qkv {
                    heads,
                    kv_heads,
                    head_dim,
                },
            ) => Geometry::Qkv(Qkv {
                heads,
                kv_heads,
                head_dim,
                inner,
            }),
            (
                Style::Column,
                Out::Merged {
                    sizes,
                    disable_tp,
                    tuples,
                },
            ) => merged(sizes, inner, disable_tp, tuples),
            (Style::Column, Out::Single(n)) => Geometry::Column(Column {
                shape: vec![n, cols],
            }),
            (Style::Row, out) => Geometry::Row(Row {
                shape: vec![n_of(&out), cols],
            }),
            (Style::Replicated, out) => Geometry::Replicated(Replicated {
                shape: vec![n_of(&out), cols],
            }),
        }
    }

    /// A parameter `[rows, N/out_div]` with the output on dim 1 (GPTQ, AWQ): a column-parallel
    /// layer's parts split on dim 1, a row-parallel layer's `rows` split on dim 0.
    pub(super) fn cols_last(&self, rows: u64, out_div: u64) -> Geometry {
        let out = self.out_over(out_div);
        let n = n_of(&out);
        let of = match (self.style, out) {
            (Style::Row, _) => {
                return Geometry::Column(Column {
                    shape: vec![rows, n],
                });
            }
            (Style::Replicated, _) => {
                return Geometry::Replicated(Replicated {
                    shape: vec![rows, n],
                });
            }
            (Style::Column, Out::Single(_)) => {
                return Geometry::Row(Row {
                    shape: vec![rows, n],
                });
            }
            (
                Style::Column,
                Out::Qkv {
                    heads,
                    kv_heads,
                    head_dim,
                },
            ) => Geometry::Qkv(Qkv {
                heads,
                kv_heads,
                head_dim,
                inner: vec![],
            }),
            (
                Style::Column,
                Out::Merged {
                    sizes,
                    disable_tp,
                    tuples,
                },
            ) => merged(sizes, vec![], disable_tp, tuples),
        };
        Geometry::WithLeading(WithLeading {
            leading: vec![rows],
            of: Box::new(of),
        })
    }

    /// A parameter `[N/out_div, cols]` whole on a row-parallel layer (vLLM's channel scales and
    /// `marlin_repeat_scales_on_all_ranks`), otherwise laid out as [`LinearShape::rows_first`].
    pub(super) fn rows_first_whole_on_row(&self, out_div: u64, cols: u64) -> Geometry {
        match self.style {
            Style::Row => Geometry::Replicated(Replicated {
                shape: vec![self.n() / out_div, cols],
            }),
            _ => self.rows_first(out_div, cols),
        }
    }

    /// [`LinearShape::cols_last`], but whole on a row-parallel layer.
    pub(super) fn cols_last_whole_on_row(&self, rows: u64, out_div: u64) -> Geometry {
        match self.style {
            Style::Row => Geometry::Replicated(Replicated {
                shape: vec![rows, self.n() / out_div],
            }),
            _ => self.cols_last(rows, out_div),
        }
    }

    /// The input width one rank holds.
    pub(super) fn k_local(&self, tp: u64) -> u64 {
        match self.style {
            Style::Row => self.k / tp,
            _ => self.k,
        }
    }
}

/// A merged column's parameter: filled shard by shard, or with `tuples` runs of shards from one
/// checkpoint tensor each (a tuple's parameter is then cut per shard as its weight is).
fn merged(sizes: Vec<u64>, inner: Vec<u64>, disable_tp: bool, tuples: Vec<Vec<u64>>) -> Geometry {
    if tuples.is_empty() {
        Geometry::MergedColumn(MergedColumn {
            sizes,
            inner,
            disable_tp,
        })
    } else {
        Geometry::MergedTuples(MergedTuples {
            sizes,
            inner,
            tuples,
        })
    }
}

fn n_of(out: &Out) -> u64 {
    LinearShape {
        out: out.clone(),
        k: 0,
        style: Style::Replicated,
    }
    .n()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layout::Rank;

    fn qkv() -> Geometry {
        Geometry::Qkv(Qkv {
            heads: 8,
            kv_heads: 4,
            head_dim: 16,
            inner: vec![128],
        })
    }

    /// GPTQ's `qzeros [K/g, N/8]` of a qkv layer at TP 2: each rank's q, k and v packed columns,
    /// at the packed offsets (`[q 8 | k 4 | v 4]` words of 8 columns).
    #[test]
    fn packed_output_columns_split_per_part() {
        let l = LinearShape::of(&qkv()).unwrap();
        let g = l.cols_last(4, 8);
        let r = Rank {
            tp: 2,
            rank: 1,
            ep: false,
        };
        let layout = g.rank_layout(r, true);
        assert_eq!(layout.shape, vec![4, 16]);
        let got: Vec<(usize, u64, u64, u64)> = (layout.slices.iter())
            .map(|s| (s.dim, s.from, s.to, s.dst_at))
            .collect();
        // q: words 8..16 of 16; k (2 heads of 2 words each): 16 + 4..8; v: 24 + 4..8.
        assert_eq!(got, vec![(1, 8, 16, 0), (1, 20, 24, 8), (1, 28, 32, 12)]);
        assert_eq!(g.expected_source(None).unwrap().to_vec(), vec![4, 32]);
    }

    #[test]
    fn row_parallel_packed_columns_split_and_channel_scales_stay_whole() {
        let l = LinearShape::of(&Geometry::Row(Row {
            shape: vec![128, 256],
        }))
        .unwrap();
        let r = Rank {
            tp: 4,
            rank: 3,
            ep: false,
        };
        assert_eq!(
            l.rows_first(1, 32).rank_layout(r, false).shape,
            vec![128, 8]
        );
        assert_eq!(
            l.rows_first_whole_on_row(1, 1).rank_layout(r, false).shape,
            vec![128, 1]
        );
        assert_eq!(l.cols_last(32, 1).rank_layout(r, false).shape, vec![8, 128]);
        assert_eq!(l.k_local(4), 64);
    }
}
