//! Why `shard` stopped, with the exit status each reason means; nothing is published on any of
//! them.

use std::io;
use std::path::{Path, PathBuf};

use super::{output, space};
use crate::exec::ExecError;
use crate::exit::ExitStatus;

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error(
        "-o {0}: holds an earlier wload output; pass --force to replace it (only once the new output is complete)"
    )]
    OutExists(PathBuf),
    #[error(transparent)]
    BadRank(#[from] crate::ranks::RankOutOfRange),
    #[error(
        "-o {0}: the output folder is, or contains, the source checkpoint; choose another folder"
    )]
    OutIsSource(PathBuf),
    #[error("-o {}: {problem}", .path.display())]
    Out {
        path: PathBuf,
        problem: output::OutProblem,
    },
    #[error(
        "-o {0}: appeared or changed while this run was writing (another wload run, or another program, got there first); it was left as it is and this run's output was discarded: check it, then run again (with --force to replace an earlier wload output)"
    )]
    Raced(PathBuf),
    #[error(
        "{}: cannot copy this side file: {source}; vLLM's example script would fail on it too: move it out of the checkpoint folder",
        .path.display()
    )]
    SideFile {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(transparent)]
    Exec(#[from] ExecError),
    /// OUT's file system has too little room for this run: refused before anything is written.
    #[error(
        "-o {}: needs {} on the file system holding {} ({} of files and {} of margin for the file system's own use), and only {} is free there{}; nothing was written: free some space or choose an output folder on another disk",
        .out.display(),
        crate::units::HumanBytes(.need.saturating_add(*.margin)),
        .fs.display(),
        crate::units::HumanBytes(*.need),
        crate::units::HumanBytes(*.margin),
        crate::units::HumanBytes(*.free),
        if *.replacing { " (the earlier output in OUT is removed only once the new one is complete, so its space does not count)" } else { "" }
    )]
    NoSpace {
        out: PathBuf,
        fs: PathBuf,
        need: u64,
        margin: u64,
        free: u64,
        replacing: bool,
    },
    #[error(
        "-o {}: this run creates {files} files, and the file system holding {} has room for only {free} more (out of inodes); nothing was written: free some inodes (delete small files) or choose an output folder on another disk",
        .out.display(),
        .fs.display()
    )]
    NoInodes {
        out: PathBuf,
        fs: PathBuf,
        files: u64,
        free: u64,
    },
    /// A write on OUT's file system failed for a reason of that file system (full, quota,
    /// read-only, file size limit), whichever file it was writing.
    #[error(
        "{}: {source}: {why} (nothing was published: this run's partial files were removed)",
        .file.display()
    )]
    OutDisk {
        file: PathBuf,
        #[source]
        source: io::Error,
        why: String,
    },
    /// An I/O failure on a file of the staging folder, named as the file of OUT it was to become.
    #[error(
        "{op} {}: {source} (nothing was published: this run's partial files were removed)",
        .path.display()
    )]
    Staged {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

impl ShardError {
    /// Names a staging file (`.OUT.wload-tmp-PID/x`) as the OUT file it stood for (`OUT/x`): the
    /// staging folder is an implementation detail, and it is gone by the time the user reads this.
    /// A failure of OUT's file system itself (full, quota, read-only) says so, with what this run
    /// needs there (`space`), whichever file it happened in.
    pub(super) fn named_in_out(
        self,
        tmp: &Path,
        out: &Path,
        space: Option<&space::Space>,
    ) -> ShardError {
        let (ShardError::Io { path, .. } | ShardError::Exec(ExecError::Io { path, .. })) = &self
        else {
            return self;
        };
        let Ok(rel) = path.strip_prefix(tmp) else {
            return self;
        };
        let path = if rel.as_os_str().is_empty() {
            out.to_path_buf()
        } else {
            out.join(rel)
        };
        match self {
            ShardError::Io { op, source, .. }
            | ShardError::Exec(ExecError::Io { op, source, .. }) => {
                match space::DiskProblem::of(&source) {
                    Some(p) => ShardError::OutDisk {
                        file: path,
                        why: p.explain(space, &output::parent_of(out)),
                        source,
                    },
                    None => ShardError::Staged { op, path, source },
                }
            }
            other => other,
        }
    }

    pub(super) fn io(op: &'static str, path: &Path, source: io::Error) -> ShardError {
        ShardError::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn exit_status(&self) -> ExitStatus {
        match self {
            // Valid flags, a folder the OS refuses: an I/O failure, as when writing a file fails.
            ShardError::Out {
                problem: output::OutProblem::ParentNotWritable { .. },
                ..
            } => ExitStatus::Runtime,
            ShardError::OutExists(_)
            | ShardError::BadRank(_)
            | ShardError::OutIsSource(_)
            | ShardError::Out { .. } => ExitStatus::Usage,
            ShardError::SideFile { source, .. } if source.kind() == io::ErrorKind::InvalidInput => {
                ExitStatus::Checkpoint
            }
            ShardError::Raced(_)
            | ShardError::NoSpace { .. }
            | ShardError::NoInodes { .. }
            | ShardError::OutDisk { .. }
            | ShardError::SideFile { .. }
            | ShardError::Io { .. }
            | ShardError::Staged { .. } => ExitStatus::Runtime,
            ShardError::Exec(e) => e.exit_status(),
        }
    }
}
