//! transformers' attribute aliases: two spellings of one config attribute, as the config class
//! resolves them before vLLM reads the attribute.
//!
//! The table is keyed by `model_type` rather than declared per mapping family because that is
//! where transformers keeps it: the config class (picked by `model_type`) owns its
//! `attribute_map`, the resolution happens when the config is read, before any model is chosen,
//! and `inspect`'s summary and `--hf-overrides` must see the resolved config, not only a family's
//! expressions.

use serde_json::{Map, Value};

/// `alias` is read as `attribute` (transformers' `attribute_map`: alias → attribute).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConfigAlias {
    pub alias: &'static str,
    pub attribute: &'static str,
    /// Which spelling transformers keeps when config.json has both: the class's dataclass field
    /// is set first, and the other spelling, passed on as an extra keyword, is set after it
    /// through `attribute_map` (configuration_utils.py:157–174, 497–501, 644–647).
    pub wins: Wins,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Wins {
    Attribute,
    Alias,
}

const fn alias(alias: &'static str, attribute: &'static str, wins: Wins) -> ConfigAlias {
    ConfigAlias {
        alias,
        attribute,
        wins,
    }
}

// vLLM 0.33 requires transformers >=5.16.1,<5.21.0; the entries below are read from 5.20.0 (and
// are the same in 5.24.0), and which spelling wins was checked by loading configs with both
// through 5.20's classes.
//
// PreTrainedConfig (configuration_utils.py, 4.57.1 `__init__` and 5.x `__post_init__`) pops the
// `torch_dtype` kwarg into `dtype` ("If both are provided, keep `dtype`"), and 5.x keeps a
// `torch_dtype` property that reads `dtype`: an alias for every config class.
const DTYPE: ConfigAlias = alias("torch_dtype", "dtype", Wins::Attribute);
const BASE: &[ConfigAlias] = &[DTYPE];

// transformers 5 renamed the routed expert count of these classes to `num_local_experts` and
// kept `num_experts` in `attribute_map` (models/mixtral/configuration_mixtral.py,
// models/qwen3_moe/configuration_qwen3_moe.py, models/gpt_oss/configuration_gpt_oss.py); 4.57.1
// had no `attribute_map` there. Configs written by transformers 5 therefore carry
// `num_local_experts` for Qwen3-MoE and Hub configs `num_experts`, and vLLM reads the resolved
// attribute either way. Mixtral's and gpt-oss's field is `num_local_experts`, Qwen3-MoE's
// `num_experts`: the other spelling wins.
const MIXTRAL_GPT_OSS: &[ConfigAlias] = &[
    DTYPE,
    alias("num_experts", "num_local_experts", Wins::Alias),
];
const QWEN3_MOE: &[ConfigAlias] = &[
    DTYPE,
    alias("num_experts", "num_local_experts", Wins::Attribute),
];
// DeepseekV2Config reads `num_experts` as `n_routed_experts`, its field
// (models/deepseek_v2/configuration_deepseek_v2.py:102).
const DEEPSEEK_V2: &[ConfigAlias] = &[DTYPE, alias("num_experts", "n_routed_experts", Wins::Alias)];
// DeepseekV3Config and Glm4MoeConfig read `num_local_experts` as `n_routed_experts` (a field) and
// `num_mtp_layers` (a field) as `num_nextn_predict_layers` (models/deepseek_v3/
// configuration_deepseek_v3.py:77, models/glm4_moe/configuration_glm4_moe.py:86), the layers
// vLLM's main model skips.
const N_ROUTED_EXPERTS_MTP: &[ConfigAlias] = &[
    DTYPE,
    alias("num_local_experts", "n_routed_experts", Wins::Alias),
    alias(
        "num_mtp_layers",
        "num_nextn_predict_layers",
        Wins::Attribute,
    ),
];
// Glm4MoeLiteConfig (GLM-4.7-Flash) reads `num_local_experts` as `n_routed_experts` and
// `head_dim` as `qk_rope_head_dim`, neither alias a field, so the alias is set last and wins
// (models/glm4_moe_lite/configuration_glm4_moe_lite.py `attribute_map`).
const GLM4_MOE_LITE: &[ConfigAlias] = &[
    DTYPE,
    alias("num_local_experts", "n_routed_experts", Wins::Alias),
    alias("head_dim", "qk_rope_head_dim", Wins::Alias),
];
// DeepseekV32Config and GlmMoeDsaConfig read `num_local_experts` as `n_routed_experts`
// (models/deepseek_v32/configuration_deepseek_v32.py:85, glm_moe_dsa/…:90).
const N_ROUTED_EXPERTS: &[ConfigAlias] = &[
    DTYPE,
    alias("num_local_experts", "n_routed_experts", Wins::Alias),
];
// No other config class of a family wload maps has an `attribute_map` in 5.20 (llama, mistral,
// qwen2, qwen2_moe, qwen3, gemma2, phi3), and the base class's is empty.

