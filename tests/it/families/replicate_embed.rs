//! `VLLM_REPLICATE_EMBED` (vLLM 0.33's DSA CUDA tree, layers/fused_embed_norm.py:39–71): the whole
//! 64-padded embedding on every rank, `lm_head` still vocab-parallel, everything else as without
//! it (vllm-spec §12.5, checked there against real vLLM on glm5_fp8 at tp2). wload reads the
//! variable as vLLM does (envs.py:639–641: `"1"` or `"true"`, any case, spaces stripped),
//! records it in wload.json and the serve line, and `load` takes it from there.

use std::path::Path;

use serde_json::Value;
use tempfile::TempDir;

use crate::support::*;

const VAR: &str = "VLLM_REPLICATE_EMBED";
const EMBED: &str = "model.embed_tokens.weight";

/// `wload ARGS…` with `VLLM_REPLICATE_EMBED=value`.
fn with_var(value: &str, args: &[&str]) -> std::process::Output {
    wload()
        .env(VAR, value)
        .args(args)
        .output()
        .expect("wload runs")
}

fn embed_shape(value: &str, dir: &Path) -> Value {
    let out = with_var(value, &["plan", s(dir), "--tp", "2", "--json"]);
    assert!(out.status.success(), "{}", context(&out));
    let plan: Value = json_doc(&["plan"], &out);
    let t = plan["ranks"][0]["tensors"].as_array().unwrap();
    let embed = t
        .iter()
        .find(|t| t["name"] == EMBED)
        .expect("the embedding");
    let head = t
        .iter()
        .find(|t| t["name"] == "lm_head.weight")
        .expect("lm_head");
    assert_eq!(
        head["shape"],
        serde_json::json!([160, 128]),
        "lm_head stays vocab-parallel"
    );
    embed["shape"].clone()
}

/// Read as vLLM reads it: on for `1` and `true` in any case with spaces around, off otherwise.
#[test]
fn the_variable_is_read_as_vllm_reads_it() {
    let f = fixture("glm5_fp8");
    for on in ["1", "true", "TRUE", " True "] {
        assert_eq!(embed_shape(on, &f), serde_json::json!([320, 128]), "{on:?}");
    }
    for off in ["0", "", "false", "yes", "on", "2"] {
        assert_eq!(
            embed_shape(off, &f),
            serde_json::json!([160, 128]),
            "{off:?}"
        );
    }
}

/// Shard at tp2 with it: vLLM's own glm5_fp8/tp2 bytes for every tensor but the embedding,
/// which is the checkpoint's whole table plus 20 zero rows on each rank; wload.json and the
/// serve line say it, and `load` / `inspect` of the folder take it from there.
#[test]
fn glm5_fp8_with_the_whole_embedding_on_every_rank() {
    let case = golden_cases()
        .into_iter()
        .find(|c| c.name == "glm5_fp8/tp2")
        .expect("the golden case");
    let vllm = materialized(&case);
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    let run = with_var(
        "1",
        &["shard", s(&case.fixture), "--tp", "2", "-o", s(&out)],
    );
    assert!(run.status.success(), "{}", context(&run));
    let src = checkpoint_tensors(&case.fixture);
    let table = &src[EMBED];
    for r in 0..2 {
        let (got, want) = (rank_tensors(&out, r), rank_tensors(&vllm, r));
        assert_eq!(
            got.keys().collect::<Vec<_>>(),
            want.keys().collect::<Vec<_>>()
        );
        for (name, t) in &got {
            if name != EMBED {
                assert_eq!(t, &want[name], "rank {r} {name}");
            }
        }
        let e = &got[EMBED];
        assert_eq!(
            (e.dtype.as_str(), e.shape.as_slice()),
            ("BF16", &[320u64, 128][..])
        );
        assert_eq!(e.rows(0, 300), &table.data[..], "rank {r}: the whole table");
        assert!(
            e.rows(300, 320).iter().all(|&b| b == 0),
            "rank {r}: padding rows zero"
        );
    }
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(out.join("wload.json")).unwrap()).unwrap();
    assert_eq!(manifest["replicate_embed"], true);
    assert_eq!(manifest["serve"]["env"][VAR], "1");
    let line = manifest["serve"]["shell"].as_str().unwrap();
    assert!(
        line.starts_with("VLLM_REPLICATE_EMBED=1 vllm serve "),
        "{line}"
    );
    assert!(
        stdout(&run).contains(line) || stderr(&run).contains(line),
        "{}",
        context(&run)
    );

    // load takes it from wload.json, without the variable.
    let load = run_ok(&["load", s(&out), "--dry-run", "--read"]);
    assert!(
        stderr(&load).contains("VLLM_REPLICATE_EMBED=1 --dtype bfloat16 taken from"),
        "{}",
        context(&load)
    );
    // inspect prints the serve line with it, text and JSON.
    let inspect = run_ok(&["inspect", s(&out)]);
    assert!(stdout(&inspect).contains(line), "{}", context(&inspect));
    let j = wload_json(&["inspect", s(&out), "--json"]);
    assert_eq!(j["serve"]["env"][VAR], "1", "{j}");
    // A folder without it, loaded with the variable set, is refused naming the embedding.
    let plain = tmp.path().join("plain");
    shard_ok(&case.fixture, 2, &plain, &[]);
    let refused = with_var("1", &["load", s(&plain), "--dry-run"]);
    assert_refusal_text(
        &refused,
        3,
        &[
            "'model.embed_tokens.weight' has shape [160, 128]",
            "needs [320, 128]",
        ],
    );
}

/// A family whose state does not depend on it (Llama) is planned, recorded and served as
/// without it, as vLLM ignores it there.
#[test]
fn a_family_that_does_not_read_it_records_nothing() {
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    let run = with_var(
        "1",
        &[
            "shard",
            s(&fixture("llama_gqa")),
            "--tp",
            "2",
            "-o",
            s(&out),
        ],
    );
    assert!(run.status.success(), "{}", context(&run));
    let text = std::fs::read_to_string(out.join("wload.json")).unwrap();
    assert!(
        !text.contains("replicate_embed") && !text.contains(VAR),
        "{text}"
    );
}

fn run_ok(args: &[&str]) -> std::process::Output {
    let out = run(args);
    assert!(out.status.success(), "wload {args:?}: {}", context(&out));
    out
}
