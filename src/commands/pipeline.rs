//! The pipeline every command that plans shares, below the commands so that none calls another:
//! pick the mapping, map the checkpoint's names and plan every rank ([`make_plan`], used by
//! `plan`, `shard`, `load` and the Python package), and the planner's verdict on many layouts
//! ([`Mappings`], for `wload sizes` and for the TP sizes a refusal names).

use crate::commands::error::Error;
use crate::model::{Model, deepseek_v4, rules_for, structure};
use crate::open::Opened;
use crate::plan::PlanOptions;
use crate::{map, mapping, plan};

/// Picks the mapping, maps the checkpoint's names and plans every rank. A refusal whose fix is
/// another `--tp` names the TP sizes that work ([`with_working_tp`]).
pub fn make_plan(opened: &Opened, opts: &PlanOptions) -> Result<plan::Plan, Error> {
    let (tp, pp) = (opts.tp, opts.pp);
    refuse_deepseek_v4(opened, deepseek_v4::Asked::Layout { tp, pp })?;
    let base = mapping::select(opts.mapping.as_deref(), opened.config.architecture())?;
    refuse_dense_expert_parallel(opened, &base, opts)?;
    let (opts, warning) = &plan::served_options(&base, opts);
    let model = Model::new(&opened.config);
    let mapping = rules_for(&base, &model, opts.parallel());
    let mapped = map::map(&mapping, &opened.checkpoint)?;
    match plan::plan_mapped(&mapping, &model, &mapped, opts) {
        Ok(mut p) => {
            p.warnings.extend(warning.map(String::from));
            Ok(p)
        }
        Err(plan::PlanError::Invalid(problems)) => {
            let problems = with_working_tp(problems, &base, opened, &model, opts);
            Err(plan::PlanError::Invalid(problems).into())
        }
        Err(e) => Err(e.into()),
    }
}

/// DeepSeek-V4 is refused before any mapping is chosen (`--mapping FILE` included): its saved
/// state is platform-specific and wload has no verified reference for it, so it writes nothing
/// for it. The refusal says what the model is, with the per-rank figures for `asked`.
pub(crate) fn refuse_deepseek_v4(opened: &Opened, asked: deepseek_v4::Asked) -> Result<(), Error> {
    if !deepseek_v4::is_deepseek_v4(&opened.config) {
        return Ok(());
    }
    let d = deepseek_v4::describe(&opened.config, &opened.checkpoint, asked);
    Err(deepseek_v4::PlatformSpecific::new(d).into())
}

/// [`refuse_dense_expert_parallel`] with the mapping `opts` selects, for a pre-sharded folder
/// (whose planning reports a mapping that cannot be selected itself).
pub(crate) fn refuse_expert_parallel_without_experts(
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
pub(crate) fn refuse_dense_expert_parallel(
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
    model: &Model,
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
        model,
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

/// One layout and vLLM's verdict: accepted, or the first problem that refuses it.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
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
    /// The first problem is a limit of wload's (a tower it does not map), not vLLM's.
    pub wload_limit: bool,
}

/// TP sizes worth asking about up to `max`: 1 to 8, the powers of two, and the divisors of the
/// attention heads (the sizes vLLM can accept at all, since each rank holds whole heads).
pub(crate) fn tp_candidates(heads: u64, max: u64) -> Vec<u64> {
    let mut v: Vec<u64> = (1..=max.min(8)).collect();
    v.extend((3..63).map(|k| 1u64 << k).take_while(|&p| p <= max));
    v.extend((1..=heads.min(max)).filter(|&d| heads.is_multiple_of(d)));
    v.sort_unstable();
    v.dedup();
    v
}

/// The checkpoint's names mapped once per distinct set of rules: a mapping's rules depend on the
/// layout only through the `when:` of its stacked rules, and mapping 100k names is a good part
/// of a check.
pub(super) struct Mappings<'a> {
    pub(super) base: &'a mapping::Mapping,
    pub(super) opened: &'a Opened,
    pub(super) model: &'a Model<'a>,
    /// The stacked rules in effect (their debug text, which shows every field), the mapping, and
    /// the checkpoint mapped with it.
    pub(super) entries: Vec<(String, mapping::Mapping, map::Mapped<'a>)>,
}

impl Mappings<'_> {
    /// The entry for `opts`'s rules, mapped now if no earlier layout had them.
    fn entry(&mut self, opts: &PlanOptions) -> Result<usize, Error> {
        let m = rules_for(self.base, self.model, opts.parallel());
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
    pub(super) fn check_all(&mut self, layouts: Vec<PlanOptions>) -> Result<Vec<Verdict>, Error> {
        use rayon::prelude::*;
        let at = (layouts.iter())
            .map(|o| self.entry(o))
            .collect::<Result<Vec<usize>, _>>()?;
        let (entries, model) = (&self.entries, self.model);
        layouts
            .into_par_iter()
            .zip(at)
            .map(|(o, i)| verdict(&entries[i].1, &entries[i].2, model, o))
            .collect()
    }
}

/// The planner's verdict on one layout, exactly as [`make_plan`] would reach it (`mapping` is
/// [`rules_for`] the layout, `mapped` the checkpoint mapped with it).
fn verdict(
    mapping: &mapping::Mapping,
    mapped: &map::Mapped,
    model: &Model,
    opts: PlanOptions,
) -> Result<Verdict, Error> {
    let result = plan::check_mapped(mapping, model, mapped, &opts);
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
        wload_limit: (first.as_ref())
            .is_some_and(|p| p.message.ends_with(crate::model::env::WLOAD_LIMIT)),
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