/// The aliases of the config class for `model_type` (the base class's when unknown).
pub(crate) fn for_model_type(model_type: Option<&str>) -> &'static [ConfigAlias] {
    match model_type {
        Some("mixtral" | "gpt_oss") => MIXTRAL_GPT_OSS,
        Some("qwen3_moe") => QWEN3_MOE,
        Some("deepseek_v2") => DEEPSEEK_V2,
        Some("deepseek_v3" | "glm4_moe") => N_ROUTED_EXPERTS_MTP,
        Some("glm4_moe_lite") => GLM4_MOE_LITE,
        Some("deepseek_v32" | "glm_moe_dsa") => N_ROUTED_EXPERTS,
        _ => BASE,
    }
}

/// The aliases for the config object `map` (by its own `model_type`).
pub(crate) fn for_map(map: &Map<String, Value>) -> &'static [ConfigAlias] {
    for_model_type(map.get("model_type").and_then(Value::as_str))
}

/// The other spelling of `name`, if it has one.
pub(crate) fn other_spelling(aliases: &[ConfigAlias], name: &str) -> Option<&'static str> {
    aliases.iter().find_map(|a| {
        if a.attribute == name {
            Some(a.alias)
        } else if a.alias == name {
            Some(a.attribute)
        } else {
            None
        }
    })
}

/// The attribute a write to `key` lands on (transformers' `__setattr__` follows `attribute_map`).
pub(crate) fn attribute_of<'a>(aliases: &[ConfigAlias], key: &'a str) -> &'a str {
    aliases
        .iter()
        .find(|a| a.alias == key)
        .map_or(key, |a| a.attribute)
}

fn present(map: &Map<String, Value>, key: &str) -> bool {
    !matches!(map.get(key), None | Some(Value::Null))
}

/// The alias's value moves to the attribute when the attribute is absent, or when both are
/// present and the alias is the spelling transformers sets last ([`ConfigAlias::wins`]).
pub(crate) fn resolve(map: &mut Map<String, Value>, aliases: &[ConfigAlias]) {
    for a in aliases {
        if (a.wins == Wins::Alias || !present(map, a.attribute))
            && let Some(v) = map.get(a.alias).filter(|v| !v.is_null()).cloned()
        {
            map.insert(a.attribute.to_string(), v);
        }
    }
}

/// Both spellings read the attribute's value, as transformers' `__getattribute__` does, so a
/// mapping expression may use either.
pub(crate) fn mirror(map: &mut Map<String, Value>, aliases: &[ConfigAlias]) {
    for a in aliases {
        if let Some(v) = map.get(a.attribute).filter(|v| !v.is_null()).cloned() {
            map.insert(a.alias.to_string(), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(v: Value) -> Map<String, Value> {
        match v {
            Value::Object(m) => m,
            _ => unreachable!("test input is an object"),
        }
    }

    #[test]
    fn alias_fills_a_missing_attribute_and_the_attribute_wins_over_it() {
        let t = for_model_type(Some("qwen3_moe"));
        let mut m = obj(json!({"num_experts": 8}));
        resolve(&mut m, t);
        assert_eq!(m["num_local_experts"], json!(8));
        let mut m = obj(json!({"num_experts": 8, "num_local_experts": 4}));
        resolve(&mut m, t);
        mirror(&mut m, t);
        assert_eq!(
            (&m["num_experts"], &m["num_local_experts"]),
            (&json!(4), &json!(4))
        );
    }

    #[test]
    fn the_alias_wins_where_the_attribute_is_the_class_field() {
        for model_type in ["mixtral", "gpt_oss", "deepseek_v2"] {
            let t = for_model_type(Some(model_type));
            let a = t[1].attribute;
            let mut m = obj(json!({"num_experts": 8, a: 4}));
            resolve(&mut m, t);
            mirror(&mut m, t);
            assert_eq!(
                (&m["num_experts"], &m[a]),
                (&json!(8), &json!(8)),
                "{model_type}"
            );
        }
        // DeepSeek-V3's MTP field is the alias, so the attribute wins there.
        let t = for_model_type(Some("deepseek_v3"));
        let mut m = obj(json!({"num_local_experts": 8, "n_routed_experts": 4,
            "num_mtp_layers": 3, "num_nextn_predict_layers": 1}));
        resolve(&mut m, t);
        assert_eq!(
            (&m["n_routed_experts"], &m["num_nextn_predict_layers"]),
            (&json!(8), &json!(1))
        );
    }

    #[test]
    fn a_null_attribute_does_not_hide_the_alias() {
        let mut m = obj(json!({"dtype": null, "torch_dtype": "bfloat16"}));
        resolve(&mut m, BASE);
        assert_eq!(m["dtype"], json!("bfloat16"));
    }

    #[test]
    fn other_spelling_goes_both_ways_and_only_for_the_class() {
        let t = for_model_type(Some("mixtral"));
        assert_eq!(other_spelling(t, "num_experts"), Some("num_local_experts"));
        assert_eq!(other_spelling(t, "num_local_experts"), Some("num_experts"));
        assert_eq!(other_spelling(t, "hidden_size"), None);
        assert_eq!(
            other_spelling(for_model_type(Some("llama")), "num_experts"),
            None
        );
        assert_eq!(attribute_of(t, "num_experts"), "num_local_experts");
        assert_eq!(attribute_of(t, "torch_dtype"), "dtype");
        assert_eq!(attribute_of(t, "vocab_size"), "vocab_size");
    }
}
