//! Why `shard` stopped, with the exit status each reason means; nothing is published on any of
//! them. Below the command, with the commands' [`Error`](super::Error) that holds it, so that no
//! circle runs through the command; the wording that needs OUT's rules is `shard/error.rs`.

use std::io;
use std::path::PathBuf;

use crate::exec::ExecError;
use crate::exit::ExitStatus;

/// How many of a refused folder's entries an error names.
const NAMED_ENTRIES: usize = 5;

#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    #[error(
        "-o {0}: holds an earlier wload output; pass --force to replace it (only once the new output is complete)"
    )]
    OutExists(PathBuf),
    #[error(transparent)]
    BadRank(#[from] crate::ranks::RankOutOfRange),
    /// OUT in object storage that could not be listed, read or written.
    #[error(transparent)]
    Store(#[from] crate::resolve::store::StoreError),
    #[error(
        "-o {0}: the output folder is, or contains, the source checkpoint; choose another folder"
    )]
    OutIsSource(PathBuf),
    #[error("-o {}: {problem}", .path.display())]
    Out { path: PathBuf, problem: OutProblem },
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
    /// Stopped (Ctrl-C, SIGTERM) before publication: the partial output was removed.
    #[error(
        "interrupted: nothing was written to {}; the partial output was removed (an earlier output there is as it was)",
        .0.display()
    )]
    Interrupted(PathBuf),
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
    pub fn exit_status(&self) -> ExitStatus {
        match self {
            // Valid flags, a folder the OS refuses: an I/O failure, as when writing a file fails.
            ShardError::Out {
                problem: OutProblem::ParentNotWritable { .. },
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
            ShardError::Interrupted(_) => ExitStatus::Interrupted,
            ShardError::Exec(e) => e.exit_status(),
            ShardError::Store(e) => e.exit_status(),
        }
    }
}

/// Why OUT cannot be used; each says what to do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OutProblem {
    #[error("not usable as an output folder name; name the folder, e.g. -o ./model-tp8")]
    NoName,
    #[error("its parent {} is not an existing folder; create it first", .0.display())]
    NoParent(PathBuf),
    #[error(
        "its parent {} cannot be written to ({why}); wload builds OUT in a hidden folder next to it and renames it into place: choose a folder you can write to",
        .parent.display()
    )]
    ParentNotWritable { parent: PathBuf, why: String },
    #[error("is a symbolic link; wload does not write through links, pass the folder it points to")]
    Link,
    #[error(
        "is not valid UTF-8; wload.json, its owner records and the serve command name OUT as text: choose a UTF-8 path"
    )]
    NotUtf8,
    #[error("exists and is not a folder; choose another output path")]
    NotAFolder,
    #[error(
        "is, or contains, the current folder; run wload from elsewhere or choose another output folder"
    )]
    HoldsCurrentFolder,
    #[error(
        "is not empty and is not a wload output (it holds {0}); wload only writes into a new or empty folder, and --force replaces only an earlier wload output: choose another folder, or move its contents away yourself"
    )]
    NotOurs(Entries),
    #[error(
        "is an earlier wload output, but also holds {0}, which wload did not write; move those away, or choose another folder"
    )]
    Foreign(Entries),
    #[error(
        "is an earlier wload output (wload {version}), but its wload.json lists only the part files, so wload cannot tell {entries} from files of yours and will not delete them; move away what is yours and delete the rest (or the whole folder) yourself, or choose another folder"
    )]
    ForeignLegacy { entries: Entries, version: String },
    #[error(
        "is inside the source checkpoint {}: the side files of a checkpoint include its folders (as vLLM's example script copies them), so this output would be copied into the next one of that checkpoint, nesting with every run; choose a folder outside it",
        .0.display()
    )]
    InsideSource(PathBuf),
    #[error(
        "is a mount point; wload builds the output next to OUT and renames it into place in one step, so that no one ever sees a partial output, and a mount point cannot be renamed: write into a folder inside it instead, e.g. -o OUT/model-tp8"
    )]
    MountPoint,
    #[error(
        "its name is {len} bytes, longer than the {max} bytes a file name may have on this file system; choose a shorter name"
    )]
    NameTooLong { len: usize, max: usize },
    #[error(
        "holds the output of another plan ({record} has {key} {theirs}, this run {ours}); runs split with --ranks into one OUT must shard the same checkpoint with the same flags: choose another OUT, or run again with the flags of the runs already there"
    )]
    OtherPlan {
        record: String,
        key: String,
        theirs: String,
        ours: String,
    },
}

/// A folder's entries for a message: the first few by name, then a count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entries(Vec<String>);

impl Entries {
    pub fn new(names: Vec<String>) -> Entries {
        Entries(names)
    }
}

impl std::fmt::Display for Entries {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let shown: Vec<_> = self.0.iter().take(NAMED_ENTRIES).cloned().collect();
        write!(f, "{}", shown.join(", "))?;
        match self.0.len().saturating_sub(NAMED_ENTRIES) {
            0 => Ok(()),
            n => write!(f, " and {n} more"),
        }
    }
}
