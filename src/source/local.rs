//! Listing a local checkpoint folder.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

/// What a folder holds, as far as resolution cares.
#[derive(Debug, Default)]
pub struct Listing {
    /// Regular files (or links to them) at the top level, by name.
    pub top: Vec<String>,
    /// Regular files in subfolders, as paths relative to the root (`original/consolidated.pth`).
    pub nested: Vec<String>,
}

impl Listing {
    pub fn has_top(&self, name: &str) -> bool {
        self.top.iter().any(|n| n == name)
    }

    /// Every file, top level first, as relative paths.
    pub fn all(&self) -> impl Iterator<Item = &str> {
        self.top
            .iter()
            .chain(self.nested.iter())
            .map(String::as_str)
    }
}

/// Lists `root` recursively (vLLM's `rglob("*")` decides the load format from the whole tree).
/// Links to folders are not followed, as `rglob` does not.
pub fn list(root: &Path) -> Result<Listing, (PathBuf, io::Error)> {
    let mut out = Listing::default();
    walk(root, root, &mut out)?;
    out.top.sort();
    out.nested.sort();
    Ok(out)
}

fn walk(root: &Path, dir: &Path, out: &mut Listing) -> Result<(), (PathBuf, io::Error)> {
    let rd = fs::read_dir(dir).map_err(|e| (dir.to_path_buf(), e))?;
    for entry in rd {
        let entry = entry.map_err(|e| (dir.to_path_buf(), e))?;
        let path = entry.path();
        let ft = entry.file_type().map_err(|e| (path.clone(), e))?;
        let is_file = ft.is_file() || (ft.is_symlink() && path.is_file());
        let rel = path
            .strip_prefix(root)
            .expect("walked paths lie under the root")
            .to_string_lossy()
            .into_owned();
        if ft.is_dir() {
            walk(root, &path, out)?;
        } else if is_file {
            if dir == root {
                out.top.push(rel);
            } else {
                out.nested.push(rel);
            }
        }
    }
    Ok(())
}
