//! The command line, as clap definitions. Also the source of the completions and the man page.

use std::ffi::OsString;
use std::path::PathBuf;

use clap::{Args, CommandFactory, Parser, Subcommand};

use crate::commands::load::DeviceKind;
use crate::config::ConfigFormat;
use crate::dtype::DtypeChoice;
use crate::exec::source::IoMode;
use crate::multimodal::{MmEncoderTpMode, Multimodal};
use crate::quant::MoeBackend;
use crate::ranks::{RankChoice, RankList};
use crate::resolve::LoadFormat;

mod count;
mod pp_partition;
mod replicate_embed;

pub use count::Count;
pub use pp_partition::PpPartitionArg;
pub use replicate_embed::ReplicateEmbedArg;

const EXIT_CODES: &str = "\
Exit status:
  0  success
  1  runtime failure (I/O, network, device)
  2  usage error (bad flags, SOURCE not found)
  3  the checkpoint is malformed or does not fit the model / plan
  129, 130, 143  stopped by SIGHUP, SIGINT (Ctrl-C) or SIGTERM (128 + the signal); nothing was published";

/// Shard and load LLM checkpoints exactly as vLLM holds them, per tensor-parallel rank.
#[derive(Debug, Parser)]
#[command(
    name = "wload",
    version,
    propagate_version = true,
    after_long_help = EXIT_CODES,
    long_about = "Shard and load LLM checkpoints exactly as vLLM holds them, per tensor-parallel rank.\n\n\
wload resolves a checkpoint (safetensors files in a folder or a Hugging Face Hub repo) the way vLLM does, maps its tensor \
names onto vLLM's parameters, and computes what every tensor-parallel rank must hold."
)]
pub struct Cli {
    /// Print more detail: how things were found and read, not only what
    #[arg(
        short,
        long,
        global = true,
        action = clap::ArgAction::Count,
        long_help = "Print more detail: how things were found and read, not only what.\n\n\
inspect: why each file was or was not chosen, per-file header sizes. plan: the skipped tensors \
one by one, the file of every source tensor. load: where the bytes came from (page-cache share, \
--io mode and why, storage and host-to-device rates, staging memory)."
    )]
    pub verbose: u8,

    /// Print only results and errors: no progress bars, notes or warnings
    #[arg(
        short,
        long,
        global = true,
        conflicts_with = "verbose",
        long_help = "Print only results and errors: no progress bars, notes or warnings.\n\n\
plan: the verdict and totals line (problems still go to stderr). load: the one result line \
(what was loaded, how fast; with --checksums, the checksums too). shard: nothing on success. \
Errors always go to stderr, and the exit status says the outcome; --json is unaffected."
    )]
    pub quiet: bool,

    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Show a checkpoint's files, config and tensors
    #[command(
        long_about = "Show a checkpoint's files, config and tensors.\n\n\
Lists which weight files vLLM would read (and which it would not, with the reason), the model \
dimensions from config.json or params.json, every tensor with its dtype, shape, size and file, \
and totals per dtype. Only the safetensors headers are read, never the tensor data.",
        after_long_help = EXIT_CODES
    )]
    Inspect(InspectArgs),
    /// Compute what every tensor-parallel rank holds, exactly as vLLM
    #[command(
        long_about = "Compute what every tensor-parallel rank holds, exactly as vLLM.\n\n\
Maps the checkpoint's names onto vLLM's parameters with the model family's mapping \
(mappings/*.yaml, chosen by config.json architectures), then lists per rank the tensors vLLM \
holds, in its state_dict order, and where every byte comes from: which checkpoint tensor and \
region, or a fill value. Everything that would stop vLLM (unmapped names, missing parameters, \
shapes that disagree with the config, sizes not divisible by --tp) is reported at once, before \
any tensor data is read.",
        after_long_help = EXIT_CODES
    )]
    Plan(PlanArgs),
    /// Which --tp, --pp and expert-parallel sizes vLLM accepts, and why not the others
    #[command(
        long_about = "Which --tp, --pp and expert-parallel sizes vLLM accepts for a checkpoint, and why not the others.\n\n\
Asks the planner `plan` uses (its checks only; no tensor data is read) about TP sizes 1 to 8, the \
powers of two and the divisors of the attention heads, up to --max-tp; for a MoE, each of them \
with --enable-expert-parallel too; and --pp 2 up to --max-pp (and the layer count) at each TP \
size accepted alone (with VLLM_PP_LAYER_PARTITION set, only the PP size it describes, at every \
TP size). A refused layout shows the first problem `wload plan` would report for it: \
the verdicts are plan's, so the two cannot disagree. Exit 0 whatever the verdicts (3 when the \
checkpoint cannot be read or mapped at all).",
        after_long_help = EXIT_CODES
    )]
    Sizes(SizesArgs),
    /// Write pre-sharded per-rank safetensors files for vLLM's sharded_state loader
    #[command(
        long_about = "Write pre-sharded per-rank safetensors files for vLLM's sharded_state loader.\n\n\
Writes model-rank-{r}-part-{p}.safetensors for every rank, byte for byte what vLLM 0.33 saves with \
save_sharded_state, plus the source's side files (config.json, tokenizer, ...) and a manifest, \
wload.json. Then: vllm serve OUT --load-format sharded_state -tp N. With --pp P the files are \
model-pp-{p}-tp-{t}-part-{k}.safetensors, one set per pipeline stage and TP rank, as vLLM names them \
then; serve with --pipeline-parallel-size P too.\n\n\
OUT must be new or an empty folder; --force also lets wload replace an earlier wload output (a \
folder with its wload.json and nothing else of yours), never anything else. The output is built in \
a hidden folder next to OUT and renamed into place only when complete (and verified, with \
--verify), and never over an OUT that another run created meanwhile; an interrupted or failed run \
leaves no OUT behind, and the hidden folders of killed runs are removed by the next run. Each \
source byte is read once, whatever the TP size, and memory stays bounded.\n\n\
Dense slices go file to file with copy_file_range. On a filesystem where that call misbehaves \
(--verify reports the damage), set WLOAD_NO_COPY_FILE_RANGE=1 to copy tensor data and side files \
through memory instead.",
        after_long_help = EXIT_CODES
    )]
    Shard(ShardArgs),
    /// Load a checkpoint into device memory per rank, timing every stage; --dry-run to debug
    #[command(
        long_about = "Load a checkpoint into device memory per rank, timing every stage.\n\n\
SOURCE is a checkpoint (planned on the fly, exactly as `plan` shows) or a pre-sharded folder \
written by `wload shard` or by vLLM (model-rank-*-part-*.safetensors, or with --pp \
model-pp-*-tp-*-part-*.safetensors; each rank reads only its own files). Rank r goes to GPU r (or, under torchrun / srun, the process's own ranks to its local \
GPUs). The report gives seconds, bytes and GB/s for resolve, plan, open, read, convert, copy \
and sync.\n\n\
--dry-run does everything but touch a device: resolves, plans and validates as vLLM would, and \
for pre-sharded folders also checks rank files, keys and shapes against the config, --tp and \
--pp, which vLLM's own loader does not. With --read it also reads and checksums every byte. Exit 0 \
when vLLM would load it, 3 with every problem listed otherwise.",
        after_long_help = EXIT_CODES
    )]
    Load(LoadArgs),
    /// Print a shell completion script to stdout (bash, zsh, fish, elvish, powershell)
    Completions {
        /// The shell to generate for
        shell: clap_complete::Shell,
    },
    /// Show the manual: wload(1), or with a subcommand's name its own page
    #[command(
        long_about = "Show the manual: wload(1), or with a subcommand's name its own page (wload-plan(1) for plan).\n\n\
On a terminal the page is shown formatted, through `man -l -`, else as plain text through \
$MANPAGER, $PAGER or `less -R`. When stdout is not a terminal the page is printed as roff, to \
install it: wload man > wload.1; wload man plan > wload-plan.1"
    )]
    Man {
        /// The subcommand whose page to print (wload-inspect(1) for inspect)
        command: Option<String>,
    },
}

