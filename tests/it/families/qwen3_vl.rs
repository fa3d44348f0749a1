//! Qwen3-VL (`Qwen3VLForConditionalGeneration`) under vLLM's multimodal flags, on the golden
//! fixture: `--mm-encoder-tp-mode data` puts every vision tensor whole on every rank (spec §11.1,
//! `qwen3_vl__mmdata`: the checkpoint's tensors, fused qkv as stored, same key set, text as in
//! the default mode); `--language-model-only` holds no `visual.*` key and the same text; the
//! vision tower's TP checks are vLLM's and apply only when it is split.

use std::path::Path;

use serde_json::Value;
use tempfile::TempDir;

use crate::support::*;

const CASE: &str = "qwen3_vl";

fn sharded(dir: &Path, name: &str, flags: &[&str]) -> std::path::PathBuf {
    let out = dir.join(name);
    let mut all = vec!["-q"];
    all.extend_from_slice(flags);
    shard_ok(&fixture(CASE), 2, &out, &all);
    out
}

fn keys(t: &Tensors) -> Vec<&String> {
    t.keys().collect()
}

#[test]
fn data_mode_holds_the_whole_tower_on_every_rank() {
    let tmp = TempDir::new().unwrap();
    let weights = sharded(tmp.path(), "weights", &[]);
    let data = sharded(tmp.path(), "data", &["--mm-encoder-tp-mode", "data"]);
    let ckpt = checkpoint_tensors(&fixture(CASE));
    for r in 0..2 {
        let (w, d) = (rank_tensors(&weights, r), rank_tensors(&data, r));
        assert_eq!(keys(&w), keys(&d), "rank {r}: same key set in both modes");
        let mut visual = 0;
        for (name, t) in &d {
            match name.strip_prefix("visual.") {
                Some(rest) => {
                    let src = &ckpt[&format!("model.visual.{rest}")];
                    assert_eq!(t.shape, src.shape, "rank {r} {name}");
                    assert!(
                        t.data == src.data,
                        "rank {r} {name}: the checkpoint's tensor"
                    );
                    visual += 1;
                }
                None => assert!(
                    t.data == w[name].data,
                    "rank {r} {name}: text as in weights mode"
                ),
            }
        }
        assert_eq!(visual, 39, "rank {r}: every vision tensor (spec §11.1)");
    }
    // The split mode really splits: rank 0's qkv is a third of the heads' rows each.
    let w0 = rank_tensors(&weights, 0);
    assert_eq!(w0["visual.blocks.0.attn.qkv.weight"].shape, [96, 64]);
    let m: Value =
        serde_json::from_slice(&std::fs::read(data.join("wload.json")).unwrap()).unwrap();
    assert_eq!(m["mm_encoder_tp_mode"], "data");
}

#[test]
fn language_model_only_holds_no_tower_and_the_same_text() {
    let tmp = TempDir::new().unwrap();
    let weights = sharded(tmp.path(), "weights", &[]);
    let lm = sharded(tmp.path(), "lm", &["--language-model-only"]);
    for r in 0..2 {
        let (w, l) = (rank_tensors(&weights, r), rank_tensors(&lm, r));
        assert!(
            l.keys().all(|k| !k.starts_with("visual.")),
            "rank {r}: {:?}",
            keys(&l)
        );
        let text: Vec<&String> = w.keys().filter(|k| !k.starts_with("visual.")).collect();
        assert_eq!(keys(&l), text, "rank {r}");
        for (name, t) in &l {
            assert!(t.data == w[name].data, "rank {r} {name}");
        }
    }
    let plan = clean_plan_json(&fixture(CASE), &["--tp", "2", "--language-model-only"]);
    let skipped = skipped_tensors(&plan, "--language-model-only");
    assert_eq!(skipped.len(), 39, "{skipped:?}");
    assert!(
        skipped.iter().all(|s| s.starts_with("model.visual.")),
        "{skipped:?}"
    );
}

