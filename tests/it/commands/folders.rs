//! Output folders after they leave `shard`: copied elsewhere (the serve line names where they are
//! now, and the pipeline partition they were written with), and put together from `--ranks` runs
//! on several machines (one complete output; runs of different plans refused, naming the files).

use std::fs;
use std::path::Path;

use serde_json::Value;
use tempfile::TempDir;

use crate::support::*;

const GQA: &str = "llama_gqa";
const PARTITION: &str = "VLLM_PP_LAYER_PARTITION";

/// `wload ARGS…` with `VLLM_PP_LAYER_PARTITION` set to `partition` (or unset), run in `cwd`.
fn run_with(cwd: &Path, partition: Option<&str>, args: &[&str]) -> std::process::Output {
    let mut cmd = wload();
    cmd.current_dir(cwd).args(args).env_remove(PARTITION);
    if let Some(p) = partition {
        cmd.env(PARTITION, p);
    }
    cmd.output().unwrap()
}

/// The environment assignments and the words of a serve line, as a shell reads them.
fn env_and_words(line: &str) -> (Vec<(String, String)>, Vec<String>) {
    let words = shell_words(line);
    let n = words.iter().take_while(|w| w.contains('=')).count();
    let env = words[..n]
        .iter()
        .map(|w| {
            let (k, v) = w.split_once('=').unwrap();
            (k.to_string(), v.to_string())
        })
        .collect();
    (env, words[n..].to_vec())
}

/// Sharded with a partition, copied elsewhere: `inspect` (run from another directory) prints a
/// serve line naming the copy's absolute path and the partition, and each stage's layers;
/// `load --dry-run` with the printed environment passes, and without it names the variable.
#[test]
fn a_partitioned_folder_copied_elsewhere_says_how_to_serve_it() {
    let work = TempDir::new().unwrap();
    let ck = work.path().join("three-layers");
    fs::create_dir_all(&ck).unwrap();
    many_layers_checkpoint(&ck, 3, |n| n);
    let out = work.path().join("out");
    let o = run_with(
        work.path(),
        Some("1,2"),
        &[
            "shard",
            "three-layers",
            "--tp",
            "2",
            "--pp",
            "2",
            "-o",
            "out",
        ],
    );
    assert!(o.status.success(), "{}", context(&o));
    let m: Value = serde_json::from_slice(&fs::read(out.join("wload.json")).unwrap()).unwrap();
    assert_eq!(m["pp_layer_partition"], "1,2", "{m:#}");
    assert!(
        stdout(&o).contains(&format!(
            "serve with: {PARTITION}=1,2 vllm serve {} ",
            out.display()
        )),
        "{}",
        stdout(&o)
    );

    let elsewhere = work.path().join("moved/here");
    copy_files(&out, &elsewhere);
    fs::remove_dir_all(&out).unwrap();
    let i = run_with(Path::new("/"), None, &["inspect", s(&elsewhere)]);
    assert!(i.status.success(), "{}", context(&i));
    let text = stdout(&i);
    assert!(text.contains("stage 0  layer 0\n"), "{text}");
    assert!(text.contains("stage 1  layers 1–2 (2 layers)\n"), "{text}");
    let line = text
        .lines()
        .find_map(|l| l.strip_prefix("serve    "))
        .unwrap_or_else(|| panic!("no serve line: {text}"));
    let (env, words) = env_and_words(line);
    assert_eq!(env, [(PARTITION.to_string(), "1,2".to_string())], "{line}");
    assert_eq!(words[..3], ["vllm", "serve", s(&elsewhere)], "{line}");
    assert!(
        words
            .windows(2)
            .any(|w| w == ["--pipeline-parallel-size", "2"]),
        "{line}"
    );
    let j = wload_json(&["inspect", s(&elsewhere), "--json"]);
    assert_eq!(j["serve"]["env"][PARTITION], "1,2", "{j:#}");
    assert_eq!(j["stages"][1]["layers"], serde_json::json!([1, 2]), "{j:#}");

    // The printed environment loads; without it, the variable is the fix named.
    let (k, v) = &env[0];
    let ok = run_with(
        Path::new("/"),
        Some(v),
        &["load", s(&elsewhere), "--dry-run", "--read"],
    );
    assert_eq!(k, PARTITION);
    assert!(ok.status.success(), "{}", context(&ok));
    let bad = run_with(Path::new("/"), None, &["load", s(&elsewhere), "--dry-run"]);
    let err = assert_refusal_text(
        &bad,
        3,
        &["another pipeline split", "set VLLM_PP_LAYER_PARTITION=1,2"],
    );
    assert_eq!(
        err.matches("\n  - ").count(),
        1,
        "one problem, not one per key: {err}"
    );
}

