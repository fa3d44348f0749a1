//! Names: the checkpoint-name rules a quantization config adds to every model's mapper (kv-cache
//! scales renamed onto the Attention layer, `.g_idx` dropped), and what a checkpoint tensor is
//! for, read from its name (`inspect`'s roles).

use super::Quantization;
use crate::mapping::Mapping;
use crate::mapping::rules::{Outcome, RegexRule, Rules, Step};

impl Quantization {
    /// The rules vLLM's quant config adds to every model's weights mapper
    /// (`get_cache_scale_mapper`, `get_checkpoint_weight_mapper`, models/utils.py:465–468): kv
    /// cache scales renamed onto the Attention layer, the method's own ([`super::Method::name_rules`]),
    /// `.g_idx` dropped; and the suffixes it lets go unmatched.
    pub(crate) fn name_rules(&self) -> (Rules, &'static [&'static str]) {
        let mut regex: Vec<(&str, Option<&str>)> = vec![
            (r"\.kv_scale$", Some(r".attn.k_scale")),
            (
                r"\.self_attn\.[kv]_proj\.([kv])_scale$",
                Some(r".self_attn.attn.\1_scale"),
            ),
            (
                r"\.self_attn\.qk(?:qk)?v_proj\.([kv])_scale$",
                Some(r".self_attn.attn.\1_scale"),
            ),
            (
                r"\.mixer\.[kv]_proj\.([kv])_scale$",
                Some(r".mixer.attn.\1_scale"),
            ),
            (r"\.self_attn\.q\.scale$", Some(r".self_attn.attn.q_scale")),
            (
                r"\.self_attn\.([kv])_cache\.scale$",
                Some(r".self_attn.attn.\1_scale"),
            ),
            // vLLM's `(?<!\.attn)\.([qkv])_scale$`: the regex crate has no look-behind, so the
            // text before the suffix is matched as "anything that does not end in `.attn`".
            (
                r"^((?:.*[^n]|.*[^t]n|.*[^t]tn|.*[^a]ttn|.*[^.]attn|n|tn|ttn|attn)?)\.([qkv])_scale$",
                Some(r"\1.attn.\2_scale"),
            ),
            (
                r"^((?:.*[^n]|.*[^t]n|.*[^t]tn|.*[^a]ttn|.*[^.]attn|n|tn|ttn|attn)?)\.([qkv])_zero_point$",
                Some(r"\1.attn.\2_zero_point"),
            ),
        ];
        // The method's own, before `.g_idx` (vLLM's mapper order).
        regex.extend(self.0.name_rules());
        regex.push((r"\.g_idx$", None));
        let mut rules = Rules::default();
        rules.regex = regex
            .into_iter()
            .map(|(p, r)| RegexRule {
                pattern: p.to_string(),
                replace: r.map(str::to_string),
            })
            .collect();
        const IGNORED: &[&str] = &[
            ".q_scale",
            ".k_scale",
            ".v_scale",
            ".q_zero_point",
            ".k_zero_point",
            ".v_zero_point",
        ];
        (rules, IGNORED)
    }

    /// `mapping` with the name rules this config adds to every model's mapper (merged after the
    /// family's, as vLLM's `mapper |= quant_config.get_cache_scale_mapper()`) and the suffixes
    /// it lets go unmatched.
    pub(crate) fn with_name_rules(&self, mapping: &Mapping) -> Mapping {
        let mut m = mapping.clone();
        let (rules, suffixes) = self.name_rules();
        m.rules.merge_common(rules);
        m.rules
            .compile()
            .expect("the quantization rules are valid regexes (unit-tested)");
        m.ignore_unexpected_suffixes
            .extend(suffixes.iter().map(|s| s.to_string()));
        m
    }
}

/// `apply_vllm_mapper` of a method's module list: the names the model's renames give `modules`
/// that the list does not hold yet (a VLM's `model.language_model.` → `language_model.model.`),
/// for the method to add beside the names as written.
pub(super) fn mapped_modules(rules: &Rules, modules: &[String]) -> Vec<String> {
    (modules.iter())
        .filter_map(|n| mapped_module(rules, n))
        .filter(|m| !modules.contains(m))
        .collect()
}

/// A module name through the model's renames (its weight's name, the stacked rule undone).
pub(super) fn mapped_module(rules: &Rules, module: &str) -> Option<String> {
    let Ok(Outcome::Mapped(m)) = rules.apply(&format!("{module}.weight")) else {
        return None;
    };
    if m.expert.is_some() {
        return None;
    }
    let mut t = m.target.strip_suffix(".weight")?.to_string();
    for step in m.trace.iter().rev() {
        if let Step::Stacked(k) = step {
            let s = &rules.stacked[*k];
            if let Some(at) = t.rfind(&s.to) {
                t.replace_range(at..at + s.to.len(), &s.from);
            }
        }
    }
    Some(rules.built_module(&t))
}

