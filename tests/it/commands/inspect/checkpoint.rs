//! The golden fixtures' tensor tables, file selection, the index, filters, overrides and human output.

use super::*;

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
    assert_refusal_text(
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
    assert_refusal_text(
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
        assert_refusal_text(&out, 3, &[target, "outside"]);
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
    assert_refusal_text(
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
    assert_refusal_text(
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
    assert_refusal_text(&run(&["inspect", s(&missing)]), 2, &["no-such-checkpoint"]);
}

#[test]
fn source_that_is_a_file_is_a_usage_error() {
    let dir = fixtures_dir().join("llama_gqa");
    assert_refusal_text(
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
        let err = assert_refusal_text(&run(&["inspect", s(&dir), "--hf-overrides", bad]), 2, &[]);
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
    assert_refusal_text(
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
