//! Pre-sharded folders (`model-rank-{r}-part-{k}.safetensors`, or with pipeline parallelism
//! `model-pp-{p}-tp-{t}-part-{k}.safetensors`, written by `wload shard` or by vLLM's
//! save_sharded_state): found, checked against what vLLM's model holds at this TP and PP (a folder
//! of another pipeline layout is refused naming both), and planned as whole-tensor copies. vLLM's own sharded_state loader accepts tensors of the wrong
//! shape silently; this is where wload does not.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use crate::checkpoint::{Checkpoint, TensorInfo, WeightFile};

use crate::checkpoint::HeaderError;
use crate::dtype::resolve_dtype;
use crate::open::Opened;
use crate::plan::PlanOptions;
use crate::plan::{self, OutTensor, Piece, Plan, RankPlan, SourceTensor};
use crate::problem::Problem;
use crate::ranks::RankError;

mod folder;
use crate::ranks::{self, RankList};
use crate::sharded::manifest::{MANIFEST, Manifest};
use folder::disagreements;
pub(crate) use folder::layout_problems;

/// Why a pre-sharded folder cannot be planned.
#[derive(Debug, thiserror::Error)]
pub enum PreShardedError {
    #[error(transparent)]
    Plan(#[from] plan::PlanError),
    #[error("{} rank files could not be read", .0.len())]
    Headers(Vec<HeaderError>),
    #[error(transparent)]
    Ranks(#[from] RankError),
    #[error(transparent)]
    Mapping(#[from] crate::mapping::MappingError),
}

use crate::sharded::names::RankFiles;

/// The plan for a pre-sharded folder's `files`, for the ranks this process loads; every problem
/// vLLM would hit (or silently accept) at once.
pub(crate) fn plan(
    opened: &Opened,
    popts: &PlanOptions,
    files: &RankFiles,
    given_ranks: Option<&RankList>,
    warnings: &mut Vec<String>,
) -> Result<Plan, PreShardedError> {
    let root = &opened.resolved.root;
    // The mode vLLM serves the model with (data falls back to weights where unsupported), as
    // the folder was written for it; a mapping that cannot be selected is reported below.
    let served = crate::mapping::select(popts.mapping.as_deref(), opened.config.architecture())
        .map(|m| plan::served_options(&m, popts));
    let popts = match &served {
        Ok((o, w)) => {
            warnings.extend(w.map(String::from));
            o
        }
        Err(_) => popts,
    };
    // The verdict `inspect` gives too: records unreadable, of two plans, or not listing every
    // rank file (whose checksum would be unknown) refuse the folder here as there.
    let runs = crate::sharded::runs::check(root, files);
    if !runs.problems.is_empty() {
        // Checking the files against either plan would only repeat it, file by file.
        return Err(plan::PlanError::Invalid(runs.problems).into());
    }
    let manifest = runs.manifest;
    let expected = match expected_plan(opened, popts, manifest.as_ref()) {
        Ok(p) => p,
        // A --tp the model refuses may still be only a typo of the one the folder records: say
        // that first.
        Err(PreShardedError::Plan(plan::PlanError::Invalid(refused))) => {
            let mut problems = folder_problems(root, popts.tp, files, manifest.as_ref());
            problems.extend(refused);
            return Err(plan::PlanError::Invalid(problems).into());
        }
        Err(e) => return Err(e),
    };
    let stages = stage_problems(root, &expected, files, manifest.as_ref());
    if !stages.is_empty() {
        // Files of another pipeline layout: the per-rank checks would only repeat it, rank by
        // rank, as missing files and keys.
        return Err(plan::PlanError::Invalid(stages).into());
    }
    if let Some(p) = partition_problem(root, &expected, files, popts) {
        // Stages of another split: every rank would be missing layers and holding others.
        return Err(plan::PlanError::Invalid(vec![p]).into());
    }
    let mut problems = folder_problems(root, popts.tp, files, manifest.as_ref());
    if let Some(m) = &manifest {
        let tensors = opened.checkpoint.all_tensors().map(|t| t.dtype);
        let model_dtype = resolve_dtype(popts.dtype, opened.config.dtype.as_deref(), tensors);
        problems.extend(disagreements(
            &root.join(MANIFEST),
            m,
            popts,
            model_dtype.as_str(),
        ));
    }
    // Only now is --tp known to fit the model, so the rank list is bounded.
    let (ranks, _) = ranks::select(expected.world(), given_ranks)?;
    let mut built = Built::default();
    for &r in &ranks {
        let key = (stage_of(&expected, r), r % popts.tp);
        let Some(parts) = files.get(&key) else {
            problems.push(Problem {
                message: format!(
                    "{}: no files for rank {r} ({})",
                    root.display(),
                    crate::sharded::names::rank_glob(key.0, key.1)
                ),
                fix: Some("copy the missing rank files, or check --tp and --pp".into()),
                ..Default::default()
            });
            continue;
        };
        let names: Vec<String> = parts.iter().map(|(_, n)| n.clone()).collect();
        let ck = Checkpoint::open(root, &names).map_err(PreShardedError::Headers)?;
        built
            .stamps
            .extend(ck.files.iter().map(|f| (f.name.clone(), f.stamp)));
        let check = RankCheck {
            rank: r,
            tp: popts.tp,
            expected: &expected,
        };
        built
            .ranks
            .push(check.run(&ck, &mut built.sources, &mut problems, warnings));
    }
    if !problems.is_empty() {
        return Err(plan::PlanError::Invalid(problems).into());
    }
    Ok(built.finish(expected))
}

/// The stage in rank file names of global rank `r`: none without pipeline parallelism (vLLM's
/// TP-only pattern).
fn stage_of(expected: &Plan, r: u64) -> Option<u64> {
    (expected.pp > 1).then_some(r / expected.tp)
}

/// The folder's pipeline layout against `--pp`: files of the other pattern, or of other stages,
/// mean the folder was written for another pipeline-parallel size. vLLM globs only its own
/// pattern and stage, so it would report missing files or keys; this names the layouts.
fn stage_problems(
    root: &Path,
    expected: &Plan,
    files: &RankFiles,
    manifest: Option<&Manifest>,
) -> Vec<Problem> {
    let pp = expected.pp;
    let found: BTreeSet<Option<u64>> = files.keys().map(|k| k.0).collect();
    let want: BTreeSet<Option<u64>> = if pp > 1 {
        (0..pp).map(Some).collect()
    } else {
        BTreeSet::from([None])
    };
    let manifest_pp = manifest.map(|m| m.pp);
    if found == want && manifest_pp.is_none_or(|m| m == pp) {
        return Vec::new();
    }
    let layout: Vec<String> = expected
        .stages
        .iter()
        .map(|s| {
            format!(
                "stage {} holds layers [{}, {})",
                s.pp_rank, s.first_layer, s.end_layer
            )
        })
        .collect();
    let stages_found: Vec<String> = found
        .iter()
        .map(|s| match s {
            None => "no stage (TP-only model-rank-* files)".to_string(),
            Some(p) => format!("stage {p}"),
        })
        .collect();
    let names: Vec<&str> = files
        .values()
        .flat_map(|v| v.iter().map(|(_, n)| n.as_str()))
        .take(8)
        .collect();
    let written_for = manifest_pp.or_else(|| {
        if found.contains(&None) {
            Some(1)
        } else {
            found.iter().flatten().max().map(|m| m + 1)
        }
    });
    vec![Problem {
        message: format!(
            "{}: --pp {pp} expects {} ({}), but the folder has files for {}: {}{}",
            root.display(),
            if pp > 1 {
                "model-pp-{p}-tp-{t}-part-{k}.safetensors files"
            } else {
                "model-rank-{t}-part-{k}.safetensors files"
            },
            layout.join(", "),
            stages_found.join(", "),
            names.join(", "),
            if files.values().map(Vec::len).sum::<usize>() > names.len() {
                ", ..."
            } else {
                ""
            }
        ),
        fix: Some(match written_for {
            Some(w) if w != pp => {
                format!("load with --pp {w}, the pipeline-parallel size it was written for")
            }
            _ => "copy the missing stage files, or re-shard with the intended --pp".into(),
        }),
        ..Default::default()
    }]
}

/// The stages' files holding other layers than vLLM, with `VLLM_PP_LAYER_PARTITION` as it is
/// now, splits the model into: the folder was written with another partition, and the fix is the
/// variable, not a re-shard.
fn partition_problem(
    root: &Path,
    expected: &Plan,
    files: &RankFiles,
    popts: &PlanOptions,
) -> Option<Problem> {
    use crate::ranks::stages::PP_PARTITION_VAR;
    use crate::sharded::layers;
    if expected.pp <= 1 {
        return None;
    }
    let found = layers::of_folder(root, files);
    let agrees = found.len() == expected.stages.len()
        && found
            .iter()
            .zip(&expected.stages)
            .all(|(f, e)| f.layers.is_empty() || f.layers.iter().copied().eq(e.layers()));
    if agrees {
        return None;
    }
    let now = match &popts.pp_partition {
        Some(p) => format!("{PP_PARTITION_VAR}={p}"),
        None => format!("{PP_PARTITION_VAR} unset: vLLM's even split"),
    };
    let want: Vec<String> = (expected.stages.iter())
        .map(|s| {
            format!(
                "stage {} layers {}–{}",
                s.pp_rank,
                s.first_layer,
                s.end_layer.saturating_sub(1)
            )
        })
        .collect();
    let have: Vec<String> = (found.iter())
        .map(|s| format!("stage {} {}", s.pp_rank, s.describe()))
        .collect();
    let fix = match layers::partition(&found) {
        Some(p) if layers::is_even_split(&p) => format!(
            "unset {PP_PARTITION_VAR}: the files follow vLLM's even split (and serve without it)"
        ),
        Some(p) => format!(
            "set {PP_PARTITION_VAR}={p}, the partition the files were written with: `{PP_PARTITION_VAR}={p} wload load …`, and serve with it (`wload inspect` prints the line)"
        ),
        None => "re-shard with the intended --pp and partition".into(),
    };
    Some(Problem {
        message: format!(
            "{}: the files were written for another pipeline split: they hold {}; vLLM ({now}) builds {}",
            root.display(),
            have.join(", "),
            want.join(", "),
        ),
        fix: Some(fix),
        ..Default::default()
    })
}

/// What vLLM's fresh model holds per rank at this TP (names, dtypes, shapes): the checkpoint
/// planner run over no checkpoint.
fn expected_plan(
    opened: &Opened,
    popts: &PlanOptions,
    manifest: Option<&Manifest>,
) -> Result<Plan, PreShardedError> {
    let mapping = crate::mapping::select(popts.mapping.as_deref(), opened.config.architecture())?;
    let empty = Checkpoint::from_files(Vec::new());
    Ok(plan::plan(
        &mapping,
        &crate::model::Model::new(&opened.config),
        &empty,
        &PlanOptions {
            expert_parallel: popts.expert_parallel || manifest.is_some_and(|m| m.expert_parallel),
            shapes_only: true,
            replicate_embed: popts.replicate_embed || manifest.is_some_and(|m| m.replicate_embed),
            moe_backend: popts.moe_backend.or_else(|| {
                let recorded = manifest.and_then(|m| m.moe_backend.as_deref())?;
                crate::quant::MoeBackend::parse(recorded).ok()
            }),
            ..popts.clone()
        },
    )?)
}

/// The folder as a whole: written for another TP (per its manifest), or holding ranks past it.
fn folder_problems(
    root: &Path,
    tp: u64,
    files: &RankFiles,
    manifest: Option<&Manifest>,
) -> Vec<Problem> {
    let mut problems = Vec::new();
    if let Some(m) = manifest
        && m.tp != tp
    {
        problems.push(Problem {
            message: format!(
                "{}: written for --tp {}, loaded with --tp {tp}",
                root.join(MANIFEST).display(),
                m.tp,
            ),
            fix: Some(format!(
                "load with --tp {} (vLLM's loader would accept smaller tensors silently)",
                m.tp
            )),
            file: Some(root.join(MANIFEST).display().to_string()),
            ..Default::default()
        });
    }
    let tp_ranks: BTreeSet<u64> = files.keys().map(|k| k.1).collect();
    let extra: Vec<u64> = tp_ranks.iter().copied().filter(|r| *r >= tp).collect();
    if !extra.is_empty() {
        problems.push(Problem {
            message: format!(
                "{}: has files for ranks {}, beyond --tp {tp}",
                root.display(),
                crate::units::id_runs(&extra),
            ),
            fix: Some(format!(
                "load with --tp {}",
                tp_ranks.last().map_or(1, |m| m + 1)
            )),
            ..Default::default()
        });
    }
    problems
}

/// One rank's files against what that rank of vLLM's model holds.
struct RankCheck<'a> {
    rank: u64,
    tp: u64,
    expected: &'a Plan,
}

impl RankCheck<'_> {
    /// Every tensor of the rank's files checked and, when it fits, planned as a whole copy;
    /// then every parameter the files lack.
    fn run(
        &self,
        ck: &Checkpoint,
        sources: &mut Vec<SourceTensor>,
        problems: &mut Vec<Problem>,
        warnings: &mut Vec<String>,
    ) -> RankPlan {
        let r = self.rank;
        let want = &self.expected.ranks[r as usize];
        let want_by: BTreeMap<&str, &OutTensor> =
            want.tensors.iter().map(|t| (t.name.as_str(), t)).collect();
        let mut seen = BTreeSet::new();
        let mut tensors = Vec::new();
        for f in &ck.files {
            for t in &f.tensors {
                if !seen.insert(t.name.clone()) {
                    problems.push(Problem {
                        message: format!(
                            "{}: tensor '{}' appears in two part files of rank {r}",
                            f.name, t.name
                        ),
                        fix: Some("remove the duplicate (vLLM raises KeyError)".into()),
                        file: Some(f.name.clone()),
                        tensor: Some(t.name.to_string()),
                        ..Default::default()
                    });
                    continue;
                }
                match self.check(f, t, want_by.get(&*t.name).copied()) {
                    Err(p) => problems.push(*p),
                    Ok(w) => {
                        if w.dtype != t.dtype {
                            // vLLM's loader only warns, and `copy_` converts: so do we.
                            warnings.push(format!(
                                "{}: '{}' is {} where vLLM's parameter is {}; converted as vLLM does",
                                f.name, t.name, t.dtype, w.dtype
                            ));
                        }
                        tensors.push(whole_copy(f, t, w, sources));
                    }
                }
            }
        }
        for w in &want.tensors {
            if !seen.contains(w.name.as_str()) {
                problems.push(Problem {
                    message: format!("rank {r}: missing tensor '{}' (vLLM: \"Missing keys ... in loaded state\")", w.name),
                    fix: Some("re-shard from the original checkpoint with `wload shard`".into()),
                    // The folder's tensors are named as the parameters they fill.
                    tensor: Some(w.name.clone()),
                    parameter: Some(w.name.clone()),
                    ..Default::default()
                });
            }
        }
        RankPlan {
            rank: r,
            pp_rank: want.pp_rank,
            tp_rank: want.tp_rank,
            bytes: tensors.iter().map(|t| t.bytes).sum(),
            tensors,
        }
    }

    /// The parameter a file's tensor fills, if it fits it; the problem is boxed, as a rare
    /// and large `Err`.
    fn check<'w>(
        &self,
        f: &WeightFile,
        t: &TensorInfo,
        want: Option<&'w OutTensor>,
    ) -> Result<&'w OutTensor, Box<Problem>> {
        let (r, tp, arch) = (self.rank, self.tp, &self.expected.architecture);
        let Some(w) = want else {
            return Err(Box::new(Problem {
                message: format!(
                    "{}: unexpected tensor '{}' (vLLM's {arch} at tp {tp} has no such parameter; its loader raises KeyError)",
                    f.name, t.name
                ),
                fix: Some("re-shard from the original checkpoint with `wload shard`".into()),
                file: Some(f.name.clone()),
                tensor: Some(t.name.to_string()),
                ..Default::default()
            }));
        };
        if w.shape[..] != t.shape[..] {
            return Err(Box::new(Problem {
                message: format!(
                    "{}: tensor '{}' has shape {:?}, but rank {r} of {arch} at tp {tp} needs {:?}",
                    f.name, t.name, t.shape, w.shape
                ),
                // The TP size may come from the file names themselves, so not only it is suspect.
                fix: Some(format!(
                    "the files were sharded for another model config (config.json, --hf-overrides){}: load them with the settings they were sharded with, or re-shard from the original checkpoint",
                    if t.name.contains("experts") {
                        ", TP size or with(out) --enable-expert-parallel"
                    } else {
                        " or TP size"
                    }
                )),
                file: Some(f.name.clone()),
                tensor: Some(t.name.to_string()),
                parameter: Some(w.name.clone()),
                shape: Some(t.shape.to_vec()),
                expected_shape: Some(w.shape.clone()),
                ..Default::default()
            }));
        }
        if w.dtype != t.dtype && !plan::convertible(t.dtype, w.dtype) {
            return Err(Box::new(Problem {
                message: format!(
                    "{}: tensor '{}' is {}, which cannot be converted to the parameter's {}",
                    f.name, t.name, t.dtype, w.dtype
                ),
                fix: Some("re-shard with the intended --dtype".into()),
                file: Some(f.name.clone()),
                tensor: Some(t.name.to_string()),
                parameter: Some(w.name.clone()),
                ..Default::default()
            }));
        }
        Ok(w)
    }
}

