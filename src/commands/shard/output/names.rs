//! The names wload gives the things it keeps next to OUT: the hidden staging folder
//! (`.{OUT}.wload-tmp-{PID}`), its owner record and the fallback's moved-aside folder, and OUT's
//! parent, where they all go. One home, read by staging, publication, the sweeper and the side
//! files' listing (which must not copy a staging folder found inside a checkpoint).

use std::path::{Path, PathBuf};

/// Marks staging folders: `.{OUT name}.wload-tmp-{PID}`.
pub(crate) const STAGING_TAG: &str = ".wload-tmp-";
/// What the fallback publication appends to the staging name for the folder it moves aside.
pub(super) const ASIDE_SUFFIX: &str = ".old";
/// The owner record inside a staging folder; removed just before publication.
pub(crate) const OWNER_FILE: &str = ".wload-owner.json";

/// OUT's parent folder (`.` for a bare name): where the staging folder is made.
pub(crate) fn parent_of(out: &Path) -> PathBuf {
    match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// The longest file name the file system of `dir` takes (NAME_MAX, 255 almost everywhere).
pub(super) fn name_max(dir: &Path) -> usize {
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
/// still get folders of their own. Both keep the tag that [`super::sweep`] looks for.
pub(super) fn staging_name(name: &str, pid: u32, max: usize) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
