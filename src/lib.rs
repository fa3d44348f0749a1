//! wload: resolve a checkpoint, map its names onto vLLM's parameters, plan what every tensor-parallel
//! rank holds, then write or load it. The binary (`src/bin/wload/`) is a thin shell over this
//! library.
//!
//! Data flows one way: [`resolve`] → [`open`] ([`checkpoint`] headers + [`config`]) → [`map`] (with
//! the [`mapping`] rules) → [`plan`] → [`exec`] → [`report`]; [`commands`] drive the stages, and
//! imports point from there down. docs/architecture.md has the map.

pub mod checkpoint;
pub mod cli;
pub mod commands;
pub mod config;
pub mod dtype;
pub mod error;
pub mod exec;
pub mod exit;
pub mod manifest;
pub mod map;
pub mod mapping;
pub mod open;
pub mod plan;
pub mod pre_sharded;
pub mod progress;
pub mod rank_files;
pub mod ranks;
pub mod report;
pub mod resolve;
pub mod small_file;

use std::path::PathBuf;
use std::time::Instant;

pub use commands::{inspect, load, shard};
pub use error::Error;
pub use exit::ExitStatus;
pub use open::{Opened, SourceOptions, Timings, open, open_detect, open_with};

/// What `plan` needs beyond the source.
#[derive(Debug, Clone)]
pub struct PlanOptions {
    pub tp: u64,
    pub expert_parallel: bool,
    pub dtype: plan::DtypeChoice,
    /// `--mapping FILE` instead of the embedded mapping for the architecture.
    pub mapping: Option<PathBuf>,
}

/// Picks the mapping, maps the checkpoint's names and plans every rank.
pub fn make_plan(opened: &Opened, opts: &PlanOptions) -> Result<plan::Plan, Error> {
    let mapping = mapping::select(opts.mapping.as_deref(), opened.config.architecture())?;
    let mapped = map::map(&mapping, &opened.checkpoint);
    let p = plan::plan_mapped(
        &mapping,
        &opened.config,
        &mapped,
        &plan::PlanOptions {
            tp: opts.tp,
            expert_parallel: opts.expert_parallel,
            dtype: opts.dtype,
            shapes_only: false,
        },
    )?;
    Ok(p)
}

/// The plan as `wload plan` prints it, optionally for one rank.
pub fn plan_report(
    opened: &Opened,
    opts: &PlanOptions,
    rank: Option<u64>,
) -> Result<plan::PlanReport, Error> {
    if opts.tp == 0 {
        return Err(plan::PlanError::BadTp.into());
    }
    if let Some(r) = rank
        && r >= opts.tp
    {
        return Err(Error::Usage(format!(
            "--rank {r} is out of range for --tp {} (ranks 0..{})",
            opts.tp,
            opts.tp - 1
        )));
    }
    let t = Instant::now();
    let mut p = make_plan(opened, opts)?;
    let timings = Timings {
        plan_s: t.elapsed().as_secs_f64(),
        ..opened.timings
    };
    if let Some(r) = rank {
        p.ranks.retain(|x| x.rank == r);
    }
    Ok(plan::PlanReport {
        schema_version: plan::SCHEMA_VERSION,
        wload_version: env!("CARGO_PKG_VERSION"),
        source: opened.resolved.root.display().to_string(),
        timings,
        plan: p,
    })
}
