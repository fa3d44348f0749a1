//! Map: what every checkpoint tensor becomes under a family's name rules, before any parameter is
//! instantiated — the vLLM parameter it names, which slot of it (shard id, expert id), the
//! conversion it needs, or the rule that drops it. Planning consumes this result and never renames.
//!
//! Whether a named parameter exists is not known here: the parameter list depends on the config,
//! `--tp` and `--enable-expert-parallel` (`when:` conditions, the layer count), so "matches no
//! parameter" and "vLLM ignores it" are the plan's assign phase's verdicts.

use std::sync::Arc;

use rayon::prelude::*;
use serde::{Serialize, Serializer};

use crate::checkpoint::{Checkpoint, TensorInfo};
use crate::mapping::Mapping;
use crate::mapping::rules::{Outcome, ShardId};

/// Every tensor vLLM keeps from the checkpoint (a copy shadowed by a later file is left out), in
/// load order, with what it becomes.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct Mapped<'c> {
    #[serde(skip)]
    pub checkpoint: &'c Checkpoint,
    pub tensors: Vec<MappedTensor<'c>>,
}

/// One checkpoint tensor and its fate.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub(crate) struct MappedTensor<'c> {
    #[serde(rename = "name", serialize_with = "tensor_name")]
    #[schemars(with = "String")]
    pub tensor: &'c TensorInfo,
    /// The weight file it is read from.
    pub file: &'c str,
    #[serde(flatten)]
    pub fate: Fate,
}

/// Where a checkpoint tensor goes.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(tag = "fate", rename_all = "snake_case")]
pub(crate) enum Fate {
    /// Into a slot of the parameter it names.
    Target(Target),
    /// Nowhere: a rule maps it to null (vLLM skips it while loading).
    Dropped { rule: String },
}

/// The parameter slot a checkpoint tensor fills.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
pub(crate) struct Target {
    /// The vLLM parameter's name (which may not exist for this config: see the module doc).
    pub parameter: Arc<str>,
    /// Which part of a stacked parameter (`q`/`k`/`v`, `0`/`1`, `w1`/`w2`/`w3`); none for a
    /// parameter filled whole.
    pub shard: Option<ShardId>,
    /// The global expert id, for fused expert parameters.
    pub expert: Option<u64>,
    /// How the rows must be rearranged on the way, beyond a dtype cast.
    /// Boxed: rare, and kept out of every mapped tensor's size.
    pub conversion: Option<Box<Conversion>>,
    /// The rules that changed the name, in order, for messages (`Rules::describe`).
    pub via: crate::mapping::rules::Trace,
}

/// A rearrangement of a tensor's rows between the checkpoint and the parameter.
#[derive(Debug, Clone, PartialEq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Conversion {
    /// Mistral's interleaved rotary rows to the half-split order, per head; `heads` is the mapping's
    /// expression for the head count, evaluated against the model's variables when planning.
    RotaryPermute { heads: String },
}

impl Target {
    /// The slot key of the parameter this tensor fills: shard id and expert id.
    pub(crate) fn slot(&self) -> (Option<ShardId>, Option<u64>) {
        (self.shard.clone(), self.expert)
    }
}

/// Applies `mapping`'s name rules to every tensor vLLM keeps from `checkpoint`; refused when a
/// rule grows a name past the mapping's limit ([`crate::mapping::limits`]).
pub(crate) fn map<'c>(
    mapping: &Mapping,
    checkpoint: &'c Checkpoint,
) -> Result<Mapped<'c>, crate::mapping::MappingError> {
    // Listed first, so that the names (90,000 in a DeepSeek-V3 checkpoint) are mapped in
    // parallel straight into their places in load order.
    let kept: Vec<&TensorInfo> = (checkpoint.files.iter())
        .flat_map(|f| f.tensors.iter())
        .filter(|t| checkpoint.is_effective(t))
        .collect();
    let tensors = kept
        .par_iter()
        .map_init(Recent::default, |recent, &t| {
            let outcome = (mapping.rules.apply_into(&t.name, &mut recent.buffer))
                .map_err(|e| crate::mapping::MappingError::NameTooLong(Box::new(e)))?;
            Ok(MappedTensor {
                tensor: t,
                file: &checkpoint.files[t.file].name,
                fate: fate(outcome, recent),
            })
        })
        .collect::<Result<_, _>>()?;
    Ok(Mapped {
        checkpoint,
        tensors,
    })
}

