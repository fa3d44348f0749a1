//! How source bytes come off storage: through the page cache (`buffered`), around it (`direct`,
//! O_DIRECT into aligned buffers), or from a mapping (`mmap`); one type for all three, so that
//! the engine and the devices read without caring which.

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::Serialize;

/// O_DIRECT's alignment for offsets, lengths and buffer addresses: the page size, a multiple of
/// every logical block size Linux block devices use.
pub(crate) const ALIGN: u64 = 4096;

/// How the engine reads source files.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, clap::ValueEnum, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum IoMode {
    /// Direct when most of the source is out of the page cache, buffered when it is in.
    #[default]
    Auto,
    /// pread through the page cache.
    Buffered,
    /// O_DIRECT reads into aligned buffers: no page-cache copy, no cache pollution.
    Direct,
    /// Copies out of a read-only mapping of each file.
    Mmap,
}

impl std::fmt::Display for IoMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoMode::Auto => "auto",
            IoMode::Buffered => "buffered",
            IoMode::Direct => "direct",
            IoMode::Mmap => "mmap",
        })
    }
}

/// One source file, opened for the chosen mode. The buffered handle is always there: it serves
/// file-to-file copies and the bytes O_DIRECT cannot reach (none, unless the file shrank).
pub struct SourceFile {
    pub path: PathBuf,
    /// The local file; `None` for a file in object storage ([`SourceFile::object`]).
    pub file: Option<File>,
    /// A weight file that stays in object storage: every read is a ranged GET of exactly its
    /// bytes, checked against the planned etag.
    object: Option<std::sync::Arc<crate::resolve::store::data::ObjectData>>,
    direct: Option<File>,
    /// Before `map`: unregistered before the range is unmapped.
    watch: Option<super::sigbus::Watch>,
    map: Option<memmap2::Mmap>,
}

/// Why a source file cannot be read the way asked.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("opening {path}: {source}")]
    Open {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("evicting {path} from the page cache: {source}")]
    Evict {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path}: this filesystem does not support O_DIRECT ({source}); use --io buffered or --io auto"
    )]
    NoDirect {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path}: cannot map its {len} bytes into memory: the process's address space is limited \
         (`ulimit -v`: {source}); raise the limit, or use --io buffered"
    )]
    AddressSpace {
        path: PathBuf,
        len: u64,
        #[source]
        source: io::Error,
    },
    #[error(
        "{path}: the path named another file when it was opened again for O_DIRECT (replaced \
         meanwhile); run again once nothing writes to the checkpoint"
    )]
    Replaced { path: PathBuf },
}

