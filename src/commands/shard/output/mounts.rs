//! Whether a folder is a mount point, which cannot be renamed: the output could not be
//! published there in one step.

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Whether the existing folder `dir` (metadata `meta`) is a mount point: on another device than
/// its parent, or listed in the mount table (a bind mount from the same device). A mount point
/// cannot be renamed, so the output could not be published there in one step.
pub(super) fn is_mount_point(dir: &Path, parent: &Path, meta: &fs::Metadata) -> bool {
    if fs::metadata(parent).is_ok_and(|p| p.dev() != meta.dev()) {
        return true;
    }
    let Ok(canon) = dir.canonicalize() else {
        return false;
    };
    use std::os::unix::ffi::OsStrExt;
    let canon = canon.as_os_str().as_bytes();
    mount_points().iter().any(|m| m.as_slice() == canon)
}

/// The mount points of `/proc/self/mountinfo` (the fifth field, octal escapes undone); none
/// where it cannot be read (other systems: the device check above stands alone there).
fn mount_points() -> Vec<Vec<u8>> {
    #[cfg(feature = "test-hooks")]
    let table = std::env::var_os("WLOAD_TEST_MOUNTINFO")
        .map_or_else(|| PathBuf::from("/proc/self/mountinfo"), PathBuf::from);
    #[cfg(not(feature = "test-hooks"))]
    let table = PathBuf::from("/proc/self/mountinfo");
    let Ok(text) = crate::small_file::read(&table) else {
        return Vec::new();
    };
    text.split(|&b| b == b'\n')
        .filter_map(|line| line.split(|&b| b == b' ').nth(4))
        .map(unescape_mount_path)
        .collect()
}

/// mountinfo writes space, tab, newline and backslash in paths as `\NNN` (octal).
fn unescape_mount_path(field: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(field.len());
    let mut i = 0;
    while i < field.len() {
        let octal = field
            .get(i + 1..i + 4)
            .filter(|d| field[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)));
        match octal {
            Some(d) => {
                let v = d.iter().fold(0u32, |v, c| v * 8 + u32::from(c - b'0'));
                out.push(u8::try_from(v).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(field[i]);
                i += 1;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mountinfo_paths_are_unescaped() {
        assert_eq!(
            unescape_mount_path(br"/mnt/my\040disk\134x"),
            b"/mnt/my disk\\x"
        );
        assert_eq!(unescape_mount_path(br"/a\9"), br"/a\9");
        assert_eq!(unescape_mount_path(b"/"), b"/");
    }
}
