//! `wload load`: every golden case loads (into host memory) exactly the tensors vLLM 0.33 held, both
//! planned on the fly from the fixture and from vLLM's own pre-sharded output; `--dry-run` (and
//! `--dry-run --read`) pass on good input and planted faults are refused with exit 3 and the fact
//! that matters; the CUDA path fails cleanly without a driver and, through a stub `libcuda.so`,
//! without a GPU; launcher variables pick this process's ranks; human output shows every stage.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Output};
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use assert_cmd::Command;
use serde_json::Value;
use tempfile::TempDir;
use xxhash_rust::xxh3::xxh3_64;

use crate::support::*;

/// Launcher variables that select ranks; removed from every command unless a test sets them.
const LAUNCHER_VARS: [&str; 6] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
];

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
    serde_json::from_slice(&out.stdout)
        .map_err(|e| format!("stdout is not JSON ({e}); {}", load_context(args, &out)))
}

fn json_ok(args: &[&str], env: &[(&str, &str)]) -> Value {
    try_json(args, env).unwrap_or_else(|e| panic!("{e}"))
}

/// Runs `wload load ARGS…` with `env` and asserts a refusal (see [`assert_refused`]).
fn assert_fails(args: &[&str], env: &[(&str, &str)], code: i32, says: &[&str]) -> Output {
    let out = load_env(args, env);
    assert_refused(&out, code, says);
    out
}

/// Runs `f` over `items` on a few threads (each item spawns processes) and concatenates the
/// results in item order.
fn par_flat_map<T: Sync, R: Send>(items: &[T], f: impl Fn(&T) -> Vec<R> + Sync) -> Vec<R> {
    let next = AtomicUsize::new(0);
    let done = Mutex::new(Vec::new());
    let threads = std::thread::available_parallelism()
        .map_or(2, |n| n.get())
        .clamp(2, 8);
    std::thread::scope(|sc| {
        for _ in 0..threads {
            sc.spawn(|| {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(item) = items.get(i) else { break };
                    let r = f(item);
                    done.lock().unwrap().push((i, r));
                }
            });
        }
    });
    let mut v = done.into_inner().unwrap();
    v.sort_by_key(|(i, _)| *i);
    v.into_iter().flat_map(|(_, r)| r).collect()
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

// ---------------------------------------------------------------------------------------------
// 1–3. Golden cases
// ---------------------------------------------------------------------------------------------

/// The golden cases grouped by the fixture command they share: a `__maxsize_` case differs from its
/// base case only in part boundaries, which `load` does not see.
fn fixture_groups() -> Vec<Vec<GoldenCase>> {
    let mut groups: BTreeMap<(PathBuf, u64, Vec<String>), Vec<GoldenCase>> = BTreeMap::new();
    for c in golden_cases() {
        groups
            .entry((c.fixture.clone(), c.tp, c.flags.clone()))
            .or_default()
            .push(c);
    }
    groups.into_values().collect()
}

/// Planned on the fly from the fixture: per rank, the tensors and their bytes are vLLM's.
#[test]
fn fixtures_load_exactly_what_vllm_held() {
    load_fixtures(|_| (cpu(), Vec::new()));
}

/// The same with the engine reading a few bytes at a time (test builds only:
/// `WLOAD_TEST_CHUNK_BYTES`), so that every slice and conversion crosses chunk boundaries on its
/// way into host memory.
#[test]
fn fixtures_load_exactly_what_vllm_held_with_tiny_chunks() {
    // Not multiples of each other or of the fixtures' row sizes; 6 bytes splits f32 elements.
    const CHUNKS: [u64; 4] = [6, 100, 1000, 4100];
    load_fixtures(|i| {
        (
            cpu(),
            vec![(
                "WLOAD_TEST_CHUNK_BYTES",
                CHUNKS[i % CHUNKS.len()].to_string(),
            )],
        )
    });
}

fn cpu() -> Vec<String> {
    vec!["--device".into(), "cpu".into()]
}

/// Every golden fixture group through the CUDA path, on the stub GPU (see [`STUB_C`]): staged
/// through small pinned slots reused many times, with copies that land only when waited for,
/// read buffered, direct and mapped; `--check` copies every tensor back, and each rank must be
/// vLLM's.
#[test]
fn fixtures_load_exactly_what_vllm_held_through_the_stub_gpu() {
    let Some((_dir, lp)) = stub_driver("fixtures_load_exactly_what_vllm_held_through_the_stub_gpu")
    else {
        return;
    };
    // (io, engine chunk, slot): chunks and slots not multiples of each other or of rows.
    const WAYS: [(&str, u64, u64); 4] = [
        ("buffered", 16 << 20, 16 << 20),
        ("direct", 1000, 4100),
        ("mmap", 4100, 1000),
        ("auto", 100, 300),
    ];
    load_fixtures(|i| {
        let (io, chunk, slot) = WAYS[i % WAYS.len()];
        (
            ["--device", "cuda", "--check", "--io", io]
                .map(String::from)
                .to_vec(),
            vec![
                ("LD_LIBRARY_PATH", lp.clone()),
                ("STUB_CU_INIT", "0".into()),
                ("STUB_GPUS", "16".into()),
                ("STUB_CTX", "ok".into()),
                ("WLOAD_TEST_CHUNK_BYTES", chunk.to_string()),
                ("WLOAD_TEST_SLOT_BYTES", slot.to_string()),
            ],
        )
    });
}

