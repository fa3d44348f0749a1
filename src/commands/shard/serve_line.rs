//! The serve line a shard output records: vLLM's `sharded_state` loader for a folder, Run:ai's
//! streamer (`runai_streamer_sharded`) for an output in object storage.

use std::path::Path;

use crate::plan::Plan;
use crate::sharded::manifest::Manifest;

/// The `vllm serve` command for OUT. Its `--dtype` is needed when vLLM's `auto` would pick
/// another: from OUT's config, or without a dtype there, from its rank files' dtypes.
pub(super) fn serve_command(
    out: &Path,
    manifest: &Manifest,
    plan: &Plan,
    config: &crate::config::ModelConfig,
) -> crate::sharded::manifest::ServeCommand {
    let written = (plan.ranks.iter()).flat_map(|r| r.tensors.iter().map(|t| t.dtype));
    let auto_dtype = crate::dtype::resolve_dtype(
        crate::dtype::DtypeChoice::Auto,
        config.dtype.as_deref(),
        written,
    );
    let serve = crate::sharded::manifest::ServeCommand::new(out, manifest, auto_dtype.as_str());
    let url = out.to_string_lossy();
    if crate::resolve::store::url::looks_like_url(&url) {
        return serve.in_store(&url);
    }
    serve
}
