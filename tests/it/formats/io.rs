//! How `load` and `shard` read their source: cold (evicted from the page cache, and shown to be),
//! warm, through each I/O path (buffered, O_DIRECT, mapped) with the same bytes; `--repeat`; and
//! host memory bounded by the buffers in flight, not by the model.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command as StdCommand;

use serde_json::Value;
use tempfile::TempDir;

use crate::support::*;

const MODES: [&str; 4] = ["auto", "buffered", "direct", "mmap"];

/// `wload load ARGS… --json`, expected to succeed, parsed.
fn load_json(args: &[&str], env: &[(&str, &str)]) -> Value {
    let mut cmd = wload();
    cmd.arg("load").args(args).arg("--json");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "load {args:?}: {}", context(&out));
    json_doc(&[&["load"], args].concat(), &out)
}

fn safetensors_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
        .collect();
    v.sort();
    v
}

/// Every tensor's checksum per rank, in report order.
fn sums(report: &Value) -> Vec<(String, String)> {
    report["ranks"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|r| r["checksums"].as_array().unwrap().clone())
        .map(|t| (t["name"].to_string(), t["xxh3"].to_string()))
        .collect()
}

/// Warm, the report says the source was all in the page cache and `auto` read it buffered; with
/// `--cold`, that it was evicted (from how much), that almost none of it is left, and that `auto`
/// read it with O_DIRECT. The human report says the same.
#[test]
fn cold_load_evicts_the_source_and_says_so() {
    let dir = copy_fixture("llama_gqa");
    let d = s(dir.path());
    for f in safetensors_files(dir.path()) {
        fs::read(f).unwrap();
    }
    let warm = load_json(&[d, "--tp", "2", "--device", "cpu"], &[]);
    let total = warm["cache"]["source_bytes"].as_u64().unwrap();
    assert!(total > 0, "{warm}");
    assert_eq!(warm["cache"]["resident_bytes"], total, "{warm}");
    assert_eq!(warm["cache"]["evicted_from_bytes"], Value::Null, "{warm}");
    assert_eq!(warm["io"]["requested"], "auto", "{warm}");
    assert_eq!(warm["io"]["used"], "buffered", "{warm}");

    let cold = load_json(&[d, "--tp", "2", "--device", "cpu", "--cold"], &[]);
    assert_eq!(cold["cache"]["evicted_from_bytes"], total, "{cold}");
    let left = cold["cache"]["resident_share"].as_f64().unwrap();
    assert!(left < 0.05, "still cached after eviction: {cold}");
    assert_eq!(cold["io"]["used"], "direct", "{cold}");
    assert!(
        cold["io"]["why"].as_str().unwrap().contains("page cache"),
        "{cold}"
    );
    assert_eq!(cold["timings"]["bytes_read"], warm["timings"]["bytes_read"]);

    let out = wload()
        .args(["load", d, "--tp", "2", "--device", "cpu", "--cold", "-v"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", context(&out));
    let text = stdout(&out);
    for needle in [
        "in the page cache at the start",
        "--cold: evicted from",
        "io direct (auto:",
        "storage -> host",
        "READ GB/s",
        // Host memory is the destination: no host-to-device label, and per-rank copy time
        // said to be summed over threads.
        "INTO MEMORY GB/s",
        "into host memory",
        "COPY s*",
        "* summed over the rank's threads",
    ] {
        assert!(text.contains(needle), "{needle:?} missing:\n{text}");
    }
    for wrong in ["H2D", "host -> device", "copy to device"] {
        assert!(!text.contains(wrong), "{wrong:?} for host memory:\n{text}");
    }
}

/// Every I/O path, warm and cold, with chunk sizes that cut tensors at unaligned offsets (and
/// reads that end in each file's unaligned tail), loads the same bytes: slices, conversions
/// (--dtype), and gpt-oss's transposed experts.
#[test]
fn every_io_path_loads_the_same_bytes() {
    let cases: [(&str, &[&str]); 4] = [
        ("llama_gqa", &["--tp", "2"]),
        ("phi3_fp32", &["--tp", "2", "--dtype", "bfloat16"]),
        ("gpt_oss", &["--tp", "2"]),
        ("mixtral", &["--tp", "2", "--enable-expert-parallel"]),
    ];
    for (fixture, flags) in cases {
        let dir = copy_fixture(fixture);
        let mut base: Vec<&str> = vec![s(dir.path()), "--device", "cpu", "--checksums"];
        base.extend(flags);
        let want = sums(&load_json(&base, &[("WLOAD_TEST_CHUNK_BYTES", "1000000")]));
        assert!(!want.is_empty());
        for mode in MODES {
            for cold in [false, true] {
                for chunk in ["1000", "4097", "20000"] {
                    let mut args = base.clone();
                    args.extend(["--io", mode]);
                    if cold {
                        args.push("--cold");
                    }
                    let r = load_json(&args, &[("WLOAD_TEST_CHUNK_BYTES", chunk)]);
                    assert_eq!(sums(&r), want, "{fixture} {args:?} chunk {chunk}");
                    let used = r["io"]["used"].as_str().unwrap();
                    if mode != "auto" {
                        assert_eq!(used, mode, "{r}");
                    }
                }
            }
        }
    }
}

/// `shard --io direct --cold` writes the same files as a warm buffered shard (the manifest's
/// hashes), and its JSON carries the same residency and I/O fields as `load`'s.
#[test]
fn shard_reads_cold_and_direct_with_the_same_output() {
    let src = copy_fixture("llama_gqa");
    let out = TempDir::new().unwrap();
    let hashes = |dir: &Path, extra: &[&str]| -> (Vec<(String, String)>, Value) {
        let mut args = vec!["shard", s(src.path()), "--tp", "2", "-o", s(dir), "--json"];
        args.extend(extra);
        let r = wload_json(&args);
        let files = r["manifest"]["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| (f["name"].to_string(), f["xxh3_64k"].to_string()))
            .collect();
        (files, r)
    };
    let (warm, wr) = hashes(&out.path().join("warm"), &["--io", "buffered"]);
    assert_eq!(wr["io"]["used"], "buffered", "{wr}");
    assert!(
        wr["source_cache"]["source_bytes"].as_u64().unwrap() > 0,
        "{wr}"
    );
    for mode in ["direct", "mmap", "auto"] {
        let (cold, cr) = hashes(&out.path().join(mode), &["--io", mode, "--cold"]);
        assert_eq!(cold, warm, "shard --io {mode} --cold");
        assert!(
            cr["source_cache"]["evicted_from_bytes"].as_u64().is_some(),
            "{cr}"
        );
        assert!(
            cr["source_cache"]["resident_share"].as_f64().unwrap() < 0.05,
            "{cr}"
        );
        // shard's auto stays buffered: its file-to-file copies beat direct reads.
        let want = if mode == "auto" { "buffered" } else { mode };
        assert_eq!(cr["io"]["used"], want, "{cr}");
    }
}

/// `--repeat 3`: three runs, min <= median <= max, in the JSON and the human report; each run
/// cold with --cold.
#[test]
fn repeat_reports_min_median_max() {
    let dir = copy_fixture("llama_gqa");
    let d = s(dir.path());
    let r = load_json(
        &[d, "--tp", "2", "--device", "cpu", "--repeat", "3", "--cold"],
        &[],
    );
    let rep = &r["repeats"];
    let runs = rep["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{r}");
    for run in runs {
        assert!(run["resident_share"].as_f64().unwrap() < 0.05, "{r}");
        assert!(run["gbps"].as_f64().unwrap() > 0.0, "{r}");
    }
    let g = |k: &str| rep[k].as_f64().unwrap();
    assert!(
        g("gbps_min") <= g("gbps_median") && g("gbps_median") <= g("gbps_max"),
        "{r}"
    );
    assert!(g("seconds_min") <= g("seconds_median") && g("seconds_median") <= g("seconds_max"));
    // One run: no repeats block.
    let one = load_json(&[d, "--tp", "2", "--device", "cpu"], &[]);
    assert_eq!(one.get("repeats"), None, "{one}");
    let out = wload()
        .args(["load", d, "--tp", "2", "--device", "cpu", "--repeat", "2"])
        .output()
        .unwrap();
    assert!(stdout(&out).contains("2 runs:"), "{}", context(&out));
}

#[test]
fn bad_io_arguments_exit_2() {
    let fx = fixture("llama_gqa");
    let f = s(&fx);
    for (args, says) in [
        (vec!["--io", "fast"], "fast"),
        (vec!["--repeat", "0"], "--repeat"),
        (vec!["--repeat", "x"], "--repeat"),
        (vec!["--repeat", "2", "--dry-run"], "--dry-run"),
    ] {
        let out = wload()
            .args(["load", f, "--device", "cpu"])
            .args(&args)
            .output()
            .unwrap();
        assert_refusal_text(&out, 2, &[says]);
    }
}

/// A truncated source file: every I/O path names the file and the tensor, exit 3 (a malformed
/// checkpoint), never a crash or a short load.
#[test]
fn truncated_source_is_named_on_every_io_path() {
    let dir = copy_fixture("llama_gqa");
    let files = safetensors_files(dir.path());
    let last = files.last().unwrap();
    let len = fs::metadata(last).unwrap().len();
    let f = fs::OpenOptions::new().write(true).open(last).unwrap();
    f.set_len(len - 1000).unwrap();
    for mode in MODES {
        let out = wload()
            .args([
                "load",
                s(dir.path()),
                "--tp",
                "2",
                "--device",
                "cpu",
                "--io",
                mode,
            ])
            .output()
            .unwrap();
        assert_refusal_text(
            &out,
            3,
            &["model-00006-of-00006.safetensors", "down_proj", "truncated"],
        );
    }
}

/// Peak resident memory of one child process (its own, not its siblings': wait4).
fn peak_rss_bytes(cmd: StdCommand) -> (std::process::ExitStatus, u64, String) {
    // wait4's ru_maxrss counts the child's memory before exec too, which is this test process's
    // (hundreds of MB while other tests run): GNU time forks the measured process from itself.
    let time = Path::new("/usr/bin/time");
    if !time.exists() {
        return peak_rss_bytes_wait4(cmd);
    }
    let report = tempfile::NamedTempFile::new().unwrap();
    let mut timed = StdCommand::new(time);
    timed.args(["-f", "%M", "-o"]).arg(report.path());
    timed.arg(cmd.get_program()).args(cmd.get_args());
    for (k, v) in cmd.get_envs() {
        match v {
            Some(v) => timed.env(k, v),
            None => timed.env_remove(k),
        };
    }
    let o = timed.output().unwrap();
    let kib: u64 = fs::read_to_string(report.path())
        .unwrap()
        .lines()
        .last()
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or_else(|| panic!("GNU time's report: {}", context(&o)));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    (o.status, kib * 1024, text)
}

/// The peak RSS as wait4 reports it (counting the child's memory before exec).
fn peak_rss_bytes_wait4(mut cmd: StdCommand) -> (std::process::ExitStatus, u64, String) {
    let child = cmd
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    // Read the pipes first so that a chatty child cannot block on a full pipe.
    let output = child.wait_with_output_no_reap();
    let mut status = 0;
    // SAFETY: an all-zero rusage is a valid value; wait4 fills it for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: `pid` is our child, not yet reaped (see wait_with_output_no_reap).
    let rc = unsafe { libc::wait4(pid, &mut status, 0, &mut ru) };
    assert_eq!(rc, pid, "wait4: {}", std::io::Error::last_os_error());
    use std::os::unix::process::ExitStatusExt;
    (
        std::process::ExitStatus::from_raw(status),
        ru.ru_maxrss as u64 * 1024,
        output,
    )
}

/// Drains a child's stdout and stderr without waiting for it (the caller reaps it with wait4).
trait NoReap {
    fn wait_with_output_no_reap(self) -> String;
}

impl NoReap for std::process::Child {
    fn wait_with_output_no_reap(mut self) -> String {
        use std::io::Read;
        let mut err = self.stderr.take().unwrap();
        let reader = std::thread::spawn(move || {
            let mut s = String::new();
            let _ = err.read_to_string(&mut s);
            s
        });
        let mut out = String::new();
        let _ = self.stdout.take().unwrap().read_to_string(&mut out);
        let err = reader.join().unwrap();
        // Dropping a Child neither kills nor reaps it.
        drop(self);
        format!("{out}\n{err}")
    }
}

/// A checkpoint of about `mb` MB of random bf16 from bench/gen_checkpoint.py; `None` without
/// python3.
fn generated_checkpoint(test: &str, dir: &Path) -> Option<()> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("bench/gen_checkpoint.py");
    let out = StdCommand::new("python3")
        .arg(script)
        .args([
            "--files",
            "2",
            "--layers",
            "2",
            "--real-shapes",
            "--random",
            "--quiet",
            "--hidden-size",
            "1024",
            "--intermediate-size",
            "4096",
            "--vocab-size",
            "48000",
            "--num-attention-heads",
            "8",
            "--num-key-value-heads",
            "4",
            "--out",
        ])
        .arg(dir)
        .output();
    match out {
        Err(_) => {
            missing_environment(test, "no python3 to generate the checkpoint");
            None
        }
        Ok(o) => {
            assert!(o.status.success(), "gen_checkpoint.py: {}", context(&o));
            Some(())
        }
    }
}

/// Host memory is bounded by the buffers in flight, not by the model: `shard` of a ~260 MB
/// checkpoint through each I/O path, cold, with 2 worker threads (8 for direct reads), peaks below
/// one 16 MiB chunk per thread plus 64 MiB for the process itself, which is less than the model.
#[test]
fn shard_memory_is_bounded_on_every_io_path() {
    const TEST: &str = "shard_memory_is_bounded_on_every_io_path";
    const CHUNK: u64 = 16 << 20;
    let dir = TempDir::new().unwrap();
    let src = dir.path().join("src");
    if generated_checkpoint(TEST, &src).is_none() {
        return;
    }
    let model: u64 = safetensors_files(&src)
        .iter()
        .map(|f| fs::metadata(f).unwrap().len())
        .sum();
    // Two workers, as on a 2-core machine, whatever this one has; direct reads use 8.
    for (mode, threads) in [("buffered", 2), ("direct", 8)] {
        let bound = threads * CHUNK + (64 << 20);
        assert!(
            bound < model,
            "{bound} bytes of buffers vs a {model}-byte model"
        );
        let out = dir.path().join(format!("out-{mode}"));
        let mut cmd = wload_process();
        cmd.env("RAYON_NUM_THREADS", "2")
            .args(["shard", s(&src), "--tp", "2", "-o", s(&out), "-q"])
            .args(["--io", mode, "--cold"]);
        let (status, rss, text) = peak_rss_bytes(cmd);
        assert!(status.success(), "shard --io {mode}: {text}");
        assert!(
            rss < bound,
            "shard --io {mode} peaked at {rss} bytes, over {bound} ({threads} threads), for a {model}-byte model"
        );
    }
}

/// Headers are read, not mapped: a process whose address space is limited (`ulimit -v`) below
/// a weight file's size still reads its headers. It used to fail mapping the file, with a
/// message blaming the file system ("copy the checkpoint to a local file system").
#[test]
fn headers_are_read_under_an_address_space_limit_smaller_than_the_file() {
    let tmp = TempDir::new().unwrap();
    let mut config = tiny_config();
    // 2^23 × 8 F32 = 256 MiB per tensor: 512 MiB of embedding and lm_head.
    config["vocab_size"] = (1u64 << 23).into();
    write_json(&tmp.path().join("config.json"), &config);
    let big: u64 = (1 << 23) * 8 * 4;
    let header = serde_json::json!({
        "lm_head.weight": {"dtype": "F32", "shape": [1u64 << 23, 8], "data_offsets": [0, big]},
        "model.embed_tokens.weight": {"dtype": "F32", "shape": [1u64 << 23, 8], "data_offsets": [big, 2 * big]},
        "model.norm.weight": {"dtype": "F32", "shape": [8], "data_offsets": [2 * big, 2 * big + 32]},
    });
    let mut text = serde_json::to_vec(&header).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let path = tmp.path().join("model.safetensors");
    let mut bytes = (text.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&text);
    fs::write(&path, &bytes).unwrap();
    // Sparse: the data region takes no disk.
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.set_len(bytes.len() as u64 + 2 * big + 32).unwrap();
    let o = StdCommand::new("prlimit")
        .arg(format!("--as={}", 384u64 << 20))
        .arg(env!("CARGO_BIN_EXE_wload"))
        .args(["inspect", s(tmp.path())])
        .output()
        .expect("prlimit runs (util-linux)");
    assert!(
        o.status.success(),
        "inspect under a 384 MiB address space: {}",
        context(&o)
    );
    assert!(stdout(&o).contains("lm_head.weight"), "{}", context(&o));
}
