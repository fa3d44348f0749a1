//! Pipeline parallelism: which layers each stage holds (vLLM's `get_pp_indices`,
//! distributed/utils.py:198–241), and on which stages the head and tail parameters are built
//! (each family's `pp_stage`).

use super::Planner;
use super::params::Param;
use crate::mapping::expr::Scope;
use crate::problem::Problem;
pub(crate) use crate::ranks::stages::{Stage, split_layers};

/// Where a parameter is, per stage kind: indexed by `2 * first + last`.
pub(super) type OnStage = [bool; 4];

impl Planner<'_> {
    /// The stages for this plan; a layout vLLM would refuse, or a stage without layers, is a
    /// problem (and one stage holding everything is returned so that later phases still run).
    pub(super) fn stages(&mut self, layers: u64) -> Vec<Stage> {
        let pp = self.opts.pp;
        let whole = vec![Stage {
            pp_rank: 0,
            first_layer: 0,
            end_layer: layers,
        }];
        // vLLM reads VLLM_PP_LAYER_PARTITION whatever the PP size (make_layers calls
        // get_pp_indices, models/utils.py:907), so a bad one is refused at PP 1 too.
        if pp <= 1 && self.opts.pp_partition.is_none() {
            return whole;
        }
        if pp > 1 && pp > layers {
            self.problems.push(Problem {
                message: format!(
                    "--pp {pp} is more than the model's {layers} layers: some pipeline stages would hold no layer"
                ),
                fix: Some(format!("choose a --pp of at most {layers}")),
                ..Default::default()
            });
            return whole;
        }
        match split_layers(layers, pp, self.opts.pp_partition.as_deref()) {
            Ok(stages) => {
                if let Some(empty) = stages
                    .iter()
                    .find(|s| pp > 1 && s.first_layer == s.end_layer)
                {
                    self.problems.push(Problem {
                        message: format!(
                            "VLLM_PP_LAYER_PARTITION gives pipeline stage {} no layers",
                            empty.pp_rank
                        ),
                        fix: Some("give every stage at least one layer".into()),
                        ..Default::default()
                    });
                    return whole;
                }
                stages
            }
            Err(msg) => {
                self.problems.push(Problem {
                    message: format!(
                        "VLLM_PP_LAYER_PARTITION={:?}: {msg}",
                        self.opts.pp_partition.as_deref().unwrap_or_default()
                    ),
                    fix: Some(format!(
                        "give {pp} comma-separated layer counts that add up to {layers}, or unset VLLM_PP_LAYER_PARTITION"
                    )),
                    ..Default::default()
                });
                whole
            }
        }
    }

    /// The mapping's `stage_needs`: a stage (the whole model without PP) holding none of the
    /// layers it asks for is refused with vLLM's message.
    pub(super) fn stage_needs(&mut self, stages: &[Stage]) {
        let Some(need) = &self.mapping.stage_needs else {
            return;
        };
        for stage in stages {
            let found = stage.layers().any(|i| {
                need.layer
                    .eval_bool(&self.env.scope(Some(i)))
                    .unwrap_or(false)
            });
            if !found {
                let whole = stages.len() == 1;
                self.problems.push(Problem {
                    message: if whole {
                        need.message.clone()
                    } else {
                        format!(
                            "{} (pipeline stage {} holds layers [{}, {}))",
                            need.message, stage.pp_rank, stage.first_layer, stage.end_layer
                        )
                    },
                    fix: need.fix.clone(),
                    ..Default::default()
                });
            }
        }
    }

    /// For every parameter, on which kinds of stage it is built: layer parameters everywhere
    /// (their layer decides), head and tail parameters where their `pp_stage` holds. With one
    /// stage everything is built and `pp_stage` is not needed.
    pub(super) fn on_stages(&mut self, params: &[Param]) -> Vec<OnStage> {
        params
            .iter()
            .map(|p| {
                if p.layer.is_some() {
                    if p.spec.pp_stage.is_some() {
                        self.problems.push(Problem {
                            message: format!(
                                "{}: `pp_stage` is for head and tail parameters; a layer's parameters are on its stage",
                                p.spec.name
                            ),
                            fix: Some("remove `pp_stage` from the layer parameter".into()),
                            parameter: Some(p.spec.name.clone()),
                            ..Default::default()
                        });
                    }
                    return [true; 4];
                }
                if self.opts.pp <= 1 {
                    return [true; 4];
                }
                let Some(expr) = &p.spec.pp_stage else {
                    self.problems.push(Problem {
                        message: format!(
                            "{}: the mapping does not say on which pipeline stages vLLM builds this parameter",
                            p.name
                        ),
                        fix: Some(
                            "add `pp_stage:` to it in the mapping (docs/mapping-format.md), or use --pp 1"
                                .into(),
                        ),
                        parameter: Some(p.name.clone()),
                        ..Default::default()
                    });
                    return [true; 4];
                };
                let mut on = [false; 4];
                for (k, slot) in on.iter_mut().enumerate() {
                    let scope = StageScope {
                        inner: self.env.scope(None),
                        first: k >= 2,
                        last: k % 2 == 1,
                    };
                    match expr.eval_bool(&scope) {
                        Ok(b) => *slot = b,
                        Err(err) => {
                            self.problems.push(Problem {
                                message: format!(
                                    "{}: cannot evaluate `pp_stage: {expr}`: {err}",
                                    p.name
                                ),
                                fix: None,
                                parameter: Some(p.name.clone()),
                                ..Default::default()
                            });
                            return [true; 4];
                        }
                    }
                }
                on
            })
            .collect()
    }
}

