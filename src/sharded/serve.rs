//! The one `vllm serve` line for a pre-sharded folder: built from the layout its files were
//! written for (what `shard` prints, what `inspect` and `load` show for a folder), never taken from
//! a manifest, whose `serve` a folder from elsewhere may fill with any command at all.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::manifest::{Manifest, ServeCommand};
use super::names::{RankFiles, WrittenFor};
use crate::checkpoint::Checkpoint;
use crate::dtype::{DtypeChoice, resolve_dtype};
use crate::multimodal::Multimodal;
use crate::ranks::embed::REPLICATE_EMBED_VAR;
use crate::ranks::stages::PP_PARTITION_VAR;

/// What the `vllm serve` command of a pre-sharded folder depends on: the layout its files were
/// written for. Structured facts only, so that the command printed is always one wload builds.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ServeLayout<'a> {
    pub tp: u64,
    pub pp: u64,
    pub expert_parallel: bool,
    /// The files' model dtype (`BF16`); `None` when unknown, which asks for no `--dtype`.
    pub dtype: Option<&'a str>,
    /// The other files in the folder (config.json, params.json, tokenizer files).
    pub side_files: &'a [String],
    /// The MoE backend the MXFP4 experts were padded for: vLLM must pick the same one.
    pub moe_backend: Option<&'a str>,
    /// `--language-model-only` and `--mm-encoder-tp-mode`: vLLM's key set depends on them.
    pub multimodal: Multimodal,
    /// Planned from params.json (the manifest's `config_format: mistral`).
    pub mistral_config: bool,
    /// `VLLM_PP_LAYER_PARTITION` the stages were split with, when not vLLM's even split.
    pub pp_layer_partition: Option<&'a str>,
    /// `VLLM_REPLICATE_EMBED=1`: the whole embedding on every rank (DSA CUDA tree).
    pub replicate_embed: bool,
    /// The hub repo id the files came from: the name clients send (`--served-model-name`).
    pub served_model_name: Option<&'a str>,
    /// The `--hf-overrides` the files were planned with.
    pub hf_overrides: Option<&'a serde_json::Map<String, serde_json::Value>>,
}

impl<'a> ServeLayout<'a> {
    pub(crate) fn of(m: &'a Manifest) -> ServeLayout<'a> {
        ServeLayout {
            tp: m.tp,
            pp: m.pp,
            expert_parallel: m.expert_parallel,
            dtype: Some(&m.dtype),
            side_files: m.side_files.as_deref().unwrap_or_default(),
            moe_backend: backend_name(m),
            multimodal: m.multimodal(),
            mistral_config: m.config_format.as_deref() == Some("mistral"),
            pp_layer_partition: partition(m),
            replicate_embed: m.replicate_embed,
            served_model_name: repo_name(m),
            hf_overrides: m.hf_overrides.as_ref(),
        }
    }
}

// The builder lives here, with the rules of the line; the type is the manifest's record of it.
impl ServeCommand {
    /// The command for folder `out` holding `m`'s files; `auto_dtype` is what vLLM's
    /// `--dtype auto` picks from the folder's config on a GPU with BF16.
    pub fn new(out: &Path, m: &Manifest, auto_dtype: &str) -> ServeCommand {
        ServeCommand::for_layout(out, &ServeLayout::of(m), auto_dtype)
    }

