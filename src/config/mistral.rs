//! params.json → the Hugging Face config vLLM builds from it: `adapt_config_dict`
//! (transformers_utils/configs/mistral.py), the parts that decide the architecture and the
//! dimensions a mapping reads.

use std::path::Path;

use serde_json::{Map, Value};

/// vLLM's `adapt_config_dict` for `m`, the params.json of the folder `root`: the general renames
/// (:146–173), MLA without a `moe` block made one (:310–326), the Mistral Large 3 MoE renames
/// (:285–307, :27–35, `model_type` `deepseek_v3`), and config.json's keys, when the folder has one, as
/// defaults for what params.json lacks (config.py:493–523, `setdefault`).
pub(super) fn to_hf(mut m: Map<String, Value>, root: &Path) -> Map<String, Value> {
    for (from, to) in [
        ("dim", "hidden_size"),
        ("norm_eps", "rms_norm_eps"),
        ("n_kv_heads", "num_key_value_heads"),
        ("n_layers", "num_hidden_layers"),
        ("n_heads", "num_attention_heads"),
        ("hidden_dim", "intermediate_size"),
    ] {
        if let Some(v) = m.remove(from) {
            m.insert(to.to_string(), v);
        }
    }
    let tied = m.remove("tied_embeddings").unwrap_or(Value::Bool(false));
    m.insert("tie_word_embeddings".into(), tied);
    if let Some(q) = m.remove("quantization").filter(|q| truthy(Some(q))) {
        m.insert("quantization_config".into(), quantization(q));
    }
    if truthy(m.get("qk_nope_head_dim")) && !truthy(m.get("moe")) {
        let dense_mla = dense_mla_moe(&m);
        m.insert("moe".into(), Value::Object(dense_mla));
    }
    let moe = m.get("moe").and_then(Value::as_object).cloned();
    let shared = moe
        .as_ref()
        .and_then(|moe| moe.get("num_shared_experts"))
        .and_then(Value::as_u64)
        .unwrap_or(0);
    let arch = match moe {
        Some(moe) if shared > 0 => {
            large_3_moe(&mut m, moe);
            "MistralLarge3ForCausalLM"
        }
        Some(moe) => {
            if let Some(n) = moe.get("num_experts") {
                m.entry("num_local_experts").or_insert(n.clone());
            }
            if let Some(k) = moe.get("num_experts_per_tok") {
                m.entry("num_experts_per_tok").or_insert(k.clone());
            }
            "MixtralForCausalLM"
        }
        None => "MistralForCausalLM",
    };
    m.insert("architectures".into(), Value::from(vec![arch]));
    for (k, v) in config_json(root) {
        m.entry(k).or_insert(v);
    }
    m
}

/// Whether Python's `bool(v)` holds for a params.json value (absent: false).
fn truthy(v: Option<&Value>) -> bool {
    match v {
        None | Some(Value::Null | Value::Bool(false)) => false,
        Some(Value::Object(o)) => !o.is_empty(),
        Some(Value::Array(a)) => !a.is_empty(),
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Number(n)) => n.as_f64() != Some(0.0),
        Some(Value::Bool(true)) => true,
    }
}

/// `_remap_mistral_quantization_args` (configs/mistral.py:199–223): an FP8 `qformat_weight` is
/// vLLM's `fp8` method, per-tensor, with static activation scales unless `qscheme_act` is
/// `NO_SCALES`; compressed-tensors passes through. Anything else vLLM refuses (ValueError): it
/// is passed on under its own name, which the quantization reader refuses as unknown.
fn quantization(q: Value) -> Value {
    let Value::Object(mut q) = q else { return q };
    if q.get("qformat_weight").and_then(Value::as_str) == Some("fp8_e4m3") {
        let dynamic = q.get("qscheme_act").and_then(Value::as_str) == Some("NO_SCALES");
        let scheme = if dynamic { "dynamic" } else { "static" };
        return serde_json::json!({"quant_method": "fp8", "activation_scheme": scheme});
    }
    let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
    if method.to_lowercase().replace('_', "-") == "compressed-tensors" {
        q.insert("quant_method".into(), "compressed-tensors".into());
    }
    Value::Object(q)
}

/// `_remap_mistral_mla_args`: an MLA model without a `moe` block is served as one routed expert
/// and one shared expert on no MoE layer (first_k_dense_replace = every layer), as Mistral Large 3.
fn dense_mla_moe(m: &Map<String, Value>) -> Map<String, Value> {
    let get = |k: &str| m.get(k).cloned().unwrap_or(Value::Null);
    let mut moe = Map::new();
    for (k, v) in [
        ("num_experts", Value::from(1)),
        ("first_k_dense_replace", get("num_hidden_layers")),
        ("route_every_n", Value::from(1)),
        ("num_shared_experts", Value::from(1)),
        ("expert_hidden_dim", get("intermediate_size")),
        ("num_experts_per_tok", Value::from(1)),
        ("routed_scale", Value::from(1.0)),
        ("num_expert_groups", Value::from(1)),
        ("num_expert_groups_per_tok", Value::from(1)),
    ] {
        moe.insert(k.into(), v);
    }
    moe
}

/// `_remap_moe_args` and the Mistral Large 3 branch: the `moe` block's fields under DeepSeek-V3's
/// names, no correction bias (`topk_method` None), softmax routing.
fn large_3_moe(m: &mut Map<String, Value>, moe: Map<String, Value>) {
    for (from, to) in [
        ("route_every_n", "moe_layer_freq"),
        ("first_k_dense_replace", "first_k_dense_replace"),
        ("num_experts_per_tok", "num_experts_per_tok"),
        ("num_experts", "n_routed_experts"),
        ("expert_hidden_dim", "moe_intermediate_size"),
        ("routed_scale", "routed_scaling_factor"),
        ("num_shared_experts", "n_shared_experts"),
        ("num_expert_groups", "n_group"),
        ("num_expert_groups_per_tok", "topk_group"),
    ] {
        if let Some(v) = moe.get(from) {
            m.insert(to.into(), v.clone());
        }
    }
    m.insert("topk_method".into(), Value::Null);
    m.insert("norm_topk_prob".into(), Value::Bool(true));
    m.insert("scoring_func".into(), "softmax".into());
    m.insert("model_type".into(), "deepseek_v3".into());
}

/// The folder's config.json object, if it has a readable one (vLLM takes it as defaults and
/// ignores a missing one).
fn config_json(root: &Path) -> Map<String, Value> {
    let bytes = crate::small_file::read(&root.join("config.json")).ok();
    match bytes.and_then(|b| serde_json::from_slice(&b).ok()) {
        Some(Value::Object(o)) => o,
        _ => Map::new(),
    }
}
