//! `inspect`'s architecture verdict: whether wload maps the config's architecture (so `plan`,
//! `shard` and `load` accept it), with which mapping, and what vLLM 0.33 does with it as far as
//! wload knows; for an architecture without a mapping, the closest names that have one.
//!
//! The verdict is the mapping selection `plan` runs ([`crate::mapping::select`]), so the two
//! cannot disagree; its refusal is the error `plan` prints, and `inspect` exits with its status
//! after printing everything else it read.

use serde::Serialize;

use crate::commands::error::Error;
use crate::mapping::{Mapping, MappingError};
use crate::model::deepseek_v4::PlatformSpecific;

/// The closest supported names listed for an unsupported architecture, at most.
const CLOSEST_SHOWN: usize = 3;

/// Below this Jaro-Winkler similarity of the model names (`Qwen3Omni` of
/// `Qwen3OmniForConditionalGeneration`), a supported name is not offered as close.
const CLOSE_ENOUGH: f64 = 0.75;

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Support {
    /// `plan`, `shard` and `load` accept the architecture: a mapping serves it.
    pub supported: bool,
    /// `architectures[0]`, what vLLM builds; `null` when the config names none.
    pub architecture: Option<String>,
    /// The mapping's family (`llama`), when one serves it.
    pub family: Option<String>,
    /// The `--mapping FILE` that serves it; `null` for a built-in mapping (or none).
    pub mapping_file: Option<String>,
    /// What vLLM 0.33 does with the architecture as far as wload knows: "supported" for every
    /// architecture a built-in mapping serves (each is checked against vLLM 0.33),
    /// "platform-specific" for DeepSeek-V4 (vLLM builds it, but per platform and GPU),
    /// "supported" too for those vLLM builds with its Transformers backend (its registry's list,
    /// `mapping/transformers_backend.rs`), "unknown" otherwise (wload keeps no list of vLLM's
    /// other architectures).
    pub vllm: &'static str,
    /// Where the structure section comes from: "mapping", or "config.json" alone (no mapping: the
    /// family's defaults and derived values are unknown, so its numbers are not the model's for sure).
    pub structure_from: &'static str,
    /// For an unsupported architecture: the supported names closest to it, closest first.
    pub closest: Vec<String>,
    /// The verdict in one line, as the human report prints it.
    pub summary: String,
    /// The refusal `plan` and `shard` give, kept for the exit status; `None` when supported.
    #[serde(skip)]
    pub refusal: Option<Error>,
}

/// The verdict for `architecture` given the selection's outcome: the mapping chosen, or why none.
pub(crate) fn support(
    architecture: Option<&str>,
    mapping: Option<&Mapping>,
    refusal: Option<MappingError>,
    mapping_file: Option<&std::path::Path>,
) -> Support {
    let arch = architecture.map(str::to_string);
    let builtin = architecture.is_some_and(|a| crate::mapping::select(None, Some(a)).is_ok());
    let backend = match &refusal {
        Some(MappingError::TransformersBackend { class, .. }) => Some(*class),
        _ => None,
    };
    let vllm = if builtin || backend.is_some() {
        "supported"
    } else {
        "unknown"
    };
    let Some(m) = mapping else {
        let closest = match &refusal {
            Some(MappingError::UnknownArchitecture { arch, known }) => closest(arch, known),
            _ => Vec::new(),
        };
        let summary = match (architecture, backend) {
            (Some(arch), Some(class)) => format!(
                "unsupported: vLLM 0.33 builds {arch} with its Transformers modeling backend ({class}), whose fused layout wload maps only for Olmo3ForCausalLM; plan and shard refuse it (exit 3); a mapping file adds it (--mapping FILE, docs/mapping-format.md)"
            ),
            _ => unsupported_summary(architecture, &closest),
        };
        return Support {
            supported: false,
            architecture: arch,
            family: None,
            mapping_file: None,
            vllm,
            structure_from: "config.json",
            closest,
            summary,
            refusal: refusal.map(Error::from),
        };
    };
    let by = match mapping_file {
        Some(f) => format!("--mapping {} (family {})", f.display(), m.family),
        None => format!("the built-in {} mapping", m.family),
    };
    let vllm_says = if builtin {
        "vLLM 0.33 builds it"
    } else {
        "whether vLLM 0.33 builds it, wload does not know"
    };
    Support {
        supported: true,
        summary: format!(
            "supported: {} by {by}; {vllm_says}; plan, shard and load accept it",
            architecture.unwrap_or("(no architectures in config)")
        ),
        architecture: arch,
        family: Some(m.family.clone()),
        mapping_file: mapping_file.map(|f| f.display().to_string()),
        vllm,
        structure_from: "mapping",
        closest: Vec::new(),
        refusal: None,
    }
}

