//! The INT8 group of `format: int-quantized` (vLLM's `CompressedTensorsW8A8Int8`): static,
//! symmetric int8 weights scaled per channel or per tensor, and int8 input activations, static
//! per tensor (an `input_scale`, and an `input_zero_point` when asymmetric) or dynamic per token.
//! It is the FP8 compressed-tensors geometry with other dtypes (`CompressedTensorsW8A8Int8.
//! create_weights`, schemes/compressed_tensors_w8a8_int8.py:39–103); a static input scale is one
//! `[1]` value (`BasevLLMParameter`) that every shard of a fused layer overwrites, so the last
//! loaded stays.

use serde_json::Value;

use super::super::cx::Weight;
use super::super::extra::{Extra, per_channel};
use super::super::{QuantError, USE_UNQUANTIZED, field, refuse};
use crate::dtype::{Dtype, F32_MIN};
use crate::layout::{Geometry, LastShard, TensorScale};

#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Int8 {
    /// Per output row (`[N, 1]`) rather than one scale per logical shard.
    pub channel: bool,
    /// Static per-tensor activations: an `input_scale` per linear layer.
    pub static_input: bool,
    /// With static asymmetric activations, an `input_zero_point` too.
    pub input_symmetric: bool,
}

impl Int8 {
    pub(super) fn parse(group: &Value, at: &dyn Fn(&str) -> String) -> Result<Self, QuantError> {
        let w = super::weights_of(group, at)?;
        let a = group.get("input_activations").filter(|a| !a.is_null());
        let int8 = |v: &Value| field(v, "type") == "int" && field(v, "num_bits") == 8;
        let Some(a) = a.filter(|a| int8(w) && int8(a)) else {
            return Err(refuse(
                format!(
                    "compressed-tensors int-quantized {} is not a scheme wload writes: it writes 8-bit int weights with 8-bit int input activations (vLLM's W8A8Int8)",
                    at("").trim_end_matches('.')
                ),
                &USE_UNQUANTIZED,
            ));
        };
        let channel = match field(w, "strategy").as_str() {
            Some("channel") => true,
            Some("tensor") => false,
            s => {
                return Err(refuse(
                    format!(
                        "compressed-tensors INT8 weight strategy {s:?} is not supported (vLLM's W8A8Int8 takes tensor and channel)"
                    ),
                    &USE_UNQUANTIZED,
                ));
            }
        };
        if field(w, "symmetric") == false || field(w, "dynamic") == true {
            return Err(refuse(
                "compressed-tensors INT8 weights must be static and symmetric (vLLM's W8A8Int8: \"Only symmetric weight quantization supported\")".into(),
                &USE_UNQUANTIZED,
            ));
        }
        let static_input = match (field(a, "dynamic").as_bool(), field(a, "strategy").as_str()) {
            (Some(false), Some("tensor")) => true,
            (Some(true), Some("token")) => false,
            (d, s) => {
                return Err(refuse(
                    format!(
                        "compressed-tensors INT8 input activations (dynamic {d:?}, strategy {s:?}) are not a scheme vLLM's W8A8Int8 accepts (static per tensor, or dynamic per token)"
                    ),
                    &USE_UNQUANTIZED,
                ));
            }
        };
        Ok(Int8 {
            channel,
            static_input,
            input_symmetric: field(a, "symmetric") != false,
        })
    }

    pub(crate) fn describe(&self) -> String {
        format!(
            "INT8 {} weights, {} int8 activations",
            if self.channel {
                "per-channel"
            } else {
                "per-tensor"
            },
            match (self.static_input, self.input_symmetric) {
                (false, _) => "dynamic per-token",
                (true, true) => "static symmetric",
                (true, false) => "static asymmetric",
            }
        )
    }
}

/// `p` becomes `weight` I8, then `weight_scale` F32 (`[N_r, 1]` per channel, `[parts]` per
/// tensor), then with static activations `input_zero_point` I8 `[1]` (asymmetric) and
/// `input_scale` F32 `[1]`.
/// `None` (the layer left as it is) for a weight that is not a linear layer's, as FP8 does.
pub(super) fn linear(i: &Int8, p: Weight<'_>) -> Option<Vec<Extra>> {
    let module = p.name.strip_suffix(".weight")?;
    let of = Box::new(p.geometry.clone());
    let name = |s: &str| format!("{module}.{s}");
    let scale = if i.channel {
        per_channel(p.geometry)?
    } else {
        Geometry::TensorScale(TensorScale { of: of.clone() })
    };
    *p.dtype = Dtype::I8;
    let mut out = vec![Extra::required(
        name("weight_scale"),
        scale,
        Dtype::F32,
        F32_MIN,
    )];
    if i.static_input {
        let one = || {
            Geometry::LastShard(LastShard {
                of: of.clone(),
                shape: vec![1],
            })
        };
        if !i.input_symmetric {
            out.push(Extra::required(
                name("input_zero_point"),
                one(),
                Dtype::I8,
                0.0,
            ));
        }
        out.push(Extra::required(
            name("input_scale"),
            one(),
            Dtype::F32,
            F32_MIN,
        ));
    }
    Some(out)
}
