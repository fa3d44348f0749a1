//! compressed-tensors `int-quantized` W8A8 parameters: vLLM's `CompressedTensorsW8A8Int8.
//! create_weights` (schemes/compressed_tensors_w8a8_int8.py:39–103). The FP8 geometry with
//! int8 weights; a static input scale is one `[1]` value (`BasevLLMParameter`) that every shard
//! of a fused layer overwrites, so the last loaded stays.

use super::super::params::Param;
use super::{Extra, F32_MIN, per_channel};
use crate::dtype::Dtype;
use crate::layout::{Geometry, LastShard, TensorScale};
use crate::quant::compressed::Int8;

/// `p` becomes `weight` I8, then `weight_scale` F32 (`[N_r, 1]` per channel, `[parts]` per
/// tensor), then with static activations `input_zero_point` I8 `[1]` (asymmetric) and
/// `input_scale` F32 `[1]`.
/// `None` (the layer left as it is) for a weight that is not a linear layer's, as FP8 does.
pub(super) fn linear(i: &Int8, p: &mut Param<'_>, module: &str) -> Option<Vec<Extra>> {
    let of = Box::new(p.geometry.clone());
    let name = |s: &str| format!("{module}.{s}");
    let scale = if i.channel {
        per_channel(&p.geometry)?
    } else {
        Geometry::TensorScale(TensorScale { of: of.clone() })
    };
    p.dtype = Dtype::I8;
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
