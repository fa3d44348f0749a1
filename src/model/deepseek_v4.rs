//! DeepSeek-V4, recognised and explained, never guessed. vLLM 0.33 builds its state per platform
//! (`models/deepseek_v4/__init__.py`: CUDA, ROCm, XPU and CPU each have their own module tree),
//! and on CUDA the saved shapes depend on the GPU generation and the MoE backend (FlashMLA pads
//! `attn_sink`; the `wo_a` FP8 scale layout differs between SM90 and SM100; MXFP4 experts are
//! padded per backend). vLLM builds neither its release format nor its CUDA tree on a CPU, so
//! wload has no verified reference for it and writes no rank files for it: every command that
//! plans refuses it with [`PlatformSpecific`], which says what the model is (from config.json and
//! the headers) and what to use instead. docs/vllm-spec §12.6.

use std::collections::BTreeMap;
use std::fmt;

use serde::Serialize;
use serde_json::Value;

use crate::checkpoint::Checkpoint;
use crate::config::ModelConfig;
use crate::dtype::Dtype;
use crate::units::{HumanBytes, plural, thousands};

/// The architectures vLLM 0.33's `deepseek_v4` package registers: the text model and the VL
/// wrapper (§12.7's table).
pub(crate) const ARCHITECTURES: &[&str] = &[
    "DeepseekV4ForCausalLM",
    "DeepseekV4ForConditionalGeneration",
];

/// Why the saved state cannot be written without a GPU reference, one reason each.
const REASONS: &[&str] = &[
    "vLLM 0.33 builds a different module tree per platform (CUDA, ROCm, XPU, CPU), with different keys",
    "on CUDA, FlashMLA pads attn_sink to 64 or 128 heads with -inf; on CPU, ROCm and XPU it holds the rank's heads alone",
    "the wo_a FP8 scale layout depends on the GPU: block-row F32 scales on SM90, packed per-row E8M0 on SM100",
    "MXFP4 experts are padded per MoE backend",
    "vLLM builds neither the release format (no MXFP4 MoE backend) nor the CUDA tree on a CPU, so no reference could be recorded",
];

/// What a plain per-rank figure is, since no plan is made.
const PER_RANK_IS: &str = "total_bytes divided by tp × pp: plain division, not a plan";

/// Whether `config` is DeepSeek-V4: its first architecture is one of [`ARCHITECTURES`].
pub(crate) fn is_deepseek_v4(config: &ModelConfig) -> bool {
    config
        .architecture()
        .is_some_and(|a| ARCHITECTURES.contains(&a))
}

/// Which layouts the per-rank figures are for: the one asked (`plan`, `shard`, `load`), or a few
/// TP sizes (`inspect`, `sizes`).
#[derive(Debug, Clone, Copy)]
pub(crate) enum Asked {
    Layout { tp: u64, pp: u64 },
    Survey { max_tp: u64 },
}

/// DeepSeek-V4 as config.json and the headers describe it, and why wload writes nothing for it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct DeepseekV4 {
    /// Always "DeepSeek-V4".
    pub model: &'static str,
    pub architecture: String,
    /// Always false: wload writes no rank files for it.
    pub supported: bool,
    /// Why its saved state is platform- and GPU-specific.
    pub reasons: Vec<&'static str>,
    pub layers: u64,
    /// `num_nextn_predict_layers`: MTP layers past `num_hidden_layers`, which vLLM drops.
    pub mtp_layers: Option<u64>,
    pub hidden_size: u64,
    pub attention_heads: u64,
    pub vocab_size: u64,
    pub routed_experts: Option<u64>,
    pub shared_experts: Option<u64>,
    pub experts_per_token: Option<u64>,
    /// config.json's `expert_dtype` as written (vLLM reads a missing one as "fp4").
    pub expert_dtype: Option<String>,
    /// The formats config.json names, one line each (linears, experts).
    pub formats: Vec<String>,
    /// The headers' tensors by dtype, largest first.
    pub dtypes: Vec<DtypeBytes>,
    pub tensors: usize,
    pub total_bytes: u64,
    /// What `bytes_per_rank` is.
    pub per_rank_is: &'static str,
    pub bytes_per_rank: Vec<PerRank>,
    pub fix: String,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct DtypeBytes {
    pub dtype: Dtype,
    pub tensors: usize,
    pub bytes: u64,
}

#[derive(Debug, Clone, Copy, Serialize, schemars::JsonSchema)]
pub struct PerRank {
    pub tp: u64,
    pub pp: u64,
    pub bytes: u64,
}

