//! A multimodal checkpoint's encoder (vision tower, projector) as the mapping names it: the
//! checkpoint tensors its rules map under one of its `skip_modules` prefixes (what vLLM does not
//! build with `--language-model-only`), counted and sized, so that a deployer sees what the flag
//! leaves out.

use serde::Serialize;

use crate::checkpoint::Checkpoint;
use crate::map::{self, Fate};
use crate::mapping::Mapping;

/// The encoder's tensors in the checkpoint.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Tower {
    /// The module prefixes, as vLLM names them (`visual.`; `vision_tower.`, `multi_modal_projector.`).
    pub modules: Vec<String>,
    pub tensors: u64,
    pub bytes: u64,
    /// Whether wload maps the tower (Qwen3-VL), or only the text model with
    /// `--language-model-only` (the tower left out).
    pub mapped: bool,
    /// Whether `--mm-encoder-tp-mode data` holds it whole on every rank; `false`: vLLM does not
    /// support that mode for the model and builds the split tower (Gemma 3, Mistral 3).
    pub data_mode: bool,
}

/// The tower of `checkpoint` under `mapping`; `None` for a mapping without one or a checkpoint
/// whose names the rules cannot map (the planner reports that).
pub(crate) fn tower(mapping: &Mapping, checkpoint: &Checkpoint) -> Option<Tower> {
    let modules: Vec<String> = mapping
        .skip_modules
        .iter()
        .map(|m| m.prefix.clone())
        .collect();
    if modules.is_empty() {
        return None;
    }
    let mapped = map::map(mapping, checkpoint).ok()?;
    let (mut tensors, mut bytes) = (0, 0);
    for m in &mapped.tensors {
        if let Fate::Target(t) = &m.fate
            && modules.iter().any(|p| t.parameter.starts_with(p.as_str()))
        {
            tensors += 1;
            bytes += m.tensor.len;
        }
    }
    let mapped_tower = mapping
        .parameters
        .head
        .iter()
        .any(|p| modules.iter().any(|m| p.name.starts_with(m.as_str())));
    Some(Tower {
        modules,
        tensors,
        bytes,
        mapped: mapped_tower,
        data_mode: mapping.encoder_tp_data,
    })
}
