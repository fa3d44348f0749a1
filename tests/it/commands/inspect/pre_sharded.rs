//! `inspect` of a pre-sharded folder (wload shard's output), complete or not.

use super::*;

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
    // Reported whole, then refused as `load` would refuse it (exit 3).
    let v = wload_json_exit(&["inspect", s(&out), "--json"], 3);
    assert_eq!(v["complete"], false);
    assert_eq!(
        v["serve"],
        Value::Null,
        "no serve line for an incomplete folder"
    );
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
        has("model-rank-3-part-1.safetensors listed in no run record (wload.json)"),
        "{problems:#?}"
    );
    assert!(
        has("wload.json lists files that are gone: model-rank-2-part-0.safetensors"),
        "{problems:#?}"
    );
    let o = run(&["inspect", s(&out)]);
    assert_eq!(o.status.code(), Some(3), "{}", context(&o));
    let human = stdout(&o);
    assert!(human.contains("complete no, "), "{human}");
    assert!(!human.contains("\nserve "), "{human}");
    assert!(human.contains("unreadable"), "{human}");
    // The problems are listed once, in the report; stderr says what failed and where they are.
    let err = stderr(&o);
    assert!(!err.contains("no files for rank 2"), "listed twice:\n{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.ends_with("(listed above)\n"), "{err}");
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
    let v = wload_json_exit(&["inspect", s(&out), "--json"], 3);
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
    let v = wload_json_exit(&["inspect", s(&out), "--json"], 3);
    assert_eq!(v["complete"], false);
    // Both patterns, stages and TP ranks near u64::MAX.
    fs::copy(
        out.join("model-rank-0-part-0.safetensors"),
        out.join("model-pp-18446744073709551615-tp-18446744073709551615-part-0.safetensors"),
    )
    .unwrap();
    let o = run(&["inspect", s(&out)]);
    assert_eq!(o.status.code(), Some(3), "{}", context(&o));
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
    let v = wload_json_exit(&["inspect", s(&out), "--json"], 3);
    assert_eq!(v["written_for"]["tp"], 1);
    assert_eq!(v["complete"], false, "{v:#}");
    assert!(
        v["problems"][0]["message"]
            .as_str()
            .unwrap()
            .contains("files beyond --tp 1"),
        "{v:#}"
    );
    assert_refusal_text(
        &run(&["load", s(&out), "--dry-run"]),
        3,
        &["records tp 0 and pp 0", "damaged"],
    );
}
