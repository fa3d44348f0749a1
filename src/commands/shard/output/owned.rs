//! What an earlier output provably holds: the entries its manifest lists, and nothing else.
//! `--force` replaces a folder only when every entry in it is one of these, and publication
//! removes only these from the folder it replaced.
//!
//! Only what the manifest names exactly counts. Part files, `wload.json` and the side files are
//! regular files directly in OUT; a folder copied as a side file counts only when the manifest
//! also lists everything in it (`side_tree`, since wload 0.1.0's later manifests), entry by entry.
//! Names that no directory entry can have (`..`, absolute or nested paths among the top-level
//! names, empty names) never match, and links, pipes and devices are never ours, whatever their
//! name. A manifest from before `side_files` lists only its part files: anything else in such a
//! folder is not provably wload's.

use std::collections::BTreeSet;
use std::ffi::{CString, OsStr};
use std::fs::{self, File};
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use crate::sharded::manifest::{MANIFEST, Manifest};

/// The entries of an earlier output that wload wrote, by its manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Owned {
    /// Regular files directly in OUT: part files, the manifest, side files.
    files: BTreeSet<String>,
    /// Folders copied as side files and every entry in them, relative to OUT; folders end in `/`.
    tree: BTreeSet<String>,
    /// The manifest predates `side_files`, so lists only its part files.
    pub legacy: bool,
}

impl Owned {
    pub(super) fn of(m: &Manifest) -> Owned {
        let mut files: BTreeSet<String> = m.files.iter().map(|f| f.name.clone()).collect();
        // Every run record merged into the view (`wload.json`, `wload-ranks-*.json`).
        files.extend(m.records.iter().cloned());
        files.insert(MANIFEST.to_string());
        files.extend(m.side_files.iter().flatten().cloned());
        // A name no directory entry can have would never match one; dropping them here also
        // keeps them away from `remove_listed`, which must never reach past the folder.
        files.retain(|n| plain(n));
        let mut tree: BTreeSet<String> = (m.side_tree.iter().flatten())
            .filter(|p| p.trim_end_matches('/').split('/').all(plain))
            .cloned()
            .collect();
        // An entry counts only inside folders that are listed too, up to OUT itself.
        let listed = tree.clone();
        tree.retain(|p| {
            let mut ancestors = p.trim_end_matches('/').match_indices('/');
            ancestors.all(|(i, _)| listed.contains(&p[..=i]))
        });
        Owned {
            files,
            tree,
            legacy: m.side_files.is_none(),
        }
    }

    /// The entries below `dir` that this listing does not account for, as paths relative to it,
    /// sorted. Walks only listed folders, without following links.
    pub(super) fn foreign(&self, dir: &Path) -> io::Result<Vec<String>> {
        let mut foreign = Vec::new();
        // (folder, its path relative to `dir` with a trailing '/', or "" for `dir` itself)
        let mut stack = vec![(dir.to_path_buf(), String::new())];
        while let Some((folder, prefix)) = stack.pop() {
            for e in fs::read_dir(&folder)? {
                let e = e?;
                let name = e.file_name();
                let Some(name) = name.to_str() else {
                    foreign.push(format!("{prefix}{}", name.to_string_lossy()));
                    continue;
                };
                let rel = format!("{prefix}{name}");
                let t = e.file_type()?;
                if t.is_file() && self.lists_file(&rel, prefix.is_empty()) {
                    continue;
                }
                let as_folder = format!("{rel}/");
                if t.is_dir() && self.tree.contains(&as_folder) {
                    stack.push((e.path(), as_folder));
                    continue;
                }
                foreign.push(rel);
            }
        }
        foreign.sort();
        Ok(foreign)
    }

    fn lists_file(&self, rel: &str, top: bool) -> bool {
        if top {
            self.files.contains(rel)
        } else {
            self.tree.contains(rel)
        }
    }

