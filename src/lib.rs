//! wload: resolve a checkpoint, map its names onto vLLM's parameters, plan what every tensor-parallel
//! rank holds, then write or load it. The binary in `main.rs` is a thin shell over this library.
//!
//! Data flows one way: [`source`] → [`checkpoint`] + [`config`] → (mapping → plan → exec) → [`report`].

pub mod checkpoint;
pub mod cli;
pub mod config;
pub mod dtype;
pub mod error;
pub mod inspect;
pub mod report;
pub mod source;

use std::path::PathBuf;

use serde_json::{Map, Value};

pub use error::{Error, ExitStatus};

/// What every subcommand needs to find and read a checkpoint.
#[derive(Debug, Clone)]
pub struct SourceOptions {
    pub source: PathBuf,
    pub load_format: source::LoadFormat,
    pub config_format: config::ConfigFormat,
    pub hf_overrides: Option<Map<String, Value>>,
}

/// A resolved checkpoint: its files, their headers and the model config. No tensor data is read.
#[derive(Debug, Clone)]
pub struct Opened {
    pub resolved: source::Resolved,
    pub config: config::ModelConfig,
    pub checkpoint: checkpoint::Checkpoint,
}

/// Resolves `opts.source`, reads the config and every selected file's header.
pub fn open(opts: &SourceOptions) -> Result<Opened, Error> {
    let resolved = source::resolve_local(&opts.source, opts.load_format, opts.config_format)?;
    let config = config::load(
        &resolved.root,
        &resolved.config_file,
        resolved.config_format,
        opts.hf_overrides.as_ref(),
    )?;
    let checkpoint = checkpoint::Checkpoint::open(&resolved.root, &resolved.file_names())
        .map_err(Error::Headers)?;
    Ok(Opened {
        resolved,
        config,
        checkpoint,
    })
}
