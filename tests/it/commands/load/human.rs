//! `--check`, usage errors and the human output.

use super::*;

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
    for stage in ["read", "convert", "copy to memory", "sync", "plan", "total"] {
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

/// The default summary leads with the result (what was loaded, how fast, how warm the source
/// was); `-q` leaves exactly that line (and with `--checksums`, the checksums), `-v` adds where
/// the bytes came from (page cache, I/O mode, rates), which the default leaves out.
#[test]
fn quiet_leaves_the_result_and_verbose_adds_the_io_detail() {
    let fx = fixtures_dir().join(GQA);
    let base = [s(&fx), "--tp", "2", "--device", "cpu"];
    let result = |text: &str| {
        let first = text.lines().next().unwrap_or_default().to_string();
        assert!(
            first.starts_with("loaded 1.1 MiB (46 tensors, 2 ranks of TP 2) into host memory in ")
                && first.contains(" GB/s, source ")
                && first.ends_with("% in the page cache"),
            "the result first:\n{text}"
        );
        first
    };
    let io_detail = ["storage -> host", "  io ", "  source 1.1 MiB: "];

    let out = load(&base);
    assert!(out.status.success(), "{}", context(&out));
    let text = stdout(&out);
    result(&text);
    for d in io_detail {
        assert!(!text.contains(d), "{d:?} only with -v:\n{text}");
    }
    assert!(
        text.contains("copy to memory"),
        "stage timings by default:\n{text}"
    );

    let quiet = load(&[&base[..], &["-q"]].concat());
    assert!(quiet.status.success(), "{}", context(&quiet));
    let text = stdout(&quiet);
    result(&text);
    assert_eq!(text.lines().count(), 1, "-q: the result line only:\n{text}");

    let sums = load(&[&base[..], &["-q", "--checksums"]].concat());
    let text = stdout(&sums);
    result(&text);
    let rest: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rest.len(), 46, "one checksum per tensor:\n{text}");
    assert!(rest.iter().all(|l| l.starts_with("rank ")), "{text}");

    let verbose = load(&[&base[..], &["-v"]].concat());
    let text = stdout(&verbose);
    result(&text);
    for d in io_detail {
        assert!(text.contains(d), "{d:?} with -v:\n{text}");
    }

    let dry = load(&[&base[..], &["-q", "--dry-run", "--read"]].concat());
    let text = stdout(&dry);
    assert_eq!(text.lines().count(), 1, "{text}");
    assert!(text.starts_with("ok: vLLM would load "), "{text}");
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
