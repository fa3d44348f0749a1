//! vLLM's sharded_state folder, written and read in one place: the rank files' names
//! ([`names`]), wload's manifest beside them ([`manifest`], one record per `--ranks` run: [`runs`]) and the `vllm serve` line that loads
//! them ([`serve`]). Another engine's on-disk layout would be a sibling of this folder.

pub mod layers;
pub mod manifest;
pub mod names;
pub mod runs;
pub mod serve;
pub mod source;
