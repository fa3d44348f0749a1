//! The side files: every entry of the checkpoint folder that vLLM's example script copies next to
//! the part files (`save_sharded_state.py`: whatever does not end in .bin, .pt or .safetensors,
//! folders whole with `shutil.copytree`, which follows links), config.json aside (written by
//! [`super::write_config`]).
//!
//! They are listed, with their sizes, before anything is written, so that the free-space check
//! counts them and a pipe, a device or a link loop is refused before the part files are written.
//! Left out, unlike the script: earlier wload outputs and staging folders inside the checkpoint
//! (copying them would nest outputs into outputs with every run) and OUT itself; weights of
//! other formats anywhere (`original/consolidated.00.pth`: gigabytes vLLM never reads here); and
//! the source's weight index (`model.safetensors.index.json`), which names files the output does
//! not have: vLLM's default loader, given the output, would fail on it.

use std::collections::HashSet;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use super::ShardError;
use super::output::{OWNER_FILE, STAGING_TAG};
use super::space::DiskProblem;
use crate::exec::{ExecError, write};
use crate::sharded::manifest::Manifest;

/// One entry to copy, relative to the checkpoint folder.
#[derive(Debug, Clone)]
struct Item {
    rel: PathBuf,
    dir: bool,
}

/// What [`list`] found to copy.
#[derive(Debug, Clone, Default)]
pub(super) struct SideFiles {
    /// In copy order: a folder before what it holds.
    items: Vec<Item>,
    /// Bytes of the files to copy, summed.
    pub bytes: u64,
    /// Entries left out, relative to the checkpoint folder, with why.
    pub skipped: Vec<Skipped>,
}

/// An entry of the source that vLLM's example script would copy and `shard` does not.
#[derive(Debug, Clone, serde::Serialize, schemars::JsonSchema)]
pub struct Skipped {
    pub name: String,
    pub why: &'static str,
}

/// Why an earlier output is not copied.
const WLOAD_FOLDER: &str = "a wload output or staging folder, not a side file";
/// Why a weight file in a folder (Llama's `original/consolidated.00.pth`) is not copied.
const WEIGHTS: &str =
    "weights of another format, which vLLM does not read from a sharded_state folder";
/// Why the source's weight index is not copied.
const WEIGHT_INDEX: &str = "the source's weight index: it lists files the output does not have, and a plain `vllm serve OUT` would fail on it";

impl SideFiles {
    /// Files and folders to create.
    pub(super) fn count(&self) -> u64 {
        self.items.len() as u64
    }

    /// The top-level names, for the manifest's `side_files`.
    pub(super) fn names(&self) -> Vec<String> {
        (self.items.iter())
            .filter(|i| i.rel.components().count() == 1)
            .map(|i| i.rel.to_string_lossy().into_owned())
            .collect()
    }

    /// Everything inside the copied folders, folders ending in `/`, for the manifest's
    /// `side_tree`; `None` without folders.
    pub(super) fn tree(&self) -> Option<Vec<String>> {
        let tree: Vec<String> = (self.items.iter())
            .filter(|i| i.dir || i.rel.components().count() > 1)
            .map(|i| {
                let rel = i.rel.to_string_lossy();
                if i.dir {
                    format!("{rel}/")
                } else {
                    rel.into_owned()
                }
            })
            .collect();
        (!tree.is_empty()).then_some(tree)
    }

    /// Copies every listed entry from `root` into `tmp`.
    pub(super) fn copy(
        &self,
        root: &Path,
        tmp: &Path,
        cancel: &AtomicBool,
    ) -> Result<(), ShardError> {
        for item in &self.items {
            if cancel.load(Ordering::Relaxed) {
                return Err(ShardError::Exec(ExecError::Cancelled));
            }
            let (from, to) = (root.join(&item.rel), tmp.join(&item.rel));
            if item.dir {
                fs::create_dir(&to).map_err(|e| ShardError::io("creating", &to, e))?;
            } else {
                copy_file(&from, &to)?;
            }
        }
        Ok(())
    }
}

