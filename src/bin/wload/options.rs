//! From clap's arguments to the library's options: every options struct the binary passes
//! (`SourceOptions`, `PlanOptions`, `SizesOptions`, `ShardOptions`, `LoadOptions`, `LoadFlags`) is
//! built here, field by field, so that `main.rs` only runs commands and a new flag is wired in
//! one place.

use wload::LoadFlags;
use wload::LoadOptions;
use wload::ShardOptions;
use wload::SizesOptions;
use wload::cli::{Cli, LoadArgs, ParallelArgs, ShardArgs, SizesArgs, SourceArgs};
use wload::{Error, PlanOptions, SourceOptions};
use wload::{RankChoice, World};

use crate::bars;

/// The flags every subcommand takes.
#[derive(Clone, Copy)]
pub(crate) struct Globals {
    pub verbose: bool,
    pub quiet: bool,
}

impl From<&Cli> for Globals {
    fn from(cli: &Cli) -> Globals {
        Globals {
            verbose: cli.verbose > 0,
            quiet: cli.quiet,
        }
    }
}

/// How to find and read SOURCE; `--quiet` leaves out the download bars. Fails on a
/// `--hf-overrides` that is not a JSON object.
pub(crate) fn source_options(a: &SourceArgs, quiet: bool) -> Result<SourceOptions, Error> {
    Ok(SourceOptions {
        source: a.source.clone(),
        load_format: a.load_format,
        config_format: a.config_format,
        hf_overrides: a
            .hf_overrides
            .as_deref()
            .map(wload::parse_overrides)
            .transpose()?,
        revision: Some(a.revision.clone()),
        download_dir: a.download_dir.clone(),
        download_progress: bars::download_bars(quiet),
        side_files: false,
        headers_only: false,
    })
}

pub(crate) fn plan_options(a: &ParallelArgs) -> PlanOptions {
    PlanOptions {
        tp: a.tp,
        pp: a.pp,
        pp_partition: a.pp_partition.get(),
        expert_parallel: a.enable_expert_parallel,
        dtype: a.model.dtype,
        mapping: a.model.mapping.clone(),
        shapes_only: false,
        moe_backend: a.moe_backend,
        multimodal: a.model.multimodal.get(),
        replicate_embed: a.replicate_embed.get(),
    }
}

pub(crate) fn sizes_options(a: &SizesArgs) -> SizesOptions {
    SizesOptions {
        max_tp: a.max_tp,
        max_pp: a.max_pp,
        dtype: a.model.dtype,
        mapping: a.model.mapping.clone(),
        pp_partition: a.pp_partition.get(),
        multimodal: a.model.multimodal.get(),
        replicate_embed: a.replicate_embed.get(),
    }
}

/// `--ranks launcher` is resolved here, against `world`, so that the library sees a list.
pub(crate) fn shard_options(a: &ShardArgs, world: World) -> Result<ShardOptions, Error> {
    let (ranks, ranks_from) = match &a.ranks {
        None => (None, None),
        Some(RankChoice::List(l)) => (Some(l.clone()), None),
        Some(RankChoice::Launcher) => {
            let share = wload::launchers::from_env()?;
            let from = format!("run {} of {} by {share}", share.index + 1, share.count);
            (Some(share.ranks(world)?), Some(from))
        }
    };
    Ok(ShardOptions {
        out: a.out.clone(),
        max_part_size: a.max_part_size,
        ranks,
        ranks_from,
        force: a.force,
        verify: a.verify,
        io: a.io.io,
        cold: a.io.cold,
    })
}

/// The ranks a `--tp`/`--pp` layout has, for the checks made before planning.
pub(crate) fn world(a: &ParallelArgs) -> World {
    World { tp: a.tp, pp: a.pp }
}

pub(crate) fn load_options(a: &LoadArgs) -> LoadOptions {
    LoadOptions {
        device: a.device,
        dry_run: a.dry_run,
        read: a.read,
        ranks: a.ranks.clone(),
        check: a.check,
        checksums: a.checksums,
        io: a.io.io,
        cold: a.io.cold,
        repeat: a.repeat,
    }
}

/// `load`'s parallel flags as given, for `wload::plan` to complete from
/// SOURCE's wload.json; `hf_overrides` parsed by [`source_options`].
pub(crate) fn load_flags(
    a: &LoadArgs,
    hf_overrides: Option<serde_json::Map<String, serde_json::Value>>,
) -> LoadFlags {
    let p = &a.parallel;
    LoadFlags {
        tp: p.tp,
        pp: p.pp,
        expert_parallel: p.enable_expert_parallel,
        dtype: p.dtype,
        config_format: a.source.config_format,
        pp_partition: p.pp_partition.get(),
        mapping: p.mapping.clone(),
        moe_backend: p.moe_backend,
        language_model_only: p.language_model_only,
        mm_encoder_tp_mode: p.mm_encoder_tp_mode,
        hf_overrides,
        replicate_embed: p.replicate_embed.get(),
    }
}
