//! Plan: for every tensor-parallel rank, the tensors vLLM holds (name, dtype, shape, in state_dict
//! order) and, for each, the pieces that fill it. Pure arithmetic on headers; every problem is found
//! here, before any tensor data is read, and all of them are reported at once.
//!
//! It consumes the map stage's result ([`crate::map::Mapped`]) and runs in phases over a
//! `Planner`: environment (`env.rs`: config, defaults, derived values, checks), parameters
//! (`params.rs`: specs instantiated per layer), assign (`assign.rs`: mapped tensors into parameter
//! slots), validate (`validate.rs`: everything filled, divisibility), pieces (`build_pieces.rs`:
//! per-rank tensors, each a `Pieces` list from `pieces.rs`). The geometry of each layout kind is
//! `crate::layout`.
//!
//! Vocabulary: a *slice* is which region of a checkpoint tensor feeds which region of a parameter;
//! flattened, it is a *block* (rows × row with strides: what a pwrite, a memcpy and a 2-D device
//! copy understand); a *piece* is how part of a rank's tensor is filled, a copied block or a fill.

mod assign;
mod build_pieces;
mod dequant;
mod params;
mod pieces;
pub(crate) mod pre_sharded;
mod quant;
mod slots;
mod stages;
mod types;
mod validate;

use crate::checkpoint::Checkpoint;
use crate::dtype::{Dtype, resolve_dtype};
pub(crate) use crate::layout::Region;
use crate::map::{self, Mapped};
use crate::mapping::Mapping;
use crate::model::env::{Env, EnvProblem, Parallel};
use crate::model::{Model, rules_for};
use crate::problem::{Problem, Problems};
use crate::quant::{Quantization, moe_backend_unused};
use crate::ranks::World;
pub(crate) use pieces::Piece;
use pieces::Pieces;
pub(crate) use stages::Stage;
pub use types::{OutTensor, Plan, PlanError, PlanOptions};
pub(crate) use types::{PlanReport, PlanTotals, RankPlan, Retie, Skipped, SourceTensor};

/// The most layers a config may claim. Every layer's parameters are built before the checkpoint
/// is compared with them (about 6 KB a layer for Llama), once per layout `wload sizes` checks: a
/// count from a typo or a hostile config must be refused at once, not cost a minute and gigabytes.
/// The deepest real models have about 130 layers; this is thirty times that.
pub(crate) const MAX_LAYERS: u64 = 4096;

/// The most parameters a model may have, all layers together (before quantization adds its
/// scales). DeepSeek-V3 has about 2,500 and a 4,096-layer Llama 45,000; a mapping whose `layer`
/// list holds a thousand parameters must not multiply into millions.
pub(crate) const MAX_PARAMETERS: u64 = 1 << 17;

/// The most experts a layer may have. Each expert of each MoE layer gets its own sources and
/// slices, so a count from a typo or a hostile config (2^31) would run for hours and exhaust
/// memory before any problem is reported. Real models have up to a few hundred (DeepSeek-V3
/// 256, Qwen3-Next 512); 65,536 plans in well under a second a layer.
pub(crate) const MAX_EXPERTS: u64 = 1 << 16;

/// Maps `ckpt`'s names with `mapping` and plans `opts.tp` ranks: [`rules_for`], [`map::map`],
/// then [`plan_mapped`].
pub fn plan(
    mapping: &Mapping,
    model: &Model,
    ckpt: &Checkpoint,
    opts: &PlanOptions,
) -> Result<Plan, PlanError> {
    let mapping = rules_for(mapping, model, opts.parallel());
    plan_mapped(&mapping, model, &map::map(&mapping, ckpt)?, opts)
}

impl PlanOptions {
    /// The layout the mapping's expressions see (`tp`, `pp`, `ep`), for [`rules_for`] and the
    /// environment.
    pub(crate) fn parallel(&self) -> Parallel {
        Parallel {
            world: World {
                tp: self.tp,
                pp: self.pp,
            },
            expert_parallel: self.expert_parallel,
            multimodal: self.multimodal,
            replicate_embed: self.replicate_embed,
        }
    }
}

/// `opts` as vLLM serves the model `mapping` describes: `--mm-encoder-tp-mode data` becomes
/// `weights` where vLLM does not support it (`Mapping::encoder_tp_data`), with vLLM's warning.
/// Every command plans with these, so that the files, the record and the serve line are those
/// of the mode vLLM builds.
pub(crate) fn served_options(
    mapping: &Mapping,
    opts: &PlanOptions,
) -> (PlanOptions, Option<&'static str>) {
    let (multimodal, warning) = opts.multimodal.served(mapping.encoder_tp_data);
    (
        PlanOptions {
            multimodal,
            ..opts.clone()
        },
        warning,
    )
}

