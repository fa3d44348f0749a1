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
    let mut serve = crate::sharded::manifest::ServeCommand::new(out, manifest, auto_dtype.as_str());
    if crate::resolve::store::url::looks_like_url(&out.to_string_lossy()) {
        // vLLM reads a sharded_state folder in object storage through Run:ai's streamer
        // (`pip install vllm[runai]`), with the store's own variables (AWS_*).
        let from = "sharded_state";
        let to = "runai_streamer_sharded";
        for a in &mut serve.argv {
            if a == from {
                *a = to.to_string();
            }
        }
        serve.shell = serve.shell.replace(
            &format!("--load-format {from}"),
            &format!("--load-format {to}"),
        );
        // The model is the URL as written, not a local path made of it.
        if let Some(model) = serve.argv.get_mut(2) {
            let local = crate::sharded::serve::shell_quote(model);
            *model = out.to_string_lossy().into_owned();
            serve.shell =
                serve
                    .shell
                    .replacen(&local, &crate::sharded::serve::shell_quote(model), 1);
        }
    }
    serve
}
