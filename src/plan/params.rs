//! Parameters phase: the mapping's parameter specs instantiated for this config — head, every
//! layer, tail, in state_dict order — with their geometry and dtype evaluated and their ties
//! resolved.

mod place;

use std::hash::BuildHasher;

use hashbrown::HashTable;
use hashbrown::hash_table::Entry;

use super::{MAX_EXPERTS, MAX_LAYERS, MAX_PARAMETERS, PlanError, Planner, Retie};
use crate::dtype::Dtype;
use crate::layout::{Dim, Geometry};
use crate::mapping::expr::{EvalError, Scope};
use crate::mapping::{Expr, Layout, ParamSpec, Tied};
use crate::problem::Problem;
use place::{At, whole};

/// A parameter instance: one spec at one layer index, with its geometry evaluated.
pub(super) struct Param<'m> {
    pub name: String,
    pub spec: &'m ParamSpec,
    pub geometry: Geometry,
    pub dtype: Dtype,
    /// Index of the parameter this one is the same tensor as (tied embeddings).
    pub alias_of: Option<usize>,
    /// The layer of a layer parameter (its pipeline stage is the one holding that layer).
    pub layer: Option<u64>,
    /// Never read from the checkpoint: always `fill` (the spec's `buffer`).
    pub buffer: bool,
    /// The value of a buffer, and of whatever the checkpoint leaves unfilled.
    pub fill: f64,
    /// A checkpoint without it is fine.
    pub optional: bool,
}

/// The instantiated parameters, and the lm_head/embedding tie that the checkpoint leaves to be
/// decided by data.
pub(super) struct Params<'m> {
    pub list: Vec<Param<'m>>,
    pub retie: Option<Retie>,
    /// The model's layer count.
    pub layers: u64,
    /// Where each name first appears, for `tied_to`: indices into `list`, found through their
    /// names, so that no name is copied (a config can claim hundreds of thousands of parameters).
    first_index: HashTable<usize>,
    /// The weights a quantization method renamed (`weight` → `qweight`, `weight_packed`), by
    /// their mapped names, for a `tied_to` naming the weight as the mapping declares it (a
    /// quantized Qwen shared expert under its second path).
    renamed: std::collections::HashMap<String, usize>,
    hasher: foldhash::fast::FixedState,
}