/// Two `--ranks` runs of one TP 8 plan, in two folders (two machines), copied together: one
/// complete output, byte for byte the single run's, that `inspect` and `load` take as it is.
#[test]
fn runs_of_one_plan_copied_together_are_one_output() {
    let work = TempDir::new().unwrap();
    let (a, b) = (work.path().join("node0"), work.path().join("node1"));
    shard_ok(&fixture(GQA), 8, &a, &["--ranks", "0-3"]);
    shard_ok(&fixture(GQA), 8, &b, &["--ranks", "4-7"]);
    assert!(a.join("wload-ranks-0-3.json").is_file());
    assert!(b.join("wload-ranks-4-7.json").is_file());
    assert!(!a.join("wload.json").exists() && !b.join("wload.json").exists());

    let merged = work.path().join("merged");
    copy_files(&a, &merged);
    copy_files(&b, &merged);
    let v = wload_json(&["inspect", s(&merged), "--json"]);
    assert_eq!(v["complete"], true, "{v:#}");
    assert_eq!(
        v["records"],
        serde_json::json!(["wload-ranks-0-3.json", "wload-ranks-4-7.json"]),
        "{v:#}"
    );
    assert_eq!(v["problems"], serde_json::json!([]), "{v:#}");
    let serve = v["serve"]["shell"].as_str().unwrap();
    assert!(
        serve.starts_with(&format!("vllm serve {} ", merged.display())),
        "{serve}"
    );
    let l = run(&["load", s(&merged), "--dry-run", "--read"]);
    assert!(l.status.success(), "{}", context(&l));

    let full = work.path().join("full");
    shard_ok(&fixture(GQA), 8, &full, &[]);
    for r in 0..8 {
        let n = format!("model-rank-{r}-part-0.safetensors");
        assert_eq!(
            fs::read(merged.join(&n)).unwrap(),
            fs::read(full.join(&n)).unwrap(),
            "{n}"
        );
    }
}

/// Runs of different plans (another dtype; another wload version) copied together are refused by
/// `inspect` and `load`, naming both records and what differs.
#[test]
fn runs_of_different_plans_are_refused_naming_the_files() {
    let work = TempDir::new().unwrap();
    let (a, b) = (work.path().join("node0"), work.path().join("node1"));
    shard_ok(&fixture(GQA), 8, &a, &["--ranks", "0-3"]);
    shard_ok(
        &fixture(GQA),
        8,
        &b,
        &["--ranks", "4-7", "--dtype", "float16"],
    );
    let merged = work.path().join("merged");
    copy_files(&a, &merged);
    copy_files(&b, &merged);
    let v = wload_json_exit(&["inspect", s(&merged), "--json"], 3);
    let text = v.to_string();
    assert!(
        text.contains("wload-ranks-4-7.json records a run of another plan than wload-ranks-0-3.json: dtype F16, not BF16"),
        "{v:#}"
    );
    assert_ne!(v["complete"], true, "{v:#}");
    assert!(
        v["serve"].is_null(),
        "no serve line for files of two plans: {v:#}"
    );
    let l = run(&["load", s(&merged), "--dry-run"]);
    assert_refusal_text(
        &l,
        3,
        &[
            "wload-ranks-4-7.json",
            "wload-ranks-0-3.json",
            "dtype F16, not BF16",
        ],
    );

    // The same plan written by another wload version.
    let merged = work.path().join("merged2");
    copy_files(&a, &merged);
    let c = work.path().join("node1b");
    shard_ok(&fixture(GQA), 8, &c, &["--ranks", "4-7"]);
    let rec = c.join("wload-ranks-4-7.json");
    let mut m: Value = serde_json::from_slice(&fs::read(&rec).unwrap()).unwrap();
    m["wload_version"] = "0.0.9".into();
    fs::write(&rec, serde_json::to_vec(&m).unwrap()).unwrap();
    copy_files(&c, &merged);
    let l = run(&["load", s(&merged), "--dry-run"]);
    assert_refusal_text(&l, 3, &["wload-ranks-4-7.json", "wload version 0.0.9, not"]);
}

/// Two `--ranks` runs of one TP 8 plan of `source` (ranks 0-3 and 4-7) in `work/node0` and
/// `work/node1`; returns the two folders.
fn two_runs(work: &Path, source: &Path) -> (std::path::PathBuf, std::path::PathBuf) {
    let (a, b) = (work.join("node0"), work.join("node1"));
    fs::create_dir_all(work).unwrap();
    shard_ok(source, 8, &a, &["--ranks", "0-3"]);
    shard_ok(source, 8, &b, &["--ranks", "4-7"]);
    (a, b)
}

