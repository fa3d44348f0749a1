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
    let config: Value =
        serde_json::from_slice(&fs::read(dir.join("config.json")).unwrap()).unwrap();
    if out["config"]["architecture"] != config["architectures"][0] {
        problems.push(format!(
            "{name}: config.architecture {} != {}",
            out["config"]["architecture"], config["architectures"][0]
        ));
    }
    problems
}

#[test]
fn every_golden_fixture_lists_exactly_its_header_tensors() {
    let names = fixture_names();
    assert!(
        !names.is_empty(),
        "no fixtures under {}",
        fixtures_dir().display()
    );
    let problems: Vec<String> = names.iter().flat_map(|n| check_fixture(n)).collect();
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

/// HF shards + index + consolidated.safetensors + params.json: a Mistral-style Hub repo.
fn mistral_style_repo() -> TempDir {
    let tmp = copy_fixture("llama_gqa");
    let d = tmp.path();
    write_safetensors(
        &d.join("consolidated.safetensors"),
        &[
            (
                "tok_embeddings.weight",
                "BF16",
                &[100, 64],
                &zeros(100 * 64 * 2),
            ),
            ("norm.weight", "BF16", &[64], &zeros(64 * 2)),
        ],
    );
    write_json(
        &d.join("params.json"),
        &json!({"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "hidden_dim": 128,
                "vocab_size": 100, "head_dim": 16, "norm_eps": 1e-5}),
    );
    tmp
}

#[test]
fn consolidated_file_makes_auto_pick_mistral() {
    let tmp = mistral_style_repo();
    let out = wload_json(&["inspect", s(tmp.path()), "--json"]);
    assert_eq!(out["format"]["requested"], "auto");
    assert_eq!(out["format"]["load_format"], "mistral");
    assert_eq!(out["format"]["config_file"], "params.json");
    assert_eq!(out["format"]["config_format"], "mistral");
    assert_eq!(names_of(&out, "files"), ["consolidated.safetensors"]);
    assert_eq!(out["config"]["hidden_size"], 64);
    assert_eq!(out["config"]["num_hidden_layers"], 2);
    assert_eq!(out["config"]["num_key_value_heads"], 2);
    assert_eq!(out["config"]["architecture"], "MistralForCausalLM");
    let tensors: BTreeSet<String> = rows_of(&out).into_iter().map(|r| r.0).collect();
    assert_eq!(
        tensors,
        BTreeSet::from([
            "norm.weight".to_string(),
            "tok_embeddings.weight".to_string()
        ])
    );
    // The HF shards are accounted for, not silently ignored.
    let dropped = names_of(&out, "dropped");
    assert!(
        dropped.contains(&"model-00001-of-00006.safetensors".to_string()),
        "{dropped:?}"
    );
}

#[test]
fn load_format_hf_reads_the_shards_and_drops_consolidated() {
    let tmp = mistral_style_repo();
    let out = wload_json(&["inspect", s(tmp.path()), "--json", "--load-format", "hf"]);
    assert_eq!(out["format"]["load_format"], "hf");
    assert_eq!(out["format"]["index"], "model.safetensors.index.json");
    let files = names_of(&out, "files");
    assert_eq!(files.len(), 6, "{files:?}");
    assert!(files.iter().all(|f| f.starts_with("model-")), "{files:?}");
    let dropped = out["dropped"].as_array().unwrap();
    let consolidated = dropped
        .iter()
        .find(|d| d["file"] == "consolidated.safetensors")
        .unwrap_or_else(|| panic!("consolidated.safetensors not in dropped: {dropped:?}"));
    let reason = consolidated["reason"].as_str().unwrap();
    assert!(reason.contains("index"), "reason: {reason}");
    assert!(
        rows_of(&out)
            .iter()
            .any(|r| r.0 == "model.embed_tokens.weight"),
        "HF tensors listed"
    );
}

#[test]
fn index_naming_a_deleted_file_is_a_checkpoint_error() {
    let tmp = copy_fixture("llama_gqa");
    fs::remove_file(tmp.path().join("model-00003-of-00006.safetensors")).unwrap();
    assert_refused(
        &run(&["inspect", s(tmp.path())]),
        3,
        &["model-00003-of-00006.safetensors"],
    );
}

fn set_index_entry(dir: &std::path::Path, tensor: &str, file: &str) {
    let path = dir.join("model.safetensors.index.json");
    let mut v: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    v["weight_map"][tensor] = json!(file);
    write_json(&path, &v);
}

#[test]
fn index_naming_a_file_never_shipped_is_a_checkpoint_error() {
    let tmp = copy_fixture("llama_gqa");
    set_index_entry(
        tmp.path(),
        "model.extra.weight",
        "model-00007-of-00006.safetensors",
    );
    assert_refused(
        &run(&["inspect", s(tmp.path()), "--json"]),
        3,
        &["model-00007-of-00006.safetensors"],
    );
}

#[test]
fn index_pointing_outside_the_folder_is_refused() {
    for target in ["../x.safetensors", "/etc/passwd", "sub/../../x.safetensors"] {
        let outer = TempDir::new().unwrap();
        // Make the escaping target exist, so that only the path check can refuse it.
        write_safetensors(
            &outer.path().join("x.safetensors"),
            &[("model.norm.weight", "BF16", &[128], &zeros(256))],
        );
        let ckpt = outer.path().join("ckpt");
        fs::create_dir(&ckpt).unwrap();
        for e in fs::read_dir(fixtures_dir().join("llama_gqa")).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), ckpt.join(e.file_name())).unwrap();
        }
        fs::set_permissions(
            ckpt.join("model.safetensors.index.json"),
            std::os::unix::fs::PermissionsExt::from_mode(0o644),
        )
        .unwrap();
        set_index_entry(&ckpt, "model.norm.weight", target);
        let out = wload()
            .args(["inspect", s(&ckpt), "--json"])
            .output()
            .unwrap();
        assert_refused(&out, 3, &[target, "outside"]);
    }
}

#[test]
fn files_are_in_natural_order() {
    let tmp = TempDir::new().unwrap();
    let d = tmp.path();
    write_json(&d.join("config.json"), &tiny_config());
    for (i, n) in [
        (10, "model-10.safetensors"),
        (2, "model-2.safetensors"),
        (1, "model-1.safetensors"),
    ] {
        let name = format!("t{i}.weight");
        write_safetensors(&d.join(n), &[(name.as_str(), "F32", &[2], &zeros(8))]);
    }
    let out = wload_json(&["inspect", s(d), "--json"]);
    assert_eq!(
        names_of(&out, "files"),
        [
            "model-1.safetensors",
            "model-2.safetensors",
            "model-10.safetensors"
        ]
    );
}

