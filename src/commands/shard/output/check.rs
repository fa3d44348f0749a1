//! What OUT is before any work is done, and whether this run may write or replace it (the
//! rules in [`super`]): the [`Target`] that publication later holds OUT to.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::mounts::is_mount_point;
use super::names::{name_max, parent_of};
use super::owned::Owned;
use crate::commands::error::shard::{Entries, OutProblem};
use crate::commands::shard::ShardError;
use crate::sharded::manifest::Manifest;

/// A folder's identity, to notice that OUT was replaced while this run was writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    pub(super) fn of(path: &Path) -> io::Result<FileId> {
        let m = fs::symlink_metadata(path)?;
        Ok(FileId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// What OUT was when it was checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Existing {
    Missing,
    Empty(FileId),
    /// An earlier wload output, to be replaced (`--force`), with what its manifest listed then:
    /// what publication may remove, whatever the folder's `wload.json` says by that time.
    Output(FileId, Owned),
}

/// An OUT that passed [`check`]: where to publish and what may be replaced there.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(super) path: PathBuf,
    pub(super) existing: Existing,
}

impl Target {
    /// Whether publication replaces an earlier output (whose space is freed only afterwards).
    pub(crate) fn replaces_output(&self) -> bool {
        matches!(self.existing, Existing::Output(..))
    }
}

/// Checks OUT against the rules ([`super`]); `source` is the checkpoint folder.
pub(super) fn check(out: &Path, force: bool, source: &Path) -> Result<Target, ShardError> {
    let bad = |why: OutProblem| ShardError::Out {
        path: out.to_path_buf(),
        problem: why,
    };
    let Some(name) = out.file_name() else {
        return Err(bad(OutProblem::NoName));
    };
    if out.to_str().is_none() {
        return Err(bad(OutProblem::NotUtf8));
    }
    let parent = parent_of(out);
    if !parent.is_dir() {
        return Err(bad(OutProblem::NoParent(parent)));
    }
    let max = name_max(&parent);
    if name.len() > max {
        return Err(bad(OutProblem::NameTooLong {
            len: name.len(),
            max,
        }));
    }
    // `out/` and `out/.` name the same folder, but rename(2) treats a trailing `/.` differently:
    // every later step uses the plain PARENT/NAME form.
    let out = &parent.join(name);
    if let (Ok(p), Ok(src)) = (parent.canonicalize(), source.canonicalize())
        && p.join(name).starts_with(&src)
    {
        return Err(bad(OutProblem::InsideSource(source.to_path_buf())));
    }
    let meta = match fs::symlink_metadata(out) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Target {
                path: out.to_path_buf(),
                existing: Existing::Missing,
            });
        }
        Err(e) => return Err(ShardError::io("checking", out, e)),
        Ok(m) => m,
    };
    if meta.file_type().is_symlink() {
        return Err(bad(OutProblem::Link));
    }
    if !meta.is_dir() {
        return Err(bad(OutProblem::NotAFolder));
    }
    let canon = out
        .canonicalize()
        .map_err(|e| ShardError::io("checking", out, e))?;
    if source.canonicalize().is_ok_and(|s| s.starts_with(&canon)) {
        return Err(ShardError::OutIsSource(out.to_path_buf()));
    }
    if std::env::current_dir().is_ok_and(|cwd| cwd.starts_with(&canon)) {
        return Err(bad(OutProblem::HoldsCurrentFolder));
    }
    if is_mount_point(out, &parent, &meta) {
        return Err(bad(OutProblem::MountPoint));
    }
    let id = FileId {
        dev: meta.dev(),
        ino: meta.ino(),
    };
    let entries = entry_names(out)?;
    if entries.is_empty() {
        return Ok(Target {
            path: out.to_path_buf(),
            existing: Existing::Empty(id),
        });
    }
    classify_full(out, force, id, entries)
}

/// OUT exists and is not empty: only an earlier wload output may be replaced, and only with
/// `--force`.
fn classify_full(
    out: &Path,
    force: bool,
    id: FileId,
    entries: Vec<String>,
) -> Result<Target, ShardError> {
    let bad = |problem| ShardError::Out {
        path: out.to_path_buf(),
        problem,
    };
    let Some(manifest) = Manifest::read(out) else {
        return Err(bad(OutProblem::NotOurs(Entries::new(entries))));
    };
    let owned = Owned::of(&manifest);
    let foreign = owned
        .foreign(out)
        .map_err(|e| ShardError::io("listing", out, e))?;
    if !foreign.is_empty() {
        let foreign = Entries::new(foreign);
        return Err(bad(if owned.legacy {
            OutProblem::ForeignLegacy {
                entries: foreign,
                version: manifest.wload_version,
            }
        } else {
            OutProblem::Foreign(foreign)
        }));
    }
    if !force {
        return Err(ShardError::OutExists(out.to_path_buf()));
    }
    Ok(Target {
        path: out.to_path_buf(),
        existing: Existing::Output(id, owned),
    })
}

pub(super) fn entry_names(dir: &Path) -> Result<Vec<String>, ShardError> {
    let mut names = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| ShardError::io("listing", dir, e))? {
        let e = e.map_err(|e| ShardError::io("listing", dir, e))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_name_the_first_few_and_count_the_rest() {
        let names = (0..8).map(|i| format!("f{i}")).collect();
        assert_eq!(
            Entries::new(names).to_string(),
            "f0, f1, f2, f3, f4 and 3 more"
        );
    }
}
