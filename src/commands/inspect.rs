//! `wload inspect`: the facts about a checkpoint, as one serialisable value.

use std::collections::BTreeMap;

use regex::Regex;
use serde::Serialize;

pub(crate) mod config_less;
pub(crate) mod support;
pub(crate) mod survey;
pub(crate) mod tower;

use crate::commands::error::Error;
use crate::config::ModelConfig;
use crate::dtype::Dtype;
use crate::model::deepseek_v4::{self, DeepseekV4, PlatformSpecific};
use crate::model::structure::{self, Structure};
use crate::open::Opened;
use crate::quant::info::QuantInfo;
use crate::quant::names::{TensorRole, tensor_role};
use crate::resolve::{DroppedFile, Resolved};

/// Borrows the tensor rows from the [`Opened`] checkpoint it describes: a large checkpoint has
/// 128k of them, and copying every name would cost more than printing them.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct Inspection<'a> {
    pub schema_version: u32,
    pub wload_version: &'static str,
    pub source: String,
    /// For a hub repo id: the revision, commit, cache snapshot and what was downloaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub: Option<crate::resolve::remote::RemoteSource>,
    pub format: FormatInfo,
    pub files: Vec<FileInfo>,
    pub dropped: Vec<DroppedFile>,
    pub config: ConfigSummary,
    /// Whether wload (and vLLM 0.33, as far as wload knows) supports the architecture, by which
    /// mapping; for one it does not, the closest names it does and that plan and shard refuse it.
    pub support: support::Support,
    /// DeepSeek-V4: what the model is and why wload writes nothing for it; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub platform_specific: Option<DeepseekV4>,
    /// The family's attention, experts and dense layers, read from the config as the mapping does.
    pub structure: Structure,
    /// A multimodal model's encoder (vision tower, projector); absent for a text-only model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub vision_tower: Option<tower::Tower>,
    /// What `quantization_config` says and whether wload writes it; `None` when there is none.
    pub quantization: Option<QuantInfo>,
    pub filter: Option<String>,
    pub tensors: Vec<TensorRow<'a>>,
    pub duplicates: Vec<crate::checkpoint::Duplicate>,
    pub totals: Totals,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct FormatInfo {
    pub requested: &'static str,
    pub load_format: &'static str,
    pub pattern: String,
    pub index: Option<String>,
    pub config_format: crate::config::ConfigFormat,
    pub config_file: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct FileInfo {
    pub file: String,
    pub reason: String,
    pub size: u64,
    pub header_bytes: u64,
    pub tensors: usize,
    pub metadata: Option<BTreeMap<String, String>>,
    /// For a hub repo id: "cache" or "download".
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<crate::resolve::remote::Origin>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct ConfigSummary {
    pub architecture: Option<String>,
    #[serde(flatten)]
    pub config: ModelConfig,
    /// head_dim as used when the config does not state it: hidden_size / num_attention_heads.
    pub head_dim_default: Option<u64>,
    /// What vLLM's `--dtype auto` loads the model as: the config's dtype, or without one the
    /// weights' common dtype (float32 becomes bfloat16).
    pub auto_dtype: Dtype,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct TensorRow<'a> {
    pub name: &'a str,
    pub dtype: Dtype,
    pub role: TensorRole,
    pub shape: &'a [u64],
    pub bytes: u64,
    pub file: &'a str,
    /// A later file holds a tensor of the same name; vLLM keeps that one.
    pub shadowed: bool,
}

#[derive(Debug, Default, Serialize, schemars::JsonSchema)]
pub struct Totals {
    /// Tensors listed (shadowed copies excluded).
    #[serde(flatten)]
    pub count: Count,
    pub by_dtype: Vec<DtypeTotal>,
    /// One entry per (role, dtype) present, in role order, then by bytes.
    pub by_role: Vec<RoleTotal>,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct DtypeTotal {
    pub dtype: Dtype,
    #[serde(flatten)]
    pub count: Count,
}

/// Tensors, their bytes and their elements, summed.
#[derive(Debug, Default, Clone, Copy, Serialize, schemars::JsonSchema)]
pub struct Count {
    pub tensors: usize,
    pub bytes: u64,
    pub parameters: u64,
}

impl Count {
    fn add(&mut self, t: &crate::checkpoint::TensorInfo) {
        self.tensors += 1;
        self.bytes += t.len;
        self.parameters += t.numel();
    }
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct RoleTotal {
    pub role: TensorRole,
    pub dtype: Dtype,
    #[serde(flatten)]
    pub count: Count,
}

/// Gathers the facts; `filter` keeps tensors whose name matches (totals then cover those only).
pub fn inspect<'a>(opened: &'a Opened, filter: Option<&str>) -> Result<Inspection<'a>, Error> {
    inspect_mapped(opened, filter, None)
}

/// [`inspect`], with the structure section read from `mapping` (`--mapping FILE`) instead of the
/// built-in mapping for the architecture; a file that cannot be read or parsed is an error.
pub fn inspect_mapped<'a>(
    opened: &'a Opened,
    filter: Option<&str>,
    mapping: Option<&std::path::Path>,
) -> Result<Inspection<'a>, Error> {
    let re = filter.map(Regex::new).transpose()?;
    let Opened {
        resolved,
        config,
        checkpoint,
        ..
    } = opened;
    let files = file_infos(resolved, checkpoint);

    let (tensors, totals) = tensors_and_totals(checkpoint, re.as_ref());
    // The mapping plan would use. Without --mapping, an architecture wload has no mapping for is
    // still inspected (its structure from the config alone).
    let (chosen, refusal) = match mapping {
        Some(file) => (Some(crate::mapping::select(Some(file), None)?), None),
        None => match crate::mapping::select(None, config.architecture()) {
            Ok(m) => (Some(m), None),
            Err(e) => (None, Some(e)),
        },
    };
    // DeepSeek-V4 is refused whatever the mapping: described, with the refusal plan gives.
    let platform_specific = deepseek_v4::is_deepseek_v4(config).then(|| {
        let survey = deepseek_v4::Asked::Survey { max_tp: 8 };
        deepseek_v4::describe(config, checkpoint, survey)
    });
    let is_dsv4 = platform_specific.is_some();
    let quantization = quantization(config, is_dsv4);
    let mut support = match &platform_specific {
        Some(d) => support::platform_specific(PlatformSpecific::new(d.clone())),
        None => support::support(config.architecture(), chosen.as_ref(), refusal, mapping),
    };
    support.refuse_quantization(quantization.as_ref());

    Ok(Inspection {
        schema_version: super::schema::INSPECT,
        wload_version: env!("CARGO_PKG_VERSION"),
        source: match &resolved.remote {
            Some(r) => r.repo.clone(),
            None => resolved.root.display().to_string(),
        },
        hub: resolved.remote.clone(),
        format: format_info(resolved),
        files,
        dropped: resolved.dropped.clone(),
        config: ConfigSummary {
            architecture: config.architecture().map(str::to_string),
            head_dim_default: config.hidden_size.checked_div(config.num_attention_heads),
            auto_dtype: crate::dtype::resolve_dtype(
                crate::dtype::DtypeChoice::Auto,
                config.dtype.as_deref(),
                checkpoint.all_tensors().map(|t| t.dtype),
            ),
            config: config.clone(),
        },
        support,
        platform_specific,
        structure: structure::structure(config, chosen.as_ref(), mapping),
        vision_tower: chosen.as_ref().and_then(|m| tower::tower(m, checkpoint)),
        quantization,
        filter: filter.map(str::to_string),
        tensors,
        duplicates: checkpoint.duplicates.clone(),
        totals,
    })
}

