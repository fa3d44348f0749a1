//! The model's variables: what mapping expressions see — the config, the mapping's defaults
//! where the config is silent, `tp`, `pp`, `ep`, the multimodal flags, then the derived values — and the mapping's
//! checks on them. The planner's environment phase, and what `inspect` and `sizes` read of a
//! model without planning it: it sits below both, and knows nothing of plans.

use std::collections::HashMap;
use std::path::Path;

use serde_json::Value;

use crate::config::{ConfigAlias, ModelConfig};
use crate::mapping::expr::{self, EvalError, Scope};
use crate::mapping::{CheckBy, Mapping};
use crate::multimodal::Multimodal;
use crate::quant::Quantization;
use crate::ranks::World;

const ADD_FIELD: &str = "add the field to config.json or pass it with --hf-overrides";

/// What the expressions see of the run's layout: `tp` and `pp` (the world), `ep`, and vLLM's
/// multimodal flags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Parallel {
    pub world: World,
    pub expert_parallel: bool,
    /// `language_model_only` and `mm_encoder_tp_mode` (`'weights'`, `'data'`).
    pub multimodal: Multimodal,
    /// `VLLM_REPLICATE_EMBED` on: the expressions' `replicate_embed`.
    pub replicate_embed: bool,
}

/// Something wrong with the variables or the config: a derived value that cannot be computed, a
/// mapping check that fails. The planner reports it as a problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnvProblem {
    pub message: String,
    pub fix: Option<String>,
}

/// How a refusal of a `by: wload` check ends: wload cannot do it, vLLM would.
pub(crate) const WLOAD_LIMIT: &str = "(wload's limit, not vLLM's)";

/// Variables visible to mapping expressions: derived values, then defaults-filled config, then
/// `tp`, `ep` and (inside layers) `i`.
pub(crate) struct Env {
    vars: HashMap<String, Value>,
    /// The config class's attribute aliases: a missing field's error names both spellings.
    aliases: &'static [ConfigAlias],
    /// The keys config.json states, before defaults (for `given('field')`).
    given: std::collections::HashSet<String>,
    /// The mapping file, as a fix that corrects an expression names it.
    mapping_file: String,
}

impl Env {
    /// Fills the variables; a derived value that cannot be computed is a problem (and stays
    /// unset). `mapping_file` is the `--mapping FILE` (none: the built-in mapping), named by the
    /// fixes of expressions that fail.
    pub(crate) fn new(
        mapping: &Mapping,
        config: &ModelConfig,
        parallel: Parallel,
        mapping_file: Option<&Path>,
    ) -> (Env, Vec<EnvProblem>) {
        let mut problems = Vec::new();
        let mut vars: HashMap<String, Value> = config.raw.clone().into_iter().collect();
        let given = vars.keys().cloned().collect();
        // A default stands in for a field config.json leaves out; an explicit `null` stays, as
        // transformers keeps None (its `__post_init__` may then fill it: the mapping's `??`).
        for (k, v) in &mapping.defaults {
            vars.entry(k.clone()).or_insert_with(|| v.clone());
        }
        vars.insert("tp".into(), Value::from(parallel.world.tp));
        vars.insert("ep".into(), Value::Bool(parallel.expert_parallel));
        vars.insert("pp".into(), Value::from(parallel.world.pp));
        if let Some(v) = &config.vision_config {
            vars.insert("vision_config".into(), v.clone());
        }
        vars.insert("hf_config".into(), config.hf_config.clone());
        vars.insert(
            "replicate_embed".into(),
            Value::Bool(parallel.replicate_embed),
        );
        // vLLM's CUDA rule for layers too narrow for Marlin (`Method::marlin_int_config`).
        let marlin = Quantization::for_model(
            config.quantization_config.as_ref(),
            config.model_type.as_deref(),
        );
        let marlin = marlin.ok().flatten().is_some_and(|q| q.marlin_int_config());
        vars.insert("quant_marlin_int".into(), Value::Bool(marlin));
        let mm = parallel.multimodal;
        vars.insert(
            "language_model_only".into(),
            Value::Bool(mm.language_model_only),
        );
        vars.insert(
            "mm_encoder_tp_mode".into(),
            Value::from(mm.mm_encoder_tp_mode.as_str()),
        );
        let mapping_file = match mapping_file {
            Some(path) => path.display().to_string(),
            None => format!(
                "the built-in mapping mappings/{}.yaml (with a copy passed as --mapping FILE)",
                mapping.family
            ),
        };
        let mut env = Env {
            vars,
            aliases: config.aliases,
            given,
            mapping_file,
        };
        for (k, e) in &mapping.derive {
            let value = e.eval(&env.scope(None));
            match value {
                Ok(v) => {
                    env.vars.insert(k.clone(), v);
                }
                Err(err) => problems.push(EnvProblem {
                    message: format!("cannot compute {k} = `{e}`: {err}"),
                    fix: Some(env.fix_for(&err, ADD_FIELD)),
                }),
            }
        }
        (env, problems)
    }