/// Loads every golden fixture group with the arguments and variables `way(group index)` gives
/// (the device among them) and compares each rank with vLLM's.
#[allow(clippy::type_complexity)]
fn load_fixtures(way: impl Fn(usize) -> (Vec<String>, Vec<(&'static str, String)>) + Sync) {
    let groups: Vec<(usize, Vec<GoldenCase>)> = fixture_groups().into_iter().enumerate().collect();
    assert!(
        groups.len() >= 10,
        "golden case groups found: {}",
        groups.len()
    );
    let failures = par_flat_map(&groups, |(i, group)| {
        let case = &group[0];
        let tp = case.tp.to_string();
        let (extra, env) = way(*i);
        let mut args = vec![s(&case.fixture), "--tp", &tp, "--checksums", "--json"];
        args.extend(extra.iter().map(String::as_str));
        args.extend(flags(case));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        match try_json(&args, &env) {
            Err(e) => vec![format!("{}: {e}", case.name)],
            Ok(report) => {
                let mut f: Vec<String> = group
                    .iter()
                    .flat_map(|c| compare(&c.name, c, &report, &tp_ranks(c)))
                    .collect();
                if report["kind"] != "checkpoint" {
                    f.push(format!(
                        "{}: kind {} (expected checkpoint)",
                        case.name, report["kind"]
                    ));
                }
                if report["dry_run"] != false {
                    f.push(format!("{}: dry_run {}", case.name, report["dry_run"]));
                }
                f
            }
        }
    });
    assert_none("loading the fixtures", &failures);
}

/// vLLM's own output folders (config.json, no wload.json) load as pre-sharded sources, unchanged.
#[test]
fn vllm_folders_load_as_pre_sharded() {
    let cases = golden_cases();
    let failures = par_flat_map(&cases, |case| {
        let tp = case.tp.to_string();
        let mut args = vec![
            s(&case.dir),
            "--tp",
            &tp,
            "--device",
            "cpu",
            "--checksums",
            "--json",
        ];
        args.extend(flags(case));
        match try_json(&args, &[]) {
            Err(e) => vec![format!("{}: {e}", case.name)],
            Ok(report) => {
                let mut f = compare(&case.name, case, &report, &tp_ranks(case));
                if report["kind"] != "pre-sharded" {
                    f.push(format!(
                        "{}: kind {} (expected pre-sharded)",
                        case.name, report["kind"]
                    ));
                }
                if report["warnings"].as_array().is_none_or(|w| !w.is_empty()) {
                    f.push(format!("{}: warnings {}", case.name, report["warnings"]));
                }
                f
            }
        }
    });
    assert_none("loading vLLM's folders", &failures);
}

/// `llama_gqa__dtype_float16` loaded without `--dtype float16`: the files are F16 where vLLM's
/// parameters are BF16. vLLM only warns (and converts), so wload warns and loads.
#[test]
fn pre_sharded_dtype_mismatch_only_warns() {
    let dir = expected("llama_gqa__dtype_float16", 2);
    let report = json_ok(&[s(&dir), "--tp", "2", "--device", "cpu", "--json"], &[]);
    let warnings: Vec<&str> = report["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // One warning per F16 tensor (the F32 scale buffers match vLLM's parameters).
    let f16 = (0..2)
        .flat_map(|r| {
            let f = dir.join(format!("model-rank-{r}-part-0.safetensors"));
            header_tensors(&f)
        })
        .filter(|t| t.dtype == "F16")
        .count();
    assert!(f16 > 0);
    assert_eq!(warnings.len(), f16, "{warnings:#?}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("lm_head.weight") && w.contains("F16") && w.contains("BF16")),
        "{warnings:#?}"
    );
    assert_eq!(reported_ranks(&report), vec![0, 1]);

    // The human output shows the warnings too (on stderr or stdout) and still succeeds.
    let out = load(&[s(&dir), "--tp", "2", "--device", "cpu", "--dry-run"]);
    assert!(out.status.success(), "{}", context(&out));
    let all = stdout(&out) + &stderr(&out);
    assert!(all.contains("F16"), "the dtype warning is shown: {all}");
}

/// vLLM converts a mismatched dtype on load (`param.copy_(loaded)`), so a rank of vLLM serving
/// `llama_gqa__dtype_float16/tp2` with `--dtype auto` holds BF16 tensors; wload keeps the file's F16.
#[test]
fn pre_sharded_dtype_mismatch_is_converted_like_vllm() {
    let dir = expected("llama_gqa__dtype_float16", 2);
    let report = json_ok(
        &[
            s(&dir),
            "--tp",
            "2",
            "--device",
            "cpu",
            "--checksums",
            "--json",
            "--ranks",
            "0",
        ],
        &[],
    );
    let got = reported_rank(&report, 0).expect("checksums");
    let file = dir.join("model-rank-0-part-0.safetensors");
    let bytes = fs::read(&file).unwrap();
    let base = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut failures = Vec::new();
    for t in header_tensors(&file) {
        if t.dtype != "F16" {
            continue;
        }
        let data = &bytes[base + t.start as usize..base + t.end as usize];
        let bf16: Vec<u8> = data
            .chunks_exact(2)
            .flat_map(|c| {
                let f = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
                half::bf16::from_f32(f).to_le_bytes()
            })
            .collect();
        let want = Held {
            dtype: "BF16".into(),
            shape: t.shape.clone(),
            xxh3: hex(&bf16),
        };
        if got.get(&t.name) != Some(&want) {
            failures.push(format!(
                "'{}': got {:?}, vLLM {want:?}",
                t.name,
                got.get(&t.name)
            ));
        }
    }
    assert_none("dtype conversion", &failures);
}

/// Mixtral sharded with `--enable-expert-parallel`, loaded without it: the expert tensors have the
/// EP shapes ([experts/tp, 2·inter, hidden]) where TP wants [experts, 2·inter/tp, hidden]; vLLM's
/// copy_ would fail, so this is refused.
#[test]
fn expert_parallel_folder_without_the_flag_is_refused() {
    let dir = expected("mixtral__ep", 2);
    assert_fails(
        &[s(&dir), "--tp", "2", "--device", "cpu", "--dry-run"],
        &[],
        3,
        &["w13_weight", "shape"],
    );
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

/// `--dry-run` passes for every good case, from the fixture and from vLLM's folder, and so does
/// `--dry-run --read`, whose hashes are the files' own. `--read` hashes the files the plan reads,
/// which for a fixture are all of them whatever the TP: it runs once per fixture folder.
#[test]
fn dry_runs_pass_for_every_good_case() {
    // (label, source, (tp, world size), flags, with --read too)
    type Job = (String, PathBuf, (u64, u64), Vec<String>, bool);
    let mut jobs: Vec<Job> = Vec::new();
    let mut fixtures_read = BTreeSet::new();
    for g in fixture_groups() {
        let c = &g[0];
        let read = fixtures_read.insert(c.fixture.clone());
        jobs.push((
            format!("{} (fixture)", c.name),
            c.fixture.clone(),
            (c.tp, c.world_size()),
            c.flags.clone(),
            read,
        ));
    }
    for c in golden_cases() {
        jobs.push((
            format!("{} (vllm)", c.name),
            c.dir.clone(),
            (c.tp, c.world_size()),
            c.flags.clone(),
            true,
        ));
    }
    let failures = par_flat_map(&jobs, |(label, dir, (tp, world), flags, with_read)| {
        let tp_s = tp.to_string();
        let mut f = Vec::new();
        for read in [false, true] {
            if read && !with_read {
                continue;
            }
            let label = format!("{label}{}", if read { " --read" } else { "" });
            let mut args = vec![
                s(dir),
                "--tp",
                &tp_s,
                "--device",
                "cpu",
                "--dry-run",
                "--json",
            ];
            if read {
                args.push("--read");
            }
            args.extend(flags.iter().map(String::as_str));
            match try_json(&args, &[]) {
                Err(e) => f.push(format!("{label}: {e}")),
                Ok(r) => {
                    if r["dry_run"] != true || reported_ranks(&r) != (0..*world).collect::<Vec<_>>()
                    {
                        f.push(format!(
                            "{label}: dry_run {} ranks {:?}",
                            r["dry_run"],
                            reported_ranks(&r)
                        ));
                    }
                    if read {
                        f.extend(check_files_read(&label, dir, &r));
                    }
                }
            }
        }
        f
    });
    assert_none("dry runs", &failures);
}

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
        &["beyond --tp 1", "ranks [1]", "shape"],
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

/// vLLM's folder (no manifest to say its TP) at the wrong TP: only the shapes tell.
#[test]
fn vllm_folder_with_the_wrong_tp() {
    let dir = expected("llama_gqa", 4);
    assert_fails(
        &[s(&dir), "--tp", "2", "--device", "cpu", "--dry-run"],
        &[],
        3,
        &["beyond --tp 2", "shape", "needs"],
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

// ---------------------------------------------------------------------------------------------
// 5. CUDA without a driver, and with a stub driver that has no GPU
// ---------------------------------------------------------------------------------------------

/// Whether a real libcuda is visible to the dynamic loader (then the no-driver test cannot run).
fn system_has_libcuda() -> bool {
    let in_cache = StdCommand::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so"))
        .unwrap_or(false);
    let in_path = std::env::var("LD_LIBRARY_PATH").is_ok_and(|p| {
        p.split(':').filter(|d| !d.is_empty()).any(|d| {
            fs::read_dir(d).is_ok_and(|rd| {
                rd.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("libcuda.so"))
            })
        })
    });
    in_cache || in_path
}

/// Without a driver: exit 1, and the message says to use `--device cpu`. Needs a machine without
/// libcuda, such as CI's.
#[test]
fn cuda_without_a_driver_exits_1() {
    if system_has_libcuda() {
        return missing_environment(
            "cuda_without_a_driver_exits_1",
            "a libcuda is installed here, so wload cannot be seen without a driver",
        );
    }
    let fx = fixtures_dir().join(GQA);
    let f = s(&fx);
    assert_fails(
        &[f, "--tp", "2", "--device", "cuda"],
        &[],
        1,
        &["no CUDA driver", "--device cpu"],
    );
    // A dry run touches no device, so it works without a driver.
    let out = load(&[f, "--tp", "2", "--device", "cuda", "--dry-run"]);
    assert!(out.status.success(), "{}", context(&out));
}

/// The stub driver, driven by the environment: `cuInit` returns `STUB_CU_INIT` (default 100,
/// CUDA_ERROR_NO_DEVICE), `cuDeviceGetCount` reports `STUB_GPUS` (default 0), `cuDeviceGet`
/// accepts ordinals below that, and creating a context fails with CUDA_ERROR_UNKNOWN (999) unless
/// `STUB_CTX=ok`; the error functions answer with fixed strings.
///
/// With `STUB_CTX=ok` it is a GPU in host memory, as unforgiving as a real one where a loader can
/// go wrong: device and pinned allocations start as garbage (0xAB), copies queued on a stream run
/// only when the stream or an event recorded after them is synchronised (so a staging buffer
/// reused before its copy is done sends the wrong bytes, and `--check` sees it), and a
/// synchronous copy back does not wait for other streams. `STUB_GPU_MEM` caps device memory
/// (CUDA_ERROR_OUT_OF_MEMORY beyond it). These are all the symbols wload calls (a missing one
/// would make cudarc panic).
pub(crate) const STUB_C: &str = r#"
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
typedef unsigned long long CUdeviceptr;
static int env_int(const char *k, int d) { const char *v = getenv(k); return v ? atoi(v) : d; }
static const char *text(int e) {
    switch (e) {
    case 2: return "stub: out of memory";
    case 100: return "stub: no CUDA-capable device is detected";
    case 101: return "stub: invalid device ordinal";
    case 999: return "stub: unknown error";
    default: return "stub: error";
    }
}
static const char *name(int e) {
    switch (e) {
    case 2: return "CUDA_ERROR_OUT_OF_MEMORY";
    case 100: return "CUDA_ERROR_NO_DEVICE";
    case 101: return "CUDA_ERROR_INVALID_DEVICE";
    case 999: return "CUDA_ERROR_UNKNOWN";
    default: return "CUDA_ERROR_STUB";
    }
}
int cuInit(unsigned int flags) { (void)flags; return env_int("STUB_CU_INIT", 100); }
int cuDriverGetVersion(int *v) { *v = 12080; return 0; }
int cuDeviceGetCount(int *count) { *count = env_int("STUB_GPUS", 0); return 0; }
int cuDeviceGet(int *dev, int ordinal) {
    if (ordinal < 0 || ordinal >= env_int("STUB_GPUS", 0)) return 101;
    *dev = ordinal;
    return 0;
}
int cuDeviceGetName(char *out, int len, int dev) {
    (void)dev;
    strncpy(out, "Stub GPU", (size_t)len);
    return 0;
}
static int ctx_ok(void) { const char *v = getenv("STUB_CTX"); return v && !strcmp(v, "ok"); }
int cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    (void)dev;
    if (!ctx_ok()) return 999;
    *ctx = (void *)0x1;
    return 0;
}
int cuDevicePrimaryCtxRelease_v2(int dev) { (void)dev; return 0; }
int cuCtxSetCurrent(void *ctx) { (void)ctx; return 0; }
int cuGetErrorString(int err, const char **s) { *s = text(err); return 0; }
int cuGetErrorName(int err, const char **s) { *s = name(err); return 0; }

static pthread_mutex_t mem_mu = PTHREAD_MUTEX_INITIALIZER;
static unsigned long long mem_used;
int cuMemAlloc_v2(CUdeviceptr *p, size_t n) {
    long long cap = (long long)env_int("STUB_GPU_MEM", 0);
    pthread_mutex_lock(&mem_mu);
    if (cap > 0 && mem_used + n > (unsigned long long)cap) { pthread_mutex_unlock(&mem_mu); return 2; }
    mem_used += n;
    pthread_mutex_unlock(&mem_mu);
    void *m = malloc(n + 8);
    if (!m) return 2;
    *(size_t *)m = n;
    memset((char *)m + 8, 0xAB, n);
    *p = (CUdeviceptr)((char *)m + 8);
    return 0;
}
int cuMemFree_v2(CUdeviceptr p) {
    char *m = (char *)p - 8;
    pthread_mutex_lock(&mem_mu);
    mem_used -= *(size_t *)m;
    pthread_mutex_unlock(&mem_mu);
    free(m);
    return 0;
}
int cuMemsetD8_v2(CUdeviceptr p, unsigned char v, size_t n) { memset((void *)p, v, n); return 0; }
int cuMemHostAlloc(void **p, size_t n, unsigned int flags) {
    (void)flags;
    if (posix_memalign(p, 4096, n)) return 2;
    memset(*p, 0xAB, n);
    return 0;
}
int cuMemFreeHost(void *p) { free(p); return 0; }

struct op { CUdeviceptr dst; const void *src; size_t n; };
struct stream { pthread_mutex_t mu; struct op *ops; size_t len, cap, done; };
struct event { struct stream *s; size_t at; };
int cuStreamCreate(struct stream **s, unsigned int flags) {
    (void)flags;
    *s = calloc(1, sizeof **s);
    pthread_mutex_init(&(*s)->mu, 0);
    return 0;
}
/* Runs the queued copies up to `upto` (the stream's lock held). */
static void run_until(struct stream *s, size_t upto) {
    while (s->done < upto) {
        struct op *o = &s->ops[s->done++];
        memcpy((void *)o->dst, o->src, o->n);
    }
}
int cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, struct stream *s) {
    pthread_mutex_lock(&s->mu);
    if (s->len == s->cap) {
        s->cap = s->cap ? 2 * s->cap : 256;
        s->ops = realloc(s->ops, s->cap * sizeof *s->ops);
    }
    s->ops[s->len].dst = dst; s->ops[s->len].src = src; s->ops[s->len].n = n;
    s->len++;
    pthread_mutex_unlock(&s->mu);
    return 0;
}
int cuStreamSynchronize(struct stream *s) {
    pthread_mutex_lock(&s->mu);
    run_until(s, s->len);
    pthread_mutex_unlock(&s->mu);
    return 0;
}
int cuStreamDestroy_v2(struct stream *s) {
    cuStreamSynchronize(s);
    free(s->ops);
    free(s);
    return 0;
}
int cuEventCreate(struct event **e, unsigned int flags) { (void)flags; *e = calloc(1, sizeof **e); return 0; }
int cuEventRecord(struct event *e, struct stream *s) {
    pthread_mutex_lock(&s->mu);
    e->s = s; e->at = s->len;
    pthread_mutex_unlock(&s->mu);
    return 0;
}
int cuEventSynchronize(struct event *e) {
    if (!e->s) return 0;
    pthread_mutex_lock(&e->s->mu);
    run_until(e->s, e->at);
    pthread_mutex_unlock(&e->s->mu);
    return 0;
}
int cuEventElapsedTime(float *ms, struct event *a, struct event *b) {
    (void)a; (void)b;
    *ms = 0.001f;
    return 0;
}
int cuEventDestroy_v2(struct event *e) { free(e); return 0; }
int cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n) { memcpy(dst, (const void *)src, n); return 0; }
"#;

/// Builds the stub as `<dir>/libcuda.so.1` plus a `libcuda.so` link (cudarc's candidates start
/// with `libcuda.so` and include `libcuda.so.1`; `LD_LIBRARY_PATH` puts the stub ahead of any
/// installed driver); `None` when there is no C compiler.
fn build_stub(dir: &Path) -> Option<()> {
    let src = dir.join("stub.c");
    fs::write(&src, STUB_C).unwrap();
    let lib = dir.join("libcuda.so.1");
    let out = StdCommand::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "cc failed to build the stub libcuda:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so")).unwrap();
    Some(())
}

