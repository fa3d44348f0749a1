//! The engine's chunked copies against a naive whole-tensor reference: random source tensors
//! (fixed seed) whose sizes straddle chunk boundaries, read in chunks of 1, 7, 64 and 4096 bytes
//! (and the default), copied whole, as row and column slices, merged into one tensor (qkv-style,
//! along rows and along columns), converted between f32/bf16/f16 (and f64 → f32) both ways, plus
//! fills; into part files (with and without copy_file_range), into host memory, through buffered,
//! O_DIRECT and mapped reads (unaligned starts and file tails everywhere), and read back by
//! the verifier, which must also find a flipped byte wherever it is.

use std::fs;
use std::path::Path;
use std::sync::atomic::AtomicBool;

use super::device::{CpuDevice, Device};
use super::parts::{self, PartFile};
use super::source::{IoMode, SourceFile};
use super::{
    CHUNK_BYTES, Control, ExecError, ExecOptions, Placement, Sink, convert, execute, verify, write,
};
use crate::dtype::Dtype;
use crate::plan::{OutTensor, Piece, Plan, RankPlan, SourceTensor};
use crate::progress::Quiet;

const CHUNKS: [u64; 5] = [1, 7, 64, 4096, CHUNK_BYTES];
pub(super) const SEED: u64 = 0x5eed_0009_c4c4_1e57;
const ROUNDS: usize = 6;

