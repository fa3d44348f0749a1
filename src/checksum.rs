//! The checksum `wload.json` records for every part file (`xxh3_64k`): the sum, modulo 2^64, of
//! the XXH3-64 digests of the file's 64 KiB blocks, block `i` hashed with seed `i`; 16 hex digits.
//!
//! Why not XXH3 of the whole file: a stream hash takes the bytes in file order, and `shard`
//! writes each file in the engine's order (every source tensor sliced into every rank at once),
//! so it had to read every file back after the last write, a tail of half a second on 4 GB.
//! Blocks can be hashed in any order, most of them straight from the bytes being written, while
//! they are in the CPU's cache; the seed ties each digest to its place in the file, and a sum
//! needs no list of digests, so memory stays the same for any file size. In Python:
//! `sum(xxhash.xxh3_64_intdigest(f.read(65536), seed=i) for i in range(blocks)) % 2**64`.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::Path;

use xxhash_rust::xxh3::xxh3_64_with_seed;

/// Bytes per block.
pub(crate) const BLOCK: u64 = 64 << 10;

/// Bytes read per step when reading a file back: small enough to stay in the core's L2 cache
/// between the kernel's copy and the hash (an 8 MiB step made hashing a third slower), read
/// rather than mapped so the file's pages never count as this process's memory, and whole
/// blocks.
pub(crate) const READ_STEP: usize = 4 * BLOCK as usize;

/// Block `index`'s digest, from its bytes (`BLOCK` of them, fewer for a file's last block).
pub(crate) fn block(index: u64, bytes: &[u8]) -> u64 {
    xxh3_64_with_seed(bytes, index)
}

/// The checksum's text from the sum of a file's block digests.
pub(crate) fn text(sum: u64) -> String {
    format!("{sum:016x}")
}

/// The block index of byte `offset`.
pub(crate) fn block_of(offset: u64) -> u64 {
    offset / BLOCK
}

/// The bytes `[start, end)` of block `index` in a file of `size` bytes (the last block is
/// shorter).
pub(crate) fn block_span(index: u64, size: u64) -> (u64, u64) {
    (index * BLOCK, ((index + 1) * BLOCK).min(size))
}

/// The sum of the digests of blocks `[first, end)` of `f`, a file of `size` bytes, read back in
/// [`READ_STEP`]s into `buf`. `stop` is asked between steps; when it says yes this ends with
/// [`io::ErrorKind::Interrupted`]. A file shorter than `size` is an error (`UnexpectedEof`).
pub(crate) fn read_blocks(
    f: &File,
    size: u64,
    (first, end): (u64, u64),
    buf: &mut Vec<u8>,
    stop: &dyn Fn() -> bool,
) -> io::Result<u64> {
    buf.resize(READ_STEP, 0);
    let mut sum = 0u64;
    let mut at = first * BLOCK;
    let end = (end * BLOCK).min(size);
    while at < end {
        if stop() {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let bytes = &mut buf[..(end - at).min(READ_STEP as u64) as usize];
        f.read_exact_at(bytes, at)?;
        for (i, b) in bytes.chunks(BLOCK as usize).enumerate() {
            sum = sum.wrapping_add(block(block_of(at) + i as u64, b));
        }
        at += bytes.len() as u64;
    }
    Ok(sum)
}

/// The checksum of an open file, read from its start.
pub(crate) fn of_open(f: &File, stop: &dyn Fn() -> bool) -> io::Result<String> {
    let size = f.metadata()?.len();
    read_blocks(f, size, (0, size.div_ceil(BLOCK)), &mut Vec::new(), stop).map(text)
}

/// The checksum of the file at `path` (the tests' reference).
#[cfg(test)]
fn of_file(path: &Path) -> io::Result<String> {
    of_open(&File::open(path)?, &|| false)
}

/// XXH3-64 of the whole file at `path`, hex: the checksum in manifests written before
/// [`BLOCK`]s (`xxh3`), still checked when a folder has one.
pub(crate) fn whole_file_xxh3(path: &Path) -> io::Result<String> {
    let f = File::open(path)?;
    let mut h = xxhash_rust::xxh3::Xxh3::new();
    let mut buf = vec![0u8; READ_STEP];
    let mut at = 0u64;
    loop {
        let n = match f.read_at(&mut buf, at) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        h.update(&buf[..n]);
        at += n as u64;
    }
    Ok(text(h.digest()))
}

/// The digest of block `index` when it is `len` zeros (at most [`BLOCK`]), without a zeroed
/// buffer per call.
pub(crate) fn zero_block(index: u64, len: u64) -> u64 {
    static ZEROS: [u8; BLOCK as usize] = [0; BLOCK as usize];
    block(index, &ZEROS[..len as usize])
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    /// The definition, written out: every block hashed with its index as seed, summed.
    fn by_definition(data: &[u8]) -> String {
        let sum = data
            .chunks(BLOCK as usize)
            .enumerate()
            .fold(0u64, |s, (i, b)| {
                s.wrapping_add(xxh3_64_with_seed(b, i as u64))
            });
        text(sum)
    }

    #[test]
    fn file_checksum_follows_the_definition_at_block_edges() {
        let dir = std::env::temp_dir().join(format!("wload-checksum-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let b = BLOCK as usize;
        for len in [
            0,
            1,
            b - 1,
            b,
            b + 1,
            READ_STEP - 1,
            READ_STEP,
            READ_STEP + 7,
            3 * READ_STEP + b,
        ] {
            let data: Vec<u8> = (0..len).map(|i| (i * 131 % 251) as u8).collect();
            let p = dir.join(format!("f{len}"));
            std::fs::File::create(&p).unwrap().write_all(&data).unwrap();
            assert_eq!(of_file(&p).unwrap(), by_definition(&data), "{len} bytes");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn moving_a_block_changes_the_checksum() {
        let b = BLOCK as usize;
        let mut data = vec![1u8; 2 * b];
        data[..b].fill(2);
        let swapped: Vec<u8> = data[b..].iter().chain(&data[..b]).copied().collect();
        assert_ne!(by_definition(&data), by_definition(&swapped));
        assert_eq!(zero_block(3, BLOCK), xxh3_64_with_seed(&vec![0u8; b], 3));
        assert_eq!(zero_block(4, 7), xxh3_64_with_seed(&[0u8; 7], 4));
    }
}
