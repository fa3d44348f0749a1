//! How `shard`'s failures are worded for the user where OUT's rules decide it: the type, with its
//! exit statuses, is the commands' (`commands/error/shard.rs`).

use std::io;
use std::path::Path;

use super::{output, space};
pub(crate) use crate::commands::error::shard::ShardError;
use crate::exec::ExecError;

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
        if let ShardError::Exec(ExecError::Cancelled) = self {
            return ShardError::Interrupted(out.to_path_buf());
        }
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
}