/// What the environment found (a value it cannot derive, a check that fails), as a problem.
impl From<EnvProblem> for Problem {
    fn from(p: EnvProblem) -> Problem {
        Problem {
            message: p.message,
            fix: p.fix,
            ..Default::default()
        }
    }
}

/// Builds the plan for `opts.tp` ranks from the mapped checkpoint, or every problem found.
pub(crate) fn plan_mapped(
    mapping: &Mapping,
    model: &Model,
    mapped: &Mapped,
    opts: &PlanOptions,
) -> Result<Plan, PlanError> {
    if opts.tp == 0 {
        return Err(PlanError::BadTp);
    }
    if opts.pp == 0 {
        return Err(PlanError::BadPp);
    }
    let Checked {
        planner,
        params,
        stages,
        on_stages,
        assigned,
        fused,
    } = checked(mapping, model, mapped, opts)?;
    let ranks = planner.ranks(&params.list, &assigned, &fused, &stages, &on_stages);
    Ok(Plan {
        family: mapping.family.clone(),
        architecture: planner.arch,
        tp: opts.tp,
        pp: opts.pp,
        stages,
        expert_parallel: opts.expert_parallel,
        dtype: planner.model_dtype,
        sources: assigned.sources,
        file_stamps: mapped.checkpoint.files.iter().map(|f| f.stamp).collect(),
        ranks,
        readers: Vec::new(),
        tie_word_embeddings: planner.env.is_true("tie_word_embeddings") && params.retie.is_none(),
        retie: params.retie,
        skipped: assigned.skipped,
        moe_backend: opts.moe_backend.map(|b| b.as_str()),
        language_model_only: opts.multimodal.language_model_only,
        mm_encoder_tp_mode: opts.multimodal.recorded_mode(),
        warnings: Vec::new(),
        module_tree: module_tree(mapping, &planner.env, opts.tp),
        replicate_embed: opts.replicate_embed && reads_var(mapping, "replicate_embed"),
        quantization: planner.quant,
    })
}

/// Whether a parameter's `whole:` reads the variable `var`: the family's state depends on
/// `VLLM_REPLICATE_EMBED` only then (vLLM ignores it for the others, and so does the record), or
/// on CUDA's rule for layers too narrow for Marlin.
fn reads_var(mapping: &Mapping, var: &str) -> bool {
    let p = &mapping.parameters;
    (p.head.iter().chain(&p.layer).chain(&p.tail))
        .any(|s| s.whole.as_ref().is_some_and(|w| w.reads(var)))
}

/// The platform whose module tree the files follow: the mapping's, or `cuda` when a parameter
/// is whole on every rank by vLLM's CUDA-only rule for Marlin's AWQ/GPTQ/INC layers
/// (`quant_marlin_int`: Qwen3.5's `in_proj_ba`, split on every other platform). One rank holds
/// the same either way.
fn module_tree(mapping: &Mapping, env: &Env, tp: u64) -> Option<String> {
    let marlin =
        tp > 1 && env.is_true("quant_marlin_int") && reads_var(mapping, "quant_marlin_int");
    (mapping.module_tree.clone()).or_else(|| marlin.then(|| "cuda".to_string()))
}

/// Whether vLLM accepts the mapped checkpoint with `opts`: every check of [`plan_mapped`], which
/// shares them, without building the ranks' tensors (the costly part at a large TP size).
/// `wload sizes` asks it about many sizes.
pub(crate) fn check_mapped(
    mapping: &Mapping,
    model: &Model,
    mapped: &Mapped,
    opts: &PlanOptions,
) -> Result<(), PlanError> {
    if opts.tp == 0 {
        return Err(PlanError::BadTp);
    }
    if opts.pp == 0 {
        return Err(PlanError::BadPp);
    }
    checked(mapping, model, mapped, opts).map(drop)
}

/// The phases before the ranks' tensors are built, and what they found.
struct Checked<'m> {
    planner: Planner<'m>,
    params: params::Params<'m>,
    stages: Vec<Stage>,
    on_stages: Vec<stages::OnStage>,
    assigned: assign::Assigned,
    fused: Vec<bool>,
}

/// Every phase that can refuse the plan: the environment, parameters, stages, assignment and
/// validation; the problems they found, or what building the ranks needs.
fn checked<'m>(
    mapping: &'m Mapping,
    model: &Model,
    mapped: &'m Mapped,
    opts: &'m PlanOptions,
) -> Result<Checked<'m>, PlanError> {
    let mut planner = Planner::new(mapping, model, mapped.checkpoint, opts)?;
    let params = planner.parameters()?;
    planner.moe_backend_used();
    let stages = planner.stages(params.layers);
    planner.stage_needs(&stages);
    let on_stages = planner.on_stages(&params.list);
    let assigned = planner.assign(&params.list, mapped);
    let fused = planner.filled(&params.list, &assigned);
    if planner.geometry_ok {
        planner.divisible(&params.list);
    }
    if !planner.problems.is_empty() {
        return Err(planner.refusal());
    }
    Ok(Checked {
        planner,
        params,
        stages,
        on_stages,
        assigned,
        fused,
    })
}

