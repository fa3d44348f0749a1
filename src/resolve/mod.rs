//! Resolve: from SOURCE to the list of weight files vLLM would read, in its order, and the config.
//! SOURCE is parsed once ([`source::Source`]): a local folder is listed here; a remote source
//! ([`remote::Remote`], the hub first) is fetched into a local folder and then selected from the
//! same way.

pub(crate) mod hub;
mod index;
pub(crate) mod local;
pub(crate) mod remote;
pub(crate) mod select;
pub(crate) mod source;
pub(crate) mod store;

use std::collections::{BTreeSet, HashSet};
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::config::ConfigFormat;
pub use select::LoadFormat;

mod error;
pub use error::ResolveError;
pub(crate) use error::{RemoteError, RemoteFailure};
use select::{NOT_FOR_INFERENCE, WeightKind, glob_match, natural_cmp, weight_kind};

/// What the caller wants from SOURCE.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Want {
    /// A checkpoint, selected as vLLM does.
    Checkpoint,
    /// A pre-sharded folder (`model-rank-*-part-*.safetensors`, or `model-pp-*-tp-*-part-*`)
    /// when SOURCE is one, else a checkpoint (`load`).
    Detect,
}

/// A weight file resolution kept, and why.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct KeptFile {
    pub file: String,
    pub reason: String,
    /// For a remote source: whether the file was already in the local cache or was downloaded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub origin: Option<remote::Origin>,
}

/// A weight-like file resolution left out, and why.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct DroppedFile {
    pub file: String,
    pub reason: String,
}

/// The outcome of resolution: where the checkpoint is and which files of it vLLM reads.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Resolved {
    pub root: PathBuf,
    pub requested_format: LoadFormat,
    /// The format in effect (`auto` resolved).
    pub format: LoadFormat,
    /// The allow pattern whose matches were used.
    pub pattern: String,
    /// The index file that filtered the matches, when there was one.
    pub index: Option<String>,
    /// Kept weight files, in vLLM's load order.
    pub files: Vec<KeptFile>,
    pub dropped: Vec<DroppedFile>,
    pub config_format: ConfigFormat,
    /// The config file, relative to the root.
    pub config_file: String,
    /// For a remote source: the source, revision and commit, and the cache snapshot that `root`
    /// is.
    #[serde(rename = "hub", skip_serializing_if = "Option::is_none")]
    pub remote: Option<remote::RemoteSource>,
    /// For a remote source: the weight files of which only the header is here (fetched, or kept
    /// by an earlier run), by name. The checkpoint is built from them, and their data cannot be
    /// read. Shared: a large repo's headers are megabytes, and reports clone the resolution.
    #[serde(skip)]
    pub headers:
        std::sync::Arc<std::collections::BTreeMap<String, crate::checkpoint::RemoteHeader>>,
}

impl Resolved {
    pub(crate) fn file_names(&self) -> Vec<String> {
        self.files.iter().map(|f| f.file.clone()).collect()
    }
}

/// Resolves a local checkpoint folder the way vLLM 0.33's DefaultModelLoader does.
pub fn resolve_local(
    root: &Path,
    requested: LoadFormat,
    config_format: ConfigFormat,
) -> Result<Resolved, ResolveError> {
    if !root.exists() {
        return Err(ResolveError::NotFound {
            path: root.to_path_buf(),
        });
    }
    if !root.is_dir() {
        return Err(ResolveError::NotADirectory {
            path: root.to_path_buf(),
        });
    }
    refuse_pre_sharded(root)?;
    let listing = local::list(root).map_err(|(path, source)| ResolveError::Io { path, source })?;
    resolve_listing(root, &listing, requested, config_format)
}

/// A folder of rank files (`wload shard`'s or vLLM's output) is no checkpoint: vLLM's hf format
/// would read its rank files as one checkpoint's shards and fail on their names or shapes.
fn refuse_pre_sharded(root: &Path) -> Result<(), ResolveError> {
    let files = crate::sharded::names::in_folder(root);
    if files.is_empty() {
        return Ok(());
    }
    let manifest = crate::sharded::manifest::Manifest::read(root);
    let written_for = crate::sharded::names::WrittenFor::of(&files, manifest.as_ref());
    Err(ResolveError::PreSharded {
        root: root.to_path_buf(),
        pattern: pre_sharded_pattern(root),
        serve: crate::sharded::serve::serve_command(
            root,
            &files,
            &written_for,
            manifest.as_ref(),
            &crate::sharded::layers::of_folder(root, &files),
        )
        .shell,
        written_for: Box::new(written_for),
    })
}

