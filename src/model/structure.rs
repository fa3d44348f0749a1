//! The family's special structure, for choosing `--tp` / `--enable-expert-parallel`: the kind of
//! attention (and MLA's ranks), the experts, which layers are dense, the router, the MTP layers.
//!
//! Derived from the mapping `plan` would use (mappings/*.yaml, or `--mapping FILE`), evaluated
//! over the config as the planner evaluates it (`model::env::Variables`: defaults, derived values), so
//! that a family's facts live in its YAML only and what `inspect` says is what `plan` builds:
//! the MoE layers are those where the mapping builds a fused-experts parameter, the expert count
//! and width are that layout's, shared experts, the router's correction bias and bias are the
//! parameters the mapping builds on a MoE layer, the MTP layers are those `skip_layer` skips.
//! What no mapping states (MLA's ranks, the router's scoring) is read from the variables, i.e.
//! config.json with the mapping's defaults, in one place for every family. It never fails: what
//! cannot be evaluated is reported as unknown (`null`).

use serde::Serialize;
use std::path::Path;

use serde_json::Value;

use crate::config::ModelConfig;
use crate::mapping::{Expr, Layout, Mapping, ParamSpec};
use crate::model::env::Variables;

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Structure {
    pub attention: Attention,
    /// Which layers have full attention and which linear attention (Qwen3.5, Qwen3-Next);
    /// `None` when every layer has full attention.
    pub attention_layers: Option<AttentionLayers>,
    /// `None` for a dense model.
    pub moe: Option<Moe>,
    /// Multi-token-prediction layers stored past `num_hidden_layers`; `None` when unknown.
    pub mtp_layers: Option<u64>,
    /// The config field that sets the MTP layer count (the first the mapping's `skip_layer`
    /// reads, through its derived values), for the human report.
    #[serde(skip)]
    pub mtp_field: Option<String>,
    /// The platform whose vLLM module tree the mapping writes, when vLLM builds the family
    /// differently per platform (`cuda`: DeepSeek-V3.2); absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module_tree: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Attention {
    Mha(Heads),
    Gqa(Heads),
    Mqa(Heads),
    Mla(Mla),
}

impl Attention {
    /// The head counts of attention with kv heads; `None` for MLA (one shared latent).
    pub(crate) fn heads(&self) -> Option<&Heads> {
        match self {
            Attention::Mha(h) | Attention::Gqa(h) | Attention::Mqa(h) => Some(h),
            Attention::Mla(_) => None,
        }
    }
}

