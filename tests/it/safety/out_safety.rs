//! `wload shard` never loses a user's data: what OUT may be, what `--force` may replace,
//! publication that cannot clobber a concurrent run, termination signals, leftovers of killed
//! runs, and no panic on hostile arguments or closed output streams.

use std::fs::{self, File};
use std::os::unix::fs::symlink;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ExitStatus, Output, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;
use tempfile::TempDir;

/// `wload shard SOURCE --tp 2 -o OUT EXTRA…` run in the folder `dir` (for relative OUTs).
fn shard_in(dir: &Path, source: &Path, out: &Path, extra: &[&str]) -> Output {
    wload()
        .current_dir(dir)
        .args(["shard", s(source), "--tp", "2", "-o", s(out)])
        .args(extra)
        .output()
        .expect("wload runs")
}

/// Exit 2 with a message that names OUT and contains `says`.
fn assert_out_refused(o: &Output, out: &Path, says: &str) {
    assert_refusal_text(o, 2, &[s(out), says]);
}

/// Every file below `dir` with its bytes, to prove a folder was not touched.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.push((p.clone(), fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Entries of OUT's parent that are wload staging folders (for any OUT).
fn staging_folders(parent: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(parent)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.') && n.contains(".wload-tmp-"))
        .collect();
    v.sort();
    v
}

/// OUT holds exactly the golden vLLM files for llama_gqa at TP 2.
fn assert_golden(out: &Path) {
    let golden = expected(GQA, 2);
    for e in fs::read_dir(&golden).unwrap() {
        let name = e.unwrap().file_name();
        if !name.to_string_lossy().starts_with("model-rank-") {
            continue;
        }
        let (a, b) = (
            fs::read(golden.join(&name)).unwrap(),
            fs::read(out.join(&name)),
        );
        assert!(b.is_ok_and(|b| b == a), "{name:?} differs from vLLM's");
    }
    assert!(out.join("wload.json").is_file());
}

/// `-o out/` and `-o out/.` name the folder `out`: published there, not refused or misplaced.
#[test]
fn trailing_slash_and_dot_name_the_folder_itself() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    for (spelling, extra) in [("out/", &[][..]), ("out/.", &["--force"][..])] {
        let o = shard_in(work.path(), &fixture(GQA), Path::new(spelling), extra);
        assert!(o.status.success(), "-o {spelling}: {}", context(&o));
        assert_golden(&out);
        assert!(staging_folders(work.path()).is_empty());
    }
}

#[test]
fn an_existing_empty_folder_is_used_without_force() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    fs::create_dir(&out).unwrap();
    let o = shard(&fixture(GQA), 2, &out, &[]);
    assert!(o.status.success(), "{}", context(&o));
    assert_golden(&out);
    assert!(staging_folders(work.path()).is_empty());
}

#[test]
fn force_replaces_an_earlier_output_and_nothing_else() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = shard(&fixture("qwen2"), 2, &out, &[]);
    assert!(o.status.success(), "{}", context(&o));

    // An earlier output: refused without --force, untouched.
    let before = snapshot(&out);
    let o = shard(&fixture(GQA), 2, &out, &[]);
    assert_out_refused(&o, &out, "pass --force");
    assert!(
        stderr(&o).contains("earlier wload output"),
        "{}",
        context(&o)
    );
    assert_eq!(snapshot(&out), before, "OUT was touched without --force");

    // With --force: replaced by exactly the new output, no staging folder left.
    let o = shard(&fixture(GQA), 2, &out, &["--force"]);
    assert!(o.status.success(), "{}", context(&o));
    assert_golden(&out);
    let names: Vec<String> = fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !names.iter().any(|n| n.contains("wload-owner")),
        "the owner record is published: {names:?}"
    );
    assert!(staging_folders(work.path()).is_empty());

    // The user adds a file of their own: --force no longer replaces the folder.
    fs::write(out.join("notes.txt"), b"mine").unwrap();
    let before = snapshot(&out);
    let o = shard(&fixture(GQA), 2, &out, &["--force"]);
    assert_out_refused(&o, &out, "notes.txt");
    assert!(
        stderr(&o).contains("which wload did not write"),
        "{}",
        context(&o)
    );
    assert_eq!(snapshot(&out), before);
}

