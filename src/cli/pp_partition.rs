//! [`PpPartitionArg`]: `VLLM_PP_LAYER_PARTITION`, read by clap with the command line.

use std::ffi::OsString;

use clap::Args;

/// `VLLM_PP_LAYER_PARTITION`, which vLLM reads from its environment (vllm/envs.py) and so does
/// wload: clap reads it with the rest of the command line, as the hidden argument
/// [`PpPartitionArg::arg`] of the subcommands in [`PpPartitionArg::SUBCOMMANDS`].
///
/// The argument is added by [`Cli::parse_args`] only, not by `Cli::command()`: clap_complete
/// lists hidden flags too, and the completions and man pages describe the command line people
/// type. Empty counts as set, as in vLLM's `os.getenv`; a value that is not UTF-8 as unset.
#[derive(Debug, Clone, Default)]
pub struct PpPartitionArg(Option<OsString>);

impl PpPartitionArg {
    pub(super) const ID: &str = "vllm_pp_layer_partition";

    /// The subcommands that plan, so the ones that read the variable.
    pub const SUBCOMMANDS: [&str; 4] = ["plan", "shard", "sizes", "load"];

    /// The partition as the planner takes it: `None` when unset or not UTF-8.
    pub fn get(&self) -> Option<String> {
        self.0.clone()?.into_string().ok()
    }

    /// The hidden argument, set from the environment (or as `--vllm-pp-layer-partition`).
    pub fn arg() -> clap::Arg {
        clap::Arg::new(Self::ID)
            .long("vllm-pp-layer-partition")
            .env(crate::ranks::stages::PP_PARTITION_VAR)
            .hide(true)
            .value_parser(clap::value_parser!(OsString))
    }
}

/// Nothing to add to `Cli::command()` (see [`PpPartitionArg`]); the value is read from the
/// matches when [`Cli::parse_args`] added the argument.
impl Args for PpPartitionArg {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        cmd
    }
}

impl clap::FromArgMatches for PpPartitionArg {
    fn from_arg_matches(m: &clap::ArgMatches) -> Result<Self, clap::Error> {
        let value = m.try_get_one::<OsString>(Self::ID).ok().flatten();
        Ok(PpPartitionArg(value.cloned()))
    }
    fn update_from_arg_matches(&mut self, m: &clap::ArgMatches) -> Result<(), clap::Error> {
        *self = Self::from_arg_matches(m)?;
        Ok(())
    }
}
