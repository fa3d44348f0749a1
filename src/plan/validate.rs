//! Validate phase: every parameter is filled (once: by a fused tensor or by its shards), and every
//! layout divides by the TP size as vLLM asserts.

use rayon::prelude::*;

use super::Planner;
use super::assign::Assigned;
use super::params::Param;
use crate::layout::Rank;
use crate::mapping::rules::ShardId;
use crate::problem::Problem;

/// How the checkpoint fills one parameter.
enum Filling {
    /// By its shards (or not at all, where that is allowed).
    Split,
    /// By one tensor stacked on disk.
    Fused,
    /// The checkpoint fills a parameter tied to another.
    TiedButFilled,
    /// By a fused tensor and by separate shards.
    Both,
    /// These slots are empty (`""`: the whole parameter).
    Missing(Vec<String>),
}

impl Planner<'_> {
    /// Problems for parameters left unfilled or filled both ways; per parameter, whether a single
    /// stacked tensor (a fused one) fills it. Parameters are checked in parallel (a large MoE
    /// has hundreds of expert slots per parameter), and their problems reported in order.
    pub(super) fn filled(&mut self, params: &[Param], a: &Assigned) -> Vec<bool> {
        let fillings: Vec<Filling> = {
            let this = &*self;
            (params.par_iter().enumerate())
                .map(|(pi, p)| this.filling(pi, p, a))
                .collect()
        };
        let mut fused = vec![false; params.len()];
        for ((p, filling), fused) in params.iter().zip(fillings).zip(&mut fused) {
            let (message, fix) = match filling {
                Filling::Split => continue,
                Filling::Fused => {
                    *fused = true;
                    continue;
                }
                Filling::Missing(missing) => {
                    self.missing(p, &missing);
                    continue;
                }
                Filling::TiedButFilled => (
                    format!(
                        "'{}' is tied to another parameter but the checkpoint fills it",
                        p.name
                    ),
                    None,
                ),
                Filling::Both => (
                    format!(
                        "'{}' is filled both by a fused tensor and by separate shards",
                        p.name
                    ),
                    Some("keep either the fused tensor or the separate ones".into()),
                ),
            };
            self.problems.push(Problem {
                message,
                fix,
                parameter: Some(p.name.clone()),
                ..Default::default()
            });
        }
        fused
    }

    /// How the checkpoint fills parameter `p` (index `pi`).
    fn filling(&self, pi: usize, p: &Param, a: &Assigned) -> Filling {
        let fed = &a.fed[pi];
        if p.buffer || p.alias_of.is_some() {
            if p.alias_of.is_some() && !fed.is_empty() {
                return Filling::TiedButFilled;
            }
            return Filling::Split;
        }
        let (split, whole) = p.geometry.required();
        let has_whole = whole.as_ref().is_some_and(|w| fed.contains_key(w));
        let has_split = split.iter().any(|k| fed.contains_key(k));
        if has_whole && has_split {
            return Filling::Both;
        }
        if has_whole {
            return Filling::Fused;
        }
        if p.optional || self.opts.shapes_only {
            return Filling::Split;
        }
        if whole.is_some_and(|w| a.present.contains(&(pi, w))) {
            return Filling::Split;
        }
        let missing: Vec<String> = split
            .iter()
            .filter(|k| !fed.contains_key(k) && !a.present.contains(&(pi, (*k).clone())))
            .map(|(s, e)| slot_name(s, e))
            .collect();
        if missing.is_empty() {
            Filling::Split
        } else {
            Filling::Missing(missing)
        }
    }

    fn missing(&mut self, p: &Param, missing: &[String]) {
        let what = if missing.len() == 1 && missing[0].is_empty() {
            String::new()
        } else {
            format!(" (missing {})", summarize(missing))
        };
        let mut message = format!(
            "parameter '{}' has nothing in the checkpoint to fill it{what}",
            p.name
        );
        let mut fix = "the checkpoint lacks this tensor or names it differently: check the names with `wload inspect`, or adjust the rules with --mapping FILE".to_string();
        // The mapping's `missing_hints`: the config says why (a condition that cannot be
        // evaluated gives no hint; the generic fix stays).
        let scope = self.env.scope(p.layer);
        if let Some(h) = (self.mapping.missing_hints.iter())
            .find(|h| p.name.contains(&h.params) && h.when.eval_bool(&scope).unwrap_or(false))
        {
            message = format!("{message}: {}", self.env.fill(&h.message));
            fix = self.env.fill(&h.fix);
        }
        self.problems.push(Problem {
            message,
            fix: Some(fix),
            parameter: Some(p.name.clone()),
            ..Default::default()
        });
    }

    /// vLLM's divisibility asserts for every parameter on every rank.
    pub(super) fn divisible(&mut self, params: &[Param]) {
        let tp = self.opts.tp;
        for rank in 0..tp {
            let r = Rank {
                tp,
                rank,
                ep: self.opts.expert_parallel,
            };
            for p in params {
                for msg in p.geometry.check(r) {
                    self.problems.push(Problem {
                        message: format!("{}: {msg}", p.name),
                        fix: Some(format!("choose another --tp (now {tp})")),
                        parameter: Some(p.name.clone()),
                        ..Default::default()
                    });
                }
            }
        }
    }
}

/// A slot as messages name it: `expert 3 w1`, `shard q`, or nothing for a whole parameter.
fn slot_name(s: &Option<ShardId>, e: &Option<u64>) -> String {
    match (s, e) {
        (Some(s), Some(e)) => format!("expert {e} {s}"),
        (Some(s), None) => format!("shard {s}"),
        (None, Some(e)) => format!("expert {e}"),
        (None, None) => String::new(),
    }
}

/// Up to four items, or the first three and the count.
fn summarize(items: &[String]) -> String {
    if items.len() <= 4 {
        items.join(", ")
    } else {
        format!("{}, … {} in all", items[..3].join(", "), items.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_lists_of_missing_slots_are_cut_to_three_and_a_count() {
        let items: Vec<String> = (0..6).map(|e| slot_name(&None, &Some(e))).collect();
        assert_eq!(
            summarize(&items[..4]),
            "expert 0, expert 1, expert 2, expert 3"
        );
        assert_eq!(
            summarize(&items),
            "expert 0, expert 1, expert 2, … 6 in all"
        );
    }

    #[test]
    fn slots_are_named_by_expert_then_shard() {
        let w1 = Some(ShardId::Name("w1".into()));
        assert_eq!(slot_name(&w1, &Some(3)), "expert 3 w1");
        assert_eq!(slot_name(&Some(ShardId::Index(1)), &None), "shard 1");
        assert_eq!(slot_name(&None, &None), "");
    }
}
