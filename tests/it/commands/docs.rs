//! Every command block of README.md and docs/deploy.md, run as written, so that no command a
//! reader copies can fail: each document in a fresh clone of its own (the example checkpoint,
//! `target/release/wload` and `wload` on the PATH being this build), its blocks in order. What
//! needs GPUs or a cluster runs against the stand-ins in tests/data/docs/bin (`vllm`, `torchrun`,
//! `srun`, `pip`), which check their arguments as the real tools parse them; `s3://models/…` is
//! the in-process S3 server. A block is run, or marked `<!-- not-run: REASON -->` or
//! `<!-- run-by: FILE -->` (FILE runs each of its lines): a new block cannot go untested.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tempfile::TempDir;

use crate::support::*;

/// A fenced block of a document, and what the tests do with it.
#[derive(Debug)]
enum Block {
    /// A `console` block: each `$ ` line a command, the lines under it what its output must hold.
    Transcript(Vec<(String, Vec<String>)>),
    /// An `sh` block: its lines, run as one script that stops at the first command that fails.
    Script(String),
    /// After `<!-- not-run: REASON -->`: why it cannot run even against stand-ins.
    NotRun(String),
    /// After `<!-- run-by: FILE -->`: the command lines, each of which FILE runs as written.
    RunBy(String, Vec<String>),
}

/// The fences whose blocks are commands; blocks of the others are files (a Dockerfile, a YAML).
const COMMANDS: [&str; 5] = ["console", "sh", "bash", "shell", ""];
const NOT_COMMANDS: [&str; 5] = ["dockerfile", "yaml", "json", "toml", "text"];

/// The folder a document's commands and outputs name for the clone they run in.
const CLONE_ROOT: &str = "/home/you/wload";

/// The blocks of `text` (the document `doc`) with their first line's number, or why one of them
/// is neither run nor marked as the tests want.
fn blocks(doc: &str, text: &str) -> Result<Vec<(usize, Block)>, String> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i < lines.len() {
        let Some(lang) = lines[i].trim_start().strip_prefix("```") else {
            i += 1;
            continue;
        };
        let start = i + 1;
        let len = lines[start..]
            .iter()
            .position(|l| l.trim_start().starts_with("```"))
            .ok_or(format!("{doc}:{start}: the block does not end"))?;
        let body = &lines[start..start + len];
        let marker = lines[..i]
            .iter()
            .rev()
            .find(|l| !l.trim().is_empty())
            .map_or("", |l| l.trim());
        i = start + len + 1;
        if NOT_COMMANDS.contains(&lang) {
            continue;
        }
        if !COMMANDS.contains(&lang) {
            return Err(format!(
                "{doc}:{start}: a ```{lang} block: say whether it holds commands (tests/it/commands/docs.rs)"
            ));
        }
        out.push((start, block(doc, start, lang, marker, body)?));
    }
    Ok(out)
}

/// One command block, by its fence's language and the marker line before it.
fn block(doc: &str, at: usize, lang: &str, marker: &str, body: &[&str]) -> Result<Block, String> {
    let commands = || -> Vec<String> {
        body.iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| l.strip_prefix("$ ").unwrap_or(l).to_string())
            .collect()
    };
    if let Some(rest) = marker.strip_prefix("<!--") {
        let rest = rest.trim_end_matches("-->").trim();
        return match rest.split_once(':') {
            Some(("not-run", why)) if why.split_whitespace().count() >= 5 => {
                Ok(Block::NotRun(why.trim().to_string()))
            }
            Some(("not-run", _)) => Err(format!("{doc}:{at}: not-run needs its reason")),
            Some(("run-by", file)) => Ok(Block::RunBy(file.trim().to_string(), commands())),
            _ => Err(format!("{doc}:{at}: unknown marker <!--{rest}-->")),
        };
    }
    if lang != "console" {
        return Ok(Block::Script(body.join("\n")));
    }
    let mut steps: Vec<(String, Vec<String>)> = Vec::new();
    for line in body {
        match (line.strip_prefix("$ "), steps.last_mut()) {
            (Some(cmd), _) => steps.push((cmd.to_string(), Vec::new())),
            (None, Some(step)) => step.1.push(line.to_string()),
            (None, None) => return Err(format!("{doc}:{at}: the transcript starts with output")),
        }
    }
    Ok(Block::Transcript(steps))
}