#[test]
fn a_tensor_in_two_files_is_a_duplicate_and_the_first_copy_is_shadowed() {
    let tmp = tiny_checkpoint();
    let d = tmp.path();
    // model.safetensors sorts after a-extra.safetensors, so its copy is the one vLLM keeps.
    write_safetensors(
        &d.join("a-extra.safetensors"),
        &[
            ("model.norm.weight", "F32", &[8], &zeros(32)),
            ("only.here", "F32", &[1], &zeros(4)),
        ],
    );
    let out = wload_json(&["inspect", s(d), "--json"]);
    assert_eq!(
        names_of(&out, "files"),
        ["a-extra.safetensors", "model.safetensors"]
    );
    assert_eq!(
        out["duplicates"],
        json!([{"name": "model.norm.weight", "files": ["a-extra.safetensors", "model.safetensors"]}])
    );
    let copies: Vec<(&str, bool)> = out["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["name"] == "model.norm.weight")
        .map(|t| {
            (
                t["file"].as_str().unwrap(),
                t["shadowed"].as_bool().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        copies,
        [("a-extra.safetensors", true), ("model.safetensors", false)]
    );
    // Shadowed copies do not count twice.
    assert_eq!(out["totals"]["tensors"], 4);
    assert_eq!(out["totals"]["parameters"], 16 * 8 * 2 + 8 + 1);
}

#[test]
fn bin_only_folder_is_not_supported() {
    let tmp = TempDir::new().unwrap();
    write_json(&tmp.path().join("config.json"), &tiny_config());
    write_raw(
        &tmp.path().join("pytorch_model.bin"),
        b"PK\x03\x04 not really a zip",
    );
    assert_refused(
        &run(&["inspect", s(tmp.path())]),
        3,
        &["pytorch_model.bin", "not support"],
    );
}

#[test]
fn filter_restricts_tensors_and_totals() {
    let dir = fixtures_dir().join("llama_gqa");
    let all = wload_json(&["inspect", s(&dir), "--json"]);
    let out = wload_json(&[
        "inspect",
        s(&dir),
        "--json",
        "--filter",
        r"layers\.0\..*_proj",
    ]);
    let names: Vec<String> = rows_of(&out).into_iter().map(|r| r.0).collect();
    assert_eq!(names.len(), 7, "{names:?}");
    assert!(
        names
            .iter()
            .all(|n| n.starts_with("model.layers.0.") && n.ends_with("_proj.weight"))
    );
    assert_eq!(out["filter"], r"layers\.0\..*_proj");
    assert_eq!(out["totals"]["tensors"], 7);
    assert!(out["totals"]["parameters"].as_u64() < all["totals"]["parameters"].as_u64());
    // Files and config are not filtered.
    assert_eq!(out["files"], all["files"]);
    assert_eq!(out["config"], all["config"]);
}

#[test]
fn invalid_filter_is_a_usage_error() {
    assert_refused(
        &run(&[
            "inspect",
            s(&fixtures_dir().join("llama_gqa")),
            "--filter",
            "(",
        ]),
        2,
        &["--filter"],
    );
}

#[test]
fn nonexistent_source_is_a_usage_error() {
    let tmp = TempDir::new().unwrap();
    let missing = tmp.path().join("no-such-checkpoint");
    assert_refused(&run(&["inspect", s(&missing)]), 2, &["no-such-checkpoint"]);
}

#[test]
fn source_that_is_a_file_is_a_usage_error() {
    let dir = fixtures_dir().join("llama_gqa");
    assert_refused(
        &run(&["inspect", s(&dir.join("config.json"))]),
        2,
        &["not a directory"],
    );
}

#[test]
fn hf_overrides_apply_to_the_config() {
    let dir = fixtures_dir().join("llama_gqa");
    let out = wload_json(&[
        "inspect",
        s(&dir),
        "--json",
        "--hf-overrides",
        r#"{"num_hidden_layers": 7}"#,
    ]);
    assert_eq!(out["config"]["num_hidden_layers"], 7);
    // Other fields keep the config's values.
    assert_eq!(out["config"]["hidden_size"], 128);
}

#[test]
fn bad_hf_overrides_are_a_usage_error() {
    let dir = fixtures_dir().join("llama_gqa");
    for bad in [r#"{"num_hidden_layers": 7"#, "[1, 2]", "not json"] {
        let err = assert_refused(&run(&["inspect", s(&dir), "--hf-overrides", bad]), 2, &[]);
        assert!(err.starts_with("error: --hf-overrides"), "{err}");
    }
}

#[test]
fn human_output_names_the_architecture_and_tensors() {
    wload()
        .args(["inspect", s(&fixtures_dir().join("llama_gqa"))])
        .assert()
        .success()
        .stdout(predicate::str::contains("LlamaForCausalLM"))
        .stdout(predicate::str::contains(
            "model.layers.1.mlp.down_proj.weight",
        ))
        .stdout(predicate::str::contains("model-00006-of-00006.safetensors"))
        .stderr(predicate::str::is_empty());
}

#[test]
fn human_output_reports_duplicates_and_dropped_files() {
    let tmp = mistral_style_repo();
    wload()
        .args(["inspect", s(tmp.path())])
        .assert()
        .success()
        .stdout(predicate::str::contains("MistralForCausalLM"))
        .stdout(predicate::str::contains("not read"))
        .stdout(predicate::str::contains("model-00001-of-00006.safetensors"));
}

/// A checkpoint whose `inspect` output is far larger than a pipe buffer (64 KiB on Linux), so the
/// process is still writing when the reader goes away.
fn checkpoint_with_many_tensors() -> TempDir {
    let tmp = TempDir::new().unwrap();
    write_json(&tmp.path().join("config.json"), &tiny_config());
    let names: Vec<String> = (0..4000)
        .map(|i| format!("model.layers.{i}.some_rather_long_module_name.weight"))
        .collect();
    let one = [0u8; 1];
    let tensors: Vec<Tensor> = names
        .iter()
        .map(|n| (n.as_str(), "U8", &[1u64][..], &one[..]))
        .collect();
    write_safetensors(&tmp.path().join("model.safetensors"), &tensors);
    tmp
}

#[test]
fn closed_stdout_is_not_an_error() {
    let tmp = checkpoint_with_many_tensors();
    for json in [false, true] {
        let mut cmd = wload_process();
        cmd.args(["inspect", s(tmp.path())]);
        if json {
            cmd.arg("--json");
        }
        let mut child = cmd
            .env("RUST_BACKTRACE", "1")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let mut first = String::new();
        BufReader::new(stdout).read_line(&mut first).unwrap();
        // The reader (and with it the pipe) is dropped here, like `| head -1`.
        assert!(!first.is_empty());
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        let status = child.wait().unwrap();
        assert!(status.success(), "json={json}: {status}; stderr: {stderr}");
        assert!(!stderr.contains("error"), "json={json}: {stderr}");
        assert!(!stderr.contains("panicked"), "json={json}: {stderr}");
    }
}

#[test]
fn verbose_human_output_shows_header_sizes_and_reasons() {
    wload()
        .args(["inspect", "-v", s(&fixtures_dir().join("llama_gqa"))])
        .assert()
        .success()
        .stdout(predicate::str::contains("HEADER"))
        .stdout(predicate::str::contains(
            "listed in model.safetensors.index.json",
        ));
}

/// vLLM lists a local folder recursively to pick the format, so a consolidated file in a subfolder
/// flips `auto` to mistral, whose top-level-only glob then finds nothing (vLLM 0.33 `default_loader.py`).
#[test]
fn nested_consolidated_file_flips_auto_to_mistral_and_finds_no_weights() {
    let tmp = tiny_checkpoint();
    fs::create_dir(tmp.path().join("original")).unwrap();
    write_safetensors(
        &tmp.path().join("original/consolidated.safetensors"),
        &[("norm.weight", "F32", &[8], &zeros(32))],
    );
    assert_refused(
        &run(&["inspect", s(tmp.path())]),
        3,
        &["mistral", "original/consolidated.safetensors"],
    );
    // Asking for hf explicitly reads the top-level file and says why the nested one is not read.
    let out = wload_json(&["inspect", s(tmp.path()), "--json", "--load-format", "hf"]);
    assert_eq!(names_of(&out, "files"), ["model.safetensors"]);
    let dropped = &out["dropped"][0];
    assert_eq!(dropped["file"], "original/consolidated.safetensors");
    assert!(dropped["reason"].as_str().unwrap().contains("subfolder"));
}

// ---- weight files that cannot be read (issue 9, item 7) ----
//
// vLLM selects weights with Python's `glob` over the folder, which lists every name that matches
// (dangling links, folders, FIFOs, undecodable names included), then fails to open the ones that
// are not readable files. wload reports each by name with exit 3 instead of skipping it.

/// Runs `wload inspect DIR` (bounded in time: a FIFO must not make it wait), expects exit 3, and
/// returns stderr.
fn inspect_fails_with_3(dir: &std::path::Path) -> String {
    let out = wload()
        .args(["inspect", s(dir)])
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .expect("wload runs");
    assert_refused(&out, 3, &[])
}

/// A broken Hugging Face cache: the link is selected by vLLM's glob and then fails to open.
#[test]
fn dangling_weight_link_is_reported_with_its_target() {
    let tmp = tiny_checkpoint();
    let target = tmp.path().join("blobs/0123abcd");
    std::os::unix::fs::symlink(&target, tmp.path().join("model-2.safetensors")).unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("model-2.safetensors: symbolic link to"),
        "{err}"
    );
    assert!(err.contains("blobs/0123abcd"), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(err.contains("download the model again"), "{err}");
}

/// With only a dangling `*.safetensors`, vLLM still takes the safetensors pattern (its glob matched)
/// rather than falling back to `*.bin`, and fails on the link; so does wload.
#[test]
fn dangling_link_wins_the_pattern_over_bin_files() {
    let tmp = tiny_checkpoint();
    fs::rename(
        tmp.path().join("model.safetensors"),
        tmp.path().join("pytorch_model.bin"),
    )
    .unwrap();
    std::os::unix::fs::symlink("gone", tmp.path().join("model.safetensors")).unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("model.safetensors: symbolic link to 'gone'"),
        "{err}"
    );
    assert!(!err.contains(".bin files"), "{err}");
}

/// An index that does not list the dangling link makes vLLM drop it before opening anything.
#[test]
fn dangling_link_not_in_the_index_is_dropped_like_vllm() {
    let tmp = tiny_checkpoint();
    std::os::unix::fs::symlink("gone", tmp.path().join("stale.safetensors")).unwrap();
    write_json(
        &tmp.path().join("model.safetensors.index.json"),
        &json!({"weight_map": {
            "model.embed_tokens.weight": "model.safetensors",
            "model.norm.weight": "model.safetensors",
            "lm_head.weight": "model.safetensors",
        }}),
    );
    let out = wload_json(&["inspect", s(tmp.path()), "--json"]);
    assert_eq!(names_of(&out, "files"), ["model.safetensors"]);
    let stale = out["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["file"] == "stale.safetensors")
        .unwrap_or_else(|| panic!("stale link not in dropped: {}", out["dropped"]));
    assert!(
        stale["reason"].as_str().unwrap().contains("not listed"),
        "{stale}"
    );
}

/// A link to itself: `open` fails with ELOOP for every user, root included.
#[test]
fn symlink_loop_is_reported_by_name() {
    let tmp = tiny_checkpoint();
    std::os::unix::fs::symlink("loop.safetensors", tmp.path().join("loop.safetensors")).unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("loop.safetensors: symbolic link to 'loop.safetensors' cannot be followed"),
        "{err}"
    );
    assert!(err.contains("fix or remove the link"), "{err}");
}

/// Opening a FIFO for reading waits for a writer; wload must answer at once instead.
#[test]
fn fifo_named_like_weights_is_reported_without_waiting() {
    let tmp = tiny_checkpoint();
    let fifo = tmp.path().join("pipe.safetensors");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file system entry.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("pipe.safetensors: is a FIFO (named pipe), not a regular file"),
        "{err}"
    );
}

#[test]
fn folder_named_like_weights_is_reported_by_name() {
    let tmp = tiny_checkpoint();
    fs::create_dir(tmp.path().join("extra.safetensors")).unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("extra.safetensors: is a folder, not a regular file"),
        "{err}"
    );
}

