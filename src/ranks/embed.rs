//! `VLLM_REPLICATE_EMBED`, the run setting vLLM 0.33's DSA CUDA tree (DeepSeek-V3.2, GLM-5) reads
//! to hold the whole embedding on every rank (layers/fused_embed_norm.py:39–71).

/// The environment variable's name.
pub(crate) const REPLICATE_EMBED_VAR: &str = "VLLM_REPLICATE_EMBED";

/// Whether `value` turns [`REPLICATE_EMBED_VAR`] on, as vLLM reads it (envs.py:639–641:
/// `.strip().lower() in ("1", "true")`).
pub(crate) fn replicate_embed_on(value: &str) -> bool {
    let v = value.trim().to_lowercase();
    v == "1" || v == "true"
}
