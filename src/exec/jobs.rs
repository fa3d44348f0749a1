//! What the engine runs: a plan's copy pieces placed as jobs per source, the fills, and the
//! parallel work items they are cut into (dense spans, chunks stretched over transposed blocks);
//! kept apart from the copying so that the cutting can be read, and changed, on its own.

use super::parts::PartFile;
use super::source::ALIGN;
use super::{ExecOptions, Placement, Sink};
use crate::dtype::Dtype;
use crate::layout::{Block, ZeroRows};
use crate::plan::{OutTensor, Piece, Plan, SourceTensor};

/// One copy piece, placed: output `out`, tensor data at byte `base`, converted to `to`.
pub(super) struct Job {
    pub(super) out: usize,
    pub(super) base: u64,
    pub(super) to: Dtype,
    pub(super) b: Block,
    /// Zero elements the job writes after each of its rows ([`row_pad`]), 0 for none.
    pub(super) pad: u64,
}

/// Whether copies write their rows' zero padding with the rows, for `sink`: on files that start
/// zeroed and take large puts best. The padded MXFP4 `w2_weight` of vLLM's TRITON backend is then
/// one span per chunk instead of a `pwrite` per row (1.5 million a gpt-oss shard).
pub(super) fn pads_rows(sink: &dyn Sink) -> bool {
    sink.starts_zeroed() && !sink.cheap_small_puts()
}

/// The zeros after each row of copy block `b`, in elements, when `zeros` (its tensor's zero
/// rows) hold exactly those tails: rows and tails then make one dense destination span. Only
/// unconverted, untransposed copies (the gather's), so that the tail bytes are the tensor's zeros.
fn row_pad(zeros: &[ZeroRows], b: &Block) -> u64 {
    if b.transposed() || b.rows == 0 || b.row == 0 || b.dst_stride <= b.row {
        return 0;
    }
    let tail = b.dst_start + b.row;
    let holds = |z: &&ZeroRows| {
        z.stride == b.dst_stride
            && z.count == b.dst_stride - b.row
            && tail >= z.start
            && (tail - z.start).is_multiple_of(z.stride)
            && (tail - z.start) / z.stride + b.rows <= z.rows
    };
    zeros.iter().find(holds).map_or(0, |z| z.count)
}

/// [`row_pad`] of a copy piece of `t`, 0 for reductions and conversions.
fn piece_pad(plan: &Plan, t: &OutTensor, zeros: &[ZeroRows], piece: &Piece) -> u64 {
    match piece {
        Piece::Copy { source, region, .. }
            if !region.reduces() && plan.sources[*source].dtype == t.dtype =>
        {
            piece.block().map_or(0, |b| row_pad(zeros, &b))
        }
        _ => 0,
    }
}

/// `t`'s zero rows when copies pad rows (`pad_rows`), else none.
fn zero_rows_of(t: &OutTensor, pad_rows: bool) -> Vec<ZeroRows> {
    if pad_rows {
        t.pieces.zero_rows().copied().collect()
    } else {
        Vec::new()
    }
}

/// One reducing piece, placed (run by `reduce.rs`): output `out`, tensor data at byte `base`, in dtype `to`; each
/// of the block's `row` destination elements is the maximum of `max_of` source elements.
pub(super) struct Reduce {
    pub(super) out: usize,
    pub(super) base: u64,
    pub(super) to: Dtype,
    pub(super) source: usize,
    pub(super) b: Block,
    pub(super) max_of: u64,
    /// The scale source of a dequantization (then `max_of` is unused).
    pub(super) dequant: Option<usize>,
    /// Each element is `-exp` of its source element (then `max_of` is 1).
    pub(super) neg_exp: bool,
}

/// A fill the sink must write: output, byte offset, dtype, value, element count.
pub(super) type Fill = (usize, u64, Dtype, f64, u64);