/// [`resolve_local`] over a given listing of `root`: the folder's own, or a remote source's file
/// list for its cache snapshot (where the index and config have been fetched before this is called).
pub(crate) fn resolve_listing(
    root: &Path,
    listing: &local::Listing,
    requested: LoadFormat,
    config_format: ConfigFormat,
) -> Result<Resolved, ResolveError> {
    resolve_with_config(root, listing, requested, Some(config_format))
}

/// The weight files vLLM would select in a local folder that has no config (`config_file` empty):
/// what `inspect` lists when [`resolve_local`] refuses with [`ResolveError::NoConfig`].
pub(crate) fn resolve_local_weights(
    root: &Path,
    requested: LoadFormat,
) -> Result<Resolved, ResolveError> {
    let listing = local::list(root).map_err(|(path, source)| ResolveError::Io { path, source })?;
    resolve_with_config(root, &listing, requested, None)
}

/// [`resolve_listing`]; without a config format, the config is not looked for.
fn resolve_with_config(
    root: &Path,
    listing: &local::Listing,
    requested: LoadFormat,
    config_format: Option<ConfigFormat>,
) -> Result<Resolved, ResolveError> {
    let (format, has_consolidated) = effective_format(listing, requested);
    let mut sel = select(root, listing, format)?;
    sel.files.sort_by(|a, b| natural_cmp(a, b));
    explain_the_rest(listing, format, &mut sel);
    let (config_format, config_file) = match config_format {
        Some(f) => pick_config(root, listing, f, has_consolidated)?,
        None => (ConfigFormat::Hf, String::new()),
    };
    refuse_unreadable(root, listing, &sel)?;
    let reason = sel.reason;
    Ok(Resolved {
        root: root.to_path_buf(),
        requested_format: requested,
        format,
        pattern: sel.pattern.to_string(),
        index: sel.index,
        files: sel
            .files
            .into_iter()
            .map(|file| KeptFile {
                file,
                reason: reason.clone(),
                origin: None,
            })
            .collect(),
        dropped: sel.dropped,
        config_format,
        config_file,
        remote: None,
        headers: Default::default(),
    })
}

/// The load format in effect (`auto` resolved) and whether the listing has Mistral's
/// `consolidated*.safetensors` anywhere.
fn effective_format(listing: &local::Listing, requested: LoadFormat) -> (LoadFormat, bool) {
    let has_consolidated = globbed(listing).any(|p| {
        let base = p.rsplit('/').next().unwrap_or(p);
        glob_match("consolidated*.safetensors", base)
    });
    let format = match requested {
        LoadFormat::Auto if has_consolidated => LoadFormat::Mistral,
        LoadFormat::Auto => LoadFormat::Hf,
        f => f,
    };
    (format, has_consolidated)
}

/// The one file [`resolve_listing`] reads from disk, when the listing has it: the index of the
/// format in effect (which decides the weight files). A remote source fetches it first.
pub(crate) fn index_to_read(
    listing: &local::Listing,
    requested: LoadFormat,
) -> Option<&'static str> {
    let (format, _) = effective_format(listing, requested);
    let index = format.index_file();
    let (pattern, _) = first_matching(listing, format)?;
    (pattern.ends_with(".safetensors") && listing.has_top(index)).then_some(index)
}

/// Every name vLLM's `rglob`/`glob` see: names that cannot be read are listed all the same.
fn globbed(listing: &local::Listing) -> impl Iterator<Item = &str> {
    listing
        .all()
        .chain(listing.unreadable.iter().map(|u| u.name.as_str()))
}

/// The files one allow pattern selected, and what became of the others.
struct Selection {
    /// The pattern whose matches were used.
    pattern: &'static str,
    files: Vec<String>,
    /// Why the files are read.
    reason: String,
    index: Option<String>,
    dropped: Vec<DroppedFile>,
}

