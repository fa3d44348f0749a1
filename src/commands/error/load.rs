//! Why `load` stopped, with the exit status each reason means. Below the command, with the
//! commands' [`Error`](super::Error) that holds it, so that no circle runs through the command.

use crate::exec::ExecError;
use crate::exec::device::DeviceError;
use crate::ranks;

#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error(transparent)]
    Device(#[from] DeviceError),
    #[error(transparent)]
    Exec(#[from] ExecError),
    #[error(transparent)]
    Ranks(#[from] ranks::RankError),
    #[error("--check: {rank_tensor} differs after the round trip through {device}")]
    CheckFailed { rank_tensor: String, device: String },
}

impl LoadError {
    pub fn exit_status(&self) -> crate::exit::ExitStatus {
        use crate::exit::ExitStatus;
        match self {
            LoadError::Ranks(_) => ExitStatus::Usage,
            LoadError::Exec(e) => e.exit_status(),
            LoadError::Device(_) | LoadError::CheckFailed { .. } => ExitStatus::Runtime,
        }
    }
}
