//! `wload.json`: what `wload shard` wrote (source, TP, flags, every part file with its size and
//! checksum), read back by `load` (to check a pre-sharded folder) and by `shard --force` (to tell an
//! earlier output from a folder of the user's).

use std::collections::BTreeMap;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::names::{RankFiles, WrittenFor};
use crate::multimodal::{MmEncoderTpMode, Multimodal};

/// The manifest's file name, next to the part files.
pub(crate) const MANIFEST: &str = "wload.json";

/// The vLLM versions whose parameter names and per-rank slicing wload follows: a folder loads in
/// these; another version loads it only if its model code keeps the same parameters.
pub(crate) const VLLM_VERSIONS: &str = "0.33.x";

/// `vllm serve` for a pre-sharded folder: every flag the files depend on, and none that vLLM
/// would infer the same way by itself. Built by [`super::serve`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ServeCommand {
    /// The environment vLLM must run with (`VLLM_PP_LAYER_PARTITION`); empty for most folders.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub env: BTreeMap<String, String>,
    /// The words, unquoted, for a program to run.
    pub argv: Vec<String>,
    /// The environment and the words quoted for a POSIX shell, to copy and paste.
    pub shell: String,
}

/// What `wload shard` wrote into OUT, as `wload.json`.
#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct Manifest {
    pub wload_version: String,
    /// vLLM's format and version these files are for.
    pub format: String,
    pub source: String,
    pub architecture: String,
    pub family: String,
    pub tp: u64,
    /// Pipeline stages; absent (written only when above 1) means 1.
    #[serde(
        default = "crate::units::one",
        skip_serializing_if = "crate::units::is_one"
    )]
    pub pp: u64,
    pub ranks: Vec<u64>,
    pub expert_parallel: bool,
    pub dtype: String,
    pub max_part_size: u64,
    pub tie_word_embeddings: bool,
    pub files: Vec<ManifestFile>,
    /// Everything else wload put in OUT (config.json, copied side files), so that `--force`
    /// can tell an earlier output from a folder with the user's own files in it. Absent in
    /// manifests of wload 0.1.0 before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_files: Option<Vec<String>>,
    /// Everything inside the folders among `side_files`, as paths relative to OUT, folders
    /// ending in `/` (`original/`, `original/params.json`): `--force` replaces a copied folder
    /// only while it holds exactly these. Absent when no folder was copied, and in manifests of
    /// wload 0.1.0 before it was added (their folders are not provably wload's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_tree: Option<Vec<String>>,
    /// The `vllm serve` command for this folder, as `shard` printed it. Absent in manifests of
    /// wload 0.1.0 before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<ServeCommand>,
    /// What wload changed in the config.json it wrote (untied embeddings, a GPTQ module list),
    /// one line each. Absent when it was copied unchanged.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_changes: Option<Vec<String>>,
    /// The vLLM MoE backend whose padding the MXFP4 experts were written with
    /// (`--moe-backend`); absent: unpadded, or no MXFP4 experts.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe_backend: Option<String>,
    /// Written with `--language-model-only` (no encoder tensors); absent: without it, and in
    /// manifests from before the flag (no multimodal family existed then).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub language_model_only: bool,
    /// `--mm-encoder-tp-mode` when not vLLM's default (`data`); absent: `weights`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mm_encoder_tp_mode: Option<String>,
    /// The platform whose vLLM module tree the keys follow (`cuda`), for a family vLLM builds
    /// differently per platform (DeepSeek-V3.2: a folder for CUDA misses keys on CPU, XPU and
    /// ROCm, and the reverse; Qwen3.5 under AWQ/GPTQ at TP > 1: `in_proj_ba` whole on every rank
    /// by CUDA's `maybe_disable_tp`, split elsewhere). Absent: the same keys everywhere.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_tree: Option<String>,
    /// `mistral` when the files were planned from params.json (Mistral-native source): vLLM must
    /// read params.json too, which it does by itself only next to consolidated*.safetensors, so
    /// `--config-format mistral` even when a config.json was copied beside it. Absent: config.json.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_format: Option<String>,
    /// `VLLM_PP_LAYER_PARTITION` as the files were planned with it (layer counts per stage);
    /// vLLM must be started with the same value. Absent: vLLM's even split.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp_layer_partition: Option<String>,
    /// The `--hf-overrides` the files were planned with (the object as given): vLLM must be
    /// started with the same, since the config.json beside the files is the source's. Absent:
    /// none.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hf_overrides: Option<serde_json::Map<String, serde_json::Value>>,
    /// `VLLM_REPLICATE_EMBED=1`: the files hold the whole padded embedding on every rank
    /// (vLLM 0.33's DSA CUDA tree), so vLLM must be started with it. Absent: off.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replicate_embed: bool,
    /// For a hub source: the repo id (`org/name`) and commit, so that the serve line keeps the
    /// name clients send (`--served-model-name`). Absent for a local folder.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_repo: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_commit: Option<String>,
    /// What identifies the source's tensor table wherever it lies ([`super::source::table_id`]):
    /// runs of one plan on machines whose copies of the checkpoint sit at other paths still merge.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_id: Option<String>,
    /// What identifies the source's data ([`super::source::data_id`]: config, headers and
    /// samples of every tensor's bytes), so that runs of two checkpoints with one tensor table (a
    /// fine-tune and its base) do not merge. Absent in records of wload before it was added:
    /// such a record is not merged with another ([`super::runs`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_data: Option<String>,
    /// The tensors whose values wload computed rather than copied, one line per kind: Mamba2's
    /// `A = -exp(A_log)`, which vLLM's loader computes with the exp of the device it loads on,
    /// so a file matches a GPU's (or torch CPU's) values only within 1 ulp. Absent: every value
    /// is a copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub computed: Option<Vec<String>>,
    /// The vLLM versions whose parameter names and slicing these files follow.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vllm_versions: Option<String>,
    /// The run records this view was read from (`wload.json`, `wload-ranks-*.json`), in the
    /// order merged; never written.
    #[serde(skip)]
    pub records: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize, schemars::JsonSchema)]
