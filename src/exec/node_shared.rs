//! Shared reads of a source in object storage: the sources of one object that ranks outside the
//! run read too ([`super::shared`]) are fetched once per node into its node cache
//! ([`crate::resolve::store::node_cache`]), then read from there, through the page cache, as a
//! local folder's shared reads are. Runs as a phase of its own before the copies, so that a copy
//! never waits on another process's fetch while it holds a buffer.

use std::sync::atomic::{AtomicBool, Ordering};

use rayon::prelude::*;

use super::source::{IoMode, SourceFile};
use super::{ExecError, Stats};
use crate::plan::Plan;
use crate::resolve::store::node_cache::NodeCache;

/// For each file of `files` that is an object holding a source marked in `shared`, its node
/// cache's file, opened to read, with every shared source of it fetched there (by this process,
/// or found fetched by another). Other files' entries stay `None`.
pub(super) fn object_twins(
    plan: &Plan,
    files: &[Option<SourceFile>],
    shared: &[bool],
    cancel: &AtomicBool,
    stats: &Stats,
) -> Result<Vec<Option<SourceFile>>, ExecError> {
    let mut caches: Vec<Option<NodeCache>> = files.iter().map(|_| None).collect();
    let mut ranges = Vec::new();
    for (src, _) in plan.sources.iter().zip(shared).filter(|(_, on)| **on) {
        let i = src.file_index;
        let Some(f) = files[i].as_ref() else { continue };
        let Some(object) = f.object_arc() else {
            continue;
        };
        if caches[i].is_none() {
            let cache = NodeCache::open(&f.path, object)
                .map_err(|e| ExecError::io("creating the node cache of", &f.path, e))?;
            caches[i] = Some(cache);
        }
        let numel = src.shape.iter().product::<u64>();
        // A packed tensor of an odd count ends in a part byte, which is its data too.
        let bytes =
            (src.dtype.byte_size(numel)).unwrap_or_else(|| (numel * src.dtype.bits()).div_ceil(8));
        ranges.push((i, src.offset, src.offset + bytes));
    }
    ranges.par_iter().try_for_each(|&(i, lo, hi)| {
        if cancel.load(Ordering::Relaxed) {
            return Err(ExecError::Cancelled);
        }
        let cache = caches[i].as_ref().expect("made above");
        let got = cache
            .ensure(lo, hi)
            .map_err(|e| ExecError::io("fetching into the node cache", cache.path(), e))?;
        stats.node_fetched_bytes.fetch_add(got, Ordering::Relaxed);
        Ok(())
    })?;
    caches
        .iter()
        .map(|c| {
            c.as_ref()
                .map(|c| SourceFile::open(c.path(), IoMode::Buffered).map_err(ExecError::Open))
                .transpose()
        })
        .collect()
}

/// Whether any of `files` is in object storage.
pub(super) fn any_object(files: &[Option<SourceFile>]) -> bool {
    files.iter().flatten().any(|f| f.object().is_some())
}