/// vLLM splits the ViT's 4 heads over the ranks without falling back to data parallelism
/// (Qwen3-VL asks `is_vit_use_data_parallel()` without the head count): TP 8 is refused up front,
/// with the fix; the whole tower or no tower is fine at TP 8.
#[test]
fn a_tp_the_vision_heads_do_not_divide_is_refused_unless_the_tower_is_whole_or_absent() {
    let src = fixture(CASE);
    let refused = run(&["plan", s(&src), "--tp", "8"]);
    assert_refusal_text(
        &refused,
        3,
        &["4 is not divisible by 8", "--mm-encoder-tp-mode data"],
    );
    for flags in [
        &["--mm-encoder-tp-mode", "data"][..],
        &["--language-model-only"][..],
    ] {
        let mut args = vec!["plan", s(&src), "--tp", "8"];
        args.extend_from_slice(flags);
        let ok = run(&args);
        assert!(ok.status.success(), "{flags:?}: {}", context(&ok));
    }
    let sizes = wload_json(&["sizes", s(&src), "--max-tp", "8", "--json"]);
    let tps: Vec<u64> = sizes["accepted_tp"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(tps, [1, 2, 4], "{sizes:#}");
}

/// A folder holds the keys of the mode it was written for: loading it with another mode is
/// refused with the fix, and left out the mode comes from wload.json.
#[test]
fn a_folder_is_loaded_with_the_mode_it_was_written_for() {
    let tmp = TempDir::new().unwrap();
    let lm = sharded(tmp.path(), "lm", &["--language-model-only"]);
    let ok = run(&["load", s(&lm), "--dry-run"]);
    assert!(ok.status.success(), "{}", context(&ok));
    let weights = sharded(tmp.path(), "weights", &[]);
    let given = run(&["load", s(&weights), "--dry-run", "--language-model-only"]);
    assert_refusal_text(&given, 3, &["--language-model-only", "wload.json"]);
    let data = run(&[
        "load",
        s(&weights),
        "--dry-run",
        "--mm-encoder-tp-mode",
        "data",
    ]);
    assert_refusal_text(&data, 3, &["--mm-encoder-tp-mode data", "weights"]);
}

/// `inspect` shows the tower (what `--language-model-only` leaves out) and, for a folder, the
/// mode it was written with.
#[test]
fn inspect_shows_the_tower_and_the_mode_a_folder_was_written_with() {
    let src = fixture(CASE);
    let json = wload_json(&["inspect", s(&src), "--json"]);
    let t = &json["vision_tower"];
    assert_eq!(t["tensors"], 39, "{t:#}");
    assert_eq!(t["modules"], serde_json::json!(["visual."]), "{t:#}");
    let ckpt = checkpoint_tensors(&src);
    let bytes: usize = ckpt
        .iter()
        .filter(|(k, _)| k.starts_with("model.visual."))
        .map(|(_, v)| v.data.len())
        .sum();
    assert_eq!(t["bytes"], bytes as u64);
    let text = run(&["inspect", s(&src)]);
    assert!(stdout(&text).contains("vision tower"), "{}", context(&text));

    let tmp = TempDir::new().unwrap();
    let data = sharded(tmp.path(), "data", &["--mm-encoder-tp-mode", "data"]);
    let folder = run(&["inspect", s(&data)]);
    assert!(
        stdout(&folder).contains("--mm-encoder-tp-mode data"),
        "{}",
        context(&folder)
    );
}

/// A tower depth from a typo or a hostile config is refused at once, naming the parameter and
/// the count, as a layer count is.
#[test]
fn a_repeat_count_past_the_limit_is_refused() {
    let src = fixture(CASE);
    let over = r#"{"vision_config": {"depth": 100000}}"#;
    let refused = run(&["plan", s(&src), "--tp", "2", "--hf-overrides", over]);
    assert_refusal_text(
        &refused,
        3,
        &[
            "visual.blocks.{j}.norm1.weight",
            "100000 modules",
            "at most 4096",
        ],
    );
}
