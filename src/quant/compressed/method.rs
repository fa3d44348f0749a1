//! compressed-tensors as a [`Method`]: one config, dispatched to its scheme's parameters — FP8's
//! (`quant/fp8/params.rs`), `wna16.rs`, `int8.rs`, NVFP4's (`quant/nvfp4.rs` with `nvfp4.rs`'s
//! names) — and its kv-cache scales (`kv_cache.rs` for `attn_head`).

use super::super::cx::{Cx, Weight};
use super::super::extra::{Extra, experts_module};
use super::super::fp8::params::{self as fp8_params, Scales};
use super::super::info::{QuantInfo, activations};
use super::super::moe_backend::MoeBackend;
use super::super::nvfp4::{self, Nvfp4Method};
use super::super::{Method, describe_line, moe_backend_unused, skipped_exactly};
use super::{Compressed, KvCacheStrategy, Nvfp4, Scheme, WeightStrategy, int8, kv_cache, wna16};
use crate::dtype::Dtype;
use crate::layout::{Experts, Geometry};
use crate::mapping::ExpertPart;
use crate::problem::Problem;

impl Compressed {
    /// Whether the experts module `module` is quantized: not in `ignore`.
    fn experts_quantized(&self, module: &str) -> bool {
        !self.ignores(module).unwrap_or(true)
    }

    fn nvfp4(n: &Nvfp4) -> Nvfp4Method {
        Nvfp4Method::new(&super::nvfp4::COMPRESSED, n.activations, Nvfp4::GROUP)
    }
}

impl Method for Compressed {
    fn name(&self) -> &'static str {
        "compressed-tensors"
    }

    fn describe(&self) -> String {
        describe_line(
            self.name(),
            &self.describe_scheme(),
            self.static_input(),
            self.ignore.len(),
        )
    }

    fn supports(&self, _dtype: Dtype) -> Result<(), String> {
        Ok(())
    }

    fn name_rules(&self) -> Vec<(&'static str, Option<&'static str>)> {
        match self.kv_cache {
            // The attn_head loader returns before reading a zero point, whatever its shape
            // (compressed_tensors.py:1196–1198): the parameter keeps its zeros.
            Some(KvCacheStrategy::AttnHead) => vec![(r"\.attn\.[qkv]_zero_point$", None)],
            _ => Vec::new(),
        }
    }

    /// W4A16 / W8A16 and NVFP4: packed rows and per-part global scales cut per shard as the
    /// weight (checked against vLLM on a Qwen3.5-MoE W4A16 checkpoint); FP8 block / INT8 not.
    fn plans_tuple_columns(&self) -> bool {
        matches!(self.scheme, Scheme::Wna16(_) | Scheme::Nvfp4(_))
    }

    fn linear_quantized(
        &self,
        module: &str,
        shards: &[String],
    ) -> Result<bool, (String, &'static str)> {
        skipped_exactly(module, shards, |n| self.ignores(n)).map(|s| !s)
    }

    fn linear(&self, w: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        match &self.scheme {
            Scheme::Wna16(s) => wna16::linear(s, w, cx),
            Scheme::Int8(i) => int8::linear(i, w),
            Scheme::Nvfp4(n) => nvfp4::linear(Self::nvfp4(n), w, cx),
            Scheme::Fp8(f) => {
                let channel = f.weights == WeightStrategy::Channel && !f.static_activations;
                if matches!(w.geometry, Geometry::MambaSplit(_)) && !channel {
                    cx.problems.push(Problem {
                        message: format!(
                            "{}: compressed-tensors FP8 with {} weights{} on a Mamba2 in_proj is not supported (wload writes channel scales with dynamic activations there, whose rows follow the weight's)",
                            w.name,
                            self.describe_scheme(),
                            if f.static_activations { " and static activations" } else { "" }
                        ),
                        fix: Some("use a channel-scaled, dynamic-activation FP8 release or the bf16 checkpoint".into()),
                        ..Default::default()
                    });
                    return None;
                }
                let scales = match f.weights {
                    WeightStrategy::Tensor => Scales::Tensor,
                    WeightStrategy::Channel => Scales::Channel,
                    WeightStrategy::Block(block) => Scales::Block("weight_scale", block),
                };
                fp8_params::linear(w, scales, f.static_activations)
            }
        }
    }

    /// NVFP4 experts take the names vLLM takes for them (their input scales are the rank's own
    /// on every backend); the other schemes' experts are the same on every backend.
    fn moe_backend(&self, b: MoeBackend) -> Result<(), (String, String)> {
        match self.scheme {
            Scheme::Nvfp4(_) => nvfp4::moe_backend(b),
            _ => Err(moe_backend_unused(b)),
        }
    }

    fn experts(&self, w: Weight<'_>, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        let module = experts_module(w.name)?.to_string();
        let module = module.as_str();
        match &self.scheme {
            Scheme::Wna16(s) => {
                let quantized = self.experts_quantized(module);
                wna16::experts(s, w, cx, module, quantized)
            }
            Scheme::Nvfp4(n) => self
                .experts_quantized(module)
                .then(|| nvfp4::experts(Self::nvfp4(n), w, cx))
                .flatten(),
            // An ignored MoE stays unquantized (UnquantizedFusedMoEMethod,
            // compressed_tensors_moe.py:57–58): Granite 4's FP8 releases keep their experts BF16.
            Scheme::Fp8(_) | Scheme::Int8(_) if !self.experts_quantized(module) => None,
            Scheme::Fp8(_) | Scheme::Int8(_) => {
                let w13 = matches!(
                    w.geometry,
                    Geometry::Experts(Experts {
                        part: ExpertPart::W13,
                        ..
                    })
                );
                if w13 {
                    cx.problems.push(Problem {
                        message: format!(
                            "{module}: compressed-tensors {} experts are not supported yet (wload writes pack-quantized W4A16 / W8A16 and NVFP4 experts)",
                            self.describe_scheme()
                        ),
                        fix: Some("use the checkpoint's bf16 or `quant_method: fp8` release".into()),
                        ..Default::default()
                    });
                }
                None
            }
        }
    }

    fn kv_cache(&self, attention: &str, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
        if self.kv_cache == Some(KvCacheStrategy::AttnHead) {
            return kv_cache::head_scales(attention, cx);
        }
        // CompressedTensorsKVCacheMethod: F32 [1] ones, then model-dtype [1] zero points.
        let scalar = |n: &str, dtype, fill| Extra::kv_scalar(attention, n, vec![1], dtype, fill);
        Some(
            ["k_scale", "v_scale", "q_scale"]
                .map(|n| scalar(n, Dtype::F32, 1.0))
                .into_iter()
                .chain(
                    ["k_zero_point", "v_zero_point", "q_zero_point"]
                        .map(|n| scalar(n, cx.model_dtype, 0.0)),
                )
                .collect(),
        )
    }

    fn inspect(&self) -> QuantInfo {
        let mut info = QuantInfo {
            activation_scheme: self.static_input().and_then(activations),
            ..QuantInfo::of(self.name())
        };
        scheme_info(&mut info, self);
        info.ignored = self.ignore.clone();
        info
    }
}