/// What `quantization_config` says; for DeepSeek-V4 (`platform_specific`), refused as the model
/// is, since vLLM reads its `fp8` as its own platform-specific format.
fn quantization(config: &ModelConfig, platform_specific: bool) -> Option<QuantInfo> {
    let model = crate::model::Model::new(config);
    let mut info = crate::quant::info::quant_info(
        config.quantization_config.as_ref(),
        model.quant.as_ref().map(Option::as_ref),
    )?;
    if platform_specific {
        info.supported = false;
        info.refusal = Some(crate::quant::info::Refusal {
            message: "DeepSeek-V4's formats (vLLM reads quant_method fp8 as deepseek_v4_fp8: FP8 block linears, experts by expert_dtype) are laid out per platform and GPU, and wload has no verified reference for them".into(),
            fix: "use vLLM's own loader (--load-format auto)".into(),
        });
    }
    Some(info)
}

/// Each weight file read: why, its size, header and tensor count.
fn file_infos(resolved: &Resolved, checkpoint: &crate::checkpoint::Checkpoint) -> Vec<FileInfo> {
    resolved
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
        .collect()
}

/// Every tensor `re` keeps, and their totals by dtype and by role (shadowed copies listed but not
/// counted).
fn tensors_and_totals<'a>(
    checkpoint: &'a crate::checkpoint::Checkpoint,
    re: Option<&Regex>,
) -> (Vec<TensorRow<'a>>, Totals) {
    let listed = checkpoint.files.iter().map(|f| f.tensors.len()).sum();
    let mut tensors = Vec::with_capacity(if re.is_some() { 0 } else { listed });
    // Without duplicates no copy is shadowed, and the name lookup per tensor can be skipped.
    let any_shadowed = !checkpoint.duplicates.is_empty();
    let mut by: BTreeMap<Dtype, Count> = BTreeMap::new();
    let mut by_role: BTreeMap<(TensorRole, Dtype), Count> = BTreeMap::new();
    let mut count = Count::default();
    for t in checkpoint.all_tensors() {
        if re.is_some_and(|re| !re.is_match(&t.name)) {
            continue;
        }
        let shadowed = any_shadowed && !checkpoint.is_effective(t);
        let role = tensor_role(&t.name);
        if !shadowed {
            by.entry(t.dtype).or_default().add(t);
            by_role.entry((role, t.dtype)).or_default().add(t);
            count.add(t);
        }
        tensors.push(TensorRow {
            name: &t.name,
            dtype: t.dtype,
            role,
            shape: &t.shape,
            bytes: t.len,
            file: &checkpoint.files[t.file].name,
            shadowed,
        });
    }
    let mut by_dtype: Vec<DtypeTotal> = by
        .into_iter()
        .map(|(dtype, count)| DtypeTotal { dtype, count })
        .collect();
    by_dtype.sort_by(|a, b| {
        b.count
            .bytes
            .cmp(&a.count.bytes)
            .then(a.dtype.cmp(&b.dtype))
    });
    let mut by_role: Vec<RoleTotal> = by_role
        .into_iter()
        .map(|((role, dtype), count)| RoleTotal { role, dtype, count })
        .collect();
    by_role.sort_by(|a, b| {
        (a.role.cmp(&b.role))
            .then(b.count.bytes.cmp(&a.count.bytes))
            .then(a.dtype.cmp(&b.dtype))
    });
    let totals = Totals {
        count,
        by_dtype,
        by_role,
    };
    (tensors, totals)
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

/// A SOURCE that is no checkpoint folder but that `inspect` still describes: a pre-sharded folder,
/// or a lone safetensors file.
#[derive(Debug, Serialize, schemars::JsonSchema)]
#[serde(untagged)]
#[allow(clippy::large_enum_variant)] // one per run: boxing would only add an indirection
pub enum OtherSource {
    PreSharded(crate::commands::inspect::survey::Survey),
    File(LoneFile),
}

/// `inspect` of one safetensors file given as SOURCE: its tensors and totals; no config, so no
/// model, and no plan.
#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct LoneFile {
    pub schema_version: u32,
    pub wload_version: &'static str,
    /// Always "file": tells this report from a checkpoint's.
    pub kind: &'static str,
    pub source: String,
    pub size: u64,
    pub header_bytes: u64,
    pub metadata: Option<BTreeMap<String, String>>,
    pub filter: Option<String>,
    pub tensors: Vec<LoneTensor>,
    pub totals: Totals,
    /// What plan, shard and load need besides the file.
    pub note: String,
}