/// A fresh clone for one document: the example checkpoint, the build as `target/release/wload`
/// and as `wload` on the PATH, the Python package's build files, the stand-ins first on the PATH,
/// and the S3 server holding the example as `s3://models/tiny-llama`.
struct Clone {
    dir: TempDir,
    root: PathBuf,
    path: String,
    home: TempDir,
    s3: S3Server,
}

impl Clone {
    fn new() -> Clone {
        let dir = TempDir::new().unwrap();
        let example = manifest_dir().join("examples/tiny-llama");
        copy_files(&example, &dir.path().join("examples/tiny-llama"));
        let release = dir.path().join("target/release");
        fs::create_dir_all(&release).unwrap();
        std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_wload"), release.join("wload")).unwrap();
        fs::create_dir(dir.path().join("python")).unwrap();
        for f in ["pyproject.toml", "Cargo.toml"] {
            fs::copy(
                manifest_dir().join("python").join(f),
                dir.path().join("python").join(f),
            )
            .unwrap();
        }
        let stand_ins = manifest_dir().join("tests/data/docs/bin");
        let path = format!(
            "{}:{}:{}",
            stand_ins.display(),
            release.display(),
            std::env::var("PATH").unwrap_or_default()
        );
        let s3 = S3Server::start();
        s3.upload_dir(&example, "tiny-llama");
        let root = dir.path().canonicalize().unwrap();
        let home = TempDir::new().unwrap();
        Clone {
            dir,
            root,
            path,
            home,
            s3,
        }
    }

    /// `sh -c script` in the clone, as a reader's shell would run it there.
    fn sh(&self, flags: &str, script: &str) -> Output {
        let script = script.replace(CLONE_ROOT, &self.root.display().to_string());
        let mut cmd = Command::new("sh");
        cmd.arg(flags)
            .arg(&script)
            .current_dir(self.dir.path())
            .env("PATH", &self.path)
            .env("HOME", self.home.path())
            .env("HF_HOME", self.home.path().join("hf"))
            .env("WLOAD_DOCS_S3_ROOT", s3_root(&self.s3));
        for (k, v) in self.s3.env() {
            cmd.env(k, v);
        }
        // What a launcher would set: only the commands' own.
        for (k, _) in std::env::vars() {
            if k.starts_with("SLURM_")
                || [
                    "RANK",
                    "WORLD_SIZE",
                    "LOCAL_RANK",
                    "GROUP_RANK",
                    "JOB_COMPLETION_INDEX",
                ]
                .contains(&k.as_str())
                || ["WLOAD_RUNS", "HF_HUB_OFFLINE", "HF_HUB_CACHE", "HF_TOKEN"]
                    .contains(&k.as_str())
            {
                cmd.env_remove(k);
            }
        }
        cmd.output().unwrap()
    }
}

/// Whether the stand-ins (Python scripts) can run here; in CI they must.
fn stand_ins_run(test: &str) -> bool {
    let ok = Command::new("python3")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        missing_environment(
            test,
            "no python3 to run the stand-ins of tests/data/docs/bin",
        );
    }
    ok
}

/// The folder the S3 server keeps its buckets in (`s3://BUCKET/KEY` is `ROOT/BUCKET/KEY`).
fn s3_root(s3: &S3Server) -> PathBuf {
    s3.folder("").parent().unwrap().to_path_buf()
}

/// An output line as a transcript shows it: exactly, or up to a trailing ` …`.
fn shows(expected: &str, got: &str, root: &Path) -> bool {
    let expected = expected.replace(CLONE_ROOT, &root.display().to_string());
    match expected.strip_suffix(" …") {
        Some(head) => got.starts_with(head),
        None => got == expected,
    }
}

/// What running a document's blocks did.
#[derive(Debug, Default)]
struct Ran {
    /// Every command run, as written.
    commands: Vec<String>,
    /// Every block not run, with its reason.
    not_run: Vec<String>,
    /// The blocks a file runs (the file, its lines).
    run_by: Vec<(String, Vec<String>)>,
    /// The `serve with: ` lines the commands printed, each run against the vllm stand-in.
    serve_lines: Vec<String>,
}

