//! `wload plan`: every rank's tensors and where each byte comes from, or every problem.

use std::time::Instant;

use super::pipeline::{Mappings, Verdict, make_plan, tp_candidates};
use crate::commands::error::Error;
use crate::model::{Model, deepseek_v4, structure};
use crate::open::{Opened, Timings};
use crate::plan::PlanOptions;
use crate::{mapping, plan};

/// The plan as `wload plan` prints it, optionally for one rank.
pub fn plan_report(
    opened: &Opened,
    opts: &PlanOptions,
    rank: Option<u64>,
) -> Result<plan::PlanReport, Error> {
    if opts.tp == 0 {
        return Err(plan::PlanError::BadTp.into());
    }
    if opts.pp == 0 {
        return Err(plan::PlanError::BadPp.into());
    }
    let world = opts.tp.saturating_mul(opts.pp);
    if let Some(r) = rank
        && r >= world
    {
        let pp = if opts.pp > 1 {
            format!(" --pp {}", opts.pp)
        } else {
            String::new()
        };
        return Err(Error::Usage(format!(
            "--rank {r} is out of range for --tp {}{pp} (ranks 0..{})",
            opts.tp,
            world - 1
        )));
    }
    let t = Instant::now();
    let mut p = make_plan(opened, opts)?;
    let timings = Timings {
        plan_s: t.elapsed().as_secs_f64(),
        ..opened.timings
    };
    let totals = plan::PlanTotals::of(&p.ranks);
    if let Some(r) = rank {
        p.ranks.retain(|x| x.rank == r);
    }
    Ok(plan::PlanReport {
        schema_version: super::schema::PLAN,
        wload_version: env!("CARGO_PKG_VERSION"),
        source: opened.resolved.root.display().to_string(),
        timings,
        hub_fetched: opened.fetched(),
        plan: p,
        verdict: "accepted",
        totals,
    })
}

/// Which sizes `wload sizes` checks.
#[derive(Debug, Clone)]
pub struct SizesOptions {
    /// The largest TP size checked.
    pub max_tp: u64,
    /// The largest PP size checked (and never more than the config's layers).
    pub max_pp: u64,
    pub dtype: crate::dtype::DtypeChoice,
    pub mapping: Option<std::path::PathBuf>,
    /// `VLLM_PP_LAYER_PARTITION`, as `plan` reads it.
    pub pp_partition: Option<String>,
    /// `--language-model-only` and `--mm-encoder-tp-mode`, for every layout checked.
    pub multimodal: crate::multimodal::Multimodal,
    /// `VLLM_REPLICATE_EMBED`, as `plan` reads it.
    pub replicate_embed: bool,
}

/// `wload sizes`: vLLM's verdict on each parallel layout checked, from the planner itself.
#[derive(Debug, serde::Serialize, schemars::JsonSchema)]
pub struct SizesReport {
    pub schema_version: u32,
    pub wload_version: &'static str,
    pub source: String,
    pub architecture: String,
    pub family: String,
    pub attention_heads: u64,
    pub kv_heads: u64,
    pub layers: u64,
    /// Routed experts; `None` for a dense model (then no expert-parallel layout is checked).
    pub experts: Option<u64>,
    /// Every layout checked, in the order checked.
    pub checked: Vec<Verdict>,
    /// The TP sizes accepted without pipeline or expert parallelism.
    pub accepted_tp: Vec<u64>,
    /// The TP sizes accepted with `--enable-expert-parallel`; `None` for a dense model.
    pub accepted_tp_expert_parallel: Option<Vec<u64>>,
    /// Per PP size checked, the TP sizes accepted with it.
    pub accepted_pp: Vec<PpSizes>,
    /// The candidate layouts not checked, each with the reason, so that every size missing from
    /// the lists above has one (the table's rows give the reasons of the sizes refused).
    pub not_checked: Vec<NotChecked>,
    pub timings: Timings,
    /// For a hub repo id: what this run fetched from the hub (docs/json.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub_fetched: Option<crate::resolve::remote::Fetched>,
    /// When no TP size is accepted because wload does not map a vision tower: the TP sizes
    /// accepted with `--language-model-only` (the text model alone); else absent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub accepted_tp_language_model_only: Option<Vec<u64>>,
    /// What vLLM warns of with these flags, in its words (a `--mm-encoder-tp-mode data` it
    /// falls back from: the sizes are those of `weights`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
}

