//! `wload.json`: what `wload shard` wrote (source, TP, flags, every part file with its size and
//! checksum), read back by `load` (to check a pre-sharded folder) and by `shard --force` (to tell an
//! earlier output from a folder of the user's).

use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::ConfigFormat;
use crate::plan::{DtypeChoice, PlanOptions};

/// The manifest's file name, next to the part files.
pub const MANIFEST: &str = "wload.json";

/// What `wload shard` wrote into OUT, as `wload.json`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Manifest {
    pub wload_version: String,
    /// vLLM's format and version these files are for.
    pub format: String,
    pub source: String,
    pub architecture: String,
    pub family: String,
    pub tp: u64,
    /// Pipeline stages; absent (written only when above 1) means 1.
    #[serde(default = "one", skip_serializing_if = "is_one")]
    pub pp: u64,
    pub ranks: Vec<u64>,
    pub expert_parallel: bool,
    pub dtype: String,
    pub max_part_size: u64,
    pub tie_word_embeddings: bool,
    pub files: Vec<ManifestFile>,
    /// Everything else wload put in OUT (config.json, copied side files), so that `--force`
    /// can tell an earlier output from a folder with the user's own files in it. Absent in
    /// manifests of wload 0.1.0 before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_files: Option<Vec<String>>,
    /// Everything inside the folders among `side_files`, as paths relative to OUT, folders
    /// ending in `/` (`original/`, `original/params.json`): `--force` replaces a copied folder
    /// only while it holds exactly these. Absent when no folder was copied, and in manifests of
    /// wload 0.1.0 before it was added (their folders are not provably wload's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub side_tree: Option<Vec<String>>,
    /// The `vllm serve` command for this folder, as `shard` printed it. Absent in manifests of
    /// wload 0.1.0 before it was added.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub serve: Option<ServeCommand>,
}

fn one() -> u64 {
    1
}

fn is_one(n: &u64) -> bool {
    *n == 1
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ManifestFile {
    pub name: String,
    /// The global rank (`pp_rank * tp + tp_rank`).
    pub rank: u64,
    /// With pipeline parallelism, the file's stage and TP rank (absent without: `rank` is the TP
    /// rank, and TP-only manifests stay as they were).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pp_rank: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tp_rank: Option<u64>,
    pub part: u64,
    pub size: u64,
    /// The file's checksum ([`crate::checksum`]: XXH3-64 of its 64 KiB blocks, summed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xxh3_64k: Option<String>,
    /// XXH3-64 of the whole file, hex: what manifests of wload 0.1.0 before block checksums
    /// hold instead; read, never written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub xxh3: Option<String>,
}

impl ManifestFile {
    /// Whether the file at `path`, whose block checksum is `sum` ([`crate::checksum`]) and size
    /// `size`, is the one recorded here. A manifest from before block checksums is checked
    /// against the whole file's XXH3, read again.
    pub fn matches(&self, path: &Path, sum: &str, size: u64) -> io::Result<bool> {
        if size != self.size {
            return Ok(false);
        }
        match (&self.xxh3_64k, &self.xxh3) {
            (Some(k), _) => Ok(k == sum),
            (None, Some(whole)) => Ok(*whole == crate::checksum::whole_file_xxh3(path)?),
            (None, None) => Ok(false),
        }
    }
}

impl Manifest {
    /// The manifest of folder `dir`, if it has a readable one.
    pub fn read(dir: &Path) -> Option<Manifest> {
        serde_json::from_slice(&crate::small_file::read(&dir.join(MANIFEST)).ok()?).ok()
    }
}

/// `vllm serve` for a pre-sharded folder: every flag the files depend on, and none that vLLM
/// would infer the same way by itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServeCommand {
    /// The words, unquoted, for a program to run.
    pub argv: Vec<String>,
    /// The same words quoted for a POSIX shell, to copy and paste.
    pub shell: String,
}

/// What the `vllm serve` command of a pre-sharded folder depends on: the layout its files were
/// written for. Structured facts only, so that the command printed is always one wload builds.
#[derive(Debug, Clone, Copy)]
pub struct ServeLayout<'a> {
    pub tp: u64,
    pub pp: u64,
    pub expert_parallel: bool,
    /// The files' model dtype (`BF16`); `None` when unknown, which asks for no `--dtype`.
    pub dtype: Option<&'a str>,
    /// The other files in the folder (config.json, params.json, tokenizer files).
    pub side_files: &'a [String],
}