/// `--force` on a folder that is not a wload output — a home folder, a project — is refused,
/// naming what is inside.
#[test]
fn force_never_replaces_a_folder_that_is_not_a_wload_output() {
    let work = TempDir::new().unwrap();
    let home = work.path().join("home");
    fs::create_dir_all(home.join(".ssh")).unwrap();
    fs::write(home.join(".ssh/id_ed25519"), b"secret").unwrap();
    fs::write(home.join("thesis.tex"), b"years of work").unwrap();
    for i in 0..7 {
        fs::write(home.join(format!("photo{i}.jpg")), b"jpg").unwrap();
    }
    let before = snapshot(&home);
    let o = shard(&fixture(GQA), 2, &home, &["--force"]);
    assert_out_refused(&o, &home, "is not a wload output");
    assert!(stderr(&o).contains(".ssh, photo0.jpg"), "{}", context(&o));
    assert!(stderr(&o).contains("and 4 more"), "{}", context(&o));
    assert_eq!(snapshot(&home), before);
    assert!(staging_folders(work.path()).is_empty());

    // A stray wload.json that is not a manifest does not make a folder ours.
    fs::write(home.join("wload.json"), b"{\"not\": \"a manifest\"}").unwrap();
    let o = shard(&fixture(GQA), 2, &home, &["--force"]);
    assert_out_refused(&o, &home, "is not a wload output");
    assert!(home.join("thesis.tex").exists());
}

/// OUT is never the current folder or one of its ancestors, even when it is an earlier output.
#[test]
fn out_holding_the_current_folder_is_refused() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = shard(&fixture(GQA), 2, &out, &[]);
    assert!(o.status.success(), "{}", context(&o));
    let before = snapshot(&out);

    let o = shard_in(&out, &fixture(GQA), &out, &["--force"]);
    assert_out_refused(&o, &out, "current folder");
    let o = shard_in(&out, &fixture(GQA), Path::new("../out"), &["--force"]);
    assert_refusal_text(&o, 2, &["current folder"]);
    let o = shard_in(work.path(), &fixture(GQA), work.path(), &["--force"]);
    assert_refusal_text(&o, 2, &[]);
    for name in [".", ".."] {
        let o = shard_in(&out, &fixture(GQA), Path::new(name), &["--force"]);
        assert_refusal_text(&o, 2, &["not usable as an output folder name"]);
    }
    assert_eq!(snapshot(&out), before);
}

#[test]
fn links_files_and_missing_parents_are_refused() {
    let work = TempDir::new().unwrap();
    let real = work.path().join("real");
    let o = shard(&fixture(GQA), 2, &real, &[]);
    assert!(o.status.success(), "{}", context(&o));

    let link = work.path().join("link");
    symlink(&real, &link).unwrap();
    let o = shard(&fixture(GQA), 2, &link, &["--force"]);
    assert_out_refused(&o, &link, "symbolic link");
    assert!(fs::symlink_metadata(&link).unwrap().is_symlink());

    let file = work.path().join("file");
    fs::write(&file, b"data").unwrap();
    let o = shard(&fixture(GQA), 2, &file, &["--force"]);
    assert_out_refused(&o, &file, "not a folder");
    assert_eq!(fs::read(&file).unwrap(), b"data");

    let deep = work.path().join("no/such/parent/out");
    let o = shard(&fixture(GQA), 2, &deep, &[]);
    assert_out_refused(&o, &deep, "create it first");
    let under_file = file.join("out");
    let o = shard(&fixture(GQA), 2, &under_file, &[]);
    assert_out_refused(&o, &under_file, "create it first");
}

/// A parent folder that cannot be written to is named as OUT's parent, with what to do; the hidden
/// staging folder wload would have made there is not mentioned.
#[test]
fn an_unwritable_parent_is_named_as_such() {
    // sysfs refuses mkdir to everyone, root included (EPERM; EACCES for other users).
    let out = Path::new("/sys/wload-test-out");
    let o = shard(&fixture(GQA), 2, out, &[]);
    let err = assert_refusal_text(
        &o,
        1,
        &[
            "-o /sys/wload-test-out",
            "its parent /sys cannot be written to",
            "choose a folder you can write to",
        ],
    );
    assert!(!err.contains("wload-tmp"), "{err}");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        use std::os::unix::fs::PermissionsExt;
        let work = TempDir::new().unwrap();
        let ro = work.path().join("ro");
        fs::create_dir(&ro).unwrap();
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o555)).unwrap();
        let o = shard(&fixture(GQA), 2, &ro.join("out"), &[]);
        assert_refusal_text(&o, 1, &[s(&ro.join("out")), "cannot be written to"]);
        fs::set_permissions(&ro, fs::Permissions::from_mode(0o755)).unwrap();
    }
}

