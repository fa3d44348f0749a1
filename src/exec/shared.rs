//! Which source bytes a run reads for other ranks too. vLLM's workers each load their own rank,
//! one process each: a byte two of them read comes off storage twice when both read around the
//! page cache (O_DIRECT), and once when they read through it. A row-parallel weight is the
//! common case (each rank needs a column slice of every row, so each reads the whole tensor),
//! then replicated tensors and replicated kv heads. Counted over every rank of the plan, before
//! it is narrowed to some (`load --ranks`), so that a run of some ranks still knows.

use super::jobs::{extent, is_span};
use super::{ExecOptions, Placement};
use crate::plan::{Piece, Plan};

/// Per source, the union of one rank's chunked jobs, and which sources it holds: kept between
/// ranks so that no rank allocates or sorts.
struct Chunked {
    union: Vec<(u64, u64)>,
    touched: Vec<usize>,
}

const NONE: (u64, u64) = (u64::MAX, 0);

impl Chunked {
    fn new(plan: &Plan) -> Chunked {
        Chunked {
            union: vec![NONE; plan.sources.len()],
            touched: Vec::new(),
        }
    }
}

/// The source elements `[lo, hi)` rank `j` of `plan` reads, as `(source, lo, hi)`, as a run of
/// that rank alone reads them ([`super::jobs::work_items`]): each span exactly, and for the jobs
/// read in chunks (converted, strided, transposed) everything between the first and the last
/// element they reach, since each chunk is read whole. Reductions read their block's extent.
fn rank_reads(plan: &Plan, j: usize, chunked: &mut Chunked, out: &mut Vec<(usize, u64, u64)>) {
    let direct = ExecOptions::default().direct;
    for t in &plan.ranks[j].tensors {
        for piece in t.pieces.iter() {
            let Piece::Copy { source, region, .. } = piece else {
                continue;
            };
            let Some(b) = piece.block() else { continue };
            let Some((lo, hi)) = extent(&b) else { continue };
            let src = &plan.sources[source];
            if !region.reduces() && is_span(&b, t.dtype, src, direct) {
                out.push((source, lo, b.src_start + b.rows * b.row));
            } else {
                let u = &mut chunked.union[source];
                if *u == NONE {
                    chunked.touched.push(source);
                }
                *u = (u.0.min(lo), u.1.max(hi));
            }
            if let Some(scale) = region.dequant {
                let total = plan.sources[scale].shape.iter().product();
                out.push((scale, 0, total));
            }
        }
    }
    for s in chunked.touched.drain(..) {
        let (lo, hi) = std::mem::replace(&mut chunked.union[s], NONE);
        out.push((s, lo, hi));
    }
}

/// For each source of `plan` (by index), how many of its ranks read it when two of them read
/// some of the same elements; 0 when each rank reads elements no other rank does (a
/// column-parallel weight's rows, an expert of one rank).
pub(crate) fn count_readers(plan: &Plan) -> Vec<u32> {
    let n = plan.sources.len();
    let mut readers = vec![0u32; n];
    if plan.ranks.len() < 2 {
        return readers;
    }
    let (mut chunked, mut reads, mut ranks) = (Chunked::new(plan), Vec::new(), Vec::new());
    for j in 0..plan.ranks.len() {
        rank_reads(plan, j, &mut chunked, &mut reads);
        ranks.resize(reads.len(), j as u32);
    }
    // Grouped by source in one pass (a plan reads 90,000 sources on 8 ranks: no sort), each
    // group in rank order.
    let mut start = vec![0usize; n + 1];
    for r in &reads {
        start[r.0 + 1] += 1;
    }
    for s in 0..n {
        start[s + 1] += start[s];
    }
    let mut at = start.clone();
    let mut grouped = vec![(0u64, 0u64, 0u32); reads.len()];
    for (&(s, lo, hi), &rank) in reads.iter().zip(&ranks) {
        grouped[at[s]] = (lo, hi, rank);
        at[s] += 1;
    }
    for s in 0..n {
        let g = &mut grouped[start[s]..start[s + 1]];
        let distinct = 1 + g.windows(2).filter(|w| w[0].2 != w[1].2).count();
        if g.len() < 2 || distinct < 2 {
            continue;
        }
        g.sort_unstable();
        if overlap_between_ranks(g) {
            readers[s] = distinct as u32;
        }
    }
    readers
}

/// Whether two ranges of `reads` (one source's `(lo, hi, rank)`, sorted by start) of
/// different ranks meet.
fn overlap_between_ranks(reads: &[(u64, u64, u32)]) -> bool {
    // The furthest end so far, with its rank, and the furthest of any other rank: a range meets
    // an earlier one of another rank iff it starts before that rank's furthest end.
    let mut best: Option<(u64, u32)> = None;
    let mut other: u64 = 0;
    for &(lo, hi, rank) in reads {
        if let Some((end, r)) = best {
            let reach = if r == rank { other } else { end };
            if lo < reach {
                return true;
            }
        }
        match best {
            Some((end, r)) if r == rank => best = Some((end.max(hi), r)),
            Some((end, _)) if hi > end => {
                other = end;
                best = Some((hi, rank));
            }
            Some(_) => other = other.max(hi),
            None => best = Some((hi, rank)),
        }
    }
    false
}

