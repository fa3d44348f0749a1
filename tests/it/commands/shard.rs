//! `wload shard`: the written part files are byte for byte what vLLM 0.33 wrote for every golden
//! case, side files and the manifest are right, and no failure (bad flags, existing OUT, bad source,
//! unwritable or full target, corrupted output under --verify, Ctrl-C) leaves an OUT or a temporary
//! folder behind.

use std::collections::BTreeSet;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::support::*;

/// Names of the `model-rank-*-part-*.safetensors` files in `dir`.
fn part_names(dir: &Path) -> BTreeSet<String> {
    fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| {
            (n.starts_with("model-rank-") || n.starts_with("model-pp-"))
                && n.ends_with(".safetensors")
        })
        .collect()
}

/// Entries of OUT's parent that look like wload's temporary folders for OUT
/// (`.OUT.wload-tmp-PID`, `.OUT.wload-old-PID`).
fn leftovers(out: &Path) -> Vec<String> {
    let name = out.file_name().unwrap().to_string_lossy().into_owned();
    let prefix = format!(".{name}.wload-");
    fs::read_dir(out.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with(&prefix))
        .collect()
}

/// A failed run must leave neither OUT nor a temporary folder next to it.
fn assert_nothing_left(out: &Path, ctx: &str) {
    assert!(
        !out.exists(),
        "{} exists after a failed run; {ctx}",
        out.display()
    );
    let left = leftovers(out);
    assert!(
        left.is_empty(),
        "temporary folders left behind: {left:?}; {ctx}"
    );
}

/// Which tensor of the safetensors file at `path` holds byte `offset` (read with the test's own
/// header parser, not the crate's).
fn tensor_at(path: &Path, offset: u64) -> String {
    let Ok(bytes) = fs::read(path) else {
        return "?".into();
    };
    if bytes.len() < 8 || offset < 8 {
        return "(header length)".into();
    }
    let base = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap());
    if offset < base {
        return "(header)".into();
    }
    header_tensors(path)
        .into_iter()
        .find(|t| t.start <= offset - base && offset - base < t.end)
        .map(|t| format!("tensor {} ({} {:?})", t.name, t.dtype, t.shape))
        .unwrap_or_else(|| "(past the last tensor)".into())
}

/// `None` when the files are identical, else a description of the first difference.
fn compare_files(want: &Path, got: &Path) -> Option<String> {
    let a = fs::read(want).unwrap_or_else(|e| panic!("{}: {e}", want.display()));
    let b = match fs::read(got) {
        Ok(b) => b,
        Err(e) => return Some(format!("cannot read: {e}")),
    };
    if a == b {
        return None;
    }
    let first = a
        .iter()
        .zip(&b)
        .position(|(x, y)| x != y)
        .unwrap_or(a.len().min(b.len())) as u64;
    Some(format!(
        "{} bytes, expected {}; first difference at byte {first}, in {}",
        b.len(),
        a.len(),
        tensor_at(want, first)
    ))
}

/// Checks the run record in `out` (wload.json, or a `--ranks` run's wload-ranks-*.json: one of
/// them) against the files: it lists exactly the part files, each with its real size and the
/// XXH3-64 of its bytes. Returns the manifest.
fn check_manifest(out: &Path) -> Value {
    let records: Vec<_> = fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            let n = p.file_name().unwrap().to_string_lossy();
            n == "wload.json" || (n.starts_with("wload-ranks-") && n.ends_with(".json"))
        })
        .collect();
    assert_eq!(records.len(), 1, "one run record: {records:?}");
    let path = &records[0];
    let text = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let m: Value = serde_json::from_slice(&text).expect("wload.json is JSON");
    let files = m["files"].as_array().expect("wload.json has files");
    let listed: BTreeSet<String> = files
        .iter()
        .map(|f| f["name"].as_str().expect("file name").to_string())
        .collect();
    assert_eq!(listed.len(), files.len(), "a file is listed twice: {m:#}");
    assert_eq!(listed, part_names(out), "manifest files vs the folder");
    for f in files {
        let name = f["name"].as_str().unwrap();
        let bytes = fs::read(out.join(name)).unwrap();
        assert_eq!(f["size"].as_u64(), Some(bytes.len() as u64), "{name}: size");
        let (rank, part) = (f["rank"].as_u64().unwrap(), f["part"].as_u64().unwrap());
        assert_eq!(
            name,
            format!("model-rank-{rank}-part-{part}.safetensors"),
            "rank/part"
        );
        let hash = f["xxh3_64k"].as_str().expect("xxh3_64k is a string");
        assert_eq!(
            hash,
            block_checksum(&bytes),
            "{name}: the checksum does not match the file"
        );
        assert!(
            f.get("xxh3").is_none(),
            "{name}: the old whole-file hash is written: {f}"
        );
    }
    m
}

