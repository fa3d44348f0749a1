//! Weight files whose tensor data stays in object storage: the engine reads exactly the byte
//! ranges it plans, by ranged GETs, each checked against the etag the header was read with.
//!
//! Why a table by local path and not a field of the plan: a plan names its files relative to
//! the checkpoint folder (`Plan` is data, written as JSON), and every reader opens them as
//! `root.join(file)`. A store source's folder is its local cache folder, which holds the config
//! and the index but not the weights; the source registers each weight file's path there once
//! resolved, and the engine's opener asks this table before the file system. So the engine, the
//! tying checks and the run record read a store's files through the same calls as a disk's.

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use super::client::Store;

/// One weight file in a store, as planned.
#[derive(Debug)]
pub(crate) struct ObjectData {
    pub(crate) store: Store,
    pub(crate) name: String,
    pub(crate) etag: String,
    pub(crate) size: u64,
}

impl ObjectData {
    /// Reads exactly `dst.len()` bytes at `off` (one ranged GET); past the planned size is
    /// `UnexpectedEof`, a changed object an error that says so.
    pub(crate) fn read_exact_at(&self, dst: &mut [u8], off: u64) -> io::Result<()> {
        let end = off + dst.len() as u64;
        if end > self.size {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if dst.is_empty() {
            return Ok(());
        }
        let bytes = self
            .store
            .get_range(&self.name, off..end, Some(&self.etag))
            .map_err(io::Error::other)?;
        dst.copy_from_slice(&bytes);
        Ok(())
    }

    pub(crate) fn size(&self) -> u64 {
        self.size
    }
}

fn table() -> &'static Mutex<HashMap<PathBuf, Arc<ObjectData>>> {
    static T: OnceLock<Mutex<HashMap<PathBuf, Arc<ObjectData>>>> = OnceLock::new();
    T.get_or_init(Default::default)
}

/// Records that `path` (in a store source's cache folder) is `data`, in the store.
pub(crate) fn register(path: PathBuf, data: ObjectData) {
    let mut t = table().lock().unwrap_or_else(|p| p.into_inner());
    t.insert(path, Arc::new(data));
}

/// The store object that `path` stands for, when it is one.
pub(crate) fn lookup(path: &Path) -> Option<Arc<ObjectData>> {
    let t = table().lock().unwrap_or_else(|p| p.into_inner());
    t.get(path).cloned()
}