/// A stub driver on `LD_LIBRARY_PATH`; `None` when there is no C compiler to build it (a failure
/// in CI, see [`missing_environment`]).
pub(crate) fn stub_driver(test: &str) -> Option<(TempDir, String)> {
    let dir = TempDir::new().unwrap();
    if build_stub(dir.path()).is_none() {
        missing_environment(test, "no C compiler (cc) to build the stub libcuda");
        return None;
    }
    let lp = match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", dir.path().display()),
        _ => dir.path().display().to_string(),
    };
    Some((dir, lp))
}

#[test]
fn cuda_stub_driver_without_gpus() {
    let Some((_dir, lp)) = stub_driver("cuda_stub_driver_without_gpus") else {
        return;
    };
    let fx = fixtures_dir().join(GQA);
    let f = s(&fx);
    let base = [("RUST_BACKTRACE", "1"), ("LD_LIBRARY_PATH", lp.as_str())];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        v
    };

    // cuInit fails with CUDA_ERROR_NO_DEVICE: the driver's own words, exit 1, no panic.
    assert_fails(
        &[f, "--tp", "2", "--device", "cuda"],
        &base,
        1,
        &[
            "CUDA_ERROR_NO_DEVICE",
            "stub: no CUDA-capable device",
            "initialising",
        ],
    );

    // cuInit succeeds, no GPUs: how many are needed, and for which ranks.
    let zero = with(&[("STUB_CU_INIT", "0"), ("STUB_GPUS", "0")]);
    assert_fails(
        &[f, "--tp", "2", "--device", "cuda"],
        &zero,
        1,
        &["2 GPUs needed", "ranks [0, 1]", "only 0 visible"],
    );
    // A torchrun process with LOCAL_RANK 1 of 2 holds ranks 2,3 on local GPUs 2,3.
    let mut local = zero.clone();
    local.extend([("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")]);
    assert_fails(
        &[f, "--tp", "4", "--device", "cuda"],
        &local,
        1,
        &["4 GPUs needed", "ranks [2, 3]", "only 0 visible"],
    );
    // A dry run does not call the driver at all.
    let out = load_env(&[f, "--tp", "2", "--device", "cuda", "--dry-run"], &base);
    assert!(out.status.success(), "{}", context(&out));
}

