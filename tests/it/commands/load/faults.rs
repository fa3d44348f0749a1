//! Planted faults (renamed, truncated, missing, unexpected, flipped) are refused, by name.

use super::*;

// ---------------------------------------------------------------------------------------------
// 4. Planted faults
// ---------------------------------------------------------------------------------------------

/// A tensor renamed in one fixture file: nothing maps it, and the parameter it filled is empty.
#[test]
fn renamed_tensor_is_named() {
    let tmp = copy_fixture(GQA);
    let file = tmp.path().join("model-00003-of-00006.safetensors");
    edit_header(&file, |h| {
        let v = h
            .remove("model.layers.0.mlp.down_proj.weight")
            .expect("tensor in shard 3");
        h.insert("model.layers.0.mlp.down_projection.weight".into(), v);
    });
    let out = assert_fails(
        &[s(tmp.path()), "--tp", "2", "--device", "cpu", "--dry-run"],
        &[],
        3,
        &["model.layers.0.mlp.down_projection.weight"],
    );
    assert!(
        stderr(&out).contains("model.layers.0.mlp.down_proj.weight"),
        "the unfilled parameter is named too: {}",
        stderr(&out)
    );
}

/// A fixture shard missing its last 10 bytes: the file is named, with or without --dry-run.
#[test]
fn truncated_shard_is_named() {
    let tmp = copy_fixture(GQA);
    let file = tmp.path().join("model-00003-of-00006.safetensors");
    let len = fs::metadata(&file).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len - 10)
        .unwrap();
    let d = s(tmp.path());
    for extra in [&["--dry-run"][..], &["--dry-run", "--read"], &[]] {
        let mut args = vec![d, "--tp", "2", "--device", "cpu"];
        args.extend(extra);
        assert_fails(
            &args,
            &[],
            3,
            &["model-00003-of-00006.safetensors", "truncated"],
        );
    }
}

/// A folder sharded at TP 2 loaded at TP 4 (missing ranks 2 and 3, shapes too big) and at TP 1
/// (rank 1 beyond TP, shapes too small, which vLLM would accept silently).
#[test]
fn pre_sharded_folder_with_the_wrong_tp() {
    let (_tmp, out) = shard_fixture(GQA, 2);
    let d = s(&out);
    let o = assert_fails(
        &[d, "--tp", "4", "--device", "cpu", "--dry-run"],
        &[],
        3,
        &["rank 2", "rank 3", "shape", "--tp 2"],
    );
    assert!(stderr(&o).contains("model-rank-2-part-"), "{}", stderr(&o));
    assert_fails(
        &[d, "--tp", "1", "--device", "cpu", "--dry-run"],
        &[],
        3,
        &["beyond --tp 1", "ranks 1,", "shape"],
    );
    // Not a dry run: the same refusal, before any device is touched.
    assert_fails(
        &[d, "--tp", "1", "--device", "cpu"],
        &[],
        3,
        &["beyond --tp 1"],
    );
}

/// A rank file that is a dangling link (a folder copied without its link targets) is the
/// folder's fault like every other bad entry: exit 3 naming the link and its target, not an
/// I/O failure (exit 1).
#[test]
fn pre_sharded_rank_file_that_is_a_dangling_link() {
    let (_tmp, out) = shard_fixture(GQA, 2);
    let f = out.join("model-rank-1-part-0.safetensors");
    fs::remove_file(&f).unwrap();
    std::os::unix::fs::symlink(out.join("gone.safetensors"), &f).unwrap();
    for extra in [
        &["--dry-run"][..],
        &["--dry-run", "--read"],
        &["--device", "cpu"],
    ] {
        let mut args = vec![s(&out)];
        args.extend_from_slice(extra);
        let o = assert_fails(&args, &[], 3, &["model-rank-1-part-0.safetensors"]);
        assert!(
            stderr(&o).contains("symbolic link") && stderr(&o).contains("gone.safetensors"),
            "{}",
            stderr(&o)
        );
    }
}

/// vLLM's folder (no manifest to say its TP) at the wrong TP: its file names say the TP it was
/// written for, and the refusal names both (vllm_folders.rs has the rest).
#[test]
fn vllm_folder_with_the_wrong_tp() {
    let dir = expected("qwen2", 4);
    assert_fails(
        &[s(&dir), "--tp", "2", "--device", "cpu", "--dry-run"],
        &[],
        3,
        &[
            "--tp 2 disagrees with the file names",
            "TP ranks 0-3",
            "--tp 4",
        ],
    );
}

/// A copy of vLLM's `llama_gqa/tp2` folder, made writable.
fn copy_vllm_folder() -> TempDir {
    let src = expected("llama_gqa", 2);
    let tmp = TempDir::new().unwrap();
    for e in fs::read_dir(&src).unwrap() {
        let e = e.unwrap();
        let to = tmp.path().join(e.file_name());
        fs::copy(e.path(), &to).unwrap();
        let mut perms = fs::metadata(&to).unwrap().permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perms.set_readonly(false);
        fs::set_permissions(&to, perms).unwrap();
    }
    tmp
}

/// One rank's file deleted: rank 1 is named; loading only rank 0 still works.
#[test]
fn missing_rank_file_is_named() {
    let tmp = copy_vllm_folder();
    fs::remove_file(tmp.path().join("model-rank-1-part-0.safetensors")).unwrap();
    let d = s(tmp.path());
    assert_fails(
        &[d, "--tp", "2", "--device", "cpu", "--dry-run"],
        &[],
        3,
        &["rank 1", "model-rank-1-part-"],
    );
    let r = json_ok(
        &[d, "--tp", "2", "--device", "cpu", "--ranks", "0", "--json"],
        &[],
    );
    assert_eq!(reported_ranks(&r), vec![0]);
}