/// Python decodes an undecodable name with surrogate escapes, so `*.safetensors` matches it and
/// vLLM selects it; wload names it (lossily, with the raw bytes) and refuses it.
#[test]
fn non_utf8_weight_name_is_reported_by_name() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tiny_checkpoint();
    let name = std::ffi::OsStr::from_bytes(b"model-\xff.safetensors");
    fs::copy(tmp.path().join("model.safetensors"), tmp.path().join(name)).unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("model-\u{FFFD}.safetensors: file name is not valid UTF-8"),
        "{err}"
    );
    assert!(err.contains(r#"bytes "model-\xff.safetensors""#), "{err}");
    assert!(err.contains("rename it to a UTF-8 name"), "{err}");
}

/// A non-UTF-8 name that no weight pattern selects changes nothing.
#[test]
fn non_utf8_name_that_is_not_selected_is_harmless() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tiny_checkpoint();
    fs::write(
        tmp.path()
            .join(std::ffi::OsStr::from_bytes(b"notes-\xe9.txt")),
        b"x",
    )
    .unwrap();
    let out = wload_json(&["inspect", s(tmp.path()), "--json"]);
    assert_eq!(names_of(&out, "files"), ["model.safetensors"]);
}

/// Permission denied. Root reads a mode-000 file anyway (CAP_DAC_OVERRIDE), and CI runs as root:
/// there the binary is run as `nobody` (a copy in a world-readable folder, so that `nobody` can
/// execute it), so the same `EACCES` path is taken for every user.
#[test]
fn weight_file_without_read_permission_is_reported_by_name() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let tmp = tiny_checkpoint();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for f in ["config.json", "model.safetensors"] {
        fs::set_permissions(tmp.path().join(f), fs::Permissions::from_mode(0o644)).unwrap();
    }
    write_safetensors(
        &tmp.path().join("secret.safetensors"),
        &[("extra.weight", "F32", &[2], &zeros(8))],
    );
    fs::set_permissions(
        tmp.path().join("secret.safetensors"),
        fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    let bin_dir = TempDir::new().unwrap();
    fs::set_permissions(bin_dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let bin = bin_dir.path().join("wload");
    fs::copy(env!("CARGO_BIN_EXE_wload"), &bin).unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(["inspect", s(tmp.path())])
        .env_remove("RUST_BACKTRACE");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.uid(65534).gid(65534).env("HOME", "/");
    }
    let out = cmd.output().expect("wload runs");
    assert_refused(
        &out,
        3,
        &["secret.safetensors: permission denied", "chmod a+r"],
    );
}

/// A dangling config.json is named as such, not reported as missing.
#[test]
fn dangling_config_link_is_reported_as_a_link() {
    let tmp = tiny_checkpoint();
    fs::remove_file(tmp.path().join("config.json")).unwrap();
    std::os::unix::fs::symlink("../blobs/cfg", tmp.path().join("config.json")).unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("config.json: symbolic link to '../blobs/cfg', which does not exist"),
        "{err}"
    );
    assert!(err.contains("vLLM reads it as the model config"), "{err}");
}

// ---- one home per fact (issue 10, item 2) ----

/// The index as Python's `json` reads it: escapes in names decoded, and a tensor named twice
/// keeps its last file, so a first entry naming a file that was never shipped does not count.
#[test]
fn index_with_escapes_and_a_repeated_name_reads_as_json_loads_does() {
    let tmp = tiny_checkpoint();
    fs::write(
        tmp.path().join("model.safetensors.index.json"),
        r#"{"metadata": {"total_size": 1e400}, "weight_map": {
            "lm_head.weight": "gone.safetensors",
            "model.embed_tokens.weight": "model\u002esafetensors",
            "model\u002enorm.weight": "model.safetensors",
            "lm_head.weight": "model.safetensors"
        }}"#,
    )
    .unwrap();
    let out = wload_json(&["inspect", s(tmp.path()), "--json"]);
    assert_eq!(names_of(&out, "files"), ["model.safetensors"]);
    assert_eq!(out["tensors"].as_array().unwrap().len(), 3);

    // The same repeat the other way round: the last file named is the one that must exist.
    fs::write(
        tmp.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"lm_head.weight": "model.safetensors", "lm_head.weight": "gone.safetensors"}}"#,
    )
    .unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("weight files referenced in index but missing: gone.safetensors"),
        "{err}"
    );
}

