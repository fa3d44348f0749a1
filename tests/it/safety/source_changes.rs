//! Sources that change while wload reads them: a checkpoint re-downloaded or synced during a
//! `shard` or `load`. The race is made deterministic by the engine's test hooks
//! (`WLOAD_TEST_AT_EXECUTE`: the plan is made and no source is open yet; `WLOAD_TEST_AT_READ`:
//! the sources are open and no tensor byte is read), which run a shell command that replaces,
//! rewrites, truncates or extends a source file at exactly that point.
//!
//! What must hold: a run reads exactly the bytes whose header it planned from, or stops with
//! an error naming the file (exit 1) and publishes nothing; never exit 0 with other bytes, never
//! a signal.

use std::fs;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Output;

use fastrand::Rng;
use tempfile::TempDir;

use crate::support::*;

/// The fixture every case shards and loads (six files, so changes hit one file among several).
const FIXTURE: &str = "llama_gqa";
const CHANGED_FILE: &str = "model-00002-of-00006.safetensors";

/// How a source file is changed.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mutation {
    /// A copy with four bytes of tensor data changed, renamed over the file (a new download).
    Replace,
    /// An identical copy renamed over the file: the same bytes, another file.
    ReplaceIdentical,
    /// Four bytes of tensor data overwritten in place (rsync --inplace, a writer in place).
    Rewrite,
    /// Cut to half its size.
    Truncate,
    /// Bytes appended.
    Extend,
}

const MUTATIONS: [Mutation; 5] = [
    Mutation::Replace,
    Mutation::ReplaceIdentical,
    Mutation::Rewrite,
    Mutation::Truncate,
    Mutation::Extend,
];

/// The shell command that applies `m` to `f` (a file of `size` bytes).
fn command(m: Mutation, f: &Path, size: u64) -> String {
    let f = s(f);
    // Inside the last tensor's data, far from the header.
    let at = size - 64;
    let poke = |target: &str| {
        format!("printf WXYZ | dd of='{target}' bs=1 seek={at} conv=notrunc status=none")
    };
    match m {
        Mutation::Replace => format!(
            "cp '{f}' '{f}.new' && {} && mv '{f}.new' '{f}'",
            poke(&format!("{f}.new"))
        ),
        Mutation::ReplaceIdentical => format!("cp '{f}' '{f}.new' && mv '{f}.new' '{f}'"),
        Mutation::Rewrite => poke(f),
        Mutation::Truncate => format!("truncate -s {} '{f}'", size / 2),
        Mutation::Extend => format!("printf 'more bytes' >> '{f}'"),
    }
}

/// A fresh copy of the fixture, its files' times a moment in the past of the run, so that a
/// change made by the hook always moves them (file system clocks tick in milliseconds).
fn source() -> TempDir {
    let dir = copy_fixture(FIXTURE);
    std::thread::sleep(std::time::Duration::from_millis(20));
    dir
}

fn size_of(p: &Path) -> u64 {
    fs::metadata(p).unwrap().len()
}

/// The refusal every changed source gets: exit 1, the file named, the cause said, no signal.
fn assert_changed_refusal(out: &Output, file: &Path) {
    assert_eq!(out.status.signal(), None, "{}", context(out));
    let err = assert_refusal_text(out, 1, &["changed since its header was read"]);
    assert!(
        err.contains(s(file)),
        "the message names the changed file {}: {err}",
        file.display()
    );
    // The source, never the hidden staging folder being written (a truncated source used to be
    // reported as the part file it was copied into).
    assert!(!err.contains(".wload-tmp"), "{err}");
}

/// A `shard --tp 2` of a fresh copy of the fixture into a new OUT, with `hook(changed file)`
/// run at `point` (one of the engine's test hooks): the run's output, the source (kept alive),
/// the changed file, OUT's parent (kept alive) and OUT.
struct HookedShard {
    out: Output,
    _src: TempDir,
    file: PathBuf,
    out_dir: TempDir,
    dir: PathBuf,
}