/// Everything that can differ between one golden case's expected folder and wload's output, run
/// with `extra` flags and `env` variables.
fn golden_failures(
    case: &GoldenCase,
    work: &Path,
    extra: &[&str],
    env: &[(&str, String)],
) -> Vec<String> {
    let out = work.join(case.name.replace('/', "-"));
    let mut args = vec!["-q".to_string()];
    if let Some(m) = case.max_size {
        args.extend(["--max-part-size".into(), m.to_string()]);
    }
    args.extend(case.flags.iter().cloned());
    args.extend(extra.iter().map(|a| a.to_string()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let run = wload()
        .args(["shard", s(&case.fixture), "--tp", &case.tp.to_string()])
        .args(["-o", s(&out)])
        .args(&args)
        .envs(env.iter().map(|(k, v)| (k, v)))
        .output()
        .expect("wload runs");
    let args = format!("{args:?} {env:?}");
    if !run.status.success() {
        return vec![format!(
            "{}: wload shard {args:?}: {}",
            case.name,
            context(&run)
        )];
    }
    let mut fails = Vec::new();
    for rank in 0..case.world_size() {
        let want: Vec<String> = case
            .rank_files(rank)
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        let prefix = case.rank_prefix(rank);
        let got: Vec<String> = part_names(&out)
            .into_iter()
            .filter(|n| n.starts_with(&prefix))
            .collect();
        let (w, g): (BTreeSet<_>, BTreeSet<_>) = (want.iter().collect(), got.iter().collect());
        if w != g {
            fails.push(format!(
                "{} rank {rank}: part files differ: missing {:?}, extra {:?}",
                case.name,
                w.difference(&g).collect::<Vec<_>>(),
                g.difference(&w).collect::<Vec<_>>()
            ));
        }
        let vllm = case.vllm_dir();
        for name in w.intersection(&g) {
            if let Some(d) = compare_files(&vllm.join(name), &out.join(name)) {
                fails.push(format!("{} {name}: {d}", case.name));
            }
        }
    }
    let extra: Vec<String> = part_names(&out)
        .into_iter()
        .filter(|n| !(0..case.world_size()).any(|r| n.starts_with(&case.rank_prefix(r))))
        .collect();
    if !extra.is_empty() {
        fails.push(format!("{}: files for no rank: {extra:?}", case.name));
    }
    // The side files vLLM's example copied must be there, unchanged (config.json included).
    for e in fs::read_dir(&case.dir).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with("model-rank-")
            || name.starts_with("model-pp-")
            || name.starts_with("oracle_meta_")
            || name == DIGESTS
        {
            continue;
        }
        // vLLM's example copies the source's weight index; wload leaves it out on purpose (it
        // names files the output does not have), and must not write it.
        if name.ends_with(".safetensors.index.json") {
            if out.join(&name).exists() {
                fails.push(format!("{}: {name} copied", case.name));
            }
            continue;
        }
        if name == "config.json" && only_gptq_modules_added(&case.dir.join(&name), &out.join(&name))
        {
            continue;
        }
        if let Some(d) = compare_files(&case.dir.join(&name), &out.join(&name)) {
            fails.push(format!("{} side file {name}: {d}", case.name));
        }
    }
    fails
}

/// vLLM's own GPTQ folder copies config.json and cannot be loaded again (spec §10.1: the fused
/// layers are built unquantized, `KeyError`); wload adds `modules_in_block_to_quantize`, with
/// which real vLLM reloads it identically. That difference, and only it, is expected.
fn only_gptq_modules_added(expected: &Path, got: &Path) -> bool {
    let read = |p: &Path| -> Option<Value> { serde_json::from_slice(&fs::read(p).ok()?).ok() };
    let (Some(want), Some(mut have)) = (read(expected), read(got)) else {
        return false;
    };
    let key = "modules_in_block_to_quantize";
    let wanted = &want["quantization_config"][key];
    let Some(qc) = have["quantization_config"].as_object_mut() else {
        return false;
    };
    let added = qc.remove(key).unwrap_or(Value::Null);
    if want["quantization_config"].get(key).is_some() {
        qc.insert(key.into(), wanted.clone());
    }
    wanted.is_null() && added.as_array().is_some_and(|a| !a.is_empty()) && have == want
}

/// Golden case `case`: the same part files as vLLM, each byte-identical, plus the side files
/// (run as `golden::<case>::shard`).
pub(crate) fn golden_case_is_byte_identical(case: &GoldenCase) {
    let work = TempDir::new().unwrap();
    let failures = golden_failures(case, work.path(), &[], &[]);
    assert!(
        failures.is_empty(),
        "{} differences from vLLM:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Golden case `case` (the `i`-th of the list) again with the engine reading a few bytes at a
/// time (test builds only: `WLOAD_TEST_CHUNK_BYTES`), so that every tensor, slice and conversion
/// of the fixtures crosses chunk boundaries; every other case copies through memory instead of
/// `copy_file_range`, and `--verify` reads it all back in the same small chunks (run as
/// `golden::<case>::shard_tiny_chunks`).
pub(crate) fn golden_case_is_byte_identical_with_tiny_chunks(i: usize, case: &GoldenCase) {
    // Not multiples of each other or of the fixtures' row sizes; 6 bytes splits f32 elements.
    const CHUNKS: [u64; 4] = [6, 100, 1000, 4100];
    let mut env = vec![(
        "WLOAD_TEST_CHUNK_BYTES",
        CHUNKS[i % CHUNKS.len()].to_string(),
    )];
    if i % 2 == 1 {
        env.push(("WLOAD_NO_COPY_FILE_RANGE", "1".to_string()));
    }
    let work = TempDir::new().unwrap();
    let failures = golden_failures(case, work.path(), &["--verify"], &env);
    assert!(
        failures.is_empty(),
        "{} differences from vLLM with tiny chunks:\n{}",
        failures.len(),
        failures.join("\n")
    );
}

/// Side files copied unchanged, no source weights copied, and a manifest that matches the files.
#[test]
fn side_files_and_manifest() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let src = fixture(GQA);
    shard_ok(&src, 2, &out, &[]);
    for name in ["config.json", "generation_config.json"] {
        assert_eq!(
            fs::read(out.join(name)).ok(),
            Some(fs::read(src.join(name)).unwrap()),
            "{name} is copied unchanged"
        );
    }
    let copied_weights: Vec<String> = fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".safetensors") && !n.starts_with("model-rank-"))
        .collect();
    assert!(
        copied_weights.is_empty(),
        "source weights copied: {copied_weights:?}"
    );
    assert_eq!(
        part_names(&out),
        BTreeSet::from([
            "model-rank-0-part-0.safetensors".to_string(),
            "model-rank-1-part-0.safetensors".to_string()
        ])
    );
    let m = check_manifest(&out);
    assert_eq!(m["tp"], 2, "{m:#}");
    assert_eq!(m["ranks"], serde_json::json!([0, 1]), "{m:#}");
}