impl Command {
    /// Whether the command line asked for one JSON document on stdout (`--json`): then every
    /// outcome, a failure too, prints one.
    pub fn json(&self) -> bool {
        match self {
            Command::Inspect(a) => a.json,
            Command::Plan(a) => a.json,
            Command::Shard(a) => a.json,
            Command::Load(a) => a.json,
            Command::Sizes(a) => a.json,
            Command::Completions { .. } | Command::Man { .. } => false,
        }
    }
}

/// How to find and read a checkpoint; shared by every subcommand.
#[derive(Debug, Args)]
pub struct SourceArgs {
    /// Checkpoint folder (safetensors files plus config.json or params.json), or a Hugging Face Hub repo id (org/name)
    #[arg(
        value_name = "SOURCE",
        value_hint = clap::ValueHint::DirPath,
        long_help = "Checkpoint folder (safetensors files plus config.json or params.json), or a Hugging Face \
Hub repo id (org/name) when no such folder exists.\n\n\
A repo id is resolved as vLLM does: from the local Hugging Face cache first (HF_HUB_CACHE, else \
$HF_HOME/hub, else ~/.cache/huggingface/hub; or --download-dir), then by downloading only the files \
the load format reads (the index first, then the shards it lists) and the side files (config, \
tokenizer, ...). HF_ENDPOINT and HF_TOKEN are honoured; with HF_HUB_OFFLINE=1 no connection is \
made and a file missing from the cache is an error. HF_HUB_ETAG_TIMEOUT (metadata requests) and \
HF_HUB_DOWNLOAD_TIMEOUT (a stalled transfer, which is then resumed a few times) are in seconds, \
default 10, as in huggingface_hub."
    )]
    pub source: PathBuf,

    /// Which weight files to read, as vLLM's --load-format
    #[arg(
        long,
        value_enum,
        default_value_t = LoadFormat::Auto,
        long_help = "Which weight files to read, as vLLM's --load-format.\n\n\
auto: mistral when a consolidated*.safetensors exists anywhere in the folder, else hf. \
hf: *.safetensors, else *.bin, else *.pt (the first pattern with a match wins). \
safetensors: *.safetensors only. mistral: consolidated*.safetensors. pt: *.pt. \
With safetensors, an index file (model.safetensors.index.json, or \
consolidated.safetensors.index.json for mistral) drops the files its weight_map does not name."
    )]
    pub load_format: LoadFormat,

    /// Which config to read, as vLLM's --config-format
    #[arg(long, value_enum, default_value_t = ConfigFormat::Auto)]
    pub config_format: ConfigFormat,

    /// JSON object applied on top of the model config, as vLLM's --hf-overrides
    #[arg(
        long,
        value_name = "JSON",
        long_help = "JSON object applied on top of the model config, as vLLM's --hf-overrides.\n\n\
Top-level keys replace the config's values; an object given for a nested *_config \
(text_config, ...) is merged into it. Example: --hf-overrides '{\"num_hidden_layers\": 2}'"
    )]
    pub hf_overrides: Option<String>,

    /// Hub revision of a repo id: branch, tag or commit, as vLLM's --revision
    #[arg(long, value_name = "REV", default_value = "main")]
    pub revision: String,

    /// Hugging Face cache folder for a repo id, as vLLM's --download-dir (default: HF_HUB_CACHE, else $HF_HOME/hub)
    #[arg(long, value_name = "DIR", value_hint = clap::ValueHint::DirPath)]
    pub download_dir: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub source: SourceArgs,

    /// Only list tensors whose name matches this regular expression (totals then cover those)
    #[arg(long, value_name = "REGEX")]
    pub filter: Option<String>,

    /// Print one JSON document instead of tables (schema: docs/inspect-json.md)
    #[arg(long)]
    pub json: bool,

    /// Mapping file whose structure (experts, dense layers, MTP layers) to describe, instead of the built-in one for the architecture (docs/mapping-format.md)
    #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath)]
    pub mapping: Option<PathBuf>,
}

