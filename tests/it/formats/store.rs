//! Object storage (`s3://…`) as SOURCE and as OUT, against a real S3-protocol server on
//! 127.0.0.1 (`support::S3Server`, which counts the bytes it sends).

use std::fs;
use std::path::Path;

use crate::support::*;

/// Every file of `a` and `b` but the run records is the same, byte for byte.
fn same_outputs(a: &Path, b: &Path) {
    let names = |d: &Path| -> Vec<String> {
        let mut v: Vec<String> = fs::read_dir(d)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| !n.starts_with("wload"))
            .collect();
        v.sort();
        v
    };
    assert_eq!(names(a), names(b), "{} vs {}", a.display(), b.display());
    for n in names(a) {
        assert!(
            fs::read(a.join(&n)).unwrap() == fs::read(b.join(&n)).unwrap(),
            "{n} differs between {} and {}",
            a.display(),
            b.display()
        );
    }
}

fn weight_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_name().to_string_lossy().ends_with(".safetensors"))
        .map(|e| e.metadata().unwrap().len())
        .sum()
}

#[test]
fn inspect_plan_and_sizes_of_an_s3_source_fetch_only_headers() {
    let server = S3Server::start();
    let fixture = fixture("llama_gqa");
    let url = server.upload_dir(&fixture, "llama");
    let cache = tempfile::TempDir::new().unwrap();
    let weights = weight_bytes(&fixture);
    for args in [
        vec!["inspect", &url],
        vec!["plan", &url, "--tp", "2"],
        vec!["sizes", &url],
        vec!["load", &url, "--tp", "2", "--dry-run"],
    ] {
        server.take_get_bytes();
        let out = server
            .wload()
            .args(&args)
            .args(["--download-dir", s(cache.path())])
            .output()
            .unwrap();
        assert!(out.status.success(), "{args:?}: {}", context(&out));
        let got = server.take_get_bytes();
        let len = |n: &str| fs::metadata(fixture.join(n)).unwrap().len();
        let headers: u64 = (fs::read_dir(&fixture).unwrap())
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|x| x == "safetensors"))
            .map(|p| {
                let b = fs::read(p).unwrap();
                8 + u64::from_le_bytes(b[..8].try_into().unwrap())
            })
            .sum();
        // Exactly: each weight file's length prefix and header, the config and the index.
        let expected = headers + len("config.json") + len("model.safetensors.index.json");
        assert_eq!(
            got, expected,
            "{args:?}: the server sent {got} bytes (weights {weights})"
        );
    }
}

#[test]
fn shard_from_s3_equals_shard_from_the_folder() {
    let server = S3Server::start();
    let fixture = fixture("llama_gqa");
    let url = server.upload_dir(&fixture, "llama");
    let cache = tempfile::TempDir::new().unwrap();
    let tmp = tempfile::TempDir::new().unwrap();
    let local = tmp.path().join("local");
    let remote = tmp.path().join("remote");
    let out = run(&["shard", s(&fixture), "--tp", "2", "-o", s(&local)]);
    assert!(out.status.success(), "{}", context(&out));
    server.take_get_bytes();
    let out = server
        .wload()
        .args(["shard", &url, "--tp", "2", "-o", s(&remote)])
        .args(["--download-dir", s(cache.path())])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", context(&out));
    same_outputs(&local, &remote);
    // Each byte of the weights read once: the data, the headers, the config and side files.
    let got = server.take_get_bytes();
    let weights = weight_bytes(&fixture);
    assert!(
        got < weights + 200_000 * 6 + 100_000,
        "read {got} of {weights}"
    );
}