/// Which files count as weights comes from one list: vLLM's formats and `.pth` get a line
/// saying why they are not read; another framework's weights and other files get none.
#[test]
fn weight_like_files_are_explained_and_others_ignored() {
    let tmp = tiny_checkpoint();
    fs::create_dir(tmp.path().join("original")).unwrap();
    for f in [
        "original/consolidated.pth",
        "training_args.bin",
        "extra.bin",
        "old.pt",
        "model.gguf",
        "tf_model.h5",
        "MODEL.BIN",
        "notes.txt",
    ] {
        fs::write(tmp.path().join(f), b"").unwrap();
    }
    let out = wload_json(&["inspect", s(tmp.path()), "--json"]);
    assert_eq!(names_of(&out, "files"), ["model.safetensors"]);
    let dropped: BTreeSet<(String, String)> = out["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let field = |k: &str| d[k].as_str().unwrap().to_string();
            (field("file"), field("reason"))
        })
        .collect();
    let want: BTreeSet<(String, String)> = [
        ("extra.bin", "*.safetensors matched first"),
        ("old.pt", "*.safetensors matched first"),
        ("training_args.bin", "training state, not weights"),
        (
            "original/consolidated.pth",
            "in a subfolder; vLLM reads only the top level",
        ),
    ]
    .into_iter()
    .map(|(f, r)| (f.to_string(), r.to_string()))
    .collect();
    assert_eq!(dropped, want);
}

// ---------------------------------------------------------------------------------------------
// Quantization and tensor roles

/// `wload inspect DIR` (human), expected to succeed with nothing on stderr.
fn inspect_human(dir: &std::path::Path) -> String {
    let out = run(&["inspect", s(dir)]);
    assert!(out.status.success(), "{}", context(&out));
    assert!(out.stderr.is_empty(), "{}", context(&out));
    stdout(&out)
}

/// The rows of the human report's `quantization` section, up to the blank line after it.
fn quant_section(human: &str) -> String {
    let start = human
        .find("\nquantization\n")
        .unwrap_or_else(|| panic!("no quantization section:\n{human}"));
    let rest = &human[start + 1..];
    rest[..rest.find("\n\n").unwrap_or(rest.len())].to_string()
}

#[test]
fn fp8_fixtures_show_method_scheme_block_and_ignored_modules() {
    let qwen_ignored = [
        "lm_head",
        "model.layers.0.input_layernorm",
        "model.layers.0.post_attention_layernorm",
        "model.layers.1.input_layernorm",
        "model.layers.1.post_attention_layernorm",
        "model.layers.1.mlp.gate",
    ];
    let cases = [
        (
            "llama_gqa_fp8_tensor",
            json!({"method": "fp8", "scheme": "per-tensor", "weight_block_size": null,
                "activation_scheme": "static", "ignored": [], "supported": true, "refusal": null}),
            vec![
                "  method               fp8\n",
                "  weights              FP8, one scale per tensor (weight_scale)\n",
                "  activations          static (an input_scale per linear layer)\n",
                "  ignored              none\n",
            ],
        ),
        (
            "llama_gqa_fp8_block",
            json!({"method": "fp8", "scheme": "block", "weight_block_size": [32, 32],
                "activation_scheme": "dynamic", "ignored": [], "supported": true, "refusal": null}),
            vec![
                "  weights              FP8, one scale per 32×32 block (weight_scale_inv)\n",
                "  activations          dynamic (scaled at run time)\n",
            ],
        ),
        (
            "llama_gqa_ct_fp8_dynamic",
            json!({"method": "compressed-tensors", "scheme": "per-channel", "weight_block_size": null,
                "activation_scheme": "dynamic", "ignored": ["lm_head"], "supported": true, "refusal": null}),
            vec![
                "  method               compressed-tensors\n",
                "  weights              FP8, one scale per output channel (weight_scale)\n",
                "  ignored              1: lm_head\n",
            ],
        ),
        (
            "qwen3_moe_fp8_block",
            json!({"method": "fp8", "scheme": "block", "weight_block_size": [32, 32],
                "activation_scheme": "dynamic", "ignored": qwen_ignored, "supported": true,
                "refusal": null}),
            vec![
                "  weights              FP8, one scale per 32×32 block (weight_scale_inv)\n",
                "  ignored              6: lm_head, model.layers.0.input_layernorm, model.layers.0.post_attention_layernorm, model.layers.1.input_layernorm, model.layers.1.post_attention_layernorm, model.layers.1.mlp.gate\n",
            ],
        ),
    ];
    for (fixture, quant, lines) in cases {
        let dir = fixtures_dir().join(fixture);
        let out = wload_json(&["inspect", s(&dir), "--json"]);
        assert_eq!(out["quantization"], quant, "{fixture}");
        let section = quant_section(&inspect_human(&dir)) + "\n";
        for line in lines
            .iter()
            .chain(&["  wload                supported: plan, shard and load accept it\n"])
        {
            assert!(
                section.contains(line),
                "{fixture}: no {line:?} in\n{section}"
            );
        }
    }
}

/// The role a tensor name's suffix gives, computed here independently of the crate.
fn expected_role(name: &str) -> &'static str {
    let last = name.rsplit('.').next().unwrap();
    match last {
        "weight" => "weight",
        "weight_scale" | "weight_scale_inv" => "weight_scale",
        "input_scale" => "input_scale",
        "k_scale" | "v_scale" => "kv_cache_scale",
        "bias" => "bias",
        _ => "other",
    }
}

#[test]
fn every_fp8_fixture_tensor_has_its_role_and_roles_are_totalled() {
    for fixture in [
        "llama_gqa_fp8_tensor",
        "llama_gqa_fp8_block",
        "llama_gqa_ct_fp8_dynamic",
        "qwen3_moe_fp8_block",
    ] {
        let dir = fixtures_dir().join(fixture);
        let out = wload_json(&["inspect", s(&dir), "--json"]);
        let mut expected: std::collections::BTreeMap<(String, String), u64> = Default::default();
        for t in header_tensors(&dir.join("model.safetensors")) {
            *expected
                .entry((expected_role(&t.name).to_string(), t.dtype))
                .or_default() += 1;
        }
        for t in out["tensors"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            assert_eq!(t["role"], expected_role(name), "{fixture}: {name}");
        }
        let got: std::collections::BTreeMap<(String, String), u64> = out["totals"]["by_role"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let key = (
                    r["role"].as_str().unwrap().into(),
                    r["dtype"].as_str().unwrap().into(),
                );
                (key, r["tensors"].as_u64().unwrap())
            })
            .collect();
        assert_eq!(got, expected, "{fixture}");
        assert!(
            got.keys().any(|(r, d)| r == "weight" && d == "F8_E4M3"),
            "{fixture}: {got:?}"
        );
        assert!(
            got.keys().any(|(r, _)| r == "weight_scale"),
            "{fixture}: {got:?}"
        );
    }
    let section = quant_section(&inspect_human(&fixtures_dir().join("llama_gqa_fp8_tensor")));
    assert!(
        section.contains(
            "  tensors              7 BF16 weights, 14 F8_E4M3 weights, 14 F32 weight scales, 14 F32 input scales"
        ),
        "{section}"
    );
}

#[test]
fn an_unsupported_quant_method_is_described_and_its_refusal_shown_with_exit_0() {
    let tmp = copy_fixture("llama_gqa_fp8_tensor");
    let path = tmp.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    config["quantization_config"] = json!({"quant_method": "gptq", "bits": 4, "group_size": 128,
        "modules_to_not_convert": ["lm_head"]});
    write_json(&path, &config);

    let out = wload_json(&["inspect", s(tmp.path()), "--json"]);
    let q = &out["quantization"];
    assert_eq!(q["method"], "gptq");
    assert_eq!(q["supported"], false);
    assert_eq!(q["scheme"], Value::Null);
    assert_eq!(q["ignored"], json!(["lm_head"]));
    let message = q["refusal"]["message"].as_str().unwrap();
    assert!(message.contains("\"gptq\" is not supported"), "{message}");
    assert!(
        q["refusal"]["fix"]
            .as_str()
            .unwrap()
            .contains("unquantized"),
        "{q}"
    );

    let section = quant_section(&inspect_human(tmp.path()));
    assert!(
        section.contains("  method               gptq\n"),
        "{section}"
    );
    assert!(
        section.contains(&format!(
            "  wload                refused by plan, shard and load: {message}\n"
        )),
        "{section}"
    );
    assert!(
        section.contains("  fix                  use the unquantized"),
        "{section}"
    );

    // What inspect says plan does, plan does.
    let plan = run(&["plan", s(tmp.path()), "--tp", "1"]);
    assert_refused(&plan, 3, &[message]);
}