impl<'m> Planner<'m> {
    /// Every parameter the model has; a spec that cannot be instantiated is a problem and left
    /// out. Refuses outright a layer count beyond [`MAX_LAYERS`].
    pub(super) fn parameters(&mut self) -> Result<Params<'m>, PlanError> {
        let layers = self.layer_count()?;
        let mapping = self.mapping;
        let mut params = Params {
            list: Vec::new(),
            retie: None,
            layers,
            first_index: HashTable::new(),
            renamed: Default::default(),
            hasher: foldhash::fast::FixedState::default(),
        };
        let head = self.expand(&mapping.parameters.head)?;
        let tail = self.expand(&mapping.parameters.tail)?;
        let specs = head
            .into_iter()
            .chain((0..layers).flat_map(|i| {
                mapping
                    .parameters
                    .layer
                    .iter()
                    .map(move |s| (s, At::Layer(i)))
            }))
            .chain(tail);
        for (spec, at) in specs {
            if let Some(mut p) = self.instantiate(spec, at, &mut params) {
                // A method that creates a layer's parameters in its own order (MXFP4 experts:
                // weights and scales, then biases) brought this one with the layer's first.
                if self.quant.is_some() && params.find(&p.name).is_some() {
                    continue;
                }
                // A quantized layer's weight changes dtype and brings its scales (quant.rs).
                let declared = p.name.clone();
                let (before, after) = self.quantize(&mut p, &params);
                for q in before {
                    params.add(q);
                }
                if p.name != declared {
                    params.renamed.insert(declared, params.list.len());
                }
                params.add(p);
                for q in after {
                    params.add(q);
                }
            }
        }
        Ok(params)
    }

    /// A head or tail list with its repeated modules written out: each run of consecutive
    /// `repeat` parameters sharing the name before `{j}` is one module, its parameters in order
    /// for `j = 0`, then for `j = 1`, … (vLLM's `ModuleList`, registered module by module).
    fn expand(&mut self, list: &'m [ParamSpec]) -> Result<Vec<(&'m ParamSpec, At)>, PlanError> {
        let module = |s: &ParamSpec| s.name.split_once("{j}").map(|(m, _)| m.to_string());
        let mut out = Vec::new();
        let mut k = 0;
        while k < list.len() {
            let (spec, Some(count)) = (&list[k], &list[k].repeat) else {
                out.push((&list[k], At::Once));
                k += 1;
                continue;
            };
            let end = k + list[k..]
                .iter()
                .take_while(|s| s.repeat.is_some() && module(s) == module(spec))
                .count();
            let n = match count.eval_u64(&self.env.scope(None)) {
                Ok(n) if n <= MAX_LAYERS => n,
                Ok(n) => {
                    self.problems.push(Problem {
                        message: format!(
                            "{}: `repeat: {count}` gives {n} modules; wload plans at most {MAX_LAYERS}",
                            spec.name
                        ),
                        fix: Some("check config.json, or pass the field with --hf-overrides".into()),
                        parameter: Some(spec.name.clone()),
                        ..Default::default()
                    });
                    return Err(self.refusal());
                }
                Err(err) => {
                    self.problems.push(Problem {
                        message: format!("{}: cannot evaluate `repeat: {count}`: {err}", spec.name),
                        fix: Some(self.env.fix_for(
                            &err,
                            "check config.json, or pass the field with --hf-overrides",
                        )),
                        parameter: Some(spec.name.clone()),
                        ..Default::default()
                    });
                    0
                }
            };
            for j in 0..n {
                out.extend(list[k..end].iter().map(|s| (s, At::Repeat(j))));
            }
            k = end;
        }
        Ok(out)
    }

    fn layer_count(&mut self) -> Result<u64, PlanError> {
        let expr = &self.mapping.parameters.layers;
        let layers = match expr.eval_u64(&self.env.scope(None)) {
            Ok(n) => n,
            Err(err) => {
                self.problems.push(Problem {
                    message: format!("cannot count layers `{expr}`: {err}"),
                    fix: None,
                    ..Default::default()
                });
                0
            }
        };
        if layers > MAX_LAYERS {
            self.problems.push(Problem {
                message: format!(
                    "the config gives {layers} layers (`{expr}`); wload plans at most {MAX_LAYERS}"
                ),
                fix: Some("check num_hidden_layers in config.json or --hf-overrides".into()),
                ..Default::default()
            });
            return Err(self.refusal());
        }
        let p = &self.mapping.parameters;
        let total = (layers.checked_mul(p.layer.len() as u64))
            .and_then(|n| n.checked_add((p.head.len() + p.tail.len()) as u64));
        if total.is_none_or(|n| n > MAX_PARAMETERS) {
            self.problems.push(Problem {
                message: format!(
                    "{layers} layers of {} parameters each (`{expr}`) are more than the {MAX_PARAMETERS} \
                     parameters wload plans for a model",
                    p.layer.len()
                ),
                fix: Some(
                    "check num_hidden_layers in config.json or --hf-overrides, and the mapping's \
                     `layer` list"
                        .into(),
                ),
                ..Default::default()
            });
            return Err(self.refusal());
        }
        Ok(layers)
    }

    /// `spec` at its place `at` (a layer, a repeated module's instance, or once), or `None` when
    /// its `when:` is false or it cannot be evaluated (a problem).
    fn instantiate(
        &mut self,
        spec: &'m ParamSpec,
        at: At,
        params: &mut Params<'m>,
    ) -> Option<Param<'m>> {
        let i = at.layer();
        let scope = match at {
            At::Repeat(j) => self.env.scope_repeated(j),
            _ => self.env.scope(i),
        };
        if let Some(w) = &spec.when {
            match w.eval_bool(&scope) {
                Ok(true) => {}
                Ok(false) => return None,
                Err(err) => {
                    self.problems.push(Problem {
                        message: format!("{}: cannot evaluate `when: {w}`: {err}", spec.name),
                        fix: err.missing_variable().map(|_| self.env.fix_for(&err, "")),
                        parameter: Some(at.name(&spec.name)),
                        ..Default::default()
                    });
                    return None;
                }
            }
        }
        let name = at.name(&spec.name);
        let whole = match whole(spec, &name, &scope, &self.env) {
            Ok(w) => w,
            Err(p) => {
                self.problems.push(*p);
                return None;
            }
        };
        let geometry = match evaluate_layout(&spec.layout, &scope) {
            Ok(g) if whole => g.whole(),
            Ok(g) => g,
            Err((text, err)) => {
                let otherwise = "check config.json, or pass the field with --hf-overrides";
                self.problems.push(Problem {
                    message: format!("{name}: {text}"),
                    fix: Some(err.map_or(otherwise.into(), |e| self.env.fix_for(&e, otherwise))),
                    parameter: Some(name.clone()),
                    ..Default::default()
                });
                return None;
            }
        };
        if let Err(values) = geometry.fits() {
            self.problems.push(Problem {
                message: format!(
                    "{name}: its shape ({values}) needs more than 2^56 elements, far past any \
                     real tensor; the sizes overflow"
                ),
                fix: Some("check config.json's dimensions, or --hf-overrides".into()),
                parameter: Some(name.clone()),
                ..Default::default()
            });
            return None;
        }
        let dtype = if spec.dtype == "model" {
            self.model_dtype
        } else {
            match spec.dtype.parse::<Dtype>() {
                Ok(d) => d,
                Err(()) => {
                    self.problems.push(Problem {
                        message: format!("{name}: unknown dtype '{}' in the mapping", spec.dtype),
                        fix: None,
                        parameter: Some(name.clone()),
                        ..Default::default()
                    });
                    return None;
                }
            }
        };
        let tied = spec.tied_to.as_ref().map(|t| (t, t.when.eval_bool(&scope)));
        let alias_of = tied.and_then(|(t, when)| self.tie(&name, t, i, when, params));
        Some(Param {
            name,
            spec,
            geometry,
            dtype,
            alias_of,
            layer: i,
            buffer: spec.buffer,
            fill: spec.fill.unwrap_or(0.0),
            optional: spec.optional,
        })
    }

    /// The parameter `name` is the same tensor as, when its `tied_to` holds. When the checkpoint
    /// ships this tensor too, vLLM builds the two untied, loads both and re-ties them only if they
    /// are equal (config/model.py:1255–1281): that is recorded as the plan's re-tie instead.
    fn tie(
        &mut self,
        name: &str,
        t: &Tied,
        i: Option<u64>,
        when: Result<bool, EvalError>,
        params: &mut Params<'m>,
    ) -> Option<usize> {
        let other = at_layer(&t.param, i);
        match when {
            Ok(true) if self.checkpoint.get(name).is_some() => {
                params.retie = Some(Retie {
                    keep: name.to_string().min(other.clone()),
                    drop: name.to_string().max(other.clone()),
                    compare: [other, name.to_string()],
                });
                None
            }
            Ok(true) => {
                let found = params.find_declared(&other);
                if found.is_none() {
                    self.problems.push(Problem {
                        message: format!(
                            "{name}: tied_to names '{other}', which is not a parameter before it"
                        ),
                        fix: Some("fix the mapping file".into()),
                        parameter: Some(name.to_string()),
                        ..Default::default()
                    });
                }
                found
            }
            Ok(false) => None,
            Err(err) => {
                self.problems.push(Problem {
                    message: format!("{name}: cannot evaluate `tied_to.when: {}`: {err}", t.when),
                    fix: None,
                    parameter: Some(name.to_string()),
                    ..Default::default()
                });
                None
            }
        }
    }
}

