//! wload: resolve a checkpoint, map its names onto vLLM's parameters, plan what every tensor-parallel
//! rank holds, then write or load it. The binary (`src/bin/wload/`) is a thin shell over this
//! library.
//!
//! Data flows one way: [`resolve`] → [`open`] ([`checkpoint`] headers + [`config`]) → [`map`] (with
//! the [`mapping`] rules) → [`plan`] → [`exec`] → [`report`]; [`commands`] drive the stages, and
//! imports point from there down. docs/architecture.md has the map.

pub mod checkpoint;
pub mod checksum;
pub mod cli;
pub mod commands;
pub mod config;
pub mod dtype;
pub mod escape;
pub mod exec;
pub mod exit;
pub mod file_stamp;
pub mod layout;
pub mod map;
pub mod mapping;
pub mod model;
pub mod multimodal;
pub mod open;
pub mod plan;
pub mod problem;
pub mod progress;
pub mod quant;
pub mod ranks;
pub mod report;
pub mod resolve;
pub mod sharded;
pub mod small_file;
pub mod units;

pub use commands::error::Error;
pub use commands::pipeline::make_plan;
pub use commands::plan::plan_report;
pub use commands::{inspect, load, shard};
pub use exit::ExitStatus;
pub use open::{Opened, SourceOptions, Timings, Want, open};
pub use plan::PlanOptions;
