//! `wload plan`: every rank's tensors and where each byte comes from, or every problem.

use std::time::Instant;

use crate::commands::error::Error;
use crate::model::{rules_for, structure};
use crate::open::{Opened, Timings};
use crate::plan::PlanOptions;
use crate::{map, mapping, plan};

/// Picks the mapping, maps the checkpoint's names and plans every rank. A refusal whose fix is
/// another `--tp` names the TP sizes that work ([`with_working_tp`]).
pub fn make_plan(opened: &Opened, opts: &PlanOptions) -> Result<plan::Plan, Error> {
    let base = mapping::select(opts.mapping.as_deref(), opened.config.architecture())?;
    refuse_dense_expert_parallel(opened, &base, opts)?;
    let mapping = rules_for(&base, &opened.config, opts.parallel());
    let mapped = map::map(&mapping, &opened.checkpoint)?;
    match plan::plan_mapped(&mapping, &opened.config, &mapped, opts) {
        Ok(p) => Ok(p),
        Err(plan::PlanError::Invalid(problems)) => {
            let problems = with_working_tp(problems, &base, opened, opts);
            Err(plan::PlanError::Invalid(problems).into())
        }
        Err(e) => Err(e.into()),
    }
}

/// [`refuse_dense_expert_parallel`] with the mapping `opts` selects, for a pre-sharded folder
/// (whose planning reports a mapping that cannot be selected itself).
pub fn refuse_expert_parallel_without_experts(
    opened: &Opened,
    opts: &PlanOptions,
) -> Result<(), Error> {
    if !opts.expert_parallel {
        return Ok(());
    }
    match mapping::select(opts.mapping.as_deref(), opened.config.architecture()) {
        Ok(m) => refuse_dense_expert_parallel(opened, &m, opts),
        Err(_) => Ok(()),
    }
}

/// `--enable-expert-parallel` for a model without experts is a usage error: vLLM ignores the
/// flag there, and a folder recording it would pass it on to the serve line for nothing.
pub fn refuse_dense_expert_parallel(
    opened: &Opened,
    mapping: &mapping::Mapping,
    opts: &PlanOptions,
) -> Result<(), Error> {
    if !opts.expert_parallel {
        return Ok(());
    }
    let shape = structure::structure(&opened.config, Some(mapping), opts.mapping.as_deref());
    if shape.moe.is_some() {
        return Ok(());
    }
    let arch = opened.config.architecture().unwrap_or(&mapping.family);
    Err(Error::Usage(format!(
        "--enable-expert-parallel: {arch} (mapping {}) has no experts, so there is nothing to \
         spread over the ranks; leave the flag out (it is for MoE models)",
        mapping.family
    )))
}

/// The largest TP size a refusal's fix looks at.
const WORKING_TP_MAX: u64 = 64;

/// `problems` with every fix that says to choose another `--tp` completed with the TP sizes that
/// work (with the other flags as given), found as `wload sizes` finds them: by the planner's
/// checks at each candidate size. Left as they are when a check fails for another reason.
fn with_working_tp(
    mut problems: Vec<crate::problem::Problem>,
    base: &mapping::Mapping,
    opened: &Opened,
    opts: &PlanOptions,
) -> Vec<crate::problem::Problem> {
    let about_tp =
        |fix: &str| fix.starts_with("choose a --tp") || fix.starts_with("choose another --tp");
    if !problems
        .iter()
        .any(|p| p.fix.as_deref().is_some_and(about_tp))
    {
        return problems;
    }
    let heads = opened.config.num_attention_heads;
    let max = WORKING_TP_MAX.max(opts.tp);
    let layouts = (tp_candidates(heads, max).into_iter())
        .filter(|&tp| tp != opts.tp)
        .map(|tp| PlanOptions { tp, ..opts.clone() })
        .collect();
    let mut maps = Mappings {
        base,
        opened,
        entries: Vec::new(),
    };
    let Ok(verdicts) = maps.check_all(layouts) else {
        return problems;
    };
    let working: Vec<u64> = verdicts
        .iter()
        .filter(|v| v.accepted)
        .map(|v| v.tp)
        .collect();
    let pp = if opts.pp > 1 {
        format!(" at --pp {}", opts.pp)
    } else {
        String::new()
    };
    let sizes = if working.is_empty() {
        format!("no TP size up to {max} works{pp}; `wload sizes` says why")
    } else {
        let list: Vec<String> = working.iter().map(u64::to_string).collect();
        format!("TP sizes that work{pp}: {}", list.join(", "))
    };
    for p in &mut problems {
        if let Some(fix) = p.fix.as_mut().filter(|f| about_tp(f)) {
            *fix = format!("{fix}; {sizes}");
        }
    }
    problems
}

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
        schema_version: plan::SCHEMA_VERSION,
        wload_version: env!("CARGO_PKG_VERSION"),
        source: opened.resolved.root.display().to_string(),
        timings,
        hub_fetched: opened.fetched(),
        plan: p,
        verdict: "accepted",
        totals,
    })
}

