//! The plan's data: what `wload plan --json` prints and what execution consumes, and how a refusal
//! is described.

use serde::Serialize;

use crate::dtype::Dtype;
use crate::plan::pieces::Piece;
use crate::problem::Problem;

/// `wload plan --json`: the plan plus where it came from.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct PlanReport {
    pub schema_version: u32,
    pub wload_version: &'static str,
    pub source: String,
    pub timings: crate::open::Timings,
    /// For a hub repo id: what this run fetched from the hub (docs/json.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub_fetched: Option<crate::resolve::remote::Fetched>,
    #[serde(flatten)]
    pub plan: Plan,
    /// Always `"accepted"`: a refused plan is the error document (docs/json.md).
    pub verdict: &'static str,
    /// Over every rank of the plan, also with `--rank` (whose `ranks` holds one).
    pub totals: PlanTotals,
}

/// A plan's size: its ranks, tensors and bytes.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PlanTotals {
    /// `tp × pp`.
    pub ranks: u64,
    /// Tensors of all ranks together, and the fewest and most of one rank.
    pub tensors: u64,
    pub tensors_per_rank_min: u64,
    pub tensors_per_rank_max: u64,
    /// Data bytes of all ranks together, and the fewest and most of one rank.
    pub bytes: u64,
    pub bytes_per_rank_min: u64,
    pub bytes_per_rank_max: u64,
}

impl PlanTotals {
    pub(crate) fn of(ranks: &[RankPlan]) -> PlanTotals {
        let tensors = || ranks.iter().map(|r| r.tensors.len() as u64);
        let bytes = || ranks.iter().map(|r| r.bytes);
        PlanTotals {
            ranks: ranks.len() as u64,
            tensors: tensors().sum(),
            tensors_per_rank_min: tensors().min().unwrap_or(0),
            tensors_per_rank_max: tensors().max().unwrap_or(0),
            bytes: bytes().sum(),
            bytes_per_rank_min: bytes().min().unwrap_or(0),
            bytes_per_rank_max: bytes().max().unwrap_or(0),
        }
    }
}

#[derive(Debug, Clone)]
pub struct PlanOptions {
    pub tp: u64,
    /// Pipeline stages (vLLM's --pipeline-parallel-size); 1 without pipeline parallelism.
    pub pp: u64,
    /// `VLLM_PP_LAYER_PARTITION`: layer counts per stage instead of vLLM's even split.
    pub pp_partition: Option<String>,
    pub expert_parallel: bool,
    pub dtype: crate::dtype::DtypeChoice,
    /// `--mapping FILE` instead of the embedded mapping for the architecture.
    pub mapping: Option<std::path::PathBuf>,
    /// Only the per-rank names, dtypes and shapes matter (checking a pre-sharded folder): a
    /// parameter the checkpoint does not fill is not a problem.
    pub shapes_only: bool,
    /// `--moe-backend`: pad MXFP4 experts as this vLLM MoE backend does; `None`: the real
    /// slices, which every backend loads.
    pub moe_backend: Option<crate::quant::MoeBackend>,
    /// `--language-model-only` and `--mm-encoder-tp-mode`: which encoder tensors a rank holds.
    pub multimodal: crate::multimodal::Multimodal,
    /// `VLLM_REPLICATE_EMBED` on (vLLM 0.33's DSA CUDA tree: the whole padded embedding on every
    /// rank); the families that read it say so with `whole: replicate_embed`.
    pub replicate_embed: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Mapping(#[from] crate::mapping::MappingError),
    #[error("{}", crate::problem::ProblemList(.0))]
    Invalid(Vec<Problem>),
    #[error("--tp must be at least 1")]
    BadTp,
    #[error("--pp must be at least 1")]
    BadPp,
}

impl PlanError {
    pub fn exit_status(&self) -> crate::exit::ExitStatus {
        match self {
            PlanError::Mapping(e) => e.exit_status(),
            PlanError::BadTp | PlanError::BadPp => crate::exit::ExitStatus::Usage,
            PlanError::Invalid(_) => crate::exit::ExitStatus::Checkpoint,
        }
    }
}

/// A checkpoint tensor some piece reads.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct SourceTensor {
    /// The checkpoint's own copy of the name, shared.
    pub name: std::sync::Arc<str>,
    /// Shared by every tensor of the file (a large MoE has thousands per file).
    pub file: std::sync::Arc<str>,
    #[serde(skip)]
    pub file_index: usize,
    /// Absolute byte offset of the tensor's data in its file.
    pub offset: u64,
    pub dtype: Dtype,
    /// Inline: a plan can read 90,000 sources.
    pub shape: crate::layout::Shape,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct OutTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    pub bytes: u64,
    pub pieces: super::Pieces,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct RankPlan {
    /// The global rank, `pp_rank * tp + tp_rank` (vLLM's layout order within a DP group).
    pub rank: u64,
    pub pp_rank: u64,
    pub tp_rank: u64,
    pub bytes: u64,
    pub tensors: Vec<OutTensor>,
}

impl Plan {
    /// What the first TP rank of each stage holds, each tensor with the checkpoint tensors it
    /// is copied from, for [`crate::quant::Method::output_config`].
    pub(crate) fn written(&self) -> Vec<crate::quant::Written> {
        let ranks = self.ranks.iter().filter(|r| r.tp_rank == 0);
        (ranks.flat_map(|r| &r.tensors))
            .map(|t| crate::quant::Written {
                name: t.name.clone(),
                sources: (t.pieces.iter())
                    .filter_map(|p| match p {
                        Piece::Copy { source, .. } => Some(self.sources[source].name.to_string()),
                        Piece::Fill { .. } => None,
                    })
                    .collect(),
            })
            .collect()
    }