/// What a checkpoint tensor is for, read from the last part of its name: the spellings vLLM's
/// quantization methods load (fp8, compressed-tensors, ModelOpt, GPTQ/AWQ), so that `inspect` can
/// describe a quantized checkpoint wload refuses as well as one it writes.
/// A kv-cache zero point goes with the kv-cache scales.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize, schemars::JsonSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum TensorRole {
    Weight,
    /// Integer or FP4 values packed into words or bytes (compressed-tensors `weight_packed`,
    /// GPTQ/AWQ `qweight`, gpt-oss MXFP4 `*_blocks`).
    PackedWeight,
    WeightScale,
    /// One scale for a whole tensor that its block scales are relative to (NVFP4
    /// `weight_scale_2`, `weight_global_scale`).
    GlobalScale,
    /// The integer offsets of asymmetric weights or activations (`weight_zero_point`,
    /// `qzeros`, `input_zero_point`).
    ZeroPoint,
    /// compressed-tensors `weight_shape`: the unpacked weight's shape.
    Shape,
    InputScale,
    KvCacheScale,
    Bias,
    Other,
}

impl TensorRole {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TensorRole::Weight => "weight",
            TensorRole::PackedWeight => "packed weight",
            TensorRole::WeightScale => "weight scale",
            TensorRole::GlobalScale => "global scale",
            TensorRole::ZeroPoint => "zero point",
            TensorRole::Shape => "weight shape",
            TensorRole::InputScale => "input scale",
            TensorRole::KvCacheScale => "kv-cache scale",
            TensorRole::Bias => "bias",
            TensorRole::Other => "other",
        }
    }
}

/// The role of the checkpoint tensor `name`.
pub(crate) fn tensor_role(name: &str) -> TensorRole {
    let (module, last) = name.rsplit_once('.').unwrap_or(("", name));
    match last {
        "weight" => TensorRole::Weight,
        "weight_packed" | "qweight" => TensorRole::PackedWeight,
        "weight_scale" | "weight_scale_inv" | "scales" => TensorRole::WeightScale,
        "weight_scale_2" | "weight_global_scale" => TensorRole::GlobalScale,
        "weight_zero_point" | "qzeros" | "input_zero_point" => TensorRole::ZeroPoint,
        "weight_shape" => TensorRole::Shape,
        "input_scale" | "input_global_scale" => TensorRole::InputScale,
        "k_scale" | "v_scale" | "q_scale" | "prob_scale" | "kv_scale" | "output_scale"
        | "prob_output_scale" | "k_zero_point" | "v_zero_point" | "q_zero_point" => {
            TensorRole::KvCacheScale
        }
        // `self_attn.q.scale`, `self_attn.k_cache.scale`: the older spellings `name_rules` renames.
        "scale"
            if [".q", ".k_cache", ".v_cache"]
                .iter()
                .any(|m| module.ends_with(m)) =>
        {
            TensorRole::KvCacheScale
        }
        "bias" => TensorRole::Bias,
        // gpt-oss experts: `gate_up_proj_bias`, and MXFP4's `gate_up_proj_blocks`, `down_proj_scales`.
        l if l.ends_with("_proj_bias") => TensorRole::Bias,
        l if l.ends_with("_blocks") => TensorRole::PackedWeight,
        l if l.ends_with("_scales") => TensorRole::WeightScale,
        _ => TensorRole::Other,
    }
}

#[cfg(test)]
mod role_tests {
    use super::{TensorRole, tensor_role};

