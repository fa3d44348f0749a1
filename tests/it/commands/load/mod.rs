//! `wload load`: every golden case loads (into host memory) exactly the tensors vLLM 0.33 held, both
//! planned on the fly from the fixture and from vLLM's own pre-sharded output; `--dry-run` (and
//! `--dry-run --read`) pass on good input and planted faults are refused with exit 3 and the fact
//! that matters; the CUDA path fails cleanly without a driver and, through a stub `libcuda.so`,
//! without a GPU; launcher variables pick this process's ranks; human output shows every stage.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Output};

use assert_cmd::Command;
use serde_json::Value;
use tempfile::TempDir;
use xxhash_rust::xxh3::xxh3_64;

use crate::support::*;

mod cuda;
mod faults;
pub(crate) mod golden;
mod human;
mod vllm_folders;

use cuda::stub_driver;
mod launchers;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// `wload load ARGS…` with the launcher variables removed and `env` set.
fn load_cmd(args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = wload();
    for v in LAUNCHER_VARS {
        cmd.env_remove(v);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.arg("load").args(args);
    cmd
}

fn load_env(args: &[&str], env: &[(&str, &str)]) -> Output {
    load_cmd(args, env).output().expect("wload runs")
}

fn load(args: &[&str]) -> Output {
    load_env(args, &[])
}

/// [`context`] with the command line, for assertion messages.
fn load_context(args: &[&str], out: &Output) -> String {
    format!("wload load {args:?}: {}", context(out))
}

/// Runs `wload load ARGS…`, expects success, and parses stdout as JSON; `Err` describes a failure.
fn try_json(args: &[&str], env: &[(&str, &str)]) -> Result<Value, String> {
    let out = load_env(args, env);
    if !out.status.success() {
        return Err(load_context(args, &out));
    }
    Ok(json_doc(&[&["load"], args].concat(), &out))
}

fn json_ok(args: &[&str], env: &[(&str, &str)]) -> Value {
    try_json(args, env).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `wload load ARGS…` with `env` and asserts a refusal (see [`assert_refused`]).
fn assert_fails(args: &[&str], env: &[(&str, &str)], code: i32, says: &[&str]) -> Output {
    let out = load_env(args, env);
    assert_refusal_text(&out, code, says);
    out
}

/// Fails once, listing every failure.
fn assert_none(what: &str, failures: &[String]) {
    assert!(
        failures.is_empty(),
        "{what}: {} failure(s):\n{}",
        failures.len(),
        failures.join("\n")
    );
}

fn hex(bytes: &[u8]) -> String {
    format!("{:016x}", xxh3_64(bytes))
}

/// One tensor as vLLM holds it, read independently of the crate.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Held {
    dtype: String,
    shape: Vec<u64>,
    xxh3: String,
}

/// What vLLM's rank `rank` held in `case`: each tensor's dtype, shape and XXH3 of its data bytes.
fn vllm_rank(case: &GoldenCase, rank: u64) -> BTreeMap<String, Held> {
    let files = case.rank_files(rank);
    assert!(!files.is_empty(), "{}: no files for rank {rank}", case.name);
    read_files(&files)
        .into_iter()
        .map(|(name, t)| {
            let held = Held {
                dtype: t.dtype,
                shape: t.shape,
                xxh3: hex(&t.data),
            };
            (name, held)
        })
        .collect()
}

/// What a `--checksums --json` report says rank `rank` holds.
fn reported_rank(report: &Value, rank: u64) -> Option<BTreeMap<String, Held>> {
    let r = report["ranks"]
        .as_array()?
        .iter()
        .find(|r| r["rank"].as_u64() == Some(rank))?;
    let sums = r["checksums"].as_array()?;
    Some(
        sums.iter()
            .map(|t| {
                (
                    t["name"].as_str().unwrap_or("?").to_string(),
                    Held {
                        dtype: t["dtype"].as_str().unwrap_or("?").to_string(),
                        shape: t["shape"]
                            .as_array()
                            .map(|a| a.iter().filter_map(Value::as_u64).collect())
                            .unwrap_or_default(),
                        xxh3: t["xxh3"].as_str().unwrap_or("?").to_string(),
                    },
                )
            })
            .collect(),
    )
}

fn reported_ranks(report: &Value) -> Vec<u64> {
    report["ranks"]
        .as_array()
        .map(|a| a.iter().filter_map(|r| r["rank"].as_u64()).collect())
        .unwrap_or_default()
}

/// Every difference between the report and vLLM's files for `ranks` of `case`.
fn compare(label: &str, case: &GoldenCase, report: &Value, ranks: &[u64]) -> Vec<String> {
    let mut failures = Vec::new();
    let got_ranks = reported_ranks(report);
    if got_ranks != ranks {
        failures.push(format!("{label}: ranks {got_ranks:?}, expected {ranks:?}"));
    }
    for &rank in ranks {
        let want = vllm_rank(case, rank);
        let Some(got) = reported_rank(report, rank) else {
            failures.push(format!("{label}: rank {rank}: no checksums in the report"));
            continue;
        };
        let want_names: BTreeSet<&String> = want.keys().collect();
        let got_names: BTreeSet<&String> = got.keys().collect();
        for n in want_names.difference(&got_names) {
            failures.push(format!("{label}: rank {rank}: '{n}' missing (vLLM has it)"));
        }
        for n in got_names.difference(&want_names) {
            failures.push(format!(
                "{label}: rank {rank}: '{n}' unexpected (vLLM has no such tensor)"
            ));
        }
        for (name, w) in &want {
            if let Some(g) = got.get(name)
                && g != w
            {
                failures.push(format!(
                    "{label}: rank {rank}: '{name}': got {g:?}, vLLM {w:?}"
                ));
            }
        }
    }
    failures
}

fn tp_ranks(case: &GoldenCase) -> Vec<u64> {
    (0..case.world_size()).collect()
}

/// The case's flags for loading its own expected folder: `--dtype`/EP as vLLM ran with.
fn flags(case: &GoldenCase) -> Vec<&str> {
    case.flags.iter().map(String::as_str).collect()
}

/// `wload shard FIXTURE --tp TP -o <tmp>/out`; returns the temp dir and OUT.
fn shard_fixture(fixture: &str, tp: u64) -> (TempDir, PathBuf) {
    let tmp = TempDir::new().unwrap();
    let out_dir = tmp.path().join("out");
    shard_ok(&fixtures_dir().join(fixture), tp, &out_dir, &[]);
    (tmp, out_dir)
}

fn cpu() -> Vec<String> {
    vec!["--device".into(), "cpu".into()]
}

/// The hashes `--dry-run --read` reports are the files' own.
fn check_files_read(label: &str, dir: &Path, report: &Value) -> Vec<String> {
    let mut f = Vec::new();
    let Some(files) = report["files_read"].as_array().filter(|a| !a.is_empty()) else {
        return vec![format!(
            "{label}: --read reported no files: {}",
            report["files_read"]
        )];
    };
    for file in files {
        let name = file["file"].as_str().unwrap_or("?");
        let Ok(bytes) = fs::read(dir.join(name)) else {
            f.push(format!(
                "{label}: files_read names {name}, which is not in {}",
                dir.display()
            ));
            continue;
        };
        if file["xxh3_64k"].as_str() != Some(block_checksum(&bytes).as_str())
            || file["bytes"].as_u64() != Some(bytes.len() as u64)
        {
            f.push(format!(
                "{label}: {name}: reported {file}, file has {} bytes, checksum {}",
                bytes.len(),
                block_checksum(&bytes)
            ));
        }
    }
    f
}