/// A tied checkpoint keeps its config (vLLM stores the embedding under lm_head only), and a
/// multi-part split lists every part in the manifest.
#[test]
fn manifest_lists_every_part() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let src = fixture("llama_tied_fp16");
    shard_ok(&src, 2, &out, &["--max-part-size", "100000"]);
    let m = check_manifest(&out);
    assert!(m["files"].as_array().unwrap().len() > 2, "{m:#}");
    assert_eq!(
        fs::read(out.join("config.json")).unwrap(),
        fs::read(src.join("config.json")).unwrap()
    );
}

/// Same input and flags ⇒ byte-identical part files and the same manifest entries.
#[test]
fn output_is_deterministic() {
    let work = TempDir::new().unwrap();
    let (a, b) = (work.path().join("a"), work.path().join("b"));
    let src = fixture("mixtral");
    for out in [&a, &b] {
        shard_ok(&src, 2, out, &["--max-part-size", "200000"]);
    }
    let names = part_names(&a);
    assert!(names.len() > 2, "several parts expected: {names:?}");
    assert_eq!(names, part_names(&b));
    for n in &names {
        assert!(
            compare_files(&a.join(n), &b.join(n)).is_none(),
            "{n} differs between two runs: {:?}",
            compare_files(&a.join(n), &b.join(n))
        );
    }
    assert_eq!(check_manifest(&a)["files"], check_manifest(&b)["files"]);
}

/// --ranks writes only the ranks asked for, and they equal vLLM's.
#[test]
fn ranks_subset_writes_only_those_ranks() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(&fixture(GQA), 8, &out, &["--ranks", "0-1"]);
    let golden = expected(GQA, 8);
    let want: BTreeSet<String> = [0, 1]
        .iter()
        .flat_map(|&r| {
            let case = GoldenCase {
                name: String::new(),
                dir: golden.clone(),
                fixture: PathBuf::new(),
                tp: 8,
                pp: 1,
                flags: vec![],
                max_size: None,
            };
            case.rank_files(r)
        })
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(part_names(&out), want);
    for n in &want {
        assert_eq!(compare_files(&golden.join(n), &out.join(n)), None, "{n}");
    }
    let m = check_manifest(&out);
    assert_eq!(m["ranks"], serde_json::json!([0, 1]), "{m:#}");
    assert_eq!(m["tp"], 8, "{m:#}");
}

/// A rank outside 0..tp is a usage error, found before anything is written.
#[test]
fn rank_out_of_range_is_a_usage_error() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = shard(&fixture(GQA), 4, &out, &["--ranks", "9"]);
    assert_refusal_text(&o, 2, &["9"]);
    assert_nothing_left(&out, &context(&o));
}

/// OUT must not be the source itself.
#[test]
fn out_equal_to_source_is_refused() {
    let src = copy_fixture(GQA);
    let before = fs::read_dir(src.path()).unwrap().count();
    let o = shard(src.path(), 2, src.path(), &["--force"]);
    assert_refusal_text(&o, 2, &[]);
    assert_eq!(fs::read_dir(src.path()).unwrap().count(), before);
}

/// Regression: with --force, an OUT containing SOURCE was replaced, deleting the checkpoint.
#[test]
fn force_never_deletes_the_source() {
    let work = TempDir::new().unwrap();
    let outer = work.path().join("outer");
    fs::create_dir(&outer).unwrap();
    let src = outer.join("src");
    fs::create_dir(&src).unwrap();
    for e in fs::read_dir(fixture(GQA)).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), src.join(e.file_name())).unwrap();
    }
    let o = shard(&src, 2, &outer, &["--force"]);
    assert!(
        src.join("config.json").exists(),
        "the source checkpoint was deleted by --force; {}",
        context(&o)
    );
    assert_refusal_text(&o, 2, &[]);
}

/// --verify passes on a correct run.
#[test]
fn verify_passes_on_a_normal_run() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = shard_ok(&fixture(GQA), 2, &out, &["--verify", "--json"]);
    let report: Value = json_doc(&["shard"], &o);
    assert_eq!(report["verified"], true, "{report:#}");
    check_manifest(&out);
}

/// Runs with the test hook flipping byte `offset` of rank 1's file.
fn shard_flipped(out: &Path, offset: u64, verify: bool) -> Output {
    let mut cmd = wload();
    cmd.args(["shard", s(&fixture(GQA)), "--tp", "2", "-o", s(out), "-q"])
        .env(
            "WLOAD_TEST_FLIP_BYTE",
            format!("model-rank-1-part-0.safetensors:{offset}"),
        );
    if verify {
        cmd.arg("--verify");
    }
    cmd.output().expect("wload runs")
}

