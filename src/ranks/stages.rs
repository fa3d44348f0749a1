//! Pipeline stages: which layers each holds, as vLLM splits them (`get_pp_indices`,
//! distributed/utils.py:198–241). Vocabulary shared by the planner and the pre-sharded folder
//! (whose serve line and checks name the partition its files were written with).

use std::ops::Range;

/// The variable vLLM reads a partition from (vllm/envs.py): layer counts per stage.
pub(crate) const PP_PARTITION_VAR: &str = "VLLM_PP_LAYER_PARTITION";

use serde::Serialize;

/// One pipeline stage: its index and the layers it holds (global numbers, as in the keys).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, schemars::JsonSchema)]
pub struct Stage {
    pub pp_rank: u64,
    pub first_layer: u64,
    pub end_layer: u64,
}

impl Stage {
    pub(crate) fn layers(&self) -> Range<u64> {
        self.first_layer..self.end_layer
    }
}

/// The layers of each of `pp` stages, as vLLM splits `layers`: `layers / pp` each, the remainder
/// one each to the stages before the last, counting back from the second-to-last; or
/// `partition` (`VLLM_PP_LAYER_PARTITION`, comma-separated counts) when set. The errors are
/// vLLM's messages.
pub(crate) fn split_layers(
    layers: u64,
    pp: u64,
    partition: Option<&str>,
) -> Result<Vec<Stage>, String> {
    let counts: Vec<u64> = match partition {
        Some(s) => {
            // Python's int() accepts surrounding spaces; a negative count is no layout at all.
            let counts = s
                .split(',')
                .map(|c| c.trim().parse::<u64>())
                .collect::<Result<Vec<u64>, _>>()
                .map_err(|_| format!("Invalid partition string: {s}"))?;
            if counts.len() as u64 != pp {
                return Err(format!(
                    "len(partitions)={} does not match pp_size={pp}.",
                    counts.len()
                ));
            }
            // Python's sum has no ceiling: added in u128 (no wrap for any count of u64s), a
            // partition of absurd counts is told by its true sum, never taken for a fit.
            let sum: u128 = counts.iter().map(|&c| u128::from(c)).sum();
            if sum != u128::from(layers) {
                return Err(format!(
                    "sum(partitions)={sum} does not match num_hidden_layers={layers}."
                ));
            }
            counts
        }
        None => {
            let mut counts = vec![layers / pp; pp as usize];
            let rem = (layers % pp) as usize;
            let n = counts.len();
            for i in 2..rem + 2 {
                counts[n - i] += 1;
            }
            counts
        }
    };
    let mut start = 0;
    Ok(counts
        .iter()
        .enumerate()
        .map(|(p, &c)| {
            let s = Stage {
                pp_rank: p as u64,
                first_layer: start,
                end_layer: start + c,
            };
            start += c;
            s
        })
        .collect())
}