/// The description of a DeepSeek-V4 checkpoint, with the per-rank figures for `asked`.
pub(crate) fn describe(config: &ModelConfig, checkpoint: &Checkpoint, asked: Asked) -> DeepseekV4 {
    let raw = &config.raw;
    let num = |k: &str| raw.get(k).and_then(Value::as_u64);
    let (dtypes, tensors, total_bytes) = header_totals(checkpoint);
    let layouts: Vec<(u64, u64)> = match asked {
        Asked::Layout { tp, pp } => vec![(tp.max(1), pp.max(1))],
        Asked::Survey { max_tp } => (0..7)
            .map(|k| 1u64 << k)
            .filter(|&tp| tp <= max_tp.max(1))
            .map(|tp| (tp, 1))
            .collect(),
    };
    let bytes_per_rank = (layouts.into_iter())
        .map(|(tp, pp)| PerRank {
            tp,
            pp,
            bytes: total_bytes / tp.saturating_mul(pp),
        })
        .collect();
    let tp_flag = match asked {
        Asked::Layout { tp, .. } if tp > 1 => format!(" --tensor-parallel-size {tp}"),
        _ => String::new(),
    };
    DeepseekV4 {
        model: "DeepSeek-V4",
        architecture: config.architecture().unwrap_or_default().to_string(),
        supported: false,
        reasons: REASONS.to_vec(),
        layers: config.num_hidden_layers,
        mtp_layers: num("num_nextn_predict_layers"),
        hidden_size: config.hidden_size,
        attention_heads: config.num_attention_heads,
        vocab_size: config.vocab_size,
        routed_experts: config.num_experts,
        shared_experts: num("n_shared_experts"),
        experts_per_token: num("num_experts_per_tok"),
        expert_dtype: raw
            .get("expert_dtype")
            .and_then(Value::as_str)
            .map(str::to_string),
        formats: formats(config),
        dtypes,
        tensors,
        total_bytes,
        per_rank_is: PER_RANK_IS,
        bytes_per_rank,
        fix: format!(
            "serve the original checkpoint with vLLM's own loader on the GPUs it will run on: vllm serve SOURCE{tp_flag} --load-format auto"
        ),
    }
}

/// The headers' tensors (shadowed copies left out) by dtype, largest first; their count and bytes.
fn header_totals(checkpoint: &Checkpoint) -> (Vec<DtypeBytes>, usize, u64) {
    let mut by: BTreeMap<Dtype, (usize, u64)> = BTreeMap::new();
    for t in checkpoint
        .all_tensors()
        .filter(|t| checkpoint.is_effective(t))
    {
        let e = by.entry(t.dtype).or_default();
        e.0 += 1;
        e.1 += t.len;
    }
    let mut dtypes: Vec<DtypeBytes> = (by.into_iter())
        .map(|(dtype, (tensors, bytes))| DtypeBytes {
            dtype,
            tensors,
            bytes,
        })
        .collect();
    dtypes.sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.dtype.cmp(&b.dtype)));
    let tensors = dtypes.iter().map(|d| d.tensors).sum();
    let bytes = dtypes.iter().map(|d| d.bytes).sum();
    (dtypes, tensors, bytes)
}

/// The formats config.json names, as vLLM 0.33 reads them (`deepseek_v4/quant_config.py`):
/// `quant_method fp8` becomes `deepseek_v4_fp8`, FP8 block linears; the experts follow
/// `expert_dtype` (`fp4`, the default: MXFP4; `fp8`: FP8 block) unless
/// `quantization_config.moe_quant_algo` is NVFP4.
fn formats(config: &ModelConfig) -> Vec<String> {
    let Some(q) = config.quantization_config.as_ref() else {
        let dtype = config.dtype.as_deref().unwrap_or("the checkpoint's dtype");
        return vec![format!("unquantized ({dtype}), no quantization_config")];
    };
    let method = q.get("quant_method").and_then(Value::as_str).unwrap_or("");
    if method != "fp8" {
        return vec![format!("quantization_config.quant_method {method:?}")];
    }
    let block = match q.get("weight_block_size").and_then(Value::as_array) {
        Some(b) => {
            let dims: Vec<String> = b.iter().map(Value::to_string).collect();
            format!("FP8 block {} linears", dims.join("×"))
        }
        None => "FP8 linears".to_string(),
    };
    let linears = format!("{block} (quant_method fp8, which vLLM reads as deepseek_v4_fp8)");
    let expert_dtype = config.raw.get("expert_dtype").and_then(Value::as_str);
    let algo = q.get("moe_quant_algo").and_then(Value::as_str);
    let experts = match (algo, expert_dtype) {
        (Some(a), _) if a.eq_ignore_ascii_case("nvfp4") => {
            "NVFP4 experts (quantization_config.moe_quant_algo NVFP4: ModelOpt NVFP4)".to_string()
        }
        (_, Some("fp8")) => "FP8 block experts (expert_dtype fp8, F32 scales)".to_string(),
        (_, None) => "MXFP4 experts (expert_dtype not set: vLLM reads fp4)".to_string(),
        (_, Some("fp4")) => "MXFP4 experts (expert_dtype fp4, E8M0 scales)".to_string(),
        (_, Some(other)) => format!("experts in expert_dtype {other:?}"),
    };
    vec![linears, experts]
}

