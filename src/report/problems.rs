//! A refused plan's problems for `--json`: every one, complete, on stdout (the terminal gets the
//! summary that [`crate::plan::ProblemList`] writes).

use std::io::{self, Write};

use crate::plan::{PlanError, ProblemsReport, SCHEMA_VERSION};

/// With `--json`, a refused plan's problems also go to stdout, every one, while stderr gets the
/// summary. Returns `e`: the refusal stays the result whether or not its JSON copy could be
/// written, so that a closed pipe cannot turn exit 3 into a quiet success.
pub fn json_problems(out: &mut dyn Write, json: bool, e: crate::Error) -> crate::Error {
    if json && let Some(doc) = problems_report(&e) {
        let _ = serde_json::to_writer_pretty(&mut *out, &doc)
            .map_err(io::Error::from)
            .and_then(|()| writeln!(out))
            .and_then(|()| out.flush());
    }
    e
}

/// The report for an error that is a list of problems; `None` for any other error.
fn problems_report(e: &crate::Error) -> Option<ProblemsReport<'_>> {
    match e {
        crate::Error::Plan(PlanError::Invalid(ps)) => Some(ProblemsReport {
            schema_version: SCHEMA_VERSION,
            wload_version: env!("CARGO_PKG_VERSION"),
            exit_status: e.exit_status() as u8,
            problem_count: ps.len(),
            problems: ps,
        }),
        _ => None,
    }
}