pub struct ManifestFile {
    pub name: String,
    /// The global rank (`pp_rank * tp + tp_rank`).
    pub rank: u64,
    /// With pipeline parallelism, the file's stage and TP rank (absent without: `rank` is the TP
    /// rank, and TP-only manifests stay as they were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp_rank: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_rank: Option<u64>,
    pub part: u64,
    pub size: u64,
    /// The file's checksum ([`crate::checksum`]: XXH3-64 of its 64 KiB blocks, summed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xxh3_64k: Option<String>,
    /// XXH3-64 of the whole file, hex: what manifests of wload 0.1.0 before block checksums
    /// hold instead; read, never written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xxh3: Option<String>,
}

impl ManifestFile {
    /// Whether the file at `path`, whose block checksum is `sum` ([`crate::checksum`]) and size
    /// `size`, is the one recorded here. A manifest from before block checksums is checked
    /// against the whole file's XXH3, read again.
    pub(crate) fn matches(&self, path: &Path, sum: &str, size: u64) -> io::Result<bool> {
        if size != self.size {
            return Ok(false);
        }
        match (&self.xxh3_64k, &self.xxh3) {
            (Some(k), _) => Ok(k == sum),
            (None, Some(whole)) => Ok(*whole == crate::checksum::whole_file_xxh3(path)?),
            (None, None) => Ok(false),
        }
    }
}

impl Manifest {
    /// The run records this view was read from, for messages: `wload.json`, or
    /// `wload-ranks-0-3.json, wload-ranks-4-7.json`.
    pub(crate) fn record_names(&self) -> String {
        if self.records.is_empty() {
            MANIFEST.to_string()
        } else {
            self.records.join(", ")
        }
    }

    /// The multimodal settings this records; a mode that is no vLLM mode asks for none (a
    /// folder from elsewhere may record anything: the pre-sharded check reports it).
    pub(crate) fn multimodal(&self) -> Multimodal {
        Multimodal {
            language_model_only: self.language_model_only,
            mm_encoder_tp_mode: self
                .mm_encoder_tp_mode
                .as_deref()
                .and_then(MmEncoderTpMode::parse)
                .unwrap_or_default(),
        }
    }

    /// One record, `name` with contents `bytes`, without merging.
    pub(crate) fn parse_record(name: &str, bytes: &[u8]) -> Result<Manifest, RecordError> {
        let mut m: Manifest = serde_json::from_slice(bytes)?;
        m.records = vec![name.to_string()];
        Ok(m)
    }

    /// As a run record's file holds it: pretty JSON, one final newline.
    pub(crate) fn to_json(&self) -> String {
        serde_json::to_string_pretty(self).expect("manifest serialises") + "\n"
    }
}

// Here, above the file names it falls back on: what a folder was written for is first what its
// manifest says.
impl WrittenFor {
    /// `files` must not be empty.
    pub(crate) fn of(files: &RankFiles, manifest: Option<&Manifest>) -> WrittenFor {
        if let Some(m) = manifest {
            // A hand-edited manifest may say 0; the layout checks divide by these.
            return WrittenFor {
                tp: m.tp.max(1),
                pp: m.pp.max(1),
                expert_parallel: Some(m.expert_parallel),
                dtype: Some(m.dtype.clone()),
                architecture: Some(m.architecture.clone()),
                source_checkpoint: Some(m.source.clone()),
                multimodal: m.multimodal().flags(),
                module_tree: m.module_tree.clone(),
                from: m.record_names(),
            };
        }
        WrittenFor::from_names(files)
    }
}

/// Why a run record cannot be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordError {
    /// Not a regular file (a folder, a pipe), permission denied, too large.
    #[error("cannot be read: {0}")]
    Unreadable(#[from] io::Error),
    /// Truncated in the copy, edited, or not wload's.
    #[error("is not a run record's JSON (cut short in the copy, or edited?): {0}")]
    Malformed(#[from] serde_json::Error),
}