    /// The command for folder `out` holding files of layout `m` (see [`ServeCommand::new`]).
    /// The folder is named by its absolute path: the line is pasted in other directories, and a
    /// relative path vLLM does not find there it takes for a hub repo id.
    pub(crate) fn for_layout(out: &Path, m: &ServeLayout, auto_dtype: &str) -> ServeCommand {
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
        if let Some(b) = m.moe_backend {
            flag("--moe-backend", Some(b.into()));
        }
        if let Some(d) = m.dtype.and_then(|d| needs_dtype(d, auto_dtype)) {
            flag("--dtype", Some(d.into()));
        }
        let side = m.side_files;
        let has = |f: &dyn Fn(&str) -> bool| side.iter().any(|s| f(s));
        // vLLM picks params.json (and Mistral's tokenizer) by itself only next to
        // consolidated*.safetensors, which a pre-sharded folder never has
        // (transformers_utils/config.py:889, tokenizers/registry.py:146); beside a config.json
        // it would read that instead.
        if has(&|s| s == "params.json") && (m.mistral_config || !has(&|s| s == "config.json")) {
            flag("--config-format", Some("mistral".into()));
            if has(&|s| s == "tekken.json" || s.starts_with("tokenizer.model.v")) {
                flag("--tokenizer-mode", Some("mistral".into()));
            }
        }
        // vLLM loads the tokenizer from the model folder and refuses to start without one.
        if !has(&|s| is_tokenizer_file(s)) {
            flag("--skip-tokenizer-init", None);
        }
        if let Some(name) = m.served_model_name {
            flag("--served-model-name", Some(name.into()));
        }
        // The folder's config.json is the source's: the config the files were planned from is
        // that one with these overrides, as vLLM applies them.
        if let Some(o) = m.hf_overrides {
            flag(
                "--hf-overrides",
                Some(serde_json::Value::from(o.clone()).to_string()),
            );
        }
        // vLLM's key set depends on these (`--language-model-only`, `--mm-encoder-tp-mode data`).
        argv.extend(m.multimodal.flags());
        let mut env: BTreeMap<String, String> = (m.pp_layer_partition.iter())
            .map(|p| (PP_PARTITION_VAR.to_string(), p.to_string()))
            .collect();
        if m.replicate_embed {
            env.insert(REPLICATE_EMBED_VAR.to_string(), "1".into());
        }
        let words = argv.iter().map(|a| shell_quote(a));
        let assignments = env.iter().map(|(k, v)| format!("{k}={}", shell_quote(v)));
        let shell = assignments.chain(words).collect::<Vec<_>>().join(" ");
        ServeCommand { env, argv, shell }
    }
}

/// The files vLLM's tokenizer loading finds a tokenizer by: Hugging Face's (fast, SentencePiece,
/// BPE, WordPiece) and Mistral's. One list, also behind `shard`'s warning.
pub(crate) fn is_tokenizer_file(name: &str) -> bool {
    const NAMES: [&str; 7] = [
        "tokenizer.json",
        "tokenizer.model",
        "tekken.json",
        "vocab.json",
        "vocab.txt",
        "spiece.model",
        "sentencepiece.bpe.model",
    ];
    NAMES.contains(&name) || name.starts_with("tokenizer.model.v")
}

/// `--dtype` for files of `dtype` (the manifest's spelling) when vLLM's `auto` would load them
/// as another dtype on some GPU: `auto` takes the config's dtype (`auto_dtype` on a GPU with
/// BF16), downcasts float32 to the platform's first choice, and falls back to float16 where BF16
/// is missing (V100, T4), converting the weights with only a warning (config/model.py:2423). Only
/// float16 files with a float16 config load as themselves everywhere.
fn needs_dtype(dtype: &str, auto_dtype: &str) -> Option<&'static str> {
    let d = vllm_dtype(dtype)?;
    (d != "float16" || dtype != auto_dtype).then_some(d)
}

/// The partition the manifest records when it is a list of counts: a folder from elsewhere may
/// record anything, and the value goes into a shell line.
fn partition(m: &Manifest) -> Option<&str> {
    let p = m.pp_layer_partition.as_deref()?;
    (!p.is_empty()
        && p.split(',')
            .all(|c| !c.is_empty() && c.bytes().all(|b| b.is_ascii_digit())))
    .then_some(p)
}

/// The hub repo id the manifest records when it reads like one (`org/name`, Hugging Face's
/// characters): a folder from elsewhere may record anything.
fn repo_name(m: &Manifest) -> Option<&str> {
    let r = m.source_repo.as_deref()?;
    let ok = |c: char| c.is_ascii_alphanumeric() || "-_.".contains(c);
    let mut parts = r.split('/');
    let valid = parts.clone().count() <= 2 && parts.all(|p| !p.is_empty() && p.chars().all(ok));
    valid.then_some(r)
}