/// A tensor vLLM has no parameter for, added to a rank file: named (vLLM raises KeyError).
#[test]
fn unexpected_tensor_in_a_rank_file_is_named() {
    let tmp = copy_vllm_folder();
    let out = tmp.path();
    let file = out.join("model-rank-1-part-0.safetensors");
    let mut raw = RawFile::read(&file);
    let mut h = raw.header();
    let start = raw.data.len();
    raw.data.extend_from_slice(&[0u8; 8]);
    h.insert(
        "model.layers.0.self_attn.extra_bias".into(),
        serde_json::json!({"dtype": "F32", "shape": [2], "data_offsets": [start, start + 8]}),
    );
    raw.header_text = serde_json::to_vec(&Value::Object(h)).unwrap();
    while !raw.header_text.len().is_multiple_of(8) {
        raw.header_text.push(b' ');
    }
    raw.write(&file);
    assert_fails(
        &[s(out), "--tp", "2", "--device", "cpu", "--dry-run"],
        &[],
        3,
        &[
            "model.layers.0.self_attn.extra_bias",
            "model-rank-1-part-0.safetensors",
        ],
    );
}

/// A folder written by `wload shard` loads back to vLLM's bytes and its manifest matches under
/// `--dry-run --read`. Then a flipped data byte (the header stays valid): `--dry-run` cannot see
/// it, `--dry-run --read` finds it through wload.json's checksum.
#[test]
fn flipped_byte_is_caught_by_dry_run_read_only() {
    let (_tmp, out) = shard_fixture(GQA, 2);
    let d = s(&out);
    let case = golden_cases()
        .into_iter()
        .find(|c| c.name == "llama_gqa/tp2")
        .expect("llama_gqa/tp2 golden case");
    let report = json_ok(
        &[d, "--tp", "2", "--device", "cpu", "--checksums", "--json"],
        &[],
    );
    assert_eq!(report["kind"], "pre-sharded");
    assert_none(
        "wload's own shards",
        &compare("shard", &case, &report, &[0, 1]),
    );
    let r = json_ok(
        &[
            d,
            "--tp",
            "2",
            "--device",
            "cpu",
            "--dry-run",
            "--read",
            "--json",
        ],
        &[],
    );
    let files = r["files_read"].as_array().unwrap();
    assert_eq!(files.len(), 2, "{r}");
    assert!(files.iter().all(|f| f["matches_manifest"] == true), "{r}");
    assert_none("hashes", &check_files_read("shard", &out, &r));

    let file = out.join("model-rank-0-part-0.safetensors");
    let mut bytes = fs::read(&file).unwrap();
    let at = bytes.len() - 100;
    bytes[at] ^= 0x5a;
    fs::write(&file, &bytes).unwrap();
    let plain = load(&[d, "--tp", "2", "--device", "cpu", "--dry-run"]);
    assert!(plain.status.success(), "{}", context(&plain));
    assert_fails(
        &[d, "--tp", "2", "--device", "cpu", "--dry-run", "--read"],
        &[],
        3,
        &["model-rank-0-part-0.safetensors", "checksum", "manifest"],
    );
    // The untouched rank alone still reads clean.
    let r = json_ok(
        &[
            d,
            "--tp",
            "2",
            "--device",
            "cpu",
            "--dry-run",
            "--read",
            "--ranks",
            "1",
            "--json",
        ],
        &[],
    );
    let files = r["files_read"].as_array().unwrap();
    assert_eq!(files.len(), 1, "{r}");
    assert_eq!(files[0]["matches_manifest"], true, "{r}");
}

/// A manifest written before block checksums (`xxh3`: XXH3-64 of the whole file) still checks
/// its folder: an untouched file matches, a changed one is named.
#[test]
fn manifest_with_whole_file_hashes_still_checks() {
    let (_tmp, out) = shard_fixture(GQA, 2);
    let d = s(&out);
    let manifest = out.join("wload.json");
    let mut m: Value = serde_json::from_slice(&fs::read(&manifest).unwrap()).unwrap();
    for f in m["files"].as_array_mut().unwrap() {
        let bytes = fs::read(out.join(f["name"].as_str().unwrap())).unwrap();
        let f = f.as_object_mut().unwrap();
        assert!(f.remove("xxh3_64k").is_some(), "{f:?}");
        f.insert("xxh3".into(), Value::String(hex(&bytes)));
    }
    fs::write(&manifest, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
    let read = [d, "--tp", "2", "--device", "cpu", "--dry-run", "--read"];
    let r = json_ok(&[&read[..], &["--json"]].concat(), &[]);
    let files = r["files_read"].as_array().unwrap();
    assert_eq!(files.len(), 2, "{r}");
    assert!(files.iter().all(|f| f["matches_manifest"] == true), "{r}");

    let file = out.join("model-rank-1-part-0.safetensors");
    let mut bytes = fs::read(&file).unwrap();
    let at = bytes.len() - 3;
    bytes[at] ^= 0x01;
    fs::write(&file, &bytes).unwrap();
    assert_fails(
        &read,
        &[],
        3,
        &["model-rank-1-part-0.safetensors", "checksum", "manifest"],
    );
}