/// The sources a run reads that ranks outside it read too (by source index), and how many bytes
/// of them the run reads (summed over its ranks).
pub(crate) struct SharedReads {
    pub sources: Vec<bool>,
    pub bytes: u64,
}

/// [`SharedReads`] of a run of the plan's ranks `ranks` (indexes into `plan.ranks`): a source
/// whose reads ranks share, read by fewer of them here than the plan counts. A plan that holds
/// every rank (not narrowed: its `readers` were not counted) is counted here, and only when a run
/// leaves some out: that costs a pass over every rank's pieces (50 ms for DeepSeek-V3 at TP 8),
/// which only runs that read direct pay.
pub(crate) fn shared_reads(plan: &Plan, ranks: &[usize]) -> SharedReads {
    let mut shared = SharedReads {
        sources: vec![false; plan.sources.len()],
        bytes: 0,
    };
    let counted;
    let readers = if !plan.readers.is_empty() {
        &plan.readers
    } else if ranks.len() < plan.ranks.len() {
        counted = count_readers(plan);
        &counted
    } else {
        return shared;
    };
    let mut here = vec![0u32; plan.sources.len()];
    let (mut chunked, mut reads, mut mine) = (Chunked::new(plan), Vec::new(), Vec::new());
    for &j in ranks {
        mine.clear();
        rank_reads(plan, j, &mut chunked, &mut mine);
        mine.sort_unstable();
        mine.dedup_by_key(|r| r.0);
        for &(s, ..) in &mine {
            here[s] += 1;
        }
        rank_reads(plan, j, &mut chunked, &mut reads);
    }
    for (s, &n) in here.iter().enumerate() {
        shared.sources[s] = readers.get(s).is_some_and(|&all| all > n);
    }
    shared.bytes = reads
        .iter()
        .filter(|r| shared.sources[r.0])
        .map(|&(s, lo, hi)| (hi - lo) * (plan.sources[s].dtype.bits() / 8))
        .sum();
    shared
}