/// The manifest's MoE backend when it is a name (vLLM's are lower case and `_`): a folder from
/// elsewhere may record anything.
fn backend_name(m: &Manifest) -> Option<&str> {
    let b = m.moe_backend.as_deref()?;
    (!b.is_empty() && b.chars().all(|c| c.is_ascii_lowercase() || c == '_')).then_some(b)
}

impl ServeCommand {
    /// The command for the same folder in object storage at `url` (`s3://…`), which vLLM reads
    /// through Run:ai's streamer (`pip install vllm[runai]`, with the store's own variables,
    /// AWS_*): `runai_streamer_sharded` for `sharded_state`, and the URL as written for the
    /// local path the command was built with.
    pub(crate) fn in_store(mut self, url: &str) -> ServeCommand {
        let (from, to) = ("sharded_state", "runai_streamer_sharded");
        for a in &mut self.argv {
            if a == from {
                *a = to.to_string();
            }
        }
        self.shell = self.shell.replace(
            &format!("--load-format {from}"),
            &format!("--load-format {to}"),
        );
        if let Some(model) = self.argv.get_mut(2) {
            let local = shell_quote(model);
            *model = url.to_string();
            self.shell = self.shell.replacen(&local, &shell_quote(url), 1);
        }
        self
    }
}

/// The folder as vLLM's positional model argument: absolute (a relative path is read against
/// the directory vLLM runs in, and taken for a hub repo id when nothing is there), its real
/// location when it exists.
fn model_arg(out: &Path) -> String {
    absolute(out).to_string_lossy().into_owned()
}

/// `path` made absolute: its canonical form when it exists, else against the working directory.
pub(crate) fn absolute(path: &Path) -> PathBuf {
    path.canonicalize()
        .or_else(|_| std::path::absolute(path))
        .unwrap_or_else(|_| path.to_path_buf())
}

/// vLLM's `--dtype` spelling of a manifest dtype (`BF16`); `None` for one it has no flag for.
pub(crate) fn vllm_dtype(manifest_dtype: &str) -> Option<&'static str> {
    DtypeChoice::recorded(manifest_dtype).map(DtypeChoice::as_str)
}

