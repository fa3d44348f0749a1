//! DeepSeek-V4 (`DeepseekV4ForCausalLM`, `DeepseekV4ForConditionalGeneration`): recognised and
//! explained, never guessed. Its saved state is platform- and GPU-specific and vLLM builds
//! neither its release format nor its CUDA tree on a CPU (vllm-spec §12.6), so every command that
//! plans refuses it with what the model is, exit 3, and nothing is ever written.

use std::path::Path;

use serde_json::Value;

use crate::support::*;

/// What every refusal says, whichever command gives it.
const WHY: &[&str] = &[
    "error: DeepseekV4ForCausalLM is DeepSeek-V4: its saved state is platform- and GPU-specific",
    "wload has no verified reference for it, so wload writes no rank files for it",
    "attn_sink",
    "SM90",
    "SM100",
    "MXFP4 experts are padded per MoE backend",
    "2 layers (+1 MTP, which vLLM drops)",
    "4 routed experts (2 per token), 1 shared",
    "FP8 block 128×128 linears (quant_method fp8, which vLLM reads as deepseek_v4_fp8)",
    "MXFP4 experts (expert_dtype fp4, E8M0 scales)",
    "plain division, not a plan",
    "--load-format auto",
];

/// The header totals the fixture's tensors add up to.
fn total_bytes(dir: &Path) -> u64 {
    header_tensors(&dir.join("model.safetensors"))
        .iter()
        .map(|t| t.end - t.start)
        .sum()
}

#[test]
fn plan_refuses_it_with_what_it_is() {
    let ck = tiny_deepseek_v4();
    let out = run(&["plan", s(ck.path()), "--tp", "2"]);
    let err = assert_refused(&out, 3, WHY);
    assert!(!err.contains("no mapping for architecture"), "{err}");
    let half = total_bytes(ck.path()) / 2;
    assert!(err.contains("--tp 2: "), "{err}");
    let doc = wload_json_exit(&["plan", s(ck.path()), "--tp", "2", "--json"], 3);
    assert_eq!(doc["error"]["kind"], "checkpoint", "{doc:#}");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("DeepSeek-V4")
    );
    let d = &doc["platform_specific"];
    assert_eq!(d["model"], "DeepSeek-V4", "{doc:#}");
    assert_eq!(d["supported"], false);
    assert_eq!(
        (d["layers"].as_u64(), d["routed_experts"].as_u64()),
        (Some(2), Some(4))
    );
    assert_eq!(d["expert_dtype"], "fp4");
    assert_eq!(d["total_bytes"].as_u64(), Some(total_bytes(ck.path())));
    assert_eq!(d["bytes_per_rank"][0]["tp"], 2);
    assert_eq!(d["bytes_per_rank"][0]["bytes"].as_u64(), Some(half));
    assert!(
        d["per_rank_is"]
            .as_str()
            .unwrap()
            .contains("plain division")
    );
    assert!(d["reasons"].as_array().unwrap().len() >= 4);
}

#[test]
fn a_mapping_file_does_not_make_it_plannable() {
    let ck = tiny_deepseek_v4();
    let mapping = manifest_dir().join("mappings/deepseek_v3.yaml");
    let out = run(&["plan", s(ck.path()), "--tp", "1", "--mapping", s(&mapping)]);
    assert_refused(&out, 3, WHY);
}

#[test]
fn the_vl_wrapper_is_recognised_too() {
    let ck = tiny_deepseek_v4();
    let mut config = tiny_deepseek_v4_config();
    config["architectures"] = serde_json::json!(["DeepseekV4ForConditionalGeneration"]);
    write_json(&ck.path().join("config.json"), &config);
    let out = run(&["plan", s(ck.path()), "--tp", "2"]);
    assert_refused(
        &out,
        3,
        &["error: DeepseekV4ForConditionalGeneration is DeepSeek-V4"],
    );
}

#[test]
fn sizes_refuses_it_with_plain_per_rank_figures() {
    let ck = tiny_deepseek_v4();
    let out = run(&["sizes", s(ck.path())]);
    let err = assert_refused(&out, 3, WHY);
    assert!(
        err.contains("--tp 1: ") && err.contains("--tp 8: "),
        "{err}"
    );
    let doc = wload_json_exit(&["sizes", s(ck.path()), "--json"], 3);
    assert_eq!(doc["platform_specific"]["model"], "DeepSeek-V4", "{doc:#}");
}

#[test]
fn shard_and_load_write_nothing() {
    let ck = tiny_deepseek_v4();
    let dest = tempfile::TempDir::new().unwrap();
    let out_dir = dest.path().join("out");
    let out = shard(ck.path(), 2, &out_dir, &[]);
    assert_refused(&out, 3, WHY);
    assert!(!out_dir.exists(), "shard created OUT");
    let doc = wload_json_exit(
        &[
            "shard",
            s(ck.path()),
            "--tp",
            "2",
            "-o",
            s(&out_dir),
            "--json",
        ],
        3,
    );
    assert_eq!(
        doc["platform_specific"]["architecture"],
        "DeepseekV4ForCausalLM"
    );
    assert!(!out_dir.exists(), "shard --json created OUT");
    let out = run(&["load", s(ck.path()), "--tp", "2", "--dry-run"]);
    assert_refused(&out, 3, WHY);
    let left: Vec<_> = std::fs::read_dir(dest.path()).unwrap().collect();
    assert!(left.is_empty(), "shard left {left:?}");
}

#[test]
fn inspect_lists_it_then_refuses() {
    let ck = tiny_deepseek_v4();
    let out = run(&["inspect", s(ck.path())]);
    let err = assert_refused_after_report(&out);
    assert!(err.contains("wload writes no rank files for it"), "{err}");
    let so = stdout(&out);
    assert!(
        so.contains("unsupported: DeepseekV4ForCausalLM is DeepSeek-V4"),
        "{so}"
    );
    assert!(so.contains("layers.0.ffn.experts.0.w1.weight"), "{so}");
    let doc = wload_json_exit(&["inspect", s(ck.path()), "--json"], 3);
    assert_eq!(doc["error"]["kind"], "checkpoint", "{doc:#}");
    assert_eq!(doc["support"]["supported"], false);
    assert_eq!(doc["support"]["vllm"], "platform-specific");
    let d = &doc["platform_specific"];
    assert_eq!(d["model"], "DeepSeek-V4", "{doc:#}");
    assert_eq!(d["total_bytes"].as_u64(), Some(total_bytes(ck.path())));
    let tps: Vec<u64> = (d["bytes_per_rank"].as_array().unwrap().iter())
        .map(|r| r["tp"].as_u64().unwrap())
        .collect();
    assert_eq!(tps, [1, 2, 4, 8]);
    assert_eq!(doc["quantization"]["supported"], false, "{doc:#}");
    assert!(doc["tensors"].as_array().is_some_and(|t| t.len() == 21));
}

/// stderr of a refused `inspect`, which prints its report first: exit 3, the refusal on stderr.
fn assert_refused_after_report(out: &std::process::Output) -> String {
    assert_eq!(out.status.code(), Some(3), "{}", context(out));
    let err = stderr(out);
    for n in WHY {
        assert!(err.contains(n), "stderr should contain {n:?}: {err}");
    }
    err
}

#[test]
fn other_deepseek_families_are_untouched() {
    let v: Value = wload_json(&[
        "inspect",
        &fixtures_dir().join("deepseek_v3").display().to_string(),
        "--json",
    ]);
    assert!(v.get("platform_specific").is_none(), "{v:#}");
}
