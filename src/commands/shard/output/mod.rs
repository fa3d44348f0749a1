//! The output folder of `wload shard`: what may be written to or replaced, the hidden staging
//! folder the files are built in, and the one atomic step that publishes it.
//!
//! The rules, so that nothing a user owns is ever lost:
//! - OUT may be missing or an existing empty folder; `--force` also lets it replace an earlier wload
//!   output (a folder holding a readable `wload.json` and nothing that manifest does not list
//!   exactly: see [`owned`]). Anything else is refused, whatever the flags, and publication
//!   removes from the replaced folder only what the manifest lists.
//! - OUT is never a link, never the source, a folder holding it or a folder inside it, never the
//!   current folder or one of its ancestors, never a mount point, and its name fits the file
//!   system.
//! - Publication never replaces something that appeared, or changed, while this run was writing:
//!   on Linux `renameat2(RENAME_NOREPLACE)` for a new OUT and `RENAME_EXCHANGE` (then a check of
//!   what came out) for a replaced one; elsewhere plain `rename`, which refuses a non-empty folder.
//! - Each staging folder records its owner (host, boot, PID, process start time): a later run into
//!   the same parent removes the ones whose owner is gone, and says so.
//!
//! A destination is one [`Publish`]: checked before any work ([`check`]), built in a local
//! staging folder ([`stage`]), published in one step ([`publish`]). [`Folder`], a local OUT
//! published by an atomic rename, is the only one; a remote destination (object storage) would
//! stage locally the same way and publish by uploading the finished folder.
//! `names` holds the names of what wload keeps next to OUT; `sweep` removes the staging folders
//! of killed runs; `owned` says what an earlier output provably holds; `mounts` finds mount
//! points.

mod bucket;
mod check;
mod mounts;
mod names;
mod owned;
mod publish;
mod stage;
mod sweep;

use std::path::Path;

pub(super) use bucket::Bucket;
pub(crate) use check::Target;
pub(crate) use names::{OWNER_FILE, STAGING_TAG, parent_of};
pub(crate) use stage::Staging;
pub(crate) use sweep::{Swept, sweep};

use super::ShardError;
use super::space::{self, Space};

/// Where a finished output goes. Every destination is built in a local staging folder and
/// published in one step at the end: a run that fails or is cancelled before then leaves
/// nothing at the destination.
pub(super) trait Publish {
    /// What [`Publish::check`] found at the destination, which publication must still find.
    type Checked;
    /// Checks the destination before any work is done: what may be written to or replaced.
    /// `source` is the checkpoint folder.
    fn check(&self, force: bool, source: &Path) -> Result<Self::Checked, ShardError>;
    /// Removes the staging folders of killed runs, and says which.
    fn sweep(&self) -> Vec<Swept>;
    /// Checks that `bytes` in `files` new files fit where the output is staged, then makes the
    /// staging folder.
    fn stage(
        &self,
        checked: &Self::Checked,
        need: (u64, u64),
    ) -> Result<(Staging, Space), ShardError>;
    /// Moves the finished staging folder to the destination, as [`Publish::check`] allowed;
    /// `true` when this `--ranks` run completed the output of several runs, whose merged
    /// manifest it then wrote as `wload.json`.
    fn publish(&self, staging: Staging, checked: &Self::Checked) -> Result<bool, ShardError>;
}

/// A local OUT folder, published by an atomic rename next to it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Folder<'a> {
    pub(super) out: &'a Path,
}

impl Publish for Folder<'_> {
    type Checked = Target;

    fn check(&self, force: bool, source: &Path) -> Result<Target, ShardError> {
        check::check(self.out, force, source)
    }

    fn sweep(&self) -> Vec<Swept> {
        sweep(self.out)
    }

    fn stage(
        &self,
        target: &Target,
        (bytes, files): (u64, u64),
    ) -> Result<(Staging, Space), ShardError> {
        let fs = parent_of(self.out);
        let space = space::check(self.out, &fs, bytes, files, target.replaces_output())?;
        Ok((Staging::create(target)?, space))
    }

    fn publish(&self, staging: Staging, target: &Target) -> Result<bool, ShardError> {
        // A folder OUT is new or empty (or replaced): no other run's records are ever in it.
        staging.publish(target).map(|()| false)
    }
}