/// Runs every command block of `doc` in order in one fresh clone; panics at the first command
/// that fails or does not print what the document shows.
fn run_document(doc: &str) -> Ran {
    let text = fs::read_to_string(manifest_dir().join(doc)).unwrap();
    let all = blocks(doc, &text).unwrap_or_else(|e| panic!("{e}"));
    let clone = Clone::new();
    let mut ran = Ran::default();
    for (at, block) in all {
        match block {
            Block::Transcript(steps) => {
                for (cmd, expected) in steps {
                    let out = clone.sh("-c", &cmd);
                    assert!(
                        out.status.success(),
                        "{doc}:{at}: `{cmd}`: {}",
                        context(&out)
                    );
                    let text = format!("{}{}", stdout(&out), stderr(&out));
                    for want in &expected {
                        assert!(
                            text.lines().any(|got| shows(want, got, &clone.root)),
                            "{doc}:{at}: `{cmd}` should print {want:?}; it printed:\n{text}"
                        );
                    }
                    ran.serve_lines.extend(
                        text.lines()
                            .filter_map(|l| l.strip_prefix("serve with: "))
                            .map(str::to_string),
                    );
                    ran.commands.push(cmd);
                }
            }
            Block::Script(script) => {
                let out = clone.sh("-ec", &script);
                assert!(
                    out.status.success(),
                    "{doc}:{at}: {script}\n{}",
                    context(&out)
                );
                ran.commands.extend(script.lines().map(str::to_string));
            }
            Block::NotRun(why) => ran.not_run.push(why),
            Block::RunBy(file, lines) => {
                let runner = fs::read_to_string(manifest_dir().join(&file)).unwrap();
                for line in &lines {
                    assert!(
                        runner.lines().any(|l| l.trim() == line),
                        "{doc}:{at}: `{line}` is not a line of {file}, which should run it"
                    );
                }
                ran.run_by.push((file, lines));
            }
        }
    }
    // What the commands printed to serve with starts vLLM too (the stand-in checks the folder).
    for line in &ran.serve_lines {
        let out = clone.sh("-c", line);
        assert!(out.status.success(), "{doc}: `{line}`: {}", context(&out));
    }
    ran
}

/// The README, from a fresh clone: the example run, the test command `.ci/run` runs; only the
/// set-up, which installs system packages from the network, is not run.
#[test]
fn readme_command_blocks_run_as_written() {
    let ran = run_document("README.md");
    assert!(
        ran.commands.iter().any(|c| c.contains("wload shard")),
        "{ran:?}"
    );
    assert_eq!(
        ran.serve_lines.len(),
        1,
        "shard prints one serve line: {ran:?}"
    );
    assert_eq!(ran.not_run.len(), 1, "only the set-up: {:?}", ran.not_run);
    assert!(
        ran.run_by
            .iter()
            .any(|(f, l)| f == ".ci/run" && l.iter().any(|c| c == "cargo test --locked")),
        "the README's test command is .ci/run's: {ran:?}"
    );
}

/// docs/deploy.md, every block run: the CI gates, the wheel, the serve lines, the split runs
/// under torchrun (with `--no-python`), srun and an Indexed Job, and object storage.
#[test]
fn deploy_guide_command_blocks_run_as_written() {
    if !stand_ins_run("deploy_guide_command_blocks_run_as_written") {
        return;
    }
    let ran = run_document("docs/deploy.md");
    assert!(ran.not_run.is_empty(), "{:?}", ran.not_run);
    for needed in [
        "jq -e .ok",
        "--dry-run --read",
        "torchrun --nnodes 2",
        "--no-python",
        "srun ",
        "JOB_COMPLETION_INDEX=",
        "pip install dist/wload-",
        "--load-format wload",
        "--headless",
        "s3://",
    ] {
        assert!(
            ran.commands.iter().any(|c| c.contains(needed)),
            "deploy.md runs no `{needed}`: {:?}",
            ran.commands
        );
    }
}

