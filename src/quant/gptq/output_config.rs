//! A GPTQ output's config.json must name its quantized modules. vLLM 0.33's `AutoGPTQConfig`
//! without `modules_in_block_to_quantize` reads them from the loaded folder's tensor dtypes
//! (`maybe_update_config`); the rank files hold the fused names (`qkv_proj`, `gate_up_proj`),
//! where `is_layer_gptq_quantized` looks for the checkpoint's (`q_proj`, `gate_proj`), so
//! the fused layers would be built unquantized and the reload fails with a `KeyError` on
//! `…qkv_proj.qweight` (verified against real vLLM, spec §10.1). With the list written in the
//! form GPTQ tools write it — per block, groups of checkpoint names — the reload is identical.

use serde_json::Value;

use crate::quant::Written;

/// Adds `modules_in_block_to_quantize` to a GPTQ `quantization_config` (`qc`) that has none;
/// says what it wrote, or `None` when nothing was needed.
pub(super) fn add_quantized_modules(
    qc: &mut Value,
    written: &dyn Fn() -> Vec<Written>,
) -> Option<String> {
    let listed = qc.get("modules_in_block_to_quantize");
    if listed.is_some_and(|v| v.as_array().is_some_and(|a| !a.is_empty())) {
        return None;
    }
    let groups = quantized_groups(&written());
    if groups.is_empty() {
        return None;
    }
    let count = groups.len();
    qc["modules_in_block_to_quantize"] = Value::from(groups);
    Some(format!(
        "quantization_config.modules_in_block_to_quantize: (absent) → {count} group(s) of the checkpoint's quantized modules (vLLM would otherwise read them from the rank files' fused names, build qkv_proj / gate_up_proj unquantized and fail to load the folder)"
    ))
}

/// The checkpoint modules each quantized linear layer (a `.qweight` parameter, routed experts
/// aside: vLLM quantizes those regardless) is filled from, one group per layer. Named within the block
/// (`self_attn.q_proj`, Qwen3.5's `linear_attn.in_proj_qkv`), as GPTQ tools write them, unless
/// some block leaves a module of that name unquantized; then by their full names.
fn quantized_groups(written: &[Written]) -> Vec<Vec<String>> {
    let mut full: Vec<Vec<String>> = Vec::new();
    for t in written {
        // Routed experts' are `w13_qweight` / `w2_qweight`; a shared expert's `qweight` counts
        // (under its runner path too, `mlp.experts._shared_experts._layer`: the same sources).
        if !t.name.ends_with(".qweight") {
            continue;
        }
        let mut group: Vec<String> = Vec::new();
        for name in &t.sources {
            let module = name.strip_suffix(".qweight").unwrap_or(name).to_string();
            if !group.contains(&module) {
                group.push(module);
            }
        }
        if !group.is_empty() && !full.contains(&group) {
            full.push(group);
        }
    }
    let in_block = |g: &Vec<String>| -> Option<Vec<String>> {
        g.iter()
            .map(|m| within_block(m).map(str::to_string))
            .collect()
    };
    let Some(relative) = full.iter().map(in_block).collect::<Option<Vec<_>>>() else {
        return full;
    };
    let mut blocks: Vec<Vec<String>> = Vec::new();
    for g in &relative {
        if !blocks.contains(g) {
            blocks.push(g.clone());
        }
    }
    // vLLM matches the names as substrings of every layer's: the short form holds unless a
    // module it names is left unquantized in some block. A block without the module at all (a
    // hybrid's full-attention layer has no `linear_attn`) is no reason for the long form.
    let quantized: std::collections::HashSet<&str> =
        full.iter().flatten().map(String::as_str).collect();
    let short: std::collections::HashSet<&str> =
        blocks.iter().flatten().map(String::as_str).collect();
    let clash = (written.iter())
        .filter(|t| !t.name.contains(".routed_experts."))
        .flat_map(|t| &t.sources)
        .filter_map(|s| s.rsplit_once('.').map(|(m, _)| m))
        .filter(|m| !quantized.contains(m))
        .any(|m| within_block(m).is_some_and(|b| short.contains(b)));
    if clash { full } else { blocks }
}

/// `self_attn.q_proj` of `model.layers.12.self_attn.q_proj`: the name after the block index.
fn within_block(module: &str) -> Option<&str> {
    let (_, rest) = module.split_once(".layers.")?;
    let (index, name) = rest.split_once('.')?;
    index.bytes().all(|b| b.is_ascii_digit()).then_some(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_names_are_the_part_after_the_layer_index() {
        assert_eq!(
            within_block("model.layers.12.self_attn.q_proj"),
            Some("self_attn.q_proj")
        );
        assert_eq!(within_block("lm_head"), None);
        assert_eq!(within_block("model.layers.x.mlp"), None);
    }
}
