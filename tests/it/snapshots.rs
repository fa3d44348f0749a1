//! The human reports and the main refusals, as reviewed snapshots (insta, `.snap` files under
//! tests/it/snapshots/): a change of wording or layout shows as a diff to accept, not as a
//! substring assert that still passes. Temp paths, the checkout's path, timings and
//! shard's page-cache-dependent read choice are filtered.
//!
//! After a deliberate change: `INSTA_UPDATE=always cargo test --test it -- snapshots::` (or
//! `cargo insta test --test it` then `cargo insta review`), and read the diff of the `.snap` files.

use std::path::Path;
use std::process::Output;

use tempfile::TempDir;

use crate::support::*;

/// Exit status, stdout and stderr of one run, as the snapshot shows them.
fn shown(out: &Output) -> String {
    format!(
        "exit: {}\n----- stdout -----\n{}----- stderr -----\n{}",
        out.status
            .code()
            .map_or("signal".to_string(), |c| c.to_string()),
        stdout(out),
        stderr(out)
    )
}

/// `wload ARGS…` with its output checked against snapshot `name`, paths and timings filtered.
fn check(name: &str, args: &[&str]) {
    snapshot(name, &run(args));
}

fn snapshot(name: &str, out: &Output) {
    snapshot_with(name, out, &[]);
}

/// [`snapshot`] with `extra` filters (regex, replacement) for what only this output varies in.
fn snapshot_with(name: &str, out: &Output, extra: &[(&str, &str)]) {
    let mut filters = snapshot_filters();
    filters.extend(extra.iter().map(|(a, b)| (a.to_string(), b.to_string())));
    let filters: Vec<(&str, &str)> = filters
        .iter()
        .map(|(a, b)| (a.as_str(), b.as_str()))
        .collect();
    insta::with_settings!({ filters => filters, prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(name, shown(out));
    });
}

fn gqa() -> String {
    fixtures_dir().join("llama_gqa").display().to_string()
}

// ---- human reports ----

#[test]
fn inspect_checkpoint() {
    check("inspect_checkpoint", &["inspect", &gqa()]);
}

#[test]
fn inspect_checkpoint_verbose() {
    check("inspect_checkpoint_verbose", &["inspect", &gqa(), "-v"]);
}

#[test]
fn inspect_pre_sharded_folder() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(Path::new(&gqa()), 2, &out, &["-q"]);
    check("inspect_pre_sharded_folder", &["inspect", s(&out)]);
}

#[test]
fn plan_report() {
    check("plan", &["plan", &gqa(), "--tp", "2"]);
}

#[test]
fn plan_one_rank() {
    check("plan_rank", &["plan", &gqa(), "--tp", "2", "--rank", "1"]);
}

#[test]
fn sizes_report() {
    check("sizes", &["sizes", &gqa()]);
}

#[test]
fn shard_summary() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    check(
        "shard_summary",
        &["shard", &gqa(), "--tp", "2", "-o", s(&out)],
    );
}

#[test]
fn load_dry_run() {
    check(
        "load_dry_run",
        &["load", &gqa(), "--tp", "2", "--device", "cpu", "--dry-run"],
    );
}

// ---- refusals ----

#[test]
fn error_source_not_found() {
    check(
        "error_source_not_found",
        &["inspect", "/nonexistent/wload-snapshot-source"],
    );
}

#[test]
fn error_tp_zero() {
    check("error_tp_zero", &["plan", &gqa(), "--tp", "0"]);
}

#[test]
fn error_tp_not_dividing_the_heads() {
    check(
        "error_tp_not_dividing_the_heads",
        &["plan", &gqa(), "--tp", "3"],
    );
}

/// vLLM's own qwen2 folder at its TP (read from the file names), against a config whose MLP is
/// twice as wide: only the shapes tell.
#[test]
fn error_shape_mismatch() {
    let dir = expected("qwen2", 4);
    let wider = r#"{"intermediate_size": 512}"#;
    check(
        "error_shape_mismatch",
        &[
            "load",
            s(&dir),
            "--device",
            "cpu",
            "--dry-run",
            "--hf-overrides",
            wider,
        ],
    );
}

/// vLLM's own folder (no wload.json) loaded with a `--tp` its file names contradict.
#[test]
fn error_tp_disagrees_with_the_file_names() {
    let dir = expected("qwen2", 4);
    check(
        "error_tp_disagrees_with_the_file_names",
        &["load", s(&dir), "--tp", "2", "--device", "cpu", "--dry-run"],
    );
}

