//! `kv_cache_scheme` (vLLM's `CompressedTensorsKVCacheMethod.validate_kv_cache_scheme`,
//! compressed_tensors.py:1103–1142): 8-bit float, symmetric, one scale per tensor or per
//! attention head.

use serde_json::Value;

use super::super::{QuantError, field, refuse};

/// How the KV cache's scales are laid out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvCacheStrategy {
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
