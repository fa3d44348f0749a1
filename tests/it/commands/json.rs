//! `--json` for pipelines: whatever happens, stdout is exactly one JSON document whose `ok` says
//! whether the command succeeded and, when it did not, whose `error.kind` names the exit status
//! (docs/json.md). Each command is run once to succeed and once to fail in each way it can.

use std::process::Output;

use serde_json::Value;

use crate::support::*;

/// Runs `wload <args>` and returns its exit status and the one JSON document on its stdout.
fn run_json(args: &[&str], env: &[(&str, &str)]) -> (i32, Value, Output) {
    let mut cmd = wload_process();
    cmd.args(args).env("RUST_BACKTRACE", "1");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("wload runs");
    let docs: Vec<Value> = serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .unwrap_or_else(|e| {
            panic!(
                "wload {args:?}: stdout is not JSON ({e}): {}",
                context(&out)
            )
        });
    assert_eq!(
        docs.len(),
        1,
        "wload {args:?}: stdout holds {} documents: {}",
        docs.len(),
        context(&out)
    );
    let code = out.status.code().expect("wload exits, not killed");
    let doc = docs.into_iter().next().unwrap();
    assert_schema(args, &doc);
    (code, doc, out)
}

/// `jq -e .ok` passes: `ok` is `true` and the document is versioned.
fn assert_ok(args: &[&str]) -> Value {
    let (code, doc, out) = run_json(args, &[]);
    assert_eq!(code, 0, "wload {args:?}: {}", context(&out));
    assert_eq!(doc["ok"], Value::Bool(true), "wload {args:?}");
    assert_eq!(doc["schema_version"], 1, "wload {args:?}");
    assert!(doc.get("error").is_none(), "wload {args:?}");
    doc
}

/// `jq -e .ok` fails: `ok` is `false`, and the error's kind and the document's exit status match
/// the process's. Returns the document.
fn assert_failed(args: &[&str], env: &[(&str, &str)], code: i32, kind: &str) -> Value {
    let (got, doc, out) = run_json(args, env);
    assert_eq!(got, code, "wload {args:?}: {}", context(&out));
    assert_eq!(doc["ok"], Value::Bool(false), "wload {args:?}");
    assert_eq!(doc["schema_version"], 1, "wload {args:?}");
    assert_eq!(doc["exit_status"], code, "wload {args:?}");
    assert_eq!(doc["error"]["kind"], kind, "wload {args:?}: {doc}");
    let message = doc["error"]["message"].as_str().expect("a message");
    assert!(!message.is_empty(), "wload {args:?}");
    // The terminal still gets the message, as without --json.
    assert!(
        stderr(&out).starts_with("error: "),
        "wload {args:?}: {}",
        context(&out)
    );
    let problems = doc["problems"].as_array().expect("a problem list");
    assert_eq!(doc["problem_count"], problems.len(), "wload {args:?}");
    doc
}

fn tiny() -> &'static str {
    "examples/tiny-llama"
}

#[test]
fn inspect_prints_one_document_either_way() {
    let doc = assert_ok(&["inspect", tiny(), "--json"]);
    assert!(doc["tensors"].as_array().is_some_and(|t| !t.is_empty()));

    let work = tempfile::TempDir::new().unwrap();
    let missing = work.path().join("no-such-checkpoint");
    let doc = assert_failed(&["inspect", s(&missing), "--json"], &[], 2, "usage");
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no such file or directory"),
        "{doc}"
    );

    // A weight file whose header lies about a tensor's size: exit 3, the file and tensor named.
    let ckpt = copy_fixture("llama_gqa");
    let file = ckpt.path().join("model-00001-of-00006.safetensors");
    edit_header(&file, |h| {
        let (_, t) = h
            .iter_mut()
            .find(|(k, _)| *k != "__metadata__")
            .expect("a tensor");
        t["shape"] = serde_json::json!([3, 5]);
    });
    let doc = assert_failed(&["inspect", s(ckpt.path()), "--json"], &[], 3, "checkpoint");
    let p = &doc["problems"][0];
    assert!(
        p["file"]
            .as_str()
            .is_some_and(|f| f.ends_with("model-00001-of-00006.safetensors")),
        "{doc}"
    );
    assert_eq!(p["shape"], serde_json::json!([3, 5]), "{doc}");
    assert!(p["tensor"].is_string(), "{doc}");

    // Nothing the hub could answer: a runtime failure, exit 1.
    let cache = tempfile::TempDir::new().unwrap();
    assert_failed(
        &[
            "inspect",
            "someorg/somemodel",
            "--download-dir",
            s(cache.path()),
            "--json",
        ],
        &[("HF_HUB_OFFLINE", "1")],
        1,
        "runtime",
    );
}