#[test]
fn error_unknown_architecture() {
    let dir = fixture_with("llama_gqa", |m| {
        m.insert(
            "architectures".into(),
            serde_json::json!(["AcmeForCausalLM"]),
        );
    });
    check(
        "error_unknown_architecture",
        &["plan", s(dir.path()), "--tp", "2"],
    );
}

// ---- the other human reports ----

#[test]
fn inspect_one_file() {
    let file = fixtures_dir().join("llama_gqa/model-00001-of-00006.safetensors");
    check("inspect_one_file", &["inspect", s(&file)]);
}

/// A folder of safetensors files without config.json: what the files hold, and why no plan.
#[test]
fn inspect_without_config() {
    let dir = copy_fixture("llama_gqa");
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    check("inspect_without_config", &["inspect", s(dir.path())]);
}

#[test]
fn plan_report_verbose() {
    check("plan_verbose", &["plan", &gqa(), "--tp", "2", "-v"]);
}

#[test]
fn load_report() {
    let out = run(&["load", &gqa(), "--tp", "2", "--device", "cpu", "--check"]);
    // The per-rank times and rates, and how much of the source the page cache held.
    let varying = [
        (r"\b\d+\.\d+\b", "[N]"),
        (r"\b\d+% in the page cache", "[N]% in the page cache"),
        (r"(?m)\b\d+%$", "[N]%"),
    ];
    snapshot_with("load_cpu", &out, &varying);
}

// ---- one refusal per error family (commands::error::Error) ----

/// `Headers`: a file whose safetensors header is cut short.
#[test]
fn error_bad_header() {
    let dir = copy_fixture("llama_gqa");
    let file = dir.path().join("model-00002-of-00006.safetensors");
    std::fs::write(&file, b"\x10\x00\x00\x00\x00\x00\x00\x00{\"a\":").unwrap();
    check("error_bad_header", &["plan", s(dir.path()), "--tp", "2"]);
}

/// `Config`: config.json that is not JSON.
#[test]
fn error_bad_config() {
    let dir = copy_fixture("llama_gqa");
    std::fs::write(dir.path().join("config.json"), "{\"architectures\": [").unwrap();
    check("error_bad_config", &["plan", s(dir.path()), "--tp", "2"]);
}

/// `Usage`: expert parallelism asked of a model without experts.
#[test]
fn error_expert_parallel_without_experts() {
    check(
        "error_expert_parallel_without_experts",
        &["plan", &gqa(), "--tp", "2", "--enable-expert-parallel"],
    );
}

/// `Shard`: OUT holds files that are not a wload output.
#[test]
fn error_out_not_ours() {
    let work = TempDir::new().unwrap();
    std::fs::write(work.path().join("notes.txt"), "mine").unwrap();
    check(
        "error_out_not_ours",
        &["shard", &gqa(), "--tp", "2", "-o", s(work.path())],
    );
}

/// `Shard` (`BadRank`): `--ranks` beyond the layout.
#[test]
fn error_rank_out_of_range() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    check(
        "error_rank_out_of_range",
        &[
            "shard",
            &gqa(),
            "--tp",
            "2",
            "--ranks",
            "0-3",
            "-o",
            s(&out),
        ],
    );
}

/// `BadFilter`: a `--filter` that is no regular expression.
#[test]
fn error_bad_filter() {
    check("error_bad_filter", &["inspect", &gqa(), "--filter", "("]);
}

/// The error document every failure prints under `--json`.
#[test]
fn error_json_document() {
    check(
        "error_json_document",
        &["plan", &gqa(), "--tp", "3", "--json"],
    );
}

/// `PlatformSpecific`: DeepSeek-V4, recognised, described and refused (no verified reference).
#[test]
fn error_deepseek_v4_platform_specific() {
    let ck = tiny_deepseek_v4();
    check(
        "error_deepseek_v4_platform_specific",
        &["plan", s(ck.path()), "--tp", "2"],
    );
}

/// DeepSeek-V4 under `inspect`: the files and tensors, then the same refusal.
#[test]
fn inspect_deepseek_v4() {
    let ck = tiny_deepseek_v4();
    check("inspect_deepseek_v4", &["inspect", s(ck.path())]);
}