/// Dropped in parallel: freeing 90,000 mapped tensors one by one cost the plan stage 2 ms.
impl Drop for Mapped<'_> {
    fn drop(&mut self) {
        if self.tensors.len() > 10_000 {
            std::mem::take(&mut self.tensors)
                .into_par_iter()
                .for_each(drop);
        }
    }
}

/// What `outcome` makes of a tensor; its parameter name is in `recent.buffer`.
fn fate(outcome: Outcome<()>, recent: &mut Recent) -> Fate {
    match outcome {
        Outcome::Dropped { rule } => Fate::Dropped { rule },
        Outcome::Mapped(m) => Fate::Target(Target {
            parameter: recent.share(),
            shard: m.shard,
            expert: m.expert,
            conversion: m
                .permute_heads
                .map(|heads| Box::new(Conversion::RotaryPermute { heads })),
            via: m.trace,
        }),
    }
}

/// The last few parameter names one thread mapped to: a fused expert parameter is named by
/// hundreds of consecutive checkpoint tensors, which then share one copy of its name instead of
/// holding one each (90,000 in a DeepSeek-V3 checkpoint, most of the map stage's memory), and
/// the thread's buffer the rules write each name into, so that a shared name is never allocated.
#[derive(Default)]
struct Recent {
    names: Vec<Arc<str>>,
    next: usize,
    buffer: String,
}

impl Recent {
    const KEPT: usize = 8;

    /// The name in `buffer`, shared with an earlier tensor's when it is one of the last few.
    fn share(&mut self) -> Arc<str> {
        let name = self.buffer.as_str();
        if let Some(a) = self.names.iter().find(|a| ***a == *name) {
            return a.clone();
        }
        let a: Arc<str> = name.into();
        if self.names.len() < Self::KEPT {
            self.names.push(a.clone());
        } else {
            self.names[self.next] = a.clone();
            self.next = (self.next + 1) % Self::KEPT;
        }
        a
    }
}