/// One word for a POSIX shell: unchanged when it has nothing the shell would interpret, else in
/// single quotes (a quote inside written `'\''`), or, when it holds a control character
/// ([`crate::escape::is_control`]: a newline, U+0085, U+202E, …), in `$'…'` with each of those
/// written as an escape ([`ansi_c_quote`]). Inside single quotes such a character would reach a
/// terminal raw, and the terminal layer ([`crate::escape::EscShell`]) would print its visible
/// escape, which the shell then takes literally: `SERVE=$(wload shard … -q)` would name another
/// folder. Not `shlex::try_quote`: shlex 2 switches to double quotes for some words and refuses
/// others.
pub(crate) fn shell_quote(word: &str) -> String {
    let plain = |c: char| c.is_ascii_alphanumeric() || "_-./=:,+@%".contains(c);
    if !word.is_empty() && word.chars().all(plain) {
        return word.to_string();
    }
    if word.chars().any(crate::escape::is_control) {
        return ansi_c_quote(word);
    }
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// `word` as `$'…'` (bash, zsh, ksh and POSIX.1-2024 sh; Debian 12's dash 0.5.12 lacks it):
/// exact, since every control is written as the escapes of its UTF-8 bytes (`\xe2\x80\xae`,
/// which the shell turns back into those bytes whatever the locale), and visible, since the word
/// then holds no control character at all.
fn ansi_c_quote(word: &str) -> String {
    use std::fmt::Write;
    let mut out = String::with_capacity(word.len() + 8);
    out.push_str("$'");
    for c in word.chars() {
        match c {
            '\\' => out.push_str(r"\\"),
            '\'' => out.push_str(r"\'"),
            '\n' => out.push_str(r"\n"),
            '\t' => out.push_str(r"\t"),
            '\r' => out.push_str(r"\r"),
            c if crate::escape::is_control(c) => {
                for b in c.encode_utf8(&mut [0; 4]).bytes() {
                    write!(out, "\\x{b:02x}").expect("writing to a String does not fail");
                }
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// `vllm serve` for the pre-sharded folder `root`, built from the layout its manifest records
/// (else its file names show), with wload's own builder ([`ServeCommand::for_layout`], the one
/// `shard` prints). Never the command a manifest carries: a folder from elsewhere can hold a
/// wload.json whose `serve` is any command at all (`…; curl … | sh`), and what `inspect` prints
/// is pasted into shells. Recomputed where the folder is now, from what it holds now: a copied
/// folder's line names the copy, a tokenizer added since is used, and the stages' layers come
/// from the rank files themselves.
pub(crate) fn serve_command(
    root: &Path,
    files: &RankFiles,
    w: &WrittenFor,
    manifest: Option<&Manifest>,
    stages: &[super::layers::StageLayers],
) -> ServeCommand {
    let listed = top_level_files(root);
    let partition = super::layers::partition(stages).filter(|p| !super::layers::is_even_split(p));
    let layout = ServeLayout {
        tp: w.tp,
        pp: w.pp,
        expert_parallel: w.expert_parallel == Some(true),
        dtype: manifest.map(|m| m.dtype.as_str()),
        side_files: &listed,
        moe_backend: manifest.and_then(backend_name),
        multimodal: manifest.map(Manifest::multimodal).unwrap_or_default(),
        mistral_config: manifest.is_some_and(|m| m.config_format.as_deref() == Some("mistral")),
        pp_layer_partition: partition.as_deref(),
        replicate_embed: manifest.is_some_and(|m| m.replicate_embed),
        served_model_name: manifest.and_then(repo_name),
        hf_overrides: manifest.and_then(|m| m.hf_overrides.as_ref()),
    };
    // Only a known dtype can need `--dtype`: reading the folder's config and headers is for that.
    let auto = match layout.dtype {
        Some(_) => folder_auto_dtype(root, files),
        None => crate::dtype::Dtype::Bf16,
    };
    ServeCommand::for_layout(root, &layout, auto.as_str())
}

/// The names of the files directly in `root`, sorted.
fn top_level_files(root: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .collect();
    names.sort();
    names
}

/// What vLLM's `--dtype auto` loads the folder as, the way `shard` judged it for its serve line:
/// the folder's config's dtype, else the rank files' common lossless dtype.
fn folder_auto_dtype(root: &Path, files: &RankFiles) -> crate::dtype::Dtype {
    use crate::config::ConfigFormat;
    let config = crate::config::load(root, "config.json", ConfigFormat::Hf, None)
        .or_else(|_| crate::config::load(root, "params.json", ConfigFormat::Mistral, None));
    // File by file: one unreadable header (which the survey reports) leaves the others' dtypes.
    let written = || {
        let names = files
            .values()
            .flat_map(|parts| parts.iter().map(|(_, n)| n));
        let opened = names.filter_map(|n| Checkpoint::open(root, std::slice::from_ref(n)).ok());
        let dtypes: Vec<_> = opened
            .flat_map(|c| c.all_tensors().map(|t| t.dtype).collect::<Vec<_>>())
            .collect();
        dtypes
    };
    match config {
        Ok(c) if c.dtype.is_some() => {
            resolve_dtype(DtypeChoice::Auto, c.dtype.as_deref(), std::iter::empty())
        }
        Ok(c) => resolve_dtype(DtypeChoice::Auto, c.dtype.as_deref(), written()),
        Err(_) => match crate::dtype::common_lossless(written()) {
            Some(crate::dtype::Dtype::F16) => crate::dtype::Dtype::F16,
            _ => crate::dtype::Dtype::Bf16,
        },
    }
}
