//! FP8 tensors vLLM dequantizes while loading (the mapping's `dequantize_fp8`): DeepSeek-V3.2's
//! `indexer.wk` in FP8 releases. vLLM's `_try_load_fp8_indexer_wk` (deepseek_v2.py:857–913,
//! called before the stacked rules by nvidia/model.py:361 and nvidia/mtp.py:408) takes every
//! checkpoint name containing `indexer.wk.`: an F8_E4M3 `….weight` and a `…weight_scale…` are
//! buffered per layer until both have come, then `scaled_dequantize` makes BF16 of them, which
//! fills shard 0 of `wk_weights_proj`. A scale without an FP8 weight stays in the buffer, unused.
//!
//! The planner pairs them from the headers and checks the scale's shape; the values are the
//! engine's (`Region::dequant`, `exec/reduce.rs`).

use std::collections::HashMap;

use super::Planner;
use super::types::Skipped;
use crate::checkpoint::TensorInfo;
use crate::dtype::Dtype;
use crate::map::{Mapped, MappedTensor};
use crate::problem::Problem;

/// The weights and scales `dequantize_fp8` takes, by key (the name up to and including the
/// pattern: vLLM's per-layer buffer).
#[derive(Default)]
pub(super) struct Pairs<'t, 'c> {
    scales: HashMap<&'t str, Vec<&'t MappedTensor<'c>>>,
    fp8_weights: HashMap<&'t str, usize>,
}

impl Planner<'_> {
    /// `name` up to and including the first `dequantize_fp8` pattern in it.
    fn dequant_key<'n>(&self, name: &'n str) -> Option<&'n str> {
        (self.mapping.dequantize_fp8.iter())
            .filter_map(|p| name.find(p.as_str()).map(|at| &name[..at + p.len()]))
            .next()
    }

    /// Whether `t` is an FP8 weight vLLM dequantizes while loading.
    pub(super) fn dequantized_weight(&self, t: &TensorInfo) -> bool {
        t.dtype == Dtype::F8E4M3
            && t.name.ends_with(".weight")
            && self.dequant_key(&t.name).is_some()
    }

    /// Whether vLLM takes `t` as the scale of a dequantized weight (whatever the weight).
    pub(super) fn dequant_scale(&self, t: &TensorInfo) -> bool {
        t.name.contains("weight_scale") && self.dequant_key(&t.name).is_some()
    }

    /// Every dequantized weight and scale of the checkpoint, by key.
    pub(super) fn dequant_pairs<'t, 'c>(&self, mapped: &'t Mapped<'c>) -> Pairs<'t, 'c> {
        let mut pairs = Pairs::default();
        if self.mapping.dequantize_fp8.is_empty() {
            return pairs;
        }
        for m in &mapped.tensors {
            if let Some(key) = self.dequant_key(&m.tensor.name) {
                if self.dequant_scale(m.tensor) {
                    pairs.scales.entry(key).or_default().push(m);
                } else if self.dequantized_weight(m.tensor) {
                    *pairs.fp8_weights.entry(key).or_default() += 1;
                }
            }
        }
        pairs
    }

    /// A scale `m` no FP8 weight uses: vLLM keeps it in its buffer and loads nothing.
    pub(super) fn unused_scale(&self, pairs: &Pairs, m: &MappedTensor) -> Option<Skipped> {
        let key = self.dequant_key(&m.tensor.name)?;
        (!pairs.fp8_weights.contains_key(key)).then(|| Skipped {
            tensor: m.tensor.name.to_string(),
            reason: "a scale vLLM keeps for an FP8 weight of its layer, which has none: unused"
                .into(),
        })
    }

    /// The scale the FP8 weight `m` is dequantized with, or why it cannot be.
    pub(super) fn scale_of<'t, 'c>(
        &self,
        pairs: &Pairs<'t, 'c>,
        m: &MappedTensor,
    ) -> Result<&'t MappedTensor<'c>, String> {
        let t = m.tensor;
        let key = self.dequant_key(&t.name).expect("a dequantized weight");
        let scale = match pairs.scales.get(key).map(Vec::as_slice) {
            Some([one]) => *one,
            Some(more) => {
                let names: Vec<&str> = more.iter().map(|s| &*s.tensor.name).collect();
                return Err(format!(
                    "FP8 tensor '{}' has {} scales ({}); vLLM dequantizes it with whichever it reads last",
                    t.name,
                    more.len(),
                    names.join(", ")
                ));
            }
            None => {
                return Err(format!(
                    "FP8 tensor '{}' has no '{}weight_scale_inv': vLLM waits for one to dequantize it and never loads the weight",
                    t.name, key
                ));
            }
        };
        let s = scale.tensor;
        let scalar = matches!(
            s.dtype,
            Dtype::F32 | Dtype::Bf16 | Dtype::F16 | Dtype::F64 | Dtype::U8 | Dtype::F8E8M0
        );
        if !scalar {
            return Err(format!(
                "scale '{}' of FP8 tensor '{}' is {}, not a float or E8M0 scale",
                s.name, t.name, s.dtype
            ));
        }
        let (out, inner) = (t.shape[0], t.shape[1..].iter().product::<u64>());
        let fits = match s.shape[..] {
            [n] => n == out,
            [s0, s1] => s0 > 0 && s1 > 0 && out % s0 == 0 && inner % s1 == 0,
            _ => false,
        };
        if t.shape.len() != 2 || !fits {
            return Err(format!(
                "scale '{}' has shape {:?}, which does not divide FP8 tensor '{}' of shape {:?} into blocks as vLLM's scaled_dequantize needs ([out] or [out / a, in / b])",
                s.name, s.shape, t.name, t.shape
            ));
        }
        Ok(scale)
    }

    /// A problem for FP8 tensor `m` that cannot be dequantized.
    pub(super) fn dequant_problem(
        &self,
        m: &MappedTensor,
        parameter: &str,
        message: String,
    ) -> Problem {
        Problem {
            message: format!("{}: {message}", m.file),
            fix: Some(
                "give each FP8 weight one scale of a shape vLLM can broadcast, or use a checkpoint that stores it unquantized".into(),
            ),
            file: Some(m.file.to_string()),
            tensor: Some(m.tensor.name.to_string()),
            parameter: Some(parameter.to_string()),
            ..Default::default()
        }
    }
}
