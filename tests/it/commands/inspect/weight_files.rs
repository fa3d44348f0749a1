//! Weight files that cannot be read (links, FIFOs, folders, odd names) and how the index is read.

use super::*;

// ---- weight files that cannot be read (issue 9, item 7) ----
//
// vLLM selects weights with Python's `glob` over the folder, which lists every name that matches
// (dangling links, folders, FIFOs, undecodable names included), then fails to open the ones that
// are not readable files. wload reports each by name with exit 3 instead of skipping it.

/// Runs `wload inspect DIR` (bounded in time: a FIFO must not make it wait), expects exit 3, and
/// returns stderr.
fn inspect_fails_with_3(dir: &std::path::Path) -> String {
    let out = wload()
        .args(["inspect", s(dir)])
        .timeout(std::time::Duration::from_secs(60))
        .output()
        .expect("wload runs");
    assert_refusal_text(&out, 3, &[])
}

/// A broken Hugging Face cache: the link is selected by vLLM's glob and then fails to open.
#[test]
fn dangling_weight_link_is_reported_with_its_target() {
    let tmp = tiny_checkpoint();
    let target = tmp.path().join("blobs/0123abcd");
    std::os::unix::fs::symlink(&target, tmp.path().join("model-2.safetensors")).unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("model-2.safetensors: symbolic link to"),
        "{err}"
    );
    assert!(err.contains("blobs/0123abcd"), "{err}");
    assert!(err.contains("does not exist"), "{err}");
    assert!(err.contains("download the model again"), "{err}");
}

/// With only a dangling `*.safetensors`, vLLM still takes the safetensors pattern (its glob matched)
/// rather than falling back to `*.bin`, and fails on the link; so does wload.
#[test]
fn dangling_link_wins_the_pattern_over_bin_files() {
    let tmp = tiny_checkpoint();
    fs::rename(
        tmp.path().join("model.safetensors"),
        tmp.path().join("pytorch_model.bin"),
    )
    .unwrap();
    std::os::unix::fs::symlink("gone", tmp.path().join("model.safetensors")).unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("model.safetensors: symbolic link to 'gone'"),
        "{err}"
    );
    assert!(!err.contains(".bin files"), "{err}");
}

/// An index that does not list the dangling link makes vLLM drop it before opening anything.
#[test]
fn dangling_link_not_in_the_index_is_dropped_like_vllm() {
    let tmp = tiny_checkpoint();
    std::os::unix::fs::symlink("gone", tmp.path().join("stale.safetensors")).unwrap();
    write_json(
        &tmp.path().join("model.safetensors.index.json"),
        &json!({"weight_map": {
            "model.embed_tokens.weight": "model.safetensors",
            "model.norm.weight": "model.safetensors",
            "lm_head.weight": "model.safetensors",
        }}),
    );
    let out = wload_json(&["inspect", s(tmp.path()), "--json"]);
    assert_eq!(names_of(&out, "files"), ["model.safetensors"]);
    let stale = out["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["file"] == "stale.safetensors")
        .unwrap_or_else(|| panic!("stale link not in dropped: {}", out["dropped"]));
    assert!(
        stale["reason"].as_str().unwrap().contains("not listed"),
        "{stale}"
    );
}

/// A link to itself: `open` fails with ELOOP for every user, root included.
#[test]
fn symlink_loop_is_reported_by_name() {
    let tmp = tiny_checkpoint();
    std::os::unix::fs::symlink("loop.safetensors", tmp.path().join("loop.safetensors")).unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("loop.safetensors: symbolic link to 'loop.safetensors' cannot be followed"),
        "{err}"
    );
    assert!(err.contains("fix or remove the link"), "{err}");
}

/// Opening a FIFO for reading waits for a writer; wload must answer at once instead.
#[test]
fn fifo_named_like_weights_is_reported_without_waiting() {
    let tmp = tiny_checkpoint();
    let fifo = tmp.path().join("pipe.safetensors");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid NUL-terminated path; mkfifo only creates a file system entry.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("pipe.safetensors: is a FIFO (named pipe), not a regular file"),
        "{err}"
    );
}

#[test]
fn folder_named_like_weights_is_reported_by_name() {
    let tmp = tiny_checkpoint();
    fs::create_dir(tmp.path().join("extra.safetensors")).unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("extra.safetensors: is a folder, not a regular file"),
        "{err}"
    );
}

