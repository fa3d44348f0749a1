//! Quantization, inside the parameters phase: a quantized linear or expert weight takes its
//! method's dtype (F8_E4M3, packed I32, I8) and brings the parameters the method creates, and
//! every Attention layer gets
//! the method's kv-cache scale parameters — in vLLM's registration order (`create_weights` of
//! `Fp8LinearMethod`, `Fp8MoEMethod`, `CompressedTensorsW8A8Fp8`, the kv-cache methods), with
//! vLLM's initial values for whatever the checkpoint leaves out.
//!
//! The FP8 methods are here; each other method's parameters are one file beside this one
//! (`gptq.rs`: GPTQ and AWQ, whose packed weight replaces the layer's `weight`), and
//! `linear.rs` reads a linear weight's geometry as the packed and grouped parameters need it.

mod gptq;
mod int8;
mod kv_cache;
mod linear;
mod mxfp4;
mod nvfp4;
mod wna16;

use super::Planner;
use super::params::{Param, Params};
use crate::dtype::Dtype;
use crate::layout::{
    BlockScale, Column, ExpertBlockScale, ExpertTensorScale, Experts, Geometry, MergedColumn,
    MergedTuples, Qkv, Replicated, Row, TensorScale,
};
use crate::mapping::{ExpertPart, QuantRole};
use crate::problem::Problem;
use crate::quant::Quantization;
use crate::quant::compressed::{KvCacheStrategy, Scheme, WeightStrategy};
use nvfp4::Nvfp4Method;

/// `torch.finfo(torch.float32).min`: vLLM's initial value of linear scales, which its
/// post-processing reads as "not loaded".
const F32_MIN: f64 = f32::MIN as f64;

/// A parameter a quantization method adds: name suffix, geometry, dtype, initial value, and
/// whether the checkpoint may leave it out.
struct Extra {
    name: String,
    geometry: Geometry,
    dtype: Dtype,
    fill: f64,
    optional: bool,
    /// Never read from the checkpoint (vLLM's loader ignores it): always `fill`.
    buffer: bool,
}