/// How to split the model: shared by plan, shard and load.
#[derive(Debug, Args)]
pub struct ParallelArgs {
    /// Tensor-parallel size (vLLM's --tensor-parallel-size)
    #[arg(
        long,
        short = 't',
        value_name = "N",
        value_parser = Count::<u64>::at_least(1),
        visible_alias = "tensor-parallel-size"
    )]
    pub tp: u64,

    /// Pipeline-parallel size (vLLM's --pipeline-parallel-size): ranks are pp_rank × tp + tp_rank
    #[arg(
        long,
        value_name = "N",
        default_value_t = 1,
        value_parser = Count::<u64>::at_least(1),
        visible_alias = "pipeline-parallel-size"
    )]
    pub pp: u64,

    /// Spread MoE experts over the ranks instead of splitting each (vLLM's --enable-expert-parallel)
    #[arg(long)]
    pub enable_expert_parallel: bool,

    #[arg(long, value_name = "NAME", value_parser = parse_moe_backend, help = MOE_BACKEND_HELP)]
    pub moe_backend: Option<MoeBackend>,

    #[command(flatten)]
    pub model: ModelArgs,

    #[command(flatten)]
    pub pp_partition: PpPartitionArg,

    #[command(flatten)]
    pub replicate_embed: ReplicateEmbedArg,
}