#[test]
fn an_unquantized_checkpoint_has_no_quantization_section_and_plain_roles() {
    let dir = fixtures_dir().join("llama_gqa");
    assert!(!inspect_human(&dir).contains("\nquantization\n"));
    let out = wload_json(&["inspect", s(&dir), "--json"]);
    assert_eq!(out["quantization"], Value::Null);
    let roles: BTreeSet<&str> = out["totals"]["by_role"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, BTreeSet::from(["weight"]));
}

#[test]
fn scale_tensors_without_a_quantization_config_are_pointed_out() {
    let tmp = copy_fixture("llama_gqa_fp8_block");
    let path = tmp.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    config
        .as_object_mut()
        .unwrap()
        .remove("quantization_config");
    write_json(&path, &config);
    let section = quant_section(&inspect_human(tmp.path()));
    assert!(
        section.contains("  method               none: the config has no quantization_config, yet the checkpoint has scale tensors\n"),
        "{section}"
    );
    assert!(section.contains("14 F32 weight scales"), "{section}");
    assert_eq!(
        wload_json(&["inspect", s(tmp.path()), "--json"])["quantization"],
        Value::Null
    );
}

#[test]
fn a_long_ignored_list_is_cut_short_unless_verbose() {
    let tmp = copy_fixture("llama_gqa_fp8_block");
    let path = tmp.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let names: Vec<String> = (0..300)
        .map(|i| format!("model.layers.{i}.mlp.gate"))
        .collect();
    config["quantization_config"]["modules_to_not_convert"] = json!(names);
    write_json(&path, &config);
    let short = quant_section(&inspect_human(tmp.path()));
    assert!(
        short.contains("  ignored              300: model.layers.0.mlp.gate, "),
        "{short}"
    );
    assert!(
        short.contains("model.layers.7.mlp.gate, and 292 more (-v lists all)\n"),
        "{short}"
    );
    assert!(!short.contains("model.layers.8.mlp.gate"), "{short}");
    let out = run(&["inspect", "-v", s(tmp.path())]);
    assert!(out.status.success(), "{}", context(&out));
    let long = quant_section(&stdout(&out));
    assert!(long.contains("model.layers.299.mlp.gate\n"), "{long}");
    let json = wload_json(&["inspect", s(tmp.path()), "--json"]);
    assert_eq!(json["quantization"]["ignored"], json!(names));
}

#[test]
fn the_json_schema_doc_names_every_quantization_and_role_field() {
    let doc = fs::read_to_string(manifest_dir().join("docs/inspect-json.md")).unwrap();
    let out = wload_json(&[
        "inspect",
        s(&fixtures_dir().join("llama_gqa_fp8_tensor")),
        "--json",
    ]);
    let mut keys: Vec<String> = Vec::new();
    for obj in [
        &out["quantization"],
        &out["tensors"][0],
        &out["totals"]["by_role"][0],
    ] {
        keys.extend(obj.as_object().unwrap().keys().cloned());
    }
    keys.extend(["by_role".into(), "quantization".into()]);
    for role in out["totals"]["by_role"].as_array().unwrap() {
        keys.push(role["role"].as_str().unwrap().into());
    }
    for k in keys {
        assert!(
            doc.contains(&format!("\"{k}\"")) || doc.contains(&format!("`{k}`")),
            "docs/inspect-json.md does not name {k:?}"
        );
    }
}

#[test]
fn the_role_summary_under_a_filter_counts_the_matching_tensors_and_says_so() {
    let dir = fixtures_dir().join("llama_gqa_fp8_tensor");
    let out = run(&["inspect", s(&dir), "--filter", r"layers\.0\..*_scale$"]);
    assert!(out.status.success(), "{}", context(&out));
    let section = quant_section(&stdout(&out));
    assert!(
        section.contains(
            "  tensors              7 F32 weight scales, 7 F32 input scales (of those matching /layers\\.0\\..*_scale$/)"
        ),
        "{section}"
    );
}

// ---------------------------------------------------------------------------------------------
// Structure: attention kind, experts, shared experts, dense layers, router, MTP layers

/// The rows of the human report's `structure` section, up to the blank line after it.
fn structure_section(human: &str) -> String {
    let start = human
        .find("\nstructure\n")
        .unwrap_or_else(|| panic!("no structure section:\n{human}"));
    let rest = &human[start + 1..];
    rest[..rest.find("\n\n").unwrap_or(rest.len())].to_string()
}

/// `inspect` of `dir` with `--hf-overrides`, human and JSON: the structure section and object.
fn structure_with(dir: &std::path::Path, overrides: &str) -> (String, Value) {
    let out = run(&["inspect", s(dir), "--hf-overrides", overrides]);
    assert!(out.status.success(), "{}", context(&out));
    let json = wload_json(&["inspect", s(dir), "--json", "--hf-overrides", overrides]);
    (structure_section(&stdout(&out)), json["structure"].clone())
}

fn rows(lines: &[&str]) -> String {
    let mut s = String::from("structure");
    for l in lines {
        s.push_str("\n  ");
        s.push_str(l);
    }
    s
}

#[test]
fn the_structure_section_follows_the_model_section() {
    let human = inspect_human(&fixtures_dir().join("deepseek_v3"));
    let model = human.find("\nmodel\n").expect("model section");
    let structure = human.find("\nstructure\n").expect("structure section");
    let tensors = human.find("\ntensors (").expect("tensors section");
    assert!(model < structure && structure < tensors, "{human}");
}

#[test]
fn deepseek_v3_structure_names_mla_ranks_shared_experts_dense_layers_and_mtp() {
    let dir = fixtures_dir().join("deepseek_v3");
    assert_eq!(
        structure_section(&inspect_human(&dir)),
        rows(&[
            "attention            MLA: 8 heads; q_lora_rank 96, kv_lora_rank 64 (k and v are one shared latent: no kv heads to replicate)",
            "mla head dims        qk_nope 32 + qk_rope 16, v 32",
            "experts              8 routed, 2 per token, intermediate 64",
            "shared experts       1, intermediate 64; tensor-parallel even with expert parallelism",
            "layers               layer 0 dense, 1 MoE (first_k_dense_replace 1)",
            "router               sigmoid scoring, topk_method noaux_tc: F32 e_score_correction_bias [8]",
            "mtp                  1 layer past num_hidden_layers (num_nextn_predict_layers): vLLM's main model skips it",
        ])
    );
    let out = wload_json(&["inspect", s(&dir), "--json"]);
    assert_eq!(
        out["structure"],
        json!({
            "attention": {
                "kind": "mla", "heads": 8, "q_lora_rank": 96, "kv_lora_rank": 64,
                "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32
            },
            "moe": {
                "routed_experts": 8, "experts_per_token": 2, "expert_intermediate_size": 64,
                "shared_experts": {
                    "count": 1, "intermediate_size": 64, "fused_intermediate_size": 64, "gate": null
                },
                "moe_layers": [1], "dense_layers": [0],
                "layer_rule": "first_k_dense_replace 1",
                "router": {
                    "scoring_func": "sigmoid", "topk_method": "noaux_tc",
                    "e_score_correction_bias": true, "bias": false
                }
            },
            "mtp_layers": 1
        })
    );
}

#[test]
fn qwen2_moe_structure_names_the_gated_shared_expert() {
    let dir = fixtures_dir().join("qwen2_moe");
    assert_eq!(
        structure_section(&inspect_human(&dir)),
        rows(&[
            "attention            GQA: 8 heads, 4 kv heads, head_dim 16",
            "experts              8 routed, 2 per token, intermediate 64",
            "shared experts       1, intermediate 128, scaled by sigmoid(shared_expert_gate); tensor-parallel even with expert parallelism",
            "layers               all 2 layers MoE",
            "router               softmax scoring",
        ])
    );
    let out = wload_json(&["inspect", s(&dir), "--json"]);
    let st = &out["structure"];
    assert_eq!(
        st["moe"]["shared_experts"],
        json!({"count": 1, "intermediate_size": 128, "fused_intermediate_size": 128, "gate": "sigmoid"})
    );
    assert_eq!(st["moe"]["moe_layers"], json!([0, 1]));
    assert_eq!(st["moe"]["dense_layers"], json!([]));
    assert_eq!(st["moe"]["layer_rule"], Value::Null);
    assert_eq!(st["mtp_layers"], 0);
}

