//! Refusals and what must never happen: errors, writes outside OUT, changing sources, fuzzing.

mod errors;
mod fuzz;
mod out_safety;
mod plan_errors;
mod source_changes;
mod terminal;
