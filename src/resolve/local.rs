//! Listing a local checkpoint folder (or a remote source's cache snapshot): what resolution selects from.

use std::fs;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::FileTypeExt;
use std::path::{Path, PathBuf};

/// What a folder holds, as far as resolution cares.
#[derive(Debug, Default)]
pub(crate) struct Listing {
    /// Regular files (or links to them) at the top level, by name.
    pub top: Vec<String>,
    /// Regular files in subfolders, as paths relative to the root (`original/consolidated.pth`).
    pub nested: Vec<String>,
    /// Top-level names that Python's `glob` lists (vLLM selects weights with it) but that cannot be
    /// read as files: resolution reports them when vLLM would select them, rather than skipping them.
    pub unreadable: Vec<Unreadable>,
}

/// A top-level entry that is not a readable regular file with a UTF-8 name.
#[derive(Debug, Clone)]
pub struct Unreadable {
    /// The name, lossily decoded when it is not UTF-8.
    pub name: String,
    pub problem: Problem,
}

#[derive(Debug, Clone)]
pub enum Problem {
    /// A symbolic link to nothing (a Hugging Face cache whose blob is gone).
    Dangling { target: PathBuf },
    /// A symbolic link that cannot be followed (a loop, a folder without permission).
    BrokenLink { target: PathBuf, error: String },
    /// A folder, FIFO, socket or device, directly or through a link.
    NotRegular { kind: &'static str },
    /// A name that is not UTF-8; `bytes` is the name with its bad bytes escaped (`\xff`).
    NotUtf8 { bytes: String },
}

impl Listing {
    pub(crate) fn has_top(&self, name: &str) -> bool {
        self.top.iter().any(|n| n == name)
    }

    /// Every file, top level first, as relative paths.
    pub(crate) fn all(&self) -> impl Iterator<Item = &str> {
        self.top
            .iter()
            .chain(self.nested.iter())
            .map(String::as_str)
    }

    /// The unreadable entry called `name`, if there is one.
    pub(crate) fn unreadable(&self, name: &str) -> Option<&Unreadable> {
        self.unreadable.iter().find(|u| u.name == name)
    }
}

/// Lists `root` recursively (vLLM's `rglob("*")` decides the load format from the whole tree).
/// Links to folders are not followed, as `rglob` does not.
pub(crate) fn list(root: &Path) -> Result<Listing, (PathBuf, io::Error)> {
    let mut out = Listing::default();
    walk(root, root, &mut out)?;
    out.top.sort();
    out.nested.sort();
    out.unreadable.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut Listing) -> Result<(), (PathBuf, io::Error)> {
    let rd = fs::read_dir(dir).map_err(|e| (dir.to_path_buf(), e))?;
    for entry in rd {
        let entry = entry.map_err(|e| (dir.to_path_buf(), e))?;
        let path = entry.path();
        let ft = entry.file_type().map_err(|e| (path.clone(), e))?;
        let rel = path
            .strip_prefix(root)
            .expect("walked paths lie under the root")
            .to_string_lossy()
            .into_owned();
        let at_top = dir == root;
        if at_top && let Some(problem) = problem_of(&path, &entry.file_name(), ft) {
            out.unreadable.push(Unreadable {
                name: rel.clone(),
                problem,
            });
            if ft.is_dir() {
                walk(root, &path, out)?;
            }
            continue;
        }
        let is_file = ft.is_file() || (ft.is_symlink() && path.is_file());
        if ft.is_dir() {
            walk(root, &path, out)?;
        } else if is_file {
            if at_top {
                out.top.push(rel);
            } else {
                out.nested.push(rel);
            }
        }
    }
    Ok(())
}

/// Why a top-level entry cannot be read as a weight file, if it cannot. Folders count: `glob`
/// lists a folder called `x.safetensors` like any other name.
fn problem_of(path: &Path, name: &std::ffi::OsStr, ft: fs::FileType) -> Option<Problem> {
    if name.to_str().is_none() {
        return Some(Problem::NotUtf8 {
            bytes: name.as_bytes().escape_ascii().to_string(),
        });
    }
    if ft.is_symlink() {
        let target = fs::read_link(path).unwrap_or_default();
        return match fs::metadata(path) {
            Ok(m) if m.is_file() => None,
            Ok(m) => Some(Problem::NotRegular {
                kind: kind_of(m.file_type()),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Some(Problem::Dangling { target }),
            Err(e) => Some(Problem::BrokenLink {
                target,
                error: e.to_string(),
            }),
        };
    }
    (!ft.is_file()).then(|| Problem::NotRegular { kind: kind_of(ft) })
}

fn kind_of(ft: fs::FileType) -> &'static str {
    if ft.is_dir() {
        "a folder"
    } else if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_block_device() || ft.is_char_device() {
        "a device"
    } else {
        "not a regular file"
    }
}