/// The copy pieces of the placed tensors as jobs per source, the reductions, and the fills a
/// sink must write (zero fills are skipped on a sink whose files start zeroed).
/// With `pad_rows` ([`pads_rows`]), copies whose rows are followed by zero padding write it.
pub(super) fn jobs_and_fills(
    plan: &Plan,
    placements: &[Placement],
    starts_zeroed: bool,
    pad_rows: bool,
) -> (Vec<Vec<Job>>, Vec<Reduce>, Vec<Fill>) {
    let mut jobs: Vec<Vec<Job>> = (0..plan.sources.len()).map(|_| Vec::new()).collect();
    let (mut reduces, mut fills) = (Vec::new(), Vec::new());
    // Padding written by copies replaces zero fills, which only a zeroed sink skips.
    let pad_rows = pad_rows && starts_zeroed;
    for pl in placements {
        let t = &plan.ranks[pl.rank].tensors[pl.tensor];
        let zeros = zero_rows_of(t, pad_rows);
        for piece in t.pieces.iter() {
            match &piece {
                Piece::Copy { source, region, .. } if region.reduces() => reduces.push(Reduce {
                    out: pl.out,
                    base: pl.offset,
                    to: t.dtype,
                    source: *source,
                    b: piece.block().expect("a copy piece has a block"),
                    max_of: region.max_of,
                    dequant: region.dequant,
                    neg_exp: region.neg_exp,
                }),
                Piece::Copy { source, .. } => jobs[*source].push(Job {
                    out: pl.out,
                    base: pl.offset,
                    to: t.dtype,
                    b: piece.block().expect("a copy piece has a block"),
                    pad: piece_pad(plan, t, &zeros, &piece),
                }),
                Piece::Fill {
                    dst_start,
                    count,
                    value,
                } => {
                    // By bits: -0.0 is not zero bytes (0x8000 in bf16), so it must be written.
                    if value.to_bits() != 0 || !starts_zeroed {
                        let item = t.dtype.bits() / 8;
                        fills.push((
                            pl.out,
                            pl.offset + dst_start * item,
                            t.dtype,
                            *value,
                            *count,
                        ));
                    }
                }
            }
        }
    }
    (jobs, reduces, fills)
}

/// The byte ranges `(out, start, end)` of the zero fills a sink that starts zeroed skips (they
/// count as written from the start), less the row padding that copies write with `pad_rows`
/// ([`pads_rows`]), so that each byte is hashed once. Mirrors [`jobs_and_fills`], which writes a
/// fill when its value is not zero.
pub(super) fn zero_fills(
    plan: &Plan,
    placements: &[Placement],
    pad_rows: bool,
) -> Vec<(usize, u64, u64)> {
    let mut v = Vec::new();
    for pl in placements {
        let t = &plan.ranks[pl.rank].tensors[pl.tensor];
        let item = t.dtype.bits() / 8;
        let zeros = zero_rows_of(t, pad_rows);
        // The element spans the padded copies write whole, by start.
        let mut padded: Vec<(u64, u64)> = Vec::new();
        if !zeros.is_empty() {
            for piece in t.pieces.iter() {
                if piece_pad(plan, t, &zeros, &piece) > 0
                    && let Some(b) = piece.block()
                {
                    padded.push((b.dst_start, b.dst_start + b.rows * b.dst_stride));
                }
            }
            padded.sort_unstable();
        }
        let in_padded = |a: u64, e: u64| {
            let i = padded.partition_point(|&(s, _)| s <= a);
            i > 0 && padded[i - 1].1 >= e
        };
        for piece in t.pieces.iter() {
            if let Piece::Fill {
                dst_start,
                count,
                value,
            } = piece
                && value.to_bits() == 0
                && !in_padded(dst_start, dst_start + count)
            {
                let start = pl.offset + dst_start * item;
                v.push((pl.out, start, start + count * item));
            }
        }
    }
    v
}

