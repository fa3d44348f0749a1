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
    let root = manifest_dir().display().to_string();
    let tmp = std::env::temp_dir().display().to_string();
    let filters: Vec<(String, &str)> = vec![
        (regex_escape(&root), "[ROOT]"),
        (
            format!(r"{}/\.tmp[A-Za-z0-9]+", regex_escape(&tmp)),
            "[TMP]",
        ),
        (r"\b\d+(\.\d+)? ?(ns|µs|us|ms|s)\b".into(), "[TIME]"),
        (r"\b\d+(\.\d+)? ?[KMGT]i?B/s\b".into(), "[RATE]"),
        // How shard chose to read depends on the page cache at the time.
        (r"(?m)^read: io .*$".into(), "read: [IO CHOICE]"),
    ];
    let filters: Vec<(&str, &str)> = filters.iter().map(|(a, b)| (a.as_str(), *b)).collect();
    insta::with_settings!({ filters => filters, prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!(name, shown(out));
    });
}

fn regex_escape(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            let special = "\\.+*?()|[]{}^$#&-~".contains(c);
            special.then_some('\\').into_iter().chain([c])
        })
        .collect()
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
