//! From a checkpoint to a folder vLLM serves, and back: the `vllm serve` command `shard` prints and
//! records (every flag the files depend on, shell-quoted), `load` taking its flags from
//! `wload.json`, and what plan, shard and load say about inputs that are no checkpoint folder. The
//! documents' commands, from a checkpoint to a served model, are run by docs.rs.

use std::fs;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use serde_json::Value;
use tempfile::TempDir;

use crate::support::*;

const GQA: &str = "llama_gqa";

/// `shard --json`'s manifest: its `serve` command, as words and as one shell line.
fn serve_of(source: &Path, out: &Path, extra: &[&str]) -> (Vec<String>, String, String) {
    let mut args = vec!["shard", s(source), "-o", s(out)];
    args.extend_from_slice(extra);
    let o = run(&args);
    assert!(o.status.success(), "{}", context(&o));
    let printed = stdout(&o)
        .lines()
        .find_map(|l| l.strip_prefix("serve with: ").map(str::to_string))
        .unwrap_or_else(|| panic!("no serve line: {}", context(&o)));
    let m: Value = serde_json::from_slice(&fs::read(out.join("wload.json")).unwrap()).unwrap();
    let argv: Vec<String> = m["serve"]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let shell = m["serve"]["shell"].as_str().unwrap().to_string();
    (argv, shell, printed)
}

fn words(s: &[&str]) -> Vec<String> {
    s.iter().map(|w| w.to_string()).collect()
}

/// Each flag the files depend on, and only those: TP; PP and EP when they apply; `--dtype`
/// unless vLLM's `auto` loads the files as they are on every GPU (only float16 files with a
/// float16 config: BF16 becomes float16 on a V100 or T4, a float32 config is downcast); and
/// `--skip-tokenizer-init` while the folder has no tokenizer (vLLM does not start without one).
/// The printed line is the manifest's, and a shell reads it back as the manifest's words.
#[test]
fn serve_command_has_every_flag_the_files_depend_on() {
    let work = TempDir::new().unwrap();
    let base = ["--load-format", "sharded_state", "--tensor-parallel-size"];
    let bf16 = ["--dtype", "bfloat16"];
    let no_tok = "--skip-tokenizer-init";
    let with_tokenizer = work.path().join("gqa-with-tokenizer");
    copy_files(&fixture(GQA), &with_tokenizer);
    fs::write(with_tokenizer.join("tokenizer.json"), "{}").unwrap();
    let cases: Vec<(PathBuf, Vec<&str>, Vec<&str>)> = vec![
        (
            fixture(GQA),
            vec!["--tp", "2"],
            vec!["2", bf16[0], bf16[1], no_tok],
        ),
        (
            fixture(GQA),
            vec!["--tp", "1", "--pp", "2"],
            vec![
                "1",
                "--pipeline-parallel-size",
                "2",
                bf16[0],
                bf16[1],
                no_tok,
            ],
        ),
        (
            fixture("mixtral"),
            vec!["--tp", "2", "--enable-expert-parallel"],
            vec!["2", "--enable-expert-parallel", bf16[0], bf16[1], no_tok],
        ),
        (
            fixture(GQA),
            vec!["--tp", "2", "--dtype", "float16"],
            vec!["2", "--dtype", "float16", no_tok],
        ),
        // A bfloat16 config: auto keeps bfloat16 on an A100 but converts to float16 on a V100.
        (
            fixture(GQA),
            vec!["--tp", "2", "--dtype", "bfloat16"],
            vec!["2", bf16[0], bf16[1], no_tok],
        ),
        // float16 files and config: what auto loads everywhere, so no flag.
        (
            fixture("llama_tied_fp16"),
            vec!["--tp", "2"],
            vec!["2", no_tok],
        ),
        // float32 configs are downcast by auto: to bfloat16 files, or kept float32, the flag.
        (
            fixture("phi3_fp32"),
            vec!["--tp", "1"],
            vec!["1", bf16[0], bf16[1], no_tok],
        ),
        (
            fixture("phi3_fp32"),
            vec!["--tp", "1", "--dtype", "float32"],
            vec!["1", "--dtype", "float32", no_tok],
        ),
        // A tokenizer beside the weights is copied, and vLLM loads it.
        (
            with_tokenizer.clone(),
            vec!["--tp", "2"],
            vec!["2", bf16[0], bf16[1]],
        ),
    ];
    for (i, (src, flags, tail)) in cases.iter().enumerate() {
        let out = work.path().join(format!("out{i}"));
        let (argv, shell, printed) = serve_of(src, &out, flags);
        let mut want = words(&["vllm", "serve", s(&out)]);
        want.extend(words(&base));
        want.extend(words(tail));
        assert_eq!(argv, want, "{} {flags:?}", src.display());
        assert_eq!(printed, shell, "{} {flags:?}", src.display());
        assert_eq!(shell_words(&shell), argv, "{} {flags:?}", src.display());
    }
}