/// vLLM's choice under `format`: the matches of the first allow pattern that has any, filtered
/// by the index for safetensors.
fn select(
    root: &Path,
    listing: &local::Listing,
    format: LoadFormat,
) -> Result<Selection, ResolveError> {
    let (pattern, files) = first_matching(listing, format).unwrap_or(("", Vec::new()));
    let mut sel = Selection {
        pattern,
        files,
        reason: format!("matches {pattern}"),
        index: None,
        dropped: Vec::new(),
    };
    if pattern.ends_with(".safetensors") {
        if listing.has_top(format.index_file()) {
            filter_by_index(root, format.index_file(), &mut sel)?;
        }
    } else if !pattern.is_empty() {
        refuse_unsupported(root, pattern, &sel.files)?;
        sel.files.clear();
    }
    if sel.files.is_empty() {
        return Err(no_weights(root, listing, format, &sel));
    }
    Ok(sel)
}

/// The first of the format's allow patterns that matches top-level names, and its matches.
fn first_matching(
    listing: &local::Listing,
    format: LoadFormat,
) -> Option<(&'static str, Vec<String>)> {
    format.allow_patterns().iter().find_map(|pat| {
        let m: Vec<String> = listing
            .top
            .iter()
            .map(String::as_str)
            .chain(listing.unreadable.iter().map(|u| u.name.as_str()))
            .filter(|n| glob_match(pat, n))
            .map(str::to_string)
            .collect();
        (!m.is_empty()).then_some((*pat, m))
    })
}

/// Keeps only the files the index names, as vLLM does; refuses an index naming absent files.
fn filter_by_index(root: &Path, index_name: &str, sel: &mut Selection) -> Result<(), ResolveError> {
    let index_path = root.join(index_name);
    let listed = index::files_named(&index_path)?;
    let present: BTreeSet<&str> = sel.files.iter().map(String::as_str).collect();
    let missing: Vec<String> = listed
        .iter()
        .filter(|f| !present.contains(f.as_str()))
        .cloned()
        .collect();
    if !missing.is_empty() {
        return Err(ResolveError::IndexMissingFiles {
            index: index_path,
            missing,
        });
    }
    let dropped = &mut sel.dropped;
    sel.files.retain(|f| {
        let keep = listed.contains(f);
        if !keep {
            dropped.push(DroppedFile {
                file: f.clone(),
                reason: format!("not listed in {index_name}"),
            });
        }
        keep
    });
    sel.reason = format!("matches {}, listed in {index_name}", sel.pattern);
    sel.index = Some(index_name.to_string());
    Ok(())
}

/// `.bin` and `.pt` weights, which vLLM reads and wload cannot: refused, unless every match is
/// training state that vLLM skips too.
fn refuse_unsupported(
    root: &Path,
    pattern: &'static str,
    matched: &[String],
) -> Result<(), ResolveError> {
    let files: Vec<String> = matched
        .iter()
        .filter(|f| !NOT_FOR_INFERENCE.contains(&f.as_str()))
        .cloned()
        .collect();
    if files.is_empty() {
        return Ok(());
    }
    Err(ResolveError::UnsupportedWeights {
        root: root.to_path_buf(),
        kind: pattern.trim_start_matches('*'),
        files,
    })
}

/// vLLM's "cannot find any model weights", with a hint at what is there instead.
fn no_weights(
    root: &Path,
    listing: &local::Listing,
    format: LoadFormat,
    sel: &Selection,
) -> ResolveError {
    let hint = if !sel.dropped.is_empty() {
        format!(
            "; {} names none of the {} files matching {}, and vLLM reads only the files it names: fix its weight_map or remove it",
            format.index_file(),
            sel.dropped.len(),
            sel.pattern
        )
    } else {
        let other_weights: Vec<&str> = listing
            .all()
            .filter(|p| is_weight_like(p))
            .take(3)
            .collect();
        if other_weights.is_empty() {
            String::new()
        } else {
            format!(
                "; weight-like files that this format does not read: {}",
                other_weights.join(", ")
            )
        }
    };
    ResolveError::NoWeights {
        root: root.to_path_buf(),
        format: format.as_str(),
        patterns: format.allow_patterns().to_vec(),
        hint,
    }
}