#[test]
fn qwen3_moe_structure_names_the_mlp_only_layers() {
    let dir = fixtures_dir().join("qwen3_moe_fp8_block");
    assert_eq!(
        structure_section(&inspect_human(&dir)),
        rows(&[
            "attention            GQA: 8 heads, 4 kv heads, head_dim 16",
            "experts              8 routed, 2 per token, intermediate 64",
            "layers               layer 0 dense, 1 MoE (mlp_only_layers [0])",
            "router               softmax scoring",
        ])
    );
    let out = wload_json(&["inspect", s(&dir), "--json"]);
    let moe = &out["structure"]["moe"];
    assert_eq!(moe["routed_experts"], 8);
    assert_eq!(moe["shared_experts"], Value::Null);
    assert_eq!(moe["moe_layers"], json!([1]));
    assert_eq!(moe["dense_layers"], json!([0]));
    assert_eq!(moe["layer_rule"], "mlp_only_layers [0]");
}

#[test]
fn mixtral_and_gpt_oss_structure_has_experts_on_every_layer() {
    let mixtral = fixtures_dir().join("mixtral");
    assert_eq!(
        structure_section(&inspect_human(&mixtral)),
        rows(&[
            "attention            GQA: 8 heads, 2 kv heads, head_dim 16",
            "experts              4 routed, 2 per token, intermediate 128",
            "layers               all 2 layers MoE",
            "router               softmax scoring",
        ])
    );
    let out = wload_json(&["inspect", s(&mixtral), "--json"]);
    assert_eq!(
        out["structure"]["moe"],
        json!({
            "routed_experts": 4, "experts_per_token": 2, "expert_intermediate_size": 128,
            "shared_experts": null, "moe_layers": [0, 1], "dense_layers": [], "layer_rule": null,
            "router": {"scoring_func": "softmax", "topk_method": null, "e_score_correction_bias": false, "bias": false}
        })
    );

    let gpt_oss = fixtures_dir().join("gpt_oss");
    assert_eq!(
        structure_section(&inspect_human(&gpt_oss)),
        rows(&[
            "attention            GQA: 8 heads, 4 kv heads, head_dim 16",
            "experts              4 routed, 2 per token, intermediate 64",
            "layers               all 2 layers MoE",
            "router               softmax scoring, with a router bias",
        ])
    );
    let out = wload_json(&["inspect", s(&gpt_oss), "--json"]);
    assert_eq!(out["structure"]["moe"]["routed_experts"], 4);
    assert_eq!(out["structure"]["moe"]["router"]["bias"], true);
}