    /// How many ranks the plan has: `tp × pp`.
    pub fn world_size(&self) -> u64 {
        self.world().size()
    }

    /// The plan's TP and PP sizes, for rank selection and its messages.
    pub(crate) fn world(&self) -> crate::ranks::World {
        crate::ranks::World {
            tp: self.tp,
            pp: self.pp,
        }
    }
}

/// The tie between lm_head and the embedding is decided by data: the config says tied but the
/// checkpoint ships an lm_head, so vLLM builds them untied and re-ties them if equal.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Retie {
    pub keep: String,
    pub drop: String,
    pub compare: [String; 2],
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Plan {
    pub family: String,
    pub architecture: String,
    pub tp: u64,
    pub pp: u64,
    /// The layers of each pipeline stage (one stage with every layer without PP).
    pub stages: Vec<super::Stage>,
    pub expert_parallel: bool,
    pub dtype: Dtype,
    pub sources: Vec<SourceTensor>,
    /// Each source file as its header was read, by `file_index`: the engine reads a file's data
    /// only while it is still that file, unchanged.
    #[serde(skip)]
    pub file_stamps: Vec<crate::file_stamp::FileStamp>,
    pub ranks: Vec<RankPlan>,
    /// For each source (by index), how many ranks read it when two of them read some of the same
    /// bytes, else 0; counted over every rank before the plan is narrowed to some, so that a run
    /// of some ranks reads those bytes through the page cache (`exec::shared`). Empty: not
    /// counted, and `ranks` holds every rank (the engine counts them when it needs to).
    #[serde(skip)]
    pub readers: Vec<u32>,
    /// Whether lm_head and the embedding are one tensor in the output (config.json must say so).
    pub tie_word_embeddings: bool,
    pub retie: Option<Retie>,
    /// Checkpoint tensors dropped by a rule or skipped as vLLM skips them.
    pub skipped: Vec<Skipped>,
    /// The vLLM MoE backend whose padding the MXFP4 experts have (`--moe-backend`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub moe_backend: Option<&'static str>,
    /// `--language-model-only`: no encoder tensors (written only when set).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub language_model_only: bool,
    /// `--mm-encoder-tp-mode` when not vLLM's default `weights` (`data`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mm_encoder_tp_mode: Option<&'static str>,
    /// What vLLM warns of when it builds this model with the flags given, in its words (a
    /// `--mm-encoder-tp-mode data` it falls back from); `plan`, `shard` and `load` say them.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub warnings: Vec<String>,
    /// The platform whose module tree the keys follow, from the mapping (`cuda` for
    /// DeepSeek-V3.2); absent: the same on every platform.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub module_tree: Option<String>,
    /// Planned with `VLLM_REPLICATE_EMBED` on, for a family whose state it changes (the whole
    /// padded embedding on every rank): vLLM must run with it (written only when set).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub replicate_embed: bool,
    /// The quantization method the plan was made with, as the planner read it (the checkpoint's
    /// headers included): what an output's config must say is the method's (`shard`).
    #[serde(skip)]
    pub quantization: Option<std::sync::Arc<crate::quant::Quantization>>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Skipped {
    pub tensor: String,
    pub reason: String,
}

impl Plan {
    /// What `wload.json` says of the values the plan computes (`Region::neg_exp`, Mamba2's `A`):
    /// the contract a reader may rely on, since no file written off the serving device can hold
    /// that device's own exp. `None` when every value is a copy.
    pub(crate) fn computed(&self) -> Option<Vec<String>> {
        let names: std::collections::BTreeSet<&str> = (self.ranks.iter())
            .flat_map(|r| &r.tensors)
            .filter(|t| {
                t.pieces
                    .iter()
                    .any(|p| matches!(p, Piece::Copy { region, .. } if region.neg_exp))
            })
            .map(|t| t.name.as_str())
            .collect();
        let first = names.first()?;
        Some(vec![format!(
            "{} tensor{} ({first}{}): -exp of the checkpoint's tensor (Mamba2's A = -exp(A_log)), \
             correctly rounded to F32 (the F64 exp rounded to nearest); vLLM computes it with the \
             loading device's expf, so these values are within 1 ulp of any device's, not always \
             bit-identical, and vLLM's sharded_state loader serves them as written",
            names.len(),
            if names.len() == 1 { "" } else { "s" },
            if names.len() > 1 { ", …" } else { "" },
        )])
    }
}