/// Two GPUs whose contexts cannot be created: the device and the operation are named, exit 1.
#[test]
fn cuda_stub_driver_context_failure() {
    let Some((_dir, lp)) = stub_driver("cuda_stub_driver_context_failure") else {
        return;
    };
    let fx = fixtures_dir().join(GQA);
    let env = [
        ("RUST_BACKTRACE", "1"),
        ("LD_LIBRARY_PATH", lp.as_str()),
        ("STUB_CU_INIT", "0"),
        ("STUB_GPUS", "2"),
    ];
    assert_fails(
        &[s(&fx), "--tp", "2", "--device", "cuda"],
        &env,
        1,
        &["cuda:0", "creating a context", "CUDA_ERROR_UNKNOWN"],
    );
}

/// Slurm with one GPU per task (`srun --gpus-per-task=1`, or `--gpu-bind`) sets each task's
/// CUDA_VISIBLE_DEVICES to its own GPU, so task 1 sees one device, at ordinal 0. wload puts task
/// 1's rank on local ordinal SLURM_LOCALID × ranks-per-task = 1 and refuses ("2 GPUs needed for
/// ranks [1], but only 1 visible") instead of using the one GPU it was given.
#[test]
fn slurm_task_with_its_own_gpu_uses_ordinal_0() {
    let Some((_dir, lp)) = stub_driver("slurm_task_with_its_own_gpu_uses_ordinal_0") else {
        return;
    };
    let fx = fixtures_dir().join(GQA);
    let env = [
        ("LD_LIBRARY_PATH", lp.as_str()),
        ("STUB_CU_INIT", "0"),
        ("STUB_GPUS", "1"),
        ("CUDA_VISIBLE_DEVICES", "1"),
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "1"),
    ];
    // Getting as far as creating the context on cuda:0 (which the stub then fails) is the point.
    assert_fails(
        &[s(&fx), "--tp", "2", "--device", "cuda"],
        &env,
        1,
        &["cuda:0", "creating a context"],
    );
}

