//! What `load` runs with: its flags, completed from a pre-sharded SOURCE's `wload.json` (a flag
//! left out takes the recorded value), or for vLLM's own sharded_state output (no manifest) from
//! its file names, read as `inspect` reads them ([`WrittenFor::of`]).

use std::path::Path;

use crate::commands::error::Error;
use crate::config::ConfigFormat;
use crate::dtype::DtypeChoice;
use crate::multimodal::{MmEncoderTpMode, Multimodal};
use crate::plan::PlanOptions;
use crate::quant::MoeBackend;
use crate::ranks::embed::REPLICATE_EMBED_VAR;
use crate::sharded::manifest::{MANIFEST, Manifest};
use crate::sharded::names::{self, WrittenFor};

/// `load`'s parallel and format flags as given (`None`: absent), before a manifest fills them in.
#[derive(Debug, Clone)]
pub struct LoadFlags {
    pub tp: Option<u64>,
    pub pp: Option<u64>,
    pub expert_parallel: bool,
    pub dtype: Option<DtypeChoice>,
    pub config_format: ConfigFormat,
    pub pp_partition: Option<String>,
    pub mapping: Option<std::path::PathBuf>,
    pub moe_backend: Option<MoeBackend>,
    /// `--language-model-only` (absent: false, or what the manifest records).
    pub language_model_only: bool,
    pub mm_encoder_tp_mode: Option<MmEncoderTpMode>,
    /// `--hf-overrides` as given.
    pub hf_overrides: Option<serde_json::Map<String, serde_json::Value>>,
    /// `VLLM_REPLICATE_EMBED` on (off: off, or what the manifest records).
    pub replicate_embed: bool,
}

/// What `load` runs with: the flags, completed from SOURCE's `wload.json`.
#[derive(Debug, Clone)]
pub(crate) struct LoadSettings {
    pub plan: PlanOptions,
    pub config_format: ConfigFormat,
    /// `--hf-overrides`: as given, else those the folder's files were planned with.
    pub hf_overrides: Option<serde_json::Map<String, serde_json::Value>>,
    /// What was taken from the manifest, one line for the user.
    pub note: Option<String>,
}

/// Completes `flags` from the manifest of `source` (a local folder written by `wload shard`): a
/// flag left out takes the recorded value. A flag given that disagrees is kept, for the
/// pre-sharded check to refuse with everything else wrong (see [`disagreements`]). Without a
/// manifest, a folder of rank files (vLLM's sharded_state output) gives `--tp` and `--pp` by its
/// file names, and a flag they contradict (files of ranks or stages beyond it, or the other
/// pattern's names) is refused here, naming both. Exit 3 for a
/// manifest recording a size of 0 or a flag the file names contradict, 2 when neither flag,
/// manifest nor file names give a TP size.
pub(crate) fn load_settings(source: &Path, flags: &LoadFlags) -> Result<LoadSettings, Error> {
    // A mistyped folder is named as one (with the close name that exists), not as a folder that
    // records no TP size.
    if !crate::resolve::store::url::looks_like_url(&source.to_string_lossy()) {
        crate::resolve::source::refuse_missing_path(source)?;
    }
    let manifest = source.is_dir().then(|| Manifest::read(source)).flatten();
    if manifest.is_none() && source.is_dir() {
        let files = names::in_folder(source);
        if !files.is_empty() {
            return from_file_names(source, flags, &files);
        }
    }
    // The run records read: wload.json, or those of the `--ranks` runs copied together.
    let at = match manifest.as_ref().map(|m| m.records.as_slice()) {
        Some([one]) => source.join(one).display().to_string(),
        Some(many) if !many.is_empty() => format!("{} ({})", source.display(), many.join(", ")),
        _ => source.join(MANIFEST).display().to_string(),
    };
    let mut taken: Vec<String> = Vec::new();
    let mut fill = |flag: &str, given: Option<u64>, recorded: Option<u64>| {
        given.or_else(|| {
            let r = recorded?;
            taken.push(format!("{flag} {r}"));
            Some(r)
        })
    };
    let tp = fill("--tp", flags.tp, manifest.as_ref().map(|m| m.tp));
    // A recorded PP of 1 is the default anyway: not worth a word in the note.
    let recorded_pp = manifest.as_ref().map(|m| m.pp).filter(|&p| p > 1);
    let pp = fill("--pp", flags.pp, recorded_pp).unwrap_or(1);
    let mut expert_parallel = flags.expert_parallel;
    let mut replicate_embed = flags.replicate_embed;
    let mut dtype = flags.dtype.unwrap_or(DtypeChoice::Auto);
    let mut config_format = flags.config_format;
    let mut hf_overrides = flags.hf_overrides.clone();
    let mut moe_backend = flags.moe_backend;
    let mut multimodal = Multimodal {
        language_model_only: flags.language_model_only,
        mm_encoder_tp_mode: flags.mm_encoder_tp_mode.unwrap_or_default(),
    };
    if let Some(m) = &manifest {
        refuse_damaged(m, &at)?;
        if m.expert_parallel && !flags.expert_parallel {
            expert_parallel = true;
            taken.push("--enable-expert-parallel".into());
        }
        taken.extend(recorded_layout(m, flags, &mut moe_backend, &mut multimodal));
        replicate_embed |= m.replicate_embed;
        if let (None, Some(r)) = (flags.dtype, DtypeChoice::recorded(&m.dtype)) {
            dtype = r;
            taken.push(format!("--dtype {}", r.as_str()));
        }
        taken.extend(recorded_source(
            m,
            source,
            &mut config_format,
            &mut hf_overrides,
        ));
    }
    let Some(tp) = tp else {
        return Err(tp_needed(source));
    };
    let note = (!taken.is_empty()).then(|| {
        format!(
            "{} taken from {} (written by wload shard)",
            taken.join(" "),
            at
        )
    });
    Ok(LoadSettings {
        plan: PlanOptions {
            tp,
            pp,
            pp_partition: flags.pp_partition.clone(),
            expert_parallel,
            dtype,
            mapping: flags.mapping.clone(),
            shapes_only: false,
            moe_backend,
            multimodal,
            replicate_embed,
        },
        config_format,
        hf_overrides,
        note,
    })
}

