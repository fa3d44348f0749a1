//! What SOURCE is, decided once: a local folder, or a remote source (an object-store URL,
//! `s3://…`, or a Hugging Face hub repo id). A SOURCE that is neither, because it reads as a mistyped path, is refused here with
//! the closest path that exists. A new kind of remote source is one more line in
//! [`Source::parse`] and its own folder beside `hub/`.

use std::fs;
use std::path::{Path, PathBuf};

use super::remote::{FetchOptions, Remote};
use super::{ResolveError, Resolved, Want, hub};

/// SOURCE, parsed.
#[derive(Debug)]
pub(crate) enum Source {
    /// A checkpoint folder (or a pre-sharded one) on this machine.
    Local(PathBuf),
    /// A source whose files are fetched into a local cache first.
    Remote(Box<dyn Remote>),
}

/// Why SOURCE (with its flags) names nothing that can be opened.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Resolve(#[from] ResolveError),
    /// A flag that names no usable revision or download folder.
    #[error("{0}")]
    Usage(String),
}

impl Source {
    /// Parses SOURCE: an existing path is a local folder; otherwise each kind of remote source is
    /// asked whether the text is one of its names, after a mistyped path is refused.
    /// `revision` and `download_dir` (vLLM's `--revision`, `--download-dir`) apply to remote
    /// sources.
    pub(crate) fn parse(
        source: &Path,
        revision: Option<&str>,
        download_dir: Option<&Path>,
    ) -> Result<Source, SourceError> {
        if let Some(store) =
            super::store::ObjectSource::parse(source, download_dir).map_err(SourceError::Usage)?
        {
            return Ok(Source::Remote(Box::new(store)));
        }
        refuse_missing_path(source)?;
        if let Some(hub) =
            hub::Hub::parse(source, revision, download_dir).map_err(SourceError::Usage)?
        {
            return Ok(Source::Remote(Box::new(hub)));
        }
        Ok(Source::Local(source.to_path_buf()))
    }

    /// Resolves SOURCE as vLLM would (a remote one through its cache, fetching what is
    /// missing). Returns the resolution and whether SOURCE is pre-sharded (only with
    /// [`Want::Detect`]).
    pub(crate) fn resolve(
        &self,
        opts: &FetchOptions,
        want: Want,
    ) -> Result<(Resolved, bool), ResolveError> {
        match self {
            Source::Remote(remote) => remote.resolve(opts, want),
            Source::Local(root)
                if want == Want::Detect && !crate::sharded::names::in_folder(root).is_empty() =>
            {
                Ok((super::resolve_pre_sharded(root, opts.config_format)?, true))
            }
            Source::Local(root) => Ok((
                super::resolve_local(root, opts.load_format, opts.config_format)?,
                false,
            )),
        }
    }
}

/// Most edits (insertions, deletions, substitutions, swaps, case ignored) between a missing
/// name and an existing one that is offered instead: 1, and 1 more per 4 characters.
fn close_enough(name: &str) -> usize {
    1 + name.chars().count() / 4
}

/// Refuses a SOURCE that is no existing path when it is a path, not a hub repo id: one that reads
/// as a path (starts with `./`, `../`, `/` or `~`, has more than one `/`, ends in `/`, or is not
/// `org/name`-shaped), or an `org/name` for which a local path of a close name exists
/// (`examples/tiny-lama` beside `examples/tiny-llama`). Anything else, including an `org/name`
/// with nothing close on disk, is left for the hub. The refusal offers the closest existing path.
pub(crate) fn refuse_missing_path(source: &Path) -> Result<(), ResolveError> {
    if source.symlink_metadata().is_ok() {
        return Ok(());
    }
    let text = source.to_string_lossy();
    let path_shaped = ["./", "../", "/", "~"].iter().any(|p| text.starts_with(p))
        || text.matches('/').count() > 1
        || text.ends_with('/');
    let hub_shaped = !path_shaped && hub::repo_id(source).is_some();
    let suggestion = closest_existing(source);
    if hub_shaped && suggestion.is_none() {
        return Ok(());
    }
    Err(ResolveError::NoSuchFolder {
        path: source.to_path_buf(),
        suggestion,
        hub_shaped,
    })
}

/// The existing path nearest to `source`: each component that does not exist replaced by the
/// closest name in the folder above it (see [`close_enough`]); `None` when one has no close name.
fn closest_existing(source: &Path) -> Option<PathBuf> {
    use std::path::Component;
    let mut at = PathBuf::new();
    for c in source.components() {
        let Component::Normal(name) = c else {
            at.push(c);
            continue;
        };
        let next = at.join(name);
        if next.symlink_metadata().is_ok() {
            at = next;
            continue;
        }
        let dir = if at.as_os_str().is_empty() {
            Path::new(".")
        } else {
            at.as_path()
        };
        let name = name.to_string_lossy().to_lowercase();
        let best = fs::read_dir(dir)
            .ok()?
            .flatten()
            .filter_map(|e| e.file_name().into_string().ok())
            .map(|n| (strsim::damerau_levenshtein(&name, &n.to_lowercase()), n))
            .filter(|(d, _)| *d <= close_enough(&name))
            .min()?;
        at.push(best.1);
    }
    (at.as_os_str() != source.as_os_str()).then_some(at)
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_close_sibling_is_found_and_a_far_one_is_not() {
        let tmp = tempfile::TempDir::new().unwrap();
        let root = tmp.path();
        std::fs::create_dir_all(root.join("examples/tiny-llama")).unwrap();
        let close = super::closest_existing(&root.join("exmples/tiny-lama"));
        assert_eq!(close, Some(root.join("examples/tiny-llama")));
        assert_eq!(super::closest_existing(&root.join("examples/qwen")), None);
    }
}