/// A block that is neither run nor marked, or marked without a reason, fails the scan.
#[test]
fn a_block_the_tests_cannot_place_is_refused() {
    let ok = "x\n```sh\nwload --version\n```\n<!-- not-run: needs a GPU that CI lacks -->\n```sh\nnvidia-smi\n```\n```yaml\na: 1\n```\n";
    let got = blocks("ok.md", ok).unwrap();
    assert!(
        matches!(&got[..], [(2, Block::Script(_)), (6, Block::NotRun(_))]),
        "{got:?}"
    );
    for (text, says) in [
        ("```zsh\nls\n```\n", "say whether it holds commands"),
        ("<!-- not-run: -->\n```sh\nls\n```\n", "needs its reason"),
        ("<!-- skip -->\n```sh\nls\n```\n", "unknown marker"),
        ("```console\noutput\n$ ls\n```\n", "starts with output"),
        ("```sh\nls\n", "does not end"),
    ] {
        let err = blocks("bad.md", text).unwrap_err();
        assert!(err.contains(says), "{text:?}: {err}");
    }
}

/// The stand-ins refuse what the real tools refuse, so a block that passes against them is one
/// the real tools run: torchrun runs a program that is no `.py` file through Python unless
/// `--no-python` (`python -u sh -c …` fails), and gives each process its ranks; vllm takes vLLM
/// 0.33's flags only and checks the folder against them; srun and pip refuse unknown options.
#[test]
fn the_stand_ins_refuse_what_the_real_tools_refuse() {
    if !stand_ins_run("the_stand_ins_refuse_what_the_real_tools_refuse") {
        return;
    }
    let clone = Clone::new();
    let ok = clone.sh(
        "-c",
        "wload shard examples/tiny-llama --tp 2 -o out -q >/dev/null && torchrun --nnodes 2 --nproc-per-node 2 --node-rank 1 --master-addr n0 --no-python sh -c 'echo rank $RANK of $WORLD_SIZE, local $LOCAL_RANK' | sort",
    );
    assert_eq!(
        stdout(&ok),
        "rank 2 of 4, local 0\nrank 3 of 4, local 1\n",
        "{}",
        context(&ok)
    );
    let serve = "vllm serve /home/you/wload/out --load-format sharded_state";
    for (cmd, says) in [
        (
            "torchrun --nnodes 2 --nproc-per-node 1 --node-rank 0 --master-addr n0 sh -c 'wload shard examples/tiny-llama --tp 2 --ranks launcher -o node$GROUP_RANK'",
            "ChildFailedError",
        ),
        ("torchrun --nnodes 2 --no-python true", "would never meet"),
        (
            "torchrun --nproc-per-node 1 --no-pyton sh",
            "unrecognized arguments",
        ),
        (
            &format!(
                "{serve} --tensor-parallel-size 2 --dtype bfloat16 --skip-tokenizer-init --no-such-flag"
            ),
            "unrecognized arguments: --no-such-flag",
        ),
        (
            &format!("{serve} --tensor-parallel-size 2 --dtype bf16 --skip-tokenizer-init"),
            "invalid choice: 'bf16'",
        ),
        (
            &format!("{serve} --tensor-parallel-size 4 --dtype bfloat16 --skip-tokenizer-init"),
            "no model-rank-2-part-*",
        ),
        (
            &format!("{serve} --tensor-parallel-size 2 --skip-tokenizer-init"),
            "pass --dtype bfloat16",
        ),
        (
            &format!("{serve} --tensor-parallel-size 2 --dtype bfloat16"),
            "has no tokenizer",
        ),
        (
            "vllm serve /home/you/wload/examples/tiny-llama --load-format wload --tensor-parallel-size 3 --skip-tokenizer-init",
            "the wload plugin would refuse",
        ),
        (
            "vllm serve /home/you/wload/nowhere --load-format sharded_state",
            "no such folder",
        ),
        (
            "vllm serve /home/you/wload/out --load-format wload2",
            "no such loader",
        ),
        (
            &format!(
                "{serve} --tensor-parallel-size 2 --dtype bfloat16 --skip-tokenizer-init --nnodes 2 --node-rank 1 --master-addr n0"
            ),
            "run --headless",
        ),
        (
            "srun --nodes 2 --ntask-per-node 1 true",
            "unrecognized option",
        ),
        ("pip install dist/wload-*.whl", "Could not find a version"),
        ("pip wheel . -w dist", "is not installable"),
    ] {
        let out = clone.sh("-c", cmd);
        assert!(
            !out.status.success(),
            "`{cmd}` should fail: {}",
            context(&out)
        );
        assert!(stderr(&out).contains(says), "`{cmd}`: {}", context(&out));
    }
    // The refused torchrun ran nothing: no rank wrote a folder.
    assert!(!clone.dir.path().join("node0").exists());
}