#[test]
fn plan_prints_one_document_either_way() {
    let doc = assert_ok(&["plan", tiny(), "--tp", "2", "--json"]);
    assert_eq!(doc["tp"], 2);

    // The checkpoint does not fit --tp 3: every problem, structured, with its fix.
    let doc = assert_failed(
        &["plan", tiny(), "--tp", "3", "--json"],
        &[],
        3,
        "checkpoint",
    );
    assert_eq!(doc["problem_count"], 2, "{doc}");
    assert_eq!(
        doc["error"]["message"],
        "2 problems found; vLLM would refuse this checkpoint or load it wrongly"
    );
    assert_eq!(
        doc["problems"][0]["fix"], "choose a --tp that divides 8; TP sizes that work: 1, 2, 4, 8",
        "{doc}"
    );

    // A renamed tensor: the file and tensor it names, as fields.
    let ckpt = tempfile::TempDir::new().unwrap();
    many_layers_checkpoint(ckpt.path(), 1, |n| n.replace(".up_proj.", ".upp_proj."));
    let to = "model.layers.0.mlp.upp_proj.weight";
    let doc = assert_failed(
        &["plan", s(ckpt.path()), "--tp", "2", "--json"],
        &[],
        3,
        "checkpoint",
    );
    let problems = doc["problems"].as_array().unwrap();
    let unmapped = problems
        .iter()
        .find(|p| p["tensor"] == to)
        .unwrap_or_else(|| panic!("no problem names {to}: {doc}"));
    assert_eq!(unmapped["file"], "model.safetensors");
    assert!(
        problems.iter().any(|p| p["parameter"]
            .as_str()
            .is_some_and(|x| x.contains("gate_up_proj"))),
        "the unfilled parameter is named: {doc}"
    );

    // wload's own usage check and clap's.
    assert_failed(
        &["plan", tiny(), "--tp", "2", "--rank", "9", "--json"],
        &[],
        2,
        "usage",
    );
    let doc = assert_failed(
        &["plan", tiny(), "--tp", "2", "--json", "--no-such-flag"],
        &[],
        2,
        "usage",
    );
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(message.contains("--no-such-flag"), "{doc}");
    assert!(!message.contains("Usage:"), "{doc}");
    assert_failed(&["plan", tiny(), "--json"], &[], 2, "usage");
}

#[test]
fn shard_prints_one_document_either_way() {
    let work = tempfile::TempDir::new().unwrap();
    let out = work.path().join("out");
    let doc = assert_ok(&["shard", tiny(), "--tp", "2", "-o", s(&out), "--json"]);
    assert!(doc["manifest"].is_object(), "{doc}");

    // OUT now holds a wload output: refused without --force.
    let doc = assert_failed(
        &["shard", tiny(), "--tp", "2", "-o", s(&out), "--json"],
        &[],
        2,
        "usage",
    );
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("--force"),
        "{doc}"
    );
    let refused = work.path().join("refused");
    assert_failed(
        &["shard", tiny(), "--tp", "3", "-o", s(&refused), "--json"],
        &[],
        3,
        "checkpoint",
    );
    assert!(!refused.exists());
}

#[test]
fn load_prints_one_document_either_way() {
    let doc = assert_ok(&["load", tiny(), "--tp", "2", "--dry-run", "--json"]);
    assert_eq!(doc["dry_run"], true);
    assert_ok(&["load", tiny(), "--tp", "2", "--device", "cpu", "--json"]);

    assert_failed(
        &[
            "load",
            tiny(),
            "--tp",
            "2",
            "--dry-run",
            "--ranks",
            "5",
            "--json",
        ],
        &[],
        2,
        "usage",
    );
    assert_failed(
        &["load", tiny(), "--tp", "3", "--dry-run", "--json"],
        &[],
        3,
        "checkpoint",
    );
    // clap's conflicts are usage errors too.
    assert_failed(
        &[
            "load",
            tiny(),
            "--tp",
            "2",
            "--dry-run",
            "--check",
            "--json",
        ],
        &[],
        2,
        "usage",
    );
}

