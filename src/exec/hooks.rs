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

/// `WLOAD_TEST_AT_EXECUTE=CMD` and `WLOAD_TEST_AT_READ=CMD`: `sh -c CMD` runs once per process
/// when the engine starts (the plan made, no source opened yet) or once its sources are open and
/// before a byte of tensor data is read, so that tests can change a source at exactly that point
/// (replace it, rewrite it, cut it short) instead of racing a running copy.
#[cfg(feature = "test-hooks")]
pub fn at(point: Point) {
    use std::sync::Once;
    static ONCE: [Once; 2] = [Once::new(), Once::new()];
    let (i, var) = match point {
        Point::Execute => (0, "WLOAD_TEST_AT_EXECUTE"),
        Point::Read => (1, "WLOAD_TEST_AT_READ"),
    };
    let Ok(cmd) = std::env::var(var) else { return };
    ONCE[i].call_once(|| {
        let status = std::process::Command::new("sh")
            .arg("-c")
            .arg(&cmd)
            .status();
        // A hook that did not run would test nothing.
        match status {
            Ok(s) if s.success() => {}
            other => panic!("{var}={cmd:?}: {other:?}"),
        }
    });
}

#[cfg(not(feature = "test-hooks"))]
pub fn at(_point: Point) {}

/// Where [`at`] runs.
#[derive(Debug, Clone, Copy)]
pub enum Point {
    Execute,
    Read,
}