/// A byte changed after writing (data region or header) is caught by --verify: exit 1, a message
/// naming the file, and nothing published.
#[test]
fn verify_catches_a_flipped_byte() {
    let golden = expected(GQA, 2).join("model-rank-1-part-0.safetensors");
    let size = fs::metadata(&golden).unwrap().len();
    let work = TempDir::new().unwrap();
    for (what, offset) in [("data", size - 10), ("header", 20)] {
        // Without --verify the hook really corrupts the file (else this test proves nothing).
        let out = work.path().join(format!("{what}-unverified"));
        let o = shard_flipped(&out, offset, false);
        assert!(o.status.success(), "{}", context(&o));
        let diff = compare_files(&golden, &out.join("model-rank-1-part-0.safetensors"));
        assert!(
            diff.as_deref()
                .is_some_and(|d| d.contains(&format!("at byte {offset},"))),
            "the test hook did not flip byte {offset}: {diff:?}"
        );

        let out = work.path().join(what);
        let o = shard_flipped(&out, offset, true);
        let ctx = format!("{what} byte {offset}: {}", context(&o));
        assert_eq!(o.status.code(), Some(1), "{ctx}");
        let err = stderr(&o);
        assert!(
            err.contains("model-rank-1-part-0.safetensors"),
            "names the file; {ctx}"
        );
        assert!(
            err.contains("differs") || err.contains("verification"),
            "says what is wrong; {ctx}"
        );
        assert!(err.contains(&offset.to_string()), "gives the offset; {ctx}");
        assert_nothing_left(&out, &ctx);
    }
}

/// A truncated source file is refused with exit 3 before anything is published.
#[test]
fn bad_source_leaves_nothing() {
    let src = copy_fixture(GQA);
    let file = src.path().join("model-00003-of-00006.safetensors");
    let len = fs::metadata(&file).unwrap().len();
    fs::OpenOptions::new()
        .write(true)
        .open(&file)
        .unwrap()
        .set_len(len - 5)
        .unwrap();
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = shard(src.path(), 2, &out, &[]);
    assert_refusal_text(&o, 3, &["model-00003-of-00006.safetensors", "truncated"]);
    assert_nothing_left(&out, &context(&o));
}

/// Whether this process can write into a folder with mode 0o555 (root, CAP_DAC_OVERRIDE).
fn permissions_are_bypassed(dir: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    let probe = dir.join("probe");
    fs::create_dir(&probe).unwrap();
    fs::set_permissions(&probe, fs::Permissions::from_mode(0o555)).unwrap();
    let bypassed = fs::write(probe.join("x"), b"x").is_ok();
    fs::set_permissions(&probe, fs::Permissions::from_mode(0o755)).unwrap();
    fs::remove_dir_all(&probe).unwrap();
    bypassed
}

/// A target that cannot be created: exit 1, the path and the OS error in the message.
#[test]
fn unwritable_target_fails_cleanly() {
    let work = TempDir::new().unwrap();

    // A regular file where a parent folder should be (tests/it/safety/out_safety.rs has more): a usage
    // error, found before any work.
    let file = work.path().join("a-file");
    fs::write(&file, b"not a folder").unwrap();
    let out = file.join("out");
    let o = shard(&fixture(GQA), 2, &out, &[]);
    assert_refusal_text(&o, 2, &[s(&file), "not an existing folder"]);
    assert_eq!(fs::read(&file).unwrap(), b"not a folder");
}

/// Linux capabilities that let root ignore file permissions (capability.h).
const CAP_DAC_OVERRIDE: libc::c_ulong = 1;
const CAP_DAC_READ_SEARCH: libc::c_ulong = 2;

/// Makes `cmd` run without the capabilities that let root ignore file permissions. They are
/// dropped from the bounding set before exec, because exec gives root every capability left there.
fn without_permission_override(cmd: &mut StdCommand) -> &mut StdCommand {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe, and the closure touches nothing else of the parent.
    unsafe {
        cmd.pre_exec(|| {
            for cap in [CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH] {
                if libc::prctl(libc::PR_CAPBSET_DROP, cap, 0, 0, 0) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        })
    }
}

/// A read-only parent folder: exit 1, "Permission denied", nothing left. As root (CI), wload runs
/// without the permission override, so the folder's mode applies to it as to any user.
#[test]
fn read_only_parent_fails_cleanly() {
    use std::os::unix::fs::PermissionsExt;
    const TEST: &str = "read_only_parent_fails_cleanly";
    let work = TempDir::new().unwrap();
    let parent = work.path().join("ro");
    fs::create_dir(&parent).unwrap();
    fs::set_permissions(&parent, fs::Permissions::from_mode(0o555)).unwrap();
    let root = permissions_are_bypassed(work.path());
    let run = |program: &str, args: &[&str]| {
        let mut cmd = StdCommand::new(program);
        cmd.args(args).env_remove("RUST_BACKTRACE");
        if root {
            without_permission_override(&mut cmd);
        }
        cmd.output()
    };
    // The probe proves the mode applies; otherwise the test below would test nothing.
    let probe = parent.join("probe");
    match run("mkdir", &[s(&probe)]) {
        Ok(o) if !o.status.success() => {}
        Ok(_) => {
            fs::set_permissions(&parent, fs::Permissions::from_mode(0o755)).unwrap();
            return missing_environment(
                TEST,
                "a mode 0555 folder is writable even without CAP_DAC_OVERRIDE",
            );
        }
        Err(e) => {
            fs::set_permissions(&parent, fs::Permissions::from_mode(0o755)).unwrap();
            return missing_environment(
                TEST,
                &format!("cannot drop CAP_DAC_OVERRIDE as root ({e})"),
            );
        }
    }
    let out = parent.join("out");
    let o = run(
        env!("CARGO_BIN_EXE_wload"),
        &["shard", s(&fixture(GQA)), "--tp", "2", "-o", s(&out)],
    )
    .expect("wload runs");
    fs::set_permissions(&parent, fs::Permissions::from_mode(0o755)).unwrap();
    assert_refusal_text(&o, 1, &["Permission denied"]);
    assert_nothing_left(&out, &context(&o));
}

/// Unmounts on drop (before the temp folder under it is removed).
struct Mounted(PathBuf);

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = StdCommand::new("umount").arg(&self.0).status();
    }
}