/// With a real driver and at least one GPU (never in CI), every golden case's rank 0 and all ranks
/// of one case load onto GPU 0 one rank at a time, with the same bytes as vLLM.
#[test]
fn cuda_loads_golden_cases_when_a_gpu_is_present() {
    const TEST: &str = "cuda_loads_golden_cases_when_a_gpu_is_present";
    // Not a missing environment: CI has no GPU, so this runs only where one is.
    if !system_has_libcuda() {
        skipped(TEST, "no libcuda here (needs an NVIDIA driver and GPU)");
        return;
    }
    let fx = fixtures_dir().join(GQA);
    let probe = load(&[
        s(&fx),
        "--tp",
        "1",
        "--device",
        "cuda",
        "--ranks",
        "0",
        "--json",
    ]);
    if !probe.status.success() {
        // Only "there is no GPU" is a reason to skip; any other failure of the CUDA path is a bug
        // this test exists to catch.
        let err = stderr(&probe);
        let no_gpu = ["only 0 visible", "CUDA_ERROR_NO_DEVICE", "no CUDA driver"];
        assert!(
            no_gpu.iter().any(|w| err.contains(w)),
            "{TEST}: a driver is installed but loading one rank failed: {}",
            context(&probe)
        );
        skipped(TEST, &format!("no usable GPU ({})", err.trim()));
        return;
    }
    let cases = golden_cases();
    let mut failures = Vec::new();
    for case in &cases {
        let ranks: Vec<u64> = if case.name == "llama_gqa/tp4" {
            tp_ranks(case)
        } else {
            vec![0]
        };
        for r in ranks {
            let tp = case.tp.to_string();
            let rs = r.to_string();
            let mut args = vec![
                s(&case.fixture),
                "--tp",
                &tp,
                "--device",
                "cuda",
                "--ranks",
                &rs,
                "--check",
                "--checksums",
                "--json",
            ];
            args.extend(flags(case));
            match try_json(&args, &[]) {
                Err(e) => failures.push(format!("{}: {e}", case.name)),
                Ok(report) => failures.extend(compare(
                    &format!("{} on cuda", case.name),
                    case,
                    &report,
                    &[r],
                )),
            }
        }
    }
    assert_none("CUDA loads", &failures);
}

