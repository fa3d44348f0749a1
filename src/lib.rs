//! wload: resolve a checkpoint, map its names onto vLLM's parameters, plan what every tensor-parallel
//! rank holds, then write or load it. The binary (`src/bin/wload/`) is a thin shell over this
//! library.
//!
//! Data flows one way: [`resolve`] → [`open`] ([`checkpoint`] headers + [`config`]) → [`map`] (with
//! the [`mapping`] rules) → [`plan`] → [`exec`] → [`report`]; [`commands`] drive the stages, and
//! imports point from there down. docs/architecture.md has the map.

// `unreachable_pub` (Cargo.toml) checks this face: nothing else is `pub`. It is checked where
// the test-only face (`testing`, below) exists, as in CI's `clippy --all-targets`; without it, what
// only the tests reach through it would read as unreachable.
#![cfg_attr(not(feature = "test-hooks"), allow(unreachable_pub))]

mod checkpoint;
mod checksum;
pub mod cli;
mod commands;
mod config;
mod dtype;
mod escape;
mod exec;
mod exit;
mod file_stamp;
mod layout;
mod map;
mod mapping;
mod model;
mod multimodal;
mod open;
mod plan;
mod problem;
mod progress;
mod quant;
mod ranks;
pub mod report;
mod resolve;
mod sharded;
mod small_file;
mod units;

// The face: everything the binary, the Python package and the integration tests use. The rest of
// the crate is private, so `unreachable_pub` and the dead-code lints see what no one calls.
pub use commands::error::Error;
pub use commands::inspect::config_less::{
    config_less as inspect_config_less, open as open_config_less,
};
pub use commands::inspect::{OtherSource, inspect, inspect_mapped, other_source};
pub use commands::load::settings::LoadFlags;
pub use commands::load::{InputKind, LoadOptions, Planned, Ranks, Request, load, plan};
pub use commands::pipeline::make_plan;
pub use commands::plan::{SizesOptions, plan_report, sizes};
pub use commands::schema;
pub use commands::shard::{ShardOptions, ShardReport, precheck, shard};
pub use config::{ConfigFormat, parse_overrides};
pub use dtype::DtypeChoice;
pub use escape::{Esc, Terminal, escape, is_control};
pub use exit::ExitStatus;
pub use multimodal::MmEncoderTpMode;
pub use open::{OpenError, Opened, SourceOptions, Timings, Want, open};
pub use plan::{OutTensor, Plan, PlanError, PlanOptions};
pub use progress::{DownloadProgress, Progress, Quiet};
pub use quant::MoeBackend;
pub use ranks::launcher::{self as launchers, Share};
pub use ranks::{RankChoice, RankList, World};
pub use resolve::remote::Fetched;
pub use resolve::store::{Scheme, StoreError};
pub use resolve::{LoadFormat, ResolveError};

/// The engine as the Python package drives it: one `fill` into caller-owned host or GPU memory
/// (a borrowing `CudaDevice`), with the I/O mode chosen as `wload load` chooses it.
pub mod engine {
    pub use crate::exec::cuda::{self, CudaDevice};
    pub use crate::exec::device::{Device, DeviceError, Stages};
    pub use crate::exec::host_ptr::HostPtrSink;
    pub use crate::exec::source::IoMode;
    pub use crate::exec::{
        Control, Destinations, ExecError, ExecOptions, Filled, Stats, fill, io_choice,
        source_files, worker_threads,
    };
}

/// The parsers and the planner by themselves, for the integration tests' fuzzing and cost
/// checks, which call them in-process (thousands of inputs a second, no files). Built only with
/// the `test-hooks` feature the tests enable; a release build has no such module.
#[cfg(feature = "test-hooks")]
#[doc(hidden)]
pub mod testing {
    pub use crate::checkpoint::{Checkpoint, HeaderError, MAX_HEADER_LEN, read_header};
    pub use crate::config::load as load_config;
    pub use crate::mapping::{COMMON, EMBEDDED, Expr, select as select_mapping};
    pub use crate::model::Model;
    pub use crate::plan::plan;
    pub use crate::resolve::resolve_local;
}