/// A disk too small: exit 1, refused by the free-space check before anything is written, nothing
/// left on the small filesystem (a disk filling up mid-run: tests/it/safety/out_safety.rs).
#[test]
fn full_disk_fails_cleanly() {
    let work = TempDir::new().unwrap();
    let dir = work.path().join("small");
    fs::create_dir(&dir).unwrap();
    // 1 MiB: the two 548 KiB part files do not both fit.
    let mounted = StdCommand::new("mount")
        .args(["-t", "tmpfs", "-o", "size=1m", "tmpfs", s(&dir)])
        .stderr(Stdio::piped())
        .output();
    match mounted {
        Ok(m) if m.status.success() => {}
        Ok(m) => {
            let why = format!(
                "cannot mount a tmpfs, which needs root ({})",
                String::from_utf8_lossy(&m.stderr).trim()
            );
            return missing_environment("full_disk_fails_cleanly", &why);
        }
        Err(e) => {
            let why = format!("cannot run mount ({e})");
            return missing_environment("full_disk_fails_cleanly", &why);
        }
    }
    let _guard = Mounted(dir.clone());
    let out = dir.join("out");
    let o = shard(&fixture(GQA), 2, &out, &[]);
    assert_refusal_text(&o, 1, &[s(&out), "is free there", "nothing was written"]);
    assert_nothing_left(&out, &context(&o));
    assert_eq!(
        fs::read_dir(&dir).unwrap().count(),
        0,
        "the small filesystem is not empty"
    );
}

/// A few hundred MB (sparse on disk) checkpoint, large enough that sharding takes a while.
fn big_checkpoint(dir: &Path) -> Result<(), String> {
    let out = StdCommand::new("python3")
        .arg(manifest_dir().join("bench/gen_checkpoint.py"))
        .args(["--files", "4", "--layers", "8", "--real-shapes"])
        .args(["--hidden-size", "1024", "--intermediate-size", "4096"])
        .args(["--num-attention-heads", "16", "--num-key-value-heads", "8"])
        .args(["--vocab-size", "32000", "--quiet", "--out", s(dir)])
        .output()
        .map_err(|e| format!("cannot run python3: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "gen_checkpoint.py failed: {}",
            String::from_utf8_lossy(&out.stderr)
        ));
    }
    Ok(())
}

/// Ctrl-C while writing: exit 130 (or death by SIGINT), no OUT, no temporary folder.
#[test]
fn sigint_leaves_nothing() {
    use std::os::unix::process::ExitStatusExt;
    let work = TempDir::new().unwrap();
    let src = work.path().join("ckpt");
    if let Err(why) = big_checkpoint(&src) {
        return missing_environment("sigint_leaves_nothing", &why);
    }
    let started = Instant::now();
    for (i, delay_ms) in [0u64, 30, 100, 250].into_iter().enumerate() {
        let out = work.path().join(format!("out{i}"));
        let mut child = wload_process()
            .args(["shard", s(&src), "--tp", "2", "-o", s(&out), "-q"])
            .env_remove("RUST_BACKTRACE")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("wload starts");
        let pid = child.id() as libc::pid_t;

        // The temporary folder appears once planning is done and the handler is installed.
        let t = Instant::now();
        while leftovers(&out).is_empty() {
            if let Some(st) = child.try_wait().unwrap() {
                panic!("delay {delay_ms} ms: wload exited ({st}) before its temp folder appeared");
            }
            assert!(t.elapsed() < Duration::from_secs(20), "no temp folder");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(delay_ms));
        // SAFETY: kill(2) on our own child's pid, which has not been reaped yet.
        assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
        let sent = Instant::now();

        let status = loop {
            if let Some(st) = child.try_wait().unwrap() {
                break st;
            }
            if sent.elapsed() > Duration::from_secs(30) {
                let _ = child.kill();
                panic!("delay {delay_ms} ms: wload did not stop within 30 s of SIGINT");
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let stopped_in = sent.elapsed();
        let mut err = String::new();
        std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
        let ctx = format!("delay {delay_ms} ms: {status}, stderr:\n{err}");
        if status.success() && delay_ms > 0 {
            // A fast (release) build may finish before the signal: then OUT must be complete.
            eprintln!("delay {delay_ms} ms: finished before SIGINT; checking the output instead");
            check_manifest(&out);
            continue;
        }
        assert!(
            status.code() == Some(130) || status.signal() == Some(libc::SIGINT),
            "{ctx}"
        );
        if status.code() == Some(130) {
            // Said once, with what became of OUT.
            let said = format!(
                "error: interrupted: nothing was written to {}",
                out.display()
            );
            assert_eq!(err.matches(&said).count(), 1, "{ctx}");
        }
        assert_nothing_left(&out, &ctx);
        assert!(
            stopped_in < Duration::from_secs(5),
            "{ctx}\nstopped {stopped_in:?} after SIGINT"
        );
    }
    eprintln!("sigint runs took {:?}", started.elapsed());
}

/// --json: the manifest, the byte count and the timings.
#[test]
fn json_report() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = shard_ok(&fixture("qwen2"), 2, &out, &["--json"]);
    let r: Value = json_doc(&["shard"], &o);
    let files = r["manifest"]["files"].as_array().expect("manifest.files");
    assert_eq!(files.len(), 2, "{r:#}");
    let on_disk = check_manifest(&out);
    assert_eq!(
        r["manifest"]["files"], on_disk["files"],
        "report vs wload.json"
    );
    let sum: u64 = files.iter().map(|f| f["size"].as_u64().unwrap()).sum();
    assert_eq!(r["bytes"].as_u64(), Some(sum), "{r:#}");
    assert_eq!(r["manifest"]["tp"], 2, "{r:#}");
}

/// The timings in the --json report are seconds spent in each stage: positive for the stages that
/// did work, zero for --verify when it did not run, and together no more than the whole run took
/// as the test measured it (a unit mix-up, ms or ns, or a stage counted twice breaks that).
#[test]
fn json_timings_add_up() {
    let work = TempDir::new().unwrap();
    for verify in [false, true] {
        let out = work.path().join(format!("out-{verify}"));
        let extra: &[&str] = if verify {
            &["--json", "--verify"]
        } else {
            &["--json"]
        };
        let started = Instant::now();
        let o = shard_ok(&fixture("qwen2"), 2, &out, extra);
        let wall = started.elapsed().as_secs_f64();
        let r: Value = json_doc(&["shard"], &o);
        let t = r["timings"].as_object().expect("timings object");
        let stage = |k: &str| {
            t.get(k)
                .and_then(Value::as_f64)
                .unwrap_or_else(|| panic!("timings.{k} missing: {r:#}"))
        };
        for k in ["plan_s", "write_s", "hash_s"] {
            assert!(stage(k) > 0.0, "{k} is not positive: {r:#}");
        }
        if verify {
            assert!(stage("verify_s") > 0.0, "--verify ran: {r:#}");
        } else {
            assert_eq!(stage("verify_s"), 0.0, "--verify did not run: {r:#}");
        }
        let mut sum = 0.0;
        for (k, v) in t {
            let v = v.as_f64().unwrap_or_else(|| panic!("{k} is not a number"));
            assert!(v.is_finite() && v >= 0.0, "{k} = {v}: {r:#}");
            // Seconds summed over the hashing threads overlap the stages: not a stage.
            if k != "hash_busy_s" {
                sum += v;
            }
        }
        assert!(stage("hash_busy_s") > 0.0, "every file was hashed: {r:#}");
        assert!(
            sum <= wall,
            "the stages sum to {sum} s, more than the {wall} s the run took: {r:#}"
        );
    }
}

/// The human summary says how to serve the result, with the right TP size.
#[test]
fn human_output_says_how_to_serve() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = shard_ok(&fixture(GQA), 4, &out, &[]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("vllm serve"), "{text}");
    assert!(text.contains(s(&out)), "{text}");
    assert!(text.contains("sharded_state"), "{text}");
    assert!(
        text.contains("--tensor-parallel-size 4") || text.contains("-tp 4"),
        "{text}"
    );
}

