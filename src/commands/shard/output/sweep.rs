//! Leftovers of killed runs: each staging folder records who made it (host, boot, PID, process
//! start time), and a later run into the same parent removes those whose owner is gone.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::names::{OWNER_FILE, STAGING_TAG, parent_of};
use crate::commands::shard::ShardError;

/// Who made a staging folder: enough to tell, on this host, whether that process still runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
pub(super) struct Owner {
    pub(super) host: String,
    /// The kernel's boot id: a PID from before a reboot is dead whatever runs under it now.
    pub(super) boot_id: Option<String>,
    pub(super) pid: u32,
    /// The process start time (clock ticks since boot), so a reused PID is not taken for it.
    pub(super) start_ticks: Option<u64>,
    /// Unix seconds, for messages.
    pub(super) started_unix: u64,
    pub(super) out: PathBuf,
}

impl Owner {
    pub(super) fn me(out: &Path) -> Owner {
        let pid = std::process::id();
        Owner {
            host: hostname(),
            boot_id: boot_id(),
            pid,
            start_ticks: start_ticks(pid),
            started_unix: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            out: out.to_path_buf(),
        }
    }

    pub(super) fn write(&self, dir: &Path) -> Result<(), ShardError> {
        let path = dir.join(OWNER_FILE);
        let text = serde_json::to_vec_pretty(self).expect("owner record serialises");
        fs::write(&path, text).map_err(|e| ShardError::io("writing", &path, e))
    }

    pub(super) fn read(dir: &Path) -> Option<Owner> {
        serde_json::from_slice(&crate::small_file::read(&dir.join(OWNER_FILE)).ok()?).ok()
    }

    /// Known to be gone: same host, and another boot, no such process, or another process
    /// under the same PID. Anything uncertain counts as alive.
    pub(super) fn is_gone(&self) -> bool {
        if self.host != hostname() {
            return false;
        }
        if let (Some(then), Some(now)) = (&self.boot_id, boot_id())
            && *then != now
        {
            return true;
        }
        if !process_exists(self.pid) {
            return true;
        }
        matches!((self.start_ticks, start_ticks(self.pid)), (Some(a), Some(b)) if a != b)
    }
}

/// A leftover staging folder this run removed.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Swept {
    pub path: PathBuf,
    pub pid: u32,
    pub started_unix: u64,
}

/// Removes the staging folders in OUT's parent whose owner is gone (killed with SIGKILL, out of
/// memory, a crash, a reboot). Folders without a readable owner record are left alone.
pub(crate) fn sweep(out: &Path) -> Vec<Swept> {
    let parent = parent_of(out);
    let Ok(entries) = fs::read_dir(&parent) else {
        return Vec::new();
    };
    let mut swept = Vec::new();
    for e in entries.flatten() {
        let name = e.file_name();
        let name = name.to_string_lossy();
        if !name.starts_with('.') || !name.contains(STAGING_TAG) {
            continue;
        }
        let path = e.path();
        let is_dir = e.file_type().is_ok_and(|t| t.is_dir());
        let Some(owner) = is_dir.then(|| Owner::read(&path)).flatten() else {
            continue;
        };
        if owner.is_gone() && fs::remove_dir_all(&path).is_ok() {
            swept.push(Swept {
                path,
                pid: owner.pid,
                started_unix: owner.started_unix,
            });
        }
    }
    swept.sort_by(|a, b| a.path.cmp(&b.path));
    swept
}

pub(super) fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is valid for its length; gethostname NUL-terminates within it or fails.
    let r = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    if r != 0 {
        return String::new();
    }
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

pub(super) fn boot_id() -> Option<String> {
    fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

/// Field 22 of `/proc/PID/stat`: when the process started, in clock ticks since boot.
pub(super) fn start_ticks(pid: u32) -> Option<u64> {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may hold spaces and parentheses: count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

pub(super) fn process_exists(pid: u32) -> bool {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return false;
    };
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid, 0) };
    r == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
