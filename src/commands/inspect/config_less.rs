//! `inspect` of a checkpoint folder without its config (no config.json, or no params.json where
//! the config format wants it): the weight files vLLM would select, every tensor and the totals.
//! Without the config there is no model, so no model or structure section and no verdict.
//!
//! It exits 3, not 0: vLLM cannot build the model without its config and `plan` and `shard`
//! refuse the folder, so `inspect`, the gate model-release CI runs, must not pass it; it still
//! lists what it can, as for an architecture without a mapping. (A lone `.safetensors` file given
//! as SOURCE exits 0: a file asked for by name is listed, not judged as a checkpoint.)

use std::path::Path;

use regex::Regex;
use serde::Serialize;

use super::{FileInfo, FormatInfo, TensorRow, Totals};
use crate::checkpoint::{Checkpoint, Duplicate};
use crate::commands::error::Error;
use crate::resolve::{DroppedFile, LoadFormat, Resolved};

/// The report: [`super::Inspection`]'s fields that need no config, and the refusal as a note.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ConfigLess<'a> {
    pub schema_version: u32,
    pub wload_version: &'static str,
    /// Always "no-config": tells this report from a checkpoint's.
    pub kind: &'static str,
    pub source: String,
    /// `config_file` is empty: there is none.
    pub format: FormatInfo,
    pub files: Vec<FileInfo>,
    pub dropped: Vec<DroppedFile>,
    pub filter: Option<String>,
    pub tensors: Vec<TensorRow<'a>>,
    pub duplicates: Vec<Duplicate>,
    pub totals: Totals,
    /// Why there is no model: the refusal `plan` gives, with its fix.
    pub note: String,
}

/// The folder's weight files as vLLM selects them, with their headers read and validated.
pub fn open(root: &Path, load_format: LoadFormat) -> Result<(Resolved, Checkpoint), Error> {
    let resolved = crate::resolve::resolve_local_weights(root, load_format)?;
    let checkpoint =
        Checkpoint::open(&resolved.root, &resolved.file_names()).map_err(Error::Headers)?;
    Ok((resolved, checkpoint))
}

/// The report over what [`open`] read; `note` says why the config is missing.
pub fn config_less<'a>(
    resolved: &'a Resolved,
    checkpoint: &'a Checkpoint,
    filter: Option<&str>,
    note: String,
) -> Result<ConfigLess<'a>, Error> {
    let re = filter.map(Regex::new).transpose()?;
    let (tensors, totals) = super::tensors_and_totals(checkpoint, re.as_ref());
    Ok(ConfigLess {
        schema_version: crate::commands::schema::INSPECT,
        wload_version: env!("CARGO_PKG_VERSION"),
        kind: "no-config",
        source: resolved.root.display().to_string(),
        format: super::format_info(resolved),
        files: super::file_infos(resolved, checkpoint),
        dropped: resolved.dropped.clone(),
        filter: filter.map(str::to_string),
        tensors,
        duplicates: checkpoint.duplicates.clone(),
        totals,
        note,
    })
}