#[derive(Debug, Serialize, schemars::JsonSchema)]
pub struct LoneTensor {
    pub name: String,
    pub dtype: Dtype,
    pub role: TensorRole,
    pub shape: Vec<u64>,
    pub bytes: u64,
}

/// The report for `source` when it is a pre-sharded folder or a lone `.safetensors` file;
/// `None` for anything else (a checkpoint folder, a hub repo id), which [`inspect`] describes.
pub fn other_source(
    source: &std::path::Path,
    filter: Option<&str>,
) -> Result<Option<OtherSource>, Error> {
    let re = filter.map(Regex::new).transpose()?;
    if crate::sharded::names::is_pre_sharded(source) {
        let survey = crate::commands::inspect::survey::survey(source, re.as_ref());
        return Ok(Some(OtherSource::PreSharded(survey)));
    }
    // A pre-sharded folder in a store: surveyed as a local one, from its records and headers.
    if let Some(mirror) = crate::resolve::store::mirror::pre_sharded(source)? {
        let survey = crate::commands::inspect::survey::survey(&mirror.dir, re.as_ref());
        return Ok(Some(OtherSource::PreSharded(survey.in_store(&mirror))));
    }
    let lone = source.is_file()
        && source
            .file_name()
            .is_some_and(|n| n.to_string_lossy().ends_with(".safetensors"));
    if !lone {
        return Ok(None);
    }
    Ok(Some(OtherSource::File(lone_file(
        source,
        filter,
        re.as_ref(),
    )?)))
}

fn lone_file(
    path: &std::path::Path,
    filter: Option<&str>,
    re: Option<&Regex>,
) -> Result<LoneFile, Error> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let ck = crate::checkpoint::Checkpoint::open(parent, std::slice::from_ref(&name))
        .map_err(Error::Headers)?;
    let (rows, totals) = tensors_and_totals(&ck, re);
    let tensors = rows
        .into_iter()
        .map(|r| LoneTensor {
            name: r.name.to_string(),
            dtype: r.dtype,
            role: r.role,
            shape: r.shape.to_vec(),
            bytes: r.bytes,
        })
        .collect();
    let f = &ck.files[0];
    Ok(LoneFile {
        schema_version: super::schema::INSPECT,
        wload_version: env!("CARGO_PKG_VERSION"),
        kind: "file",
        source: path.display().to_string(),
        size: f.size,
        header_bytes: f.header_len,
        metadata: f.metadata.clone(),
        filter: filter.map(str::to_string),
        tensors,
        totals,
        note: lone_file_note(parent, &name),
    })
}

/// What plan, shard and load need besides a lone file, pointing at its folder when that helps.
fn lone_file_note(parent: &std::path::Path, name: &str) -> String {
    if crate::sharded::names::RankFile::parse(name).is_some() {
        return format!(
            "one part of a pre-sharded folder's rank files: inspect or load the folder, {}",
            parent.display()
        );
    }
    let has_config = parent.join("config.json").is_file() || parent.join("params.json").is_file();
    format!(
        "a single file has no config: plan, shard and load need the checkpoint folder, with the model's config.json (or params.json), that holds it{}",
        if has_config {
            format!("; {} has one", parent.display())
        } else {
            String::new()
        }
    )
}
