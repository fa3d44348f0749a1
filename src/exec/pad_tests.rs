//! Row padding written with the rows (`jobs::pads_rows`): an MXFP4 `w2_weight` in miniature,
//! padded as vLLM's TRITON backend pads it, into part files at every chunk size. The bytes are
//! the plan's, the manifest checksum is that of the file on disk, and the zero fills hashed up
//! front leave out exactly the padding the copies write, so that each byte is hashed once.

use std::fs;
use std::sync::atomic::AtomicBool;

use super::jobs::{jobs_and_fills, zero_fills};
use super::parts;
use super::source::IoMode;
use super::{CHUNK_BYTES, Control, ExecOptions, Placement, verify, write};
use crate::dtype::Dtype;
use crate::layout::ZeroRows;
use crate::plan::{OutTensor, Piece, Plan, RankPlan, Region, SourceTensor};
use crate::progress::Quiet;

/// Experts, rows per expert, source columns, the rank's columns (from `COL`), padded width.
const E: u64 = 3;
const H: u64 = 5;
const W: u64 = 10;
const NC: u64 = 4;
const COL: u64 = 6;
const WP: u64 = 7;

fn copy(rows: u64, src_start: u64, dst_start: u64) -> Piece {
    Piece::Copy {
        source: 0,
        region: Region::ALL,
        rows,
        row: NC,
        src_start,
        src_stride: W,
        dst_start,
        dst_stride: WP,
        src_elem_stride: 1,
    }
}

/// Rank tensor `[E + 1, H, WP]`: expert 0 by one block, experts 1 and 2 by one block each of
/// two and three rows (so that padded spans meet), every row's tail zero (one `ZeroRows` run),
/// and a last expert of zeros as one plain fill (not padding: hashed up front).
fn plan(root: &std::path::Path) -> (Plan, Vec<u8>) {
    let data: Vec<u8> = (0..E * H * W).map(|i| (i * 7 + 1) as u8).collect();
    let mut file = vec![0xAAu8; 5];
    file.extend_from_slice(&data);
    fs::write(root.join("ckpt-0.bin"), &file).unwrap();
    let source = SourceTensor {
        name: "w2".into(),
        file: "ckpt-0.bin".into(),
        file_index: 0,
        offset: 5,
        dtype: Dtype::U8,
        shape: smallvec::smallvec![E * H, W],
    };
    let mut pieces = vec![copy(H, COL, 0)];
    for e in 1..E {
        pieces.push(copy(2, e * H * W + COL, e * H * WP));
        pieces.push(copy(H - 2, (e * H + 2) * W + COL, (e * H + 2) * WP));
    }
    pieces.push(Piece::Fill {
        dst_start: E * H * WP,
        count: H * WP,
        value: 0.0,
    });
    let mut t = OutTensor {
        name: "w2_weight".into(),
        dtype: Dtype::U8,
        shape: vec![E + 1, H, WP],
        bytes: (E + 1) * H * WP,
        pieces: pieces.into(),
    };
    t.pieces.push_zero_rows(ZeroRows {
        start: NC,
        count: WP - NC,
        stride: WP,
        rows: E * H,
    });
    let mut want = vec![0u8; t.bytes as usize];
    for r in 0..E * H {
        let (s, d) = ((r * W + COL) as usize, (r * WP) as usize);
        want[d..d + NC as usize].copy_from_slice(&data[s..s + NC as usize]);
    }
    let stamp =
        crate::file_stamp::FileStamp::of_file(&fs::File::open(root.join("ckpt-0.bin")).unwrap())
            .unwrap();
    let plan = Plan {
        family: "test".into(),
        architecture: "Test".into(),
        tp: 1,
        pp: 1,
        stages: Vec::new(),
        expert_parallel: false,
        dtype: Dtype::U8,
        file_stamps: vec![stamp],
        sources: vec![source],
        ranks: vec![RankPlan {
            rank: 0,
            pp_rank: 0,
            tp_rank: 0,
            bytes: t.bytes,
            tensors: vec![t],
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
    };
    (plan, want)
}

const PLACED: [Placement; 1] = [Placement {
    rank: 0,
    tensor: 0,
    out: 0,
    offset: 0,
}];

/// Every copy pads its rows; the zero fills hashed up front are the last expert's alone (with
/// padding off, every row's tail too); a sink that does not start zeroed pads nothing.
#[test]
fn copies_take_their_rows_padding_and_the_zero_fills_leave_it_out() {
    let root = tempfile::TempDir::new().unwrap();
    let (plan, _) = plan(root.path());
    let (jobs, _, _) = jobs_and_fills(&plan, &PLACED, true, true);
    assert_eq!(jobs[0].len(), 1 + 2 * (E as usize - 1));
    assert!(jobs[0].iter().all(|j| j.pad == WP - NC));
    let (jobs, _, fills) = jobs_and_fills(&plan, &PLACED, false, true);
    assert!(jobs[0].iter().all(|j| j.pad == 0));
    assert_eq!(fills.len() as u64, E * H + 1, "every zero fill written");
    let last = (E * H * WP, (E + 1) * H * WP);
    assert_eq!(zero_fills(&plan, &PLACED, true), vec![(0, last.0, last.1)]);
    let all = zero_fills(&plan, &PLACED, false);
    assert_eq!(all.len() as u64, E * H + 1);
    assert_eq!((all[0], all[1]), ((0, last.0, last.1), (0, NC, WP)));
}

/// Through part files at chunk sizes that cut rows, padding and blocks anywhere: the file holds
/// the padded tensor, its checksum is the file's, and the verifier agrees.
#[test]
fn padded_rows_reach_the_file_once_and_hash_as_it() {
    let root = tempfile::TempDir::new().unwrap();
    let (plan, want) = plan(root.path());
    let files = parts::layout(&plan.ranks[0], None, false);
    for chunk_bytes in [1, 3, 7, W, W + 1, 4096, CHUNK_BYTES] {
        let opts = ExecOptions {
            chunk_bytes,
            direct: true,
            io: IoMode::Buffered,
            share_reads: false,
        };
        let dir = tempfile::TempDir::new().unwrap();
        let cancel = AtomicBool::new(false);
        let ctl = Control::new(&cancel, &Quiet).with_options(opts);
        let written = write::write_parts(&plan, root.path(), dir.path(), &files, &ctl).unwrap();
        let f = &files[0];
        let path = dir.path().join(&f.name);
        let got = fs::read(&path).unwrap();
        let at = f.tensors[0].1 as usize;
        assert_eq!(&got[at..], &want[..], "chunk {chunk_bytes}");
        let on_disk = crate::checksum::of_open(&fs::File::open(&path).unwrap(), &|| false).unwrap();
        assert_eq!(written.hashes[0], on_disk, "chunk {chunk_bytes}");
        verify::verify_parts(&plan, root.path(), dir.path(), &files, &ctl).unwrap();
    }
}
