//! Helpers shared by the integration tests: the one way to run the binary and to check a refusal
//! (`run`), the golden fixtures (`golden`) and the cases kept as digests (`digests`), a safetensors writer/reader independent of the crate
//! (`safetensors`), every tensor of an output rank or a checkpoint (`tensors`), small generated
//! checkpoints (`checkpoints`), NVFP4 codes and reassembly (`fp4`), and how a test whose environment is missing is skipped or, in CI,
//! failed.

mod checkpoints;
mod digests;
mod fp4;
mod golden;
mod refusals;
mod run;
mod s3;
mod safetensors;
mod schemas;
mod tensors;

use std::path::Path;

pub(crate) use checkpoints::*;
pub(crate) use digests::*;
pub(crate) use fp4::*;
pub(crate) use golden::*;
pub(crate) use refusals::*;
pub(crate) use run::*;
pub(crate) use s3::*;
pub(crate) use safetensors::*;
pub(crate) use schemas::{assert_schema, schema_errors};
pub(crate) use tensors::*;

/// The path as a `&str`, for command lines.
pub(crate) fn s(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

/// Whether this run is CI (`CI` set, and not `false` or `0`): there every test that needs root or a
/// toolchain must really run, so a missing environment is a failure, not a skip.
pub(crate) fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "false" | "0"))
}

/// `test` cannot run because its environment (root, a tool, a kernel feature) is missing: `why`.
/// In CI that fails the test; elsewhere the skip is printed and the caller returns. Not for tests
/// that can never run in CI (a real GPU): those call [`skipped`] directly.
pub(crate) fn missing_environment(test: &str, why: &str) {
    if in_ci() {
        panic!("{test}: {why}; CI must provide this (CI is set, so this is not skipped)");
    }
    skipped(test, why);
}

/// Prints `SKIPPED: <test>: <why>` where `cargo test` shows it: straight to stderr, because the
/// harness swallows `eprintln!` output of tests that pass.
pub(crate) fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {why}");
}

/// CPU time of the calling thread: unlike wall time, not inflated while other processes (or
/// other tests) hold the cores.
pub(crate) fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

/// The manifest's checksum of `bytes` (`xxh3_64k`), written out from its definition in
/// docs/shard-json.md rather than taken from wload: every 64 KiB block's XXH3-64 with the
/// block's index as seed, summed modulo 2^64, as 16 hex digits.
pub(crate) fn block_checksum(bytes: &[u8]) -> String {
    let sum = bytes.chunks(64 << 10).enumerate().fold(0u64, |s, (i, b)| {
        s.wrapping_add(xxhash_rust::xxh3::xxh3_64_with_seed(b, i as u64))
    });
    format!("{sum:016x}")
}
