//! Test hooks: environment variables that change what the engine does, read only by builds with
//! the `test-hooks` feature. The integration tests get that feature through the crate's
//! dev-dependency on itself; `cargo build`, `cargo build --release` and `cargo install` never
//! enable it, so a shipped binary neither reads these variables nor contains their names.

/// `WLOAD_TEST_CHUNK_BYTES=N`: the engine reads sources `N` bytes at a time instead of
/// [`super::CHUNK_BYTES`], so that the tiny golden fixtures cross chunk boundaries everywhere.
#[cfg(feature = "test-hooks")]
pub fn chunk_bytes() -> Option<u64> {
    let v = std::env::var("WLOAD_TEST_CHUNK_BYTES").ok()?;
    // A typo must not quietly test the default chunk size instead.
    match v.trim().parse::<u64>() {
        Ok(n) if n > 0 => Some(n),
        _ => panic!("WLOAD_TEST_CHUNK_BYTES={v:?}: expected a byte count of at least 1"),
    }
}

#[cfg(not(feature = "test-hooks"))]
pub fn chunk_bytes() -> Option<u64> {
    None
}

/// `WLOAD_TEST_SLOT_BYTES=N`: CUDA staging slots of `N` bytes instead of 16 MiB, so that the stub
/// driver's tests send every tensor through several slots and reuse each many times.
#[cfg(feature = "test-hooks")]
pub fn slot_bytes() -> Option<usize> {
    let v = std::env::var("WLOAD_TEST_SLOT_BYTES").ok()?;
    match v.trim().parse::<usize>() {
        Ok(n) if n > 0 => Some(n),
        _ => panic!("WLOAD_TEST_SLOT_BYTES={v:?}: expected a byte count of at least 1"),
    }
}

#[cfg(not(feature = "test-hooks"))]
pub fn slot_bytes() -> Option<usize> {
    None
}
