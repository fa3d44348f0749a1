//! Test hooks: environment variables that change what the engine does, read only by builds with
//! the `test-hooks` feature. The integration tests get that feature through the crate's
//! dev-dependency on itself; `cargo build`, `cargo build --release` and `cargo install` never
//! enable it, so a shipped binary neither reads these variables nor contains their names.

/// `WLOAD_TEST_CHUNK_BYTES=N`: the engine reads sources `N` bytes at a time instead of
/// [`super::CHUNK_BYTES`], so that the tiny golden fixtures cross chunk boundaries everywhere.
#[cfg(feature = "test-hooks")]
pub(crate) fn chunk_bytes() -> Option<u64> {
    let v = std::env::var("WLOAD_TEST_CHUNK_BYTES").ok()?;
    // A typo must not quietly test the default chunk size instead.
    match v.trim().parse::<u64>() {
        Ok(n) if n > 0 => Some(n),
        _ => panic!("WLOAD_TEST_CHUNK_BYTES={v:?}: expected a byte count of at least 1"),
    }
}

#[cfg(not(feature = "test-hooks"))]
pub(crate) fn chunk_bytes() -> Option<u64> {
    None
}

/// `WLOAD_TEST_SLOT_BYTES=N`: CUDA staging slots of `N` bytes instead of 16 MiB, so that the stub
/// driver's tests send every tensor through several slots and reuse each many times.
#[cfg(feature = "test-hooks")]
pub(crate) fn slot_bytes() -> Option<usize> {
    let v = std::env::var("WLOAD_TEST_SLOT_BYTES").ok()?;
    match v.trim().parse::<usize>() {
        Ok(n) if n > 0 => Some(n),
        _ => panic!("WLOAD_TEST_SLOT_BYTES={v:?}: expected a byte count of at least 1"),
    }
}

#[cfg(not(feature = "test-hooks"))]
pub(crate) fn slot_bytes() -> Option<usize> {
    None
}

/// `WLOAD_TEST_AT_EXECUTE=CMD` and `WLOAD_TEST_AT_READ=CMD`: `sh -c CMD` runs each time the
/// engine starts (the plan made, no source opened yet), or once its sources are open and before
/// a byte of tensor data is read, so that tests can change a source at exactly that point
/// (replace it, rewrite it, cut it short) instead of racing a running copy. `WLOAD_TEST_RUN` in
/// the command's environment counts the engine runs of the process from 1 (a shard's write is
/// 1, its `--verify` 2).
#[cfg(feature = "test-hooks")]
pub(crate) fn at(point: Point) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static RUNS: AtomicUsize = AtomicUsize::new(0);
    let (var, run) = match point {
        Point::Execute => (
            "WLOAD_TEST_AT_EXECUTE",
            RUNS.fetch_add(1, Ordering::SeqCst) + 1,
        ),
        Point::Read => ("WLOAD_TEST_AT_READ", RUNS.load(Ordering::SeqCst)),
        Point::Hash => ("WLOAD_TEST_AT_HASH", RUNS.load(Ordering::SeqCst)),
    };
    let Ok(cmd) = std::env::var(var) else { return };
    let status = std::process::Command::new("sh")
        .arg("-c")
        .arg(&cmd)
        .env("WLOAD_TEST_RUN", run.to_string())
        .status();
    // A hook that did not run would test nothing.
    match status {
        Ok(s) if s.success() => {}
        other => panic!("{var}={cmd:?}: {other:?}"),
    }
}

#[cfg(not(feature = "test-hooks"))]
pub(crate) fn at(_point: Point) {}

/// Where [`at`] runs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Point {
    Execute,
    Read,
    /// `load --dry-run --read`: the headers checked, before the files are hashed
    /// (`WLOAD_TEST_AT_HASH`).
    Hash,
}
