//! What `wload load` reports: per rank, per stage, the I/O mode, the repeats and the checksums;
//! `--json` prints these as they are, [`crate::report::load`] writes them for people.

use serde::Serialize;

use super::DeviceKind;
use crate::exec::io_choice;
use crate::open::Timings;

/// Where the tensors came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, schemars::JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum InputKind {
    /// A Hugging Face / Mistral checkpoint, planned on the fly.
    Checkpoint,
    /// Per-rank files written by `wload shard` or vLLM's save_sharded_state.
    PreSharded,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct LoadReport {
    pub source: String,
    pub kind: InputKind,
    pub device: DeviceKind,
    pub dry_run: bool,
    pub tp: u64,
    /// Pipeline stages; in the JSON only when above 1, so that TP-only reports stay as they were.
    #[serde(skip_serializing_if = "crate::units::is_one")]
    pub pp: u64,
    pub ranks: Vec<RankReport>,
    pub bytes: u64,
    pub timings: LoadTimings,
    /// For a hub repo id: what this run fetched from the hub (docs/json.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub_fetched: Option<crate::resolve::remote::Fetched>,
    pub warnings: Vec<String>,
    /// Per-file XXH3 from `--dry-run --read`.
    pub files_read: Vec<FileSum>,
    /// How the source was read, and why (absent on a dry run).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io: Option<IoReport>,
    /// The source's page-cache residency before the (last) load; absent on a dry run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cache: Option<CacheReport>,
    /// With `--repeat N` above 1: every run, and min/median/max.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub repeats: Option<Repeats>,
    /// `--check` passed: every tensor read back from its device equals the host's. Not in the
    /// JSON, where exit status 0 with `--check` says it.
    #[serde(skip)]
    pub checked: bool,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct IoReport {
    #[serde(flatten)]
    pub choice: io_choice::IoChoice,
    /// Pinned (GPU) host bytes held for staging, per rank: the bound on host memory.
    pub staging_bytes_per_rank: u64,
    /// Worker threads reading and copying (more than the cores for direct reads).
    pub threads: usize,
}

/// The source's page-cache residency as the load started.
pub(crate) type CacheReport = io_choice::SourceCache;

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Repeats {
    pub runs: Vec<RunSample>,
    /// Of the runs' GB/s (transfer and sync).
    pub gbps_min: f64,
    pub gbps_median: f64,
    pub gbps_max: f64,
    pub seconds_min: f64,
    pub seconds_median: f64,
    pub seconds_max: f64,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct RunSample {
    pub seconds: f64,
    pub gbps: f64,
    pub resident_share: f64,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct RankReport {
    pub rank: u64,
    pub device: String,
    pub tensors: usize,
    pub bytes: u64,
    /// Seconds spent handing this rank's bytes to its device, summed over threads.
    pub copy_s: f64,
    /// Where this rank's time went, stage by stage.
    #[serde(flatten)]
    pub stages: RankStages,
    pub checksums: Option<Vec<TensorSum>>,
}

/// One rank's stages. Storage to host counts the reads made straight into the rank's staging
/// or memory (every dense unconverted span); bytes that needed conversion or a gather are read
/// by the engine and counted in the totals only.
#[derive(Debug, Default, Clone, Serialize, schemars::JsonSchema)]
pub struct RankStages {
    pub read_bytes: u64,
    /// Wall seconds with at least one of this rank's reads in progress.
    pub read_busy_s: f64,
    pub read_gbps: f64,
    pub h2d_bytes: u64,
    /// Host to device: the GPU's own copy time (events), or for host memory the wall seconds
    /// with a copy in progress.
    pub h2d_s: f64,
    pub h2d_gbps: f64,
    /// How much of the shorter stage ran hidden behind the other (1 = fully), over the load's
    /// wall time.
    pub overlap: f64,
    /// Thread-summed seconds waiting for a staging buffer (copies behind reads shows as 0).
    pub staging_wait_s: f64,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct TensorSum {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub xxh3: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct FileSum {
    pub file: String,
    pub bytes: u64,
    /// Its checksum as `wload.json` records one ([`crate::checksum`]).
    pub xxh3_64k: String,
    /// Whether it matched the manifest (`None` when there is none to compare with).
    pub matches_manifest: Option<bool>,
}

#[derive(Debug, Default, Serialize, schemars::JsonSchema)]
pub struct LoadTimings {
    #[serde(flatten)]
    pub open: Timings,
    /// Creating contexts and allocating device memory.
    pub open_devices_s: f64,
    /// Reading, converting and copying (wall clock, all stages overlapped).
    pub transfer_s: f64,
    /// Thread-summed seconds in each overlapped stage.
    pub read_s: f64,
    pub convert_s: f64,
    pub copy_s: f64,
    /// Waiting for the devices to finish.
    pub sync_s: f64,
    /// Bytes read from storage.
    pub bytes_read: u64,
    /// Storage to host over the transfer's wall time, all ranks (bytes_read / (transfer + sync)).
    pub read_gbps: f64,
    /// Host to device over the same wall time (the loaded bytes).
    pub h2d_gbps: f64,
    /// Evicting the source from the page cache (`--cold`), and measuring its residency.
    pub cache_s: f64,
    pub total_s: f64,
}

impl LoadTimings {
    pub(crate) fn gbps(&self, bytes: u64) -> f64 {
        crate::exec::timing::gbps(bytes, self.transfer_s + self.sync_s)
    }
}