/// The parallel work, in file order: every source with jobs split into items, and per source the
/// jobs its chunk items serve.
pub(super) fn work_items(
    plan: &Plan,
    jobs: &[Vec<Job>],
    opts: ExecOptions,
) -> (Vec<Item>, Vec<Vec<usize>>) {
    let mut order: Vec<usize> = (0..plan.sources.len())
        .filter(|&s| !jobs[s].is_empty())
        .collect();
    order.sort_by_key(|&s| (plan.sources[s].file_index, plan.sources[s].offset));
    let mut rest: Vec<Vec<usize>> = (0..plan.sources.len()).map(|_| Vec::new()).collect();
    let mut items = Vec::new();
    for &s in &order {
        split_source(
            s,
            &plan.sources[s],
            &jobs[s],
            opts,
            &mut items,
            &mut rest[s],
        );
    }
    (items, rest)
}

/// One unit of parallel work: a dense, unconverted span of one job (bytes `[at, at + len)` of
/// it), or one chunk of a source (elements `[c0, c1)`) for every other job of that source.
#[derive(Debug, Clone, Copy)]
pub(super) enum Item {
    Span {
        source: usize,
        job: usize,
        at: u64,
        len: u64,
    },
    Chunk {
        source: usize,
        c0: u64,
        c1: u64,
    },
}

impl Item {
    pub(super) fn source(&self) -> usize {
        match *self {
            Item::Span { source, .. } | Item::Chunk { source, .. } => source,
        }
    }
}

/// A source's work items: its dense unconverted jobs as spans of at most a chunk each, and the
/// rest (converted, strided, transposed) as chunks of the source read once for all of them.
fn split_source(
    source: usize,
    src: &SourceTensor,
    jobs: &[Job],
    opts: ExecOptions,
    items: &mut Vec<Item>,
    rest: &mut Vec<usize>,
) {
    let isz = src.dtype.bits() / 8;
    let step = opts.chunk_bytes.max(1);
    for (j, job) in jobs.iter().enumerate() {
        if !is_span(&job.b, job.to, src, opts.direct) {
            rest.push(j);
            continue;
        }
        let len = job.b.rows * job.b.row * isz;
        let from = src.offset + job.b.src_start * isz;
        let mut at = 0;
        while at < len {
            let mut n = step.min(len - at);
            // Spans end on block boundaries of the file, so that direct reads of neighbouring
            // spans never share a block.
            // Rounded down, so that a span stays within a chunk (and a GPU staging slot).
            if step >= ALIGN && n < len - at {
                let end = (from + at + n) / ALIGN * ALIGN;
                if end > from + at {
                    n = end - from - at;
                }
            }
            items.push(Item::Span {
                source,
                job: j,
                at,
                len: n,
            });
            at += n;
        }
    }
    if rest.is_empty() {
        return;
    }
    let chunk = (opts.chunk_bytes / isz).max(1);
    let refs: Vec<&Job> = rest.iter().map(|&j| &jobs[j]).collect();
    let spans = transposed_spans(&refs);
    // Only the elements the jobs reach are read: a rank's slice of a converted tensor is its
    // slice, not the whole tensor.
    let Some((mut c0, total)) = union(refs.iter().map(|j| extent(&j.b))) else {
        return;
    };
    while c0 < total {
        let c1 = chunk_end(c0, chunk, total, &spans);
        items.push(Item::Chunk { source, c0, c1 });
        c0 = c1;
    }
}

/// Whether a run copies block `b` of `src` (into dtype `to`) as spans of its own, read exactly
/// (dense and unconverted, with `direct` copies allowed), rather than within chunks of the
/// source read once for every other job.
pub(super) fn is_span(b: &Block, to: Dtype, src: &SourceTensor, direct: bool) -> bool {
    let dense =
        !b.transposed() && (b.rows == 1 || (b.src_stride == b.row && b.dst_stride == b.row));
    direct && dense && to == src.dtype && b.rows * b.row > 0
}

