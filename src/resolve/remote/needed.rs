//! Which files a run needs from a remote source, and in what order they are fetched: the same for
//! every remote. Selection follows vLLM's exactly: [`crate::resolve::resolve_listing`] runs over
//! the remote's file list, with the index ([`crate::resolve::index_to_read`], fetched first)
//! dropping the shards it does not name; only then are the kept weight files (or, for a command
//! that reads no tensor data, their headers) and the config fetched.

use super::{FetchOptions, Snapshot};
use crate::resolve::local::Listing;
use crate::resolve::{ResolveError, Resolved, Want};

/// Selects as vLLM would, fetching first what selection reads (the index decides which weight
/// files are needed), then the config and the selected files (or their headers), and the side
/// files when the command copies them. Returns the resolution of the snapshot's folder and
/// whether it is pre-sharded (only with [`Want::Detect`]).
pub(crate) fn select_and_fetch(
    snap: &mut dyn Snapshot,
    opts: &FetchOptions,
    want: Want,
) -> Result<(Resolved, bool), ResolveError> {
    let folder = snap.folder().to_path_buf();
    let listing = snap.listing();
    let top = |keep: fn(&str) -> bool| -> Vec<String> {
        listing.top.iter().filter(|f| keep(f)).cloned().collect()
    };
    let side = if opts.side_files {
        top(is_side_file)
    } else {
        Vec::new()
    };
    let rank_files = top(is_rank_file);
    if want == Want::Detect && !rank_files.is_empty() {
        // What the loader of a pre-sharded folder reads besides the rank files.
        let (_, config) = crate::resolve::pick_config(&folder, listing, opts.config_format, false)?;
        let mut needed = rank_files;
        needed.push(config);
        needed.extend(quant_config(listing));
        // Every run record: wload.json, and those of `--ranks` runs uploaded together.
        needed.extend(
            (listing.top.iter())
                .filter(|n| crate::sharded::runs::is_record(n))
                .cloned(),
        );
        needed.extend(side);
        snap.fetch(&needed)?;
        return Ok((
            crate::resolve::resolve_pre_sharded(&folder, opts.config_format)?,
            true,
        ));
    }
    if let Some(index) = crate::resolve::index_to_read(listing, opts.load_format) {
        let index = [index.to_string()];
        snap.fetch(&index)?;
    }
    let listing = snap.listing();
    let r =
        crate::resolve::resolve_listing(&folder, listing, opts.load_format, opts.config_format)?;
    let mut needed = if opts.headers_only {
        Vec::new()
    } else {
        r.file_names()
    };
    needed.push(r.config_file.clone());
    needed.extend(quant_config(listing));
    needed.extend(side);
    snap.fetch(&needed)?;
    if opts.headers_only {
        snap.fetch_headers(&r.file_names())?;
    }
    Ok((r, false))
}

/// `hf_quant_config.json` when the source has it: vLLM reads the quantization config from it
/// when config.json has none, so every command needs it, not only `shard`'s side files.
fn quant_config(listing: &Listing) -> Option<String> {
    let name = crate::config::HF_QUANT_CONFIG;
    listing.has_top(name).then(|| name.to_string())
}

/// A top-level file of a source that is not weights: config, tokenizer, generation config,
/// index, chat templates, README and licence. What `shard` copies next to the per-rank files, and
/// what vLLM's own snapshot holds beside the weights. Dotfiles (`.gitattributes`) are left out,
/// and so is anything in a subfolder (vLLM ignores `original/**` and reads only the top level).
fn is_side_file(name: &str) -> bool {
    // Not vLLM's exact, case-sensitive test: `MODEL.BIN` is not fetched as a side file either.
    !name.contains('/')
        && !name.starts_with('.')
        && crate::resolve::select::weight_kind(&name.to_ascii_lowercase()).is_none()
}

/// A part file `load` reads from a pre-sharded folder, of either pattern (`--pp` says which one
/// it expects, and the folder is checked against it).
pub(crate) fn is_rank_file(name: &str) -> bool {
    crate::sharded::names::RankFile::parse(name).is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn side_files_are_top_level_non_weights() {
        for yes in [
            "config.json",
            "generation_config.json",
            "tokenizer.json",
            "tokenizer.model",
            "tokenizer_config.json",
            "params.json",
            "chat_template.jinja",
            "model.safetensors.index.json",
            "README.md",
        ] {
            assert!(is_side_file(yes), "{yes}");
        }
        for no in [
            "model.safetensors",
            "pytorch_model.bin",
            "consolidated.pth",
            "model.gguf",
            "tf_model.h5",
            "flax_model.msgpack",
            ".gitattributes",
            "original/params.json",
        ] {
            assert!(!is_side_file(no), "{no}");
        }
    }

    #[test]
    fn rank_files_match_the_loader() {
        assert!(is_rank_file("model-rank-0-part-0.safetensors"));
        assert!(is_rank_file("model-rank-12-part-3.safetensors"));
        assert!(!is_rank_file("model-rank-a-part-0.safetensors"));
        assert!(!is_rank_file("model-rank-0-part-.safetensors"));
        assert!(!is_rank_file("model-00001-of-00002.safetensors"));
        // Pipeline-parallel files make a pre-sharded repo too (loaded with --pp).
        assert!(is_rank_file("model-pp-0-tp-0-part-0.safetensors"));
        assert!(!is_rank_file("model-pp-0-tp-00-part-0.safetensors"));
    }
}
