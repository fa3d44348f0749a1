//! The family's special structure, for choosing `--tp` / `--enable-expert-parallel`: the kind of
//! attention (and MLA's ranks), the experts, which layers are dense, the router, the MTP layers.
//!
//! Read from the config's raw fields with the defaults and rules the mappings use
//! (mappings/*.yaml `defaults` / `derive`, which cite vLLM's model files), so that what `inspect`
//! says matches what `plan` builds. It never fails: a missing field without a family default, or
//! one of the wrong type, is reported as unknown (`null`).

use serde::Serialize;
use serde_json::{Map, Value};

use crate::config::ModelConfig;

#[derive(Debug, Serialize)]
pub struct Structure {
    pub attention: Attention,
    /// `None` for a dense model.
    pub moe: Option<Moe>,
    /// Multi-token-prediction layers stored past `num_hidden_layers`; `None` when unknown.
    pub mtp_layers: Option<u64>,
}

#[derive(Debug, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Attention {
    Mha(Heads),
    Gqa(Heads),
    Mqa(Heads),
    Mla(Mla),
}

#[derive(Debug, Serialize)]
pub struct Heads {
    pub heads: u64,
    pub kv_heads: u64,
    /// As the family computes it (config, family default, or hidden / heads).
    pub head_dim: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct Mla {
    pub heads: u64,
    pub q_lora_rank: QLora,
    pub kv_lora_rank: Option<u64>,
    pub qk_nope_head_dim: Option<u64>,
    pub qk_rope_head_dim: Option<u64>,
    pub v_head_dim: Option<u64>,
}

/// q's low-rank projection: a rank, `null` when q is projected straight from the hidden state
/// (DeepSeek-V2-Lite), or "unknown" when the config's value is not a number.
#[derive(Debug, Serialize, PartialEq)]
#[serde(untagged)]
pub enum QLora {
    Rank(u64),
    None,
    Unknown(&'static str),
}

#[derive(Debug, Serialize)]
pub struct Moe {
    pub routed_experts: Option<u64>,
    pub experts_per_token: Option<u64>,
    pub expert_intermediate_size: Option<u64>,
    pub shared_experts: Option<SharedExperts>,
    /// Layer indices with a MoE block and with a dense MLP; `None` when the rule is unknown.
    pub moe_layers: Option<Vec<u64>>,
    pub dense_layers: Option<Vec<u64>>,
    /// The config fields that decide which layers are MoE, when any do.
    pub layer_rule: Option<String>,
    pub router: Router,
}

#[derive(Debug, Serialize)]
pub struct SharedExperts {
    pub count: u64,
    pub intermediate_size: Option<u64>,
    /// vLLM builds the shared experts as one MLP of count × intermediate_size.
    pub fused_intermediate_size: Option<u64>,
    /// "sigmoid" for Qwen2-MoE's shared_expert_gate; `None` when ungated.
    pub gate: Option<&'static str>,
}

#[derive(Debug, Serialize)]
pub struct Router {
    pub scoring_func: Option<String>,
    pub topk_method: Option<String>,
    /// An F32 `e_score_correction_bias` of one value per routed expert.
    pub e_score_correction_bias: bool,
    /// The router linear layer has a bias (gpt-oss).
    pub bias: bool,
}

/// A config field as read: absent, `null`, a number, or something else.
#[derive(Debug, Clone, PartialEq)]
enum Field {
    Absent,
    Null,
    Num(u64),
    Odd,
}

fn field(raw: &Map<String, Value>, key: &str) -> Field {
    match raw.get(key) {
        None => Field::Absent,
        Some(Value::Null) => Field::Null,
        Some(v) => v.as_u64().map_or(Field::Odd, Field::Num),
    }
}

/// The number, or `default` when the field is absent or `null` (transformers' default applies);
/// `None` when it is of the wrong type.
fn num(raw: &Map<String, Value>, key: &str, default: Option<u64>) -> Option<u64> {
    match field(raw, key) {
        Field::Num(n) => Some(n),
        Field::Absent | Field::Null => default,
        Field::Odd => None,
    }
}

fn string(raw: &Map<String, Value>, key: &str) -> Option<String> {
    raw.get(key).and_then(Value::as_str).map(str::to_string)
}

/// The mapping families with a special structure, by the architecture vLLM builds.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Family {
    DeepseekV2,
    DeepseekV3,
    Qwen2Moe,
    Qwen3Moe,
    Glm4Moe,
    Mixtral,
    GptOss,
    Other,
}

fn family(arch: Option<&str>) -> Family {
    match arch {
        Some("DeepseekV2ForCausalLM") => Family::DeepseekV2,
        Some("DeepseekV3ForCausalLM") => Family::DeepseekV3,
        Some("Qwen2MoeForCausalLM") => Family::Qwen2Moe,
        Some("Qwen3MoeForCausalLM") => Family::Qwen3Moe,
        Some("Glm4MoeForCausalLM") => Family::Glm4Moe,
        Some("MixtralForCausalLM") => Family::Mixtral,
        Some("GptOssForCausalLM") => Family::GptOss,
        _ => Family::Other,
    }
}

pub fn structure(c: &ModelConfig) -> Structure {
    let fam = family(c.architecture());
    Structure {
        attention: attention(c, fam),
        moe: moe(c, fam),
        mtp_layers: mtp_layers(&c.raw, fam),
    }
}

fn attention(c: &ModelConfig, fam: Family) -> Attention {
    let raw = &c.raw;
    let deepseek = matches!(fam, Family::DeepseekV2 | Family::DeepseekV3);
    if deepseek || (fam == Family::Other && raw.contains_key("kv_lora_rank")) {
        return Attention::Mla(mla(c, deepseek));
    }
    let head_dim = match fam {
        // Qwen2's attention ignores config.head_dim (qwen2.py:150; mappings/qwen2.yaml).
        Family::Qwen2Moe => None,
        // GptOssConfig's default (mappings/gpt_oss.yaml).
        Family::GptOss => num(raw, "head_dim", Some(64)),
        _ => c.head_dim,
    }
    .or_else(|| c.hidden_size.checked_div(c.num_attention_heads));
    let h = Heads {
        heads: c.num_attention_heads,
        kv_heads: c.num_key_value_heads,
        head_dim,
    };
    match h.kv_heads {
        1 if h.heads > 1 => Attention::Mqa(h),
        k if k < h.heads => Attention::Gqa(h),
        _ => Attention::Mha(h),
    }
}

/// DeepseekV2Config's defaults (mappings/deepseek_v2.yaml, which V3 inherits); another family
/// with MLA fields gets no defaults.
fn mla(c: &ModelConfig, deepseek: bool) -> Mla {
    let raw = &c.raw;
    let d = |n: u64| deepseek.then_some(n);
    // transformers defaults a missing q_lora_rank to 1536 but keeps an explicit null, and vLLM
    // then builds q_proj instead of q_a_proj/q_b_proj (deepseek_v2.py:1051).
    let q_lora_rank = match field(raw, "q_lora_rank") {
        Field::Absent if deepseek => QLora::Rank(1536),
        Field::Absent | Field::Odd => QLora::Unknown("unknown"),
        Field::Null | Field::Num(0) => QLora::None,
        Field::Num(n) => QLora::Rank(n),
    };
    Mla {
        heads: c.num_attention_heads,
        q_lora_rank,
        kv_lora_rank: num(raw, "kv_lora_rank", d(512)),
        qk_nope_head_dim: num(raw, "qk_nope_head_dim", d(128)),
        qk_rope_head_dim: num(raw, "qk_rope_head_dim", d(64)),
        v_head_dim: num(raw, "v_head_dim", d(128)),
    }
}

fn routed_experts(c: &ModelConfig, fam: Family) -> Option<u64> {
    let raw = &c.raw;
    match fam {
        Family::DeepseekV2 | Family::DeepseekV3 => num(raw, "n_routed_experts", Some(0)),
        Family::Qwen2Moe => num(raw, "num_experts", Some(60)),
        Family::Glm4Moe => match field(raw, "n_routed_experts") {
            Field::Num(n) => Some(n),
            Field::Odd => None,
            _ => num(raw, "num_local_experts", Some(128)),
        },
        Family::Mixtral | Family::GptOss => num(raw, "num_local_experts", None),
        Family::Qwen3Moe | Family::Other => c.num_experts,
    }
}

fn moe(c: &ModelConfig, fam: Family) -> Option<Moe> {
    let raw = &c.raw;
    let experts = routed_experts(c, fam);
    let expected_moe = !matches!(fam, Family::Other);
    // A MoE family whose expert count is unreadable is still a MoE; a count of 0 is vLLM's
    // dense fallback (`num_experts > 0 &&` in the mappings' moe_layer).
    match experts {
        Some(0) => return None,
        None if !expected_moe => return None,
        _ => {}
    }
    let expert_intermediate_size = match fam {
        // Mixtral's and gpt-oss's experts are intermediate_size wide (mixtral.py, gpt_oss.py).
        Family::Mixtral | Family::GptOss => c.intermediate_size,
        Family::Qwen2Moe | Family::Glm4Moe => num(raw, "moe_intermediate_size", Some(1408)),
        _ => c.moe_intermediate_size,
    };
    let (moe_layers, layer_rule) = moe_layers(c, fam);
    // The rules yield ascending indices: a binary search keeps 65536 layers instant.
    let dense_layers = moe_layers.as_ref().map(|m| {
        (0..c.num_hidden_layers)
            .filter(|i| m.binary_search(i).is_err())
            .collect()
    });
    Some(Moe {
        routed_experts: experts,
        experts_per_token: num(raw, "num_experts_per_tok", None),
        expert_intermediate_size,
        shared_experts: shared_experts(raw, fam, expert_intermediate_size),
        moe_layers,
        dense_layers,
        layer_rule,
        router: router(raw, fam),
    })
}

fn shared_experts(
    raw: &Map<String, Value>,
    fam: Family,
    expert_intermediate: Option<u64>,
) -> Option<SharedExperts> {
    let (count, size, gate) = match fam {
        // DeepseekV2MoE / Glm4MoE: one MLP of moe_intermediate_size × n_shared_experts
        // (deepseek_v2.py, glm4_moe.py:170–181; the mappings' shared_size).
        Family::DeepseekV2 => (
            num(raw, "n_shared_experts", Some(2))?,
            expert_intermediate,
            None,
        ),
        Family::DeepseekV3 | Family::Glm4Moe => (
            num(raw, "n_shared_experts", Some(1))?,
            expert_intermediate,
            None,
        ),
        // Qwen2MoeSparseMoeBlock: one shared expert scaled by sigmoid(shared_expert_gate(x)),
        // absent when shared_expert_intermediate_size is 0 (qwen2_moe.py:148–179).
        Family::Qwen2Moe => {
            let size = num(raw, "shared_expert_intermediate_size", Some(5632));
            (u64::from(size != Some(0)), size, Some("sigmoid"))
        }
        _ => return None,
    };
    (count > 0).then(|| SharedExperts {
        count,
        intermediate_size: size,
        fused_intermediate_size: size.and_then(|s| s.checked_mul(count)),
        gate,
    })
}

/// Far above any real model (DeepSeek-V3 has 61 layers).
const MAX_LISTED_LAYERS: u64 = 1 << 16;

/// The MoE layers by the family's rule (the mappings' `moe_layer`), and the fields that decide it.
fn moe_layers(c: &ModelConfig, fam: Family) -> (Option<Vec<u64>>, Option<String>) {
    let raw = &c.raw;
    // A config claiming billions of layers would otherwise have inspect list them all.
    if c.num_hidden_layers > MAX_LISTED_LAYERS {
        return (None, None);
    }
    let layers = 0..c.num_hidden_layers;
    match fam {
        // deepseek_v2.py:1293–1297: layer_idx >= first_k_dense_replace and
        // layer_idx % moe_layer_freq == 0.
        Family::DeepseekV2 | Family::DeepseekV3 => {
            let k_default = if fam == Family::DeepseekV3 { 3 } else { 0 };
            let (Some(k), Some(freq)) = (
                num(raw, "first_k_dense_replace", Some(k_default)),
                num(raw, "moe_layer_freq", Some(1)),
            ) else {
                return (None, odd(raw, &["first_k_dense_replace", "moe_layer_freq"]));
            };
            if freq == 0 {
                return (None, Some("moe_layer_freq 0".into()));
            }
            let mut rule = format!("first_k_dense_replace {k}");
            if freq != 1 {
                rule.push_str(&format!(", moe_layer_freq {freq}"));
            }
            let moe = layers.filter(|i| *i >= k && i % freq == 0).collect();
            (Some(moe), Some(rule))
        }
        // glm4_moe.py:353–362: every layer from first_k_dense_replace on.
        Family::Glm4Moe => match num(raw, "first_k_dense_replace", Some(1)) {
            Some(k) => (
                Some(layers.filter(|i| *i >= k).collect()),
                Some(format!("first_k_dense_replace {k}")),
            ),
            None => (None, odd(raw, &["first_k_dense_replace"])),
        },
        // qwen2_moe.py:312–319 / qwen3_moe.py: not in mlp_only_layers, and
        // (layer_idx + 1) % decoder_sparse_step == 0.
        Family::Qwen2Moe | Family::Qwen3Moe => qwen_moe_layers(raw, layers),
        Family::Mixtral | Family::GptOss => (Some(layers.collect()), None),
        Family::Other => (None, None),
    }
}

/// The first of `keys` whose value is not what the family reads, as written ("first_k_dense_replace
/// = \"three\""), for saying why the layers are unknown.
fn odd(raw: &Map<String, Value>, keys: &[&str]) -> Option<String> {
    keys.iter().find_map(|k| {
        let v = raw.get(*k)?;
        let fine = v.is_null()
            || v.is_u64()
            || (*k == "mlp_only_layers"
                && v.as_array().is_some_and(|a| a.iter().all(Value::is_u64)));
        (!fine).then(|| format!("{k} = {v}"))
    })
}

fn qwen_moe_layers(
    raw: &Map<String, Value>,
    layers: std::ops::Range<u64>,
) -> (Option<Vec<u64>>, Option<String>) {
    let only: Option<Vec<u64>> = match raw.get("mlp_only_layers") {
        None | Some(Value::Null) => Some(Vec::new()),
        Some(Value::Array(a)) => a.iter().map(Value::as_u64).collect(),
        Some(_) => None,
    };
    let (Some(only), Some(step)) = (only, num(raw, "decoder_sparse_step", Some(1))) else {
        return (None, odd(raw, &["mlp_only_layers", "decoder_sparse_step"]));
    };
    if step == 0 {
        // vLLM divides by it and fails; plan refuses it with the mapping's message.
        return (None, Some("decoder_sparse_step 0".into()));
    }
    let mut rule = Vec::new();
    if step != 1 {
        rule.push(format!("decoder_sparse_step {step}"));
    }
    if !only.is_empty() {
        let list: Vec<String> = only.iter().map(u64::to_string).collect();
        rule.push(format!("mlp_only_layers [{}]", list.join(", ")));
    }
    let moe = layers
        .filter(|i| !only.contains(i) && (i + 1) % step == 0)
        .collect();
    (Some(moe), (!rule.is_empty()).then(|| rule.join(", ")))
}

fn router(raw: &Map<String, Value>, fam: Family) -> Router {
    match fam {
        // DeepseekV2MoE: scoring_func defaults to softmax; topk_method noaux_tc adds the F32
        // correction bias (deepseek_v2.py:327–332). V3's config class has no topk_method.
        Family::DeepseekV2 | Family::DeepseekV3 => {
            let topk = match raw.get("topk_method") {
                None if fam == Family::DeepseekV2 => Some("greedy".to_string()),
                _ => string(raw, "topk_method"),
            };
            Router {
                scoring_func: string(raw, "scoring_func").or(Some("softmax".into())),
                e_score_correction_bias: topk.as_deref() == Some("noaux_tc"),
                topk_method: topk,
                bias: false,
            }
        }
        // Glm4MoE: an F32 router with sigmoid scoring and an F32 correction bias on every MoE
        // layer (glm4_moe.py:119–150).
        Family::Glm4Moe => Router {
            scoring_func: Some("sigmoid".into()),
            topk_method: string(raw, "topk_method"),
            e_score_correction_bias: true,
            bias: false,
        },
        // Softmax over the router logits, no correction bias (qwen2_moe.py, qwen3_moe.py,
        // mixtral.py, gpt_oss.py; gpt-oss's router has a bias).
        Family::Qwen2Moe | Family::Qwen3Moe | Family::Mixtral | Family::GptOss => Router {
            scoring_func: Some("softmax".into()),
            topk_method: None,
            e_score_correction_bias: false,
            bias: fam == Family::GptOss,
        },
        // A family wload has no mapping for: only what its config states.
        Family::Other => {
            let topk = string(raw, "topk_method");
            Router {
                scoring_func: string(raw, "scoring_func"),
                e_score_correction_bias: topk.as_deref() == Some("noaux_tc"),
                topk_method: topk,
                bias: false,
            }
        }
    }
}

/// MTP layers past num_hidden_layers belong to the speculative decoder: vLLM's main model skips
/// their weights (deepseek_v2 / glm4_moe mappings' skip_layer).
fn mtp_layers(raw: &Map<String, Value>, fam: Family) -> Option<u64> {
    match fam {
        Family::DeepseekV2 | Family::DeepseekV3 => num(raw, "num_nextn_predict_layers", Some(0)),
        Family::Glm4Moe => match field(raw, "num_nextn_predict_layers") {
            Field::Num(n) => Some(n),
            Field::Odd => None,
            _ => num(raw, "num_mtp_layers", Some(1)),
        },
        _ => num(raw, "num_nextn_predict_layers", Some(0)),
    }
}