/// An OUT path that is not UTF-8 is refused before anything is written (the manifest and the
/// staging folder's owner record hold it as text), not a panic.
#[test]
fn a_non_utf8_out_is_refused() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let work = TempDir::new().unwrap();
    let out = work.path().join(OsStr::from_bytes(b"bad\xffname"));
    let o = wload()
        .arg("shard")
        .arg(fixture(GQA))
        .args(["--tp", "2", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert_refusal_text(&o, 2, &["is not valid UTF-8", "choose a UTF-8 path"]);
    assert_eq!(fs::read_dir(work.path()).unwrap().count(), 0);
}

/// A Llama of about 150 MB (zeros), large enough that a shard takes a while.
fn big_checkpoint(dir: &Path) {
    let (hidden, inter, layers, vocab) = (1024u64, 2048u64, 4u64, 32000u64);
    fs::create_dir_all(dir).unwrap();
    let mut cfg = tiny_config();
    cfg["hidden_size"] = hidden.into();
    cfg["intermediate_size"] = inter.into();
    cfg["num_attention_heads"] = 8.into();
    cfg["num_key_value_heads"] = 4.into();
    cfg["num_hidden_layers"] = layers.into();
    cfg["vocab_size"] = vocab.into();
    cfg["dtype"] = "bfloat16".into();
    write_json(&dir.join("config.json"), &cfg);
    let kv = hidden / 2;
    let mut shapes: Vec<(String, Vec<u64>)> = vec![
        ("model.embed_tokens.weight".into(), vec![vocab, hidden]),
        ("model.norm.weight".into(), vec![hidden]),
        ("lm_head.weight".into(), vec![vocab, hidden]),
    ];
    for l in 0..layers {
        let p = format!("model.layers.{l}");
        for (n, shape) in [
            ("self_attn.q_proj.weight", vec![hidden, hidden]),
            ("self_attn.k_proj.weight", vec![kv, hidden]),
            ("self_attn.v_proj.weight", vec![kv, hidden]),
            ("self_attn.o_proj.weight", vec![hidden, hidden]),
            ("mlp.gate_proj.weight", vec![inter, hidden]),
            ("mlp.up_proj.weight", vec![inter, hidden]),
            ("mlp.down_proj.weight", vec![hidden, inter]),
            ("input_layernorm.weight", vec![hidden]),
            ("post_attention_layernorm.weight", vec![hidden]),
        ] {
            shapes.push((format!("{p}.{n}"), shape));
        }
    }
    let data: Vec<Vec<u8>> = shapes
        .iter()
        .map(|(_, sh)| zeros(sh.iter().product::<u64>() as usize * 2))
        .collect();
    let tensors: Vec<Tensor> = shapes
        .iter()
        .zip(&data)
        .map(|((n, sh), d)| (n.as_str(), "BF16", sh.as_slice(), d.as_slice()))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

fn spawn_shard(source: &Path, out: &Path, extra: &[&str]) -> Child {
    wload_process()
        .args(["shard", s(source), "--tp", "2", "-o", s(out), "-q"])
        .args(extra)
        .env_remove("RUST_BACKTRACE")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("wload starts")
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child, which has not been reaped yet.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, sig) }, 0);
}