/// A partial `--ranks` run says the folder must be completed first, and inspect shows what is
/// missing.
#[test]
fn serve_line_of_a_partial_run_says_to_complete_the_folder() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = shard_ok(&fixture(GQA), 4, &out, &["--ranks", "0-1"]);
    assert!(
        stdout(&o).contains("serve with (once all 4 ranks' files are in one folder; `wload inspect` checks): vllm serve"),
        "{}",
        stdout(&o)
    );
    let v = wload_json_exit(&["inspect", s(&out), "--json"], 3);
    assert_eq!(v["complete"], false);
    assert!(
        v["problems"][0]["message"]
            .as_str()
            .unwrap()
            .contains("no files for ranks 2-3 of --tp 4 (shard wrote only ranks 0-1 here"),
        "{v:#}"
    );
}

/// Paths with spaces, quotes, `$` and a leading `-` survive the copy and paste into a shell, and
/// one that starts with `-` is not taken for a flag by vLLM. Control characters (a newline,
/// U+0085, U+202E) are written `$'…'` escapes: exact when the shell reads them, visible on a
/// terminal.
#[test]
fn serve_command_quotes_hostile_paths() {
    let work = TempDir::new().unwrap();
    for name in [
        "my model",
        "it's $HOME `x`",
        "-tp8",
        "tab\there",
        "new\nline",
        "nel\u{85}x",
        "rlo\u{202e}x 'q' \\",
    ] {
        let out = work.path().join(name);
        let (argv, shell, _) = serve_of(&fixture(GQA), &out, &["--tp", "2"]);
        assert_eq!(argv[2], s(&out));
        assert_eq!(shell_words(&shell), argv, "{name}");
        // Relative as the user typed it, absolute in the line: vLLM run elsewhere finds it, and
        // `-tp8` is not taken for a flag.
        let o = wload()
            .current_dir(work.path())
            .args(["shard", s(&fixture(GQA)), "--tp", "2", "-o"])
            .arg(format!("rel-{name}"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", context(&o));
        let line = stdout(&o)
            .lines()
            .find_map(|l| l.strip_prefix("serve with: ").map(str::to_string))
            .unwrap();
        let w = shell_words(&line);
        assert_eq!(
            Path::new(&w[2]),
            work.path()
                .canonicalize()
                .unwrap()
                .join(format!("rel-{name}")),
            "{line}"
        );
        // `SERVE=$(wload shard … -q)`: the line alone, on a pipe, as exact as `serve.argv` and
        // with no control character for a terminal to act on.
        let quiet = work.path().join(format!("q-{name}"));
        let o = shard_ok(&fixture(GQA), 2, &quiet, &["-q"]);
        let line = stdout(&o).trim_end_matches('\n').to_string();
        assert!(
            !line
                .chars()
                .any(|c| c.is_control() || ('\u{2028}'..='\u{202e}').contains(&c)),
            "{line:?}"
        );
        let m: serde_json::Value =
            serde_json::from_slice(&std::fs::read(quiet.join("wload.json")).unwrap()).unwrap();
        let recorded: Vec<String> = serde_json::from_value(m["serve"]["argv"].clone()).unwrap();
        assert_eq!(shell_words(&line), recorded, "{line}");
        assert_eq!(recorded[2], s(&quiet), "{line}");
    }
    let o = wload()
        .current_dir(work.path())
        .args(["shard", s(&fixture(GQA)), "--tp", "2", "--output=-x"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", context(&o));
    let abs = work.path().canonicalize().unwrap().join("-x");
    assert!(
        stdout(&o).contains(&format!("serve with: vllm serve {} ", abs.display())),
        "{}",
        stdout(&o)
    );
}

/// `load OUT` needs no flag that `wload.json` records, says which it took, and refuses one that
/// disagrees naming both values.
#[test]
fn load_takes_its_flags_from_the_manifest() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(
        &fixture("mixtral"),
        2,
        &out,
        &["--enable-expert-parallel", "-q"],
    );
    let o = run(&["load", s(&out), "--dry-run", "--read"]);
    assert!(o.status.success(), "{}", context(&o));
    let err = stderr(&o);
    assert!(
        err.contains("note: --tp 2 --enable-expert-parallel --dtype bfloat16 taken from")
            && err.contains("wload.json"),
        "{err}"
    );
    // The same values given explicitly: no disagreement.
    let o = run(&[
        "load",
        s(&out),
        "--dry-run",
        "--tp",
        "2",
        "--enable-expert-parallel",
        "--dtype",
        "bfloat16",
    ]);
    assert!(o.status.success(), "{}", context(&o));
    assert!(!stderr(&o).contains("note:"), "{}", stderr(&o));
    // -q keeps the note to itself.
    let o = run(&["-q", "load", s(&out), "--dry-run"]);
    assert!(
        o.status.success() && stderr(&o).is_empty(),
        "{}",
        context(&o)
    );

    for (flag, needles) in [
        (
            &["--tp", "4"][..],
            &["written for --tp 2, loaded with --tp 4", "wload.json"][..],
        ),
        (
            &["--pp", "2"][..],
            &["--pp 2 expects", "load with --pp 1"][..],
        ),
        (
            &["--dtype", "float16"][..],
            &[
                "--dtype float16 was given",
                "records --dtype bfloat16",
                "wload.json",
            ][..],
        ),
    ] {
        let mut args = vec!["load", s(&out), "--dry-run"];
        args.extend_from_slice(flag);
        let err = assert_refusal_text(&run(&args), 3, needles);
        assert!(!err.contains("note:"), "{err}");
    }

    // A TP the model refuses too: the manifest's value is named first.
    let err = assert_refusal_text(
        &run(&["load", s(&out), "--dry-run", "--tp", "3"]),
        3,
        &["written for --tp 2, loaded with --tp 3", "not divisible"],
    );
    assert!(
        err.find("written for").unwrap() < err.find("not divisible").unwrap(),
        "{err}"
    );

    let dense = work.path().join("dense");
    shard_ok(&fixture(GQA), 2, &dense, &["-q"]);
    assert_refusal_text(
        &run(&["load", s(&dense), "--dry-run", "--enable-expert-parallel"]),
        3,
        &["--enable-expert-parallel", "no expert parallelism"],
    );
}

/// Pipeline stages come from the manifest too.
#[test]
fn load_takes_pp_from_the_manifest() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(&fixture(GQA), 1, &out, &["--pp", "2", "-q"]);
    let o = run(&["load", s(&out), "--dry-run", "--json"]);
    assert!(o.status.success(), "{}", context(&o));
    let v: Value = json_doc(&["load"], &o);
    assert_eq!((v["tp"].as_u64(), v["pp"].as_u64()), (Some(1), Some(2)));
    assert!(stderr(&o).contains("--tp 1 --pp 2"), "{}", stderr(&o));
}

/// Without a manifest, `load` cannot guess the TP size: a usage error that says what to pass.
#[test]
fn load_without_manifest_or_tp_is_a_usage_error() {
    assert_refusal_text(
        &run(&["load", s(&fixture(GQA)), "--dry-run"]),
        2,
        &["--tp is needed", "wload.json", "pass --tp N"],
    );
    // A vLLM-written folder (no wload.json) has its TP in its file names (vllm_folders.rs).
    // A mistyped folder is named as not being one, not as a folder that lacks a manifest.
    let work = TempDir::new().unwrap();
    fs::create_dir(work.path().join("out")).unwrap();
    let typo = work.path().join("ouy");
    assert_refusal_text(
        &run(&["load", s(&typo), "--dry-run"]),
        2,
        &[
            &format!("{}: no such folder", s(&typo)),
            &format!("did you mean {}?", s(&work.path().join("out"))),
        ],
    );
}

/// `plan` and `shard` on a pre-sharded folder say what it is, what it was written for, how to
/// load and serve it, and to re-shard the original instead; nothing is written.
#[test]
fn plan_and_shard_refuse_a_pre_sharded_folder() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(&fixture(GQA), 2, &out, &["-q"]);
    let original = fixture(GQA).canonicalize().unwrap();
    let needles = [
        "a pre-sharded folder",
        "written for --tp 2 per its wload.json",
        "wload load",
        "vllm serve",
        "--tensor-parallel-size 2",
        "original checkpoint",
        s(&original),
    ];
    assert_refusal_text(&run(&["plan", s(&out), "--tp", "2"]), 3, &needles);
    let again = work.path().join("again");
    assert_refusal_text(
        &run(&["shard", s(&out), "--tp", "4", "-o", s(&again)]),
        3,
        &needles,
    );
    assert!(!again.exists());
    // vLLM's own output has no manifest: the layout comes from the file names.
    let pp = work.path().join("pp");
    shard_ok(&fixture(GQA), 2, &pp, &["--pp", "2", "-q"]);
    fs::remove_file(pp.join("wload.json")).unwrap();
    assert_refusal_text(
        &run(&["plan", s(&pp), "--tp", "2"]),
        3,
        &[
            "written for --tp 2 --pp 2 per its file names",
            "--pipeline-parallel-size 2",
        ],
    );
}

/// A lone safetensors file: `inspect` lists it; plan, shard and load say what else they need.
#[test]
fn a_lone_safetensors_file_is_inspected_and_explained() {
    let file = fixture(GQA).join("model-00001-of-00006.safetensors");
    let v = wload_json(&["inspect", s(&file), "--json"]);
    assert_eq!(v["kind"], "file");
    let tensors = v["tensors"].as_array().unwrap();
    assert!(!tensors.is_empty());
    assert_eq!(
        v["totals"]["tensors"].as_u64(),
        Some(tensors.len() as u64),
        "{v}"
    );
    assert!(v["note"].as_str().unwrap().contains("config.json"), "{v}");
    let human = stdout(&run(&["inspect", s(&file)]));
    assert!(human.contains("a single safetensors file"), "{human}");
    assert!(human.contains("model.embed_tokens.weight"), "{human}");

    assert_refusal_text(
        &run(&["plan", s(&file), "--tp", "2"]),
        2,
        &[
            "single .safetensors file has no config",
            "pass the folder it is in",
        ],
    );
    let work = TempDir::new().unwrap();
    let alone = work.path().join("w.safetensors");
    fs::copy(&file, &alone).unwrap();
    assert_refusal_text(
        &run(&[
            "shard",
            s(&alone),
            "--tp",
            "2",
            "-o",
            s(&work.path().join("o")),
        ]),
        2,
        &[
            "put it in a folder with the model's config.json",
            "wload inspect",
        ],
    );
    assert_refusal_text(
        &run(&["load", s(&alone), "--tp", "2", "--dry-run"]),
        2,
        &["single .safetensors file has no config"],
    );
}

/// `org/name` that is no local folder and no reachable hub: both said, not only "cannot reach".
#[test]
fn a_missing_folder_shaped_like_a_repo_id_says_so() {
    let home = TempDir::new().unwrap();
    let o = wload()
        .current_dir(home.path())
        .env("HF_HOME", home.path())
        .env_remove("HF_HUB_CACHE")
        .env("HF_ENDPOINT", "http://127.0.0.1:9")
        .env("HF_HUB_ETAG_TIMEOUT", "2")
        .args(["inspect", "models/llama"])
        .output()
        .unwrap();
    assert_refusal_text(
        &o,
        1,
        &["models/llama: no local folder of that name", "cannot reach"],
    );
    let o = wload()
        .current_dir(home.path())
        .env("HF_HOME", home.path())
        .env_remove("HF_HUB_CACHE")
        .env("HF_HUB_OFFLINE", "1")
        .args(["inspect", "models/llama"])
        .output()
        .unwrap();
    assert_refusal_text(
        &o,
        1,
        &[
            "no local folder of that name",
            "not in the Hugging Face cache",
        ],
    );
}

/// On a terminal, the progress bar says what it counts.
#[test]
fn the_progress_bar_has_a_label() {
    let (mut master, slave) = pty();
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let mut child = wload_process()
        .args(["shard", s(&fixture(GQA)), "--tp", "2", "-o", s(&out)])
        .stdout(Stdio::null())
        .stderr(Stdio::from(slave))
        .spawn()
        .unwrap();
    let deadline = Instant::now() + RUN_LIMIT;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "wload shard did not finish");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    // The child has exited: what it wrote waits in the terminal's buffer. Non-blocking, so that a
    // copy of the slave end inherited by another test's child cannot hold the read open.
    // SAFETY: fcntl on a descriptor this test owns.
    unsafe {
        libc::fcntl(master.as_raw_fd(), libc::F_SETFL, libc::O_NONBLOCK);
    }
    let mut seen = Vec::new();
    let mut buf = [0u8; 4096];
    while let Ok(n) = master.read(&mut buf) {
        if n == 0 {
            break;
        }
        seen.extend_from_slice(&buf[..n]);
    }
    let seen = String::from_utf8_lossy(&seen);
    assert!(seen.contains("writing "), "{seen:?}");
}

/// A pseudo-terminal: (master to read, slave to hand to the child as stderr).
fn pty() -> (fs::File, OwnedFd) {
    let (mut m, mut s) = (0, 0);
    // SAFETY: openpty writes two descriptors into the given integers and reads nothing else; the
    // null name, termios and winsize pointers are allowed.
    let r = unsafe {
        libc::openpty(
            &mut m,
            &mut s,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(r, 0, "openpty: {}", std::io::Error::last_os_error());
    // Not inherited by the children other tests spawn meanwhile (the child gets its copy through
    // dup2, which clears the flag).
    for fd in [m, s] {
        // SAFETY: fcntl on descriptors just opened here.
        unsafe { libc::fcntl(fd, libc::F_SETFD, libc::FD_CLOEXEC) };
    }
    // SAFETY: both descriptors were just opened by openpty and are owned by nothing else.
    unsafe { (fs::File::from_raw_fd(m), OwnedFd::from_raw_fd(s)) }
}
