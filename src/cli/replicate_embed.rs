//! [`ReplicateEmbedArg`]: `VLLM_REPLICATE_EMBED`, read by clap with the command line.

use std::ffi::OsString;

use clap::Args;

/// `VLLM_REPLICATE_EMBED`, which vLLM 0.33 reads from its environment (vllm/envs.py:639–641:
/// `os.getenv("VLLM_REPLICATE_EMBED", "0").strip().lower() in ("1", "true")`) and so does
/// wload: the DSA CUDA tree (DeepSeek-V3.2, GLM-5) then holds the whole padded embedding on
/// every rank (layers/fused_embed_norm.py:39–71). Read like [`super::PpPartitionArg`]: a hidden
/// argument of the same subcommands, added by `Cli::parse_args` only.
#[derive(Debug, Clone, Default)]
pub struct ReplicateEmbedArg(Option<OsString>);

impl ReplicateEmbedArg {
    pub(super) const ID: &str = "vllm_replicate_embed";

    /// Whether the variable is on as vLLM reads it; a value that is not UTF-8 is off.
    pub fn get(&self) -> bool {
        (self.0.as_ref().and_then(|v| v.to_str()))
            .is_some_and(crate::ranks::embed::replicate_embed_on)
    }

    /// The hidden argument, set from the environment (or as `--vllm-replicate-embed`).
    pub fn arg() -> clap::Arg {
        clap::Arg::new(Self::ID)
            .long("vllm-replicate-embed")
            .env(crate::ranks::embed::REPLICATE_EMBED_VAR)
            .hide(true)
            .value_parser(clap::value_parser!(OsString))
    }
}

/// Nothing to add to `Cli::command()` (see [`ReplicateEmbedArg`]).
impl Args for ReplicateEmbedArg {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        cmd
    }
}

impl clap::FromArgMatches for ReplicateEmbedArg {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let value = m.try_get_one::<OsString>(Self::ID).ok().flatten();
        Ok(ReplicateEmbedArg(value.cloned()))
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}
