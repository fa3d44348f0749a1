//! `inspect`'s quantization section: what `quantization_config` says, read as `plan`, `shard`
//! and `load` read it (each method's [`super::Method::inspect`]), and for a scheme wload
//! refuses, what could be read of it and why.

use serde::Serialize;
use serde_json::Value;

use super::{QuantError, Quantization};

/// A checkpoint's quantization as `inspect` describes it: for a scheme wload refuses, what could be
/// read of it and why it is refused (`plan`, `shard` and `load` stop there; `inspect` does not).
#[derive(Debug, Serialize, schemars::JsonSchema)]
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

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Refusal {
    pub message: String,
    pub fix: String,
}

impl QuantInfo {
    /// A supported method's info, every field but its name empty (each method fills its own).
    pub(crate) fn of(method: &str) -> QuantInfo {
        QuantInfo {
            method: Some(method.to_string()),
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
        }
    }
}

/// `static` or `dynamic`, as `activation_scheme` is written.
pub(crate) fn activations(static_scales: bool) -> Option<String> {
    Some(if static_scales { "static" } else { "dynamic" }.to_string())
}

/// What `inspect` says of `qc` (the raw `quantization_config`) parsed as `parsed`: the method's
/// own account, or, when refused, what the raw JSON says and why.
pub(crate) fn quant_info(
    qc: Option<&Value>,
    parsed: Result<Option<&Quantization>, &QuantError>,
) -> Option<QuantInfo> {
    let qc = qc?;
    match parsed {
        Ok(q) => q.map(|q| q.inspect()),
        Err(e) => Some(refused(qc, e.clone())),
    }
}

/// A refused scheme's fields are read leniently: a malformed one is what the refusal explains.
fn refused(qc: &Value, e: QuantError) -> QuantInfo {
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