/// The model's dtype and mapping file: shared by plan, shard and sizes (`load`, whose dtype
/// defaults to its folder's wload.json, has [`LoadParallelArgs`]).
#[derive(Debug, Args)]
pub struct ModelArgs {
    /// Model dtype, as vLLM's --dtype (auto: the config's, else the weights' common dtype; float32 becomes bfloat16)
    #[arg(long, value_enum, default_value_t = DtypeChoice::Auto)]
    pub dtype: DtypeChoice,

    #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath, help = MAPPING_HELP)]
    pub mapping: Option<PathBuf>,

    #[command(flatten)]
    pub multimodal: MultimodalArgs,
}

/// vLLM's multimodal flags that change which tensors a rank holds: shared by plan, shard and
/// sizes (`load`'s default to its folder's wload.json: [`LoadParallelArgs`]).
#[derive(Debug, Args)]
pub struct MultimodalArgs {
    #[arg(long, help = LANGUAGE_MODEL_ONLY_HELP)]
    pub language_model_only: bool,

    #[arg(long, value_enum, value_name = "MODE", default_value_t = MmEncoderTpMode::Weights, help = MM_ENCODER_TP_MODE_HELP)]
    pub mm_encoder_tp_mode: MmEncoderTpMode,
}

impl MultimodalArgs {
    pub fn get(&self) -> Multimodal {
        Multimodal {
            language_model_only: self.language_model_only,
            mm_encoder_tp_mode: self.mm_encoder_tp_mode,
        }
    }
}

/// The help of `--language-model-only` (plan, shard, sizes).
const LANGUAGE_MODEL_ONLY_HELP: &str = "Multimodal models: the language model only, without its vision (or audio) encoder, as vLLM's --language-model-only builds it; ignored for text-only models, as vLLM ignores it";

/// The help of `--mm-encoder-tp-mode` (plan, shard, sizes).
const MM_ENCODER_TP_MODE_HELP: &str = "Multimodal models: how the encoder uses tensor parallelism, as vLLM's --mm-encoder-tp-mode: weights (each layer split over the ranks, vLLM's default) or data (the whole encoder on every rank)";

/// The help of `--moe-backend` (plan, shard, load).
const MOE_BACKEND_HELP: &str = "The vLLM --moe-backend the experts are laid out for. MXFP4 experts padded as it pads them (triton, marlin, flashinfer_trtllm, flashinfer_cutlass, deep_gemm, cpu, emulation; default: unpadded slices, which load on every backend). ModelOpt NVFP4 experts under --enable-expert-parallel, required: a FlashInfer backend (flashinfer_trtllm, flashinfer_cutlass, flashinfer_cutedsl, flashinfer_b12x) holds every expert's input scales on every rank, the others (marlin, the H100/H200 default; cutlass, b12x, humming, flashinfer_moe_ep_cutedsl, emulation) the rank's own";

fn parse_moe_backend(s: &str) -> Result<MoeBackend, String> {
    MoeBackend::parse(s)
}

/// The help of every `--mapping` that picks the mapping to plan with (plan, shard, sizes, load).
const MAPPING_HELP: &str =
    "Mapping file to use instead of the built-in one for the architecture (docs/mapping-format.md)";

impl Cli {
    /// The command that parses: `Cli::command()` plus the arguments read from the environment
    /// ([`PpPartitionArg`]).
    fn parsing_command() -> clap::Command {
        Cli::command().mut_subcommands(|c| {
            if PpPartitionArg::SUBCOMMANDS.contains(&c.get_name()) {
                c.arg(PpPartitionArg::arg()).arg(ReplicateEmbedArg::arg())
            } else {
                c
            }
        })
    }

    /// Parses `args` (the program's name first), as `Cli::try_parse_from` but with the
    /// environment's arguments.
    pub fn parse_args<I, T>(args: I) -> Result<Cli, clap::Error>
    where
        I: IntoIterator<Item = T>,
        T: Into<OsString> + Clone,
    {
        let mut cmd = Cli::parsing_command();
        let matches = cmd.try_get_matches_from_mut(args)?;
        <Cli as clap::FromArgMatches>::from_arg_matches(&matches).map_err(|e| e.format(&mut cmd))
    }
}