// ---------------------------------------------------------------------------------------------
// 6. Launchers
// ---------------------------------------------------------------------------------------------

#[test]
fn torchrun_variables_pick_this_process_ranks() {
    let fx = fixtures_dir().join(GQA);
    let f = s(&fx);
    let args = [f, "--tp", "2", "--device", "cpu", "--json", "--checksums"];
    let r = json_ok(&args, &[("RANK", "1"), ("WORLD_SIZE", "2")]);
    assert_eq!(reported_ranks(&r), vec![1], "{r}");
    let case = golden_cases()
        .into_iter()
        .find(|c| c.name == "llama_gqa/tp2")
        .unwrap();
    assert_none(
        "rank 1 under torchrun",
        &compare("torchrun", &case, &r, &[1]),
    );

    // --ranks overrides the launcher.
    let mut with_ranks = args.to_vec();
    with_ranks.extend(["--ranks", "0"]);
    let r = json_ok(&with_ranks, &[("RANK", "1"), ("WORLD_SIZE", "2")]);
    assert_eq!(reported_ranks(&r), vec![0], "{r}");

    // 3 processes cannot split TP 4.
    assert_fails(
        &[f, "--tp", "4", "--device", "cpu", "--json"],
        &[("RANK", "0"), ("WORLD_SIZE", "3")],
        2,
        &["3 processes", "--tp 4"],
    );
    // A rank that is not a number.
    assert_fails(
        &[f, "--tp", "2", "--device", "cpu"],
        &[("RANK", "one"), ("WORLD_SIZE", "2")],
        2,
        &["rank='one'"],
    );
    // RANK beyond WORLD_SIZE.
    assert_fails(
        &[f, "--tp", "2", "--device", "cpu"],
        &[("RANK", "2"), ("WORLD_SIZE", "2")],
        2,
        &["RANK=2 is not below WORLD_SIZE=2"],
    );
}

