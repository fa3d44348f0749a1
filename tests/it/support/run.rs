//! The one way to run the binary ([`wload`], [`wload_process`], [`run`], [`shard`]) and to check
//! what it said ([`context`], [`assert_refused`]).

use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;
use serde_json::Value;

use super::s;
use super::schemas::assert_schema;

/// The longest any one `wload` run may take before the test fails; a regression to a hang then
/// fails its test instead of blocking the whole suite (all of it one process).
pub(crate) const RUN_LIMIT: Duration = Duration::from_secs(300);

/// Launcher variables that pick a run's ranks (torchrun, srun, Slurm arrays, Kubernetes Indexed
/// Jobs): removed from a command unless a test sets them, so the machine's own never leak in.
pub(crate) const LAUNCHER_VARS: [&str; 12] = [
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "SLURM_PROCID",
    "SLURM_NTASKS",
    "SLURM_LOCALID",
    "SLURM_ARRAY_TASK_ID",
    "SLURM_ARRAY_TASK_MIN",
    "SLURM_ARRAY_TASK_STEP",
    "SLURM_ARRAY_TASK_COUNT",
    "JOB_COMPLETION_INDEX",
    "WLOAD_RUNS",
];

/// `wload` as built by cargo for this test run, with a clean environment for the variables that
/// change its behaviour, killed (and the test failed) after [`RUN_LIMIT`].
pub(crate) fn wload() -> Command {
    let mut cmd = Command::from_std(wload_process());
    cmd.timeout(RUN_LIMIT);
    cmd
}

/// The same as [`wload`], as a plain child process: for the tests that spawn it, signal it or wait
/// on it themselves (and bound that wait themselves).
pub(crate) fn wload_process() -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_wload"));
    cmd.env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .env_remove("HF_HUB_OFFLINE")
        .env_remove("VLLM_REPLICATE_EMBED");
    cmd
}

/// `wload ARGS…` run to completion (see [`wload`] for its environment and time limit); a run
/// killed at the time limit fails the test here.
pub(crate) fn run(args: &[&str]) -> Output {
    let out = wload().args(args).output().expect("wload runs");
    assert_ne!(
        out.status.signal(),
        Some(libc::SIGKILL),
        "wload {args:?}: {}",
        context(&out)
    );
    out
}

/// Runs `wload <args>`, expects success, and parses stdout as JSON.
/// What `wload ARGS…` printed on stdout (`out`), parsed as one JSON document and validated against
/// its schema (docs/schemas/): for a test that runs the command its own way. `args` needs only the
/// subcommand (`&["load"]`) when the whole line is not at hand.
pub(crate) fn json_doc(args: &[&str], out: &Output) -> Value {
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("wload {args:?}: stdout is not JSON ({e}): {}", context(out)));
    assert_schema(args, &v);
    v
}

pub(crate) fn wload_json(args: &[&str]) -> Value {
    let out = run(args);
    assert!(
        out.status.success(),
        "wload {args:?} failed: {}",
        context(&out)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "wload {args:?}: stdout is not JSON ({e}): {}",
            context(&out)
        )
    });
    assert_schema(args, &v);
    v
}

/// Runs `wload <args>`, expects exit status `code`, and parses stdout as JSON: with `--json`, a
/// report that ends in a refusal (an incomplete folder) is still the one document, `"ok": false`.
pub(crate) fn wload_json_exit(args: &[&str], code: i32) -> Value {
    let out = run(args);
    assert_eq!(
        out.status.code(),
        Some(code),
        "wload {args:?}: {}",
        context(&out)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "wload {args:?}: stdout is not JSON ({e}): {}",
            context(&out)
        )
    });
    assert_eq!(v["ok"], code == 0, "{v:#}");
    assert_schema(args, &v);
    v
}

/// `wload shard SOURCE --tp TP -o OUT EXTRA…`, run to completion.
pub(crate) fn shard(source: &Path, tp: u64, out: &Path, extra: &[&str]) -> Output {
    let tp = tp.to_string();
    let mut args = vec!["shard", s(source), "--tp", &tp, "-o", s(out)];
    args.extend_from_slice(extra);
    run(&args)
}