/// The distinct ranks (indexes into `plan.ranks`) of `placements`.
pub(super) fn ranks_of(placements: &[Placement]) -> Vec<usize> {
    let mut v: Vec<usize> = placements.iter().map(|p| p.rank).collect();
    v.sort_unstable();
    v.dedup();
    v
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};
    use std::sync::atomic::AtomicBool;

    use super::*;
    use crate::checkpoint::Checkpoint;
    use crate::exec::device::{CpuDevice, Device};
    use crate::exec::page_cache::{evict, resident_pages};
    use crate::exec::source::IoMode;
    use crate::exec::{Control, Destinations, fill};
    use crate::plan::PlanOptions;
    use crate::progress::Quiet;

    fn fixture() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/golden/fixtures/llama_gqa")
    }

    fn names() -> Vec<String> {
        (1..=6)
            .map(|i| format!("model-{i:05}-of-00006.safetensors"))
            .collect()
    }

    /// The llama_gqa golden fixture (8 heads, 4 kv heads) planned at `tp`, readers counted.
    fn llama_gqa(tp: u64) -> Plan {
        llama_gqa_in(&fixture(), tp)
    }

    /// [`llama_gqa`] of a copy of the fixture in `root`.
    fn llama_gqa_in(root: &Path, tp: u64) -> Plan {
        let config =
            crate::config::load(root, "config.json", crate::config::ConfigFormat::Hf, None)
                .expect("config");
        let ckpt = Checkpoint::open(root, &names()).expect("headers");
        let mapping = crate::mapping::select(None, config.architecture()).expect("mapping");
        let opts = PlanOptions {
            tp,
            pp: 1,
            pp_partition: None,
            expert_parallel: false,
            dtype: crate::dtype::DtypeChoice::Auto,
            mapping: None,
            shapes_only: false,
            moe_backend: None,
            multimodal: Default::default(),
            replicate_embed: false,
        };
        let model = crate::model::Model::new(&config);
        let mut plan = crate::plan::plan(&mapping, &model, &ckpt, &opts).expect("plan");
        plan.readers = count_readers(&plan);
        plan
    }

    /// Which sources ranks read in common, by name: a row-parallel weight's column slices and a
    /// replicated norm are every rank's; a column-parallel weight's rows, the vocabulary rows of
    /// the embedding and lm_head, each rank's own; kv heads too, until there are fewer of them
    /// than ranks (TP 8), when pairs of ranks read the same heads.
    #[test]
    fn ranks_share_row_parallel_slices_replicated_tensors_and_replicated_kv_heads() {
        for tp in [1u64, 2, 4, 8] {
            let plan = llama_gqa(tp);
            for (s, src) in plan.sources.iter().enumerate() {
                let name = &*src.name;
                let every = ["o_proj", "down_proj", "norm"]
                    .iter()
                    .any(|p| name.contains(p));
                let kv = name.contains("k_proj") || name.contains("v_proj");
                let want = if tp > 1 && (every || (kv && tp > 4)) {
                    tp as u32
                } else {
                    0
                };
                assert_eq!(plan.readers[s], want, "tp {tp}: {name}");
            }
        }
    }

    /// A run of one rank reads the shared sources through the page cache, and says how many
    /// bytes; a run of every rank reads each chunk once for all of them, so none.
    #[test]
    fn a_run_shares_what_ranks_outside_it_read_too() {
        let plan = llama_gqa(2);
        let one = shared_reads(&plan, &[0]);
        let want: Vec<bool> = plan.readers.iter().map(|&n| n > 0).collect();
        assert_eq!(one.sources, want);
        let bytes: u64 = (plan.sources.iter().zip(&want))
            .filter(|(_, on)| **on)
            .map(|(s, _)| s.shape.iter().product::<u64>() * s.dtype.bits() / 8)
            .sum();
        // Each rank reads nearly the whole of every shared source: rank 0's column slice spans
        // every row but the last one's second half.
        assert!(
            one.bytes <= bytes && one.bytes > bytes / 100 * 99,
            "{} of {bytes}",
            one.bytes
        );
        let all = shared_reads(&plan, &[0, 1]);
        assert!(all.sources.iter().all(|on| !on));
        assert_eq!(all.bytes, 0);
        // A whole plan is counted when a run leaves ranks out.
        let mut uncounted = plan.clone();
        uncounted.readers.clear();
        assert_eq!(shared_reads(&uncounted, &[0]).sources, want);
        assert_eq!(shared_reads(&uncounted, &[0, 1]).bytes, 0);
    }

    /// A cold direct run of rank 0 of 2, sharing: the page cache then holds the sources rank 1
    /// reads too, and none of rank 0's own (a page's worth in from either end, where a tensor
    /// may share a page with its neighbour); not sharing, it holds none.
    #[test]
    fn a_run_reads_shared_sources_through_the_page_cache_and_the_rest_around_it() {
        let dir = tempfile::TempDir::new().unwrap();
        for f in names().iter().chain([&"config.json".to_string()]) {
            std::fs::copy(fixture().join(f), dir.path().join(f)).unwrap();
        }
        let plan = llama_gqa_in(dir.path(), 2);
        let shared = shared_reads(&plan, &[0]).sources;
        for share_reads in [true, false] {
            for f in names() {
                evict(&dir.path().join(f)).unwrap();
            }
            let mut dev = CpuDevice::default();
            let sizes: Vec<u64> = plan.ranks[0].tensors.iter().map(|t| t.bytes).collect();
            dev.alloc(&sizes).unwrap();
            let devices: Vec<Box<dyn Device>> = vec![Box::new(dev)];
            let cancel = AtomicBool::new(false);
            let opts = ExecOptions {
                io: IoMode::Direct,
                share_reads,
                ..ExecOptions::default()
            };
            let ctl = Control::new(&cancel, &Quiet).with_options(opts);
            let run = fill(
                &plan,
                dir.path(),
                &[0],
                Destinations::Devices(&devices),
                &ctl,
            );
            run.unwrap_or_else(|e| panic!("O_DIRECT where the tests run? {e}"));
            let mut seen = [0, 0];
            for (s, src) in plan.sources.iter().enumerate() {
                let (_, page, pages) = resident_pages(&dir.path().join(&*src.file)).unwrap();
                let bytes = src.shape.iter().product::<u64>() * src.dtype.bits() / 8;
                let (first, end) = (src.offset.div_ceil(page) + 1, (src.offset + bytes) / page);
                let inner = &pages[(first as usize).min(end as usize)..end as usize];
                if inner.is_empty() {
                    continue;
                }
                let want = share_reads && shared[s];
                seen[want as usize] += 1;
                let got = inner.iter().filter(|&&b| b & 1 == 1).count();
                let expect = if want { inner.len() } else { 0 };
                assert_eq!(got, expect, "{}: share_reads {share_reads}", src.name);
            }
            assert!(seen[0] > 0 && (seen[1] > 0) == share_reads, "{seen:?}");
        }
    }

    #[test]
    fn overlap_is_between_ranks_only() {
        let r = |lo, hi, rank| (lo, hi, rank);
        assert!(!overlap_between_ranks(&[r(0, 10, 0), r(10, 20, 1)]));
        assert!(overlap_between_ranks(&[r(0, 10, 0), r(9, 20, 1)]));
        // A rank's own ranges may meet.
        assert!(!overlap_between_ranks(&[
            r(0, 10, 0),
            r(5, 12, 0),
            r(12, 20, 1)
        ]));
        // Met through an earlier range of another rank than the furthest-reaching one.
        assert!(overlap_between_ranks(&[
            r(0, 30, 1),
            r(1, 40, 0),
            r(35, 50, 0)
        ]));
        assert!(overlap_between_ranks(&[r(0, 10, 0), r(2, 3, 1)]));
    }
}