/// Runs `wload shard SRC --tp TP -o OUT` with `extra` flags and `env`; panics unless it succeeds.
fn shard_env_ok(src: &Path, tp: u64, out: &Path, extra: &[&str], env: &[(&str, &str)]) {
    let o = wload()
        .args(["shard", s(src), "--tp", &tp.to_string(), "-o", s(out), "-q"])
        .args(extra)
        .envs(env.iter().copied())
        .output()
        .expect("wload runs");
    assert!(
        o.status.success(),
        "shard {} --tp {tp} {extra:?} {env:?}: {}",
        src.display(),
        context(&o)
    );
}

/// A shard run: fixture, TP, extra flags, environment.
type Case<'a> = (&'a str, u64, &'a [&'a str], &'a [(&'a str, &'a str)]);

/// Each file is hashed for wload.json as soon as its last byte is written, beside the writes of
/// the others: over TP sizes, part splits (parts that complete at different times), rank subsets,
/// every byte through memory in small chunks, fills and FP8 scales, the manifest holds the XXH3 of
/// the bytes on disk, and `load` accepts the folder: `--dry-run --read` finds every checksum equal
/// to the manifest's, `--check` loads it.
#[test]
fn manifest_hashes_are_the_written_bytes() {
    let tiny: &[(&str, &str)] = &[
        ("WLOAD_TEST_CHUNK_BYTES", "100"),
        ("WLOAD_NO_COPY_FILE_RANGE", "1"),
    ];
    let cases: &[Case] = &[
        (GQA, 1, &[], &[]),
        (GQA, 2, &[], &[]),
        (GQA, 4, &["--max-part-size", "30000"], &[]),
        ("llama_tied_fp16", 2, &["--max-part-size", "100000"], &[]),
        ("mixtral", 2, &["--max-part-size", "200000"], tiny),
        ("mixtral", 4, &[], &[("WLOAD_TEST_CHUNK_BYTES", "4100")]),
        ("qwen2", 4, &["--ranks", "1-2"], &[]),
        ("llama_gqa_fp8_block", 2, &["--max-part-size", "50000"], &[]),
    ];
    let work = TempDir::new().unwrap();
    for (i, &(fx, tp, extra, env)) in cases.iter().enumerate() {
        let ctx = format!("{fx} --tp {tp} {extra:?} {env:?}");
        let out = work.path().join(format!("out{i}"));
        shard_env_ok(&fixture(fx), tp, &out, extra, env);
        let m = check_manifest(&out);
        if extra.contains(&"--max-part-size") {
            let files = m["files"].as_array().unwrap();
            assert!(
                files.len() as u64 > tp,
                "{ctx}: expected several parts per rank: {m:#}"
            );
        }
        let tp_s = tp.to_string();
        let mut load_args = vec!["load", s(&out), "--tp", &tp_s, "--device", "cpu"];
        if let Some(at) = extra.iter().position(|&a| a == "--ranks") {
            load_args.extend(["--ranks", extra[at + 1]]);
        }
        let read = run(&[load_args.as_slice(), &["--dry-run", "--read", "--json"]].concat());
        assert!(
            read.status.success(),
            "{ctx}: load --dry-run --read: {}",
            context(&read)
        );
        let r: Value = json_doc(&["load"], &read);
        let sums = r["files_read"].as_array().expect("files_read");
        // Parts without tensors (vLLM's split can close an empty first part) are not read.
        assert!(!sums.is_empty(), "{ctx}: {r:#}");
        for f in sums {
            assert_eq!(f["matches_manifest"], true, "{ctx}: {f:#}");
        }
        let check = run(&[load_args.as_slice(), &["--check"]].concat());
        assert!(
            check.status.success(),
            "{ctx}: load --check: {}",
            context(&check)
        );
    }
}