#[derive(Debug, Args)]
pub struct PlanArgs {
    #[command(flatten)]
    pub source: SourceArgs,

    #[command(flatten)]
    pub parallel: ParallelArgs,

    /// Show only this rank
    #[arg(long, value_name = "R")]
    pub rank: Option<u64>,

    /// Print one JSON document instead of tables (schema: docs/plan-json.md)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct SizesArgs {
    #[command(flatten)]
    pub source: SourceArgs,

    /// The largest tensor-parallel size to check
    #[arg(long, value_name = "N", default_value_t = 64, value_parser = Count::<u64>::new(1, 4096))]
    pub max_tp: u64,

    /// The largest pipeline-parallel size to check (never more than the layers)
    #[arg(long, value_name = "N", default_value_t = 4, value_parser = Count::<u64>::new(1, 1024))]
    pub max_pp: u64,

    #[command(flatten)]
    pub model: ModelArgs,

    #[command(flatten)]
    pub pp_partition: PpPartitionArg,

    #[command(flatten)]
    pub replicate_embed: ReplicateEmbedArg,

    /// Print one JSON document instead of a table (schema: docs/sizes-json.md)
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ShardArgs {
    #[command(flatten)]
    pub source: SourceArgs,

    #[command(flatten)]
    pub parallel: ParallelArgs,

    /// Output folder: new or empty (or, with --force, an earlier wload output)
    #[arg(short, long = "output", value_name = "OUT", value_hint = clap::ValueHint::DirPath)]
    pub out: PathBuf,

    /// Largest data size of one part file: bytes (40000) or with a unit (500MB, 5GiB)
    #[arg(long, value_name = "SIZE", default_value = "5GiB", value_parser = parse_size)]
    pub max_part_size: u64,

    /// Write only these ranks, e.g. 0-3 or 0,2,5 (to split one job across machines); or
    /// `launcher`: this run's contiguous share of them, from torchrun (RANK/WORLD_SIZE), srun
    /// (SLURM_PROCID/SLURM_NTASKS), a Slurm array (SLURM_ARRAY_TASK_ID, SLURM_ARRAY_TASK_MIN,
    /// SLURM_ARRAY_TASK_COUNT) or a Kubernetes Indexed Job (JOB_COMPLETION_INDEX, with WLOAD_RUNS
    /// set to its completions)
    #[arg(long, value_name = "LIST|launcher")]
    pub ranks: Option<RankChoice>,

    /// Replace OUT if it is an earlier wload output (only once the new output is complete)
    #[arg(long)]
    pub force: bool,

    /// Read every written byte back and compare it with the source before publishing OUT
    #[arg(long)]
    pub verify: bool,

    #[command(flatten)]
    pub io: IoArgs,

    /// Print a JSON report (the manifest, sizes, timings) instead of a summary (schema: docs/shard-json.md)
    #[arg(long)]
    pub json: bool,
}

fn parse_size(s: &str) -> Result<u64, String> {
    crate::units::parse_size(s)
}

#[derive(Debug, Args)]
pub struct LoadArgs {
    #[command(flatten)]
    pub source: SourceArgs,

    #[command(flatten)]
    pub parallel: LoadParallelArgs,

    /// Where to load: GPUs through the CUDA driver, or host memory
    #[arg(long, value_enum, default_value_t = DeviceKind::Cuda)]
    pub device: DeviceKind,

    /// Check everything vLLM would check, without touching a device
    #[arg(long)]
    pub dry_run: bool,

    /// With --dry-run: also read every byte and checksum it (and compare with wload.json)
    #[arg(long, requires = "dry_run")]
    pub read: bool,

    /// Load only these ranks, e.g. 0-3 (default: from RANK/WORLD_SIZE or SLURM_PROCID/SLURM_NTASKS, else all)
    #[arg(long, value_name = "LIST")]
    pub ranks: Option<RankList>,

    /// Copy every tensor back from the device and compare it with the host's bytes
    #[arg(long, conflicts_with = "dry_run")]
    pub check: bool,

    /// Report an XXH3-64 checksum of every loaded tensor
    #[arg(long, conflicts_with = "dry_run")]
    pub checksums: bool,

    #[command(flatten)]
    pub io: IoArgs,

    /// Load N times and report min/median/max (with --cold, each load starts cold)
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = Count::<u32>::new(1, 1000), conflicts_with = "dry_run")]
    pub repeat: u32,

    /// Print one JSON document instead of tables (schema: docs/load-json.md)
    #[arg(long)]
    pub json: bool,
}