/// Without `--json` nothing changes: stdout stays empty on failure.
#[test]
fn without_json_a_failure_prints_nothing_on_stdout() {
    for args in [
        &["plan", tiny(), "--tp", "3"][..],
        &["plan", tiny(), "--tpp", "3"],
        &["inspect", "/no/such/folder"],
    ] {
        let out = run(args);
        assert_ne!(out.status.code(), Some(0), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: {}", context(&out));
    }
}

/// `--json` after `--` is a value, not the flag: no document is promised there.
#[test]
fn json_after_double_dash_is_not_the_flag() {
    let out = run(&["inspect", "--", "--json"]);
    assert_eq!(out.status.code(), Some(2), "{}", context(&out));
    assert!(out.stdout.is_empty(), "{}", context(&out));
}

/// Ctrl-C during `shard --json`: the error document still comes, with kind `interrupted` and
/// the process's own exit status (130).
#[test]
fn an_interrupted_shard_prints_an_interrupted_document() {
    use std::process::Stdio;
    use std::time::{Duration, Instant};
    let work = tempfile::TempDir::new().unwrap();
    let src = work.path().join("ckpt");
    let generated = std::process::Command::new("python3")
        .arg(manifest_dir().join("bench/gen_checkpoint.py"))
        .args(["--files", "4", "--layers", "8", "--real-shapes"])
        .args(["--hidden-size", "1024", "--intermediate-size", "4096"])
        .args(["--num-attention-heads", "16", "--num-key-value-heads", "8"])
        .args(["--vocab-size", "32000", "--quiet", "--out", s(&src)])
        .output();
    match generated {
        Ok(o) if o.status.success() => {}
        Ok(o) => panic!("gen_checkpoint.py: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => {
            return missing_environment(
                "an_interrupted_shard_prints_an_interrupted_document",
                &format!("cannot run python3: {e}"),
            );
        }
    }
    let out = work.path().join("out");
    let mut child = wload_process()
        .args(["shard", s(&src), "--tp", "2", "-o", s(&out), "-q", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wload starts");
    // The staging folder appears once planning is done and the signal handler is installed.
    let staging = format!(".{}.wload-", out.file_name().unwrap().to_string_lossy());
    let t = Instant::now();
    while !std::fs::read_dir(work.path()).unwrap().any(|e| {
        e.unwrap()
            .file_name()
            .to_string_lossy()
            .starts_with(&staging)
    }) {
        assert!(child.try_wait().unwrap().is_none(), "wload ended early");
        assert!(t.elapsed() < Duration::from_secs(30), "no staging folder");
        std::thread::sleep(Duration::from_millis(1));
    }
    // SAFETY: kill(2) on our own child, which has not been reaped yet.
    assert_eq!(
        unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGINT) },
        0
    );
    let sent = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if sent.elapsed() > Duration::from_secs(30) {
            let _ = child.kill();
            panic!("wload did not stop within 30 s of SIGINT");
        }
        std::thread::sleep(Duration::from_millis(2));
    };
    let read = |r: &mut dyn std::io::Read| {
        let mut v = Vec::new();
        r.read_to_end(&mut v).unwrap();
        v
    };
    let stdout = read(child.stdout.as_mut().unwrap());
    let stderr = String::from_utf8_lossy(&read(child.stderr.as_mut().unwrap())).into_owned();
    assert_eq!(status.code(), Some(130), "{status}: {stderr}");
    let doc: Value = serde_json::from_slice(&stdout)
        .unwrap_or_else(|e| panic!("stdout is not one JSON document ({e}); stderr: {stderr}"));
    assert_schema(&["shard"], &doc);
    assert_eq!(doc["ok"], false);
    assert_schema(&[], &doc);
    assert_eq!(doc["exit_status"], 130);
    assert_eq!(doc["error"]["kind"], "interrupted", "{doc}");
    assert!(!out.exists());
}

/// The one problem of `doc` whose `key` is `value`.
fn problem_with<'d>(doc: &'d Value, key: &str, value: &str) -> &'d Value {
    doc["problems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p[key] == value)
        .unwrap_or_else(|| panic!("no problem with {key} {value}: {doc}"))
}

/// The fields a problem carries, in the order the document has them.
fn keys(p: &Value) -> Vec<&str> {
    p.as_object().unwrap().keys().map(String::as_str).collect()
}

/// Reverses the shape of the first 2-D tensor of `file` whose name contains `part` (same
/// element count, so the header stays valid) and returns its name and its new shape.
fn transpose_in_header(file: &std::path::Path, part: &str) -> (String, Value) {
    let mut found = None;
    edit_header(file, |h| {
        let (name, t) = h
            .iter_mut()
            .find(|(k, t)| k.contains(part) && t["shape"].as_array().is_some_and(|s| s.len() == 2))
            .unwrap_or_else(|| panic!("no 2-D '{part}' tensor in {}", file.display()));
        let mut shape = t["shape"].as_array().unwrap().clone();
        assert_ne!(
            shape[0], shape[1],
            "{name}: a square shape reversed is the same"
        );
        shape.reverse();
        t["shape"] = Value::Array(shape.clone());
        found = Some((name.clone(), Value::Array(shape)));
    });
    found.unwrap()
}

