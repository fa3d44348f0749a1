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

/// The checkpoint modules each quantized linear layer (a `.qweight` parameter, experts aside:
/// vLLM quantizes those regardless) is filled from, one group per layer. When every block has
/// the same groups, they are named within the block (`self_attn.q_proj`), as GPTQ tools write
/// them; otherwise by their full names.
fn quantized_groups(written: &[Written]) -> Vec<Vec<String>> {
    let mut full: Vec<Vec<String>> = Vec::new();
    for t in written {
        if !t.name.ends_with(".qweight") || t.name.contains(".experts.") {
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
    // Each block's groups, counted: the short form only says the same of every block.
    let per_block = full.len() / blocks.len().max(1);
    let uniform = blocks
        .iter()
        .all(|b| relative.iter().filter(|g| *g == b).count() == per_block);
    if uniform { blocks } else { full }
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