impl SizesReport {
    /// When no layout checked is accepted (`plan` refuses every one with these flags): why, and
    /// the flag that helps if one does.
    pub fn refusal(&self) -> Option<crate::plan::PlanError> {
        if self.checked.iter().any(|v| v.accepted) {
            return None;
        }
        let list = |tps: &[u64]| {
            tps.iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        };
        let (message, fix) = match &self.accepted_tp_language_model_only {
            Some(lm) if !lm.is_empty() => (
                "no layout checked can be planned: wload does not map this model's vision tower",
                format!(
                    "pass --language-model-only (to plan, shard and vllm serve) for the text model alone: --tp {} then",
                    list(lm)
                ),
            ),
            _ => (
                "no layout checked can be planned",
                "the table gives each size's first reason; `wload plan SOURCE --tp N` lists them all"
                    .into(),
            ),
        };
        Some(crate::plan::PlanError::Invalid(vec![
            crate::problem::Problem {
                message: message.into(),
                fix: Some(fix),
                ..Default::default()
            },
        ]))
    }
}

/// A layout `wload sizes` did not ask the planner about, and why.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct NotChecked {
    /// `None`: every TP size.
    pub tp: Option<u64>,
    pub pp: u64,
    pub expert_parallel: bool,
    pub reason: String,
}

#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct PpSizes {
    pub pp: u64,
    pub tp: Vec<u64>,
}

/// Checks every candidate layout with the planner `plan --tp N` uses (its checks only, not the
/// ranks' tensors): TP sizes alone, with expert parallelism for a MoE, and with PP 2… at each TP
/// size accepted alone.
pub fn sizes(opened: &Opened, opts: &SizesOptions) -> Result<SizesReport, Error> {
    let t = Instant::now();
    let config = &opened.config;
    let max_tp = opts.max_tp;
    super::pipeline::refuse_deepseek_v4(opened, deepseek_v4::Asked::Survey { max_tp })?;
    let mapping = mapping::select(opts.mapping.as_deref(), config.architecture())?;
    let (multimodal, warning) = opts.multimodal.served(mapping.encoder_tp_data);
    let layout = |tp, pp, expert_parallel| PlanOptions {
        tp,
        pp,
        pp_partition: opts.pp_partition.clone(),
        expert_parallel,
        dtype: opts.dtype,
        mapping: opts.mapping.clone(),
        shapes_only: false,
        moe_backend: None,
        multimodal,
        replicate_embed: opts.replicate_embed,
    };
    let model = Model::new(config);
    let mut maps = Mappings {
        base: &mapping,
        opened,
        model: &model,
        entries: Vec::new(),
    };
    let tps = tp_candidates(config.num_attention_heads, opts.max_tp.max(1));
    let alone: Vec<PlanOptions> = tps.iter().map(|&tp| layout(tp, 1, false)).collect();
    let mut checked = maps.check_all(alone)?;
    let accepted_tp = accepted(&checked, 1, false);
    let accepted_tp_language_model_only =
        text_model_sizes(&mut maps, opts, &tps, &checked, &accepted_tp, &layout)?;
    // As the planner sees the model: the family's defaults fill what config.json leaves out (a
    // Mixtral config without num_local_experts has 8), and 0 experts is vLLM's dense fallback.
    let shape = structure::structure(config, Some(&mapping), opts.mapping.as_deref());
    let experts = shape.moe.as_ref().and_then(|m| m.routed_experts);
    let moe = shape.moe.is_some();
    let mut not_checked = Vec::new();
    if moe {
        // At TP 1 expert parallelism changes nothing, and a size that splits attention heads is
        // refused whatever happens to the experts (the rows above say so).
        let heads = config.num_attention_heads;
        let (ep, skip): (Vec<u64>, Vec<u64>) =
            (tps.iter()).partition(|&&tp| tp > 1 && heads.is_multiple_of(tp));
        not_checked.extend(skip.into_iter().map(|tp| NotChecked {
            tp: Some(tp),
            pp: 1,
            expert_parallel: true,
            reason: ep_not_checked(tp, heads),
        }));
        checked.extend(maps.check_all(ep.iter().map(|&tp| layout(tp, 1, true)).collect())?);
    }
    let (pps, pp_tps) = pp_layouts(opts, config.num_hidden_layers, &tps, &accepted_tp);
    not_checked.extend(pp_not_checked(
        opts,
        config.num_hidden_layers,
        &pps,
        &pp_tps,
        &tps,
    ));
    let pp_layouts = pps
        .iter()
        .flat_map(|&pp| pp_tps.iter().map(move |&tp| (tp, pp)));
    checked.extend(maps.check_all(pp_layouts.map(|(tp, pp)| layout(tp, pp, false)).collect())?);
    let accepted_pp = pps
        .iter()
        .filter(|_| !pp_tps.is_empty())
        .map(|&pp| PpSizes {
            pp,
            tp: accepted(&checked, pp, false),
        })
        .collect();
    Ok(SizesReport {
        schema_version: super::schema::SIZES,
        wload_version: env!("CARGO_PKG_VERSION"),
        source: opened.resolved.root.display().to_string(),
        architecture: config.architecture().unwrap_or(&mapping.family).to_string(),
        family: mapping.family.clone(),
        attention_heads: config.num_attention_heads,
        // MLA has no kv heads to replicate: the heads.
        kv_heads: (shape.attention.heads()).map_or(config.num_attention_heads, |h| h.kv_heads),
        layers: config.num_hidden_layers,
        experts,
        accepted_tp_expert_parallel: moe.then(|| accepted(&checked, 1, true)),
        accepted_tp,
        accepted_pp,
        checked,
        not_checked,
        timings: Timings {
            plan_s: t.elapsed().as_secs_f64(),
            ..opened.timings
        },
        hub_fetched: opened.fetched(),
        accepted_tp_language_model_only,
        warnings: warning.map(String::from).into_iter().collect(),
    })
}