    #[test]
    fn tensor_roles_follow_the_name_suffix() {
        let l = "model.layers.0";
        for (name, role) in [
            (format!("{l}.self_attn.q_proj.weight"), TensorRole::Weight),
            (format!("{l}.input_layernorm.weight"), TensorRole::Weight),
            (
                format!("{l}.self_attn.q_proj.weight_scale"),
                TensorRole::WeightScale,
            ),
            (
                format!("{l}.mlp.experts.3.up_proj.weight_scale_inv"),
                TensorRole::WeightScale,
            ),
            (format!("{l}.mlp.down_proj.qzeros"), TensorRole::ZeroPoint),
            (
                format!("{l}.mlp.down_proj.weight_zero_point"),
                TensorRole::ZeroPoint,
            ),
            (
                format!("{l}.mlp.experts.3.up_proj.weight_packed"),
                TensorRole::PackedWeight,
            ),
            (format!("{l}.mlp.up_proj.weight_shape"), TensorRole::Shape),
            (
                format!("{l}.mlp.down_proj.input_scale"),
                TensorRole::InputScale,
            ),
            (
                format!("{l}.self_attn.k_proj.k_scale"),
                TensorRole::KvCacheScale,
            ),
            (format!("{l}.self_attn.kv_scale"), TensorRole::KvCacheScale),
            (
                format!("{l}.self_attn.v_proj.output_scale"),
                TensorRole::KvCacheScale,
            ),
            (
                format!("{l}.self_attn.q_zero_point"),
                TensorRole::KvCacheScale,
            ),
            (
                format!("{l}.self_attn.k_cache.scale"),
                TensorRole::KvCacheScale,
            ),
            (format!("{l}.self_attn.q_proj.bias"), TensorRole::Bias),
            (
                format!("{l}.mlp.experts.gate_up_proj_blocks"),
                TensorRole::PackedWeight,
            ),
            (
                format!("{l}.mlp.experts.gate_up_proj_bias"),
                TensorRole::Bias,
            ),
            (
                format!("{l}.mlp.up_proj.weight_scale_2"),
                TensorRole::GlobalScale,
            ),
            (
                format!("{l}.mlp.up_proj.weight_global_scale"),
                TensorRole::GlobalScale,
            ),
            (
                format!("{l}.mlp.experts.down_proj_scales"),
                TensorRole::WeightScale,
            ),
            (
                format!("{l}.mlp.gate.e_score_correction_bias"),
                TensorRole::Other,
            ),
            (format!("{l}.norm.scale"), TensorRole::Other),
            (format!("{l}.self_attn.q_proj.g_idx"), TensorRole::Other),
            ("weight".to_string(), TensorRole::Weight),
            (String::new(), TensorRole::Other),
        ] {
            assert_eq!(tensor_role(&name), role, "{name}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::Quantization;
    use serde_json::json;

    /// Shipped mappings compile their regexes only when a name needs them, trusting that they
    /// compile: every one does, alone and with each scheme's rules merged in.
    #[test]
    fn every_shipped_mapping_compiles_with_every_schemes_rules() {
        let parse = |v| Quantization::from_config(Some(&v)).unwrap().unwrap();
        let schemes = [
            parse(
                json!({"quant_method": "fp8", "activation_scheme": "dynamic",
                "weight_block_size": [128, 128]}),
            ),
            parse(
                json!({"quant_method": "compressed-tensors", "format": "float-quantized",
                "config_groups": {"g": {"targets": ["Linear"],
                    "weights": {"type": "float", "num_bits": 8, "strategy": "channel"},
                    "input_activations": {"type": "float", "num_bits": 8, "dynamic": true, "strategy": "token"}}}}),
            ),
            parse(
                json!({"quant_method": "compressed-tensors", "format": "pack-quantized",
                "config_groups": {"g": {"targets": ["Linear"],
                    "weights": {"type": "int", "num_bits": 4, "strategy": "group", "group_size": 32, "symmetric": true}}},
                "kv_cache_scheme": {"type": "float", "num_bits": 8, "strategy": "attn_head", "symmetric": true}}),
            ),
        ];
        for m in crate::mapping::embedded() {
            m.rules.check_regexes().unwrap();
            for q in &schemes {
                let with = q.with_name_rules(&m);
                with.rules.check_regexes().unwrap();
                assert!(with.rules.regex.len() > m.rules.regex.len(), "{}", m.family);
            }
        }
    }

    #[test]
    fn kv_scale_names_move_onto_the_attention_layer_unless_already_there() {
        let fp8 = json!({"quant_method": "fp8", "activation_scheme": "dynamic"});
        let (mut rules, _) = Quantization::from_config(Some(&fp8))
            .unwrap()
            .unwrap()
            .name_rules();
        rules.compile().unwrap();
        let target = |n: &str| match rules.apply(n).expect("short names") {
            crate::mapping::rules::Outcome::Mapped(m) => m.target,
            crate::mapping::rules::Outcome::Dropped { .. } => "dropped".into(),
        };
        let l = "model.layers.3.self_attn";
        assert_eq!(
            target(&format!("{l}.k_proj.k_scale")),
            format!("{l}.attn.k_scale")
        );
        assert_eq!(target(&format!("{l}.q_scale")), format!("{l}.attn.q_scale"));
        assert_eq!(
            target(&format!("{l}.attn.v_scale")),
            format!("{l}.attn.v_scale")
        );
        assert_eq!(
            target(&format!("{l}.kv_scale")),
            format!("{l}.attn.k_scale")
        );
        assert_eq!(
            target(&format!("{l}.v_proj.output_scale")),
            format!("{l}.attn.v_scale")
        );
        assert_eq!(
            target(&format!("{l}.q_proj.weight_scale")),
            format!("{l}.q_proj.weight_scale")
        );
        assert_eq!(target(&format!("{l}.q_proj.g_idx")), "dropped");
    }
}