/// Lists the side files of the checkpoint at `root`; `out` (OUT) is never among them.
pub(super) fn list(root: &Path, out: &Path) -> Result<SideFiles, ShardError> {
    let out = out.canonicalize().ok();
    let mut side = SideFiles::default();
    // Every folder entered, by identity: `copytree` follows links, so a link to a folder that
    // holds it would be copied forever.
    let mut seen: HashSet<(u64, u64)> = HashSet::new();
    if let Ok(m) = fs::metadata(root) {
        seen.insert((m.dev(), m.ino()));
    }
    let mut stack = vec![PathBuf::new()];
    while let Some(rel_dir) = stack.pop() {
        let dir = root.join(&rel_dir);
        let mut entries: Vec<_> = fs::read_dir(&dir)
            .map_err(|e| ShardError::io("listing", &dir, e))?
            .collect::<Result<_, _>>()
            .map_err(|e| ShardError::io("listing", &dir, e))?;
        entries.sort_by_key(|e| e.file_name());
        let mut folders = Vec::new();
        for e in entries {
            let name = e.file_name();
            let rel = rel_dir.join(&name);
            let path = e.path();
            let text = name.to_string_lossy();
            if rel_dir.as_os_str().is_empty() && !copied_at_top(&text) {
                continue;
            }
            let meta = fs::metadata(&path).map_err(|source| side_error(&path, source))?;
            if let Some(why) = (!meta.is_dir()).then(|| left_out(&text)).flatten() {
                side.skip(&rel, why);
                continue;
            }
            if !meta.is_dir() {
                crate::small_file::check_regular(&path).map_err(|s| side_error(&path, s))?;
                side.bytes = side.bytes.saturating_add(meta.len());
                side.items.push(Item { rel, dir: false });
                continue;
            }
            if is_wload_folder(&path, &text, out.as_deref()) {
                side.skip(&rel, WLOAD_FOLDER);
                continue;
            }
            if !seen.insert((meta.dev(), meta.ino())) {
                let why = "is a folder reached a second time through a link (a link loop, or two links to one folder): copying it would not end, and vLLM's example script fails on it too; remove the link";
                return Err(side_error(
                    &path,
                    io::Error::new(io::ErrorKind::InvalidInput, why),
                ));
            }
            side.items.push(Item {
                rel: rel.clone(),
                dir: true,
            });
            folders.push(rel);
        }
        stack.extend(folders);
    }
    // By path, component by component: each folder comes before what it holds, so copying
    // creates it first.
    side.items.sort_by(|a, b| a.rel.cmp(&b.rel));
    Ok(side)
}

impl SideFiles {
    fn skip(&mut self, rel: &Path, why: &'static str) {
        self.skipped.push(Skipped {
            name: rel.to_string_lossy().into_owned(),
            why,
        });
    }
}

/// Why a file the script would copy is left out: weights of any format, at any depth (the
/// output holds its own), and the source's weight index; `None` to copy it.
fn left_out(name: &str) -> Option<&'static str> {
    let index = name
        .strip_suffix(".index.json")
        .is_some_and(|w| crate::resolve::select::weight_kind(w).is_some());
    if index {
        Some(WEIGHT_INDEX)
    } else {
        crate::resolve::select::weight_kind(name).map(|_| WEIGHTS)
    }
}

/// Whether a top-level entry of the checkpoint is a side file: not vLLM's weights, and not
/// config.json, which is written separately.
fn copied_at_top(name: &str) -> bool {
    let weights = crate::resolve::select::weight_kind(name);
    weights != Some(crate::resolve::select::WeightKind::Vllm) && name != "config.json"
}

/// A folder that is wload's and not the checkpoint's: OUT, a staging folder (by name or owner
/// record), or an earlier output (a readable manifest).
fn is_wload_folder(path: &Path, name: &str, out: Option<&Path>) -> bool {
    (name.starts_with('.') && name.contains(STAGING_TAG))
        || path.join(OWNER_FILE).is_file()
        || Manifest::read(path).is_some()
        || out.is_some_and(|o| path.canonicalize().is_ok_and(|c| c == o))
}

fn side_error(path: &Path, source: io::Error) -> ShardError {
    ShardError::SideFile {
        path: path.to_path_buf(),
        source,
    }
}

/// A regular file only, as Python's shutil.copy (which vLLM's example uses) refuses named pipes:
/// opening one would wait for a writer forever. A failure of the output's file system (full,
/// quota, read-only) is the output's, not the side file's: it is reported on `to`, which the
/// caller names as the file of OUT it was to become.
pub(super) fn copy_file(from: &Path, to: &Path) -> Result<(), ShardError> {
    let copied = crate::small_file::check_regular(from).and_then(|_| {
        if write::copy_file_range_disabled() {
            copy_through_memory(from, to)
        } else {
            fs::copy(from, to).map(|_| ())
        }
    });
    match copied {
        Ok(()) => Ok(()),
        Err(e) if DiskProblem::of(&e).is_some() => Err(ShardError::io("writing", to, e)),
        Err(source) => Err(side_error(from, source)),
    }
}

/// `fs::copy` and `io::copy` both use copy_file_range on Linux; with WLOAD_NO_COPY_FILE_RANGE
/// set (a filesystem whose copy_file_range corrupts data) side files go through a buffer like the
/// tensor data does.
fn copy_through_memory(from: &Path, to: &Path) -> io::Result<()> {
    let src = File::open(from)?;
    let dst = File::create(to)?;
    let mut buf = vec![0u8; 1 << 20];
    let mut at = 0u64;
    loop {
        let n = src.read_at(&mut buf, at)?;
        if n == 0 {
            break;
        }
        dst.write_all_at(&buf[..n], at)?;
        at += n as u64;
    }
    dst.set_permissions(src.metadata()?.permissions())
}