/// Bumped when a field of `wload sizes --json` changes meaning or disappears (docs/sizes-json.md).
pub const SIZES_SCHEMA_VERSION: u32 = 1;

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
}

/// `wload sizes`: vLLM's verdict on each parallel layout checked, from the planner itself.
#[derive(Debug, serde::Serialize)]
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
}

/// A layout `wload sizes` did not ask the planner about, and why.
#[derive(Debug, Clone, serde::Serialize)]
pub struct NotChecked {
    /// `None`: every TP size.
    pub tp: Option<u64>,
    pub pp: u64,
    pub expert_parallel: bool,
    pub reason: String,
}

/// One layout and vLLM's verdict: accepted, or the first problem that refuses it.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Verdict {
    pub tp: u64,
    pub pp: u64,
    pub expert_parallel: bool,
    pub accepted: bool,
    /// The first problem `wload plan` reports for this layout; `None` when accepted.
    pub reason: Option<String>,
    pub fix: Option<String>,
    /// How many problems `wload plan` reports for it in all.
    pub problems: usize,
}

#[derive(Debug, Clone, serde::Serialize)]
pub struct PpSizes {
    pub pp: u64,
    pub tp: Vec<u64>,
}

/// TP sizes worth asking about up to `max`: 1 to 8, the powers of two, and the divisors of the
/// attention heads (the sizes vLLM can accept at all, since each rank holds whole heads).
pub fn tp_candidates(heads: u64, max: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (1..=max.min(8)).collect();
    v.extend((3..63).map(|k| 1u64 << k).take_while(|&p| p <= max));
    v.extend((1..=heads.min(max)).filter(|&d| heads.is_multiple_of(d)));
    v.sort_unstable();
    v.dedup();
    v
}

/// Checks every candidate layout with the planner `plan --tp N` uses (its checks only, not the
/// ranks' tensors): TP sizes alone, with expert parallelism for a MoE, and with PP 2… at each TP
/// size accepted alone.
pub fn sizes(opened: &Opened, opts: &SizesOptions) -> Result<SizesReport, Error> {
    let t = Instant::now();
    let config = &opened.config;
    let mapping = mapping::select(opts.mapping.as_deref(), config.architecture())?;
    let layout = |tp, pp, expert_parallel| PlanOptions {
        tp,
        pp,
        pp_partition: opts.pp_partition.clone(),
        expert_parallel,
        dtype: opts.dtype,
        mapping: opts.mapping.clone(),
        shapes_only: false,
        moe_backend: None,
        multimodal: opts.multimodal,
    };
    let mut maps = Mappings {
        base: &mapping,
        opened,
        entries: Vec::new(),
    };
    let tps = tp_candidates(config.num_attention_heads, opts.max_tp.max(1));
    let alone: Vec<PlanOptions> = tps.iter().map(|&tp| layout(tp, 1, false)).collect();
    let mut checked = maps.check_all(alone)?;
    let accepted_tp = accepted(&checked, 1, false);
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
        schema_version: SIZES_SCHEMA_VERSION,
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
    })
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

