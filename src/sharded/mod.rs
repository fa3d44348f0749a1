//! vLLM's sharded_state folder, written and read in one place: the rank files' names
//! ([`names`]), wload's manifest beside them ([`manifest`], one record per `--ranks` run: [`runs`]) and the `vllm serve` line that loads
//! them ([`serve`]). Another engine's on-disk layout would be a sibling of this folder.

pub(crate) mod layers;
pub(crate) mod manifest;
pub(crate) mod names;
pub(crate) mod runs;
pub(crate) mod serve;
pub(crate) mod source;