    /// Removes from `dir` the regular files and folders this listing names, never following a
    /// link. Whatever else is there (something written into the folder after it was checked)
    /// stays, and so do the folders holding it.
    pub(super) fn remove_listed(&self, dir: &Path) -> io::Result<()> {
        let root = open_dir(None, dir.as_os_str())?;
        for name in &self.files {
            unlink_file(&root, name);
        }
        // Deepest first, so that each folder is empty by the time it is removed.
        let mut tree: Vec<&String> = self.tree.iter().collect();
        tree.sort_by_key(|p| std::cmp::Reverse(p.trim_end_matches('/').matches('/').count()));
        for rel in tree {
            let (parent, name) = split(rel.trim_end_matches('/'));
            let Ok(parent) = open_path(&root, parent) else {
                continue;
            };
            if rel.ends_with('/') {
                // Fails, as it should, on a folder that still holds something.
                let _ = unlinkat(&parent, name, libc::AT_REMOVEDIR);
            } else {
                unlink_file(&parent, name);
            }
        }
        Ok(())
    }
}

/// One path component that stays where it is: not empty, `.` or `..`, and without a `/`.
fn plain(name: &str) -> bool {
    !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\0'])
}

/// `a/b/c` as (`a/b`, `c`); a top-level name has the parent "".
fn split(rel: &str) -> (&str, &str) {
    rel.rsplit_once('/').unwrap_or(("", rel))
}

/// The folder at `rel` below `root`, each step opened without following links.
fn open_path(root: &File, rel: &str) -> io::Result<File> {
    let mut at = open_dir(Some(root), OsStr::new("."))?;
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        at = open_dir(Some(&at), OsStr::new(part))?;
    }
    Ok(at)
}

