//! vLLM's own sharded_state output (rank files, no wload.json): `load` reads TP and PP from the
//! file names, as `inspect` does, and refuses a `--tp` or `--pp` the names contradict, naming both.

use super::*;

/// vLLM's llama_gqa folder at TP 8, loaded with no `--tp`: the names give 8, for the dry run and
/// for a load into host memory, and the note says where the size came from.
#[test]
fn a_vllm_folder_loads_at_the_tp_its_file_names_say() {
    let dir = expected("llama_gqa", 8);
    for extra in [&["--dry-run"][..], &[]] {
        let mut args = vec![s(&dir), "--device", "cpu", "--json"];
        args.extend_from_slice(extra);
        let out = load(&args);
        assert!(out.status.success(), "{}", load_context(&args, &out));
        let v: Value = json_doc(&["load"], &out);
        assert_eq!(v["tp"].as_u64(), Some(8), "{v:#}");
        assert!(v["pp"].as_u64().is_none_or(|p| p == 1), "{v:#}");
        assert_eq!(v["kind"], "pre-sharded", "{v:#}");
        assert!(
            stderr(&out).contains("--tp 8 taken from the file names in")
                && stderr(&out).contains("model-rank-*-part-*.safetensors; no wload.json"),
            "{}",
            stderr(&out)
        );
    }
    // The same size given is no news: no note.
    let out = load(&[s(&dir), "--tp", "8", "--device", "cpu", "--dry-run"]);
    assert!(out.status.success(), "{}", context(&out));
    assert!(!stderr(&out).contains("taken from"), "{}", stderr(&out));
}

/// A `--tp` the names contradict (files of ranks beyond it) is refused before planning, with
/// both sizes and the ranks the files hold. A larger `--tp` is not contradicted by the names (a
/// node may hold only some ranks' files): the pre-sharded check names the missing ranks.
#[test]
fn a_tp_the_file_names_contradict_is_refused_naming_both() {
    let dir = expected("llama_gqa", 8);
    for tp in ["1", "2", "4"] {
        let o = assert_fails(
            &[s(&dir), "--tp", tp, "--device", "cpu", "--dry-run"],
            &[],
            3,
            &[
                &format!("--tp {tp} disagrees with the file names in {}", s(&dir)),
                "model-rank-*-part-*.safetensors files are for TP ranks 0-7",
                "written for --tp 8",
                "load with --tp 8, or leave --tp out",
            ],
        );
        // One problem, not one per tensor.
        assert!(
            stderr(&o).starts_with("error: 1 problem found"),
            "{}",
            stderr(&o)
        );
    }
    // Refused for what it is (8 heads over 16 ranks), not by the names (faults.rs's
    // missing_rank_file_is_named has a rank's files missing under the right --tp).
    let o = assert_fails(
        &[s(&dir), "--tp", "16", "--dry-run"],
        &[],
        3,
        &["by tp (16)"],
    );
    assert!(!stderr(&o).contains("file names"), "{}", stderr(&o));
    // --json: the same problem, in the error document.
    let out = load(&[s(&dir), "--tp", "2", "--dry-run", "--json"]);
    let v: Value = json_doc(&["load"], &out);
    assert_eq!(v["error"]["kind"], "checkpoint");
    assert_eq!(v["problem_count"], 1);
}

/// A pipeline-parallel folder (`model-pp-{p}-tp-{t}-part-{k}`) without its manifest: both sizes
/// from the names; a `--pp` they contradict is refused, and so is `--pp 2` on TP-only names.
#[test]
fn pp_is_read_from_the_file_names_too() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(&fixtures_dir().join(GQA), 2, &out, &["--pp", "2", "-q"]);
    fs::remove_file(out.join("wload.json")).unwrap();
    let o = load(&[s(&out), "--device", "cpu", "--json"]);
    assert!(o.status.success(), "{}", context(&o));
    let v: Value = json_doc(&["load"], &o);
    assert_eq!((v["tp"].as_u64(), v["pp"].as_u64()), (Some(2), Some(2)));
    assert!(
        stderr(&o).contains("--tp 2 --pp 2 taken from the file names"),
        "{}",
        stderr(&o)
    );

    assert_fails(
        &[s(&out), "--pp", "1", "--dry-run"],
        &[],
        3,
        &[
            "--pp 1 disagrees with the file names",
            "model-pp-*-tp-*-part-*.safetensors files are for pipeline stages 0-1",
            "written for --pp 2",
        ],
    );
    assert_fails(
        &[s(&expected("llama_gqa", 2)), "--pp", "2", "--dry-run"],
        &[],
        3,
        &[
            "--pp 2 disagrees",
            "named without a pipeline stage",
            "--pp 1",
        ],
    );
}