#[test]
fn llama_gqa_structure_is_grouped_query_attention_without_experts() {
    let dir = fixtures_dir().join("llama_gqa");
    assert_eq!(
        structure_section(&inspect_human(&dir)),
        rows(&[
            "attention            GQA: 8 heads, 4 kv heads, head_dim 16",
            "experts              none (a dense MLP on every layer)",
        ])
    );
    let out = wload_json(&["inspect", s(&dir), "--json"]);
    assert_eq!(
        out["structure"],
        json!({
            "attention": {"kind": "gqa", "heads": 8, "kv_heads": 4, "head_dim": 16},
            "moe": null,
            "mtp_layers": 0
        })
    );
    let (mqa, _) = structure_with(&dir, r#"{"num_key_value_heads": 1}"#);
    assert!(
        mqa.contains("MQA: 8 heads, 1 kv head, head_dim 16"),
        "{mqa}"
    );
    let (_, mha) = structure_with(&dir, r#"{"num_key_value_heads": 8}"#);
    assert_eq!(mha["attention"]["kind"], "mha");
}

#[test]
fn deepseek_defaults_apply_when_the_config_leaves_fields_out() {
    // DeepseekV3Config's first_k_dense_replace is 3 when config.json leaves it out; an explicit
    // null q_lora_rank means no q compression (V2-Lite); two shared experts are fused into one MLP.
    let tmp = fixture_with("deepseek_v3", |m| {
        m.remove("first_k_dense_replace").expect("stated");
    });
    let dir = tmp.path();
    let (human, st) = structure_with(
        dir,
        r#"{"num_hidden_layers": 61, "q_lora_rank": null, "n_shared_experts": 2,
            "num_nextn_predict_layers": 3}"#,
    );
    assert!(
        human.contains("q_lora_rank none (q_proj from the hidden state)"),
        "{human}"
    );
    assert!(
        human.contains("layers 0–2 dense, 3–60 MoE (first_k_dense_replace 3)"),
        "{human}"
    );
    assert!(
        human.contains("2 × 64, fused into one MLP of 128"),
        "{human}"
    );
    assert!(human.contains("3 layers past num_hidden_layers"), "{human}");
    assert_eq!(st["attention"]["q_lora_rank"], Value::Null);
    assert_eq!(st["moe"]["dense_layers"], json!([0, 1, 2]));
    assert_eq!(st["moe"]["moe_layers"].as_array().unwrap().len(), 58);
    assert_eq!(st["moe"]["shared_experts"]["fused_intermediate_size"], 128);

    // moe_layer_freq 2: every other layer from first_k_dense_replace on.
    let dir = fixtures_dir().join("deepseek_v3");
    let dir = dir.as_path();
    let (human, st) = structure_with(
        dir,
        r#"{"num_hidden_layers": 12, "first_k_dense_replace": 1, "moe_layer_freq": 2}"#,
    );
    assert_eq!(st["moe"]["moe_layers"], json!([2, 4, 6, 8, 10]));
    assert!(
        human.contains("5 MoE (2, 4, 6, …), 7 dense (first_k_dense_replace 1, moe_layer_freq 2)"),
        "{human}"
    );

    // n_routed_experts 0: vLLM builds a dense MLP everywhere.
    let (human, st) = structure_with(dir, r#"{"n_routed_experts": 0}"#);
    assert_eq!(st["moe"], Value::Null);
    assert!(
        human.contains("none (a dense MLP on every layer)"),
        "{human}"
    );

    // Without topk_method (DeepseekV3Config has none) there is no correction bias.
    let (human, st) = structure_with(dir, r#"{"topk_method": null}"#);
    assert_eq!(st["moe"]["router"]["e_score_correction_bias"], false);
    assert!(
        human.contains("router               sigmoid scoring\n"),
        "{human}\n"
    );
}

#[test]
fn qwen_sparse_step_and_no_shared_expert_are_described() {
    let (human, st) = structure_with(
        &fixtures_dir().join("qwen2_moe"),
        r#"{"num_hidden_layers": 48, "decoder_sparse_step": 2, "shared_expert_intermediate_size": 0}"#,
    );
    assert!(
        human
            .contains("layers               24 MoE (1, 3, 5, …), 24 dense (decoder_sparse_step 2)"),
        "{human}"
    );
    assert!(!human.contains("shared experts"), "{human}");
    assert_eq!(st["moe"]["shared_experts"], Value::Null);
    assert_eq!(st["moe"]["moe_layers"][0], 1);
    assert_eq!(st["moe"]["dense_layers"][0], 0);
}

#[test]
fn odd_structure_fields_are_unknown_and_inspect_still_succeeds() {
    let dir = fixtures_dir().join("deepseek_v3");
    let (human, st) = structure_with(
        &dir,
        r#"{"first_k_dense_replace": "three", "kv_lora_rank": "x", "q_lora_rank": [1],
            "moe_intermediate_size": null, "num_nextn_predict_layers": -1, "topk_method": 5}"#,
    );
    assert_eq!(
        human,
        rows(&[
            "attention            MLA: 8 heads; q_lora_rank unknown, kv_lora_rank unknown (k and v are one shared latent: no kv heads to replicate)",
            "mla head dims        qk_nope 32 + qk_rope 16, v 32",
            // An explicit null is not the class default (2048): transformers keeps None, which
            // its `int` field then refuses.
            "experts              8 routed, 2 per token, intermediate unknown",
            "shared experts       1, intermediate unknown; tensor-parallel even with expert parallelism",
            r#"layers               unknown (first_k_dense_replace = "three")"#,
            "router               sigmoid scoring",
            "mtp                  unknown",
        ])
    );
    assert_eq!(st["attention"]["q_lora_rank"], "unknown");
    assert_eq!(st["attention"]["kv_lora_rank"], Value::Null);
    assert_eq!(st["moe"]["moe_layers"], Value::Null);
    assert_eq!(st["moe"]["dense_layers"], Value::Null);
    assert_eq!(st["mtp_layers"], Value::Null);

    let (human, _) = structure_with(
        &fixtures_dir().join("qwen3_moe_fp8_block"),
        r#"{"mlp_only_layers": [0, "x"]}"#,
    );
    assert!(
        human.contains(r#"layers               unknown (mlp_only_layers = [0,"x"])"#),
        "{human}"
    );
    let (human, _) = structure_with(
        &fixtures_dir().join("qwen2_moe"),
        r#"{"decoder_sparse_step": 0}"#,
    );
    assert!(
        human.contains("layers               unknown (decoder_sparse_step 0)"),
        "{human}"
    );
}

#[test]
fn an_absurd_layer_count_is_not_listed() {
    let started = std::time::Instant::now();
    let (human, st) = structure_with(
        &fixtures_dir().join("deepseek_v3"),
        r#"{"num_hidden_layers": 1000000000000}"#,
    );
    assert!(human.contains("layers               unknown\n"), "{human}");
    assert_eq!(st["moe"]["moe_layers"], Value::Null);
    assert!(started.elapsed().as_secs() < 30, "{:?}", started.elapsed());

    // The most layers listed: a per-layer linear search took 28 s here (debug build).
    let started = std::time::Instant::now();
    let (human, st) = structure_with(
        &fixtures_dir().join("deepseek_v3"),
        r#"{"num_hidden_layers": 65536, "first_k_dense_replace": 3}"#,
    );
    assert!(
        human.contains("layers 0–2 dense, 3–65535 MoE (first_k_dense_replace 3)"),
        "{human}"
    );
    assert_eq!(st["moe"]["moe_layers"].as_array().unwrap().len(), 65533);
    assert!(started.elapsed().as_secs() < 10, "{:?}", started.elapsed());
}

#[test]
fn the_json_schema_doc_names_every_structure_field() {
    let doc = fs::read_to_string(manifest_dir().join("docs/inspect-json.md")).unwrap();
    let mut keys: Vec<String> = vec!["structure".into()];
    for fixture in ["deepseek_v3", "qwen2_moe", "llama_gqa"] {
        let out = wload_json(&["inspect", s(&fixtures_dir().join(fixture)), "--json"]);
        let st = &out["structure"];
        let mut objs = vec![st, &st["attention"]];
        if st["moe"].is_object() {
            objs.extend([&st["moe"], &st["moe"]["router"]]);
            if st["moe"]["shared_experts"].is_object() {
                objs.push(&st["moe"]["shared_experts"]);
            }
        }
        for o in objs {
            keys.extend(o.as_object().unwrap().keys().cloned());
        }
    }
    for k in keys {
        assert!(
            doc.contains(&format!("\"{k}\"")),
            "docs/inspect-json.md does not name {k:?}"
        );
    }
}

#[test]
fn glm4_moe_defaults_give_one_dense_layer_a_shared_expert_and_one_mtp_layer() {
    // No GLM fixture: the Qwen3-MoE one read as Glm4MoeForCausalLM, with the fields Glm4MoeConfig
    // defaults (first_k_dense_replace 1, n_shared_experts 1, one MTP layer) left out.
    let (human, st) = structure_with(
        &fixtures_dir().join("qwen3_moe_fp8_block"),
        r#"{"architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe",
            "num_experts": null, "num_local_experts": null, "n_routed_experts": 16,
            "num_hidden_layers": 4, "mlp_only_layers": null}"#,
    );
    assert_eq!(
        human,
        rows(&[
            "attention            GQA: 8 heads, 4 kv heads, head_dim 16",
            "experts              16 routed, 2 per token, intermediate 64",
            "shared experts       1, intermediate 64; tensor-parallel even with expert parallelism",
            "layers               layer 0 dense, 1–3 MoE (first_k_dense_replace 1)",
            "router               sigmoid scoring: F32 e_score_correction_bias [16]",
            "mtp                  1 layer past num_hidden_layers (num_nextn_predict_layers): vLLM's main model skips it",
        ])
    );
    assert_eq!(st["mtp_layers"], 1);
    assert_eq!(st["moe"]["router"]["e_score_correction_bias"], true);
}

/// A family only a mapping file knows: its structure comes from the file (which layers build
/// experts, their count and width, shared experts, the router's bias, the layers `skip_layer`
/// skips, the scoring its defaults name), with no Rust for it.
const CUSTOM_MOE_MAPPING: &str = r#"
family: custom_moe
description: a made-up MoE family known only to this file
architectures: [CustomMoeForCausalLM]
defaults:
  dense_head_layers: 1
  n_shared_experts: 2
  scoring_func: sigmoid
  mtp_depth: 2
derive:
  shared_size: moe_intermediate_size * n_shared_experts
  moe_layer: "i >= dense_head_layers && i % 2 == 1"
skip_layer: i >= num_hidden_layers && i < num_hidden_layers + mtp_depth
parameters:
  layer:
    - name: model.layers.{i}.mlp.router.bias
      when: moe_layer
      layout: {kind: replicated, shape: [num_experts]}
    - name: model.layers.{i}.mlp.shared_experts.gate_up_proj.weight
      when: moe_layer
      layout: {kind: merged_column, sizes: [shared_size, shared_size], inner: [hidden_size]}
    - name: model.layers.{i}.mlp.experts.w13_weight
      when: moe_layer
      layout: {kind: experts, part: w13, experts: num_experts * 2, intermediate: moe_intermediate_size, hidden: hidden_size}
"#;

#[test]
fn a_family_only_its_mapping_file_knows_gets_its_structure_from_the_file() {
    let work = TempDir::new().unwrap();
    let file = work.path().join("custom_moe.yaml");
    fs::write(&file, CUSTOM_MOE_MAPPING).unwrap();
    let dir = fixtures_dir().join("qwen3_moe_fp8_block");
    let overrides = r#"{"architectures": ["CustomMoeForCausalLM"], "num_hidden_layers": 6,
                        "mlp_only_layers": null, "dense_head_layers": 3}"#;
    let args = |json: bool| {
        let mut a = vec![
            "inspect",
            s(&dir),
            "--hf-overrides",
            overrides,
            "--mapping",
            s(&file),
        ];
        if json {
            a.push("--json");
        }
        a
    };
    let out = run(&args(false));
    assert!(out.status.success(), "{}", context(&out));
    assert_eq!(
        structure_section(&stdout(&out)),
        rows(&[
            "attention            GQA: 8 heads, 4 kv heads, head_dim 16",
            "experts              16 routed, 2 per token, intermediate 64",
            "shared experts       2 × 64, fused into one MLP of 128; tensor-parallel even with expert parallelism",
            "layers               layers 0–2 dense, 3 MoE, 4 dense, 5 MoE (dense_head_layers 3)",
            "router               sigmoid scoring, with a router bias",
            "mtp                  2 layers past num_hidden_layers (mtp_depth): vLLM's main model skips them",
        ])
    );
    let st = wload_json(&args(true))["structure"].clone();
    assert_eq!(st["moe"]["moe_layers"], json!([3, 5]));
    assert_eq!(st["moe"]["dense_layers"], json!([0, 1, 2, 4]));
    assert_eq!(st["moe"]["layer_rule"], "dense_head_layers 3");
    assert_eq!(st["moe"]["shared_experts"]["count"], 2);
    assert_eq!(st["mtp_layers"], 2);

    // Without the file wload has no mapping for the architecture: the config's experts only.
    let (human, st) = structure_with(&dir, overrides);
    assert!(human.contains("layers               unknown"), "{human}");
    assert_eq!(st["moe"]["routed_experts"], 8);
    assert_eq!(st["moe"]["moe_layers"], Value::Null);

    // A mapping file that is not there is refused, as by plan.
    let missing = work.path().join("missing.yaml");
    let out = run(&["inspect", s(&dir), "--mapping", s(&missing)]);
    assert_refused(&out, 2, &["missing.yaml", "cannot read"]);
}

/// `inspect` of `wload shard`'s output: per rank and part, counted independently from the
/// files' headers, the layout from wload.json, complete, and how to check and serve it.
#[test]
fn a_pre_sharded_folder_is_described_rank_by_rank() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(
        &fixtures_dir().join("llama_gqa"),
        2,
        &out,
        &["--pp", "2", "-q"],
    );
    let v = wload_json(&["inspect", s(&out), "--json"]);
    assert_eq!(v["kind"], "pre-sharded");
    assert_eq!(v["schema_version"], 1);
    assert_eq!(v["written_for"]["tp"], 2);
    assert_eq!(v["written_for"]["pp"], 2);
    assert_eq!(v["written_for"]["from"], "wload.json");
    assert_eq!(v["written_for"]["expert_parallel"], false);
    assert_eq!(v["world_size"], 4);
    assert_eq!(v["complete"], true, "{v:#}");
    let ranks = v["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 4);
    let mut all = 0;
    for (g, r) in ranks.iter().enumerate() {
        let (p, t) = (g as u64 / 2, g as u64 % 2);
        assert_eq!(
            (
                r["rank"].as_u64(),
                r["pp_rank"].as_u64(),
                r["tp_rank"].as_u64()
            ),
            (Some(g as u64), Some(p), Some(t))
        );
        let file = out.join(format!("model-pp-{p}-tp-{t}-part-0.safetensors"));
        let n = header_tensors(&file).len();
        assert_eq!(r["files"][0]["tensors"].as_u64(), Some(n as u64));
        assert_eq!(
            r["files"][0]["size"].as_u64(),
            Some(fs::metadata(&file).unwrap().len())
        );
        assert_eq!(r["files"][0]["size_matches_manifest"], true);
        all += n;
    }
    assert_eq!(v["totals"]["tensors"].as_u64(), Some(all as u64));
    assert_eq!(v["totals"]["files"], 4);
    assert!(
        v["serve"]["shell"]
            .as_str()
            .unwrap()
            .contains("--pipeline-parallel-size 2")
    );

    let human = stdout(&run(&["inspect", s(&out)]));
    for want in [
        "pre-sharded folder",
        "written  for --tp 2 --pp 2 (per wload.json",
        "model-pp-1-tp-1-part-0.safetensors",
        "complete yes: all 4 ranks of --tp 2 --pp 2 have their files",
        "serve    vllm serve",
    ] {
        assert!(human.contains(want), "{want:?} in:\n{human}");
    }
    // --filter counts only the matching tensors.
    let f = wload_json(&["inspect", s(&out), "--json", "--filter", "embed_tokens"]);
    assert_eq!(f["totals"]["tensors"], 2, "{f:#}");
}

/// What makes a folder incomplete is each named, with a fix; inspect still exits 0 and says
/// `complete: false`.
#[test]
fn an_incomplete_pre_sharded_folder_says_what_is_missing() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(&fixtures_dir().join("llama_gqa"), 4, &out, &["-q"]);
    fs::remove_file(out.join("model-rank-2-part-0.safetensors")).unwrap();
    let f1 = out.join("model-rank-1-part-0.safetensors");
    let len = fs::metadata(&f1).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&f1)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    fs::write(
        out.join("model-rank-3-part-1.safetensors"),
        b"not safetensors",
    )
    .unwrap();
    let v = wload_json(&["inspect", s(&out), "--json"]);
    assert_eq!(v["complete"], false);
    let problems: Vec<String> = v["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            assert!(p["fix"].is_string(), "{p}");
            p["message"].as_str().unwrap().to_string()
        })
        .collect();
    let has = |s: &str| problems.iter().any(|p| p.contains(s));
    assert!(has("no files for rank 2 of --tp 4"), "{problems:#?}");
    assert!(
        has(&format!("{} bytes, but wload.json records {len}", len - 10)),
        "{problems:#?}"
    );
    assert!(
        has("model-rank-3-part-1.safetensors: not listed in wload.json"),
        "{problems:#?}"
    );
    assert!(
        has("wload.json lists files that are gone: model-rank-2-part-0.safetensors"),
        "{problems:#?}"
    );
    let human = stdout(&run(&["inspect", s(&out)]));
    assert!(human.contains("complete no, "), "{human}");
    assert!(human.contains("unreadable"), "{human}");
}