/// A write that fails after blocks of several files are hashed (test builds only:
/// `WLOAD_TEST_WRITE_FAILS_AFTER`, a full disk after that many bytes) ends the run with exit 1,
/// the disk's error naming the file, and leaves neither OUT nor a temporary folder: at the first
/// write, half-way, and near the end.
#[test]
fn a_write_failing_beside_the_hashing_leaves_nothing() {
    let work = TempDir::new().unwrap();
    let src = fixture("mixtral");
    let split = ["--max-part-size", "200000"];
    let good = work.path().join("good");
    shard_ok(&src, 2, &good, &[&split[..], &["-q"]].concat());
    let m = check_manifest(&good);
    // Data bytes: each file's size less its header (the 8-byte length and the JSON).
    let data: u64 = m["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            let bytes = fs::read(good.join(f["name"].as_str().unwrap())).unwrap();
            let header = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap());
            bytes.len() as u64 - header
        })
        .sum();
    for budget in [0, data / 2, data * 9 / 10] {
        let out = work.path().join(format!("out{budget}"));
        let o = wload()
            .args(["shard", s(&src), "--tp", "2", "-o", s(&out), "-q"])
            .args(split)
            .env("WLOAD_TEST_WRITE_FAILS_AFTER", budget.to_string())
            .output()
            .expect("wload runs");
        let ctx = format!("budget {budget} of {data}: {}", context(&o));
        // Which rank file fills the disk first is a race: the fragments, not the whole text.
        assert_refused(&o, 1, &["No space left", "model-rank-"]);
        assert_nothing_left(&out, &ctx);
    }
}

/// The summary counts in words that agree with the numbers: "1 file", "rank [0]", "2 files".
#[test]
fn summary_counts_in_singular_and_plural() {
    let work = TempDir::new().unwrap();
    for (tp, want) in [(1, "wrote 1 file ("), (2, "wrote 2 files (")] {
        let out = work.path().join(format!("out{tp}"));
        let o = shard_ok(&fixture(GQA), tp, &out, &[]);
        let text = stdout(&o);
        let first = text.lines().next().unwrap_or_default();
        assert!(first.starts_with(want), "tp {tp}: {text}");
        let ranks = if tp == 1 { "rank 0 " } else { "ranks 0-1 " };
        assert!(first.contains(ranks), "tp {tp}: {text}");
        assert!(!text.contains(" 1 files"), "{text}");
    }
}

/// The names on the summary's "copied " line.
fn copied_names(text: &str) -> Vec<&str> {
    text.lines()
        .find_map(|l| l.strip_prefix("copied "))
        .map(|l| l.split(", ").collect())
        .unwrap_or_default()
}

/// config.json copied unchanged is listed with the copied files; rewritten (a tied config whose
/// lm_head differs from the embedding: vLLM must load both, untied), the summary says what
/// changed and why, and `--json` lists the change.
#[test]
fn summary_says_whether_config_json_was_rewritten() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("plain");
    let o = shard_ok(&fixture(GQA), 2, &out, &[]);
    let text = stdout(&o);
    assert!(copied_names(&text).contains(&"config.json"), "{text}");
    assert!(!text.contains("rewrote"), "{text}");
    let j = wload_json(&[
        "shard",
        s(&fixture(GQA)),
        "--tp",
        "2",
        "-o",
        s(&work.path().join("pj")),
        "--json",
    ]);
    assert_eq!(j["config_changes"], serde_json::json!([]), "{j:#}");

    // The tied fixture plus an lm_head that differs from the embedding in one element.
    let src = copy_fixture("llama_tied_fp16");
    let Held {
        dtype,
        shape,
        mut data,
    } = checkpoint_tensors(src.path())
        .remove("model.embed_tokens.weight")
        .expect("the fixture has an embedding");
    data[0] ^= 0x01;
    let head = [(
        "lm_head.weight",
        dtype.as_str(),
        shape.as_slice(),
        data.as_slice(),
    )];
    write_safetensors(&src.path().join("model-lm-head.safetensors"), &head);
    let ipath = src.path().join("model.safetensors.index.json");
    let mut index: Value = serde_json::from_slice(&fs::read(&ipath).unwrap()).unwrap();
    index["weight_map"]["lm_head.weight"] = Value::from("model-lm-head.safetensors");
    write_json(&ipath, &index);

    let out = work.path().join("untied");
    let o = shard_ok(src.path(), 2, &out, &[]);
    let text = stdout(&o);
    let line = text
        .lines()
        .find(|l| l.starts_with("rewrote config.json: "))
        .unwrap_or_else(|| panic!("no rewrite line: {text}"));
    assert!(
        line.contains("tie_word_embeddings: true → false (lm_head differs"),
        "{text}"
    );
    assert!(!copied_names(&text).contains(&"config.json"), "{text}");
    let cfg: Value = serde_json::from_slice(&fs::read(out.join("config.json")).unwrap()).unwrap();
    assert_eq!(cfg["tie_word_embeddings"], false);
    let j = wload_json(&[
        "shard",
        s(src.path()),
        "--tp",
        "2",
        "-o",
        s(&work.path().join("uj")),
        "--json",
    ]);
    let changes = j["config_changes"].as_array().expect("config_changes");
    assert_eq!(changes.len(), 1, "{j:#}");
    assert!(
        changes[0]
            .as_str()
            .unwrap()
            .starts_with("tie_word_embeddings: true → false"),
        "{j:#}"
    );
}

