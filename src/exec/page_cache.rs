//! How much of a file the page cache holds (`mincore`), and how to drop it from there
//! (`posix_fadvise`), so that cold loads are cold and every report says which kind it measured.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::source::{ALIGN, OpenError};

/// How much of a set of files the page cache holds.
#[derive(Debug, Default, Clone, Copy, Serialize, PartialEq, schemars::JsonSchema)]
pub(crate) struct Residency {
    pub bytes: u64,
    pub resident_bytes: u64,
}

impl Residency {
    pub(crate) fn share(&self) -> f64 {
        if self.bytes == 0 {
            1.0
        } else {
            self.resident_bytes as f64 / self.bytes as f64
        }
    }

    fn add(&mut self, o: Residency) {
        self.bytes += o.bytes;
        self.resident_bytes += o.resident_bytes;
    }
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as u64 } else { ALIGN }
}

/// Bytes of `path` in the page cache, by `mincore` on a mapping of it (mapping reads nothing).
pub(crate) fn residency(path: &Path) -> io::Result<Residency> {
    let (len, page, vec) = resident_pages(path)?;
    if len == 0 {
        return Ok(Residency::default());
    }
    let pages = vec.len();
    let full = vec.iter().filter(|&&b| b & 1 == 1).count() as u64;
    // The last page may be partial.
    let last_partial = vec[pages - 1] & 1 == 1 && len % page != 0;
    let resident = full * page - if last_partial { page - len % page } else { 0 };
    Ok(Residency {
        bytes: len,
        resident_bytes: resident,
    })
}

/// `path`'s length, the page size, and `mincore`'s byte per page (bit 0: in the page cache).
pub(crate) fn resident_pages(path: &Path) -> io::Result<(u64, u64, Vec<u8>)> {
    let f = File::open(path)?;
    let len = f.metadata()?.len();
    let page = page_size();
    if len == 0 {
        return Ok((0, page, Vec::new()));
    }
    // SAFETY: read-only map, never dereferenced: only its address range goes to mincore.
    let m = unsafe { memmap2::Mmap::map(&f) }?;
    let pages = len.div_ceil(page) as usize;
    let mut vec = vec![0u8; pages];
    // SAFETY: `m` spans `len` bytes from a page-aligned address; `vec` has one byte per page.
    let rc = unsafe {
        libc::mincore(
            m.as_ptr() as *mut libc::c_void,
            len as usize,
            vec.as_mut_ptr(),
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((len, page, vec))
}

/// The page-cache residency of all of `paths`.
pub(crate) fn residency_all(paths: &[PathBuf]) -> Result<Residency, OpenError> {
    let mut r = Residency::default();
    for p in paths {
        r.add(residency(p).map_err(|source| OpenError::Open {
            path: p.clone(),
            source,
        })?);
    }
    Ok(r)
}

/// Drops `path`'s pages from the page cache (written back first, since dirty pages stay).
/// Pages another process has mapped stay too: [`residency`] afterwards says what is left.
pub(crate) fn evict(path: &Path) -> io::Result<()> {
    let f = File::open(path)?;
    f.sync_data()?;
    // SAFETY: a valid descriptor; offset 0 and length 0 mean the whole file.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(io::Error::from_raw_os_error(rc));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::exec::source::tests::file_with;

    #[test]
    fn eviction_drops_residency() {
        let (_d, p, _) = file_with(8 << 20);
        std::fs::read(&p).unwrap();
        let before = residency(&p).unwrap();
        assert_eq!(before.bytes, 8 << 20);
        assert!(before.share() > 0.9, "{before:?}");
        evict(&p).unwrap();
        let after = residency(&p).unwrap();
        assert!(after.share() < 0.1, "{after:?}");
    }
}
