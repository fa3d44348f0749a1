//! vLLM's `--moe-backend`: which fused-MoE kernel the experts are laid out for. Its own file
//! because the planner's context (`cx.rs`) and the methods whose experts depend on it (MXFP4's
//! padding, NVFP4's input scales under EP) name it.

use crate::layout::mxfp4::MX_BLOCK;

/// A MoE backend by vLLM's `--moe-backend` name (`config/kernel.py` `MoEBackend`): those a
/// gpt-oss MXFP4 deployment can pick, whose padding does not depend on the platform, and those
/// vLLM maps to an NVFP4 MoE backend (`fused_moe/oracle/nvfp4.py` `map_nvfp4_backend`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoeBackend {
    /// OAI Triton kernels (the SM90 default for MXFP4): intermediate to 64, hidden kept.
    Triton,
    /// Marlin (and batched Marlin, CUDA): MXFP4 intermediate to 128, hidden to 256; NVFP4's
    /// SM90 (H100/H200) default.
    Marlin,
    /// FlashInfer TRT-LLM (the Blackwell default): MXFP4 intermediate to 128, hidden to 256.
    FlashinferTrtllm,
    /// FlashInfer CUTLASS: MXFP4 128 and 128.
    FlashinferCutlass,
    /// DeepGEMM: MXFP4 128 and 128.
    DeepGemm,
    /// The CPU AMX kernel: MXFP4 32 and 32.
    Cpu,
    /// Emulation: MXFP4 32 and 32 (MX block alignment only).
    Emulation,
    /// FlashInfer CuteDSL (NVFP4; its batched variant under a batched activation format).
    FlashinferCutedsl,
    /// FlashInfer's CuteDSL fused MoE for SM12x (NVFP4).
    FlashinferB12x,
    /// vLLM's own CUTLASS kernels (NVFP4: `VLLM_CUTLASS`).
    Cutlass,
    /// b12x FP4 kernels on SM12x (NVFP4).
    B12x,
    /// Humming mixed-precision kernels (NVFP4).
    Humming,
    /// FlashInfer's CuteDSL MoE-EP mega-kernel (NVFP4; not one of FlashInfer's global-scale
    /// backends).
    FlashinferMoeEpCutedsl,
}

impl MoeBackend {
    pub const ALL: [MoeBackend; 13] = [
        MoeBackend::Triton,
        MoeBackend::Marlin,
        MoeBackend::FlashinferTrtllm,
        MoeBackend::FlashinferCutlass,
        MoeBackend::DeepGemm,
        MoeBackend::Cpu,
        MoeBackend::Emulation,
        MoeBackend::FlashinferCutedsl,
        MoeBackend::FlashinferB12x,
        MoeBackend::Cutlass,
        MoeBackend::B12x,
        MoeBackend::Humming,
        MoeBackend::FlashinferMoeEpCutedsl,
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
            MoeBackend::FlashinferCutedsl => "flashinfer_cutedsl",
            MoeBackend::FlashinferB12x => "flashinfer_b12x",
            MoeBackend::Cutlass => "cutlass",
            MoeBackend::B12x => "b12x",
            MoeBackend::Humming => "humming",
            MoeBackend::FlashinferMoeEpCutedsl => "flashinfer_moe_ep_cutedsl",
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
                format!(
                    "unknown MoE backend '{name}': wload pads MXFP4 experts as these vLLM --moe-backend values do: {}; and lays out NVFP4 experts for these: {}",
                    names(MoeBackend::mxfp4()),
                    names(MoeBackend::nvfp4()),
                )
            })
    }

    /// The backends wload pads MXFP4 experts for.
    pub(crate) fn mxfp4() -> impl Iterator<Item = MoeBackend> {
        MoeBackend::ALL
            .into_iter()
            .filter(|b| b.alignment().is_some())
    }

    /// The names vLLM 0.33 takes for NVFP4 experts, in `map_nvfp4_backend`'s order.
    pub(crate) fn nvfp4() -> impl Iterator<Item = MoeBackend> {
        [
            MoeBackend::B12x,
            MoeBackend::Cutlass,
            MoeBackend::FlashinferTrtllm,
            MoeBackend::FlashinferCutlass,
            MoeBackend::FlashinferCutedsl,
            MoeBackend::FlashinferMoeEpCutedsl,
            MoeBackend::FlashinferB12x,
            MoeBackend::Marlin,
            MoeBackend::Humming,
            MoeBackend::Emulation,
        ]
        .into_iter()
    }

    /// `[hidden, intermediate]` alignments the backend rounds MXFP4 parameters up to (hidden 1:
    /// kept); `None` for a backend wload does not pad MXFP4 experts for.
    pub(crate) fn alignment(self) -> Option<[u64; 2]> {
        match self {
            MoeBackend::Triton => Some([1, 64]),
            MoeBackend::Marlin | MoeBackend::FlashinferTrtllm => Some([256, 128]),
            MoeBackend::FlashinferCutlass | MoeBackend::DeepGemm => Some([128, 128]),
            MoeBackend::Cpu | MoeBackend::Emulation => Some([MX_BLOCK, MX_BLOCK]),
            _ => None,
        }
    }

    /// For NVFP4 experts: whether vLLM allocates the input scales for every expert of the model
    /// (`Some(true)`: the FlashInfer backends, `use_global_sf`, `oracle/nvfp4.py:58-71`) or for
    /// the rank's own (`Some(false)`); `None` for a name vLLM refuses for NVFP4 MoE.
    pub(crate) fn nvfp4_global_input_scales(self) -> Option<bool> {
        match self {
            MoeBackend::FlashinferTrtllm
            | MoeBackend::FlashinferCutlass
            | MoeBackend::FlashinferCutedsl
            | MoeBackend::FlashinferB12x => Some(true),
            MoeBackend::B12x
            | MoeBackend::Cutlass
            | MoeBackend::FlashinferMoeEpCutedsl
            | MoeBackend::Marlin
            | MoeBackend::Humming
            | MoeBackend::Emulation => Some(false),
            MoeBackend::Triton | MoeBackend::DeepGemm | MoeBackend::Cpu => None,
        }
    }
}

/// `a, b, c`: backends by vLLM's names.
pub(crate) fn names(backends: impl Iterator<Item = MoeBackend>) -> String {
    backends
        .map(MoeBackend::as_str)
        .collect::<Vec<_>>()
        .join(", ")
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
        assert_eq!(MoeBackend::Triton.alignment(), Some([1, 64]));
        assert_eq!(MoeBackend::Marlin.alignment(), Some([256, 128]));
        assert_eq!(MoeBackend::Humming.alignment(), None);
        assert!(
            err.contains("flashinfer_trtllm, flashinfer_cutlass, flashinfer_cutedsl"),
            "{err}"
        );
    }
}