fn open_dir(at: Option<&File>, name: &OsStr) -> io::Result<File> {
    let c = CString::new(name.as_bytes()).map_err(|_| io::ErrorKind::InvalidInput)?;
    let dirfd = at.map_or(libc::AT_FDCWD, |f| f.as_raw_fd());
    let flags = libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    // SAFETY: a valid NUL-terminated name, relative to an open folder or the current folder.
    let fd = unsafe { libc::openat(dirfd, c.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` was just opened and is owned by nothing else.
    Ok(File::from(unsafe { OwnedFd::from_raw_fd(fd) }))
}

/// Removes `name` from `dir` if it is a regular file (not a link, folder or special file).
fn unlink_file(dir: &File, name: &str) {
    let Some(c) = plain(name).then(|| CString::new(name).ok()).flatten() else {
        return;
    };
    // SAFETY: an all-zero stat is a valid value for fstatat to fill in.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: valid folder descriptor, NUL-terminated name and a stat buffer we own.
    let r = unsafe {
        libc::fstatat(
            dir.as_raw_fd(),
            c.as_ptr(),
            &mut st,
            libc::AT_SYMLINK_NOFOLLOW,
        )
    };
    if r == 0 && st.st_mode & libc::S_IFMT == libc::S_IFREG {
        let _ = unlinkat(dir, name, 0);
    }
}

fn unlinkat(dir: &File, name: &str, flags: libc::c_int) -> io::Result<()> {
    // A name with a '/' or that is `.`/`..` would reach past `dir`: such names are never ours.
    if !plain(name) {
        return Err(io::ErrorKind::InvalidInput.into());
    }
    let c = CString::new(name).map_err(|_| io::ErrorKind::InvalidInput)?;
    // SAFETY: valid folder descriptor and NUL-terminated single-component name.
    if unsafe { libc::unlinkat(dir.as_raw_fd(), c.as_ptr(), flags) } == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn owned(files: &[&str], side: Option<&[&str]>, tree: &[&str]) -> Owned {
        let s = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        let mut m: Manifest = serde_json::from_value(serde_json::json!({
            "wload_version": "0", "format": "", "source": "", "architecture": "", "family": "",
            "tp": 1, "ranks": [0], "expert_parallel": false, "dtype": "BF16", "max_part_size": 1,
            "tie_word_embeddings": false, "files": [],
        }))
        .unwrap();
        m.files = s(files)
            .into_iter()
            .map(|name| crate::sharded::manifest::ManifestFile {
                name,
                rank: 0,
                pp_rank: None,
                tp_rank: None,
                part: 0,
                size: 0,
                xxh3_64k: None,
                xxh3: None,
            })
            .collect();
        m.side_files = side.map(s);
        m.side_tree = (!tree.is_empty()).then(|| s(tree));
        Owned::of(&m)
    }

    /// Hostile names in a manifest never reach outside the folder, and what is not listed (or
    /// is listed but of another kind) is foreign and stays when the folder is removed.
    #[test]
    fn only_exactly_listed_regular_files_and_listed_folders_are_ours() {
        let work = tempfile::TempDir::new().unwrap();
        let outside = work.path().join("outside");
        fs::create_dir(&outside).unwrap();
        fs::write(outside.join("keep"), b"k").unwrap();
        let dir = work.path().join("out");
        fs::create_dir_all(dir.join("sub/deeper")).unwrap();
        fs::create_dir(dir.join("listed-dir")).unwrap();
        for f in [
            "p0",
            "wload.json",
            "tok.json",
            "sub/a",
            "sub/deeper/b",
            "mine",
        ] {
            fs::write(dir.join(f), b"x").unwrap();
        }
        symlink(&outside, dir.join("link")).unwrap();
        let hostile = [
            "..",
            "../outside/keep",
            "/etc/passwd",
            "",
            ".",
            "sub/a",
            "link",
            "listed-dir",
            "mine/",
        ];
        let mut side = vec!["tok.json"];
        side.extend(hostile);
        let o = owned(
            &["p0", "p0"],
            Some(&side),
            &[
                "sub/",
                "sub/a",
                "sub/deeper/",
                "sub/deeper/b",
                "../outside/",
                "link/",
            ],
        );
        assert_eq!(o.foreign(&dir).unwrap(), ["link", "listed-dir", "mine"]);
        o.remove_listed(&dir).unwrap();
        let mut left: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(
            left,
            ["link", "listed-dir", "mine"],
            "listed folders are removed"
        );
        assert_eq!(fs::read(outside.join("keep")).unwrap(), b"k");
    }

    /// A manifest from before `side_files` accounts for its part files and itself only.
    #[test]
    fn a_legacy_manifest_lists_only_its_part_files() {
        let work = tempfile::TempDir::new().unwrap();
        for f in ["p0", "wload.json", "config.json"] {
            fs::write(work.path().join(f), b"x").unwrap();
        }
        let o = owned(&["p0"], None, &[]);
        assert!(o.legacy);
        assert_eq!(o.foreign(work.path()).unwrap(), ["config.json"]);
    }

    /// A listed folder holding something unlisted is foreign in part: the unlisted entry is
    /// named, and removal leaves it and its folder.
    #[test]
    fn an_unlisted_file_in_a_listed_folder_is_foreign_and_kept() {
        let work = tempfile::TempDir::new().unwrap();
        let dir = work.path();
        fs::create_dir(dir.join("original")).unwrap();
        fs::write(dir.join("original/params.json"), b"x").unwrap();
        fs::write(dir.join("original/notes.txt"), b"mine").unwrap();
        let o = owned(
            &[],
            Some(&["original"]),
            &["original/", "original/params.json"],
        );
        assert_eq!(o.foreign(dir).unwrap(), ["original/notes.txt"]);
        let sub = dir.join("x");
        fs::create_dir(&sub).unwrap();
        fs::rename(dir.join("original"), sub.join("original")).unwrap();
        o.remove_listed(&sub).unwrap();
        assert!(sub.join("original/notes.txt").exists());
        assert!(!sub.join("original/params.json").exists());
    }
}