/// When no TP size is accepted only because wload does not map a tower: the sizes accepted with
/// `--language-model-only` (the text model alone), checked the same way; else `None`.
fn text_model_sizes(
    maps: &mut Mappings,
    opts: &SizesOptions,
    tps: &[u64],
    checked: &[Verdict],
    accepted_tp: &[u64],
    layout: &dyn Fn(u64, u64, bool) -> PlanOptions,
) -> Result<Option<Vec<u64>>, Error> {
    let tower = accepted_tp.is_empty()
        && !opts.multimodal.language_model_only
        && checked.iter().any(|v| v.wload_limit);
    if !tower {
        return Ok(None);
    }
    let lm_only = |tp| PlanOptions {
        multimodal: crate::multimodal::Multimodal {
            language_model_only: true,
            ..opts.multimodal
        },
        ..layout(tp, 1, false)
    };
    let v = maps.check_all(tps.iter().map(|&tp| lm_only(tp)).collect())?;
    Ok(Some(accepted(&v, 1, false)))
}

/// The PP sizes to check, and the TP sizes to check each at: 2 up to `--max-pp` and the layers,
/// at the TP sizes accepted alone; but with `VLLM_PP_LAYER_PARTITION`, which vLLM applies whatever
/// the size and which refuses every other PP size (PP 1 included), only the size it describes, at
/// every TP size.
fn pp_layouts(
    opts: &SizesOptions,
    layers: u64,
    tps: &[u64],
    accepted_tp: &[u64],
) -> (Vec<u64>, Vec<u64>) {
    match &opts.pp_partition {
        Some(p) => {
            let stages = p.split(',').count() as u64;
            let pps = (stages > 1).then_some(stages).into_iter().collect();
            (pps, tps.to_vec())
        }
        None => {
            let max_pp = opts.max_pp.min(layers);
            ((2..=max_pp).collect(), accepted_tp.to_vec())
        }
    }
}

/// Why `tp` is not checked with `--enable-expert-parallel`.
fn ep_not_checked(tp: u64, heads: u64) -> String {
    if tp == 1 {
        // vllm/model_executor/layers/fused_moe/config.py, FusedMoEParallelConfig.make: `use_ep =
        // dp_size * pcp_size * tp_size > 1 and enable_expert_parallel`.
        "vLLM uses expert parallelism only when TP × DP > 1: at TP 1 the flag changes nothing"
            .into()
    } else {
        format!(
            "the size does not divide the {heads} attention heads, which expert parallelism does not change"
        )
    }
}

/// The PP layouts not checked: at the TP sizes refused alone, and above the layer count.
fn pp_not_checked(
    opts: &SizesOptions,
    layers: u64,
    pps: &[u64],
    pp_tps: &[u64],
    tps: &[u64],
) -> Vec<NotChecked> {
    if opts.pp_partition.is_some() {
        return Vec::new();
    }
    let mut out = Vec::new();
    for &pp in pps {
        let refused = tps.iter().filter(|tp| !pp_tps.contains(tp));
        out.extend(refused.map(|&tp| NotChecked {
            tp: Some(tp),
            pp,
            expert_parallel: false,
            reason:
                "refused without --pp, and each stage splits its tensors as TP alone does".into(),
        }));
    }
    if opts.max_pp > layers {
        out.push(NotChecked {
            tp: None,
            pp: layers + 1,
            expert_parallel: false,
            reason: format!(
                "--pp {} and above: the model has {layers} layers, and vLLM gives each stage at least one",
                layers + 1
            ),
        });
    }
    out
}

fn accepted(checked: &[Verdict], pp: u64, expert_parallel: bool) -> Vec<u64> {
    checked
        .iter()
        .filter(|v| v.accepted && v.pp == pp && v.expert_parallel == expert_parallel)
        .map(|v| v.tp)
        .collect()
}