fn shard_with_hook(point: &str, extra: &[&str], hook: impl FnOnce(&Path) -> String) -> HookedShard {
    let src = source();
    let file = src.path().join(CHANGED_FILE);
    let out_dir = TempDir::new().unwrap();
    let dir = out_dir.path().join("out");
    let out = wload()
        .args(["shard", s(src.path()), "--tp", "2", "-o", s(&dir)])
        .args(extra)
        .env(point, hook(&file))
        .output()
        .unwrap();
    HookedShard {
        out,
        _src: src,
        file,
        out_dir,
        dir,
    }
}

/// A source cut short while a shard copies it file to file (copy_file_range) is named as the
/// source that shrank, with both sizes.
#[test]
fn a_source_truncated_during_a_shard_is_named_with_its_sizes() {
    let mut size = 0;
    let r = shard_with_hook("WLOAD_TEST_AT_READ", &[], |f| {
        size = size_of(f);
        command(Mutation::Truncate, f, size)
    });
    assert_changed_refusal(&r.out, &r.file);
    let err = stderr(&r.out);
    assert!(
        err.contains(&format!("shrank from {size} to {} bytes", size / 2)),
        "{err}"
    );
    assert!(!r.dir.exists());
}

/// A shard whose source file is replaced by rename after planning (before the engine opens it)
/// is refused, naming the file, and leaves no OUT: the engine used to reopen by path and read
/// the new file at the old offsets, exiting 0 with bytes of neither version.
#[test]
fn a_source_replaced_after_planning_stops_the_shard() {
    let r = shard_with_hook("WLOAD_TEST_AT_EXECUTE", &[], |f| {
        command(Mutation::Replace, f, size_of(f))
    });
    assert_changed_refusal(&r.out, &r.file);
    assert!(!r.dir.exists(), "nothing is published");
    let left: Vec<_> = fs::read_dir(r.out_dir.path()).unwrap().collect();
    assert!(left.is_empty(), "no staging folder is left: {left:?}");
}

/// A source rewritten in place once the engine holds it open (same inode, same size) is caught
/// by the check after reading: exit 1, nothing published.
#[test]
fn a_source_rewritten_in_place_while_read_stops_the_shard() {
    let r = shard_with_hook("WLOAD_TEST_AT_READ", &[], |f| {
        command(Mutation::Rewrite, f, size_of(f))
    });
    assert_changed_refusal(&r.out, &r.file);
    assert!(!r.dir.exists(), "nothing is published");
}

/// `--verify` compares the output with the source as planned: a source rewritten between the
/// write and the read-back is refused, not "verified byte for byte" against the new bytes.
#[test]
fn verify_refuses_a_source_changed_after_the_write() {
    // The second engine run of the process is the read-back.
    let r = shard_with_hook("WLOAD_TEST_AT_EXECUTE", &["--verify"], |f| {
        let poke = command(Mutation::Rewrite, f, size_of(f));
        format!("if [ \"$WLOAD_TEST_RUN\" = 2 ]; then {poke}; fi")
    });
    assert_changed_refusal(&r.out, &r.file);
    assert!(!stdout(&r.out).contains("verified"), "{}", context(&r.out));
    assert!(!r.dir.exists(), "nothing is published");
}

/// `load --io mmap` of a source truncated under its map used to die of SIGBUS (exit 135, no
/// message). Every read mode now ends in the same refusal, naming the file.
#[test]
fn a_source_truncated_while_loaded_is_refused_in_every_io_mode() {
    for io in ["mmap", "buffered", "direct"] {
        let src = source();
        let f = src.path().join(CHANGED_FILE);
        let o = wload()
            .args([
                "load",
                s(src.path()),
                "--tp",
                "2",
                "--device",
                "cpu",
                "--io",
                io,
            ])
            .env(
                "WLOAD_TEST_AT_READ",
                command(Mutation::Truncate, &f, size_of(&f)),
            )
            .output()
            .unwrap();
        assert_changed_refusal(&o, &f);
    }
}