/// A rank tensor filled by one copy of a whole file tensor.
fn whole_copy(
    f: &WeightFile,
    t: &TensorInfo,
    w: &OutTensor,
    sources: &mut Vec<SourceTensor>,
) -> OutTensor {
    let numel = t.numel();
    sources.push(SourceTensor {
        name: t.name.clone(),
        file: f.name.as_str().into(),
        file_index: t.file,
        offset: t.offset,
        dtype: t.dtype,
        shape: t.shape.as_slice().into(),
    });
    OutTensor {
        name: t.name.to_string(),
        dtype: w.dtype,
        shape: t.shape.to_vec(),
        bytes: w.bytes,
        pieces: vec![Piece::Copy {
            source: sources.len() - 1,
            region: crate::plan::Region::ALL,
            rows: 1,
            row: numel,
            src_start: 0,
            src_stride: numel,
            dst_start: 0,
            dst_stride: numel,
            src_elem_stride: 1,
        }]
        .into(),
    }
}

/// The source tensors and rank plans built so far.
#[derive(Default)]
struct Built {
    sources: Vec<SourceTensor>,
    /// Each rank file as its header was read, by name.
    stamps: BTreeMap<String, crate::file_stamp::FileStamp>,
    ranks: Vec<RankPlan>,
}

impl Built {
    fn finish(mut self, expected: Plan) -> Plan {
        // Sources of different ranks live in different files: index files by name.
        let mut file_ix: BTreeMap<String, usize> = BTreeMap::new();
        let mut file_stamps = Vec::new();
        for s in &mut self.sources {
            let n = file_ix.len();
            s.file_index = *file_ix.entry(s.file.to_string()).or_insert_with(|| {
                file_stamps.push(self.stamps.get(&*s.file).copied().unwrap_or_default());
                n
            });
        }
        Plan {
            family: expected.family,
            architecture: expected.architecture,
            tp: expected.tp,
            pp: expected.pp,
            stages: expected.stages,
            expert_parallel: expected.expert_parallel,
            dtype: expected.dtype,
            sources: self.sources,
            file_stamps,
            ranks: self.ranks,
            readers: Vec::new(),
            tie_word_embeddings: expected.tie_word_embeddings,
            retie: None,
            skipped: Vec::new(),
            moe_backend: expected.moe_backend,
            language_model_only: expected.language_model_only,
            mm_encoder_tp_mode: expected.mm_encoder_tp_mode,
            warnings: expected.warnings,
            module_tree: expected.module_tree,
            replicate_embed: expected.replicate_embed,
            quantization: expected.quantization,
        }
    }
}