    /// The mapping's checks (vLLM's asserts on the config and TP size): those that fail or
    /// cannot be evaluated. When there are any, the geometry is not worth checking per rank.
    pub(crate) fn check(&self, mapping: &Mapping) -> Vec<EnvProblem> {
        let mut problems = Vec::new();
        for c in &mapping.checks {
            match c.rule.eval_bool(&self.scope(None)) {
                Ok(true) => {}
                Ok(false) => problems.push(EnvProblem {
                    message: match c.by {
                        CheckBy::Vllm => {
                            format!("{} (vLLM requires `{}`)", self.fill(&c.message), c.rule)
                        }
                        CheckBy::Wload => format!("{} {WLOAD_LIMIT}", self.fill(&c.message)),
                    },
                    fix: c.fix.as_ref().map(|f| self.fill(f)),
                }),
                Err(err) => problems.push(EnvProblem {
                    message: format!("cannot check `{}`: {err}", c.rule),
                    fix: Some(self.fix_for(&err, ADD_FIELD)),
                }),
            }
        }
        problems
    }

    /// The fix for an expression that failed with `err`: for a variable nothing defines, whether
    /// it looks like a typo in the mapping file; else `otherwise`.
    pub(crate) fn fix_for(&self, err: &EvalError, otherwise: &str) -> String {
        match err.missing_variable() {
            Some(name) => {
                let known = self.vars.keys().map(String::as_str).chain(["i"]);
                expr::unknown_variable_fix(name, known, &self.mapping_file)
            }
            None => otherwise.to_string(),
        }
    }

    /// The variables, plus `i` inside layer `i`.
    pub(crate) fn scope(&self, i: Option<u64>) -> EnvScope<'_> {
        EnvScope {
            env: self,
            i,
            j: None,
        }
    }

    /// The variables, plus `j` inside instance `j` of a repeated head or tail module.
    pub(crate) fn scope_repeated(&self, j: u64) -> EnvScope<'_> {
        EnvScope {
            env: self,
            i: None,
            j: Some(j),
        }
    }

    /// Whether `name` is the boolean `true`.
    pub(crate) fn is_true(&self, name: &str) -> bool {
        self.vars.get(name) == Some(&Value::Bool(true))
    }

    /// `{field}` in a message replaced by its value.
    pub(crate) fn fill(&self, template: &str) -> String {
        let mut out = String::new();
        let mut rest = template;
        while let Some(a) = rest.find('{') {
            let Some(b) = rest[a..].find('}') else {
                break;
            };
            out.push_str(&rest[..a]);
            let key = &rest[a + 1..a + b];
            // Through the scope: `{vision_config.num_heads}` reads a nested field.
            match self.scope(None).get(key) {
                Some(Value::String(s)) => out.push_str(&s),
                Some(v) => out.push_str(&v.to_string()),
                None => out.push_str(&rest[a..=a + b]),
            }
            rest = &rest[a + b + 1..];
        }
        out.push_str(rest);
        out
    }
}

/// What an expression sees: the environment, and `i` inside layer `i`.
pub(crate) struct EnvScope<'a> {
    env: &'a Env,
    i: Option<u64>,
    j: Option<u64>,
}