/// The source elements `[first, last + 1)` block `b` reaches; `None` for an empty block.
pub(super) fn extent(b: &Block) -> Option<(u64, u64)> {
    (b.rows > 0 && b.row > 0).then(|| {
        (
            b.src_start,
            b.src_start + (b.rows - 1) * b.src_stride + b.src_row_span(),
        )
    })
}

/// The smallest range holding every one of `extents`; `None` when all are empty.
fn union(extents: impl Iterator<Item = Option<(u64, u64)>>) -> Option<(u64, u64)> {
    extents
        .flatten()
        .reduce(|(a0, a1), (b0, b1)| (a0.min(b0), a1.max(b1)))
}

/// A chunk is stretched to hold a whole transposed block of at most this many chunks, so that
/// the block goes out in one put (one gpt-oss expert: 33 MB for gpt-oss-120b's `gate_up_proj`).
const TRANSPOSED_CHUNKS: u64 = 4;

/// The source ranges `[first, last + 1)` of the transposed jobs, by start.
fn transposed_spans(jobs: &[&Job]) -> Vec<(u64, u64)> {
    let mut v: Vec<(u64, u64)> = jobs
        .iter()
        .filter(|j| j.b.transposed() && j.b.rows > 0)
        .map(|j| {
            let b = j.b;
            (
                b.src_start,
                b.src_start + (b.rows - 1) * b.src_stride + b.src_row_span(),
            )
        })
        .collect();
    v.sort_unstable();
    v
}

/// Where the chunk from `c0` ends: `chunk` elements on, stretched over a transposed block that
/// starts in it when the chunk then stays within [`TRANSPOSED_CHUNKS`] chunks. A transposed block
/// cut by a chunk boundary still copies right, as row pieces.
fn chunk_end(c0: u64, chunk: u64, total: u64, spans: &[(u64, u64)]) -> u64 {
    let mut c1 = (c0 + chunk).min(total);
    let limit = c0.saturating_add(chunk.saturating_mul(TRANSPOSED_CHUNKS));
    let first = spans.partition_point(|&(a, _)| a < c0);
    for &(a, b) in &spans[first..] {
        if a >= c1 {
            break;
        }
        if b > c1 && b <= limit {
            c1 = b.min(total);
        }
    }
    c1
}

/// Every tensor of the given part files, placed at its data offset in file `out`.
pub(crate) fn placements_for(plan: &Plan, files: &[PartFile]) -> Vec<Placement> {
    let mut v = Vec::new();
    for (out, f) in files.iter().enumerate() {
        let rank = plan
            .ranks
            .iter()
            .position(|r| r.rank == f.rank)
            .expect("part files come from the plan's ranks");
        for &(tensor, offset) in &f.tensors {
            v.push(Placement {
                rank,
                tensor,
                out,
                offset,
            });
        }
    }
    v
}

/// Where in a block each tensor of `rank` would best start in memory: the file offset, modulo
/// [`ALIGN`], of the source bytes that land at its start, by its largest unconverted
/// dense copy (0 when it has none). Host memory placed so takes direct reads without a copy.
pub(crate) fn phases(plan: &Plan, rank: usize) -> Vec<u64> {
    plan.ranks[rank]
        .tensors
        .iter()
        .map(|t| {
            let osz = t.dtype.bits() / 8;
            t.pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Copy { source, .. } => Some((&plan.sources[source], p.block()?)),
                    Piece::Fill { .. } => None,
                })
                .filter(|(s, b)| s.dtype == t.dtype && !b.transposed())
                .max_by_key(|(_, b)| b.rows * b.row)
                .map_or(0, |(s, b)| {
                    let isz = s.dtype.bits() / 8;
                    let src = (s.offset + b.src_start * isz) % ALIGN;
                    let dst = (b.dst_start * osz) % ALIGN;
                    (src + ALIGN - dst) % ALIGN
                })
        })
        .collect()
}
