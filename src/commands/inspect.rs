//! `wload inspect`: the facts about a checkpoint, as one serialisable value.

use std::collections::BTreeMap;

use regex::Regex;
use serde::Serialize;

use crate::config::ModelConfig;
use crate::dtype::Dtype;
use crate::resolve::{DroppedFile, Resolved};
use crate::{Error, Opened};

/// Bumped when a field changes meaning or disappears; adding fields does not bump it.
pub const SCHEMA_VERSION: u32 = 1;

/// Borrows the tensor rows from the [`Opened`] checkpoint it describes: a large checkpoint has
/// 128k of them, and copying every name would cost more than printing them.
#[derive(Debug, Serialize)]
pub struct Inspection<'a> {
    pub schema_version: u32,
    pub wload_version: &'static str,
    pub source: String,
    /// For a hub repo id: the revision, commit, cache snapshot and what was downloaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub: Option<crate::resolve::hub::HubSource>,
    pub format: FormatInfo,
    pub files: Vec<FileInfo>,
    pub dropped: Vec<DroppedFile>,
    pub config: ConfigSummary,
    pub filter: Option<String>,
    pub tensors: Vec<TensorRow<'a>>,
    pub duplicates: Vec<crate::checkpoint::Duplicate>,
    pub totals: Totals,
}

#[derive(Debug, Serialize)]
pub struct FormatInfo {
    pub requested: &'static str,
    pub load_format: &'static str,
    pub pattern: String,
    pub index: Option<String>,
    pub config_format: crate::config::ConfigFormat,
    pub config_file: String,
}

#[derive(Debug, Serialize)]
pub struct FileInfo {
    pub file: String,
    pub reason: String,
    pub size: u64,
    pub header_bytes: u64,
    pub tensors: usize,
    pub metadata: Option<BTreeMap<String, String>>,
    /// For a hub repo id: "cache" or "download".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<crate::resolve::hub::Origin>,
}

#[derive(Debug, Serialize)]
pub struct ConfigSummary {
    pub architecture: Option<String>,
    #[serde(flatten)]
    pub config: ModelConfig,
    /// head_dim as used when the config does not state it: hidden_size / num_attention_heads.
    pub head_dim_default: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct TensorRow<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub shape: &'a [u64],
    pub bytes: u64,
    pub file: &'a str,
    /// A later file holds a tensor of the same name; vLLM keeps that one.
    pub shadowed: bool,
}

#[derive(Debug, Default, Serialize)]
pub struct Totals {
    /// Tensors listed (shadowed copies excluded).
    pub tensors: usize,
    pub bytes: u64,
    pub parameters: u64,
    pub by_dtype: Vec<DtypeTotal>,
}

#[derive(Debug, Serialize)]
pub struct DtypeTotal {
    pub dtype: Dtype,
    pub tensors: usize,
    pub bytes: u64,
    pub parameters: u64,
}

/// Gathers the facts; `filter` keeps tensors whose name matches (totals then cover those only).
pub fn inspect<'a>(opened: &'a Opened, filter: Option<&str>) -> Result<Inspection<'a>, Error> {
    let re = filter.map(Regex::new).transpose()?;
    let Opened {
        resolved,
        config,
        checkpoint,
        ..
    } = opened;
    let files = resolved
        .files
        .iter()
        .zip(&checkpoint.files)
        .map(|(k, f)| FileInfo {
            file: f.name.clone(),
            reason: k.reason.clone(),
            size: f.size,
            header_bytes: f.header_len,
            tensors: f.tensors.len(),
            metadata: f.metadata.clone(),
            origin: k.origin,
        })
        .collect();

    let listed = checkpoint.files.iter().map(|f| f.tensors.len()).sum();
    let mut tensors = Vec::with_capacity(if re.is_some() { 0 } else { listed });
    // Without duplicates no copy is shadowed, and the name lookup per tensor can be skipped.
    let any_shadowed = !checkpoint.duplicates.is_empty();
    let mut by: BTreeMap<Dtype, DtypeTotal> = BTreeMap::new();
    let mut totals = Totals::default();
    for t in checkpoint.all_tensors() {
        if re.as_ref().is_some_and(|re| !re.is_match(&t.name)) {
            continue;
        }
        let shadowed = any_shadowed && !checkpoint.is_effective(t);
        if !shadowed {
            let numel = t.numel();
            let e = by.entry(t.dtype).or_insert(DtypeTotal {
                dtype: t.dtype,
                tensors: 0,
                bytes: 0,
                parameters: 0,
            });
            e.tensors += 1;
            e.bytes += t.len;
            e.parameters += numel;
            totals.tensors += 1;
            totals.bytes += t.len;
            totals.parameters += numel;
        }
        tensors.push(TensorRow {
            name: &t.name,
            dtype: t.dtype,
            shape: &t.shape,
            bytes: t.len,
            file: &checkpoint.files[t.file].name,
            shadowed,
        });
    }
    totals.by_dtype = by.into_values().collect();
    totals
        .by_dtype
        .sort_by(|a, b| b.bytes.cmp(&a.bytes).then(a.dtype.cmp(&b.dtype)));

    Ok(Inspection {
        schema_version: SCHEMA_VERSION,
        wload_version: env!("CARGO_PKG_VERSION"),
        source: match &resolved.hub {
            Some(h) => h.repo.clone(),
            None => resolved.root.display().to_string(),
        },
        hub: resolved.hub.clone(),
        format: format_info(resolved),
        files,
        dropped: resolved.dropped.clone(),
        config: ConfigSummary {
            architecture: config.architecture().map(str::to_string),
            head_dim_default: config.hidden_size.checked_div(config.num_attention_heads),
            config: config.clone(),
        },
        filter: filter.map(str::to_string),
        tensors,
        duplicates: checkpoint.duplicates.clone(),
        totals,
    })
}

fn format_info(r: &Resolved) -> FormatInfo {
    FormatInfo {
        requested: r.requested_format.as_str(),
        load_format: r.format.as_str(),
        pattern: r.pattern.clone(),
        index: r.index.clone(),
        config_format: r.config_format,
        config_file: r.config_file.clone(),
    }
}