/// The last data byte of `path` changed: a rank file corrupted in the copy.
fn corrupt_last_byte(path: &Path) {
    let mut bytes = fs::read(path).unwrap();
    *bytes.last_mut().unwrap() ^= 0x5a;
    fs::write(path, bytes).unwrap();
}

/// A folder gathered from `--ranks` runs whose second run record is missing, truncated or a
/// folder: `inspect` and `load --dry-run --read` both refuse it, naming the record (or, when it is
/// gone, the rank files no record lists), so that rank 5's corrupted file is never read unchecked.
#[test]
fn a_gathered_folder_without_a_readable_record_is_refused_by_inspect_and_load() {
    let work = TempDir::new().unwrap();
    let (a, b) = two_runs(work.path(), &fixture(GQA));
    type Damage = fn(&Path);
    let cases: [(&str, Damage, &str); 3] = [
        (
            "missing",
            |p| fs::remove_file(p).unwrap(),
            "model-rank-5-part-0.safetensors",
        ),
        (
            "truncated",
            |p| {
                let text = fs::read(p).unwrap();
                fs::write(p, &text[..text.len() / 2]).unwrap();
            },
            "wload-ranks-4-7.json",
        ),
        (
            "a folder",
            |p| {
                fs::remove_file(p).unwrap();
                fs::create_dir(p).unwrap();
            },
            "wload-ranks-4-7.json",
        ),
    ];
    for (case, damage, named) in cases {
        let merged = work.path().join(case.replace(' ', "-"));
        copy_files(&a, &merged);
        copy_files(&b, &merged);
        damage(&merged.join("wload-ranks-4-7.json"));
        corrupt_last_byte(&merged.join("model-rank-5-part-0.safetensors"));
        let v = wload_json_exit(&["inspect", s(&merged), "--json"], 3);
        assert_eq!(v["complete"], false, "{case}: {v:#}");
        assert!(v.to_string().contains(named), "{case}: {v:#}");
        let l = run(&["load", s(&merged), "--dry-run", "--read"]);
        // Where the cut record's JSON ends depends on the source path it holds: fragments only.
        assert_refused(&l, 3, &[named]);
    }
}

/// `dir`'s safetensors files with the data of the tensors whose name contains `which` changed
/// (every byte, as a fine-tune changes them), the headers (so the tensor table) unchanged.
fn change_weights(dir: &Path, which: &str) {
    for e in fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_none_or(|x| x != "safetensors") {
            continue;
        }
        let mut raw = RawFile::read(&p);
        for t in raw.header().iter().filter(|(n, _)| n.contains(which)) {
            let Some(span) = t.1["data_offsets"].as_array() else {
                continue;
            };
            let (from, to) = (span[0].as_u64().unwrap(), span[1].as_u64().unwrap());
            for byte in &mut raw.data[from as usize..to as usize] {
                *byte ^= 1;
            }
        }
        raw.write(&p);
    }
}

/// Runs of two checkpoints with the same tensor table (a fine-tune of every weight; a re-release
/// that fixed one tensor) copied together are refused by `inspect` and `load`, naming both
/// records; runs of two copies of one checkpoint (another path, other modification times) merge.
#[test]
fn runs_of_two_checkpoints_with_one_tensor_table_are_refused() {
    let work = TempDir::new().unwrap();
    let (a, _) = two_runs(&work.path().join("base"), &fixture(GQA));
    for (case, which) in [("fine-tune", "."), ("re-release", "lm_head")] {
        let other = copy_fixture(GQA);
        change_weights(other.path(), which);
        let b = work.path().join(case);
        shard_ok(other.path(), 8, &b, &["--ranks", "4-7"]);
        let merged = work.path().join(format!("{case}-merged"));
        copy_files(&a, &merged);
        copy_files(&b, &merged);
        let v = wload_json_exit(&["inspect", s(&merged), "--json"], 3);
        let text = v.to_string();
        for n in ["wload-ranks-4-7.json", "wload-ranks-0-3.json"] {
            assert!(text.contains(n), "{case}: {v:#}");
        }
        let l = run(&["load", s(&merged), "--dry-run", "--read"]);
        assert_refusal_text(&l, 3, &["wload-ranks-4-7.json", "wload-ranks-0-3.json"]);
    }
    // A copy of the checkpoint elsewhere (new path, new modification times) is the same source.
    let copy = copy_fixture(GQA);
    let b = work.path().join("copy");
    shard_ok(copy.path(), 8, &b, &["--ranks", "4-7"]);
    let merged = work.path().join("copy-merged");
    copy_files(&a, &merged);
    copy_files(&b, &merged);
    let v = wload_json(&["inspect", s(&merged), "--json"]);
    assert_eq!(v["complete"], true, "{v:#}");
    let l = run(&["load", s(&merged), "--dry-run", "--read"]);
    assert!(l.status.success(), "{}", context(&l));
}

