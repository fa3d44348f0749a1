//! The `wload` binary: the command itself is the library's [`wload::app::run`], which the Python
//! package's `wload` console script calls too, so that both are one program.

use std::process::ExitCode;

fn main() -> ExitCode {
    ExitCode::from(wload::app::run(std::env::args_os()))
}
