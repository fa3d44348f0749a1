//! Quantization, inside the parameters phase: the planner asks the checkpoint's method
//! ([`crate::quant::Method`]) what a linear or expert weight becomes and which parameters come
//! with it, and which kv-cache scales every Attention layer gets. The method decides; this file
//! only finds which role a parameter has, gives the method its context ([`Cx`]) and turns what
//! it adds into parameters beside the weight.

use super::Planner;
use super::params::{Param, Params};
use crate::layout::{Geometry, MergedTuples, Qkv};
use crate::mapping::QuantRole;
use crate::problem::Problem;
use crate::quant::Quantization;
use crate::quant::cx::{Cx, Weight};
use crate::quant::extra::Extra;

impl<'m> Planner<'m> {
    /// What quantization does to `p`: parameters to add before it and after it.
    pub(super) fn quantize(
        &mut self,
        p: &mut Param<'m>,
        params: &Params<'m>,
    ) -> (Vec<Param<'m>>, Vec<Param<'m>>) {
        let Some(q) = self.quant.clone() else {
            return (vec![], vec![]);
        };
        // A tied parameter is the partner's module under a second name: quantized as it is.
        let partner_quantized = p.alias_of.map(|a| !params.list[a].dtype.is_float());
        let extras = match p.spec.quant_role() {
            QuantRole::Linear => self.linear(&q, p, partner_quantized).map(|e| (vec![], e)),
            QuantRole::Experts => {
                let (w, mut cx) = self.cx(p, &no_heads);
                let made = q.experts(w, &mut cx);
                self.quantized_experts |= made.is_some();
                made.map(|e| (vec![], e))
            }
            QuantRole::Attention => self.kv_cache(&q, p, params).map(|e| (e, vec![])),
            QuantRole::None => None,
        };
        let Some((before, after)) = extras else {
            return (vec![], vec![]);
        };
        self.made(p, params, before, after)
    }