/// What every phase reads (the mapping, the options, the expression environment) and the problems
/// they find.
struct Planner<'m> {
    mapping: &'m Mapping,
    /// Looked up by name once, not renamed: whether the checkpoint ships a tied parameter itself
    /// (then vLLM re-ties by data, see `params.rs`).
    checkpoint: &'m Checkpoint,
    opts: &'m PlanOptions,
    env: Env,
    model_dtype: Dtype,
    /// The checkpoint's quantization scheme, if any (`quant/` adds its parameters). Shared, not
    /// copied, by every parameter's step: a GPTQ config holds one name per quantized module.
    quant: Option<std::sync::Arc<Quantization>>,
    /// The config's architecture, for messages (the mapping's family when it names none).
    arch: String,
    /// Whether the config passed the mapping's checks, so that per-rank divisibility is worth
    /// reporting too.
    geometry_ok: bool,
    /// Whether the method quantized some experts (the parameters phase sets it): what
    /// `--moe-backend` lays out.
    quantized_experts: bool,
    problems: Problems,
}

impl<'m> Planner<'m> {
    /// The environment phase; a quantization scheme wload cannot write is refused before
    /// anything else.
    fn new(
        mapping: &'m Mapping,
        model: &Model,
        checkpoint: &'m Checkpoint,
        opts: &'m PlanOptions,
    ) -> Result<Planner<'m>, PlanError> {
        let config = model.config;
        let mut problems = Problems::default();
        // The model's method, copied: what the checkpoint and mapping say is this plan's.
        let mut quant = match &model.quant {
            Ok(q) => q.clone(),
            Err(e) => {
                problems.push(Problem {
                    message: e.message.clone(),
                    fix: Some(e.fix.clone()),
                    ..Default::default()
                });
                return Err(PlanError::Invalid(problems.list));
            }
        };
        let model_dtype = resolve_dtype(
            opts.dtype,
            config.dtype.as_deref(),
            checkpoint.all_tensors().map(|t| t.dtype),
        );
        if let Some(q) = &mut quant {
            // maybe_update_config: GPTQ's and AWQ's layer lists from the checkpoint's dtypes.
            let tensors = &mut checkpoint.all_tensors().map(|t| (&*t.name, t.dtype));
            if let Err(e) = q.update_from_checkpoint(tensors) {
                problems.push(Problem {
                    message: e.message,
                    fix: Some(e.fix),
                    ..Default::default()
                });
                return Err(PlanError::Invalid(problems.list));
            }
            q.apply_vllm_mapper(&mapping.rules);
            // get_supported_act_dtypes: vLLM refuses the model before loading.
            if let Err(message) = q.supports(model_dtype) {
                problems.push(Problem {
                    message,
                    fix: Some(
                        if model_dtype == Dtype::F16 {
                            "pass --dtype bfloat16"
                        } else {
                            "pass --dtype bfloat16 (or float16)"
                        }
                        .into(),
                    ),
                    ..Default::default()
                });
            }
        }
        if let Some(b) = opts.moe_backend {
            let taken = match &quant {
                Some(q) => q.moe_backend(b),
                None => Err(moe_backend_unused(b)),
            };
            if let Err((message, fix)) = taken {
                problems.push(Problem {
                    message,
                    fix: Some(fix),
                    ..Default::default()
                });
            }
        }
        let (env, unset) = Env::new(mapping, config, opts.parallel(), opts.mapping.as_deref());
        unset.into_iter().for_each(|p| problems.push(p.into()));
        let derived = problems.is_empty();
        let failed = env.check(mapping);
        let geometry_ok = failed.is_empty() && derived;
        failed.into_iter().for_each(|p| problems.push(p.into()));
        Ok(Planner {
            mapping,
            checkpoint,
            opts,
            env,
            model_dtype,
            quant: quant.map(std::sync::Arc::new),
            arch: config.architecture().unwrap_or(&mapping.family).to_string(),
            geometry_ok,
            quantized_experts: false,
            problems,
        })
    }

    /// `--moe-backend` on a checkpoint whose method takes it but that has no quantized experts
    /// (a dense NVFP4 model): the flag would change nothing.
    fn moe_backend_used(&mut self) {
        if let Some(b) = self.opts.moe_backend
            && !self.quantized_experts
            && self.problems.is_empty()
        {
            let (message, fix) = moe_backend_unused(b);
            self.problems.push(Problem {
                message,
                fix: Some(fix),
                ..Default::default()
            });
        }
    }

    /// The problems found so far, as the error that refuses the plan.
    fn refusal(&mut self) -> PlanError {
        PlanError::Invalid(std::mem::take(&mut self.problems).list)
    }
}

