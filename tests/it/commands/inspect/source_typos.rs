//! A SOURCE that does not exist: a path is never sent to the hub, and a close local name is
//! offered (`did you mean examples/tiny-llama?`); an `org/name` with nothing close on disk is
//! still a hub repo id.

use std::process::Output;

use super::*;

/// `wload ARGS…` run in `cwd`, the hub kept offline with an empty cache.
fn run_in(cwd: &std::path::Path, args: &[&str]) -> Output {
    wload()
        .current_dir(cwd)
        .env("HF_HUB_OFFLINE", "1")
        .env("HF_HUB_CACHE", cwd.join("hub-cache"))
        .args(args)
        .output()
        .unwrap()
}

/// A work folder holding `examples/tiny-llama` (a copy of the llama_gqa fixture).
fn work() -> TempDir {
    let work = TempDir::new().unwrap();
    let dir = work.path().join("examples/tiny-llama");
    fs::create_dir_all(&dir).unwrap();
    for e in fs::read_dir(fixtures_dir().join("llama_gqa")).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    work
}

#[test]
fn a_mistyped_org_name_path_with_a_close_sibling_is_not_a_repo_id() {
    let w = work();
    for cmd in [
        &["inspect", "examples/tiny-lama"][..],
        &["plan", "examples/tiny-lama", "--tp", "2"],
        &["load", "examples/tiny-lama", "--dry-run"],
    ] {
        let out = run_in(w.path(), cmd);
        let err = assert_refusal_text(&out, 2, &[]);
        assert_eq!(
            err,
            "error: examples/tiny-lama: no such folder (no such file or directory); not asked of the hub as a repo id, since a local path of a close name exists; did you mean examples/tiny-llama?\n",
            "{cmd:?}"
        );
    }
    // The suggestion is right: it inspects.
    let out = run_in(w.path(), &["inspect", "examples/tiny-llama"]);
    assert!(out.status.success(), "{}", context(&out));
}

#[test]
fn a_path_shaped_source_is_never_a_repo_id() {
    let w = work();
    for (source, suggestion) in [
        ("./examples/tiny-lama", Some("./examples/tiny-llama")),
        ("exmples/tiny-llama/", Some("examples/tiny-llama")),
        ("examples/Tiny-Lama/", Some("examples/tiny-llama")),
        ("examples/tiny-llama/oops", None),
        ("../no-such-folder-anywhere/x", None),
        ("/nonexistent/wload-source", None),
        ("~/models/x", None),
        ("a/b/c", None),
        ("nothing-like-it", None),
    ] {
        let out = run_in(w.path(), &["inspect", source]);
        let err = assert_refusal_text(&out, 2, &[&format!("error: {source}: no such folder")]);
        assert!(!err.contains("hub"), "{source}: {err}");
        match suggestion {
            Some(s) => assert!(err.contains(&format!("; did you mean {s}?")), "{err}"),
            None => assert!(!err.contains("did you mean"), "{source}: {err}"),
        }
    }
}

/// An `org/name` with no close name on disk goes to the hub as before (offline here, so the
/// refusal is the cache's).
#[test]
fn an_org_name_with_nothing_close_is_still_a_repo_id() {
    let w = work();
    let out = run_in(w.path(), &["inspect", "someorg/some-model"]);
    let err = assert_refusal_text(&out, 1, &["someorg/some-model", "HF_HUB_OFFLINE"]);
    assert!(!err.contains("no such folder"), "{err}");
    // `examples` exists, but nothing in it is close to `qwen-7b`.
    let out = run_in(w.path(), &["inspect", "examples/qwen-7b"]);
    let err = stderr(&out);
    assert!(
        err.contains("HF_HUB_OFFLINE") && !err.contains("did you mean"),
        "{err}"
    );
}