impl SourceFile {
    /// Opens `path` for `mode` (`auto` must be resolved first: it is taken as buffered).
    pub fn open(path: &Path, mode: IoMode) -> Result<SourceFile, OpenError> {
        let open_err = |source| OpenError::Open {
            path: path.to_path_buf(),
            source,
        };
        if let Some(object) = crate::resolve::store::data::lookup(path) {
            // The mode is the page cache's business; a store is read the one way it can be.
            return Ok(SourceFile {
                path: path.to_path_buf(),
                file: None,
                object: Some(object),
                direct: None,
                watch: None,
                map: None,
            });
        }
        let file = File::open(path).map_err(open_err)?;
        let mut src = SourceFile {
            path: path.to_path_buf(),
            object: None,
            file: Some(file),
            direct: None,
            watch: None,
            map: None,
        };
        match mode {
            IoMode::Direct => {
                let f = std::fs::OpenOptions::new()
                    .read(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(path)
                    .map_err(|source| match source.raw_os_error() {
                        Some(libc::EINVAL) => OpenError::NoDirect {
                            path: path.to_path_buf(),
                            source,
                        },
                        _ => open_err(source),
                    })?;
                // Opened by path twice: both must be the same file, or the run would check one
                // and read the other.
                let id = |f: &File| f.metadata().map(|m| (m.dev(), m.ino()));
                if id(&f).map_err(open_err)? != id(src.local()).map_err(open_err)? {
                    return Err(OpenError::Replaced {
                        path: path.to_path_buf(),
                    });
                }
                src.direct = Some(f);
            }
            IoMode::Mmap => src.map_whole(path)?,
            IoMode::Auto | IoMode::Buffered => {}
        }
        Ok(src)
    }

    /// The same file opened again to read through the page cache, for bytes that other
    /// processes read too ([`super::shared`]): the first to read them takes them from storage,
    /// the others from memory. Without readahead, which would take the bytes after them (another
    /// tensor, read direct) from storage as well, and the node would read those twice.
    pub(crate) fn buffered_twin(&self) -> Result<SourceFile, OpenError> {
        let twin = SourceFile::open(&self.path, IoMode::Buffered)?;
        let open_err = |source| OpenError::Open {
            path: self.path.clone(),
            source,
        };
        let id = |f: &File| f.metadata().map(|m| (m.dev(), m.ino()));
        if id(twin.local()).map_err(open_err)? != id(self.local()).map_err(open_err)? {
            return Err(OpenError::Replaced {
                path: self.path.clone(),
            });
        }
        // SAFETY: a valid descriptor; offset 0 and length 0 mean the whole file.
        let rc =
            unsafe { libc::posix_fadvise(twin.local().as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
        if rc != 0 {
            return Err(open_err(io::Error::from_raw_os_error(rc)));
        }
        Ok(twin)
    }

    /// Maps the file for `--io mmap`, watched for pages that vanish if it shrinks
    /// ([`super::sigbus`]); a file the watch cannot take is read with `pread` instead.
    fn map_whole(&mut self, path: &Path) -> Result<(), OpenError> {
        let open_err = |source| OpenError::Open {
            path: path.to_path_buf(),
            source,
        };
        let len = self.local().metadata().map_err(open_err)?.len();
        if len == 0 {
            return Ok(());
        }
        // SAFETY: a read-only private map. A file truncated under it would raise SIGBUS on the
        // pages past its new end; the watch turns those into zero pages and marks the file,
        // which the engine then refuses (the stamp check after reading).
        let m = unsafe { memmap2::Mmap::map(self.local()) }.map_err(|source| {
            if source.raw_os_error() == Some(libc::ENOMEM) {
                OpenError::AddressSpace {
                    path: path.to_path_buf(),
                    len,
                    source,
                }
            } else {
                open_err(source)
            }
        })?;
        if let Some(w) = super::sigbus::Watch::new(m.as_ptr(), m.len()) {
            self.watch = Some(w);
            self.map = Some(m);
        }
        Ok(())
    }

    /// Whether pages of the mapping vanished while it was read (the file shrank): what was read
    /// there is zeros, not the file's bytes.
    pub(crate) fn lost_pages(&self) -> bool {
        self.watch.as_ref().is_some_and(|w| w.lost_pages())
    }

    pub(crate) fn mode(&self) -> IoMode {
        if self.direct.is_some() {
            IoMode::Direct
        } else if self.map.is_some() {
            IoMode::Mmap
        } else {
            IoMode::Buffered
        }
    }

    /// Reads source bytes `[off, off + len)` into `dst`, which must be [`ALIGN`]-aligned and at
    /// least [`staging_len`]`(len)` long; returns where in `dst` they start (O_DIRECT reads whole
    /// aligned blocks around them). A short file is `UnexpectedEof`.
    pub(crate) fn read_staged(&self, dst: &mut [u8], off: u64, len: usize) -> io::Result<usize> {
        debug_assert!(dst.len() >= staging_len(len));
        if let Some(f) = &self.direct {
            let a0 = off / ALIGN * ALIGN;
            let delta = (off - a0) as usize;
            let want = (delta + len).div_ceil(ALIGN as usize) * ALIGN as usize;
            let got = read_full(f, &mut dst[..want], a0)?;
            // The file's tail: O_DIRECT reads stop at the end, within the last block.
            if got < delta + len {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            return Ok(delta);
        }
        self.read_exact_at(&mut dst[..len], off)?;
        Ok(0)
    }

    /// Reads exactly `dst.len()` bytes at `off`, into any buffer; direct files go through
    /// `bounce`, an aligned buffer kept by the caller.
    pub(crate) fn read_into(
        &self,
        dst: &mut [u8],
        off: u64,
        bounce: &mut AlignedBuf,
    ) -> io::Result<()> {
        if self.direct.is_some() {
            let b = bounce.get(staging_len(dst.len()));
            let at = self.read_staged(b, off, dst.len())?;
            dst.copy_from_slice(&b[at..at + dst.len()]);
            return Ok(());
        }
        self.read_exact_at(dst, off)
    }

    /// [`SourceFile::read_into`], but for direct files straight into `dst` when `dst`'s address
    /// and `off` sit at the same place in a block: only a partial first and last block go
    /// through `bounce`, the rest lands without a copy.
    pub(crate) fn read_into_in_place(
        &self,
        dst: &mut [u8],
        off: u64,
        bounce: &mut AlignedBuf,
    ) -> io::Result<()> {
        let a = ALIGN as usize;
        let Some(f) = &self.direct else {
            return self.read_exact_at(dst, off);
        };
        if dst.as_ptr() as usize % a != (off % ALIGN) as usize || dst.len() < 2 * a {
            return self.read_into(dst, off, bounce);
        }
        let head = (off.next_multiple_of(ALIGN) - off) as usize;
        let body = (dst.len() - head) / a * a;
        let (first, rest) = dst.split_at_mut(head);
        let (middle, last) = rest.split_at_mut(body);
        self.read_into(first, off, bounce)?;
        let at = off + head as u64;
        if read_full(f, middle, at)? < body {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        self.read_into(last, at + body as u64, bounce)
    }

    /// Source bytes `[off, off + len)`: straight from the mapping, or read into `buf`.
    pub(crate) fn read<'a>(
        &'a self,
        buf: &'a mut AlignedBuf,
        off: u64,
        len: usize,
    ) -> io::Result<&'a [u8]> {
        if let Some(m) = &self.map {
            let end = off as usize + len;
            if end > m.len() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            return Ok(&m[off as usize..end]);
        }
        let b = buf.get(staging_len(len));
        let at = self.read_staged(b, off, len)?;
        Ok(&b[at..at + len])
    }

    /// Buffered (or mapped) positioned read of exactly `dst.len()` bytes.
    fn read_exact_at(&self, dst: &mut [u8], off: u64) -> io::Result<()> {
        if let Some(m) = &self.map {
            let end = off as usize + dst.len();
            if end > m.len() {
                return Err(io::ErrorKind::UnexpectedEof.into());
            }
            dst.copy_from_slice(&m[off as usize..end]);
            return Ok(());
        }
        match (&self.file, &self.object) {
            (Some(f), _) => f.read_exact_at(dst, off),
            (None, Some(o)) => o.read_exact_at(dst, off),
            (None, None) => unreachable!("a SourceFile is a local file or an object"),
        }
    }

    /// The local file of a source opened from disk (every mode but an object's).
    fn local(&self) -> &File {
        self.file
            .as_ref()
            .expect("only sources opened from disk are mapped or opened for O_DIRECT")
    }

    /// The object-store file this source is, when it is one.
    pub(crate) fn object(&self) -> Option<&crate::resolve::store::data::ObjectData> {
        self.object.as_deref()
    }

    pub(crate) fn object_arc(
        &self,
    ) -> Option<std::sync::Arc<crate::resolve::store::data::ObjectData>> {
        self.object.clone()
    }
}

/// Room a staged read of `len` bytes needs: an aligned block more on each side.
pub(crate) fn staging_len(len: usize) -> usize {
    len + 2 * ALIGN as usize
}

/// Reads until `dst` is full or the file ends; returns the bytes read.
fn read_full(f: &File, dst: &mut [u8], off: u64) -> io::Result<usize> {
    let mut got = 0;
    while got < dst.len() {
        match f.read_at(&mut dst[got..], off + got as u64) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(got)
}

/// A growable buffer whose start is [`ALIGN`]-aligned (O_DIRECT's rule for buffer addresses).
#[derive(Default)]
pub(crate) struct AlignedBuf {
    raw: Vec<u8>,
}

impl AlignedBuf {
    /// The first `len` bytes of the aligned region, grown if needed (contents unspecified).
    pub(crate) fn get(&mut self, len: usize) -> &mut [u8] {
        let a = ALIGN as usize;
        if self.raw.len() < len + a {
            self.raw = vec![0; len + a];
        }
        let start = self.raw.as_ptr().align_offset(a);
        &mut self.raw[start..start + len]
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A temporary file of `len` distinct-ish bytes (also used by `page_cache`'s tests).
    pub(in crate::exec) fn file_with(len: usize) -> (tempfile::TempDir, PathBuf, Vec<u8>) {
        let dir = tempfile::TempDir::new().unwrap();
        let p = dir.path().join("f.bin");
        let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4099) as u8).collect();
        std::fs::write(&p, &bytes).unwrap();
        (dir, p, bytes)
    }

    /// Every mode reads the same bytes at unaligned starts, across block edges and up to the
    /// file's unaligned tail; one byte past the end is a clean UnexpectedEof.
    #[test]
    fn every_mode_reads_the_same_bytes() {
        let len = 3 * ALIGN as usize + 1234;
        let (_d, p, bytes) = file_with(len);
        for mode in [IoMode::Buffered, IoMode::Direct, IoMode::Mmap] {
            let f = match SourceFile::open(&p, mode) {
                Ok(f) => f,
                Err(OpenError::NoDirect { .. }) => {
                    panic!("O_DIRECT unsupported where the tests run: {}", p.display())
                }
                Err(e) => panic!("{e}"),
            };
            assert_eq!(f.mode(), mode);
            let mut buf = AlignedBuf::default();
            let mut bounce = AlignedBuf::default();
            for (off, n) in [
                (0, len),
                (1, 10),
                (4095, 2),
                (4097, 9000),
                (len - 7, 7),
                (len - 1, 1),
                (5000, 0),
            ] {
                let got = f.read(&mut buf, off as u64, n).unwrap().to_vec();
                assert_eq!(got, &bytes[off..off + n], "{mode} read at {off}+{n}");
                let mut dst = vec![0u8; n];
                f.read_into(&mut dst, off as u64, &mut bounce).unwrap();
                assert_eq!(dst, &bytes[off..off + n], "{mode} read_into at {off}+{n}");
            }
            // In place: destinations at every phase against the source offset.
            for (off, n) in [(0usize, len), (4096, 8192), (100, 9000), (4000, len - 4000)] {
                for shift in [0usize, 1, off % 4096] {
                    let mut raw = AlignedBuf::default();
                    let room = raw.get(n + 8192);
                    let dst = &mut room[shift..shift + n];
                    f.read_into_in_place(dst, off as u64, &mut bounce).unwrap();
                    assert_eq!(
                        dst,
                        &bytes[off..off + n],
                        "{mode} in place {off}+{n} at {shift}"
                    );
                }
            }
            let err = f.read(&mut buf, len as u64 - 3, 4).unwrap_err();
            assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof, "{mode}");
        }
    }
}
