//! The hidden folder next to OUT that the output is built in: on OUT's file system, so that
//! publication is one rename, with an owner record so that a killed run's folder is swept later.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::check::Target;
use super::names::{name_max, parent_of, staging_name};
use super::sweep::Owner;
use crate::commands::error::shard::OutProblem;
use crate::commands::shard::ShardError;
use crate::commands::shard::space::DiskProblem;

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

/// The hidden folder next to OUT that the output is built in (same filesystem, so publication is
/// one rename). Removed on drop unless published.
#[derive(Debug)]
pub(crate) struct Staging {
    pub(super) path: PathBuf,
    pub(super) published: bool,
}

impl Staging {
    /// Creates `.{OUT}.wload-tmp-{PID}` ([`staging_name`]) with its owner record.
    pub(crate) fn create(target: &Target) -> Result<Staging, ShardError> {
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

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        if !self.published {
            let _ = fs::remove_dir_all(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::shard::output::names::STAGING_TAG;

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
}