/// A compressed-tensors scheme's fields.
fn scheme_info(info: &mut QuantInfo, c: &Compressed) {
    match &c.scheme {
        Scheme::Fp8(f) => {
            let (scheme, block) = match f.weights {
                WeightStrategy::Tensor => ("per-tensor", None),
                WeightStrategy::Channel => ("per-channel", None),
                WeightStrategy::Block(b) => ("block", Some(b)),
            };
            info.scheme = Some(scheme);
            info.weight_block_size = block;
        }
        Scheme::Wna16(w) => {
            info.scheme = Some(if w.group.is_some() {
                "group"
            } else {
                "per-channel"
            });
            info.bits = Some(w.bits);
            info.group_size = w.group;
            info.symmetric = Some(w.symmetric);
            info.weights = Some(format!(
                "{} (weight_packed, weight_scale, weight_shape{})",
                w.describe(),
                if w.symmetric {
                    ""
                } else {
                    ", weight_zero_point"
                }
            ));
        }
        Scheme::Int8(i) => {
            info.scheme = Some(if i.channel {
                "per-channel"
            } else {
                "per-tensor"
            });
            info.bits = Some(8);
            info.symmetric = Some(true);
            info.weights = Some(format!("{} (weight I8, weight_scale F32)", i.describe()));
        }
        Scheme::Nvfp4(n) => {
            (info.scheme, info.bits, info.group_size) =
                (Some("group"), Some(4), Some(Nvfp4::GROUP));
            info.symmetric = Some(true);
            info.weights = Some("NVFP4: E2M1 packed two a byte (weight_packed U8), an F8_E4M3 scale per 16 elements (weight_scale) and an F32 global scale per part (weight_global_scale)".into());
            // W4A4 quantizes activations per group at run time, from a static global scale.
            info.activation_scheme = Some(if n.activations { "nvfp4" } else { "none" }.into());
        }
    }
    info.kv_cache_scheme = c.kv_cache.map(|k| match k {
        KvCacheStrategy::Tensor => "tensor",
        KvCacheStrategy::AttnHead => "attn_head",
    });
}