/// [`ParallelArgs`] for `load`: each may be left out for a folder whose wload.json records it.
#[derive(Debug, Args)]
pub struct LoadParallelArgs {
    /// Tensor-parallel size (vLLM's --tensor-parallel-size); default: the one in SOURCE's wload.json
    #[arg(
        long,
        short = 't',
        value_name = "N",
        value_parser = Count::<u64>::at_least(1),
        visible_alias = "tensor-parallel-size"
    )]
    pub tp: Option<u64>,

    /// Pipeline-parallel size (vLLM's --pipeline-parallel-size); default: wload.json's, else 1
    #[arg(
        long,
        value_name = "N",
        value_parser = Count::<u64>::at_least(1),
        visible_alias = "pipeline-parallel-size"
    )]
    pub pp: Option<u64>,

    /// Spread MoE experts over the ranks (vLLM's --enable-expert-parallel); default: wload.json's
    #[arg(long)]
    pub enable_expert_parallel: bool,

    /// Model dtype, as vLLM's --dtype; default: wload.json's, else auto (the config's)
    #[arg(long, value_enum)]
    pub dtype: Option<DtypeChoice>,

    #[arg(long, value_name = "NAME", value_parser = parse_moe_backend, help = MOE_BACKEND_HELP)]
    pub moe_backend: Option<MoeBackend>,

    /// Multimodal models: the language model only, as vLLM's --language-model-only; default: wload.json's
    #[arg(long)]
    pub language_model_only: bool,

    /// Multimodal models: the encoder's TP mode, as vLLM's --mm-encoder-tp-mode (weights, data); default: wload.json's, else weights
    #[arg(long, value_enum, value_name = "MODE")]
    pub mm_encoder_tp_mode: Option<MmEncoderTpMode>,

    #[arg(long, value_name = "FILE", value_hint = clap::ValueHint::FilePath, help = MAPPING_HELP)]
    pub mapping: Option<PathBuf>,

    #[command(flatten)]
    pub pp_partition: PpPartitionArg,

    #[command(flatten)]
    pub replicate_embed: ReplicateEmbedArg,
}

/// How source files are read; shared by `load` and `shard`, so that both measure the same way.
#[derive(Debug, Args)]
pub struct IoArgs {
    /// How to read the source: auto, buffered, direct (O_DIRECT), or mmap
    #[arg(
        long,
        value_enum,
        value_name = "MODE",
        default_value_t = IoMode::Auto,
        long_help = "How to read the source: auto, buffered (pread through the page cache), direct \
(O_DIRECT), or mmap.\n\n\
auto: for load, direct when under half of the source is in the page cache, else buffered (and \
buffered where the filesystem has no O_DIRECT); for shard, always buffered, since its \
file-to-file copies beat direct reads even cold. The report says which mode was used and why."
    )]
    pub io: IoMode,

    /// Drop the source files from the page cache first (posix_fadvise), checked with mincore
    #[arg(long)]
    pub cold: bool,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cli_is_consistent() {
        Cli::command().debug_assert();
        Cli::parsing_command().debug_assert();
    }

    /// The variable reaches every subcommand that plans, and only through the parsing command.
    #[test]
    fn pp_partition_is_read_by_the_planning_subcommands() {
        let parse = |line: &str| Cli::parse_args(line.split(' ')).unwrap().command;
        let given = "1,1";
        let lines = [
            "wload plan S --tp 1 --vllm-pp-layer-partition 1,1",
            "wload shard S --tp 1 -o O --vllm-pp-layer-partition 1,1",
            "wload sizes S --vllm-pp-layer-partition 1,1",
            "wload load S --vllm-pp-layer-partition 1,1",
        ];
        for line in lines {
            let got = match parse(line) {
                Command::Plan(a) => a.parallel.pp_partition,
                Command::Shard(a) => a.parallel.pp_partition,
                Command::Sizes(a) => a.pp_partition,
                Command::Load(a) => a.parallel.pp_partition,
                _ => unreachable!("{line}"),
            };
            assert_eq!(got.get().as_deref(), Some(given), "{line}");
        }
        assert_eq!(lines.len(), PpPartitionArg::SUBCOMMANDS.len());
        let documented = Cli::command();
        for sub in documented.get_subcommands() {
            assert!(
                sub.get_arguments()
                    .all(|a| a.get_id() != PpPartitionArg::ID)
            );
        }
    }
}