/// Each kind of problem carries, as typed fields, what it is about: no field is read back out of
/// the message, and a field the problem is not about is left out.
#[test]
fn problems_carry_their_file_tensor_parameter_and_shapes_as_fields() {
    // A header that gives a weight the wrong (transposed) shape: all five, and the rule.
    let ckpt = copy_fixture("llama_gqa");
    let file = "model-00002-of-00006.safetensors";
    let (tensor, shape) = transpose_in_header(&ckpt.path().join(file), "mlp.gate_proj");
    let doc = assert_failed(
        &["plan", s(ckpt.path()), "--tp", "1", "--json"],
        &[],
        3,
        "checkpoint",
    );
    let p = problem_with(&doc, "tensor", &tensor);
    assert_eq!(p["file"], file, "{p}");
    assert_eq!(p["parameter"], tensor.replace("gate_proj", "gate_up_proj"));
    assert_eq!(p["shape"], shape);
    let mut expected = shape.as_array().unwrap().clone();
    expected.reverse();
    assert_eq!(p["expected_shape"], Value::Array(expected));
    assert_eq!(p["rule"], "stacked '.gate_proj' → '.gate_up_proj' shard 0");
    assert!(p["message"].as_str().unwrap().contains(&tensor), "{p}");

    // A tensor that matches no parameter: its file and name; no parameter, no shapes.
    let ckpt = tempfile::TempDir::new().unwrap();
    many_layers_checkpoint(ckpt.path(), 1, |n| n.replace(".up_proj.", ".upp_proj."));
    let doc = assert_failed(
        &["plan", s(ckpt.path()), "--tp", "2", "--json"],
        &[],
        3,
        "checkpoint",
    );
    let unmapped = problem_with(&doc, "tensor", "model.layers.0.mlp.upp_proj.weight");
    assert_eq!(
        keys(unmapped),
        ["message", "fix", "file", "tensor"],
        "{unmapped}"
    );
    assert_eq!(unmapped["file"], "model.safetensors");
    // The parameter it leaves unfilled: named, with no file or tensor (there is none).
    let missing = problem_with(&doc, "parameter", "model.layers.0.mlp.gate_up_proj.weight");
    assert_eq!(keys(missing), ["message", "fix", "parameter"], "{missing}");
    assert!(
        missing["message"]
            .as_str()
            .unwrap()
            .contains("has nothing in the checkpoint to fill it"),
        "{missing}"
    );

    // A size vLLM cannot split across the ranks: the parameter, and the fix.
    let doc = assert_failed(
        &[
            "plan",
            tiny(),
            "--tp",
            "2",
            "--hf-overrides",
            r#"{"intermediate_size": 255}"#,
            "--json",
        ],
        &[],
        3,
        "checkpoint",
    );
    // The down projection's wrong shape is a problem too; this one is the split.
    let split = problem_with(
        &doc,
        "fix",
        "choose another --tp (now 2); no TP size up to 64 works; `wload sizes` says why",
    );
    assert_eq!(keys(split), ["message", "fix", "parameter"], "{split}");
    assert_eq!(split["parameter"], "model.layers.0.mlp.gate_up_proj.weight");
    assert_eq!(
        split["message"],
        "model.layers.0.mlp.gate_up_proj.weight: merged output size (255) is not divisible by tp (2)"
    );

    // A config check (vLLM's assert on the config and TP size) is about none of them.
    let doc = assert_failed(
        &["plan", tiny(), "--tp", "3", "--json"],
        &[],
        3,
        "checkpoint",
    );
    for p in doc["problems"].as_array().unwrap() {
        assert_eq!(keys(p), ["message", "fix"], "{p}");
    }
}

/// A pre-sharded folder with a tensor of the wrong shape: the rank file, the tensor, the
/// parameter it would fill and both shapes.
#[test]
fn a_wrong_shaped_tensor_in_a_sharded_folder_is_named_by_fields() {
    let work = tempfile::TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(std::path::Path::new(tiny()), 2, &out, &["-q"]);
    let file = "model-rank-1-part-0.safetensors";
    let (tensor, shape) = transpose_in_header(&out.join(file), "gate_up_proj");
    let doc = assert_failed(
        &["load", s(&out), "--dry-run", "--json"],
        &[],
        3,
        "checkpoint",
    );
    let p = problem_with(&doc, "tensor", &tensor);
    assert_eq!(p["file"], file, "{p}");
    // A sharded folder's tensors are named as the parameters they fill.
    assert_eq!(p["parameter"], tensor.as_str());
    assert_eq!(p["shape"], shape);
    let mut expected = shape.as_array().unwrap().clone();
    expected.reverse();
    assert_eq!(p["expected_shape"], Value::Array(expected));
    assert!(p.get("rule").is_none(), "{p}");
}