/// The refusal every command that plans gives for DeepSeek-V4 (exit 3): what the model is, why
/// wload writes nothing for it, and what to use.
#[derive(Debug, thiserror::Error)]
pub struct PlatformSpecific(pub Box<DeepseekV4>);

impl PlatformSpecific {
    pub(crate) fn new(d: DeepseekV4) -> PlatformSpecific {
        PlatformSpecific(Box::new(d))
    }

    /// The checkpoint cannot be handled: exit 3.
    pub fn exit_status(&self) -> crate::exit::ExitStatus {
        crate::exit::ExitStatus::Checkpoint
    }

    /// The message for a terminal: each line escaped on its own, the line breaks kept.
    pub(crate) fn for_terminal(&self) -> String {
        (self.to_string().lines())
            .map(|l| crate::escape::escape(l).into_owned())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl fmt::Display for PlatformSpecific {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = &self.0;
        writeln!(
            f,
            "{} is DeepSeek-V4: its saved state is platform- and GPU-specific and wload has no verified reference for it, so wload writes no rank files for it",
            d.architecture
        )?;
        writeln!(f, "  why:")?;
        for r in &d.reasons {
            writeln!(f, "    - {r}")?;
        }
        writeln!(f, "  model: {}", model_line(d))?;
        writeln!(f, "  formats: {}", d.formats.join("; "))?;
        let dtypes: Vec<String> = (d.dtypes.iter())
            .map(|x| format!("{} {}", x.dtype, HumanBytes(x.bytes)))
            .collect();
        writeln!(
            f,
            "  headers: {} tensor{}, {} ({})",
            thousands(d.tensors as u64),
            plural(d.tensors as u64),
            HumanBytes(d.total_bytes),
            dtypes.join(", ")
        )?;
        writeln!(f, "  per rank: {}", per_rank_line(d))?;
        write!(f, "fix: {}", d.fix)
    }
}

/// Layers, width, heads, vocabulary and experts, as config.json states them.
fn model_line(d: &DeepseekV4) -> String {
    let mtp = match d.mtp_layers {
        Some(n) if n > 0 => format!(" (+{n} MTP, which vLLM drops)"),
        _ => String::new(),
    };
    let mut s = format!(
        "{} layer{}{mtp}, hidden {}, {} attention heads, vocab {}",
        d.layers,
        plural(d.layers),
        d.hidden_size,
        d.attention_heads,
        thousands(d.vocab_size)
    );
    if let Some(n) = d.routed_experts {
        s.push_str(&format!("; {n} routed expert{}", plural(n)));
        if let Some(k) = d.experts_per_token {
            s.push_str(&format!(" ({k} per token)"));
        }
        if let Some(sh) = d.shared_experts {
            s.push_str(&format!(", {sh} shared"));
        }
    }
    s
}

/// The per-rank figures, labelled as the plain division they are.
fn per_rank_line(d: &DeepseekV4) -> String {
    let each: Vec<String> = (d.bytes_per_rank.iter())
        .map(|r| {
            let pp = if r.pp > 1 {
                format!(" --pp {}", r.pp)
            } else {
                String::new()
            };
            format!("--tp {}{pp}: {}", r.tp, HumanBytes(r.bytes))
        })
        .collect();
    format!(
        "{} (the total divided by the ranks: plain division, not a plan)",
        each.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_reasons_name_what_differs_per_platform() {
        let all = REASONS.join(" ");
        for needle in ["attn_sink", "wo_a", "SM90", "SM100", "MXFP4", "CPU"] {
            assert!(all.contains(needle), "{needle}");
        }
    }
}