/// Waits (at most 60 s, then kills it and fails) and returns the status and stderr.
fn finish(mut child: Child) -> (ExitStatus, String) {
    let t = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t.elapsed() > Duration::from_secs(60) {
            let _ = child.kill();
            panic!("wload did not finish within 60 s");
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    (status, err)
}

/// Waits until `child` is writing part files into its staging folder in `parent`; None if it
/// exited first.
fn wait_for_staging(child: &mut Child, parent: &Path) -> Option<String> {
    let t = Instant::now();
    let writing = |name: &String| {
        fs::read_dir(parent.join(name)).is_ok_and(|mut d| {
            d.any(|e| e.is_ok_and(|e| e.file_name().to_string_lossy().starts_with("model-rank-")))
        })
    };
    loop {
        if let Some(name) = staging_folders(parent)
            .into_iter()
            .find(|n| n.ends_with(&format!("-{}", child.id())))
            .filter(writing)
        {
            return Some(name);
        }
        if child.try_wait().unwrap().is_some() {
            return None;
        }
        assert!(t.elapsed() < Duration::from_secs(60), "no staging folder");
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Two runs into one OUT: the first starts long before the second and finishes after it. The
/// second publishes; the first loses the race with exit 1 and leaves the winner's output intact.
#[test]
fn concurrent_runs_into_one_out_never_clobber() {
    let work = TempDir::new().unwrap();
    let big = work.path().join("big");
    big_checkpoint(&big);
    let out = work.path().join("out");
    for force in [false, true] {
        let flags: &[&str] = if force { &["--force"] } else { &[] };
        if force {
            // With --force both may replace an earlier output, but not one that changed meanwhile.
            let o = shard(&fixture("qwen2"), 2, &out, &[]);
            assert!(o.status.success(), "{}", context(&o));
        }
        let mut first = spawn_shard(&big, &out, flags);
        let staging = wait_for_staging(&mut first, work.path()).expect("first run is writing");
        signal(&first, libc::SIGSTOP);
        let o = shard(&fixture(GQA), 2, &out, flags);
        signal(&first, libc::SIGCONT);
        assert!(o.status.success(), "second run: {}", context(&o));
        let winner = snapshot(&out);

        let (status, err) = finish(first);
        assert_eq!(status.code(), Some(1), "first run (force {force}): {err}");
        assert!(
            err.contains("appeared or changed while this run was writing"),
            "{err}"
        );
        assert!(err.contains(s(&out)), "{err}");
        assert_eq!(snapshot(&out), winner, "the winner's output was touched");
        assert_golden(&out);
        assert!(
            !work.path().join(&staging).exists(),
            "the loser left {staging}"
        );
        fs::remove_dir_all(&out).unwrap();
    }
}

/// SIGTERM (timeout, Slurm, CI cancellation) and SIGHUP (a closed terminal) stop a shard as
/// Ctrl-C does: exit 128 + n, no OUT, no staging folder.
#[test]
fn sigterm_and_sighup_leave_nothing() {
    let work = TempDir::new().unwrap();
    let big = work.path().join("big");
    big_checkpoint(&big);
    for (sig, code) in [(libc::SIGTERM, 143), (libc::SIGHUP, 129)] {
        let out = work.path().join(format!("out{sig}"));
        let mut child = spawn_shard(&big, &out, &[]);
        wait_for_staging(&mut child, work.path()).expect("wload is writing");
        signal(&child, sig);
        let (status, err) = finish(child);
        assert_eq!(status.code(), Some(code), "signal {sig}: {status}: {err}");
        assert!(err.contains("interrupted"), "{err}");
        assert!(!out.exists(), "signal {sig}: OUT was published");
        assert_eq!(staging_folders(work.path()), Vec::<String>::new());
    }
}

/// A run killed outright (SIGKILL, out of memory) leaves its staging folder; the next run into
/// the same parent removes it and says so. A live run's staging folder is left alone.
#[test]
fn leftovers_of_dead_runs_are_swept_and_live_ones_kept() {
    let work = TempDir::new().unwrap();
    let big = work.path().join("big");
    big_checkpoint(&big);

    // A live run, paused while writing (started first: a run sweeps when it starts).
    let mut paused = spawn_shard(&big, &work.path().join("b"), &[]);
    let live = wait_for_staging(&mut paused, work.path()).expect("first run is writing");
    signal(&paused, libc::SIGSTOP);

    let mut killed = spawn_shard(&big, &work.path().join("a"), &[]);
    let dead = wait_for_staging(&mut killed, work.path()).expect("second run is writing");
    signal(&killed, libc::SIGKILL);
    let (status, _) = finish(killed);
    assert_eq!(status.signal(), Some(libc::SIGKILL));
    assert!(
        work.path().join(&dead).is_dir(),
        "SIGKILL left nothing to sweep"
    );

    // A staging folder without an owner record (not provably ours) is never removed.
    let unknown = work.path().join(".c.wload-tmp-1");
    fs::create_dir(&unknown).unwrap();
    fs::write(unknown.join("x"), b"x").unwrap();

    let o = shard(&fixture(GQA), 2, &work.path().join("d"), &[]);
    signal(&paused, libc::SIGCONT);
    assert!(o.status.success(), "{}", context(&o));
    assert!(!work.path().join(&dead).exists(), "{dead} was not swept");
    assert!(
        stderr(&o).contains(&format!("note: removed {}", s(&work.path().join(&dead)))),
        "{}",
        context(&o)
    );
    assert!(
        unknown.join("x").exists(),
        "a folder of unknown owner was removed"
    );
    assert!(
        work.path().join(&live).is_dir(),
        "a live run's folder was removed"
    );

    let (status, err) = finish(paused);
    assert!(status.success(), "the paused run: {status}: {err}");
    assert!(!work.path().join(&live).exists());
    assert!(work.path().join("b/wload.json").is_file());
}

/// `--ranks` is checked against `--tp` before anything is allocated.
#[test]
fn huge_rank_lists_are_refused_without_allocating() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    for ranks in ["0-18446744073709551615", "0-100000000", "2"] {
        let t = Instant::now();
        let o = shard(&fixture(GQA), 2, &out, &["--ranks", ranks]);
        assert_refusal_text(&o, 2, &["out of range for --tp 2"]);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "--ranks {ranks} is slow"
        );
        let o = wload()
            .args(["load", s(&fixture(GQA)), "--tp", "2", "--dry-run"])
            .args(["--device", "cpu", "--ranks", ranks])
            .output()
            .unwrap();
        assert_refusal_text(&o, 2, &["out of range for --tp 2"]);
    }
    // An absurd --tp is refused by planning, before any per-rank list is built.
    for tp in ["18446744073709551615", "4294967296"] {
        for cmd in ["shard", "load"] {
            let mut c = wload();
            c.args([cmd, s(&fixture(GQA)), "--tp", tp, "--ranks", "0-4294967295"]);
            if cmd == "shard" {
                c.args(["-o", s(&out)]);
            } else {
                c.args(["--dry-run", "--device", "cpu"]);
            }
            let o = c.output().unwrap();
            assert_refusal_text(&o, 3, &["is not divisible by tp"]);
        }
    }
    let o = shard(&fixture(GQA), 2, &out, &["--ranks", "18446744073709551616"]);
    assert_refusal_text(&o, 2, &[]);
    assert!(!out.exists());
}

fn run_with_stdout(args: &[&str], stdout: Stdio, stderr: Stdio) -> Output {
    wload_process()
        .args(args)
        .env("RUST_BACKTRACE", "1")
        .stdout(stdout)
        .stderr(stderr)
        .output()
        .expect("wload runs")
}

/// A full disk on stdout is exit 1 with a message; a closed pipe is a quiet success; a full or
/// closed stderr changes nothing about the exit status. Never a panic (exit 101).
#[test]
fn full_or_closed_output_streams_never_panic() {
    let gqa = fixture(GQA);
    let cases: [&[&str]; 5] = [
        &["completions", "bash"],
        &["man"],
        &["inspect", s(&gqa)],
        &["inspect", s(&gqa), "--json"],
        &["plan", s(&gqa), "--tp", "2", "--json"],
    ];
    for args in cases {
        let o = run_with_stdout(
            args,
            File::create("/dev/full").unwrap().into(),
            Stdio::piped(),
        );
        assert_eq!(
            o.status.code(),
            Some(1),
            "{args:?} > /dev/full: {}",
            context(&o)
        );
        assert!(
            stderr(&o).contains("No space left on device"),
            "{}",
            context(&o)
        );

        let mut child = wload_process()
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        drop(child.stdout.take()); // `wload … | head -0`
        let (status, err) = finish(child);
        assert_eq!(status.code(), Some(0), "{args:?} | closed pipe: {err}");
        assert!(err.is_empty(), "{args:?}: {err}");
    }
    // An error with stderr full: the exit status still says what happened.
    let o = run_with_stdout(
        &["inspect", "/no/such/folder"],
        Stdio::null(),
        File::create("/dev/full").unwrap().into(),
    );
    assert_eq!(o.status.code(), Some(2), "exit {:?}", o.status.code());
}

/// A named pipe among the side files would block a copy forever: refused by name, exit 3, no
/// OUT (Python's shutil.copy, which vLLM's example uses, refuses it too).
#[test]
fn a_named_pipe_among_the_side_files_is_refused() {
    let src = copy_fixture(GQA);
    let fifo = src.path().join("notes.fifo");
    let c = std::ffi::CString::new(s(&fifo)).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let t = Instant::now();
    let o = shard(src.path(), 2, &out, &[]);
    assert_refusal_text(&o, 3, &["notes.fifo", "named pipe"]);
    assert!(t.elapsed() < Duration::from_secs(20));
    assert!(!out.exists());
    assert!(staging_folders(work.path()).is_empty());
}

/// A write that fails (a full disk, through the test hook) names the file of OUT it was writing,
/// not the hidden staging folder the user never asked for and that is gone by then.
#[test]
fn a_failed_write_names_the_out_file_not_the_staging_folder() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = wload()
        .args(["shard", s(&fixture(GQA)), "--tp", "2", "-o", s(&out), "-q"])
        .env("WLOAD_TEST_WRITE_FAILS_AFTER", "1000")
        .output()
        .expect("wload runs");
    let named = out.join("model-rank-");
    assert_refusal_text(
        &o,
        1,
        &[s(&named), "No space left", "nothing was published"],
    );
    assert!(!stderr(&o).contains("wload-tmp"), "{}", context(&o));
    assert!(staging_folders(work.path()).is_empty() && !out.exists());
}

