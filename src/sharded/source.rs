//! What identifies the checkpoint a `shard` run read, as its run record keeps it, so that runs
//! split across machines merge ([`super::runs`]) only when they sharded the same checkpoint.
//!
//! Two identities, both independent of where the copy lies and when it was copied (a checkpoint
//! synced to each node has other paths and modification times there, and its runs must merge):
//!
//! - [`table_id`]: the files' names and sizes and every tensor's name, dtype, shape and place.
//!   Another model, TP-relevant dimension or layout differs here.
//! - [`data_id`]: the config the plan read, every file's header as written, and samples of every
//!   tensor's bytes. A fine-tune of a base (or a re-release that fixed some weights) has the same
//!   tensor table but other bytes: that differs here.
//!
//! Why samples and not a hash of all the data: each run reads only its own ranks' slices, so no
//! whole-data hash is common to all runs unless each reads the whole checkpoint again (a second
//! pass over hundreds of GB). Every run reads the same samples, though: the first, middle and last
//! [`SAMPLE`] bytes of each tensor (all of a smaller one), at most 12 KiB per tensor: 1.1 GB for
//! DeepSeek-V3's 90,000 tensors, 0.16% of its 680 GB, in 4 KiB reads. A fine-tune changes every
//! tensor and a fix rewrites the tensors it fixes, so a sample of each tensor tells them apart;
//! what it cannot see is a change confined to bytes no sample covers (the rank files' own
//! checksums still hold each rank to what its run wrote). Why not modification times or the hub's
//! etags: copies of one checkpoint have other times, and a run from the hub and one from a local
//! copy of it must merge too; the bytes are the same everywhere.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use xxhash_rust::xxh3::Xxh3;

use crate::checkpoint::{Backing, Checkpoint, WeightFile};

/// Bytes read at each sampled place of a tensor.
pub(crate) const SAMPLE: u64 = 4096;

/// XXH3-64 of the weight files' names and sizes and every tensor's name, dtype, shape and place.
/// Two copies of one checkpoint agree; a changed tensor table does not. Reads no data.
pub(crate) fn table_id(ck: &Checkpoint) -> String {
    let mut h = Xxh3::new();
    for f in &ck.files {
        h.update(f.name.as_bytes());
        h.update(&f.size.to_le_bytes());
        for t in &f.tensors {
            h.update(t.name.as_bytes());
            h.update(t.dtype.as_str().as_bytes());
            for d in &t.shape {
                h.update(&d.to_le_bytes());
            }
            h.update(&t.offset.to_le_bytes());
            h.update(&t.len.to_le_bytes());
        }
    }
    format!("{:016x}", h.digest())
}

/// XXH3-64 of `config` (the config file's bytes as planned from) and, per weight file, its name,
/// size, header and samples of its tensors' bytes ([`samples`]). Fails when a file cannot be read
/// or is no longer the one whose header was read.
pub(crate) fn data_id(ck: &Checkpoint, config: &[u8]) -> io::Result<String> {
    let mut h = Xxh3::new();
    h.update(&(config.len() as u64).to_le_bytes());
    h.update(config);
    let mut buf = vec![0u8; SAMPLE as usize];
    for f in &ck.files {
        h.update(f.name.as_bytes());
        h.update(&f.size.to_le_bytes());
        // In object storage, samples would be thousands of small GETs: the store's etag names
        // the object's bytes instead (runs from the same objects merge; one from a local copy
        // of them does not, and says so).
        if let Backing::Object { etag } = &f.backing {
            h.update(b"object-etag");
            h.update(etag.as_bytes());
            continue;
        }
        let file = open_unchanged(f)?;
        let mut header = vec![0u8; f.data_start() as usize];
        file.read_exact_at(&mut header, 0)?;
        h.update(&header);
        for (at, n) in samples(f) {
            file.read_exact_at(&mut buf[..n as usize], at)?;
            h.update(&buf[..n as usize]);
        }
    }
    Ok(format!("{:016x}", h.digest()))
}

/// `f` opened, if it is still the file whose header was read (a file replaced since would give
/// another checkpoint's samples under this one's table).
fn open_unchanged(f: &WeightFile) -> io::Result<File> {
    if let Backing::HeaderOnly { .. } = f.backing {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("{}: only its header is on this machine", f.name),
        ));
    }
    let file = File::open(&f.path)?;
    let now = crate::file_stamp::FileStamp::of_file(&file)?;
    match f.stamp.change_to(&now) {
        None => Ok(file),
        Some(change) => Err(io::Error::other(format!(
            "{}: changed since its header was read: {change}",
            f.name
        ))),
    }
}

/// The (offset, length) pieces of `f` sampled: of each tensor, all of it up to 3 × [`SAMPLE`]
/// bytes, else its first, middle and last [`SAMPLE`] bytes (a fix to the first or last rows, such
/// as added tokens' embeddings, shows as well as one to the whole tensor).
fn samples(f: &WeightFile) -> Vec<(u64, u64)> {
    let per_tensor = 3 * SAMPLE;
    let mut out = Vec::new();
    for t in &f.tensors {
        if t.len <= per_tensor {
            out.extend(chunks(t.offset, t.len));
        } else {
            let mid = t.offset + (t.len - SAMPLE) / 2;
            let end = t.offset + t.len - SAMPLE;
            out.extend([(t.offset, SAMPLE), (mid, SAMPLE), (end, SAMPLE)]);
        }
    }
    out
}

/// `len` bytes from `at` as pieces of at most [`SAMPLE`] bytes (the read buffer's size).
fn chunks(at: u64, len: u64) -> impl Iterator<Item = (u64, u64)> {
    (0..len)
        .step_by(SAMPLE as usize)
        .map(move |o| (at + o, SAMPLE.min(len - o)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_tensors_are_read_whole_in_buffer_sized_pieces() {
        assert_eq!(chunks(10, 0).count(), 0);
        assert_eq!(
            chunks(10, 5000).collect::<Vec<_>>(),
            [(10, 4096), (4106, 904)]
        );
    }
}