/// Whether a parameter is on `stage` of `stages`.
pub(super) fn holds(p: &Param, on: &OnStage, stage: &Stage, stages: usize) -> bool {
    match p.layer {
        Some(i) => stage.layers().contains(&i),
        None => {
            let first = stage.pp_rank == 0;
            let last = stage.pp_rank as usize + 1 == stages;
            on[2 * usize::from(first) + usize::from(last)]
        }
    }
}

/// The environment plus `first_stage` and `last_stage`, for `pp_stage`.
struct StageScope<'a> {
    inner: crate::model::env::EnvScope<'a>,
    first: bool,
    last: bool,
}

impl Scope for StageScope<'_> {
    fn get(&self, name: &str) -> Option<serde_json::Value> {
        match name {
            "first_stage" => Some(self.first.into()),
            "last_stage" => Some(self.last.into()),
            _ => self.inner.get(name),
        }
    }

    fn other_spelling(&self, name: &str) -> Option<&'static str> {
        self.inner.other_spelling(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counts(layers: u64, pp: u64, partition: Option<&str>) -> Vec<u64> {
        split_layers(layers, pp, partition)
            .expect("a layout")
            .iter()
            .map(|s| s.end_layer - s.first_layer)
            .collect()
    }

    #[test]
    fn layers_split_as_vllm_get_pp_indices() {
        assert_eq!(counts(3, 2, None), [2, 1]);
        assert_eq!(counts(3, 3, None), [1, 1, 1]);
        assert_eq!(counts(5, 3, None), [2, 2, 1]);
        assert_eq!(counts(5, 4, None), [1, 1, 2, 1]);
        assert_eq!(counts(8, 2, None), [4, 4]);
        assert_eq!(counts(7, 1, None), [7]);
        let s = split_layers(3, 2, None).unwrap();
        assert_eq!((s[0].layers(), s[1].layers()), (0..2, 2..3));
        let s = split_layers(5, 4, None).unwrap();
        assert_eq!(s[2].layers(), 2..4);
    }

    #[test]
    fn a_partition_overrides_and_is_checked_as_vllm_does() {
        assert_eq!(counts(5, 2, Some("1,4")), [1, 4]);
        assert_eq!(counts(5, 2, Some(" 3, 2")), [3, 2]);
        assert_eq!(
            split_layers(5, 2, Some("1,x")).unwrap_err(),
            "Invalid partition string: 1,x"
        );
        assert_eq!(
            split_layers(5, 2, Some("1,2,2")).unwrap_err(),
            "len(partitions)=3 does not match pp_size=2."
        );
        assert_eq!(
            split_layers(5, 2, Some("1,2")).unwrap_err(),
            "sum(partitions)=3 does not match num_hidden_layers=5."
        );
    }

    /// Counts whose u64 sum wraps round to the layer count (3 + (2^64 - 1) = 2) are refused with
    /// their true sum, as Python's sum gives it: they used to be accepted for 2 layers.
    #[test]
    fn a_partition_whose_sum_wraps_is_refused_with_its_true_sum() {
        assert_eq!(
            split_layers(2, 2, Some("3,18446744073709551615")).unwrap_err(),
            "sum(partitions)=18446744073709551618 does not match num_hidden_layers=2."
        );
        assert_eq!(
            split_layers(2, 3, Some("18446744073709551615,18446744073709551615,4")).unwrap_err(),
            "sum(partitions)=36893488147419103234 does not match num_hidden_layers=2."
        );
    }
}