/// A manifest recording a size of 0 is damaged: no folder is written for one (exit 3).
fn refuse_damaged(m: &Manifest, at: &str) -> Result<(), Error> {
    if m.tp != 0 && m.pp != 0 {
        return Ok(());
    }
    Err(crate::plan::PlanError::Invalid(vec![crate::problem::Problem {
        message: format!(
            "{} records tp {} and pp {}, and no folder is written for a size of 0: the manifest is damaged",
            at, m.tp, m.pp
        ),
        fix: Some("re-shard, or remove wload.json and pass --tp (and --pp)".into()),
        file: Some(at.to_string()),
        ..Default::default()
    }])
    .into())
}

/// How the source's config was read for the files, where the flags leave it open: the
/// `--hf-overrides` they were planned with and `--config-format mistral`. Returns the flags
/// taken, for the note.
fn recorded_source(
    m: &Manifest,
    source: &Path,
    config_format: &mut ConfigFormat,
    hf_overrides: &mut Option<serde_json::Map<String, serde_json::Value>>,
) -> Vec<String> {
    let mut taken = Vec::new();
    // The files were planned from the source's config with these; the folder's config.json is
    // the source's, so the load must apply them again (as `vllm serve` must).
    if let (None, Some(o)) = (&*hf_overrides, &m.hf_overrides) {
        *hf_overrides = Some(o.clone());
        let text = serde_json::Value::from(o.clone()).to_string();
        taken.push(format!(
            "--hf-overrides {}",
            crate::sharded::serve::shell_quote(&text)
        ));
    }
    // vLLM reads params.json only when told to, next to rank files: so must the load.
    if *config_format == ConfigFormat::Auto
        && source.join("params.json").is_file()
        && (m.config_format.as_deref() == Some("mistral") || !source.join("config.json").exists())
    {
        *config_format = ConfigFormat::Mistral;
        taken.push("--config-format mistral".into());
    }
    taken
}

/// Neither flag nor manifest gives a TP size (exit 2).
fn tp_needed(source: &Path) -> Error {
    let why = if source.is_dir() {
        format!(
            "{} has no {MANIFEST} recording the tensor-parallel size (only `wload shard` outputs have one)",
            source.display()
        )
    } else {
        // A typo'd folder must not read as "this folder lacks a manifest".
        format!(
            "{} is not a local folder (a hub repo id, or a path that does not exist), so no {MANIFEST} records the tensor-parallel size",
            source.display()
        )
    };
    Error::Usage(format!("--tp is needed: {why}; pass --tp N"))
}

