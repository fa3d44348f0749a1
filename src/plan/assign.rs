//! Assign phase: every mapped checkpoint tensor into its parameter's slot, checked on the way —
//! the parameter exists (or vLLM ignores the name), the shard id fits the layout, the shape is the
//! one the config implies, the dtype converts, and no slot is filled twice.

use std::collections::{HashMap, HashSet};

use rayon::prelude::*;

use super::params::Param;
use super::{Planner, Skipped, SourceTensor, convertible, shape_cast};
use crate::checkpoint::TensorInfo;
use crate::dtype::Dtype;
use crate::layout::SlotKey;
use crate::map::{Conversion, Fate, Mapped, MappedTensor, Target};
use crate::mapping::Expr;
use crate::problem::Problem;

/// A fast, fixed hasher: slot lookups run once per piece, millions of times for a large MoE.
type Hasher = foldhash::fast::FixedState;

use super::dequant::Pairs;
pub(super) use super::slots::{Fed, Feed};

/// What the checkpoint fills.
pub(super) struct Assigned {
    /// The checkpoint tensors the plan reads, in checkpoint order.
    pub sources: Vec<SourceTensor>,
    /// Per parameter (same index): its filled slots.
    pub fed: Vec<Fed>,
    /// Slots some tensor names but could not fill: a tensor reported as unusable is not reported
    /// again as missing.
    pub present: HashSet<(usize, SlotKey), Hasher>,
    /// Checkpoint tensors dropped by a rule or skipped as vLLM skips them.
    pub skipped: Vec<Skipped>,
}