/// splitmix64: a fixed, dependency-free stream of test data.
pub(super) struct Rng(pub(super) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..=hi`.
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }

    fn pick<T: Copy>(&mut self, v: &[T]) -> T {
        v[self.next() as usize % v.len()]
    }
}

fn item(d: Dtype) -> u64 {
    d.bits() / 8
}

/// A source tensor as the test holds it: its bytes in memory (the reference reads these, never
/// the file), and where they sit in the checkpoint.
pub(super) struct Src {
    rows: u64,
    cols: u64,
    dtype: Dtype,
    bytes: Vec<u8>,
}

/// Random element bits, mostly finite values (so that conversions round), some NaN/inf/subnormal
/// patterns (so that canonical NaNs and overflow are exercised too).
fn random_bytes(rng: &mut Rng, dtype: Dtype, n: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity((n * item(dtype)) as usize);
    for _ in 0..n {
        let special = rng.range(0, 15) == 0;
        match dtype {
            Dtype::F32 => {
                let x = if special {
                    f32::from_bits(rng.next() as u32)
                } else {
                    (rng.next() as i32 as f32) / 1e6
                };
                out.extend_from_slice(&x.to_le_bytes());
            }
            Dtype::F64 => {
                let x = if special {
                    f64::from_bits(rng.next())
                } else {
                    (rng.next() as i64 as f64) / 1e12
                };
                out.extend_from_slice(&x.to_le_bytes());
            }
            Dtype::Bf16 | Dtype::F16 => {
                out.extend_from_slice(&(rng.next() as u16).to_le_bytes());
            }
            _ => out.push(rng.next() as u8),
        }
    }
    out
}

/// The naive reference: the whole tensor, piece by piece, row by row, from the in-memory sources.
pub(super) fn reference_tensor(t: &OutTensor, srcs: &[Src]) -> Vec<u8> {
    let osz = item(t.dtype) as usize;
    let mut out = vec![0u8; t.bytes as usize];
    for p in t.pieces.iter() {
        match p {
            Piece::Copy {
                source,
                rows,
                row,
                src_start,
                src_stride,
                dst_start,
                dst_stride,
                src_elem_stride,
                ..
            } => {
                let s = &srcs[source];
                let isz = item(s.dtype) as usize;
                for k in 0..rows {
                    let mut raw = Vec::new();
                    for x in 0..row {
                        let a = ((src_start + k * src_stride + x * src_elem_stride) as usize) * isz;
                        raw.extend_from_slice(&s.bytes[a..a + isz]);
                    }
                    let mut conv = Vec::new();
                    convert::convert_into(s.dtype, t.dtype, &raw, &mut conv);
                    let d = ((dst_start + k * dst_stride) as usize) * osz;
                    out[d..d + conv.len()].copy_from_slice(&conv);
                }
            }
            Piece::Fill {
                dst_start,
                count,
                value,
            } => {
                let mut one = Vec::new();
                convert::convert_into(Dtype::F32, t.dtype, &(value as f32).to_le_bytes(), &mut one);
                for i in 0..count as usize {
                    let d = (dst_start as usize + i) * osz;
                    out[d..d + osz].copy_from_slice(&one);
                }
            }
        }
    }
    out
}

fn copy(source: usize, rows: u64, row: u64, src: (u64, u64), dst: (u64, u64)) -> Piece {
    Piece::Copy {
        source,
        region: crate::plan::Region::ALL,
        rows,
        row,
        src_start: src.0,
        src_stride: src.1,
        dst_start: dst.0,
        dst_stride: dst.1,
        src_elem_stride: 1,
    }
}

/// A transposing copy: element x of row k from `src.0 + k·src.1 + x·src.2`.
fn transposed(source: usize, rows: u64, row: u64, src: (u64, u64, u64), dst: (u64, u64)) -> Piece {
    let mut p = copy(source, rows, row, (src.0, src.1), dst);
    if let Piece::Copy {
        src_elem_stride, ..
    } = &mut p
    {
        *src_elem_stride = src.2;
    }
    p
}

/// Output dtype for a source: itself, or (floats only) another float.
fn out_dtype(rng: &mut Rng, from: Dtype) -> Dtype {
    match from {
        Dtype::F32 | Dtype::Bf16 | Dtype::F16 => {
            rng.pick(&[from, Dtype::F32, Dtype::Bf16, Dtype::F16])
        }
        Dtype::F64 => rng.pick(&[Dtype::F64, Dtype::F32]),
        other => other,
    }
}

fn tensor(name: String, dtype: Dtype, shape: Vec<u64>, pieces: Vec<Piece>) -> OutTensor {
    let bytes = shape.iter().product::<u64>() * item(dtype);
    OutTensor {
        name,
        dtype,
        shape,
        bytes,
        pieces: pieces.into(),
    }
}

/// The stamps of the files `sources` read, by file index, as the header reader takes them.
fn stamps(root: &Path, sources: &[SourceTensor]) -> Vec<crate::file_stamp::FileStamp> {
    let mut out = Vec::new();
    for s in sources {
        if out.len() <= s.file_index {
            out.resize(s.file_index + 1, Default::default());
        }
        let f = fs::File::open(root.join(&*s.file)).unwrap();
        out[s.file_index] = crate::file_stamp::FileStamp::of_file(&f).unwrap();
    }
    out
}

/// One random problem: a checkpoint of two files under `root` and a plan of two ranks.
pub(super) fn problem(rng: &mut Rng, root: &Path) -> (Plan, Vec<Src>) {
    let (sources, srcs) = random_checkpoint(rng, root);
    let mut ranks = Vec::new();
    for rank in 0..2u64 {
        let mut tensors = slices_of_each(rng, rank, &srcs);
        // qkv-style merges of three sources with the same column count / row count, when present.
        merged(rng, rank, &srcs, &mut tensors);
        ranks.push(RankPlan {
            rank,
            pp_rank: 0,
            tp_rank: rank,
            bytes: tensors.iter().map(|t| t.bytes).sum(),
            tensors,
        });
    }
    let plan = Plan {
        family: "test".into(),
        architecture: "Test".into(),
        tp: 2,
        pp: 1,
        stages: Vec::new(),
        expert_parallel: false,
        dtype: Dtype::Bf16,
        file_stamps: stamps(root, &sources),
        sources,
        ranks,
        readers: Vec::new(),
        tie_word_embeddings: false,
        retie: None,
        skipped: Vec::new(),
        moe_backend: None,
        language_model_only: false,
        mm_encoder_tp_mode: None,
        warnings: Vec::new(),
        module_tree: None,
        replicate_embed: false,
        quantization: None,
    };
    (plan, srcs)
}

/// A plan of one rank at TP1 reading one source tensor under `root`.
fn one_rank_plan(root: &Path, source: SourceTensor, dtype: Dtype, tensors: Vec<OutTensor>) -> Plan {
    Plan {
        family: "test".into(),
        architecture: "Test".into(),
        tp: 1,
        pp: 1,
        stages: Vec::new(),
        expert_parallel: false,
        dtype,
        file_stamps: stamps(root, std::slice::from_ref(&source)),
        sources: vec![source],
        ranks: vec![RankPlan {
            rank: 0,
            pp_rank: 0,
            tp_rank: 0,
            bytes: tensors.iter().map(|t| t.bytes).sum(),
            tensors,
        }],
        readers: Vec::new(),
        tie_word_embeddings: false,
        retie: None,
        skipped: Vec::new(),
        moe_backend: None,
        language_model_only: false,
        mm_encoder_tp_mode: None,
        warnings: Vec::new(),
        module_tree: None,
        replicate_embed: false,
        quantization: None,
    }
}

/// Random 2-D source tensors of random dtypes in two files under `root`, each after some junk.
fn random_checkpoint(rng: &mut Rng, root: &Path) -> (Vec<SourceTensor>, Vec<Src>) {
    let dtypes = [Dtype::F32, Dtype::Bf16, Dtype::F16, Dtype::F64, Dtype::I8];
    let mut srcs = Vec::new();
    let mut sources = Vec::new();
    let mut files = [Vec::new(), Vec::new()];
    for i in 0..rng.range(4, 9) {
        let dtype = rng.pick(&dtypes);
        // Up to ~20 KB: across the 4096-byte chunk, and many 64-byte ones.
        let (rows, cols) = (rng.range(1, 70), rng.range(1, 70));
        let bytes = random_bytes(rng, dtype, rows * cols);
        let fi = rng.range(0, 1) as usize;
        // Unaligned junk before each tensor: offsets must come from the plan, not alignment.
        let pad = rng.range(0, 13) as usize;
        files[fi].extend((0..pad).map(|_| rng.next() as u8));
        sources.push(SourceTensor {
            name: format!("src.{i}").into(),
            file: format!("ckpt-{fi}.bin").into(),
            file_index: fi,
            offset: files[fi].len() as u64,
            dtype,
            shape: smallvec::smallvec![rows, cols],
        });
        files[fi].extend_from_slice(&bytes);
        srcs.push(Src {
            rows,
            cols,
            dtype,
            bytes,
        });
    }
    for (fi, data) in files.iter().enumerate() {
        fs::write(root.join(format!("ckpt-{fi}.bin")), data).unwrap();
    }

    (sources, srcs)
}

/// Rank `rank`'s copies of each source: whole, a row slice, a column slice, transposed whole and
/// a transposed column slice.
fn slices_of_each(rng: &mut Rng, rank: u64, srcs: &[Src]) -> Vec<OutTensor> {
    let mut tensors = Vec::new();
    for (si, s) in srcs.iter().enumerate() {
        let (r, c) = (s.rows, s.cols);
        let to = out_dtype(rng, s.dtype);
        // Whole tensor.
        tensors.push(tensor(
            format!("r{rank}.whole.{si}"),
            to,
            vec![r, c],
            vec![copy(si, 1, r * c, (0, 0), (0, 0))],
        ));
        // Row slice [a, b): one dense span from the middle of the source.
        let a = rng.range(0, r - 1);
        let b = rng.range(a + 1, r);
        tensors.push(tensor(
            format!("r{rank}.rows.{si}"),
            to,
            vec![b - a, c],
            vec![copy(si, 1, (b - a) * c, (a * c, 0), (0, 0))],
        ));
        // Column slice [a, b): strided source, dense destination.
        let a = rng.range(0, c - 1);
        let b = rng.range(a + 1, c);
        tensors.push(tensor(
            format!("r{rank}.cols.{si}"),
            to,
            vec![r, b - a],
            vec![copy(si, r, b - a, (a, c), (0, b - a))],
        ));
        // Transposed: the whole tensor, and columns [a, b) of it (gpt-oss's experts).
        tensors.push(tensor(
            format!("r{rank}.t.{si}"),
            to,
            vec![c, r],
            vec![transposed(si, c, r, (0, 1, c), (0, r))],
        ));
        tensors.push(tensor(
            format!("r{rank}.tcols.{si}"),
            to,
            vec![b - a, r],
            vec![transposed(si, b - a, r, (a, 1, c), (0, r))],
        ));
    }
    tensors
}

/// Two merged tensors: the row halves of up to three sources stacked along rows (dense pieces at
/// offsets, like q/k/v), and the column halves of them side by side (strided destination, like a
/// merged column-parallel gate_up), each followed by a padding fill.
fn merged(rng: &mut Rng, rank: u64, srcs: &[Src], tensors: &mut Vec<OutTensor>) {
    let picks: Vec<usize> = (0..3)
        .map(|_| rng.range(0, srcs.len() as u64 - 1) as usize)
        .collect();
    let to = rng.pick(&[Dtype::F32, Dtype::Bf16, Dtype::F16]);
    let conv = |d: Dtype| matches!(d, Dtype::F32 | Dtype::Bf16 | Dtype::F16);
    let picks: Vec<usize> = picks.into_iter().filter(|&i| conv(srcs[i].dtype)).collect();
    if picks.is_empty() {
        return;
    }
    let fill = rng.pick(&[0.0, -0.0, 1.0, -2.5]);

    // Along rows: each source contributes the rows of its half `rank`, cut to a shared width.
    let width = picks.iter().map(|&i| srcs[i].cols).min().unwrap();
    let mut pieces = Vec::new();
    let mut at = 0;
    for &i in &picks {
        let s = &srcs[i];
        let half = s.rows.div_ceil(2);
        let (a, b) = ((rank * half).min(s.rows), ((rank + 1) * half).min(s.rows));
        if a < b {
            pieces.push(copy(
                i,
                b - a,
                width,
                (a * s.cols, s.cols),
                (at * width, width),
            ));
            at += b - a;
        }
    }
    let pad = rng.range(0, 3);
    pieces.push(Piece::Fill {
        dst_start: at * width,
        count: pad * width,
        value: fill,
    });
    tensors.push(tensor(
        format!("r{rank}.qkv"),
        to,
        vec![at + pad, width],
        pieces,
    ));

    // Along columns: each source's column half `rank`, over a shared row count.
    let height = picks.iter().map(|&i| srcs[i].rows).min().unwrap();
    let halves: Vec<(usize, u64, u64)> = picks
        .iter()
        .map(|&i| {
            let c = srcs[i].cols;
            let half = c.div_ceil(2);
            (i, (rank * half).min(c), ((rank + 1) * half).min(c))
        })
        .filter(|(_, a, b)| a < b)
        .collect();
    let total: u64 = halves.iter().map(|(_, a, b)| b - a).sum::<u64>() + 1;
    let mut pieces = Vec::new();
    let mut col = 0;
    for &(i, a, b) in &halves {
        pieces.push(copy(i, height, b - a, (a, srcs[i].cols), (col, total)));
        col += b - a;
    }
    // The last column of every row: a strided fill, one Fill per row as the planner would.
    for k in 0..height {
        pieces.push(Piece::Fill {
            dst_start: k * total + col,
            count: 1,
            value: fill,
        });
    }
    tensors.push(tensor(
        format!("r{rank}.gate_up"),
        to,
        vec![height, total],
        pieces,
    ));
}

/// The part files the reference expects: each header, then each tensor's reference bytes.
fn reference_file(plan: &Plan, f: &PartFile, srcs: &[Src]) -> Vec<u8> {
    let rank = plan.ranks.iter().find(|r| r.rank == f.rank).unwrap();
    let mut out = vec![0u8; f.size as usize];
    out[..f.header.len()].copy_from_slice(&f.header);
    for &(ti, off) in &f.tensors {
        let t = reference_tensor(&rank.tensors[ti], srcs);
        out[off as usize..off as usize + t.len()].copy_from_slice(&t);
    }
    out
}

/// Host memory, as `load --device cpu` fills it: small puts, direct reads into the buffer.
struct MemSink(CpuDevice);

impl Sink for MemSink {
    fn put(&self, out: usize, offset: u64, bytes: &[u8]) -> Result<(), ExecError> {
        self.0.upload(out, offset, bytes).map_err(ExecError::Device)
    }

    fn starts_zeroed(&self) -> bool {
        true
    }

    fn cheap_small_puts(&self) -> bool {
        self.0.is_host()
    }

    fn copy_from_source(
        &self,
        out: usize,
        offset: u64,
        src: &SourceFile,
        src_offset: u64,
        len: u64,
    ) -> Result<bool, ExecError> {
        self.0
            .upload_from_file(out, offset, src, src_offset, len)
            .map_err(ExecError::Device)
    }
}

/// First differing byte of two buffers, for messages.
fn first_diff(a: &[u8], b: &[u8]) -> Option<usize> {
    if a == b {
        return None;
    }
    Some(
        a.iter()
            .zip(b)
            .position(|(x, y)| x != y)
            .unwrap_or(a.len().min(b.len())),
    )
}

fn check_files(plan: &Plan, root: &Path, srcs: &[Src], opts: ExecOptions, ctx: &str) {
    let files: Vec<PartFile> = plan
        .ranks
        .iter()
        .flat_map(|r| parts::layout(r, Some(part_size(r)), false))
        .collect();
    let dir = tempfile::TempDir::new().unwrap();
    let cancel = AtomicBool::new(false);
    write::write_parts(
        plan,
        root,
        dir.path(),
        &files,
        &Control::new(&cancel, &Quiet).with_options(opts),
    )
    .unwrap_or_else(|e| panic!("{ctx}: writing: {e}"));
    for f in &files {
        let got = fs::read(dir.path().join(&f.name)).unwrap();
        let want = reference_file(plan, f, srcs);
        if let Some(at) = first_diff(&want, &got) {
            panic!("{ctx}: {} differs from the reference at byte {at}", f.name);
        }
    }
    verify::verify_parts(
        plan,
        root,
        dir.path(),
        &files,
        &Control::new(&cancel, &Quiet).with_options(opts),
    )
    .unwrap_or_else(|e| panic!("{ctx}: verifying a correct output: {e}"));

    // The verifier must find a flipped byte anywhere: header, data, fills, strided columns.
    // (Each probe is a whole verification: a few chunk sizes are enough.)
    if !matches!(opts.chunk_bytes, 7 | 4096) {
        return;
    }
    let f = &files[files.len() - 1];
    let path = dir.path().join(&f.name);
    let original = fs::read(&path).unwrap();
    let mut offsets = vec![0, f.header.len() as u64 - 1, f.size - 1];
    offsets.extend(f.tensors.iter().map(|&(_, o)| o));
    for at in offsets.into_iter().filter(|&o| o < f.size) {
        let mut bad = original.clone();
        bad[at as usize] ^= 0x10;
        fs::write(&path, &bad).unwrap();
        let r = verify::verify_parts(
            plan,
            root,
            dir.path(),
            &files,
            &Control::new(&cancel, &Quiet).with_options(opts),
        );
        match r {
            Err(ExecError::Mismatch { offset, .. }) => {
                assert_eq!(offset, at, "{ctx}: the verifier names the flipped byte")
            }
            other => panic!(
                "{ctx}: byte {at} of {} flipped: verifier said {other:?}",
                f.name
            ),
        }
    }
    fs::write(&path, &original).unwrap();
}

/// A part size that splits a rank into a few parts, so outputs > 0 are exercised too.
fn part_size(r: &RankPlan) -> u64 {
    (r.bytes / 3).max(1)
}

/// Every rank loaded into memory and checked against the reference: all in one run, or with
/// `opts.share_reads` one run per rank, as ranks in processes of their own load (their shared
/// sources read through the page cache while the rest is read direct).
fn check_memory(plan: &Plan, root: &Path, srcs: &[Src], opts: ExecOptions, ctx: &str) {
    if !opts.share_reads {
        return check_ranks(plan, root, srcs, opts, ctx, 0..plan.ranks.len());
    }
    let mut plan = plan.clone();
    plan.readers = super::shared::count_readers(&plan);
    for j in 0..plan.ranks.len() {
        check_ranks(&plan, root, srcs, opts, ctx, j..j + 1);
    }
}

fn check_ranks(
    plan: &Plan,
    root: &Path,
    srcs: &[Src],
    opts: ExecOptions,
    ctx: &str,
    ranks: std::ops::Range<usize>,
) {
    let mut placements = Vec::new();
    let mut sizes = Vec::new();
    for ri in ranks {
        let r = &plan.ranks[ri];
        for (ti, t) in r.tensors.iter().enumerate() {
            placements.push(Placement {
                rank: ri,
                tensor: ti,
                out: sizes.len(),
                offset: 0,
            });
            sizes.push(t.bytes);
        }
    }
    let mut dev = CpuDevice::default();
    dev.alloc(&sizes).unwrap();
    let sink = MemSink(dev);
    let cancel = AtomicBool::new(false);
    execute(
        plan,
        root,
        &placements,
        &sink,
        &Control::new(&cancel, &Quiet).with_options(opts),
    )
    .unwrap_or_else(|e| panic!("{ctx}: loading into memory: {e}"));
    for pl in &placements {
        let t = &plan.ranks[pl.rank].tensors[pl.tensor];
        let got = sink.0.download(pl.out).unwrap();
        let want = reference_tensor(t, srcs);
        if let Some(at) = first_diff(&want, &got[..want.len()]) {
            panic!(
                "{ctx}: {} in memory differs from the reference at byte {at}",
                t.name
            );
        }
    }
}

#[test]
fn chunked_copies_match_a_naive_reference() {
    let mut rng = Rng(SEED);
    for round in 0..ROUNDS {
        let root = tempfile::TempDir::new().unwrap();
        let (plan, srcs) = problem(&mut rng, root.path());
        for chunk_bytes in CHUNKS {
            for (direct, io, share_reads) in [
                (true, IoMode::Buffered, false),
                (false, IoMode::Buffered, false),
                (true, IoMode::Direct, false),
                (true, IoMode::Direct, true),
                (false, IoMode::Mmap, false),
            ] {
                // One-byte chunks through O_DIRECT are a block read per byte: slow, and no
                // edge that 7-byte chunks do not already cross.
                if chunk_bytes == 1 && io != IoMode::Buffered {
                    continue;
                }
                let opts = ExecOptions {
                    chunk_bytes,
                    direct,
                    io,
                    share_reads,
                };
                let ctx = format!("seed {SEED:#x} round {round}, {opts:?}");
                check_files(&plan, root.path(), &srcs, opts, &ctx);
                check_memory(&plan, root.path(), &srcs, opts, &ctx);
            }
        }
    }
}

/// A block with no rows or an empty row copies nothing (and must not underflow computing its
/// last row), whatever the chunk size.
#[test]
fn empty_blocks_copy_nothing() {
    let root = tempfile::TempDir::new().unwrap();
    fs::write(root.path().join("ckpt-0.bin"), [7u8; 64]).unwrap();
    let source = SourceTensor {
        name: "src".into(),
        file: "ckpt-0.bin".into(),
        file_index: 0,
        offset: 0,
        dtype: Dtype::F32,
        shape: smallvec::smallvec![4, 4],
    };
    let t = tensor(
        "t".into(),
        Dtype::Bf16,
        vec![4],
        vec![copy(0, 0, 4, (0, 4), (0, 4)), copy(0, 3, 0, (0, 4), (0, 4))],
    );
    let plan = one_rank_plan(root.path(), source, Dtype::Bf16, vec![t]);
    for chunk_bytes in CHUNKS {
        let mut dev = CpuDevice::default();
        dev.alloc(&[8]).unwrap();
        let sink = MemSink(dev);
        let pl = [Placement {
            rank: 0,
            tensor: 0,
            out: 0,
            offset: 0,
        }];
        let opts = ExecOptions {
            chunk_bytes,
            direct: true,
            io: IoMode::Buffered,
            share_reads: false,
        };
        let cancel = AtomicBool::new(false);
        execute(
            &plan,
            root.path(),
            &pl,
            &sink,
            &Control::new(&cancel, &Quiet).with_options(opts),
        )
        .unwrap();
        assert_eq!(sink.0.download(0).unwrap(), vec![0u8; 8], "{opts:?}");
    }
}

/// gpt-oss's expert weights in miniature: `gate_up_proj` [E 3, H 5, 2I 8] as F32 holding its own
/// element index, rank 1 of TP2 (columns [4, 8) of each expert, transposed to [3, 4, 5]), into
/// F32 and BF16, with chunks that cut rows anywhere, that hold an expert whole and the default.
/// Every byte is checked against the index formula, not against the reference above.
#[test]
fn transposed_copies_are_exact_at_every_chunk_size() {
    let (e, h, two_i, cols) = (3u64, 5u64, 8u64, (4u64, 8u64));
    let n = e * h * two_i;
    let root = tempfile::TempDir::new().unwrap();
    let data: Vec<u8> = (0..n).flat_map(|v| (v as f32).to_le_bytes()).collect();
    // Junk before the tensor: offsets come from the plan.
    let mut file = vec![0xAAu8; 3];
    file.extend_from_slice(&data);
    fs::write(root.path().join("ckpt-0.bin"), &file).unwrap();
    let source = SourceTensor {
        name: "gate_up_proj".into(),
        file: "ckpt-0.bin".into(),
        file_index: 0,
        offset: 3,
        dtype: Dtype::F32,
        shape: smallvec::smallvec![e, h, two_i],
    };
    let w = cols.1 - cols.0;
    let pieces = || -> Vec<Piece> {
        (0..e)
            .map(|x| transposed(0, w, h, (x * h * two_i + cols.0, 1, two_i), (x * w * h, h)))
            .collect()
    };
    let tensors: Vec<OutTensor> = [Dtype::F32, Dtype::Bf16]
        .iter()
        .map(|&d| tensor(format!("w13.{d}"), d, vec![e, w, h], pieces()))
        .collect();
    let plan = one_rank_plan(root.path(), source, Dtype::F32, tensors);
    // want[x][c][k] = gate_up_proj[x][k][cols.0 + c]; small integers are exact in BF16 too.
    let want: Vec<f32> = (0..e)
        .flat_map(|x| {
            (0..w).flat_map(move |c| {
                (0..h).map(move |k| (x * h * two_i + k * two_i + cols.0 + c) as f32)
            })
        })
        .collect();
    let want_f32: Vec<u8> = want.iter().flat_map(|v| v.to_le_bytes()).collect();
    let want_bf16: Vec<u8> = want
        .iter()
        .flat_map(|v| ((v.to_bits() >> 16) as u16).to_le_bytes())
        .collect();
    let srcs = [Src {
        rows: e * h,
        cols: two_i,
        dtype: Dtype::F32,
        bytes: data,
    }];
    // 4, 12 and 20 bytes cut rows; 600 bytes hold an expert (160 bytes) with room.
    for chunk_bytes in [1, 4, 12, 20, 600, CHUNK_BYTES] {
        let opts = ExecOptions {
            chunk_bytes,
            direct: true,
            io: IoMode::Buffered,
            share_reads: false,
        };
        let mut dev = CpuDevice::default();
        dev.alloc(&[want_f32.len() as u64, want_bf16.len() as u64])
            .unwrap();
        let sink = MemSink(dev);
        let pl: Vec<Placement> = (0..2)
            .map(|t| Placement {
                rank: 0,
                tensor: t,
                out: t,
                offset: 0,
            })
            .collect();
        let cancel = AtomicBool::new(false);
        execute(
            &plan,
            root.path(),
            &pl,
            &sink,
            &Control::new(&cancel, &Quiet).with_options(opts),
        )
        .unwrap();
        assert_eq!(sink.0.download(0).unwrap(), want_f32, "F32, {opts:?}");
        assert_eq!(sink.0.download(1).unwrap(), want_bf16, "BF16, {opts:?}");
        // Part files and the verifier take the same path.
        check_files(&plan, root.path(), &srcs, opts, &format!("files, {opts:?}"));
    }
}
