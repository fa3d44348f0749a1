//! vLLM's `--moe-backend`: which fused-MoE kernel the experts are laid out for. Its own file
//! because the planner's context (`cx.rs`) and the MXFP4 method both name it.

use crate::layout::mxfp4::MX_BLOCK;

/// An MXFP4 MoE backend by vLLM's `--moe-backend` name, for the padding it gives the experts'
/// parameters (`mxfp4_round_up_hidden_size_and_intermediate_size`). Only backends a gpt-oss
/// deployment can pick by name, whose rounding does not depend on the platform.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeBackend {
    /// OAI Triton kernels (the SM90 default): intermediate to 64, hidden kept.
    Triton,
    /// Marlin (and batched Marlin, CUDA): intermediate to 128, hidden to 256.
    Marlin,
    /// FlashInfer TRT-LLM (the Blackwell default): intermediate to 128, hidden to 256.
    FlashinferTrtllm,
    /// FlashInfer CUTLASS: 128 and 128.
    FlashinferCutlass,
    /// DeepGEMM: 128 and 128.
    DeepGemm,
    /// The CPU AMX kernel: 32 and 32.
    Cpu,
    /// Emulation: 32 and 32 (MX block alignment only).
    Emulation,
}

impl MoeBackend {
    pub const ALL: [MoeBackend; 7] = [
        MoeBackend::Triton,
        MoeBackend::Marlin,
        MoeBackend::FlashinferTrtllm,
        MoeBackend::FlashinferCutlass,
        MoeBackend::DeepGemm,
        MoeBackend::Cpu,
        MoeBackend::Emulation,
    ];

    /// vLLM's spelling (`--moe-backend` values, `config/kernel.py` `MoEBackend`).
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            MoeBackend::Triton => "triton",
            MoeBackend::Marlin => "marlin",
            MoeBackend::FlashinferTrtllm => "flashinfer_trtllm",
            MoeBackend::FlashinferCutlass => "flashinfer_cutlass",
            MoeBackend::DeepGemm => "deep_gemm",
            MoeBackend::Cpu => "cpu",
            MoeBackend::Emulation => "emulation",
        }
    }

    /// A name as vLLM's argument parser takes it (lower case, `-` read as `_`); the error
    /// lists the names wload knows.
    pub fn parse(name: &str) -> Result<MoeBackend, String> {
        let norm = name.to_lowercase().replace('-', "_");
        MoeBackend::ALL
            .into_iter()
            .find(|b| b.as_str() == norm)
            .ok_or_else(|| {
                let known: Vec<&str> = MoeBackend::ALL.iter().map(|b| b.as_str()).collect();
                format!(
                    "unknown MoE backend '{name}': wload pads MXFP4 experts as these vLLM --moe-backend values do: {}",
                    known.join(", ")
                )
            })
    }

    /// `[hidden, intermediate]` alignments the backend rounds the parameters up to (hidden 1:
    /// kept).
    pub(crate) fn alignment(self) -> [u64; 2] {
        match self {
            MoeBackend::Triton => [1, 64],
            MoeBackend::Marlin | MoeBackend::FlashinferTrtllm => [256, 128],
            MoeBackend::FlashinferCutlass | MoeBackend::DeepGemm => [128, 128],
            MoeBackend::Cpu | MoeBackend::Emulation => [MX_BLOCK, MX_BLOCK],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backends_are_named_as_vllm_names_them() {
        assert_eq!(
            MoeBackend::parse("Flashinfer-TRTLLM"),
            Ok(MoeBackend::FlashinferTrtllm)
        );
        for b in MoeBackend::ALL {
            assert_eq!(MoeBackend::parse(b.as_str()), Ok(b));
        }
        let err = MoeBackend::parse("cuda").unwrap_err();
        assert!(
            err.contains("'cuda'") && err.contains("triton, marlin"),
            "{err}"
        );
        assert_eq!(MoeBackend::Triton.alignment(), [1, 64]);
        assert_eq!(MoeBackend::Marlin.alignment(), [256, 128]);
    }
}
