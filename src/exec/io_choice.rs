//! The `--io` mode a run reads with: `auto` resolved by the source's page-cache residency (after
//! `--cold`'s eviction), recorded with why, so that reports say what was measured.

use std::path::PathBuf;

use serde::Serialize;

use super::page_cache::{evict, residency_all};
use super::source::{IoMode, OpenError, SourceFile};
use crate::units::human_bytes;

/// Below this share of the source in the page cache, `auto` reads around it: copying cached
/// pages is faster than any disk, while for uncached ones O_DIRECT saves the extra copy.
pub const AUTO_RESIDENT_SHARE: f64 = 0.5;

/// The mode `auto` stands for, given the resident share of the source (0 to 1), with why.
pub(crate) fn choose(mode: IoMode, resident_share: f64) -> (IoMode, String) {
    match mode {
        IoMode::Auto if resident_share >= AUTO_RESIDENT_SHARE => (
            IoMode::Buffered,
            format!(
                "auto: {:.0}% of the source was in the page cache (at least {:.0}%), so buffered",
                resident_share * 100.0,
                AUTO_RESIDENT_SHARE * 100.0
            ),
        ),
        IoMode::Auto => (
            IoMode::Direct,
            format!(
                "auto: {:.0}% of the source was in the page cache (under {:.0}%), so direct",
                resident_share * 100.0,
                AUTO_RESIDENT_SHARE * 100.0
            ),
        ),
        m => (m, format!("{m}: as asked")),
    }
}

/// The source's page-cache state as a run starts.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct SourceCache {
    /// Bytes of the source files the plan reads.
    pub source_bytes: u64,
    /// Of those, in the page cache when the run started (after the eviction, with `--cold`).
    pub resident_bytes: u64,
    pub resident_share: f64,
    /// With `--cold`: resident before the eviction (then `resident_bytes` is after it).
    pub evicted_from_bytes: Option<u64>,
}

/// The I/O mode asked for, the one used, and why.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct IoChoice {
    pub requested: IoMode,
    pub used: IoMode,
    pub why: String,
    /// The source is in object storage: read by ranged GETs, whatever the mode says.
    #[serde(skip)]
    pub object_storage: bool,
}

impl IoChoice {
    /// Whether the run reads what other ranks read too once per node
    /// ([`ExecOptions::share_reads`](super::ExecOptions)): `auto`'s direct reads, through the
    /// page cache; an object store's, through the node cache.
    pub fn shares_reads(&self) -> bool {
        self.object_storage || (self.requested == IoMode::Auto && self.used == IoMode::Direct)
    }

    /// Says in `why` that the run read `bytes` (its [`Stats::shared_bytes`](super::Stats))
    /// buffered for ranks outside it, so that the report says what was measured.
    pub fn note_shared(&mut self, bytes: u64) {
        if self.object_storage && bytes > 0 {
            self.why = format!(
                "{}; the {} that ranks outside this run read too (column slices of row-parallel \
                 weights, replicated tensors) through the node cache beside the source's headers, \
                 so that the node fetches them from the store once",
                self.why,
                human_bytes(bytes)
            );
        } else if self.shares_reads() && bytes > 0 {
            self.why = format!(
                "{}; but the {} that ranks outside this run read too (column slices of row-parallel \
                 weights, replicated tensors) buffered, so that the node reads them from storage once",
                self.why,
                human_bytes(bytes)
            );
        }
    }
}

/// What `load` and `shard` do before reading: with `cold`, every file out of the page cache
/// (then measured, so the report proves it); the residency as the run starts, which `auto`
/// chooses by.
pub fn prepare(
    paths: &[PathBuf],
    mode: IoMode,
    cold: bool,
) -> Result<(SourceCache, IoChoice), OpenError> {
    if let Some(objects) = in_object_storage(paths) {
        return Ok(objects);
    }
    let mut evicted_from = None;
    if cold {
        evicted_from = Some(residency_all(paths)?.resident_bytes);
        for p in paths {
            evict(p).map_err(|source| OpenError::Evict {
                path: p.clone(),
                source,
            })?;
        }
    }
    let now = residency_all(paths)?;
    let (mut used, mut why) = choose(mode, now.share());
    // `auto` must not fail where O_DIRECT is not supported (some container and network
    // filesystems): it reads buffered there instead, and says so.
    if mode == IoMode::Auto
        && used == IoMode::Direct
        && let Some(p) = paths.first()
        && let Err(OpenError::NoDirect { .. }) = SourceFile::open(p, IoMode::Direct)
    {
        used = IoMode::Buffered;
        why = format!("{why}; but this filesystem does not support O_DIRECT, so buffered");
    }
    Ok((
        SourceCache {
            source_bytes: now.bytes,
            resident_bytes: now.resident_bytes,
            resident_share: now.share(),
            evicted_from_bytes: evicted_from,
        },
        IoChoice {
            requested: mode,
            used,
            why,
            object_storage: false,
        },
    ))
}

/// For a source in object storage: no page cache to measure or evict, and one way to read it.
fn in_object_storage(paths: &[PathBuf]) -> Option<(SourceCache, IoChoice)> {
    let objects: Vec<_> = (paths.iter())
        .filter_map(|p| crate::resolve::store::data::lookup(p))
        .collect();
    if objects.is_empty() {
        return None;
    }
    let bytes = objects.iter().map(|o| o.size()).sum();
    Some((
        SourceCache {
            source_bytes: bytes,
            resident_bytes: 0,
            resident_share: 0.0,
            evicted_from_bytes: None,
        },
        IoChoice {
            requested: IoMode::Auto,
            used: IoMode::Buffered,
            why: format!(
                "object storage: ranged GETs of the planned bytes, {} at once",
                super::OBJECT_THREADS
            ),
            object_storage: true,
        },
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_follows_residency() {
        assert_eq!(choose(IoMode::Auto, 1.0).0, IoMode::Buffered);
        assert_eq!(choose(IoMode::Auto, 0.0).0, IoMode::Direct);
        assert!(choose(IoMode::Auto, 0.0).1.contains("0% of the source"));
        assert_eq!(choose(IoMode::Mmap, 0.0).0, IoMode::Mmap);
    }
}