/// Rewrites OUT's `wload.json` with `edit` (to make it look older or hostile).
fn edit_manifest(out: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = out.join("wload.json");
    let mut m: serde_json::Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    edit(m.as_object_mut().unwrap());
    fs::write(&path, serde_json::to_vec_pretty(&m).unwrap()).unwrap();
}

/// A manifest written before `side_files` existed lists only its part files: `--force` refuses
/// a folder holding anything else, naming it, and deletes nothing (it used to delete every entry
/// such a folder held, the user's included).
#[test]
fn force_on_a_legacy_output_deletes_nothing_it_does_not_list() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(&fixture(GQA), 2, &out, &[]);
    edit_manifest(&out, |m| {
        m.remove("side_files");
        m.remove("side_tree");
        m["wload_version"] = "0.1.0".into();
    });
    fs::write(out.join("notes.txt"), b"mine").unwrap();
    fs::create_dir(out.join("runs")).unwrap();
    fs::write(out.join("runs/log"), b"mine too").unwrap();
    let before = snapshot(&out);
    let o = shard(&fixture(GQA), 2, &out, &["--force"]);
    let err = assert_refusal_text(
        &o,
        2,
        &[
            s(&out),
            "wload 0.1.0",
            "lists only the part files",
            "notes.txt",
        ],
    );
    assert!(err.contains("config.json") && err.contains("runs"), "{err}");
    assert_eq!(snapshot(&out), before, "--force deleted unlisted files");
    assert!(staging_folders(work.path()).is_empty());

    // Holding only what it lists (part files and wload.json), it is replaced.
    for e in fs::read_dir(&out).unwrap() {
        let p = e.unwrap().path();
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        if p.is_dir() {
            fs::remove_dir_all(&p).unwrap();
        } else if !name.starts_with("model-rank-") && name != "wload.json" {
            fs::remove_file(&p).unwrap();
        }
    }
    let o = shard(&fixture(GQA), 2, &out, &["--force"]);
    assert!(o.status.success(), "{}", context(&o));
    assert_golden(&out);
}

