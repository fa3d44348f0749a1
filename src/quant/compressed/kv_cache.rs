//! `kv_cache_scheme` (vLLM's `CompressedTensorsKVCacheMethod.validate_kv_cache_scheme`,
//! compressed_tensors.py:1103–1142): 8-bit float, symmetric, one scale per tensor or per
//! attention head.

use serde_json::Value;

use super::super::cx::Cx;
use super::super::extra::Extra;
use super::super::{QuantError, field, refuse};
use crate::dtype::Dtype;
use crate::layout::{Geometry, KvHeadScale, KvScale, Replicated};
use crate::problem::Problem;

/// How the KV cache's scales are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum KvCacheStrategy {
    /// One `[1]` scale per k, v and q.
    Tensor,
    /// One scale per kv head (`[num_kv_heads]` per rank); q reduced by amax over its GQA group.
    AttnHead,
}

const FIX: &str = "use a checkpoint with an 8-bit float, symmetric, per-tensor or per-head kv_cache_scheme, or remove kv_cache_scheme and its scales for an unquantized KV cache";

impl KvCacheStrategy {
    /// `None` when the config has no `kv_cache_scheme`.
    pub(super) fn parse(qc: &Value) -> Result<Option<KvCacheStrategy>, QuantError> {
        let Some(s) = qc.get("kv_cache_scheme").filter(|s| !s.is_null()) else {
            return Ok(None);
        };
        let (t, bits) = (field(s, "type"), field(s, "num_bits"));
        if t != "float" || bits != 8 {
            let name = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
            return Err(refuse(
                format!(
                    "Currently supported kv cache quantization is num_bits=8, type=float, however received num_bits={}, type={} (quantization_config.kv_cache_scheme)",
                    name(&bits),
                    name(&t)
                ),
                FIX,
            ));
        }
        let strategy = match field(s, "strategy").as_str() {
            Some("tensor") => KvCacheStrategy::Tensor,
            Some("attn_head") => KvCacheStrategy::AttnHead,
            other => {
                return Err(refuse(
                    format!(
                        "Invalid strategy for compressed-tensors KV cache. Expected strategies: (tensor, attn_head), found strategy: {} (quantization_config.kv_cache_scheme.strategy)",
                        other.unwrap_or("none")
                    ),
                    FIX,
                ));
            }
        };
        if field(s, "symmetric") != true {
            return Err(refuse(
                format!(
                    "Only support symmetric scaling factor for compressed-tensors KV cache. However found symmetric: {} (quantization_config.kv_cache_scheme.symmetric)",
                    field(s, "symmetric")
                ),
                FIX,
            ));
        }
        Ok(Some(strategy))
    }
}

/// `attn_head` kv-cache scales (`CompressedTensorsKVCacheMethod`, compressed_tensors.py:
/// 1144–1226): `k_scale`, `v_scale`, `q_scale` F32 `[n_kv]` per rank — the rank's kv heads, q
/// reduced by amax over each query group first — and `[n_kv]` zero points in the model dtype
/// that the loader never fills from the checkpoint.
pub(super) fn head_scales(attention: &str, cx: &mut Cx<'_>) -> Option<Vec<Extra>> {
    let module = attention;
    let heads = (cx.qkv_heads)(attention);
    let Some((heads, kv_heads)) = heads.filter(|(h, kv)| *kv > 0 && h.is_multiple_of(*kv)) else {
        cx.problems.push(Problem {
            message: format!(
                "{module}: kv_cache_scheme strategy attn_head needs the layer's query and kv head counts (a QKVParallelLinear with whole query groups per kv head), and this attention has none"
            ),
            fix: Some("use a checkpoint with a per-tensor kv_cache_scheme".into()),
            parameter: Some(format!("{module}.k_scale")),
            ..Default::default()
        });
        return None;
    };
    let n = if cx.tp >= kv_heads {
        1
    } else {
        kv_heads / cx.tp
    };
    let scale = |s: &str, which| Extra {
        name: format!("{module}.{s}"),
        geometry: Geometry::KvHeadScale(KvHeadScale {
            heads,
            kv_heads,
            which,
        }),
        dtype: Dtype::F32,
        fill: 1.0,
        optional: true,
        buffer: false,
    };
    let zero = |s: &str| Extra {
        name: format!("{module}.{s}"),
        geometry: Geometry::Replicated(Replicated { shape: vec![n] }),
        dtype: cx.model_dtype,
        fill: 0.0,
        optional: true,
        buffer: true,
    };
    Some(vec![
        scale("k_scale", KvScale::K),
        scale("v_scale", KvScale::V),
        scale("q_scale", KvScale::Q),
        zero("k_zero_point"),
        zero("v_zero_point"),
        zero("q_zero_point"),
    ])
}