/// A rank file of a pre-sharded folder replaced after its header was checked: `load` and
/// `load --dry-run --read` refuse it instead of loading or hashing the new file.
#[test]
fn a_rank_file_replaced_after_its_header_was_checked_is_refused() {
    let src = copy_fixture(FIXTURE);
    let out_dir = TempDir::new().unwrap();
    let out = out_dir.path().join("out");
    shard_ok(src.path(), 2, &out, &[]);
    std::thread::sleep(std::time::Duration::from_millis(20));
    let f = out.join("model-rank-1-part-0.safetensors");
    let mutate = command(Mutation::Replace, &f, size_of(&f));
    for point in ["WLOAD_TEST_AT_EXECUTE", "WLOAD_TEST_AT_READ"] {
        let fresh = out.with_extension(point);
        copy_dir(&out, &fresh);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let f = fresh.join("model-rank-1-part-0.safetensors");
        let mutate = mutate.replace(s(&out), s(&fresh));
        let o = wload()
            .args(["load", s(&fresh), "--device", "cpu"])
            .env(point, &mutate)
            .output()
            .unwrap();
        assert_changed_refusal(&o, &f);
    }
    // --dry-run --read hashes the files without the engine: replaced before it reads them.
    let fresh = out.with_extension("read");
    copy_dir(&out, &fresh);
    let f = fresh.join("model-rank-1-part-0.safetensors");
    fs::copy(&f, fresh.join("copy")).unwrap();
    let o = wload()
        .args(["load", s(&fresh), "--dry-run", "--read"])
        .env(
            "WLOAD_TEST_AT_HASH",
            format!("mv '{}' '{}'", s(&fresh.join("copy")), s(&f)),
        )
        .output()
        .unwrap();
    assert_changed_refusal(&o, &f);
}

fn copy_dir(from: &Path, to: &Path) {
    fs::create_dir_all(to).unwrap();
    for e in fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), to.join(e.file_name())).unwrap();
    }
}

/// One random case of the property test: which command, which file, which change, when.
#[derive(Debug)]
struct Case {
    args: Vec<&'static str>,
    file: usize,
    mutation: Mutation,
    point: &'static str,
}

fn random_case(rng: &mut Rng) -> Case {
    let commands: [&[&str]; 6] = [
        &["shard", "--tp", "2"],
        &["shard", "--tp", "1", "--verify"],
        &["shard", "--tp", "2", "--io", "direct"],
        &["load", "--tp", "2", "--device", "cpu", "--io", "buffered"],
        &["load", "--tp", "2", "--device", "cpu", "--io", "direct"],
        &["load", "--tp", "1", "--device", "cpu", "--io", "mmap"],
    ];
    Case {
        args: rng.choice(commands).unwrap().to_vec(),
        file: rng.usize(1..=6),
        mutation: *rng.choice(&MUTATIONS).unwrap(),
        point: rng
            .choice(["WLOAD_TEST_AT_EXECUTE", "WLOAD_TEST_AT_READ"])
            .unwrap(),
    }
}

/// What a run produced that a user would consume: the rank files' bytes (shard) or every
/// loaded tensor's checksum (load).
fn result_of(case: &Case, src: &Path, out: &Path, extra_env: Option<(&str, String)>) -> Output {
    let mut cmd = wload();
    cmd.arg(case.args[0]).arg(s(src)).args(&case.args[1..]);
    if case.args[0] == "shard" {
        cmd.args(["-o", s(out)]);
    } else {
        cmd.args(["--checksums", "--json"]);
    }
    if let Some((k, v)) = extra_env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

fn rank_files_bytes(out: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut v: Vec<(PathBuf, Vec<u8>)> = fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(".safetensors"))
        .map(|p| {
            let b = fs::read(&p).unwrap();
            (p.file_name().unwrap().into(), b)
        })
        .collect();
    v.sort();
    v
}