/// WORLD_SIZE without RANK is not a torchrun launch (torchrun sets both); without the launcher,
/// all ranks load.
#[test]
fn world_size_alone_is_ignored() {
    let fx = fixtures_dir().join(GQA);
    let r = json_ok(
        &[
            s(&fx),
            "--tp",
            "4",
            "--device",
            "cpu",
            "--dry-run",
            "--json",
        ],
        &[("WORLD_SIZE", "3")],
    );
    assert_eq!(reported_ranks(&r), vec![0, 1, 2, 3], "{r}");
}

#[test]
fn slurm_variables_pick_this_process_ranks() {
    let fx = fixtures_dir().join(GQA);
    let f = s(&fx);
    let env = [
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "0"),
    ];
    let r = json_ok(&[f, "--tp", "4", "--device", "cpu", "--json"], &env);
    assert_eq!(reported_ranks(&r), vec![0, 1], "{r}");
    let r = json_ok(
        &[f, "--tp", "4", "--device", "cpu", "--json", "--ranks", "3"],
        &env,
    );
    assert_eq!(reported_ranks(&r), vec![3], "{r}");
    let env = [("SLURM_PROCID", "1"), ("SLURM_NTASKS", "2")];
    let r = json_ok(
        &[f, "--tp", "4", "--device", "cpu", "--dry-run", "--json"],
        &env,
    );
    assert_eq!(reported_ranks(&r), vec![2, 3], "{r}");
    assert_fails(
        &[f, "--tp", "4", "--device", "cpu"],
        &[("SLURM_PROCID", "0"), ("SLURM_NTASKS", "3")],
        2,
        &["srun", "3 processes"],
    );
}

/// torchrun wins over Slurm when both are set (torchrun inside an srun allocation).
#[test]
fn torchrun_wins_over_slurm() {
    let fx = fixtures_dir().join(GQA);
    let env = [
        ("RANK", "3"),
        ("WORLD_SIZE", "4"),
        ("SLURM_PROCID", "0"),
        ("SLURM_NTASKS", "1"),
    ];
    let r = json_ok(
        &[
            s(&fx),
            "--tp",
            "4",
            "--device",
            "cpu",
            "--dry-run",
            "--json",
        ],
        &env,
    );
    assert_eq!(reported_ranks(&r), vec![3], "{r}");
}

// ---------------------------------------------------------------------------------------------
// 7. --check and usage errors
// ---------------------------------------------------------------------------------------------

#[test]
fn check_passes_on_cpu() {
    let fx = fixtures_dir().join("mixtral");
    let r = json_ok(
        &[s(&fx), "--tp", "2", "--device", "cpu", "--check", "--json"],
        &[],
    );
    assert_eq!(reported_ranks(&r), vec![0, 1], "{r}");
    let dir = expected("qwen2", 4);
    let out = load(&[
        s(&dir),
        "--tp",
        "4",
        "--device",
        "cpu",
        "--check",
        "--ranks",
        "1-2",
    ]);
    assert!(out.status.success(), "{}", context(&out));
}

#[test]
fn usage_errors_exit_2() {
    let fx = fixtures_dir().join(GQA);
    let f = s(&fx);
    assert_fails(
        &[f, "--tp", "2", "--device", "cpu", "--ranks", "5"],
        &[],
        2,
        &["rank 5", "--tp 2"],
    );
    assert_fails(
        &[f, "--tp", "2", "--device", "cpu", "--read"],
        &[],
        2,
        &["--dry-run"],
    );
    assert_fails(
        &[f, "--tp", "2", "--device", "cpu", "--dry-run", "--check"],
        &[],
        2,
        &["--check"],
    );
    assert_fails(
        &[
            f,
            "--tp",
            "2",
            "--device",
            "cpu",
            "--dry-run",
            "--checksums",
        ],
        &[],
        2,
        &["--checksums"],
    );
    assert_fails(&[f, "--tp", "2", "--device", "gpu"], &[], 2, &["gpu"]);
}

// ---------------------------------------------------------------------------------------------
// 8. Human output
// ---------------------------------------------------------------------------------------------