impl Scope for EnvScope<'_> {
    fn get(&self, k: &str) -> Option<Value> {
        match (k, self.i, self.j) {
            ("i", Some(i), _) => Some(Value::from(i)),
            ("j", _, Some(j)) => Some(Value::from(j)),
            _ => match k.split_once('.') {
                // `vision_config.depth`: a field of a nested config object.
                Some((top, path)) => path
                    .split('.')
                    .try_fold(self.env.vars.get(top)?, |v, f| v.get(f))
                    .cloned(),
                None => self.env.vars.get(k).cloned(),
            },
        }
    }

    fn other_spelling(&self, name: &str) -> Option<&'static str> {
        crate::config::aliases::other_spelling(self.env.aliases, name)
    }

    fn given(&self, name: &str) -> Option<bool> {
        Some(self.env.given.contains(name))
    }
}

/// The variables the planner's expressions see for a model at `--tp 1` (config, the mapping's
/// defaults, its derived values), for describing the model as `plan` reads it without planning
/// it: `inspect`'s structure section. A derived value that cannot be computed stays unset, as in
/// the planner, which reports it.
pub(crate) struct Variables {
    env: Env,
    derived: std::collections::HashSet<String>,
}

impl Variables {
    /// Without a mapping (an architecture wload has none for), only the config's fields.
    pub(crate) fn new(
        mapping: Option<&Mapping>,
        config: &ModelConfig,
        mapping_file: Option<&Path>,
    ) -> Variables {
        let Some(mapping) = mapping else {
            let vars: HashMap<String, Value> = config.raw.clone().into_iter().collect();
            return Variables {
                env: Env {
                    given: vars.keys().cloned().collect(),
                    vars,
                    aliases: config.aliases,
                    mapping_file: String::new(),
                },
                derived: Default::default(),
            };
        };
        let parallel = Parallel {
            world: World::tp(1),
            expert_parallel: false,
            multimodal: Multimodal::default(),
            replicate_embed: false,
        };
        Variables {
            env: Env::new(mapping, config, parallel, mapping_file).0,
            derived: mapping.derive.keys().cloned().collect(),
        }
    }

    /// The value of `name` (a config field, a default, `tp`/`ep` or a derived value).
    pub(crate) fn get(&self, name: &str) -> Option<&Value> {
        self.env.vars.get(name)
    }

    /// Whether `name` is one of the mapping's derived values rather than a config field.
    pub(crate) fn is_derived(&self, name: &str) -> bool {
        self.derived.contains(name)
    }

    /// `e` evaluated over the variables, with `i` set inside layer `i`.
    pub(crate) fn eval(&self, e: &expr::Expr, i: Option<u64>) -> Result<Value, EvalError> {
        e.eval(&self.env.scope(i))
    }

    pub(crate) fn eval_u64(&self, e: &expr::Expr, i: Option<u64>) -> Result<u64, EvalError> {
        e.eval_u64(&self.env.scope(i))
    }

    pub(crate) fn eval_bool(&self, e: &expr::Expr, i: Option<u64>) -> Result<bool, EvalError> {
        e.eval_bool(&self.env.scope(i))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(vars: &[(&str, Value)]) -> Env {
        Env {
            vars: vars
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            aliases: &[],
            given: vars.iter().map(|(k, _)| k.to_string()).collect(),
            mapping_file: "m.yaml".into(),
        }
    }

    #[test]
    fn message_fields_are_filled_and_unknown_ones_kept() {
        let e = env(&[("n", Value::from(7)), ("s", Value::from("x"))]);
        assert_eq!(e.fill("n={n} s={s} m={m}"), "n=7 s=x m={m}");
        // An unclosed brace is text (it used to repeat what came before it).
        assert_eq!(e.fill("open {n"), "open {n");
    }

    #[test]
    fn i_is_visible_only_inside_a_layer() {
        let e = env(&[("i", Value::from(9))]);
        assert_eq!(e.scope(Some(3)).get("i"), Some(Value::from(3)));
        assert_eq!(e.scope(None).get("i"), Some(Value::from(9)));
    }
}