/// A folder copied as a side file is replaced while it holds exactly what was copied; a file the
/// user added inside it, or a listed file turned into a link, makes the folder not provably
/// wload's. Hostile names in the manifest (`..`, absolute paths) never reach outside OUT.
#[test]
fn force_replaces_copied_folders_only_while_they_hold_what_was_copied() {
    let src = copy_fixture(GQA);
    fs::create_dir_all(src.path().join("original/sub")).unwrap();
    fs::write(src.path().join("original/params.json"), b"{}").unwrap();
    fs::write(src.path().join("original/sub/t.txt"), b"t").unwrap();
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(src.path(), 2, &out, &[]);
    assert_eq!(fs::read(out.join("original/sub/t.txt")).unwrap(), b"t");
    shard_ok(src.path(), 2, &out, &["--force"]);

    fs::write(out.join("original/sub/mine.txt"), b"mine").unwrap();
    let before = snapshot(&out);
    let o = shard(src.path(), 2, &out, &["--force"]);
    assert_refusal_text(
        &o,
        2,
        &[
            s(&out),
            "original/sub/mine.txt",
            "which wload did not write",
        ],
    );
    assert_eq!(snapshot(&out), before);
    fs::remove_file(out.join("original/sub/mine.txt")).unwrap();

    let victim = work.path().join("victim");
    fs::write(&victim, b"keep").unwrap();
    fs::remove_file(out.join("generation_config.json")).unwrap();
    symlink(&victim, out.join("generation_config.json")).unwrap();
    let o = shard(src.path(), 2, &out, &["--force"]);
    assert_refusal_text(&o, 2, &["generation_config.json"]);
    fs::remove_file(out.join("generation_config.json")).unwrap();

    let abs = s(&victim).to_string();
    edit_manifest(&out, |m| {
        let hostile = [
            "..",
            "../victim",
            abs.as_str(),
            "",
            ".",
            "original/params.json",
        ];
        let side = m["side_files"].as_array_mut().unwrap();
        side.extend(hostile.map(serde_json::Value::from));
        let tree = m["side_tree"].as_array_mut().unwrap();
        tree.extend(["../", "../victim", "/", abs.as_str()].map(serde_json::Value::from));
    });
    shard_ok(src.path(), 2, &out, &["--force"]);
    assert_golden(&out);
    assert_eq!(fs::read(&victim).unwrap(), b"keep");
    let left = staging_folders(work.path());
    let inside: Vec<_> = left
        .iter()
        .map(|l| snapshot(&work.path().join(l)))
        .collect();
    assert!(left.is_empty(), "{left:?}: {inside:?}");
}

/// OUT inside SOURCE is refused: the next shard of that checkpoint would copy it as a side file.
#[test]
fn out_inside_the_source_is_refused() {
    let src = copy_fixture(GQA);
    for rel in ["out", "deeper/out"] {
        let out = src.path().join(rel);
        if let Some(p) = out.parent() {
            fs::create_dir_all(p).unwrap();
        }
        let o = shard(src.path(), 2, &out, &[]);
        assert_out_refused(&o, &out, "is inside the source checkpoint");
        assert!(
            stderr(&o).contains("choose a folder outside it"),
            "{}",
            context(&o)
        );
        assert!(!out.exists());
        assert!(staging_folders(out.parent().unwrap()).is_empty());
    }
}