#[test]
fn human_output_shows_ranks_and_stages() {
    let fx = fixtures_dir().join(GQA);
    let out = load(&[s(&fx), "--tp", "2", "--device", "cpu"]);
    assert!(out.status.success(), "{}", context(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    let head = lines
        .iter()
        .position(|l| l.contains("RANK") && l.contains("DEVICE") && l.contains("TENSORS"))
        .unwrap_or_else(|| panic!("a per-rank table:\n{text}"));
    for (i, r) in ["0", "1"].iter().enumerate() {
        let row: Vec<&str> = lines[head + 1 + i].split_whitespace().collect();
        assert_eq!(row.first(), Some(r), "row for rank {r}:\n{text}");
        assert_eq!(row.get(1), Some(&"cpu"), "row for rank {r}:\n{text}");
        assert_eq!(row.get(2), Some(&"23"), "23 tensors per rank:\n{text}");
    }
    for stage in ["read", "convert", "copy to device", "sync", "plan", "total"] {
        assert!(
            lines.iter().any(|l| l.trim_start().starts_with(stage)),
            "stage {stage:?} shown:\n{text}"
        );
    }
    assert!(text.contains("GB/s"), "throughput shown:\n{text}");
    assert!(
        !text.contains('\u{1b}'),
        "no escape codes when not on a terminal:\n{text}"
    );

    // A dry run says it would load, and which kind of source it read.
    let out = load(&[s(&fx), "--tp", "2", "--device", "cpu", "--dry-run"]);
    assert!(out.status.success(), "{}", context(&out));
    let text = stdout(&out);
    assert!(
        text.contains("tp 2") && text.contains("checkpoint"),
        "{text}"
    );
}

/// The GPU benchmark's wload steps (bench/gpu/run.sh with SKIP_TORCH=1: generate, load warm and
/// cold with --repeat and --check, write the JSON) against the stub GPU, so that the script is
/// known to work before it meets a real one.
#[test]
fn gpu_bench_script_runs_on_the_stub_gpu() {
    const TEST: &str = "gpu_bench_script_runs_on_the_stub_gpu";
    let Some((_dir, lp)) = stub_driver(TEST) else {
        return;
    };
    if StdCommand::new("python3")
        .arg("--version")
        .output()
        .is_err()
    {
        return missing_environment(TEST, "no python3 to generate the checkpoint");
    }
    let work = TempDir::new().unwrap();
    let json = work.path().join("results/run.json");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/gpu/run.sh");
    let out = StdCommand::new("bash")
        .arg(&script)
        .arg(work.path())
        .arg("--json")
        .arg(&json)
        .env("WLOAD_BIN", env!("CARGO_BIN_EXE_wload"))
        .env("SKIP_TORCH", "1")
        .env("RUNS", "2")
        .env(
            "GEN_ARGS",
            "--files 2 --layers 2 --real-shapes --hidden-size 256 --intermediate-size 640 \
             --vocab-size 1000 --num-attention-heads 4 --num-key-value-heads 2",
        )
        .env("LD_LIBRARY_PATH", &lp)
        .env("STUB_CU_INIT", "0")
        .env("STUB_GPUS", "1")
        .env("STUB_CTX", "ok")
        .env("WLOAD_TEST_SLOT_BYTES", "65536")
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SLURM_PROCID")
        .output()
        .unwrap();
    let ctx = context(&out);
    assert!(out.status.success(), "{ctx}");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("PASS"), "{ctx}");
    let r: Value = serde_json::from_slice(&fs::read(&json).unwrap()).unwrap();
    assert_eq!(r["pass"], true, "{r}");
    for (run, io) in [("wload_warm", "buffered"), ("wload_cold", "direct")] {
        let w = &r[run];
        assert_eq!(w["ok"], true, "{run}: {r}");
        assert_eq!(w["check"], "ok", "{run}: {r}");
        assert_eq!(w["io"], io, "{run}: {r}");
        assert!(w["gbps_median"].as_f64().unwrap() > 0.0, "{run}: {r}");
    }
    assert!(
        r["wload_warm"]["resident_share"].as_f64().unwrap() > 0.99,
        "{r}"
    );
    assert!(
        r["wload_cold"]["resident_share"].as_f64().unwrap() < 0.01,
        "{r}"
    );
    assert_eq!(r["pinned_h2d_gbps"], Value::Null, "{r}");
}

/// `--check` that passes says so (issue #13): how many tensors were compared, and on what; a
/// load without it claims no check.
#[test]
fn a_passing_check_is_confirmed() {
    let fx = fixtures_dir().join(GQA);
    let args = [s(&fx), "--tp", "2", "--device", "cpu", "--check"];
    let out = load(&args);
    assert!(out.status.success(), "{}", load_context(&args, &out));
    let text = stdout(&out);
    let tensors: u64 = json_ok(&[s(&fx), "--tp", "2", "--device", "cpu", "--json"], &[])["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["tensors"].as_u64().unwrap())
        .sum();
    let line = format!(
        "checked: all {tensors} tensors read back from cpu equal byte for byte what the host computes from the source"
    );
    assert!(
        text.lines().any(|l| l == line),
        "no `{line}`: {}",
        load_context(&args, &out)
    );
    let args = [s(&fx), "--tp", "2", "--device", "cpu"];
    let out = load(&args);
    assert!(
        !stdout(&out).contains("checked:"),
        "{}",
        load_context(&args, &out)
    );
}
