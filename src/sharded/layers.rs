//! The layers a pre-sharded folder's pipeline stages hold, read from its rank files' tensor names
//! (`model.layers.7.mlp…`): what `inspect` shows per stage, and the `VLLM_PP_LAYER_PARTITION`
//! vLLM must be started with when the split is not its even one. Read from the files, not the
//! manifest, so that vLLM's own folders and copied ones say the same.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde::Serialize;

use super::names::RankFiles;
use crate::checkpoint::Checkpoint;
use crate::ranks::stages::split_layers;

/// One stage's decoder layers, by the numbers in its tensor names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct StageLayers {
    pub pp_rank: u64,
    /// Sorted, without repeats.
    pub layers: Vec<u64>,
}

impl StageLayers {
    /// `layers 0–13 (14 layers)`, `layer 0`, or the numbers when they are not one run.
    pub(crate) fn describe(&self) -> String {
        let n = self.layers.len();
        match (self.layers.first(), self.layers.last()) {
            (None, _) | (_, None) => "no layers".into(),
            (Some(a), _) if n == 1 => format!("layer {a}"),
            (Some(a), Some(b)) if b - a + 1 == n as u64 => {
                format!("layers {a}–{b} ({n} layers)")
            }
            _ => format!("layers {:?} (not one run)", self.layers),
        }
    }
}

/// Each stage's layers, from the files of its first TP rank (every TP rank of a stage holds the
/// same layers). Files whose header cannot be read count as holding none: the folder's other
/// checks name them. Empty without pipeline stages in the names.
pub(crate) fn of_folder(root: &Path, files: &RankFiles) -> Vec<StageLayers> {
    let mut by_stage: BTreeMap<u64, BTreeSet<u64>> = BTreeMap::new();
    // Keys in (stage, TP rank) order: a stage's first entry is its first TP rank.
    for (&(pp, _), parts) in files {
        let Some(pp) = pp else { continue };
        if by_stage.contains_key(&pp) {
            continue;
        }
        let layers = by_stage.entry(pp).or_default();
        for (_, name) in parts {
            if let Ok(ck) = Checkpoint::open(root, std::slice::from_ref(name)) {
                layers.extend(ck.all_tensors().filter_map(|t| layer_of(&t.name)));
            }
        }
    }
    by_stage
        .into_iter()
        .map(|(pp_rank, l)| StageLayers {
            pp_rank,
            layers: l.into_iter().collect(),
        })
        .collect()
}

/// The decoder layer a vLLM parameter belongs to: the number after `layers.` (`model.layers.7`,
/// `model.language_model.layers.7`).
pub(crate) fn layer_of(name: &str) -> Option<u64> {
    let mut rest = name;
    while let Some(i) = rest.find("layers.") {
        let at_start = i == 0 || rest.as_bytes()[i - 1] == b'.';
        let after = &rest[i + "layers.".len()..];
        let digits = after.bytes().take_while(u8::is_ascii_digit).count();
        if at_start && digits > 0 && after.as_bytes().get(digits) == Some(&b'.') {
            return after[..digits].parse().ok();
        }
        rest = after;
    }
    None
}

/// The `VLLM_PP_LAYER_PARTITION` value that splits layers as `stages` hold them (`1,2`), when
/// they hold consecutive runs from layer 0 on in stage order; `None` otherwise.
pub(crate) fn partition(stages: &[StageLayers]) -> Option<String> {
    let mut next = 0;
    let mut counts = Vec::new();
    for (i, s) in stages.iter().enumerate() {
        let n = s.layers.len() as u64;
        let run = s.layers.first() == Some(&next) && s.layers.last() == Some(&(next + n - 1));
        if s.pp_rank != i as u64 || n == 0 || !run {
            return None;
        }
        counts.push(n.to_string());
        next += n;
    }
    (!counts.is_empty()).then(|| counts.join(","))
}

/// Whether `partition` (`1,2`) is what vLLM splits its layers into unasked.
pub(crate) fn is_even_split(partition: &str) -> bool {
    let counts: Vec<u64> = partition
        .split(',')
        .filter_map(|c| c.parse().ok())
        .collect();
    let total = counts.iter().sum();
    split_layers(total, counts.len() as u64, None).is_ok_and(|stages| {
        stages
            .iter()
            .map(|s| s.end_layer - s.first_layer)
            .eq(counts.iter().copied())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layer_numbers_come_from_the_layers_component() {
        assert_eq!(layer_of("model.layers.7.mlp.down_proj.weight"), Some(7));
        assert_eq!(layer_of("model.language_model.layers.12.x"), Some(12));
        assert_eq!(layer_of("layers.0.attention.wq.weight"), Some(0));
        assert_eq!(layer_of("model.embed_tokens.weight"), None);
        assert_eq!(layer_of("model.num_layers.3.x"), None);
        assert_eq!(layer_of("model.layers.x.3"), None);
    }

    #[test]
    fn partitions_are_the_stages_counts() {
        let s = |p, l: &[u64]| StageLayers {
            pp_rank: p,
            layers: l.to_vec(),
        };
        assert_eq!(partition(&[s(0, &[0]), s(1, &[1, 2])]), Some("1,2".into()));
        assert_eq!(partition(&[s(0, &[0, 2]), s(1, &[1])]), None);
        assert_eq!(partition(&[s(0, &[]), s(1, &[0])]), None);
        assert!(is_even_split("2,1"));
        assert!(!is_even_split("1,2"));
        assert!(is_even_split("20,20,20,20"));
    }
}
