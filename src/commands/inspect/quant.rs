//! `inspect`'s quantization section: what `quantization_config` says, read as `plan`, `shard`
//! and `load` read it, and for a scheme wload refuses, what could be read of it and why.

use serde::Serialize;
use serde_json::Value;

use crate::quant::Quantization;
use crate::quant::compressed::WeightStrategy;

/// A checkpoint's quantization as `inspect` describes it: for a scheme wload refuses, what could be
/// read of it and why it is refused (`plan`, `shard` and `load` stop there; `inspect` does not).
#[derive(Debug, Serialize)]
pub struct QuantInfo {
    /// `quant_method` as written; `None` when absent.
    pub method: Option<String>,
    /// How FP8 weights are scaled: "per-tensor", "per-channel" or "block"; `None` when refused.
    pub scheme: Option<&'static str>,
    pub weight_block_size: Option<[u64; 2]>,
    /// "static" (an `input_scale` per linear layer) or "dynamic".
    pub activation_scheme: Option<String>,
    /// Modules (or compressed-tensors `re:` patterns) left unquantized.
    pub ignored: Vec<String>,
    /// Integer schemes (compressed-tensors pack- and int-quantized): bits, group size (none per
    /// channel), symmetry, and the weights in words.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub bits: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub group_size: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub symmetric: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub weights: Option<String>,
    /// compressed-tensors `kv_cache_scheme`: "tensor" or "attn_head".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kv_cache_scheme: Option<&'static str>,
    pub supported: bool,
    pub refusal: Option<Refusal>,
}

#[derive(Debug, Serialize)]
pub struct Refusal {
    pub message: String,
    pub fix: String,
}

/// `qc` (the raw `quantization_config`) as wload reads it, or, when refused, what the raw JSON
/// says and why.
pub(super) fn quant_info(qc: Option<&Value>, model_type: Option<&str>) -> Option<QuantInfo> {
    let qc = qc?;
    let q = match Quantization::for_model(Some(qc), model_type) {
        Ok(q) => q?,
        Err(e) => return Some(refused(qc, e)),
    };
    let method = q.method().to_string();
    let mut info = QuantInfo {
        method: Some(method),
        scheme: None,
        weight_block_size: None,
        activation_scheme: None,
        ignored: Vec::new(),
        bits: None,
        group_size: None,
        symmetric: None,
        weights: None,
        kv_cache_scheme: None,
        supported: true,
        refusal: None,
    };
    let how = |s: bool| Some(if s { "static" } else { "dynamic" }.to_string());
    match q {
        Quantization::Fp8(f) => {
            info.scheme = Some(if f.block.is_some() {
                "block"
            } else {
                "per-tensor"
            });
            info.weight_block_size = f.block;
            info.activation_scheme = how(f.static_activations);
            info.ignored = f.ignored;
        }
        Quantization::Compressed(c) => {
            info.activation_scheme = c.static_input().and_then(how);
            compressed_info(&mut info, &c);
            info.ignored = c.ignore;
        }
        Quantization::ModelOptNvFp4(m) => {
            info.scheme = Some("group");
            info.bits = Some(4);
            info.group_size = Some(m.group_size);
            info.weights = Some(format!(
                "NVFP4: E2M1 packed two a byte (weight U8), an F8_E4M3 scale per {} elements (weight_scale) and an F32 global scale per part (weight_scale_2)",
                m.group_size
            ));
            // W4A4 quantizes activations per group at run time, from a static global scale.
            info.activation_scheme = Some(if m.activations { "nvfp4" } else { "none" }.into());
            info.ignored = m.exclude;
        }
        Quantization::Gptq(g) => {
            info.scheme = Some(if g.group.is_some() {
                "group"
            } else {
                "per-channel"
            });
            info.bits = Some(g.bits);
            info.group_size = g.group;
            info.symmetric = Some(true);
            info.weights = Some(format!(
                "INT{} packed 8/int32 on the input dim (qweight, scales, qzeros), {}, desc_act {}, symmetric{}",
                g.bits,
                g.group
                    .map_or("one group per output channel".into(), |n| format!(
                        "groups of {n}"
                    )),
                g.desc_act,
                if g.listed.is_some() {
                    ", quantized modules listed (modules_in_block_to_quantize)"
                } else {
                    ", quantized modules: those with integer tensors in the checkpoint"
                }
            ));
        }
        Quantization::GptOssMxfp4(m) => {
            info.scheme = Some("mxfp4 experts");
            info.bits = Some(4);
            info.group_size = Some(32);
            info.weights = Some(
                "MXFP4 experts: E2M1 packed two a byte (*_blocks → w13_weight / w2_weight, U8), an E8M0 scale per 32 (*_scales); attention, router and embeddings unquantized"
                    .into(),
            );
            info.ignored = m.not_converted;
        }
        Quantization::Awq(a) => {
            info.scheme = Some("group");
            info.bits = Some(a.bits);
            info.group_size = Some(a.group);
            info.symmetric = Some(!a.zero_point);
            info.weights = Some(format!(
                "INT{} packed 8/int32 on the output dim (qweight, qzeros, scales), groups of {}, zero points {}",
                a.bits,
                a.group,
                if a.zero_point { "on" } else { "off" }
            ));
            info.ignored = a.not_converted.clone();
        }
    }
    Some(info)
}

/// A compressed-tensors scheme's fields.
fn compressed_info(info: &mut QuantInfo, c: &crate::quant::compressed::Compressed) {
    use crate::quant::compressed::{KvCacheStrategy, Nvfp4, Scheme};
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

/// A refused scheme's fields are read leniently: a malformed one is what the refusal explains.
fn refused(qc: &Value, e: crate::quant::QuantError) -> QuantInfo {
    let block = qc
        .get("weight_block_size")
        .and_then(Value::as_array)
        .and_then(|a| match a.as_slice() {
            [n, k] => Some([n.as_u64()?, k.as_u64()?]),
            _ => None,
        });
    let ignored = ["ignored_layers", "modules_to_not_convert", "ignore"]
        .iter()
        .filter_map(|k| qc.get(k).and_then(Value::as_array))
        .find(|a| !a.is_empty())
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    QuantInfo {
        method: qc
            .get("quant_method")
            .and_then(Value::as_str)
            .map(str::to_string),
        scheme: None,
        weight_block_size: block,
        activation_scheme: qc
            .get("activation_scheme")
            .and_then(Value::as_str)
            .map(str::to_string),
        ignored,
        bits: None,
        group_size: None,
        symmetric: None,
        weights: None,
        kv_cache_scheme: None,
        supported: false,
        refusal: Some(Refusal {
            message: e.message,
            fix: e.fix,
        }),
    }
}