/// A record without `source_data` (written before wload recorded its source's data) cannot show
/// that its run read the same checkpoint: it is not merged with another, and the refusal says to
/// re-shard; alone, it still loads.
#[test]
fn a_record_without_source_data_is_not_merged() {
    let work = TempDir::new().unwrap();
    let (a, b) = two_runs(work.path(), &fixture(GQA));
    let rec = b.join("wload-ranks-4-7.json");
    let mut m: Value = serde_json::from_slice(&fs::read(&rec).unwrap()).unwrap();
    m.as_object_mut().unwrap().remove("source_data").unwrap();
    fs::write(&rec, serde_json::to_vec(&m).unwrap()).unwrap();
    let merged = work.path().join("merged");
    copy_files(&a, &merged);
    copy_files(&b, &merged);
    let v = wload_json_exit(&["inspect", s(&merged), "--json"], 3);
    assert!(
        v.to_string()
            .contains("re-shard the ranks of wload-ranks-4-7.json"),
        "{v:#}"
    );
    let l = run(&["load", s(&merged), "--dry-run", "--read"]);
    assert_refusal_text(&l, 3, &["wload-ranks-4-7.json", "records no source data"]);
    let l = run(&["load", s(&b), "--dry-run", "--ranks", "4-7", "--read"]);
    assert!(l.status.success(), "{}", context(&l));
}

/// A folder sharded with `--hf-overrides`: its config.json is the source's, so the overrides are
/// recorded, passed on the serve line (`inspect` recomputes it), taken by `load` like the other
/// recorded flags, and runs made with other overrides are not merged with it.
#[test]
fn hf_overrides_are_recorded_served_loaded_and_kept_apart() {
    let work = TempDir::new().unwrap();
    let over = r#"{"rope_theta": 5000.0}"#;
    let out = work.path().join("out");
    shard_ok(&fixture(GQA), 2, &out, &["--hf-overrides", over]);
    let m: Value = serde_json::from_slice(&fs::read(out.join("wload.json")).unwrap()).unwrap();
    assert_eq!(
        m["hf_overrides"],
        serde_json::json!({"rope_theta": 5000.0}),
        "{m:#}"
    );
    let argv: Vec<&str> = (m["serve"]["argv"].as_array().unwrap().iter())
        .map(|w| w.as_str().unwrap())
        .collect();
    let at = argv
        .iter()
        .position(|w| *w == "--hf-overrides")
        .expect("the flag");
    assert_eq!(argv[at + 1], r#"{"rope_theta":5000.0}"#);
    let v = wload_json_exit(&["inspect", s(&out), "--json"], 0);
    assert_eq!(
        v["serve"]["argv"], m["serve"]["argv"],
        "inspect's line is shard's: {v:#}"
    );
    let (_, words) = env_and_words(v["serve"]["shell"].as_str().unwrap());
    assert_eq!(words, argv, "the shell line says the same: {v:#}");
    let l = run(&["load", s(&out), "--dry-run"]);
    assert!(l.status.success(), "{}", String::from_utf8_lossy(&l.stderr));
    let said = String::from_utf8_lossy(&l.stderr);
    assert!(
        said.contains(r#"--hf-overrides '{"rope_theta":5000.0}' taken from"#),
        "{said}"
    );

    // Ranks 4-7 without the overrides, gathered with ranks 0-3 made with them.
    let (a, b) = (work.path().join("node0"), work.path().join("node1"));
    shard_ok(
        &fixture(GQA),
        8,
        &a,
        &["--ranks", "0-3", "--hf-overrides", over],
    );
    shard_ok(&fixture(GQA), 8, &b, &["--ranks", "4-7"]);
    let merged = work.path().join("merged");
    copy_files(&a, &merged);
    copy_files(&b, &merged);
    let expected = [
        "wload-ranks-4-7.json records a run of another plan than wload-ranks-0-3.json",
        r#"--hf-overrides none, not {"rope_theta":5000.0}"#,
    ];
    let v = wload_json_exit(&["inspect", s(&merged), "--json"], 3);
    for e in expected {
        assert!(
            v.to_string().replace("\\\"", "\"").contains(e),
            "{e}\n{v:#}"
        );
    }
    assert_refusal_text(&run(&["load", s(&merged), "--dry-run"]), 3, &expected);
}