/// Python decodes an undecodable name with surrogate escapes, so `*.safetensors` matches it and
/// vLLM selects it; wload names it (lossily, with the raw bytes) and refuses it.
#[test]
fn non_utf8_weight_name_is_reported_by_name() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tiny_checkpoint();
    let name = std::ffi::OsStr::from_bytes(b"model-\xff.safetensors");
    fs::copy(tmp.path().join("model.safetensors"), tmp.path().join(name)).unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("model-\u{FFFD}.safetensors: file name is not valid UTF-8"),
        "{err}"
    );
    assert!(err.contains(r#"bytes "model-\xff.safetensors""#), "{err}");
    assert!(err.contains("rename it to a UTF-8 name"), "{err}");
}

/// A non-UTF-8 name that no weight pattern selects changes nothing.
#[test]
fn non_utf8_name_that_is_not_selected_is_harmless() {
    use std::os::unix::ffi::OsStrExt;
    let tmp = tiny_checkpoint();
    fs::write(
        tmp.path()
            .join(std::ffi::OsStr::from_bytes(b"notes-\xe9.txt")),
        b"x",
    )
    .unwrap();
    let out = wload_json(&["inspect", s(tmp.path()), "--json"]);
    assert_eq!(names_of(&out, "files"), ["model.safetensors"]);
}

/// Permission denied. Root reads a mode-000 file anyway (CAP_DAC_OVERRIDE), and CI runs as root:
/// there the binary is run as `nobody` (a copy in a world-readable folder, so that `nobody` can
/// execute it), so the same `EACCES` path is taken for every user.
#[test]
fn weight_file_without_read_permission_is_reported_by_name() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let tmp = tiny_checkpoint();
    fs::set_permissions(tmp.path(), fs::Permissions::from_mode(0o755)).unwrap();
    for f in ["config.json", "model.safetensors"] {
        fs::set_permissions(tmp.path().join(f), fs::Permissions::from_mode(0o644)).unwrap();
    }
    write_safetensors(
        &tmp.path().join("secret.safetensors"),
        &[("extra.weight", "F32", &[2], &zeros(8))],
    );
    fs::set_permissions(
        tmp.path().join("secret.safetensors"),
        fs::Permissions::from_mode(0o000),
    )
    .unwrap();
    let bin_dir = TempDir::new().unwrap();
    fs::set_permissions(bin_dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let bin = bin_dir.path().join("wload");
    fs::copy(env!("CARGO_BIN_EXE_wload"), &bin).unwrap();
    fs::set_permissions(&bin, fs::Permissions::from_mode(0o755)).unwrap();
    let mut cmd = std::process::Command::new(&bin);
    cmd.args(["inspect", s(tmp.path())])
        .env_remove("RUST_BACKTRACE");
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        cmd.uid(65534).gid(65534).env("HOME", "/");
    }
    let out = cmd.output().expect("wload runs");
    assert_refusal_text(
        &out,
        3,
        &["secret.safetensors: permission denied", "chmod a+r"],
    );
}

/// A dangling config.json is named as such, not reported as missing.
#[test]
fn dangling_config_link_is_reported_as_a_link() {
    let tmp = tiny_checkpoint();
    fs::remove_file(tmp.path().join("config.json")).unwrap();
    std::os::unix::fs::symlink("../blobs/cfg", tmp.path().join("config.json")).unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("config.json: symbolic link to '../blobs/cfg', which does not exist"),
        "{err}"
    );
    assert!(err.contains("vLLM reads it as the model config"), "{err}");
}

// ---- one home per fact (issue 10, item 2) ----

/// The index as Python's `json` reads it: escapes in names decoded, and a tensor named twice
/// keeps its last file, so a first entry naming a file that was never shipped does not count.
#[test]
fn index_with_escapes_and_a_repeated_name_reads_as_json_loads_does() {
    let tmp = tiny_checkpoint();
    fs::write(
        tmp.path().join("model.safetensors.index.json"),
        r#"{"metadata": {"total_size": 1e400}, "weight_map": {
            "lm_head.weight": "gone.safetensors",
            "model.embed_tokens.weight": "model\u002esafetensors",
            "model\u002enorm.weight": "model.safetensors",
            "lm_head.weight": "model.safetensors"
        }}"#,
    )
    .unwrap();
    let out = wload_json(&["inspect", s(tmp.path()), "--json"]);
    assert_eq!(names_of(&out, "files"), ["model.safetensors"]);
    assert_eq!(out["tensors"].as_array().unwrap().len(), 3);

    // The same repeat the other way round: the last file named is the one that must exist.
    fs::write(
        tmp.path().join("model.safetensors.index.json"),
        r#"{"weight_map": {"lm_head.weight": "model.safetensors", "lm_head.weight": "gone.safetensors"}}"#,
    )
    .unwrap();
    let err = inspect_fails_with_3(tmp.path());
    assert!(
        err.contains("weight files referenced in index but missing: gone.safetensors"),
        "{err}"
    );
}

/// Which files count as weights comes from one list: vLLM's formats and `.pth` get a line
/// saying why they are not read; another framework's weights and other files get none.
#[test]
fn weight_like_files_are_explained_and_others_ignored() {
    let tmp = tiny_checkpoint();
    fs::create_dir(tmp.path().join("original")).unwrap();
    for f in [
        "original/consolidated.pth",
        "training_args.bin",
        "extra.bin",
        "old.pt",
        "model.gguf",
        "tf_model.h5",
        "MODEL.BIN",
        "notes.txt",
    ] {
        fs::write(tmp.path().join(f), b"").unwrap();
    }
    let out = wload_json(&["inspect", s(tmp.path()), "--json"]);
    assert_eq!(names_of(&out, "files"), ["model.safetensors"]);
    let dropped: BTreeSet<(String, String)> = out["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| {
            let field = |k: &str| d[k].as_str().unwrap().to_string();
            (field("file"), field("reason"))
        })
        .collect();
    let want: BTreeSet<(String, String)> = [
        ("extra.bin", "*.safetensors matched first"),
        ("old.pt", "*.safetensors matched first"),
        ("training_args.bin", "training state, not weights"),
        (
            "original/consolidated.pth",
            "in a subfolder; vLLM reads only the top level",
        ),
    ]
    .into_iter()
    .map(|(f, r)| (f.to_string(), r.to_string()))
    .collect();
    assert_eq!(dropped, want);
}