/// One mapped tensor, checked on its own (the checks that need no other tensor).
enum Verdict<'t> {
    Dropped(&'t str),
    /// Its name is no parameter of the model.
    NoParameter(&'t Target),
    /// It fits parameter `pi`'s slot, if no other tensor filled that slot before.
    Fits {
        pi: usize,
        target: &'t Target,
        rotary_heads: Option<u64>,
    },
    /// It does not fit parameter `pi`: the problem says why.
    Misfit {
        pi: usize,
        target: &'t Target,
        problem: Box<Problem>,
    },
}

/// The parameter one thread looked up last. The map stage gives consecutive tensors of one
/// parameter one shared name, so its address says "the same parameter" without hashing the
/// name again (a fused expert parameter is named by hundreds of tensors in a row).
#[derive(Default)]
struct LastParameter {
    /// The shared name's address (the names live as long as the mapped checkpoint) and its
    /// parameter index.
    last: Option<(*const u8, Option<usize>)>,
}

impl LastParameter {
    fn index(
        &mut self,
        name: &std::sync::Arc<str>,
        by_name: &HashMap<&str, usize, Hasher>,
    ) -> Option<usize> {
        let at = name.as_ptr();
        match self.last {
            Some((a, pi)) if a == at => pi,
            _ => {
                let pi = by_name.get(&**name).copied();
                self.last = Some((at, pi));
                pi
            }
        }
    }
}

impl Planner<'_> {
    /// Checks every mapped tensor on its own, in parallel (a DeepSeek-V3 checkpoint has 90,000),
    /// then fills the slots in load order, where a slot filled twice is found.
    pub(super) fn assign(&mut self, params: &[Param], mapped: &Mapped) -> Assigned {
        let by_name: HashMap<&str, usize, Hasher> = params
            .iter()
            .enumerate()
            .map(|(i, p)| (p.name.as_str(), i))
            .collect();
        let files: Vec<std::sync::Arc<str>> = (mapped.checkpoint.files.iter())
            .map(|f| f.name.as_str().into())
            .collect();
        let verdicts: Vec<Verdict> = {
            let this = &*self;
            (mapped.tensors.par_iter())
                .map_init(LastParameter::default, |last, m| {
                    this.verdict(params, &by_name, last, m)
                })
                .collect()
        };
        let pairs = self.dequant_pairs(mapped);
        // The tensors the plan reads, in load order: the sources, built once all are known.
        let mut read: Vec<&MappedTensor> = Vec::with_capacity(verdicts.len());
        let mut a = Assigned {
            sources: Vec::new(),
            fed: (params.iter())
                .map(|p| Fed::new(p.geometry.expert_count()))
                .collect(),
            present: HashSet::default(),
            skipped: Vec::new(),
        };
        for (m, v) in mapped.tensors.iter().zip(verdicts) {
            // A skipped (MTP) layer's scale is reported with its layer below.
            if self.dequant_scale(m.tensor) && self.skipped_layer(&m.tensor.name).is_none() {
                // Read with its FP8 weight (`fill`), or unused.
                a.skipped.extend(self.unused_scale(&pairs, m));
                continue;
            }
            match v {
                Verdict::Dropped(rule) => a.skipped.push(Skipped {
                    tensor: m.tensor.name.to_string(),
                    reason: format!("dropped by {rule}"),
                }),
                Verdict::NoParameter(target) => self.no_parameter(m, target, &mut a.skipped),
                Verdict::Misfit {
                    pi,
                    target,
                    problem,
                } => {
                    self.problems.push(*problem);
                    a.present.insert((pi, target.slot()));
                }
                Verdict::Fits {
                    pi,
                    target,
                    rotary_heads,
                } => self.fill(
                    &params[pi],
                    pi,
                    (m, target),
                    rotary_heads,
                    (&mut a, &pairs),
                    &mut read,
                ),
            }
        }
        a.sources = (read.par_iter())
            .map(|m| source_of(m.tensor, files[m.tensor.file].clone()))
            .collect();
        a
    }

    /// What `m` is to the model, from its name, shape and dtype alone.
    fn verdict<'t>(
        &self,
        params: &[Param],
        by_name: &HashMap<&str, usize, Hasher>,
        last: &mut LastParameter,
        m: &'t MappedTensor,
    ) -> Verdict<'t> {
        let target = match &m.fate {
            Fate::Dropped { rule } => return Verdict::Dropped(rule),
            Fate::Target(target) => target,
        };
        let Some(pi) = last.index(&target.parameter, by_name) else {
            return Verdict::NoParameter(target);
        };
        match self.misfit(&params[pi], m, target) {
            Some(problem) => Verdict::Misfit {
                pi,
                target,
                problem: Box::new(problem),
            },
            None => Verdict::Fits {
                pi,
                target,
                rotary_heads: self.rotary_heads(target),
            },
        }
    }

    /// A name that is no parameter: skipped when vLLM ignores such names (unexpected biases and
    /// the mapping's suffixes), otherwise a problem.
    fn no_parameter(&mut self, m: &MappedTensor, target: &Target, skipped: &mut Vec<Skipped>) {
        let t = m.tensor;
        let ignored = std::iter::once(".bias")
            .chain(
                self.mapping
                    .ignore_unexpected_suffixes
                    .iter()
                    .map(String::as_str),
            )
            .find(|s| target.parameter.ends_with(s));
        if let Some(i) = self.skipped_layer(&t.name) {
            skipped.push(Skipped {
                tensor: t.name.to_string(),
                reason: format!(
                    "layer {i} is a speculative-decoding (MTP) layer, which vLLM skips when loading the model"
                ),
            });
            return;
        }
        if let Some(m) = self.mapping.skip_modules.iter().find(|m| {
            target.parameter.starts_with(&m.prefix)
                && m.when.eval_bool(&self.env.scope(None)).unwrap_or(false)
        }) {
            skipped.push(Skipped {
                tensor: t.name.to_string(),
                reason: m.reason.clone(),
            });
            return;
        }
        if let Some(sfx) = ignored {
            skipped.push(Skipped {
                tensor: t.name.to_string(),
                reason: format!(
                    "no parameter '{}'; vLLM ignores unexpected '{sfx}' names",
                    target.parameter
                ),
            });
            return;
        }
        let what = if *target.parameter == *t.name {
            String::new()
        } else {
            format!(
                " → '{}'{}",
                target.parameter,
                via(&self.mapping.rules, target)
            )
        };
        self.problems.push(Problem {
            message: format!(
                "{}: tensor '{}'{what} matches no parameter of {} (mapping '{}')",
                m.file, t.name, self.arch, self.mapping.family
            ),
            fix: Some(
                "rename the tensor, add a rule with --mapping FILE, or check that config.json names the right architecture"
                    .into(),
            ),
            file: Some(m.file.to_string()),
            tensor: Some(t.name.to_string()),
            rule: rule_of(&self.mapping.rules, target),
            ..Default::default()
        });
    }

    /// Why `m` cannot fill its slot of `p`: a shard id the layout does not take, a shape other
    /// than the config implies, a dtype that does not convert. `None` when it fits.
    fn misfit(&self, p: &Param, m: &MappedTensor, target: &Target) -> Option<Problem> {
        let (t, file) = (m.tensor, m.file);
        // Text for messages only: most tensors fit and need none.
        let rules = &self.mapping.rules;
        let via_text = || via(rules, target);
        let shard = target.shard.as_ref();
        // What every problem of this tensor names: its file, itself, the parameter and the rule.
        let about = |message: String, fix: &str| Problem {
            message,
            fix: Some(fix.into()),
            file: Some(file.to_string()),
            tensor: Some(t.name.to_string()),
            parameter: Some(p.name.clone()),
            rule: rule_of(rules, target),
            ..Default::default()
        };
        let expected = match p.geometry.expected_source(shard) {
            Ok(s) => s,
            Err(err) => {
                return Some(about(
                    format!(
                        "{file}: tensor '{}' → '{}'{}: {err}",
                        t.name,
                        p.name,
                        via_text()
                    ),
                    "fix the mapping rule's shard id (--mapping FILE)",
                ));
            }
        };
        let shard_text = || shard.map_or(String::new(), |s| format!(" shard {s}"));
        let scalar_ok = expected.is_empty() && t.shape.iter().product::<u64>() == 1;
        if t.shape[..] != expected[..] && !scalar_ok {
            return Some(Problem {
                shape: Some(t.shape.to_vec()),
                expected_shape: Some(expected.to_vec()),
                ..about(
                    format!(
                        "{file}: tensor '{}' has shape {:?}, but '{}'{}{} expects {expected:?}",
                        t.name,
                        t.shape,
                        p.name,
                        shard_text(),
                        via_text()
                    ),
                    "check config.json's dimensions (override with --hf-overrides) or that the checkpoint matches this model",
                )
            });
        }
        // An FP8 tensor vLLM dequantizes to BF16 while loading, then copies into the parameter.
        let dequantized = self.dequantized_weight(t) && convertible(Dtype::Bf16, p.dtype);
        if !convertible(t.dtype, p.dtype) && !shape_cast(t.dtype, p.dtype, &p.name) && !dequantized
        {
            return Some(about(
                format!(
                    "{file}: tensor '{}' is {}, which cannot be converted to {} for '{}'",
                    t.name, t.dtype, p.dtype, p.name
                ),
                self.dtype_fix(t.dtype, p.dtype),
            ));
        }
        None
    }

    /// What to do about a checkpoint tensor of dtype `t` that cannot fill a parameter of `p`.
    fn dtype_fix(&self, _t: Dtype, p: Dtype) -> &'static str {
        if p == Dtype::F8E4M3 {
            "quantization_config says this layer is FP8, but the checkpoint stores it otherwise: list the module in the config's ignored_layers / modules_to_not_convert (fp8) or ignore (compressed-tensors)"
        } else {
            "a quantized tensor needs its quantization_config in config.json (FP8 is supported); otherwise use the unquantized checkpoint"
        }
    }

    /// A tensor `m` that fits into its slot of `p` (index `pi`), unless the slot is filled
    /// already; `read` lists the tensors read so far (a slot's feed is its index there).
    fn fill<'t, 'c>(
        &mut self,
        p: &Param,
        pi: usize,
        (m, target): (&'t MappedTensor<'c>, &Target),
        rotary_heads: Option<u64>,
        (a, pairs): (&mut Assigned, &Pairs<'t, 'c>),
        read: &mut Vec<&'t MappedTensor<'c>>,
    ) {
        let scale = if self.dequantized_weight(m.tensor) {
            match self.scale_of(pairs, m) {
                Ok(scale) => Some(scale),
                Err(message) => {
                    let problem = self.dequant_problem(m, &p.name, message);
                    self.problems.push(problem);
                    a.present.insert((pi, target.slot()));
                    return;
                }
            }
        } else {
            None
        };
        let feed = Feed {
            source: read.len(),
            rotary_heads,
            // Read right after the weight.
            dequant: scale.map(|_| read.len() + 1),
        };
        if let Err(prev) = a.fed[pi].fill(target.slot(), feed) {
            let shard_text = target
                .shard
                .as_ref()
                .map_or(String::new(), |s| format!(" shard {s}"));
            let rules = &self.mapping.rules;
            // Names the second of the two: the first is in the plan already.
            self.problems.push(Problem {
                message: format!(
                    "'{}'{shard_text}: filled twice, by '{}' and '{}'",
                    p.name, read[prev.source].tensor.name, m.tensor.name
                ),
                fix: Some("remove one of the two tensors from the checkpoint".into()),
                file: Some(m.file.to_string()),
                tensor: Some(m.tensor.name.to_string()),
                parameter: Some(p.name.clone()),
                rule: rule_of(rules, target),
                ..Default::default()
            });
            a.present.insert((pi, target.slot()));
            return;
        }
        read.push(m);
        read.extend(scale);
    }

    /// The layer index of a `model.layers.{i}.` tensor the mapping's `skip_layer` excludes.
    fn skipped_layer(&self, name: &str) -> Option<u64> {
        let rule = self.mapping.skip_layer.as_ref()?;
        let rest = name.strip_prefix("model.layers.")?;
        let i: u64 = rest.split('.').next()?.parse().ok()?;
        rule.eval_bool(&self.env.scope(Some(i)))
            .unwrap_or(false)
            .then_some(i)
    }

    /// The head count of a rotary permutation; a count that does not evaluate means none (the
    /// rows are then copied as they are).
    fn rotary_heads(&self, target: &Target) -> Option<u64> {
        match target.conversion.as_deref() {
            Some(Conversion::RotaryPermute { heads }) => Expr::parse(heads)
                .ok()?
                .eval_u64(&self.env.scope(None))
                .ok(),
            None => None,
        }
    }
}

/// ` (via rule, rule)` for messages; empty when no rule changed the name.
fn via(rules: &crate::mapping::rules::Rules, target: &Target) -> String {
    rule_of(rules, target).map_or(String::new(), |r| format!(" (via {r})"))
}

/// The rules that renamed a tensor to `target`, in order; `None` when its name was kept.
fn rule_of(rules: &crate::mapping::rules::Rules, target: &Target) -> Option<String> {
    let steps: Vec<String> = target.via.iter().map(|s| rules.describe(s)).collect();
    (!steps.is_empty()).then(|| steps.join(", "))
}

fn source_of(t: &TensorInfo, file: std::sync::Arc<str>) -> SourceTensor {
    SourceTensor {
        name: t.name.clone(),
        file,
        file_index: t.file,
        offset: t.offset,
        dtype: t.dtype,
        shape: t.shape.as_slice().into(),
    }
}