/// Whether vLLM's `copy_` into a parameter of `to` accepts a tensor of `from` (float types only).
pub(crate) fn convertible(from: Dtype, to: Dtype) -> bool {
    let float = |d| matches!(d, Dtype::F16 | Dtype::Bf16 | Dtype::F32 | Dtype::F64);
    from == to || (float(from) && float(to))
}

/// The one integer-to-float conversion vLLM makes while loading: a pack-quantized MoE's int64
/// `weight_shape` copied into its model-dtype `w13_weight_shape` / `w2_weight_shape`
/// (`_load_single_value`, fused_moe/routed_experts.py:631–639).
fn shape_cast(from: Dtype, to: Dtype, parameter: &str) -> bool {
    from == Dtype::I64
        && matches!(to, Dtype::Bf16 | Dtype::F16 | Dtype::F32)
        && [".w13_weight_shape", ".w2_weight_shape"]
            .iter()
            .any(|s| parameter.ends_with(s))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    fn problem(m: &str) -> Problem {
        Problem {
            message: m.into(),
            fix: None,
            ..Problem::default()
        }
    }

    #[test]
    fn problems_keep_the_order_found_and_each_once() {
        let mut ps = Problems::default();
        for m in ["b", "a", "b", "c", "a"] {
            ps.push(problem(m));
        }
        let got: Vec<&str> = ps.list.iter().map(|p| p.message.as_str()).collect();
        assert_eq!(got, ["b", "a", "c"]);
    }

    /// The llama_gqa golden fixture's config and headers.
    fn llama_gqa() -> (ModelConfig, Checkpoint) {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data/golden/fixtures/llama_gqa");
        let config =
            crate::config::load(&root, "config.json", crate::config::ConfigFormat::Hf, None)
                .expect("config");
        let names: Vec<String> = std::fs::read_dir(&root)
            .expect("fixture")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.ends_with(".safetensors"))
            .collect();
        let ckpt = Checkpoint::open(&root, &names).expect("headers");
        (config, ckpt)
    }

    fn options(tp: u64) -> PlanOptions {
        PlanOptions {
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
        }
    }

    #[test]
    fn the_plan_follows_the_mapped_result_and_never_renames() {
        let (config, ckpt) = llama_gqa();
        let mapping = crate::mapping::select(None, config.architecture()).expect("mapping");
        let mut mapped = map::map(&mapping, &ckpt).expect("maps");
        let norm = mapped
            .tensors
            .iter_mut()
            .find(|t| &*t.tensor.name == "model.norm.weight")
            .expect("norm");
        norm.fate = map::Fate::Dropped {
            rule: "a test".into(),
        };
        let Err(PlanError::Invalid(problems)) =
            plan_mapped(&mapping, &Model::new(&config), &mapped, &options(2))
        else {
            panic!("a dropped norm leaves its parameter empty");
        };
        assert_eq!(
            problems
                .iter()
                .map(|p| p.message.as_str())
                .collect::<Vec<_>>(),
            ["parameter 'model.norm.weight' has nothing in the checkpoint to fill it"]
        );
    }

    #[test]
    fn planning_a_checkpoint_is_mapping_it_then_planning_the_result() {
        let (config, ckpt) = llama_gqa();
        let mapping = crate::mapping::select(None, config.architecture()).expect("mapping");
        let model = Model::new(&config);
        let direct = plan(&mapping, &model, &ckpt, &options(2)).expect("plan");
        let staged = plan_mapped(
            &mapping,
            &model,
            &map::map(&mapping, &ckpt).expect("maps"),
            &options(2),
        )
        .expect("plan");
        assert_eq!(
            serde_json::to_value(&direct).expect("json"),
            serde_json::to_value(&staged).expect("json")
        );
        assert_eq!(
            direct.sources.len(),
            mapping_targets(&map::map(&mapping, &ckpt).expect("maps"))
        );
    }

    /// How many mapped tensors name a parameter (every one does in a checkpoint that plans).
    fn mapping_targets(m: &Mapped) -> usize {
        m.tensors
            .iter()
            .filter(|t| matches!(t.fate, map::Fate::Target(_)))
            .count()
    }

    #[test]
    fn only_float_types_convert_into_one_another() {
        assert!(convertible(Dtype::F32, Dtype::Bf16));
        assert!(convertible(Dtype::I32, Dtype::I32));
        assert!(!convertible(Dtype::I16, Dtype::Bf16));
    }
}