/// The checkpoint's names mapped once per distinct set of rules: a mapping's rules depend on the
/// layout only through the `when:` of its stacked rules, and mapping 100k names is a good part
/// of a check.
struct Mappings<'a> {
    base: &'a mapping::Mapping,
    opened: &'a Opened,
    /// The stacked rules in effect (their debug text, which shows every field), the mapping, and
    /// the checkpoint mapped with it.
    entries: Vec<(String, mapping::Mapping, map::Mapped<'a>)>,
}

impl Mappings<'_> {
    /// The entry for `opts`'s rules, mapped now if no earlier layout had them.
    fn entry(&mut self, opts: &PlanOptions) -> Result<usize, Error> {
        let m = rules_for(self.base, &self.opened.config, opts.parallel());
        let key = format!("{:?}", m.rules.stacked);
        if let Some(i) = self.entries.iter().position(|e| e.0 == key) {
            return Ok(i);
        }
        let mapped = map::map(&m, &self.opened.checkpoint)?;
        self.entries.push((key, m, mapped));
        Ok(self.entries.len() - 1)
    }

    /// The layouts' verdicts, checked in parallel, in the order given; the first error that is
    /// not a refusal (an unreadable mapping) stops everything.
    fn check_all(&mut self, layouts: Vec<PlanOptions>) -> Result<Vec<Verdict>, Error> {
        use rayon::prelude::*;
        let at = (layouts.iter())
            .map(|o| self.entry(o))
            .collect::<Result<Vec<usize>, _>>()?;
        let (entries, opened) = (&self.entries, self.opened);
        layouts
            .into_par_iter()
            .zip(at)
            .map(|(o, i)| verdict(&entries[i].1, &entries[i].2, opened, o))
            .collect()
    }
}

fn accepted(checked: &[Verdict], pp: u64, expert_parallel: bool) -> Vec<u64> {
    checked
        .iter()
        .filter(|v| v.accepted && v.pp == pp && v.expert_parallel == expert_parallel)
        .map(|v| v.tp)
        .collect()
}

/// The planner's verdict on one layout, exactly as [`make_plan`] would reach it (`mapping` is
/// [`rules_for`] the layout, `mapped` the checkpoint mapped with it).
fn verdict(
    mapping: &mapping::Mapping,
    mapped: &map::Mapped,
    opened: &Opened,
    opts: PlanOptions,
) -> Result<Verdict, Error> {
    let result = plan::check_mapped(mapping, &opened.config, mapped, &opts);
    let (accepted, first, problems) = match result {
        Ok(()) => (true, None, 0),
        Err(plan::PlanError::Invalid(ps)) => {
            let n = ps.len();
            (false, ps.into_iter().next(), n)
        }
        Err(e) => return Err(e.into()),
    };
    Ok(Verdict {
        tp: opts.tp,
        pp: opts.pp,
        expert_parallel: opts.expert_parallel,
        accepted,
        reason: first.as_ref().map(|p| p.message.clone()),
        fix: first.and_then(|p| p.fix),
        problems,
    })
}

#[cfg(test)]
mod tests {
    use super::tp_candidates;

    #[test]
    fn tp_candidates_hold_every_divisor_of_the_heads() {
        assert_eq!(
            tp_candidates(28, 64),
            [1, 2, 3, 4, 5, 6, 7, 8, 14, 16, 28, 32, 64]
        );
        assert_eq!(tp_candidates(8, 4), [1, 2, 3, 4]);
        assert_eq!(tp_candidates(1, 1), [1]);
        assert_eq!(tp_candidates(96, 16), [1, 2, 3, 4, 5, 6, 7, 8, 12, 16]);
    }
}