/// An earlier output or staging folder that sits inside a checkpoint (from an older wload, or
/// moved there) is not copied into the next output as a side file, and the run says so: outputs
/// no longer nest into outputs.
#[test]
fn earlier_outputs_inside_the_source_are_not_copied_as_side_files() {
    let src = copy_fixture(GQA);
    let work = TempDir::new().unwrap();
    let first = work.path().join("first");
    shard_ok(src.path(), 2, &first, &[]);
    fs::rename(&first, src.path().join("old-out")).unwrap();
    let staging = src.path().join(".x.wload-tmp-1");
    fs::create_dir(&staging).unwrap();
    fs::write(staging.join("model-rank-0-part-0.safetensors"), b"partial").unwrap();

    let out = work.path().join("out");
    let o = wload()
        .args(["shard", s(src.path()), "--tp", "2", "-o", s(&out), "--json"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", context(&o));
    assert!(
        !out.join("old-out").exists(),
        "an earlier output was copied"
    );
    assert!(!out.join(".x.wload-tmp-1").exists());
    assert!(
        stderr(&o).contains("note: left out old-out"),
        "{}",
        context(&o)
    );
    let report: serde_json::Value = json_doc(&["shard"], &o);
    let skipped: Vec<&str> = (report["skipped_side_files"].as_array().unwrap().iter())
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        skipped,
        [".x.wload-tmp-1", "model.safetensors.index.json", "old-out"]
    );
    assert_golden(&out);
}

/// A file system mounted for the test, unmounted (lazily) when dropped.
struct Mount(PathBuf);

impl Mount {
    /// A tmpfs of `size` (`1m`) at the existing folder `at`; `None` where mounting is not
    /// allowed (no root, a sandbox).
    fn tmpfs(at: &Path, size: &str) -> Option<Mount> {
        let c = |t: &str| std::ffi::CString::new(t).unwrap();
        let (target, opts) = (c(s(at)), c(&format!("size={size}")));
        // SAFETY: valid NUL-terminated strings; mount(2) only reads them.
        let r = unsafe {
            libc::mount(
                c("tmpfs").as_ptr(),
                target.as_ptr(),
                c("tmpfs").as_ptr(),
                0,
                opts.as_ptr().cast(),
            )
        };
        (r == 0).then(|| Mount(at.to_path_buf()))
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let c = std::ffi::CString::new(s(&self.0)).unwrap();
        // SAFETY: a valid NUL-terminated path.
        unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
    }
}

/// A mount table (`/proc/self/mountinfo` format) that lists `path`, octal-escaped as the kernel
/// writes it, for the mount-point test hook.
fn fake_mountinfo(dir: &Path, path: &Path) -> PathBuf {
    let escaped = s(path).replace('\\', "\\134").replace(' ', "\\040");
    let table = dir.join("mountinfo");
    let line =
        format!("1 0 8:1 / / rw - ext4 /dev/sda1 rw\n99 1 0:42 / {escaped} rw - tmpfs tmpfs rw\n");
    fs::write(&table, line).unwrap();
    table
}

/// An empty mount point as OUT (a fresh volume) is refused before anything is written, saying to
/// use a folder inside it (renaming the staging folder onto it failed with "Device or resource
/// busy" after all the writing). A real tmpfs where mounting is allowed; the mount table test
/// hook (a bind mount: same device as its parent) always.
#[test]
fn an_empty_mount_point_is_refused_up_front() {
    let work = TempDir::new().unwrap();
    let vol = work.path().join("vol");
    fs::create_dir(&vol).unwrap();
    match Mount::tmpfs(&vol, "64m") {
        Some(_mounted) => {
            let o = shard(&fixture(GQA), 2, &vol, &[]);
            assert_out_refused(&o, &vol, "is a mount point");
            assert!(stderr(&o).contains("a folder inside it"), "{}", context(&o));
            assert_eq!(fs::read_dir(&vol).unwrap().count(), 0);
            assert!(staging_folders(work.path()).is_empty());
            shard_ok(&fixture(GQA), 2, &vol.join("model-tp2"), &[]);
            assert_golden(&vol.join("model-tp2"));
        }
        None => skipped(
            "an_empty_mount_point_is_refused_up_front (real tmpfs part)",
            "mount(2) is not allowed here; the mount-table hook below still runs",
        ),
    }
    let bind = work.path().join("my vol");
    fs::create_dir(&bind).unwrap();
    let table = fake_mountinfo(work.path(), &bind.canonicalize().unwrap());
    for extra in [&[][..], &["--force"][..]] {
        let o = wload()
            .args(["shard", s(&fixture(GQA)), "--tp", "2", "-o", s(&bind)])
            .args(extra)
            .env("WLOAD_TEST_MOUNTINFO", &table)
            .output()
            .unwrap();
        assert_out_refused(&o, &bind, "is a mount point");
        assert_eq!(fs::read_dir(&bind).unwrap().count(), 0);
    }
}

/// Too little room on OUT's file system is refused with exit 1 before anything is written there,
/// naming what is needed and what is free (the part files used to be preallocated until the disk
/// had a few megabytes left). The free-space test hook always; a real 1 MiB tmpfs where mounting
/// is allowed.
#[test]
fn free_space_is_checked_before_anything_is_written() {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = wload()
        .args(["shard", s(&fixture(GQA)), "--tp", "2", "-o", s(&out)])
        .env("WLOAD_TEST_FREE_BYTES", "1000")
        .output()
        .unwrap();
    assert_refusal_text(
        &o,
        1,
        &[
            s(&out),
            "only 1000 B is free there",
            "nothing was written",
            "on another disk",
        ],
    );
    assert_eq!(
        fs::read_dir(work.path()).unwrap().count(),
        0,
        "something was written"
    );

    // Replacing an earlier output: its space is not counted as free, and the message says why.
    shard_ok(&fixture(GQA), 2, &out, &[]);
    let before = snapshot(&out);
    let o = wload()
        .args([
            "shard",
            s(&fixture(GQA)),
            "--tp",
            "2",
            "-o",
            s(&out),
            "--force",
        ])
        .env("WLOAD_TEST_FREE_BYTES", "1000")
        .output()
        .unwrap();
    assert_refusal_text(&o, 1, &["removed only once the new one is complete"]);
    assert_eq!(snapshot(&out), before);

    let small = work.path().join("small");
    fs::create_dir(&small).unwrap();
    let Some(_mounted) = Mount::tmpfs(&small, "1m") else {
        return skipped(
            "free_space_is_checked_before_anything_is_written (real tmpfs part)",
            "mount(2) is not allowed here; the hook cases above ran",
        );
    };
    let out = small.join("out");
    let o = shard(&fixture(GQA), 2, &out, &[]);
    assert_refusal_text(&o, 1, &[s(&out), "is free there", "nothing was written"]);
    assert_eq!(
        fs::read_dir(&small).unwrap().count(),
        0,
        "something was written"
    );
}

/// The part files' bytes of llama_gqa at TP 2, as written.
fn gqa_part_bytes() -> u64 {
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(&fixture(GQA), 2, &out, &[]);
    fs::read_dir(&out)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| s(p).contains("model-rank-"))
        .map(|f| fs::metadata(f).unwrap().len())
        .sum()
}