/// vLLM's own output has no wload.json: the layout is read from the file names, the load command
/// then carries the flags, and a hostile name (a rank past u64's usual range, gaps in the parts)
/// neither hangs nor panics.
#[test]
fn a_pre_sharded_folder_without_manifest_is_inferred_from_names() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(
        &fixtures_dir().join("llama_gqa"),
        2,
        &out,
        &["-q", "--max-part-size", "100000"],
    );
    fs::remove_file(out.join("wload.json")).unwrap();
    let v = wload_json(&["inspect", s(&out), "--json"]);
    assert_eq!(v["written_for"]["from"], "file names");
    assert_eq!(v["written_for"]["tp"], 2);
    assert_eq!(v["written_for"]["expert_parallel"], Value::Null);
    assert_eq!(v["complete"], true, "{v:#}");
    assert!(v["ranks"][0]["files"].as_array().unwrap().len() > 1);
    assert_eq!(
        v["check_with"],
        format!("wload load {} --tp 2 --dry-run --read", s(&out))
    );
    assert_eq!(v["serve"], Value::Null);

    fs::remove_file(out.join("model-rank-0-part-1.safetensors")).unwrap();
    let v = wload_json(&["inspect", s(&out), "--json"]);
    assert_eq!(v["complete"], false);
    assert!(
        v["problems"][0]["message"]
            .as_str()
            .unwrap()
            .contains("gaps"),
        "{v:#}"
    );

    fs::copy(
        out.join("model-rank-0-part-0.safetensors"),
        out.join("model-rank-18446744073709551615-part-0.safetensors"),
    )
    .unwrap();
    let o = run(&["inspect", s(&out), "--json"]);
    assert!(o.status.success(), "{}", context(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["complete"], false);
    // Both patterns, stages and TP ranks near u64::MAX.
    fs::copy(
        out.join("model-rank-0-part-0.safetensors"),
        out.join("model-pp-18446744073709551615-tp-18446744073709551615-part-0.safetensors"),
    )
    .unwrap();
    let o = run(&["inspect", s(&out)]);
    assert!(o.status.success(), "{}", context(&o));
    assert!(stdout(&o).contains("mixes"), "{}", stdout(&o));
}

/// A hand-edited wload.json with impossible sizes is reported against, not divided by.
#[test]
fn a_manifest_claiming_tp_zero_does_not_crash_inspect() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(&fixtures_dir().join("llama_gqa"), 2, &out, &["-q"]);
    let path = out.join("wload.json");
    let mut m: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    m["tp"] = json!(0);
    m["pp"] = json!(0);
    fs::write(&path, serde_json::to_vec(&m).unwrap()).unwrap();
    let v = wload_json(&["inspect", s(&out), "--json"]);
    assert_eq!(v["written_for"]["tp"], 1);
    assert_eq!(v["complete"], false, "{v:#}");
    assert!(
        v["problems"][0]["message"]
            .as_str()
            .unwrap()
            .contains("files beyond --tp 1"),
        "{v:#}"
    );
    assert_refused(
        &run(&["load", s(&out), "--dry-run"]),
        3,
        &["records tp 0 and pp 0", "damaged"],
    );
}