impl Extra {
    /// A parameter the checkpoint must fill.
    fn required(name: String, geometry: Geometry, dtype: Dtype, fill: f64) -> Extra {
        Extra {
            name,
            geometry,
            dtype,
            fill,
            optional: false,
            buffer: false,
        }
    }
}

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
            QuantRole::Experts => self.experts(&q, p).map(|e| (vec![], e)),
            QuantRole::Attention => self.kv_cache(&q, p, params).map(|e| (e, vec![])),
            QuantRole::None => None,
        };
        let Some((before, after)) = extras else {
            return (vec![], vec![]);
        };
        self.made(p, params, before, after)
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

    /// A linear layer's weight, unless its module is left unquantized: the method's parameters (FP8 here, the others in their files).
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
        let module = module.as_str();
        let block_fp8 = matches!(q, Quantization::Fp8(f) if f.block.is_some());
        if matches!(p.geometry, Geometry::MergedTuples(MergedTuples { .. })) && !block_fp8 {
            // Qwen3.5's in_proj_qkvz: block FP8 is planned (block_scale.rs cuts the tuple's scale);
            // other formats' tuple scales (and in_proj_ba, which vLLM replicates under AWQ/GPTQ on
            // CUDA, qwen_gdn_linear_attn.py:853–869) are not: refused rather than written wrong.
            self.problems.push(Problem {
                message: format!(
                    "{module}: a merged column filled by tuple shards (Qwen3.5's GDN in_proj_qkvz) quantized as {} is not supported by wload yet (block FP8 is)",
                    q.describe()
                ),
                fix: Some("list the module in the quantization config's ignore list if the checkpoint stores it unquantized, or shard an unquantized or block-FP8 checkpoint".into()),
                parameter: Some(p.name.clone()),
                ..Default::default()
            });
            return None;
        }
        if let Some(s) = gptq::IntScheme::of(q) {
            return self.int_linear(s, p);
        }
        if let Quantization::ModelOptNvFp4(m) = q {
            return self.nvfp4_linear(Nvfp4Method::modelopt(m), module, p);
        }
        if let Quantization::Compressed(c) = q {
            match &c.scheme {
                Scheme::Wna16(w) => return self.wna16_linear(w, p, module),
                Scheme::Int8(i) => return int8::linear(i, p, module),
                Scheme::Nvfp4(n) => {
                    return self.nvfp4_linear(Nvfp4Method::compressed(n), module, p);
                }
                Scheme::Fp8(_) => {}
            }
        }
        p.dtype = Dtype::F8E4M3;
        let of = Box::new(p.geometry.clone());
        let per_tensor = |name: &str| {
            let g = Geometry::TensorScale(TensorScale { of: of.clone() });
            Extra::required(format!("{module}.{name}"), g, Dtype::F32, F32_MIN)
        };
        let block_scale = |name: &str, block: [u64; 2]| {
            let g = Geometry::BlockScale(BlockScale {
                of: of.clone(),
                block,
            });
            Extra::required(format!("{module}.{name}"), g, Dtype::F32, F32_MIN)
        };
        let (weight_scale, static_input) = match q {
            Quantization::Fp8(f) => (
                match f.block {
                    Some(block) => block_scale("weight_scale_inv", block),
                    None => per_tensor("weight_scale"),
                },
                f.static_activations,
            ),
            Quantization::Compressed(c) => {
                let Scheme::Fp8(f) = &c.scheme else {
                    return None;
                };
                (
                    match f.weights {
                        WeightStrategy::Tensor => per_tensor("weight_scale"),
                        WeightStrategy::Channel => Extra::required(
                            format!("{module}.weight_scale"),
                            per_channel(&p.geometry)?,
                            Dtype::F32,
                            F32_MIN,
                        ),
                        WeightStrategy::Block(block) => block_scale("weight_scale", block),
                    },
                    f.static_activations,
                )
            }
            // Their parameters are gptq.rs's and nvfp4.rs's (sent there before this).
            // linear_quantized is false for every MXFP4 layer; the others' parameters are
            // gptq.rs's and nvfp4.rs's (sent there before this).
            Quantization::Gptq(_)
            | Quantization::Awq(_)
            | Quantization::ModelOptNvFp4(_)
            | Quantization::GptOssMxfp4(_) => return None,
        };
        let mut out = vec![weight_scale];
        if static_input {
            out.push(per_tensor("input_scale"));
        }
        Some(out)
    }

    /// A fused expert weight, unless its layer is left unquantized: the method's parameters.
    fn experts(&mut self, q: &Quantization, p: &mut Param<'m>) -> Option<Vec<Extra>> {
        if let Quantization::GptOssMxfp4(_) = q {
            return self.mxfp4_experts(p);
        }
        let module = p.name.split_once(".routed_experts.")?.0.to_string();
        let module = module.as_str();
        if let Some(s) = gptq::IntScheme::of(q) {
            return q
                .experts_quantized(module)
                .then(|| self.int_experts(s, p))
                .flatten();
        }
        match q {
            Quantization::Fp8(f) => self.fp8_experts(q, f, module, p),
            Quantization::Gptq(_) | Quantization::Awq(_) | Quantization::GptOssMxfp4(_) => None,
            Quantization::ModelOptNvFp4(m) => q
                .experts_quantized(module)
                .then(|| self.nvfp4_experts(Nvfp4Method::modelopt(m), p))
                .flatten(),
            Quantization::Compressed(c) => match &c.scheme {
                Scheme::Wna16(w) => self.wna16_experts(w, q, p, module),
                Scheme::Nvfp4(n) => q
                    .experts_quantized(module)
                    .then(|| self.nvfp4_experts(Nvfp4Method::compressed(n), p))
                    .flatten(),
                Scheme::Fp8(_) | Scheme::Int8(_) => {
                    let w13 = matches!(
                        p.geometry,
                        Geometry::Experts(Experts {
                            part: ExpertPart::W13,
                            ..
                        })
                    );
                    if w13 {
                        self.problems.push(Problem {
                            message: format!(
                                "{module}: compressed-tensors {} experts are not supported yet (wload writes pack-quantized W4A16 / W8A16 and NVFP4 experts)",
                                c.describe_scheme()
                            ),
                            fix: Some("use the checkpoint's bf16 or `quant_method: fp8` release".into()),
                            ..Default::default()
                        });
                    }
                    None
                }
            },
        }
    }

    /// A fused FP8 expert weight: F8_E4M3; after `w2_weight`, both weights' scales (vLLM
    /// registers `w13_weight`, `w2_weight`, then the scales).
    fn fp8_experts(
        &mut self,
        q: &Quantization,
        fp8: &crate::quant::fp8::Fp8,
        module: &str,
        p: &mut Param<'m>,
    ) -> Option<Vec<Extra>> {
        let Geometry::Experts(Experts {
            part,
            experts,
            intermediate,
            hidden,
        }) = p.geometry
        else {
            return None;
        };
        if !q.experts_quantized(module) {
            return None;
        }
        p.dtype = Dtype::F8E4M3;
        if part == ExpertPart::W13 {
            return None;
        }
        let base = p.name.strip_suffix("w2_weight")?;
        let scale = |part: ExpertPart, name: &str, geometry: Geometry| {
            let name = format!("{base}{}_{name}", part_name(part));
            Extra::required(name, geometry, Dtype::F32, 1.0)
        };
        let parts = [ExpertPart::W13, ExpertPart::W2];
        let mut out: Vec<Extra> = match fp8.block {
            Some(block) => parts
                .map(|part| {
                    let g = Geometry::ExpertBlockScale(ExpertBlockScale {
                        part,
                        experts,
                        dims: [intermediate, hidden],
                        block,
                    });
                    scale(part, "weight_scale_inv", g)
                })
                .into(),
            None => parts
                .map(|part| {
                    let g = Geometry::ExpertTensorScale(ExpertTensorScale {
                        part,
                        experts,
                        input: false,
                    });
                    scale(part, "weight_scale", g)
                })
                .into(),
        };
        if fp8.static_activations {
            out.extend(parts.map(|part| {
                let g = Geometry::ExpertTensorScale(ExpertTensorScale {
                    part,
                    experts,
                    input: true,
                });
                scale(part, "input_scale", g)
            }));
        }
        Some(out)
    }

    /// The kv-cache scale parameters of the Attention layer whose first scale buffer `p` is.
    fn kv_cache(
        &mut self,
        q: &Quantization,
        p: &Param<'m>,
        params: &Params<'m>,
    ) -> Option<Vec<Extra>> {
        let module = module_of(&p.name)?;
        let first = ["q_scale", "k_scale"]
            .iter()
            .all(|s| params.find(&format!("{module}.{s}")).is_none());
        if !first {
            return None;
        }
        let scalar = |name: &str, shape: Vec<u64>, dtype, fill| Extra {
            name: format!("{module}.{name}"),
            geometry: Geometry::Replicated(Replicated { shape }),
            dtype,
            fill,
            optional: true,
            buffer: false,
        };
        let model = self.model_dtype;
        Some(match q {
            // Fp8KVCacheMethod: KVCacheScaleParameter, 0-d in the model dtype, -1 ("not loaded").
            // ModelOptKVCacheMethod is the same BaseKVCacheMethod, whatever kv_cache_quant_algo says.
            Quantization::Fp8(_) | Quantization::ModelOptNvFp4(_) => {
                ["q_scale", "k_scale", "v_scale", "prob_scale"]
                    .map(|n| scalar(n, vec![], model, -1.0))
                    .into()
            }
            Quantization::Compressed(c) if c.kv_cache == Some(KvCacheStrategy::AttnHead) => {
                return self.kv_head_scales(module, params);
            }
            // CompressedTensorsKVCacheMethod: F32 [1] ones, then model-dtype [1] zero points.
            Quantization::Compressed(_) => ["k_scale", "v_scale", "q_scale"]
                .map(|n| scalar(n, vec![1], Dtype::F32, 1.0))
                .into_iter()
                .chain(
                    ["k_zero_point", "v_zero_point", "q_zero_point"]
                        .map(|n| scalar(n, vec![1], model, 0.0)),
                )
                .collect(),
            // No kv-cache method: the Attention layer keeps only its scale buffers.
            Quantization::Gptq(_) | Quantization::Awq(_) => return None,
            // Mxfp4Config.get_quant_method gives Attention no method: no kv-cache scales.
            Quantization::GptOssMxfp4(_) => return None,
        })
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

/// The module a parameter belongs to: its name without the last component.
fn module_of(name: &str) -> Option<&str> {
    name.rsplit_once('.').map(|(m, _)| m)
}

fn part_name(part: ExpertPart) -> &'static str {
    match part {
        ExpertPart::W13 => "w13",
        ExpertPart::W2 => "w2",
    }
}

/// Per-channel scales (`ChannelQuantScaleParameter`, `[out, 1]`): sliced like the weight's rows;
/// a row-parallel layer keeps them whole.
fn per_channel(weight: &Geometry) -> Option<Geometry> {
    Some(match weight {
        Geometry::Qkv(Qkv {
            heads,
            kv_heads,
            head_dim,
            ..
        }) => Geometry::Qkv(Qkv {
            heads: *heads,
            kv_heads: *kv_heads,
            head_dim: *head_dim,
            inner: vec![1],
        }),
        Geometry::MergedColumn(MergedColumn {
            sizes, disable_tp, ..
        }) => Geometry::MergedColumn(MergedColumn {
            sizes: sizes.clone(),
            inner: vec![1],
            disable_tp: *disable_tp,
        }),
        Geometry::Column(Column { shape }) => Geometry::Column(Column {
            shape: vec![*shape.first()?, 1],
        }),
        Geometry::Row(Row { shape }) | Geometry::Replicated(Replicated { shape }) => {
            Geometry::Replicated(Replicated {
                shape: vec![*shape.first()?, 1],
            })
        }
        _ => return None,
    })
}