impl<'m> Params<'m> {
    fn add(&mut self, p: Param<'m>) {
        let Params {
            list,
            first_index,
            hasher,
            ..
        } = self;
        if let Entry::Vacant(v) = first_index.entry(
            hasher.hash_one(&p.name),
            |&j| list[j].name == p.name,
            |&j| hasher.hash_one(&list[j].name),
        ) {
            v.insert(list.len());
        }
        list.push(p);
    }

    /// The first parameter named `name`, or declared so before its method renamed it.
    fn find_declared(&self, name: &str) -> Option<usize> {
        (self.find(name)).or_else(|| self.renamed.get(name).copied())
    }

    /// The first parameter named `name`.
    pub(super) fn find(&self, name: &str) -> Option<usize> {
        self.first_index
            .find(self.hasher.hash_one(name), |&j| self.list[j].name == name)
            .copied()
    }
}

/// `{i}` in a name replaced by the layer index.
fn at_layer(name: &str, i: Option<u64>) -> String {
    match i {
        Some(i) => name.replace("{i}", &i.to_string()),
        None => name.to_string(),
    }
}

/// A layout's dimensions evaluated, the expert counts bounded by [`MAX_EXPERTS`]; the error
/// names the expression that failed, and keeps why (for its fix).
fn evaluate_layout(l: &Layout, scope: &dyn Scope) -> Result<Geometry, (String, Option<EvalError>)> {
    let evaluated = l.try_map(&mut |e: &Expr, dim| {
        let n = (e.eval_u64(scope)).map_err(|err| (format!("`{e}`: {err}"), Some(err)))?;
        match dim {
            Dim::Experts if n > MAX_EXPERTS => Err((
                format!("`{e}` gives {n} experts; wload plans at most {MAX_EXPERTS} a layer"),
                None,
            )),
            _ => Ok(n),
        }
    })?;
    evaluated.into_geometry().map_err(|m| (m, None))
}
