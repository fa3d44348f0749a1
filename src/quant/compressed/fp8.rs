//! The FP8 group of `format: float-quantized` (vLLM's `CompressedTensorsW8A8Fp8`): static,
//! symmetric 8-bit float weights scaled per tensor, channel or block, with static per-tensor or
//! dynamic input activations.

use serde_json::Value;

use super::super::{QuantError, USE_UNQUANTIZED, block_size, field, refuse};

/// FP8 weights and how their activations are scaled.
#[derive(Debug, Clone)]
pub(crate) struct Fp8Scheme {
    pub weights: WeightStrategy,
    /// Static per-tensor input activations (`input_activations.dynamic: false`): an
    /// `input_scale` per linear layer.
    pub static_activations: bool,
}

/// How compressed-tensors scales FP8 weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WeightStrategy {
    /// One scale per logical shard.
    Tensor,
    /// One scale per output row (`[out, 1]`).
    Channel,
    /// One scale per `[block_n, block_k]` block.
    Block([u64; 2]),
}

impl Fp8Scheme {
    pub(super) fn parse(group: &Value, at: &dyn Fn(&str) -> String) -> Result<Self, QuantError> {
        let weights = weights(group, at)?;
        let static_activations = activations(group)?;
        if matches!(weights, WeightStrategy::Block(_)) && static_activations {
            return Err(refuse(
                "compressed-tensors block FP8 weights need dynamic activations".into(),
                &USE_UNQUANTIZED,
            ));
        }
        Ok(Fp8Scheme {
            weights,
            static_activations,
        })
    }
}

/// The group's weights: static, symmetric 8-bit floats, scaled per tensor, channel or block.
fn weights(group: &Value, at: &dyn Fn(&str) -> String) -> Result<WeightStrategy, QuantError> {
    let w = super::weights_of(group, at)?;
    let (wtype, bits) = (field(w, "type"), field(w, "num_bits"));
    if wtype != "float" || bits != 8 {
        return Err(refuse(
            format!(
                "compressed-tensors weights of type {wtype} with {bits} bits are not supported in format float-quantized (NVFP4 and MXFP4 have their own packed layouts); wload writes 8-bit float weights here"
            ),
            &USE_UNQUANTIZED,
        ));
    }
    if field(w, "symmetric") == false || field(w, "dynamic") == true {
        return Err(refuse(
            "compressed-tensors FP8 weights must be static and symmetric (vLLM's W8A8Fp8 scheme)"
                .into(),
            &USE_UNQUANTIZED,
        ));
    }
    match field(w, "strategy").as_str() {
        Some("tensor") => Ok(WeightStrategy::Tensor),
        Some("channel") => Ok(WeightStrategy::Channel),
        Some("block") => Ok(WeightStrategy::Block(block_size(
            &field(w, "block_structure"),
            &at("weights.block_structure"),
        )?)),
        other => Err(refuse(
            format!(
                "compressed-tensors FP8 weight strategy {other:?} is not supported (tensor, channel and block are)"
            ),
            &USE_UNQUANTIZED,
        )),
    }
}

/// Whether the group's input activations are static (an `input_scale` per layer): 8-bit
/// floats, dynamic per token or group, or static per tensor.
fn activations(group: &Value) -> Result<bool, QuantError> {
    // Weight-only FP8 (W8A16) runs on Marlin with other parameters.
    let Some(a) = group.get("input_activations").filter(|a| !a.is_null()) else {
        return Err(refuse(
            "compressed-tensors FP8 without input_activations (weight-only W8A16) is not supported"
                .into(),
            &USE_UNQUANTIZED,
        ));
    };
    if field(a, "type") != "float" || field(a, "num_bits") != 8 {
        return Err(refuse(
            "compressed-tensors input activations other than 8-bit float are not supported".into(),
            &USE_UNQUANTIZED,
        ));
    }
    match (field(a, "dynamic").as_bool(), field(a, "strategy").as_str()) {
        (Some(true), Some("token" | "group")) => Ok(false),
        (Some(false), Some("tensor")) => Ok(true),
        (d, s) => Err(refuse(
            format!(
                "compressed-tensors FP8 input activations (dynamic {d:?}, strategy {s:?}) are not a scheme vLLM's W8A8Fp8 accepts"
            ),
            &USE_UNQUANTIZED,
        )),
    }
}
