//! A pre-sharded folder as a whole: which ranks and parts its names (or its manifest) say it
//! should hold, and where the flags given disagree with the manifest.

use std::path::Path;

use crate::dtype::DtypeChoice;
use crate::plan::PlanOptions;
use crate::problem::Problem;
use crate::sharded::manifest::{MANIFEST, Manifest};
use crate::sharded::names::{RankFiles, WrittenFor};

/// What a complete folder of this layout lacks: ranks without files, gaps in a rank's part
/// numbers, and a mix of both name patterns. (Files the records list that are gone, or that no
/// record lists, are [`crate::sharded::runs::check`]'s.)
pub(crate) fn layout_problems(
    files: &RankFiles,
    w: &WrittenFor,
    manifest: Option<&Manifest>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    let staged = w.pp > 1 || files.keys().all(|k| k.0.is_some());
    if files.keys().any(|k| k.0.is_some()) && files.keys().any(|k| k.0.is_none()) {
        problems.push(Problem {
            message: format!(
                "the folder mixes {} and {} files: vLLM reads only one pattern, by --pipeline-parallel-size",
                crate::sharded::names::TP_ONLY_GLOB,
                crate::sharded::names::PP_GLOB
            ),
            fix: Some("remove the files of the other run".into()),
            ..Default::default()
        });
    }
    let beyond: Vec<String> = files
        .keys()
        .filter(|(p, t)| *t >= w.tp || p.is_some_and(|p| p >= w.pp))
        .map(|&(p, t)| crate::sharded::names::rank_glob(p, t))
        .collect();
    if !beyond.is_empty() {
        problems.push(Problem {
            message: format!(
                "files beyond {} (per its {}): {}",
                w.flags(),
                w.from,
                beyond.join(", ")
            ),
            fix: Some("remove the files of the other run, or re-shard into an empty folder".into()),
            ..Default::default()
        });
    }
    let mut missing = Vec::new();
    for rank in 0..w.tp.saturating_mul(w.pp).min(MAX_RANKS_CHECKED) {
        let key = (staged.then_some(rank / w.tp), rank % w.tp);
        match files.get(&key) {
            None => missing.push(rank),
            Some(parts) => {
                let have: Vec<u64> = parts.iter().map(|p| p.0).collect();
                if have.iter().enumerate().any(|(i, p)| *p != i as u64) {
                    problems.push(Problem {
                        message: format!(
                            "rank {rank}: part numbers {have:?} have gaps ({})",
                            crate::sharded::names::rank_glob(key.0, key.1)
                        ),
                        fix: Some("copy the missing part files".into()),
                        ..Default::default()
                    });
                }
            }
        }
    }
    if !missing.is_empty() {
        let hint = match manifest {
            Some(m) if m.ranks.len() as u64 != w.tp.saturating_mul(w.pp) => format!(
                " (shard wrote only ranks {} here, with --ranks: copy the others' files in)",
                crate::units::id_runs(&m.ranks)
            ),
            _ => String::new(),
        };
        problems.push(Problem {
            message: format!(
                "no files for rank{} {} of {}{hint}",
                if missing.len() == 1 { "" } else { "s" },
                crate::units::id_runs(&missing),
                w.flags()
            ),
            fix: Some("copy the missing rank files into the folder".into()),
            ..Default::default()
        });
    }
    problems
}

/// Where `--enable-expert-parallel` and an explicit `--dtype` disagree with the manifest at
/// `at`: `model_dtype` is what the options make of the config. TP and PP are checked with the
/// folder's files (`pre_sharded`), which name both values too.
pub(super) fn disagreements(
    at: &Path,
    m: &Manifest,
    opts: &PlanOptions,
    model_dtype: &str,
) -> Vec<crate::problem::Problem> {
    let mut problems = Vec::new();
    if opts.expert_parallel && !m.expert_parallel {
        problems.push(disagreement(
            at,
            "--enable-expert-parallel",
            "no expert parallelism (each expert split over the ranks)",
        ));
    }
    // vLLM's key set depends on the multimodal flags (no tower, or a whole one): a folder is
    // for the mode it was written with.
    let recorded_lm = m.language_model_only;
    if opts.multimodal.language_model_only != recorded_lm {
        let (given, recorded) = if recorded_lm {
            (
                "no --language-model-only",
                "--language-model-only (no vision tower)",
            )
        } else {
            (
                "--language-model-only",
                "no --language-model-only (the vision tower)",
            )
        };
        problems.push(disagreement(at, given, recorded));
    }
    let mode = opts.multimodal.mm_encoder_tp_mode.as_str();
    let recorded_mode = m.mm_encoder_tp_mode.as_deref().unwrap_or("weights");
    if mode != recorded_mode {
        problems.push(disagreement(
            at,
            &format!("--mm-encoder-tp-mode {mode}"),
            &format!("--mm-encoder-tp-mode {recorded_mode}"),
        ));
    }
    // `--dtype auto` is vLLM's own choice, converting as it does: not a disagreement.
    if opts.dtype != DtypeChoice::Auto
        && model_dtype != m.dtype
        && let Some(r) = DtypeChoice::recorded(&m.dtype)
    {
        problems.push(disagreement(
            at,
            &format!("--dtype {}", opts.dtype.as_str()),
            &format!("--dtype {}", r.as_str()),
        ));
    }
    problems
}

fn disagreement(at: &Path, given: &str, recorded: &str) -> crate::problem::Problem {
    crate::problem::Problem {
        message: format!(
            "{given} was given, but {} records {recorded}: the files were written for that",
            at.display()
        ),
        fix: Some(format!(
            "drop the flag (load takes it from {MANIFEST}), or re-shard the original checkpoint with {given}"
        )),
        file: Some(at.display().to_string()),
        ..Default::default()
    }
}

/// A folder whose names claim more ranks than this is not walked rank by rank (a file called
/// `model-rank-18446744073709551615-part-0.safetensors` must not make inspect loop forever).
const MAX_RANKS_CHECKED: u64 = 1 << 16;