impl<'a> ServeLayout<'a> {
    pub fn of(m: &'a Manifest) -> ServeLayout<'a> {
        ServeLayout {
            tp: m.tp,
            pp: m.pp,
            expert_parallel: m.expert_parallel,
            dtype: Some(&m.dtype),
            side_files: m.side_files.as_deref().unwrap_or_default(),
        }
    }
}

impl ServeCommand {
    /// The command for folder `out` (as the user named it) holding `m`'s files; `auto_dtype` is
    /// what vLLM's `--dtype auto` picks from the folder's config.
    pub fn new(out: &Path, m: &Manifest, auto_dtype: &str) -> ServeCommand {
        ServeCommand::for_layout(out, &ServeLayout::of(m), auto_dtype)
    }

    /// The command for folder `out` holding files of layout `m` (see [`ServeCommand::new`]).
    pub fn for_layout(out: &Path, m: &ServeLayout, auto_dtype: &str) -> ServeCommand {
        let mut argv: Vec<String> = vec!["vllm".into(), "serve".into(), model_arg(out)];
        let mut flag = |f: &str, v: Option<String>| {
            argv.push(f.into());
            argv.extend(v);
        };
        flag("--load-format", Some("sharded_state".into()));
        flag("--tensor-parallel-size", Some(m.tp.to_string()));
        if m.pp > 1 {
            flag("--pipeline-parallel-size", Some(m.pp.to_string()));
        }
        if m.expert_parallel {
            flag("--enable-expert-parallel", None);
        }
        if let Some(dtype) = m.dtype
            && dtype != auto_dtype
            && let Some(d) = vllm_dtype(dtype)
        {
            flag("--dtype", Some(d.into()));
        }
        let side = m.side_files;
        let has = |f: &dyn Fn(&str) -> bool| side.iter().any(|s| f(s));
        // vLLM picks params.json (and Mistral's tokenizer) by itself only next to
        // consolidated*.safetensors, which a pre-sharded folder never has
        // (transformers_utils/config.py:889, tokenizers/registry.py:146).
        if has(&|s| s == "params.json") && !has(&|s| s == "config.json") {
            flag("--config-format", Some("mistral".into()));
            if has(&|s| s == "tekken.json" || s.starts_with("tokenizer.model.v")) {
                flag("--tokenizer-mode", Some("mistral".into()));
            }
        }
        let shell = argv
            .iter()
            .map(|a| shell_quote(a))
            .collect::<Vec<_>>()
            .join(" ");
        ServeCommand { argv, shell }
    }
}

/// The folder as vLLM's positional model argument: a relative path that starts with `-` would be
/// read as a flag.
fn model_arg(out: &Path) -> String {
    let s = out.to_string_lossy().into_owned();
    if s.starts_with('-') {
        format!("./{s}")
    } else {
        s
    }
}

/// vLLM's `--dtype` spelling of a manifest dtype (`BF16`); `None` for one it has no flag for.
pub fn vllm_dtype(manifest_dtype: &str) -> Option<&'static str> {
    match manifest_dtype {
        "BF16" => Some("bfloat16"),
        "F16" => Some("float16"),
        "F32" => Some("float32"),
        _ => None,
    }
}

/// One word for a POSIX shell: unchanged when it has nothing the shell would interpret, else in
/// single quotes (a quote inside written `'\''`).
pub fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_string();
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

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
}

/// What `load` runs with: the flags, completed from SOURCE's `wload.json`.
#[derive(Debug, Clone)]
pub struct LoadSettings {
    pub plan: PlanOptions,
    pub config_format: ConfigFormat,
    /// What was taken from the manifest, one line for the user.
    pub note: Option<String>,
}