/// [`load_settings`] for a folder of rank files without a manifest: TP and PP as the file names
/// say (the sizes `inspect` reports for it), the other flags as given.
fn from_file_names(
    source: &Path,
    flags: &LoadFlags,
    files: &names::RankFiles,
) -> Result<LoadSettings, Error> {
    let named = WrittenFor::of(files, None);
    let pattern = names::pattern(files);
    let ranks = |of: fn(&(Option<u64>, u64)) -> Option<u64>| {
        let ids: Vec<u64> = files.keys().filter_map(of).collect();
        if ids.is_empty() {
            "none".into()
        } else {
            crate::units::id_runs(&ids)
        }
    };
    let mut problems = Vec::new();
    let mut refuse = |flag: &str, given: u64, named_size: u64, what: String| {
        problems.push(crate::problem::Problem {
            message: format!(
                "{flag} {given} disagrees with the file names in {}: its {pattern} files are {what}, written for {flag} {named_size}",
                source.display()
            ),
            fix: Some(format!(
                "load with {flag} {named_size}, or leave {flag} out: load reads it from the file names"
            )),
            file: Some(source.display().to_string()),
            ..Default::default()
        });
    };
    // Fewer ranks named than the flag's size prove nothing (a node may hold only its own ranks'
    // files, or one is missing, which the pre-sharded check names); files of ranks beyond it do.
    if let Some(tp) = flags.tp.filter(|&t| t < named.tp) {
        refuse(
            "--tp",
            tp,
            named.tp,
            format!("for TP ranks {}", ranks(|k| Some(k.1))),
        );
    }
    let staged = pattern == names::PP_GLOB;
    // TP-only names are read only with PP off, and PP names only with it on.
    let contradicts = |p: u64| {
        if staged {
            p < named.pp || p == 1
        } else {
            p != 1
        }
    };
    if let Some(pp) = flags.pp.filter(|&p| contradicts(p)) {
        let what = if staged {
            format!("for pipeline stages {}", ranks(|k| k.0))
        } else {
            "named without a pipeline stage (vLLM names them so only when pipeline parallelism is off)".into()
        };
        refuse("--pp", pp, named.pp, what);
    }
    if !problems.is_empty() {
        return Err(crate::plan::PlanError::Invalid(problems).into());
    }
    let mut taken = Vec::new();
    let tp = flags.tp.unwrap_or_else(|| {
        taken.push(format!("--tp {}", named.tp));
        named.tp
    });
    let pp = flags.pp.unwrap_or_else(|| {
        if named.pp > 1 {
            taken.push(format!("--pp {}", named.pp));
        }
        named.pp
    });
    let note = (!taken.is_empty()).then(|| {
        format!(
            "{} taken from the file names in {} ({pattern}; no {MANIFEST})",
            taken.join(" "),
            source.display()
        )
    });
    Ok(LoadSettings {
        plan: PlanOptions {
            tp,
            pp,
            pp_partition: flags.pp_partition.clone(),
            expert_parallel: flags.expert_parallel,
            dtype: flags.dtype.unwrap_or(DtypeChoice::Auto),
            mapping: flags.mapping.clone(),
            shapes_only: false,
            moe_backend: flags.moe_backend,
            multimodal: Multimodal {
                language_model_only: flags.language_model_only,
                mm_encoder_tp_mode: flags.mm_encoder_tp_mode.unwrap_or_default(),
            },
            replicate_embed: flags.replicate_embed,
        },
        config_format: flags.config_format,
        hf_overrides: flags.hf_overrides.clone(),
        note,
    })
}

/// The MoE backend, multimodal flags and `VLLM_REPLICATE_EMBED` left out that the manifest records (the files' shapes
/// and vLLM's key set depend on them): set in `moe` and `mm`, and returned as the flags taken.
/// A name or mode this wload does not know is the pre-sharded check's to report (the shapes or
/// keys then differ): the files were written for it.
fn recorded_layout(
    m: &Manifest,
    flags: &LoadFlags,
    moe: &mut Option<MoeBackend>,
    mm: &mut Multimodal,
) -> Vec<String> {
    let mut taken = Vec::new();
    let recorded = m
        .moe_backend
        .as_deref()
        .and_then(|b| MoeBackend::parse(b).ok());
    if let (None, Some(b)) = (flags.moe_backend, recorded) {
        *moe = Some(b);
        taken.push(format!("--moe-backend {}", b.as_str()));
    }
    // A folder written with the whole embedding on every rank is loaded with it, as vLLM must
    // serve it.
    if m.replicate_embed && !flags.replicate_embed {
        taken.push(format!("{REPLICATE_EMBED_VAR}=1"));
    }
    if m.language_model_only && !flags.language_model_only {
        mm.language_model_only = true;
        taken.push("--language-model-only".into());
    }
    let recorded = m
        .mm_encoder_tp_mode
        .as_deref()
        .and_then(MmEncoderTpMode::parse);
    if let (None, Some(mode)) = (flags.mm_encoder_tp_mode, recorded) {
        mm.mm_encoder_tp_mode = mode;
        taken.push(format!("--mm-encoder-tp-mode {mode}"));
    }
    taken
}