/// A hybrid model's layers: those where the mapping builds the attention's qkv parameter, and the
/// others (Gated-DeltaNet linear attention, no kv cache).
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct AttentionLayers {
    /// Layer indices with full (softmax) attention; `None` when unknown.
    pub full: Option<Vec<u64>>,
    /// Layer indices with linear attention; `None` when unknown.
    pub linear: Option<Vec<u64>>,
    /// The config fields that decide which layers are which (`layer_types [...]`,
    /// `full_attention_interval 4`), or the odd value that makes them unknown.
    pub layer_rule: Option<String>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Heads {
    pub heads: u64,
    pub kv_heads: u64,
    /// As the family computes it (config, family default, or hidden / heads).
    pub head_dim: Option<u64>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
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
#[derive(Debug, Serialize, PartialEq, schemars::JsonSchema)]
#[serde(untagged)]
pub enum QLora {
    Rank(u64),
    None,
    Unknown(&'static str),
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
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

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct SharedExperts {
    pub count: u64,
    pub intermediate_size: Option<u64>,
    /// vLLM builds the shared experts as one MLP of count × intermediate_size.
    pub fused_intermediate_size: Option<u64>,
    /// "sigmoid" for Qwen2-MoE's shared_expert_gate; `None` when ungated.
    pub gate: Option<&'static str>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Router {
    pub scoring_func: Option<String>,
    pub topk_method: Option<String>,
    /// An F32 `e_score_correction_bias` of one value per routed expert.
    pub e_score_correction_bias: bool,
    /// The router linear layer has a bias (gpt-oss).
    pub bias: bool,
}

/// Far above any real model (DeepSeek-V3 has 61 layers): a config claiming billions of layers
/// would otherwise have inspect list them all.
const MAX_LISTED_LAYERS: u64 = 1 << 16;

/// `mapping` is the one `plan` would use (`None`: wload has none for the architecture);
/// `mapping_file` is `--mapping FILE`, for messages.
pub(crate) fn structure(
    c: &ModelConfig,
    mapping: Option<&Mapping>,
    mapping_file: Option<&Path>,
) -> Structure {
    let v = Variables::new(mapping, c, mapping_file);
    let Some(m) = mapping else {
        return Structure {
            attention: attention(c, &v, &[]),
            attention_layers: None,
            moe: unmapped_moe(c, &v),
            mtp_layers: num(&v, "num_nextn_predict_layers").or_else(|| {
                v.get("num_nextn_predict_layers")
                    .is_none_or(Value::is_null)
                    .then_some(0)
            }),
            mtp_field: Some("num_nextn_predict_layers".into()),
            module_tree: None,
        };
    };
    let layers = v.eval_u64(&m.parameters.layers, None).ok();
    Structure {
        attention: attention(c, &v, &m.parameters.layer),
        attention_layers: attention_layers(&v, &m.parameters.layer, layers),
        moe: moe(&v, &m.parameters.layer, layers),
        mtp_layers: mtp_layers(&v, m.skip_layer.as_ref(), layers),
        mtp_field: m
            .skip_layer
            .as_ref()
            .and_then(|e| config_fields(m, e, 0).into_iter().next()),
        module_tree: m.module_tree.clone(),
    }
}

/// The config fields `e` reads, looking through the mapping's derived values (a `skip_layer` may
/// read a derived count), but not the layer count or index.
fn config_fields(m: &Mapping, e: &Expr, depth: usize) -> Vec<String> {
    let mut out = Vec::new();
    for name in e.vars() {
        if matches!(name, "i" | "num_hidden_layers") {
            continue;
        }
        match m.derive.get(name) {
            // A derived value reads only the ones before it: the depth bound is a guard.
            Some(d) if depth < m.derive.len() => out.extend(config_fields(m, d, depth + 1)),
            Some(_) => {}
            None => out.push(name.to_string()),
        }
    }
    out
}

/// An architecture without a mapping: only what its config states (no layer rule, no defaults).
fn unmapped_moe(c: &ModelConfig, v: &Variables) -> Option<Moe> {
    let experts = c.num_experts.filter(|n| *n > 0)?;
    let topk = string(v, "topk_method");
    Some(Moe {
        routed_experts: Some(experts),
        experts_per_token: num(v, "num_experts_per_tok"),
        expert_intermediate_size: c.moe_intermediate_size,
        shared_experts: None,
        moe_layers: None,
        dense_layers: None,
        layer_rule: None,
        router: Router {
            scoring_func: string(v, "scoring_func"),
            e_score_correction_bias: topk.as_deref() == Some("noaux_tc"),
            topk_method: topk,
            bias: false,
        },
    })
}

fn num(v: &Variables, name: &str) -> Option<u64> {
    v.get(name).and_then(Value::as_u64)
}

fn string(v: &Variables, name: &str) -> Option<String> {
    v.get(name).and_then(Value::as_str).map(str::to_string)
}

/// MLA when the variables have a kv latent rank (DeepSeek's config fields, with the mapping's
/// defaults); otherwise heads, with head_dim as the mapping's qkv layout computes it.
fn attention(c: &ModelConfig, v: &Variables, layer: &[ParamSpec]) -> Attention {
    if v.get("kv_lora_rank").is_some_and(|x| !x.is_null()) {
        return Attention::Mla(Mla {
            heads: c.num_attention_heads,
            q_lora_rank: q_lora(v),
            kv_lora_rank: num(v, "kv_lora_rank"),
            qk_nope_head_dim: num(v, "qk_nope_head_dim"),
            qk_rope_head_dim: num(v, "qk_rope_head_dim"),
            v_head_dim: num(v, "v_head_dim"),
        });
    }
    // As the family's qkv layout computes them (its defaults for fields the config leaves out).
    let qkv = layer.iter().find_map(|p| match &p.layout {
        Layout::Qkv(q) => Some((&q.head_dim, &q.kv_heads)),
        _ => None,
    });
    let head_dim = match qkv {
        Some((d, _)) => v.eval_u64(d, Some(0)).ok(),
        None => num(v, "head_dim").or_else(|| c.hidden_size.checked_div(c.num_attention_heads)),
    };
    let kv_heads = qkv.and_then(|(_, k)| v.eval_u64(k, Some(0)).ok());
    let h = Heads {
        heads: c.num_attention_heads,
        kv_heads: kv_heads.unwrap_or(c.num_key_value_heads),
        head_dim,
    };
    match h.kv_heads {
        1 if h.heads > 1 => Attention::Mqa(h),
        k if k < h.heads => Attention::Gqa(h),
        _ => Attention::Mha(h),
    }
}

/// The mapping's `q_lora` (whether vLLM builds q_a_proj/q_b_proj) when it derives one; else the
/// config's field as transformers reads it: an explicit `null` or 0 means q is projected straight
/// from the hidden state (deepseek_v2.py:1051).
fn q_lora(v: &Variables) -> QLora {
    let rank = || num(v, "q_lora_rank").map_or(QLora::Unknown("unknown"), QLora::Rank);
    match v.get("q_lora") {
        Some(Value::Bool(false)) => QLora::None,
        Some(Value::Bool(true)) => rank(),
        _ if v.is_derived("q_lora") => QLora::Unknown("unknown"),
        _ => match v.get("q_lora_rank") {
            Some(Value::Null) => QLora::None,
            Some(x) if x.as_u64() == Some(0) => QLora::None,
            _ => rank(),
        },
    }
}

/// Full and linear attention layers, when the mapping builds the qkv parameter on some layers
/// only (a hybrid model); `None` when it builds it on every layer, or has none (MLA: every layer).
fn attention_layers(
    v: &Variables,
    layer: &[ParamSpec],
    layers: Option<u64>,
) -> Option<AttentionLayers> {
    let qkv = (layer.iter()).find(|p| matches!(p.layout, Layout::Qkv { .. }))?;
    let when = qkv.when.as_ref()?;
    let (full, layer_rule) = built_on(v, qkv, layers);
    if let (Some(f), Some(n)) = (&full, layers)
        && f.len() as u64 == n
    {
        return None;
    }
    let linear = full.as_ref().zip(layers).map(|(f, n)| others(f, n));
    // A hybrid family decides by a derived value (Qwen3.5's `linear_layer`): name the config
    // fields behind it.
    let layer_rule = layer_rule.or_else(|| {
        let parts: Vec<String> = (when.vars_through_substitutions().into_iter())
            .filter(|k| !matches!(*k, "i" | "num_hidden_layers"))
            .filter_map(|k| Some(format!("{k} {}", show(v.get(k)?))))
            .collect();
        (!parts.is_empty()).then(|| parts.join(", "))
    });
    Some(AttentionLayers {
        full,
        linear,
        layer_rule,
    })
}

/// The layers below `n` not in `of` (ascending: a binary search keeps 65536 layers instant).
fn others(of: &[u64], n: u64) -> Vec<u64> {
    (0..n).filter(|i| of.binary_search(i).is_err()).collect()
}

fn is_experts(p: &ParamSpec) -> bool {
    matches!(
        p.layout,
        Layout::Experts(_) | Layout::GptOssExperts(_) | Layout::TransposedExperts(_)
    )
}

/// Whether the mapping may build `p` at layer `i`: none of its `when`'s conditions is false
/// (one that cannot be evaluated, for a config field of the wrong type, leaves it built: the
/// planner reports why).
fn may_build(v: &Variables, p: &ParamSpec, i: Option<u64>) -> bool {
    p.when.as_ref().is_none_or(|w| {
        w.conjuncts()
            .iter()
            .all(|c| v.eval_bool(c, i).unwrap_or(true))
    })
}

fn moe(v: &Variables, layer: &[ParamSpec], layers: Option<u64>) -> Option<Moe> {
    let experts = layer.iter().find(|p| is_experts(p))?;
    let (moe_layers, layer_rule) = built_on(v, experts, layers);
    // No layer with experts: vLLM's dense fallback (n_routed_experts 0, Qwen's num_experts 0).
    if moe_layers.as_ref().is_some_and(Vec::is_empty) {
        return None;
    }
    let probe = moe_layers.as_ref().and_then(|m| m.first().copied());
    let dims = match &experts.layout {
        Layout::Experts(k) => Some((&k.experts, &k.intermediate)),
        Layout::GptOssExperts(k) => Some((&k.experts, &k.intermediate)),
        Layout::TransposedExperts(k) => Some((&k.experts, &k.intermediate)),
        _ => None,
    };
    let (count, intermediate) = match dims {
        Some((experts, intermediate)) => (
            v.eval_u64(experts, probe).ok(),
            v.eval_u64(intermediate, probe).ok(),
        ),
        None => (None, None),
    };
    let built: Vec<&ParamSpec> = layer.iter().filter(|p| may_build(v, p, probe)).collect();
    let named = |suffix: &str| built.iter().any(|p| p.name.ends_with(suffix));
    let dense_layers = moe_layers.as_ref().zip(layers).map(|(m, n)| others(m, n));
    Some(Moe {
        routed_experts: count,
        experts_per_token: num(v, "num_experts_per_tok"),
        expert_intermediate_size: intermediate,
        shared_experts: shared_experts(v, &built),
        moe_layers,
        dense_layers,
        layer_rule,
        router: Router {
            // Not a mapping fact: config.json's (or the mapping's default), softmax otherwise.
            scoring_func: string(v, "scoring_func").or(Some("softmax".into())),
            topk_method: string(v, "topk_method"),
            e_score_correction_bias: named("e_score_correction_bias"),
            bias: named("router.bias") || named("gate.bias"),
        },
    })
}

/// vLLM builds the shared experts as one MLP (its gate_up_proj's halves are count ×
/// intermediate_size wide), tensor-parallel even with expert parallelism; Qwen2-MoE scales it by
/// sigmoid(shared_expert_gate). The count is config.json's `n_shared_experts` (with the mapping's
/// default), one when the family has no such field.
fn shared_experts(v: &Variables, built: &[&ParamSpec]) -> Option<SharedExperts> {
    let fused = built.iter().find_map(|p| match &p.layout {
        Layout::MergedColumn(m) if p.name.contains("shared_expert") && p.tied_to.is_none() => {
            Some(m.sizes.first().and_then(|s| v.eval_u64(s, None).ok()))
        }
        _ => None,
    })?;
    let count = match v.get("n_shared_experts") {
        None | Some(Value::Null) => 1,
        Some(x) => x.as_u64()?,
    };
    let gated = built
        .iter()
        .any(|p| p.name.ends_with("shared_expert_gate.weight"));
    (count > 0).then(|| SharedExperts {
        count,
        intermediate_size: fused.and_then(|f| (f % count == 0).then(|| f / count)),
        fused_intermediate_size: fused,
        gate: gated.then_some("sigmoid"),
    })
}

/// The layers where the mapping builds `p` (the experts, the attention), and the config fields
/// that leave it out of the others ("first_k_dense_replace 1"), or the value that makes them
/// unknown.
fn built_on(
    v: &Variables,
    p: &ParamSpec,
    layers: Option<u64>,
) -> (Option<Vec<u64>>, Option<String>) {
    let Some(n) = layers.filter(|n| *n <= MAX_LISTED_LAYERS) else {
        return (None, None);
    };
    let Some(when) = &p.when else {
        return (Some((0..n).collect()), None);
    };
    let conds = when.conjuncts();
    if let Some(odd) = conds.iter().find_map(|c| odd_field(v, c)) {
        return (None, Some(odd));
    }
    let mut moe = Vec::new();
    // Which conditions keep some layer dense: the fields they read decide the layers.
    let mut deciding = vec![false; conds.len()];
    for i in 0..n {
        match v.eval_bool(when, Some(i)) {
            Ok(true) => moe.push(i),
            Ok(false) => {
                for (k, c) in conds.iter().enumerate() {
                    deciding[k] |= v.eval_bool(c, Some(i)) == Ok(false);
                }
            }
            Err(err) => {
                // The fields of the condition that failed ("decoder_sparse_step 0"), or why.
                let failed = conds.iter().find(|c| v.eval(c, Some(i)).is_err());
                let why = failed.and_then(|c| fields(v, [c]));
                return (None, why.or_else(|| Some(format!("layer {i}: {err}"))));
            }
        }
    }
    let rule = fields(
        v,
        conds
            .iter()
            .zip(&deciding)
            .filter(|(_, d)| **d)
            .map(|(c, _)| c),
    );
    (Some(moe), rule)
}

/// The config fields `conds` read (not the mapping's derived values, not `i`), each once with its
/// value: "decoder_sparse_step 2, mlp_only_layers [0]".
fn fields<'e>(v: &Variables, conds: impl IntoIterator<Item = &'e Expr>) -> Option<String> {
    let mut seen: Vec<&str> = Vec::new();
    for c in conds {
        for name in c.vars() {
            if name != "i" && !v.is_derived(name) && !seen.contains(&name) {
                seen.push(name);
            }
        }
    }
    let parts: Vec<String> = seen
        .iter()
        .filter_map(|k| Some(format!("{k} {}", show(v.get(k)?))))
        .collect();
    (!parts.is_empty()).then(|| parts.join(", "))
}

/// Lists past this many items are shown by their first ones and their length: a 60-layer
/// `layer_types` is not a readable rule.
const SHOWN_ITEMS: usize = 6;

fn show(x: &Value) -> String {
    match x {
        Value::Array(a) if a.len() > SHOWN_ITEMS => {
            let items: Vec<String> = a.iter().take(3).map(show).collect();
            format!("[{}, …] ({} items)", items.join(", "), a.len())
        }
        Value::Array(a) => {
            let items: Vec<String> = a.iter().map(show).collect();
            format!("[{}]", items.join(", "))
        }
        Value::String(t) => t.clone(),
        other => other.to_string(),
    }
}

/// The first variable `e` reads whose value no layer rule can use (a string, a negative or
/// fractional number, a list of anything but layer indices), as written
/// ("first_k_dense_replace = \"three\""), for saying why the layers are unknown.
fn odd_field(v: &Variables, e: &Expr) -> Option<String> {
    e.vars().into_iter().find_map(|k| {
        let x = v.get(k)?;
        let fine = match x {
            Value::Null | Value::Bool(_) => true,
            Value::Number(n) => n.is_u64(),
            Value::Array(a) => a.iter().all(Value::is_u64),
            Value::String(_) | Value::Object(_) => false,
        };
        (!fine).then(|| format!("{k} = {x}"))
    })
}

/// Multi-token-prediction layers past the decoder layers: the run of layer indices from
/// `layers` on that the mapping's `skip_layer` skips (vLLM's main model skips their weights).
/// None without a `skip_layer`; unknown when it reads an odd value or cannot be evaluated.
fn mtp_layers(v: &Variables, skip: Option<&Expr>, layers: Option<u64>) -> Option<u64> {
    let Some(skip) = skip else { return Some(0) };
    if odd_field(v, skip).is_some() {
        return None;
    }
    let start = layers?;
    let skipped = |n: u64| -> Option<bool> { v.eval_bool(skip, Some(start.checked_add(n)?)).ok() };
    if !skipped(0)? {
        return Some(0);
    }
    // The skipped layers are one run: gallop to a layer past it, then bisect for its end, so that
    // a config claiming a million MTP layers costs a few dozen evaluations.
    let (mut yes, mut no) = (0u64, 1u64);
    while skipped(no)? {
        yes = no;
        no = no.checked_mul(2)?;
    }
    while no - yes > 1 {
        let mid = yes + (no - yes) / 2;
        if skipped(mid)? {
            yes = mid;
        } else {
            no = mid;
        }
    }
    Some(yes + 1)
}