/// Completes `flags` from the manifest of `source` (a local folder written by `wload shard`): a
/// flag left out takes the recorded value. A flag given that disagrees is kept, for the
/// pre-sharded check to refuse with everything else wrong (see [`disagreements`]). Exit 3 for a
/// manifest recording a size of 0, 2 when neither flag nor manifest gives a TP size.
pub fn load_settings(source: &Path, flags: &LoadFlags) -> Result<LoadSettings, crate::Error> {
    let manifest = source.is_dir().then(|| Manifest::read(source)).flatten();
    let at = source.join(MANIFEST);
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
    let mut dtype = flags.dtype.unwrap_or(DtypeChoice::Auto);
    let mut config_format = flags.config_format;
    if let Some(m) = &manifest {
        if m.tp == 0 || m.pp == 0 {
            return Err(crate::plan::PlanError::Invalid(vec![crate::plan::Problem {
                message: format!(
                    "{} records tp {} and pp {}, and no folder is written for a size of 0: the manifest is damaged",
                    at.display(),
                    m.tp,
                    m.pp
                ),
                fix: Some("re-shard, or remove wload.json and pass --tp (and --pp)".into()),
                file: Some(at.display().to_string()),
                ..Default::default()
            }])
            .into());
        }
        if m.expert_parallel && !flags.expert_parallel {
            expert_parallel = true;
            taken.push("--enable-expert-parallel".into());
        }
        if let (None, Some(r)) = (flags.dtype, recorded_dtype(&m.dtype)) {
            dtype = r;
            taken.push(format!("--dtype {}", dtype_name(r)));
        }
        // vLLM reads params.json only when told to, next to rank files: so must the load.
        if config_format == ConfigFormat::Auto
            && source.join("params.json").is_file()
            && !source.join("config.json").exists()
        {
            config_format = ConfigFormat::Mistral;
            taken.push("--config-format mistral".into());
        }
    }
    let Some(tp) = tp else {
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
        return Err(crate::Error::Usage(format!(
            "--tp is needed: {why}; pass --tp N"
        )));
    };
    let note = (!taken.is_empty()).then(|| {
        format!(
            "{} taken from {} (written by wload shard)",
            taken.join(" "),
            at.display()
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
        },
        config_format,
        note,
    })
}

/// Where `--enable-expert-parallel` and an explicit `--dtype` disagree with the manifest at
/// `at`: `model_dtype` is what the options make of the config. TP and PP are checked with the
/// folder's files (`pre_sharded`), which name both values too.
pub fn disagreements(
    at: &Path,
    m: &Manifest,
    opts: &PlanOptions,
    model_dtype: &str,
) -> Vec<crate::plan::Problem> {
    let mut problems = Vec::new();
    if opts.expert_parallel && !m.expert_parallel {
        problems.push(disagreement(
            at,
            "--enable-expert-parallel",
            "no expert parallelism (each expert split over the ranks)",
        ));
    }
    // `--dtype auto` is vLLM's own choice, converting as it does: not a disagreement.
    if opts.dtype != DtypeChoice::Auto
        && model_dtype != m.dtype
        && let Some(r) = recorded_dtype(&m.dtype)
    {
        problems.push(disagreement(
            at,
            &format!("--dtype {}", dtype_name(opts.dtype)),
            &format!("--dtype {}", dtype_name(r)),
        ));
    }
    problems
}

fn disagreement(at: &Path, given: &str, recorded: &str) -> crate::plan::Problem {
    crate::plan::Problem {
        message: format!(
            "{given} was given, but {} records {recorded}: the files were written for that",
            at.display()
        ),
        fix: Some(format!(
            "drop the flag (load takes it from {MANIFEST}), or re-shard the original checkpoint with {given}"
        )),
        file: Some(at.display().to_string()),
        ..Default::default()
    }
}

/// The `--dtype` that produces a manifest's dtype (`BF16`).
fn recorded_dtype(manifest_dtype: &str) -> Option<DtypeChoice> {
    match manifest_dtype {
        "BF16" => Some(DtypeChoice::Bfloat16),
        "F16" => Some(DtypeChoice::Float16),
        "F32" => Some(DtypeChoice::Float32),
        _ => None,
    }
}

fn dtype_name(d: DtypeChoice) -> &'static str {
    match d {
        DtypeChoice::Auto => "auto",
        DtypeChoice::Bfloat16 => "bfloat16",
        DtypeChoice::Float16 => "float16",
        DtypeChoice::Float32 => "float32",
    }
}
