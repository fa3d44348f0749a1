//! The architectures vLLM 0.33 builds with its Transformers modeling backend
//! (`model_executor/models/registry.py:747-782`, `_TRANSFORMERS_SUPPORTED_MODELS`): no native
//! class, so the state is transformers' module tree with vLLM's graph fusers applied
//! (`models/transformers/base.py` `recursive_replace`: q/k/v fused into `qkv_proj` and gate/up
//! into `gate_up_proj` where the traced dataflow allows, norms swapped as they are detected, the
//! rest split by the config's tensor-parallel plan or replicated). Which fusions apply is decided
//! per model class from its forward, so wload maps only the ones checked against real vLLM
//! (OLMo 3, `mappings/olmo3.yaml`) and refuses the others by name, with the reason, rather than
//! read them with a mapping written for a native class.

/// `(architecture, vLLM's backend class)`, as the registry lists them.
const SENT_TO_BACKEND: &[(&str, &str)] = &[
    ("ArceeForCausalLM", "TransformersForCausalLM"),
    ("CwmForCausalLM", "TransformersForCausalLM"),
    ("FlexOlmoForCausalLM", "TransformersMoEForCausalLM"),
    ("GlmForCausalLM", "TransformersForCausalLM"),
    ("GPTBigCodeForCausalLM", "TransformersForCausalLM"),
    ("GPTNeoXForCausalLM", "TransformersForCausalLM"),
    ("HunYuanDenseV1ForCausalLM", "TransformersForCausalLM"),
    ("HunYuanMoEV1ForCausalLM", "TransformersMoEForCausalLM"),
    ("Jais2ForCausalLM", "TransformersForCausalLM"),
    ("Kolibri1ForCausalLM", "TransformersMoEForCausalLM"),
    ("MellumForCausalLM", "TransformersMoEForCausalLM"),
    ("NanbeigeForCausalLM", "TransformersForCausalLM"),
    ("OlmoForCausalLM", "TransformersForCausalLM"),
    ("Olmo2ForCausalLM", "TransformersForCausalLM"),
    ("Olmo3ForCausalLM", "TransformersForCausalLM"),
    ("PhiForCausalLM", "TransformersForCausalLM"),
    ("SeedOssForCausalLM", "TransformersForCausalLM"),
    ("SmolLM3ForCausalLM", "TransformersForCausalLM"),
    ("Starcoder2ForCausalLM", "TransformersForCausalLM"),
    ("VaultGemmaForCausalLM", "TransformersForCausalLM"),
    (
        "Emu3ForConditionalGeneration",
        "TransformersMultiModalForCausalLM",
    ),
    (
        "HunYuanVLForConditionalGeneration",
        "TransformersMultiModalForCausalLM",
    ),
    (
        "VibeVoiceAsrForConditionalGeneration",
        "TransformersMultiModalForCausalLM",
    ),
    // Named in config.json directly (`--model-impl transformers` checkpoints).
    ("TransformersForCausalLM", "TransformersForCausalLM"),
    ("TransformersMoEForCausalLM", "TransformersMoEForCausalLM"),
    (
        "TransformersMultiModalForCausalLM",
        "TransformersMultiModalForCausalLM",
    ),
    (
        "TransformersMultiModalMoEForCausalLM",
        "TransformersMultiModalMoEForCausalLM",
    ),
];

/// vLLM's Transformers-backend class for `arch`, when vLLM 0.33 builds it with that backend.
pub(crate) fn backend_class(arch: &str) -> Option<&'static str> {
    SENT_TO_BACKEND
        .iter()
        .find(|(a, _)| *a == arch)
        .map(|(_, class)| *class)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_registry_list_names_each_architecture_once() {
        let mut names: Vec<&str> = SENT_TO_BACKEND.iter().map(|(a, _)| *a).collect();
        names.sort();
        names.dedup();
        assert_eq!(names.len(), SENT_TO_BACKEND.len());
        assert_eq!(
            backend_class("Olmo3ForCausalLM"),
            Some("TransformersForCausalLM")
        );
        assert_eq!(backend_class("LlamaForCausalLM"), None);
    }
}