impl Support {
    /// A supported architecture whose quantization `plan` refuses (GPTQ `desc_act`, a removed
    /// method): refused as `plan` refuses it, so that `inspect` as a CI gate exits as `plan` does.
    pub(crate) fn refuse_quantization(&mut self, quant: Option<&crate::quant::info::QuantInfo>) {
        let Some(r) = quant.and_then(|q| q.refusal.as_ref()) else {
            return;
        };
        if self.refusal.is_some() {
            return;
        }
        self.summary = self.summary.replace(
            "plan, shard and load accept it",
            "but plan, shard and load refuse its quantization (below)",
        );
        let problem = crate::problem::Problem {
            message: r.message.clone(),
            fix: Some(r.fix.clone()),
            ..Default::default()
        };
        self.refusal = Some(crate::plan::PlanError::Invalid(vec![problem]).into());
    }
}

/// The verdict for DeepSeek-V4, which every command that plans refuses (`refusal`) whatever
/// the mapping: its state is platform-specific, and wload has no verified reference for it.
pub(crate) fn platform_specific(refusal: PlatformSpecific) -> Support {
    let arch = refusal.0.architecture.clone();
    Support {
        supported: false,
        summary: format!(
            "unsupported: {arch} is DeepSeek-V4, whose saved state is platform- and GPU-specific; wload has no verified reference for it and writes no rank files for it; plan, shard and load refuse it (exit 3); use vLLM's own loader (--load-format auto)"
        ),
        architecture: Some(arch),
        family: None,
        mapping_file: None,
        vllm: "platform-specific",
        structure_from: "config.json",
        closest: Vec::new(),
        refusal: Some(refusal.into()),
    }
}

fn unsupported_summary(architecture: Option<&str>, closest: &[String]) -> String {
    let Some(arch) = architecture else {
        return "unsupported: config.json names no architecture (no 'architectures'), so no mapping is chosen; plan and shard refuse it (exit 3)".into();
    };
    let near = if closest.is_empty() {
        "no supported architecture has a close name".to_string()
    } else {
        format!("closest supported: {}", closest.join(", "))
    };
    format!(
        "unsupported: wload has no mapping for {arch} ({near}); plan and shard refuse it (exit 3); whether vLLM 0.33 builds it, wload does not know; a mapping file adds the family (--mapping FILE, docs/mapping-format.md)"
    )
}

/// The model name of an architecture, lowercased: `qwen3moe` of `Qwen3MoeForCausalLM`.
fn stem(arch: &str) -> String {
    let s = arch.find("For").map_or(arch, |i| &arch[..i]);
    s.to_lowercase().replace(['_', '-'], "")
}

/// The supported names (`known`, comma-separated) closest to `arch`, closest first.
fn closest(arch: &str, known: &str) -> Vec<String> {
    let target = stem(arch);
    let mut scored: Vec<(f64, &str)> = known
        .split(", ")
        .filter(|k| !k.is_empty())
        .map(|k| (strsim::jaro_winkler(&target, &stem(k)), k))
        .filter(|(s, _)| *s >= CLOSE_ENOUGH)
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0).then(a.1.cmp(b.1)));
    scored
        .into_iter()
        .take(CLOSEST_SHOWN)
        .map(|(_, k)| k.to_string())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn close_names_are_offered_and_far_ones_are_not() {
        let known = "LlamaForCausalLM, Qwen2ForCausalLM, Qwen3MoeForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM";
        let c = closest("Qwen3OmniMoeForConditionalGeneration", known);
        assert_eq!(
            c.first().map(String::as_str),
            Some("Qwen3MoeForCausalLM"),
            "{c:?}"
        );
        assert!(c.contains(&"Qwen3ForCausalLM".to_string()), "{c:?}");
        assert_eq!(closest("LLaMAForCausalLM", known), ["LlamaForCausalLM"]);
        assert!(closest("AcmeForCausalLM", known).is_empty());
    }
}