/// `--verify` that passes says so in the summary; without it, no such claim.
#[test]
fn verify_confirms_when_it_passes() {
    let work = TempDir::new().unwrap();
    for verify in [true, false] {
        let out = work.path().join(format!("out-{verify}"));
        let extra: &[&str] = if verify { &["--verify"] } else { &[] };
        let o = shard_ok(&fixture(GQA), 2, &out, extra);
        let text = stdout(&o);
        let said = text
            .lines()
            .any(|l| l == "verified: all 2 files read back byte for byte as the plan computes them from the source");
        assert_eq!(said, verify, "--verify {verify}: {text}");
    }
}

/// With `-v`, the summary says how the source was read and how much of it was cached (the JSON's
/// `io` and `source_cache`): a write rate means little without them. The default leaves them out
/// and leads with the result; `-q` prints the serve line alone, for a script to capture.
#[test]
fn the_summary_says_how_the_source_was_read() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let src = Path::new("examples/tiny-llama");
    let read_line = |o: &Output| {
        stdout(o)
            .lines()
            .find(|l| l.starts_with("read: "))
            .unwrap_or_else(|| panic!("no `read:` line: {}", context(o)))
            .to_string()
    };
    let o = shard_ok(src, 2, &out, &["--io", "direct", "-v"]);
    let line = read_line(&o);
    assert!(
        line.starts_with("read: io direct (direct: as asked); source 1.1 MiB, "),
        "{line}"
    );
    assert!(
        line.contains("% in the page cache at the start ("),
        "{line}"
    );
    assert!(!line.contains("--cold"), "{line}");

    let o = shard_ok(src, 2, &out, &["--force", "--cold", "--verbose"]);
    let line = read_line(&o);
    assert!(line.starts_with("read: io "), "{line}");
    // How much was cached before depends on what ran before: only that it was evicted.
    assert!(line.contains(", after --cold evicted it from "), "{line}");
    assert!(line.ends_with(" cached)"), "{line}");

    let o = shard_ok(src, 2, &out, &["--force"]);
    let text = stdout(&o);
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("wrote 2 files"), "{}", stdout(&o));
    assert!(
        !lines
            .iter()
            .any(|l| l.starts_with("read: ") || l.starts_with("time: ")),
        "{}",
        stdout(&o)
    );

    let o = shard_ok(src, 2, &out, &["--force", "-q"]);
    let serve = format!("vllm serve {} ", out.display());
    assert!(stdout(&o).starts_with(&serve), "{}", context(&o));
    assert_eq!(stdout(&o).lines().count(), 1, "{}", context(&o));
    assert_eq!(stderr(&o), "", "{}", context(&o));
}

/// The output holds what `vllm serve` reads: not the source's weight index (it names files the
/// output does not have) nor weights of other formats in a folder (Llama's `original/`), each
/// left out with a note saying why; the tokenizer and other side files are copied.
#[test]
fn the_source_weight_index_and_other_weights_are_left_out_with_why() {
    let src = copy_fixture("llama_gqa");
    assert!(src.path().join("model.safetensors.index.json").is_file());
    fs::create_dir(src.path().join("original")).unwrap();
    fs::write(src.path().join("original/consolidated.00.pth"), b"weights").unwrap();
    fs::write(src.path().join("original/params.json"), b"{}").unwrap();
    fs::write(src.path().join("tokenizer.json"), b"{}").unwrap();
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = shard_ok(src.path(), 2, &out, &[]);
    assert!(!out.join("model.safetensors.index.json").exists());
    assert!(!out.join("original/consolidated.00.pth").exists());
    assert!(out.join("original/params.json").is_file());
    assert!(out.join("tokenizer.json").is_file());
    let err = stderr(&o);
    assert!(
        err.contains(
            "note: left out model.safetensors.index.json of the source: the source's weight index"
        ),
        "{err}"
    );
    assert!(
        err.contains(
            "note: left out original/consolidated.00.pth of the source: weights of another format"
        ),
        "{err}"
    );
    check_manifest(&out);
}

/// A `--ranks` run into a local folder records no serve line (its folder is not where the runs'
/// files are merged; `wload inspect` of that folder gives the line), and with `-q`, whose stdout
/// is the serve line alone, still warns on stderr that the line holds only once all ranks are
/// together.
#[test]
fn a_ranks_run_records_no_serve_line_and_warns_even_when_quiet() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = shard_ok(&fixture(GQA), 2, &out, &["--ranks", "0", "-q"]);
    assert!(stdout(&o).starts_with("vllm serve "), "{}", context(&o));
    assert!(
        stderr(&o).contains("warning: this run wrote 1 of the 2 ranks: serve once all 2 ranks' files are in one folder"),
        "{}",
        context(&o)
    );
    let record: Value =
        serde_json::from_slice(&fs::read(out.join("wload-ranks-0.json")).unwrap()).unwrap();
    assert_eq!(record["serve"], Value::Null, "{record:#}");
    // A run of every rank records its line.
    let all = work.path().join("all");
    shard_ok(&fixture(GQA), 2, &all, &["-q"]);
    let record: Value = serde_json::from_slice(&fs::read(all.join("wload.json")).unwrap()).unwrap();
    assert!(record["serve"]["shell"].as_str().is_some(), "{record:#}");
}

/// wload.json names the source as the user did (a link's own path, made absolute), not where
/// the link points today.
#[test]
fn the_record_names_a_linked_source_by_its_link() {
    let work = TempDir::new().unwrap();
    let link = work.path().join("current-model");
    std::os::unix::fs::symlink(fixture(GQA), &link).unwrap();
    let out = work.path().join("out");
    shard_ok(&link, 2, &out, &["-q"]);
    let m = check_manifest(&out);
    assert_eq!(m["source"], link.display().to_string(), "{m:#}");
}