/// [`shard`], expected to succeed.
pub(crate) fn shard_ok(source: &Path, tp: u64, out: &Path, extra: &[&str]) -> Output {
    let o = shard(source, tp, out, extra);
    assert!(
        o.status.success(),
        "wload shard {} --tp {tp} {extra:?} failed: {}",
        source.display(),
        context(&o)
    );
    o
}

pub(crate) fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub(crate) fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit status, stderr and the start of stdout, for assertion messages.
pub(crate) fn context(out: &Output) -> String {
    let so = stdout(out);
    let end = (0..=so.len().min(2000))
        .rev()
        .find(|&i| so.is_char_boundary(i))
        .unwrap_or(0);
    // `Command::timeout` kills with SIGKILL and still returns the output: say so.
    let status = match out.status.signal() {
        Some(libc::SIGKILL) => {
            format!("killed by SIGKILL (over the {RUN_LIMIT:?} limit, or out of memory)")
        }
        Some(n) => format!("killed by signal {n}"),
        None => format!("exit {:?}", out.status.code()),
    };
    format!(
        "{status}\nstderr:\n{}\nstdout (start):\n{}",
        stderr(out),
        &so[..end]
    )
}

/// A refusal as wload makes one: exit status `code`, stderr starting with `error: ` and containing
/// every one of `needles` (exact substrings), no panic, and on stdout nothing, or (for a run with
/// `--json`) the error document only, with that exit status. Returns stderr.
pub(crate) fn assert_refused(out: &Output, code: i32, needles: &[&str]) -> String {
    let ctx = context(out);
    assert_eq!(out.status.code(), Some(code), "{ctx}");
    let err = stderr(out);
    assert!(err.starts_with("error: "), "an `error: ` message; {ctx}");
    for n in needles {
        assert!(err.contains(n), "stderr should contain {n:?}; {ctx}");
    }
    assert!(!err.contains("panicked"), "{ctx}");
    if !out.stdout.is_empty() {
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!("stdout is neither empty nor one JSON document ({e}); {ctx}")
        });
        assert_eq!(doc["ok"], false, "{ctx}");
        assert_eq!(doc["exit_status"], code, "{ctx}");
        assert_schema(&[], &doc);
    }
    err
}

/// `wload plan SOURCE --json ARGS…`, clean: exit 0 and nothing on stderr.
pub(crate) fn clean_plan_json(source: &Path, args: &[&str]) -> Value {
    let mut all = vec!["plan", s(source), "--json"];
    all.extend_from_slice(args);
    let out = run(&all);
    assert!(out.status.success(), "{}", context(&out));
    assert!(out.stderr.is_empty(), "plan is clean: {}", context(&out));
    let v = serde_json::from_slice(&out.stdout).expect("plan --json is JSON");
    assert_schema(&all, &v);
    v
}

/// The tensors `plan --json` lists as skipped, sorted; each one's reason must mention `why`.
pub(crate) fn skipped_tensors(plan: &Value, why: &str) -> Vec<String> {
    let mut skipped: Vec<String> = plan["skipped"]
        .as_array()
        .expect("skipped")
        .iter()
        .map(|s| {
            let reason = s["reason"].as_str().unwrap();
            assert!(reason.contains(why), "{s}: the reason names {why}");
            s["tensor"].as_str().unwrap().to_string()
        })
        .collect();
    skipped.sort();
    skipped
}

/// What bash makes of `line`: its words (environment assignments included). bash, not `sh`:
/// a word with a control character in it is quoted `$'…'`, which Debian's dash lacks.
pub(crate) fn shell_words(line: &str) -> Vec<String> {
    let o = std::process::Command::new("bash")
        .arg("-c")
        .arg(format!("printf '%s\\0' {line}"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", context(&o));
    let mut words: Vec<String> = String::from_utf8(o.stdout)
        .unwrap()
        .split('\0')
        .map(str::to_string)
        .collect();
    words.pop();
    words
}