/// The loaded tensors' checksums of a `load --checksums --json` document.
fn loaded_checksums(o: &Output) -> serde_json::Value {
    let v: serde_json::Value = json_doc(&["load"], o);
    v["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["checksums"].clone())
        .collect()
}

/// The property: whatever file of the source is replaced, rewritten, truncated or extended,
/// before the engine opens it or after, no run exits 0 with bytes other than those of the
/// unchanged source; no run dies of a signal or a panic; a refused shard publishes nothing.
#[test]
fn mutating_a_source_between_plan_and_read_never_yields_other_bytes() {
    let mut rng = Rng::with_seed(0x5eed_f11e);
    let mut reference: std::collections::BTreeMap<String, Output> = Default::default();
    let mut refused = 0;
    for i in 0..30 {
        let case = random_case(&mut rng);
        let src = source();
        let f = src
            .path()
            .join(format!("model-0000{}-of-00006.safetensors", case.file));
        let work = TempDir::new().unwrap();
        let out = work.path().join("out");
        let key = case.args.join(" ");
        if !reference.contains_key(&key) {
            let clean_dir = TempDir::new().unwrap();
            let clean = clean_dir.path().join("out");
            let o = result_of(&case, src.path(), &clean, None);
            assert!(o.status.success(), "reference run {key}: {}", context(&o));
            reference.insert(key.clone(), o);
            if case.args[0] == "shard" {
                reference.get_mut(&key).unwrap().stdout = serde_json::to_vec(
                    &rank_files_bytes(&clean)
                        .into_iter()
                        .map(|(n, b)| (n, xxhash_rust::xxh3::xxh3_64(&b)))
                        .collect::<Vec<_>>(),
                )
                .unwrap();
            }
        }
        let mutate = command(case.mutation, &f, size_of(&f));
        let o = result_of(&case, src.path(), &out, Some((case.point, mutate)));
        let ctx = format!("case {i} {case:?}: {}", context(&o));
        assert_eq!(o.status.signal(), None, "{ctx}");
        assert!(matches!(o.status.code(), Some(0 | 1)), "{ctx}");
        if !o.status.success() {
            refused += 1;
            if case.args[0] == "shard" {
                assert!(!out.exists(), "a refused shard publishes nothing: {ctx}");
            }
            continue;
        }
        // Exit 0: the bytes must be the unchanged source's.
        if case.args[0] == "shard" {
            let got: Vec<(PathBuf, u64)> = rank_files_bytes(&out)
                .into_iter()
                .map(|(n, b)| (n, xxhash_rust::xxh3::xxh3_64(&b)))
                .collect();
            let want: Vec<(PathBuf, u64)> =
                serde_json::from_slice(&reference[&key].stdout).unwrap();
            assert_eq!(got, want, "{ctx}");
        } else {
            assert_eq!(
                loaded_checksums(&o),
                loaded_checksums(&reference[&key]),
                "{ctx}"
            );
        }
    }
    // Every mutation above moves the file's stamp: all are refused, none slips through.
    assert_eq!(refused, 30, "every changed source is refused");
}

/// The config.json a shard publishes is the one it planned from: rewritten after planning, the
/// source's new config is not what OUT gets (it used to be read again when OUT was written).
#[test]
fn the_published_config_is_the_one_planned_from() {
    let src = source();
    let config = src.path().join("config.json");
    let planned = fs::read(&config).unwrap();
    let out_dir = TempDir::new().unwrap();
    let out = out_dir.path().join("out");
    let o = wload()
        .args(["shard", s(src.path()), "--tp", "2", "-o", s(&out)])
        .env(
            "WLOAD_TEST_AT_EXECUTE",
            format!("printf '{{\"num_hidden_layers\": 99}}' > '{}'", s(&config)),
        )
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", context(&o));
    assert_eq!(fs::read(out.join("config.json")).unwrap(), planned);
}
