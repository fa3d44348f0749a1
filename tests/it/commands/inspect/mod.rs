//! `wload inspect`: file selection, the tensor table and the config, checked against the golden
//! fixtures (read independently of the crate) and small generated checkpoints.

use std::collections::BTreeSet;
use std::fs;
use std::io::{BufRead, BufReader, Read};
use std::process::Stdio;

use predicates::prelude::*;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::*;

mod checkpoint;
mod pre_sharded;
mod quantization;
mod source_typos;
mod structure;
mod support;
mod weight_files;

/// (name, dtype, shape, file) of one tensor.
type Row = (String, String, Vec<u64>, String);

fn rows_of(out: &Value) -> BTreeSet<Row> {
    out["tensors"]
        .as_array()
        .expect("tensors array")
        .iter()
        .map(|t| {
            let (name, dtype, shape) = json_tensor(t);
            (name, dtype, shape, t["file"].as_str().unwrap().to_string())
        })
        .collect()
}

fn names_of(v: &Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("{key} is an array"))
        .iter()
        .map(|f| f["file"].as_str().unwrap().to_string())
        .collect()
}

/// Checks one fixture; returns what is wrong with it, if anything.
fn check_fixture(name: &str) -> Vec<String> {
    let dir = fixtures_dir().join(name);
    let mut problems = Vec::new();

    // The files vLLM reads: the index's weight_map when there is one, else every *.safetensors.
    let index = dir.join("model.safetensors.index.json");
    let mut files: Vec<String> = if index.exists() {
        let v: Value = serde_json::from_slice(&fs::read(&index).unwrap()).unwrap();
        v["weight_map"]
            .as_object()
            .unwrap()
            .values()
            .map(|f| f.as_str().unwrap().to_string())
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    } else {
        fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".safetensors"))
            .collect()
    };
    files.sort();

    let mut expected = BTreeSet::new();
    let mut parameters = 0u64;
    for f in &files {
        for t in header_tensors(&dir.join(f)) {
            parameters += t.shape.iter().product::<u64>();
            expected.insert((t.name, t.dtype, t.shape, f.clone()));
        }
    }

    let out = wload_json(&["inspect", s(&dir), "--json"]);
    let got = rows_of(&out);
    for missing in expected.difference(&got) {
        problems.push(format!("{name}: not listed: {missing:?}"));
    }
    for extra in got.difference(&expected) {
        problems.push(format!("{name}: listed but not in any header: {extra:?}"));
    }
    let listed_files: BTreeSet<String> = names_of(&out, "files").into_iter().collect();
    let files_set: BTreeSet<String> = files.iter().cloned().collect();
    if listed_files != files_set {
        problems.push(format!(
            "{name}: files {listed_files:?}, expected {files_set:?}"
        ));
    }
    if out["totals"]["parameters"].as_u64() != Some(parameters) {
        problems.push(format!(
            "{name}: totals.parameters {} != {parameters}",
            out["totals"]["parameters"]
        ));
    }
    if out["totals"]["tensors"].as_u64() != Some(expected.len() as u64) {
        problems.push(format!(
            "{name}: totals.tensors {} != {}",
            out["totals"]["tensors"],
            expected.len()
        ));
    }
    // A Mistral-native fixture has params.json, whose class vLLM picks from its fields: the
    // fixture's record names it ("MistralLarge3ForCausalLM (Mistral native format)").
    let arch = match fs::read(dir.join("config.json")) {
        Ok(bytes) => serde_json::from_slice::<Value>(&bytes).unwrap()["architectures"][0].clone(),
        Err(_) => {
            let info: Value =
                serde_json::from_slice(&fs::read(dir.join("fixture_info.json")).unwrap()).unwrap();
            let arch = info["arch"]
                .as_str()
                .unwrap()
                .split_whitespace()
                .next()
                .unwrap();
            Value::from(arch)
        }
    };
    if out["config"]["architecture"] != arch {
        problems.push(format!(
            "{name}: config.architecture {} != {arch}",
            out["config"]["architecture"]
        ));
    }
    problems
}

/// `wload inspect DIR` (human), expected to succeed with nothing on stderr.
fn inspect_human(dir: &std::path::Path) -> String {
    let out = run(&["inspect", s(dir)]);
    assert!(out.status.success(), "{}", context(&out));
    assert!(out.stderr.is_empty(), "{}", context(&out));
    stdout(&out)
}