fn tensor_name<S: Serializer>(t: &&TensorInfo, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&t.name)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::WeightFile;
    use crate::dtype::Dtype;

    fn file(name: &str, tensors: &[&str]) -> WeightFile {
        WeightFile {
            name: name.into(),
            path: name.into(),
            size: 0,
            header_len: 0,
            stamp: Default::default(),
            backing: crate::checkpoint::Backing::File,
            metadata: None,
            tensors: tensors
                .iter()
                .map(|n| TensorInfo {
                    name: (*n).into(),
                    dtype: Dtype::Bf16,
                    shape: smallvec::smallvec![2, 2],
                    file: 0,
                    offset: 0,
                    len: 8,
                })
                .collect(),
        }
    }

    fn checkpoint(files: Vec<WeightFile>) -> Checkpoint {
        let files = files
            .into_iter()
            .enumerate()
            .map(|(i, mut f)| {
                f.tensors.iter_mut().for_each(|t| t.file = i);
                f
            })
            .collect();
        Checkpoint::from_files(files)
    }

    fn llama() -> Mapping {
        crate::mapping::select(None, Some("LlamaForCausalLM")).expect("llama mapping")
    }

    #[test]
    fn stacked_names_become_a_parameter_slot_and_the_rules_that_led_there() {
        let ckpt = checkpoint(vec![file(
            "a.safetensors",
            &[
                "model.layers.3.self_attn.k_proj.weight",
                "model.layers.3.mlp.up_proj.weight",
                "model.norm.weight",
            ],
        )]);
        let m = map(&llama(), &ckpt).expect("maps");
        let targets: Vec<_> = m
            .tensors
            .iter()
            .map(|t| match &t.fate {
                Fate::Target(x) => (&*x.parameter, x.slot()),
                Fate::Dropped { rule } => panic!("dropped by {rule}"),
            })
            .collect();
        assert_eq!(
            targets,
            [
                (
                    "model.layers.3.self_attn.qkv_proj.weight",
                    (Some(ShardId::Name("k".into())), None)
                ),
                (
                    "model.layers.3.mlp.gate_up_proj.weight",
                    (Some(ShardId::Index(1)), None)
                ),
                ("model.norm.weight", (None, None)),
            ]
        );
        let Fate::Target(k) = &m.tensors[0].fate else {
            unreachable!()
        };
        let via: Vec<String> = k.via.iter().map(|s| llama().rules.describe(s)).collect();
        assert_eq!(via, ["stacked '.k_proj' → '.qkv_proj' shard k"]);
        assert_eq!(m.tensors[0].file, "a.safetensors");
    }

    #[test]
    fn rotary_embedding_buffers_are_dropped_by_the_common_rule() {
        let ckpt = checkpoint(vec![file(
            "a.safetensors",
            &["model.layers.0.self_attn.rotary_emb.inv_freq"],
        )]);
        let m = map(&llama(), &ckpt).expect("maps");
        assert!(
            matches!(&m.tensors[0].fate, Fate::Dropped { rule } if rule.contains("rotary_emb")),
            "{:?}",
            m.tensors[0].fate
        );
    }

    #[test]
    fn a_tensor_shadowed_by_a_later_file_is_mapped_once_from_the_file_vllm_keeps() {
        let ckpt = checkpoint(vec![
            file("a.safetensors", &["model.norm.weight"]),
            file("b.safetensors", &["model.norm.weight"]),
        ]);
        let m = map(&llama(), &ckpt).expect("maps");
        assert_eq!(m.tensors.len(), 1);
        assert_eq!(m.tensors[0].file, "b.safetensors");
    }

    #[test]
    fn mistral_native_q_and_k_carry_the_rotary_permutation() {
        let mistral = crate::mapping::select(None, Some("MistralForCausalLM")).expect("mapping");
        let ckpt = checkpoint(vec![file(
            "consolidated.safetensors",
            &[
                "layers.0.attention.wk.weight",
                "layers.0.attention.wo.weight",
            ],
        )]);
        let m = map(&mistral, &ckpt).expect("maps");
        let conv: Vec<_> = m
            .tensors
            .iter()
            .map(|t| match &t.fate {
                Fate::Target(x) => x.conversion.as_deref().cloned(),
                Fate::Dropped { .. } => None,
            })
            .collect();
        assert_eq!(
            conv,
            [
                Some(Conversion::RotaryPermute {
                    heads: "num_key_value_heads".into()
                }),
                None
            ]
        );
    }

    /// Llama 4's stacked q/k rules ask for the permutation (of `.weight` only, llama4.py:805–844);
    /// v and a per-tensor scale do not get it, nor the vision model's q/k, whose loader
    /// (`_load_other_weights`) does not permute (the text rules are `under: language_model.`).
    #[test]
    fn llama4_hf_q_and_k_carry_the_rotary_permutation_from_their_stacked_rules() {
        let l4 =
            crate::mapping::select(None, Some("Llama4ForConditionalGeneration")).expect("mapping");
        let p = "language_model.model.layers.3.self_attn.";
        let names = [
            format!("{p}q_proj.weight"),
            format!("{p}k_proj.weight"),
            format!("{p}v_proj.weight"),
            format!("{p}k_proj.weight_scale"),
            "vision_model.model.layers.0.self_attn.q_proj.weight".to_string(),
        ];
        let refs: Vec<&str> = names.iter().map(String::as_str).collect();
        let ckpt = checkpoint(vec![file("a.safetensors", &refs)]);
        let m = map(&l4, &ckpt).expect("maps");
        let conv: Vec<_> = (m.tensors.iter())
            .map(|t| match &t.fate {
                Fate::Target(x) => x.conversion.as_deref().cloned(),
                Fate::Dropped { .. } => None,
            })
            .collect();
        let heads = |h: &str| Some(Conversion::RotaryPermute { heads: h.into() });
        assert_eq!(
            conv,
            [
                heads("num_attention_heads"),
                heads("num_key_value_heads"),
                None,
                None,
                None
            ]
        );
        assert!(
            matches!(&m.tensors[4].fate, Fate::Target(t) if t.parameter.starts_with("vision_model."))
        );
    }

    #[test]
    fn the_result_serialises_with_each_tensor_its_file_and_fate() {
        let ckpt = checkpoint(vec![file(
            "a.safetensors",
            &["model.layers.0.self_attn.q_proj.weight"],
        )]);
        let json = serde_json::to_value(map(&llama(), &ckpt).expect("maps")).expect("serialises");
        assert_eq!(
            json["tensors"][0],
            serde_json::json!({
                "name": "model.layers.0.self_attn.q_proj.weight",
                "file": "a.safetensors",
                "fate": "target",
                "parameter": "model.layers.0.self_attn.qkv_proj.weight",
                "shard": "q",
                "expert": null,
                "conversion": null,
                "via": [{"stacked": 0}],
            })
        );
    }
}
