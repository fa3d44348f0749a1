//! The output folder of `wload shard`: what may be written to or replaced, the hidden staging
//! folder the files are built in, and the one atomic step that publishes it.
//!
//! The rules, so that nothing a user owns is ever lost:
//! - OUT may be missing or an existing empty folder; `--force` also lets it replace an earlier wload
//!   output (a folder holding a readable `wload.json` and nothing that manifest does not list
//!   exactly: see [`super::owned`]). Anything else is refused, whatever the flags, and publication
//!   removes from the replaced folder only what the manifest lists.
//! - OUT is never a link, never the source, a folder holding it or a folder inside it, never the
//!   current folder or one of its ancestors, never a mount point, and its name fits the file
//!   system.
//! - Publication never replaces something that appeared, or changed, while this run was writing:
//!   on Linux `renameat2(RENAME_NOREPLACE)` for a new OUT and `RENAME_EXCHANGE` (then a check of
//!   what came out) for a replaced one; elsewhere plain `rename`, which refuses a non-empty folder.
//! - Each staging folder records its owner (host, boot, PID, process start time): a later run into
//!   the same parent removes the ones whose owner is gone, and says so.

use std::fs;
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::ShardError;
use super::mounts::is_mount_point;
use super::owned::Owned;
use super::space::DiskProblem;
use super::sweep::Owner;
pub use super::sweep::{Swept, sweep};
use crate::commands::error::shard::{Entries, OutProblem};
use crate::sharded::manifest::Manifest;

/// Marks staging folders: `.{OUT name}.wload-tmp-{PID}`.
pub const STAGING_TAG: &str = ".wload-tmp-";
/// What the fallback publication appends to the staging name for the folder it moves aside.
const ASIDE_SUFFIX: &str = ".old";
/// The owner record inside a staging folder; removed just before publication.
pub const OWNER_FILE: &str = ".wload-owner.json";

/// A folder's identity, to notice that OUT was replaced while this run was writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct FileId {
    dev: u64,
    ino: u64,
}

impl FileId {
    fn of(path: &Path) -> io::Result<FileId> {
        let m = fs::symlink_metadata(path)?;
        Ok(FileId {
            dev: m.dev(),
            ino: m.ino(),
        })
    }
}

/// What OUT was when it was checked.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Existing {
    Missing,
    Empty(FileId),
    /// An earlier wload output, to be replaced (`--force`), with what its manifest listed then:
    /// what publication may remove, whatever the folder's `wload.json` says by that time.
    Output(FileId, Owned),
}

/// An OUT that passed [`check`]: where to publish and what may be replaced there.
#[derive(Debug, Clone)]
pub struct Target {
    path: PathBuf,
    existing: Existing,
}

impl Target {
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether publication replaces an earlier output (whose space is freed only afterwards).
    pub fn replaces_output(&self) -> bool {
        matches!(self.existing, Existing::Output(..))
    }
}

/// Checks OUT against the rules above; `source` is the checkpoint folder.
pub fn check(out: &Path, force: bool, source: &Path) -> Result<Target, ShardError> {
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

/// The longest file name the file system of `dir` takes (NAME_MAX, 255 almost everywhere).
fn name_max(dir: &Path) -> usize {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return 255;
    };
    // SAFETY: a valid NUL-terminated path; pathconf only reads it.
    let n = unsafe { libc::pathconf(c.as_ptr(), libc::_PC_NAME_MAX) };
    usize::try_from(n).ok().filter(|&n| n > 0).unwrap_or(255)
}

/// The staging folder's name for OUT named `name`: `.{name}.wload-tmp-{pid}`, or, where that
/// (with the fallback's `.old`) would pass the file system's name limit `max`, the name cut
/// short and followed by a hash of the whole of it, so that two long names sharing a prefix
/// still get folders of their own. Both keep the tag that [`sweep`] looks for.
fn staging_name(name: &str, pid: u32, max: usize) -> String {
    let full = format!(".{name}{STAGING_TAG}{pid}");
    if full.len() + ASIDE_SUFFIX.len() <= max {
        return full;
    }
    let hash = format!("~{:016x}", xxhash_rust::xxh3::xxh3_64(name.as_bytes()));
    let fixed = 1 + hash.len() + STAGING_TAG.len() + pid.to_string().len() + ASIDE_SUFFIX.len();
    let mut keep = max.saturating_sub(fixed).min(name.len());
    while !name.is_char_boundary(keep) {
        keep -= 1;
    }
    format!(".{}{hash}{STAGING_TAG}{pid}", &name[..keep])
}