/// A disk that fills up anyway (another writer, a file system holding less than it reports) is
/// the output disk's failure, said with OUT and what the run needs, whichever file it hit: a
/// side file being copied is not blamed (it used to be, with "move it out of the checkpoint
/// folder"), nor is the preallocation of a part file. On real small tmpfs volumes, with the
/// free-space check told there is room; where mounting is not allowed, a write failing through
/// the test hook.
#[test]
fn a_disk_filling_up_is_blamed_on_the_disk_not_the_file() {
    let src = copy_fixture(GQA);
    fs::write(src.path().join("big-notes.txt"), zeros(2 << 20)).unwrap();
    let work = TempDir::new().unwrap();
    let parts = gqa_part_bytes();
    // Room for the part files and small side files (a page each), not for the 2 MiB one; then
    // room for nothing.
    let cases = [
        (parts.next_multiple_of(4096) + (128 << 10), "big-notes.txt"),
        (64 << 10, "model-rank-0-part-0.safetensors"),
    ];
    for (i, (size, file)) in cases.into_iter().enumerate() {
        let vol = work.path().join(format!("vol{i}"));
        fs::create_dir(&vol).unwrap();
        let Some(_mounted) = Mount::tmpfs(&vol, &size.to_string()) else {
            skipped(
                "a_disk_filling_up_is_blamed_on_the_disk_not_the_file (tmpfs part)",
                "mount(2) is not allowed here; the hook case below still runs",
            );
            break;
        };
        let out = vol.join("out");
        let o = wload()
            .args(["shard", s(src.path()), "--tp", "2", "-o", s(&out)])
            .env("WLOAD_TEST_FREE_BYTES", (1u64 << 40).to_string())
            .output()
            .unwrap();
        let err = assert_refusal_text(
            &o,
            1,
            &[
                s(&out.join(file)),
                "No space left on device",
                &format!(
                    "the output's file system (the one holding {}) is full",
                    s(&vol)
                ),
                "this run needs",
                "nothing was published",
            ],
        );
        assert!(
            !err.contains("move it out") && !err.contains("wload-tmp"),
            "{err}"
        );
        assert_eq!(fs::read_dir(&vol).unwrap().count(), 0, "left behind");
    }
    let out = work.path().join("out");
    let o = wload()
        .args(["shard", s(src.path()), "--tp", "2", "-o", s(&out)])
        .env("WLOAD_TEST_WRITE_FAILS_AFTER", "1000")
        .output()
        .unwrap();
    let err = assert_refusal_text(
        &o,
        1,
        &["the output's file system", "is full", "this run needs"],
    );
    assert!(!err.contains("wload-tmp"), "{err}");
}

/// An OUT name near the file system's limit works (its staging name used to pass 255 bytes and
/// fail about the hidden folder); one over the limit is refused by name, with the limit.
#[test]
fn long_out_names_work_and_too_long_ones_are_refused_about_out() {
    let work = TempDir::new().unwrap();
    let long = work.path().join("m".repeat(250));
    let o = shard(&fixture(GQA), 2, &long, &[]);
    assert!(o.status.success(), "{}", context(&o));
    assert_golden(&long);
    assert!(staging_folders(work.path()).is_empty());
    shard_ok(&fixture(GQA), 2, &long, &["--force"]);

    let too_long = work.path().join("m".repeat(256));
    let o = shard(&fixture(GQA), 2, &too_long, &[]);
    let err = assert_refusal_text(&o, 2, &["its name is 256 bytes, longer than the 255 bytes"]);
    assert!(!err.contains("wload-tmp"), "{err}");
}