    /// What a method plans with for the weight `p`: `p` itself, and the context.
    fn cx<'a>(
        &'a mut self,
        p: &'a mut Param<'m>,
        qkv_heads: &'a dyn Fn(&str) -> Option<(u64, u64)>,
    ) -> (Weight<'a>, Cx<'a>) {
        let weight = Weight {
            name: &mut p.name,
            geometry: &mut p.geometry,
            dtype: &mut p.dtype,
        };
        let cx = Cx {
            tp: self.opts.tp,
            ep: self.opts.expert_parallel,
            moe_backend: self.opts.moe_backend,
            model_dtype: self.model_dtype,
            problems: &mut self.problems,
            qkv_heads,
        };
        (weight, cx)
    }

    /// The parameters `before` and `after` as instances beside `p`.
    fn made(
        &self,
        p: &Param<'m>,
        params: &Params<'m>,
        before: Vec<Extra>,
        after: Vec<Extra>,
    ) -> (Vec<Param<'m>>, Vec<Param<'m>>) {
        let make = |e: Extra| {
            // A scale of a tied weight is tied to the partner's scale of the same name.
            let alias_of = p.alias_of.and_then(|a| {
                let partner = &params.list[a].name;
                let base = module_of(partner).unwrap_or(partner);
                let own = module_of(&p.name).unwrap_or(&p.name);
                params.find(&e.name.replacen(own, base, 1))
            });
            Param {
                name: e.name,
                spec: p.spec,
                geometry: e.geometry,
                dtype: e.dtype,
                alias_of,
                layer: p.layer,
                buffer: e.buffer,
                fill: e.fill,
                optional: e.optional,
            }
        };
        (
            before.into_iter().map(make).collect(),
            after.into_iter().map(make).collect(),
        )
    }

    /// Whether the linear layer whose weight is `p` is quantized (a tied weight: as its
    /// partner is); a fused layer vLLM refuses is a problem, and not quantized.
    fn linear_quantized(
        &mut self,
        q: &Quantization,
        p: &Param<'m>,
        partner_quantized: Option<bool>,
    ) -> bool {
        let Some(module) = p.name.strip_suffix(".weight") else {
            return false;
        };
        let quantized = match partner_quantized {
            Some(b) => Ok(b),
            None => {
                let built = self.mapping.rules.built_module(module);
                q.linear_quantized(&built, &self.fused_shards(&built))
            }
        };
        quantized.unwrap_or_else(|(message, fix)| {
            self.problems.push(Problem {
                message: format!("{module}: {message}"),
                fix: Some(fix.into()),
                ..Default::default()
            });
            false
        })
    }

    /// A linear layer's weight, unless its module is left unquantized: the method's parameters.
    fn linear(
        &mut self,
        q: &Quantization,
        p: &mut Param<'m>,
        partner_quantized: Option<bool>,
    ) -> Option<Vec<Extra>> {
        let module = p.name.strip_suffix(".weight")?.to_string();
        if !self.linear_quantized(q, p, partner_quantized) {
            return None;
        }
        if matches!(p.geometry, Geometry::MergedTuples(MergedTuples { .. }))
            && !q.plans_tuple_columns()
        {
            // Qwen3.5's in_proj_qkvz: block FP8, AWQ, GPTQ, ModelOpt NVFP4 and compressed-tensors
            // W4A16 / NVFP4 are planned (each shard cut by itself, a tuple's per-tensor scale in
            // each of its slots); the others are not checked against vLLM: refused rather than
            // written wrong.
            self.problems.push(Problem {
                message: format!(
                    "{module}: a merged column filled by tuple shards (Qwen3.5's GDN in_proj_qkvz) quantized as {} is not supported by wload yet (block FP8, AWQ, GPTQ, NVFP4 and compressed-tensors W4A16 are)",
                    q.describe()
                ),
                fix: Some("list the module in the quantization config's ignore list if the checkpoint stores it unquantized, or shard an unquantized, block-FP8, AWQ, GPTQ, NVFP4 or W4A16 checkpoint".into()),
                parameter: Some(p.name.clone()),
                ..Default::default()
            });
            return None;
        }
        let (w, mut cx) = self.cx(p, &no_heads);
        q.linear(w, &mut cx)
    }

    /// The kv-cache scale parameters of the Attention layer whose first scale buffer `p` is.
    fn kv_cache(
        &mut self,
        q: &Quantization,
        p: &mut Param<'m>,
        params: &Params<'m>,
    ) -> Option<Vec<Extra>> {
        let module = module_of(&p.name)?.to_string();
        let first = ["q_scale", "k_scale"]
            .iter()
            .all(|s| params.find(&format!("{module}.{s}")).is_none());
        if !first {
            return None;
        }
        let heads = |attention: &str| params.qkv_heads(attention);
        let (_, mut cx) = self.cx(p, &heads);
        q.kv_cache(&module, &mut cx)
    }

    /// The checkpoint names of a fused module's parts (vLLM's `packed_modules_mapping`), from
    /// the mapping's stacked rules: `qkv_proj` → `q_proj`, `k_proj`, `v_proj`.
    fn fused_shards(&self, module: &str) -> Vec<String> {
        let last = |s: &str| s.rsplit('.').next().unwrap_or(s).to_string();
        let proj = last(module);
        let mut shards: Vec<String> = self
            .mapping
            .rules
            .stacked
            .iter()
            .filter(|r| last(&r.to) == proj)
            .map(|r| last(&r.from))
            .collect();
        shards.dedup();
        shards
    }
}

impl Params<'_> {
    /// The query and kv head counts of the qkv layer beside the Attention layer `attention`:
    /// the latest sibling weight with that layout.
    fn qkv_heads(&self, attention: &str) -> Option<(u64, u64)> {
        let parent = attention.rsplit_once('.').map_or("", |(m, _)| m);
        self.list.iter().rev().find_map(|p| match p.geometry {
            Geometry::Qkv(Qkv {
                heads, kv_heads, ..
            }) if p.name.starts_with(parent) && p.name[parent.len()..].starts_with('.') => {
                Some((heads, kv_heads))
            }
            _ => None,
        })
    }
}

/// For a weight: no Attention layer's heads are asked for.
fn no_heads(_: &str) -> Option<(u64, u64)> {
    None
}

/// The module a parameter belongs to: its name without the last component.
fn module_of(name: &str) -> Option<&str> {
    name.rsplit_once('.').map(|(m, _)| m)
}