fn entry_names(dir: &Path) -> Result<Vec<String>, ShardError> {
    let mut names = Vec::new();
    for e in fs::read_dir(dir).map_err(|e| ShardError::io("listing", dir, e))? {
        let e = e.map_err(|e| ShardError::io("listing", dir, e))?;
        names.push(e.file_name().to_string_lossy().into_owned());
    }
    names.sort();
    Ok(names)
}

/// A staging folder that could not be created, worded with OUT and its parent: the hidden name
/// is wload's, not the user's.
fn staging_error(out: &Path, e: io::Error) -> ShardError {
    let parent = parent_of(out);
    let denied = matches!(
        e.kind(),
        io::ErrorKind::PermissionDenied | io::ErrorKind::ReadOnlyFilesystem
    );
    if denied {
        return ShardError::Out {
            path: out.to_path_buf(),
            problem: OutProblem::ParentNotWritable {
                parent,
                why: e.to_string(),
            },
        };
    }
    if let Some(p) = DiskProblem::of(&e) {
        return ShardError::OutDisk {
            file: out.to_path_buf(),
            why: p.explain(None, &parent),
            source: e,
        };
    }
    ShardError::io("creating the output's staging folder in", &parent, e)
}

pub fn parent_of(out: &Path) -> PathBuf {
    match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The hidden folder next to OUT that the output is built in (same filesystem, so publication is
/// one rename). Removed on drop unless published.
#[derive(Debug)]
pub struct Staging {
    path: PathBuf,
    published: bool,
}

impl Staging {
    /// Creates `.{OUT}.wload-tmp-{PID}` ([`staging_name`]) with its owner record.
    pub fn create(target: &Target) -> Result<Staging, ShardError> {
        let name = (target.path.file_name())
            .map(|n| n.to_string_lossy())
            .unwrap_or_default();
        let parent = parent_of(&target.path);
        let staging = staging_name(&name, std::process::id(), name_max(&parent));
        let path = parent.join(staging);
        fs::create_dir(&path).map_err(|e| staging_error(&target.path, e))?;
        let staging = Staging {
            path,
            published: false,
        };
        Owner::me(&target.path)
            .write(&staging.path)
            .map_err(|e| e.named_in_out(&staging.path, &target.path, None))?;
        Ok(staging)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Moves the finished folder to OUT, as [`check`] allowed and only if OUT is still what it
    /// was then.
    pub fn publish(mut self, target: &Target) -> Result<(), ShardError> {
        let owner = self.path.join(OWNER_FILE);
        fs::remove_file(&owner).map_err(|e| ShardError::io("removing", &owner, e))?;
        match &target.existing {
            Existing::Missing => rename_noreplace(&self.path, &target.path)?,
            Existing::Empty(id) | Existing::Output(id, _) => self.replace(target, *id)?,
        }
        self.published = true;
        Ok(())
    }

    /// Swaps the staging folder with OUT, checks that what came out is what was checked, and
    /// removes it; if it is not, swaps back and reports the race.
    fn replace(&self, target: &Target, id: FileId) -> Result<(), ShardError> {
        let out = &target.path;
        if !exchange(&self.path, out)? {
            return fallback_replace(&self.path, target, id);
        }
        // `self.path` now holds what was at OUT.
        if !still_as_checked(&self.path, &target.existing, id) {
            let _ = exchange(&self.path, out);
            return Err(ShardError::Raced(out.clone()));
        }
        match &target.existing {
            Existing::Output(_, owned) => remove_replaced(&self.path, out, owned),
            _ => {
                if fs::remove_dir(&self.path).is_err() {
                    // Written into since `still_as_checked` looked.
                    let _ = exchange(&self.path, out);
                    return Err(ShardError::Raced(out.clone()));
                }
            }
        }
        Ok(())
    }
}

/// Removes the earlier output that publication replaced, now at `dir`: only what its manifest
/// listed when it was checked. Best effort: the new output is already in place, and failing the
/// run now would misreport it.
fn remove_replaced(dir: &Path, out: &Path, owned: &Owned) {
    // While the listed files go, the folder carries our owner record, so that a run killed
    // meanwhile leaves a leftover the next run sweeps.
    let recorded = Owner::me(out).write(dir).is_ok();
    let _ = owned.remove_listed(dir);
    if recorded {
        let _ = fs::remove_file(dir.join(OWNER_FILE));
    }
    // What is left was put there after the check (or could not be removed, as a file another
    // process holds open on a network file system): it is not provably ours, so it stays, without
    // an owner record, which the sweeper needs before it removes anything.
    let _ = fs::remove_dir(dir);
}

/// Whether a folder that was OUT is still what [`check`] found: the same folder, still empty or
/// still holding only what its manifest accounts for.
fn still_as_checked(dir: &Path, existing: &Existing, id: FileId) -> bool {
    if FileId::of(dir).ok() != Some(id) {
        return false;
    }
    match existing {
        Existing::Missing => false,
        Existing::Empty(_) => entry_names(dir).is_ok_and(|e| e.is_empty()),
        Existing::Output(_, owned) => owned.foreign(dir).is_ok_and(|f| f.is_empty()),
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

/// Where `renameat2` is missing (not Linux, or a filesystem without it): move OUT aside, check it,
/// rename, then remove what was moved aside.
fn fallback_replace(staging: &Path, target: &Target, id: FileId) -> Result<(), ShardError> {
    let out = &target.path;
    let mut aside = staging.as_os_str().to_owned();
    aside.push(ASIDE_SUFFIX);
    let aside = PathBuf::from(aside);
    fs::rename(out, &aside).map_err(|e| rename_error(out, e))?;
    if !still_as_checked(&aside, &target.existing, id) {
        let _ = fs::rename(&aside, out);
        return Err(ShardError::Raced(out.clone()));
    }
    if let Err(e) = rename_noreplace(staging, out) {
        let _ = fs::rename(&aside, out);
        return Err(e);
    }
    match &target.existing {
        Existing::Output(_, owned) => remove_replaced(&aside, out, owned),
        _ => {
            let _ = fs::remove_dir(&aside);
        }
    }
    Ok(())
}

/// A rename into OUT that failed: a mount point (which [`check`] missed, or one mounted since)
/// is said as such; the rest names OUT.
fn rename_error(out: &Path, e: io::Error) -> ShardError {
    if e.raw_os_error() == Some(libc::EBUSY) {
        return ShardError::Out {
            path: out.to_path_buf(),
            problem: OutProblem::MountPoint,
        };
    }
    ShardError::io("renaming into", out, e)
}

/// Renames `from` to `to` unless `to` exists; a `to` that appeared is a lost race.
fn rename_noreplace(from: &Path, to: &Path) -> Result<(), ShardError> {
    match sys::rename_noreplace(from, to) {
        Ok(()) => Ok(()),
        Err(e) if matches!(e.raw_os_error(), Some(libc::EEXIST | libc::ENOTEMPTY)) => {
            Err(ShardError::Raced(to.to_path_buf()))
        }
        Err(e) => Err(rename_error(to, e)),
    }
}

/// Atomically swaps two paths; `Ok(false)` where the system cannot.
fn exchange(a: &Path, b: &Path) -> Result<bool, ShardError> {
    match sys::exchange(a, b) {
        Ok(()) => Ok(true),
        Err(e) if sys::unsupported(&e) => Ok(false),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Err(ShardError::Raced(b.to_path_buf())),
        Err(e) => Err(rename_error(b, e)),
    }
}

#[cfg(target_os = "linux")]
mod sys {
    use std::ffi::CString;
    use std::io;
    use std::os::unix::ffi::OsStrExt;
    use std::path::Path;

    fn c(p: &Path) -> io::Result<CString> {
        CString::new(p.as_os_str().as_bytes()).map_err(|_| io::ErrorKind::InvalidInput.into())
    }

    fn renameat2(from: &Path, to: &Path, flags: libc::c_uint) -> io::Result<()> {
        let (f, t) = (c(from)?, c(to)?);
        // SAFETY: both are valid NUL-terminated paths, relative to the current folder.
        let r = unsafe {
            libc::renameat2(
                libc::AT_FDCWD,
                f.as_ptr(),
                libc::AT_FDCWD,
                t.as_ptr(),
                flags,
            )
        };
        if r == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    pub(super) fn unsupported(e: &io::Error) -> bool {
        matches!(e.raw_os_error(), Some(libc::EINVAL | libc::ENOSYS))
    }

    pub(super) fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
        match renameat2(from, to, libc::RENAME_NOREPLACE) {
            Err(e) if unsupported(&e) => std::fs::rename(from, to),
            r => r,
        }
    }

    pub(super) fn exchange(a: &Path, b: &Path) -> io::Result<()> {
        renameat2(a, b, libc::RENAME_EXCHANGE)
    }
}

#[cfg(not(target_os = "linux"))]
mod sys {
    use std::io;
    use std::path::Path;

    pub fn unsupported(_: &io::Error) -> bool {
        true
    }

    /// `rename` refuses a non-empty folder, so only an empty folder that appeared meanwhile
    /// could be replaced.
    pub fn rename_noreplace(from: &Path, to: &Path) -> io::Result<()> {
        std::fs::rename(from, to)
    }

    pub fn exchange(_: &Path, _: &Path) -> io::Result<()> {
        Err(io::ErrorKind::Unsupported.into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_errors_name_out_and_its_parent_not_the_hidden_folder() {
        let out = Path::new("models/llama-tp8");
        for kind in [
            io::ErrorKind::PermissionDenied,
            io::ErrorKind::ReadOnlyFilesystem,
        ] {
            let msg = staging_error(out, io::Error::from(kind)).to_string();
            assert!(
                msg.starts_with("-o models/llama-tp8: its parent models cannot be written to"),
                "{msg}"
            );
            assert!(!msg.contains(STAGING_TAG), "{msg}");
            let e = staging_error(out, io::Error::from(kind));
            assert_eq!(e.exit_status(), crate::exit::ExitStatus::Runtime);
        }
        // A full disk is the output's file system's, said with OUT and that file system.
        let full = staging_error(out, io::Error::from_raw_os_error(libc::ENOSPC));
        let msg = full.to_string();
        assert!(
            msg.starts_with("models/llama-tp8: No space left on device")
                && msg.contains("the output's file system (the one holding models) is full"),
            "{msg}"
        );
        assert!(!msg.contains(STAGING_TAG), "{msg}");
        assert_eq!(full.exit_status(), crate::exit::ExitStatus::Runtime);
        let other = staging_error(out, io::Error::from(io::ErrorKind::InvalidData));
        assert!(
            other
                .to_string()
                .starts_with("creating the output's staging folder in models:")
        );
    }

    #[test]
    fn a_live_process_is_not_gone_and_a_reused_pid_is() {
        let me = Owner::me(Path::new("out"));
        assert!(!me.is_gone());
        let reused = Owner {
            start_ticks: me.start_ticks.map(|t| t + 1),
            ..me.clone()
        };
        assert!(reused.is_gone());
        let other_host = Owner {
            host: format!("{}-elsewhere", me.host),
            pid: u32::MAX,
            ..me.clone()
        };
        assert!(
            !other_host.is_gone(),
            "another host's folder is never ours to judge"
        );
        let rebooted = Owner {
            boot_id: Some("another-boot".into()),
            ..me
        };
        assert!(rebooted.is_gone());
    }

    /// A staging name fits the file system's limit (with the fallback's suffix), keeps the tag
    /// the sweeper looks for, and two long names with one prefix get distinct folders.
    #[test]
    fn long_out_names_get_short_distinct_staging_names() {
        assert_eq!(staging_name("out", 42, 255), ".out.wload-tmp-42");
        let a = "é".repeat(120) + "a";
        let b = "é".repeat(120) + "b";
        let (sa, sb) = (
            staging_name(&a, u32::MAX, 255),
            staging_name(&b, u32::MAX, 255),
        );
        for n in [&sa, &sb] {
            assert!(n.len() + ASIDE_SUFFIX.len() <= 255, "{} bytes", n.len());
            assert!(n.starts_with('.') && n.contains(STAGING_TAG), "{n}");
        }
        assert_ne!(sa, sb);
        assert_eq!(sa, staging_name(&a, u32::MAX, 255), "deterministic");
    }

    #[test]
    fn entries_name_the_first_few_and_count_the_rest() {
        let names = (0..8).map(|i| format!("f{i}")).collect();
        assert_eq!(
            Entries::new(names).to_string(),
            "f0, f1, f2, f3, f4 and 3 more"
        );
    }
}