/// Gives everything else that looks like weights a line saying why it is not read.
fn explain_the_rest(listing: &local::Listing, format: LoadFormat, sel: &mut Selection) {
    let kept: HashSet<&str> = sel.files.iter().map(String::as_str).collect();
    let already: HashSet<String> = sel.dropped.iter().map(|d| d.file.clone()).collect();
    for p in globbed(listing) {
        if !is_weight_like(p) || kept.contains(p) || already.contains(p) {
            continue;
        }
        let reason = if p.contains('/') {
            "in a subfolder; vLLM reads only the top level".to_string()
        } else if NOT_FOR_INFERENCE.contains(&p) {
            "training state, not weights".to_string()
        } else if format.allow_patterns().iter().any(|pat| glob_match(pat, p)) {
            format!("{} matched first", sel.pattern)
        } else {
            format!("not read under load format {}", format.as_str())
        };
        sel.dropped.push(DroppedFile {
            file: p.to_string(),
            reason,
        });
    }
}

/// Selected names that cannot be read as files: vLLM's glob selects them and then fails.
fn refuse_unreadable(
    root: &Path,
    listing: &local::Listing,
    sel: &Selection,
) -> Result<(), ResolveError> {
    let bad: Vec<local::Unreadable> = sel
        .files
        .iter()
        .filter_map(|f| listing.unreadable(f).cloned())
        .collect();
    if bad.is_empty() {
        return Ok(());
    }
    Err(ResolveError::UnreadableWeights {
        root: root.to_path_buf(),
        why: format!("vLLM's glob selects it (it matches {})", sel.pattern),
        files: bad,
    })
}

/// Weights that deserve a line saying why they are not read.
fn is_weight_like(p: &str) -> bool {
    matches!(weight_kind(p), Some(WeightKind::Vllm | WeightKind::Pth))
}

/// A pre-sharded folder (vLLM's sharded_state layout): its weight files are read per rank by the
/// loader, so resolution only finds the config.
pub(crate) fn resolve_pre_sharded(
    root: &Path,
    config_format: ConfigFormat,
) -> Result<Resolved, ResolveError> {
    if !root.is_dir() {
        return Err(ResolveError::NotFound {
            path: root.to_path_buf(),
        });
    }
    let listing = local::list(root).map_err(|(path, source)| ResolveError::Io { path, source })?;
    let (config_format, config_file) = pick_config(root, &listing, config_format, false)?;
    Ok(Resolved {
        root: root.to_path_buf(),
        requested_format: LoadFormat::Auto,
        format: LoadFormat::Safetensors,
        pattern: pre_sharded_pattern(root).into(),
        index: None,
        files: Vec::new(),
        dropped: Vec::new(),
        config_format,
        config_file,
        remote: None,
        headers: Default::default(),
    })
}

/// The pattern of a pre-sharded folder's files: the pipeline-parallel one only when every rank
/// file there has it.
fn pre_sharded_pattern(root: &Path) -> &'static str {
    crate::sharded::names::pattern(&crate::sharded::names::in_folder(root))
}

/// vLLM's config-format detection (transformers_utils/config.py:889–907): Mistral's params.json
/// only when the repo also has `consolidated*.safetensors`, otherwise config.json.
pub(crate) fn pick_config(
    root: &Path,
    listing: &local::Listing,
    requested: ConfigFormat,
    has_consolidated: bool,
) -> Result<(ConfigFormat, String), ResolveError> {
    let has_params = listing.has_top("params.json");
    let has_config = listing.has_top("config.json");
    let format = match requested {
        ConfigFormat::Auto if has_consolidated && has_params => ConfigFormat::Mistral,
        ConfigFormat::Auto => ConfigFormat::Hf,
        f => f,
    };
    let (name, present) = match format {
        ConfigFormat::Mistral => ("params.json", has_params),
        _ => ("config.json", has_config),
    };
    if !present && let Some(u) = listing.unreadable(name) {
        return Err(ResolveError::UnreadableWeights {
            root: root.to_path_buf(),
            why: "vLLM reads it as the model config".into(),
            files: vec![u.clone()],
        });
    }
    if !present {
        return Err(ResolveError::NoConfig {
            root: root.to_path_buf(),
            mistral: format == ConfigFormat::Mistral || has_consolidated,
            has_params: format != ConfigFormat::Mistral && has_params,
        });
    }
    Ok((format, name.to_string()))
}
