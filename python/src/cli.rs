//! The `wload` command inside the extension: the wheel's `wload` console script
//! (`wload/_cli.py`) runs the same Rust code as cargo's binary, so that one wheel is the whole
//! tool, with no second binary built, shipped or found on `PATH`.

use std::ffi::OsString;

use pyo3::prelude::*;

/// Runs the command line `argv` (the program's name first, as `sys.argv`) as the `wload` binary
/// would, writing to the process's stdout and stderr, and returns its exit status. Once per
/// process, and only from the console script: it may install wload's own SIGINT, SIGTERM and
/// SIGHUP handlers, and a second signal ends the process.
#[pyfunction]
pub(crate) fn main(py: Python<'_>, argv: Vec<OsString>) -> u8 {
    // A command runs for minutes and calls no Python: other threads keep the interpreter.
    py.detach(|| wload::app::run(argv))
}
