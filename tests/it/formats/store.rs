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
    // What was fetched, from where, each file once.
    let err = stderr(&out);
    let line = err
        .lines()
        .find(|l| l.contains("fetched"))
        .unwrap_or_default();
    assert!(line.starts_with(&format!("{url}: fetched ")), "{err}");
    let named = line.split(['(', ',', ')']).map(str::trim);
    assert_eq!(named.filter(|n| *n == "config.json").count(), 1, "{line}");
    same_outputs(&local, &remote);
    // Each byte of the weights read once: the data, the headers, the config and side files.
    let got = server.take_get_bytes();
    let weights = weight_bytes(&fixture);
    assert!(
        got < weights + 200_000 * 6 + 100_000,
        "read {got} of {weights}"
    );
}

/// `wload shard` of `source` into `out` (a path or URL) with the server's environment.
fn shard_with(server: &S3Server, source: &str, out: &str, extra: &[&str]) -> std::process::Output {
    let cache = tempfile::TempDir::new().unwrap();
    server
        .wload()
        .args([
            "shard",
            source,
            "-o",
            out,
            "--download-dir",
            s(cache.path()),
        ])
        .args(extra)
        .output()
        .unwrap()
}

/// Every golden case, sharded from the S3 server to the S3 server, is byte-identical to the same
/// case sharded from its folder to a folder (which the golden tests hold to vLLM's own files).
#[test]
fn every_golden_case_shards_from_s3_to_s3_as_from_a_folder() {
    let server = S3Server::start();
    let tmp = tempfile::TempDir::new().unwrap();
    let mut seen = std::collections::BTreeSet::new();
    for case in golden_cases() {
        let name = case
            .fixture
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        let key = format!("{name}-{}-{}-{:?}", case.tp, case.pp, case.flags);
        if !seen.insert(key.clone()) {
            continue;
        }
        let url = server.upload_dir(&case.fixture, &format!("src/{name}"));
        let tp = case.tp.to_string();
        let mut flags: Vec<&str> = vec!["--tp", &tp];
        flags.extend(case.flags.iter().map(String::as_str));
        let max;
        if let Some(m) = case.max_size {
            max = m.to_string();
            flags.extend(["--max-part-size", &max]);
        }
        let local = tmp.path().join(&key);
        let out = run(&[&["shard", s(&case.fixture), "-o", s(&local)][..], &flags].concat());
        assert!(out.status.success(), "{key}: {}", context(&out));
        let prefix = format!("out/{}", seen.len());
        let out = shard_with(&server, &url, &format!("s3://{BUCKET}/{prefix}"), &flags);
        assert!(out.status.success(), "{key}: {}", context(&out));
        same_outputs(&local, &server.folder(&prefix));
    }
    assert!(seen.len() >= 30, "only {} cases", seen.len());
}

#[test]
fn an_s3_output_names_the_streamer_in_its_serve_line_and_refuses_what_is_not_its_own() {
    let server = S3Server::start();
    let fixture = fixture("llama_gqa");
    let out_url = format!("s3://{BUCKET}/out");
    let out = shard_with(&server, s(&fixture), &out_url, &["--tp", "2"]);
    assert!(out.status.success(), "{}", context(&out));
    let record: serde_json::Value =
        serde_json::from_slice(&fs::read(server.folder("out").join("wload.json")).unwrap())
            .unwrap();
    let shell = record["serve"]["shell"].as_str().unwrap();
    assert!(
        shell.contains("vllm serve s3://models/out --load-format runai_streamer_sharded"),
        "{shell}"
    );
    // Again without --force: refused, nothing changed.
    let before = server.objects("out");
    let out = shard_with(&server, s(&fixture), &out_url, &["--tp", "2"]);
    assert_eq!(out.status.code(), Some(2), "{}", context(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--force"),
        "{}",
        context(&out)
    );
    // With --force, at another TP: the old ranks' files that the new output lacks are gone.
    let out = shard_with(&server, s(&fixture), &out_url, &["--tp", "1", "--force"]);
    assert!(out.status.success(), "{}", context(&out));
    let after = server.objects("out");
    assert!(after.contains(&"model-rank-0-part-0.safetensors".to_string()));
    assert!(
        !after.contains(&"model-rank-1-part-0.safetensors".to_string()),
        "{after:?}"
    );
    assert!(before.contains(&"model-rank-1-part-0.safetensors".to_string()));
    // A prefix that holds something else is never written to, even with --force.
    fs::create_dir_all(server.folder("mine")).unwrap();
    fs::write(server.folder("mine").join("notes.txt"), "mine").unwrap();
    let out = shard_with(
        &server,
        s(&fixture),
        &format!("s3://{BUCKET}/mine"),
        &["--tp", "2", "--force"],
    );
    assert_eq!(out.status.code(), Some(2), "{}", context(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("notes.txt"),
        "{}",
        context(&out)
    );
    assert_eq!(server.objects("mine"), vec!["notes.txt".to_string()]);
}

#[test]
fn split_runs_into_one_prefix_give_one_output_and_another_plan_is_refused() {
    let server = S3Server::start();
    let fixture = fixture("llama_gqa");
    let tmp = tempfile::TempDir::new().unwrap();
    let whole = tmp.path().join("whole");
    let out = run(&["shard", s(&fixture), "--tp", "4", "-o", s(&whole)]);
    assert!(out.status.success(), "{}", context(&out));
    let url = format!("s3://{BUCKET}/split");
    for ranks in ["0,1", "2-3"] {
        let out = shard_with(&server, s(&fixture), &url, &["--tp", "4", "--ranks", ranks]);
        assert!(out.status.success(), "{ranks}: {}", context(&out));
    }
    same_outputs(&whole, &server.folder("split"));
    // The output is no checkpoint: `plan` says what it is and how to serve it.
    let out = server
        .wload()
        .args(["plan", &url, "--tp", "4"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success()
            && err.contains("a pre-sharded folder")
            && err.contains("runai_streamer_sharded"),
        "{}",
        context(&out)
    );
    // The second run completed it: its records merged, as wload.json.
    assert!(server.objects("split").contains(&"wload.json".to_string()));
    // A run of the same prefix at another TP: refused before anything is uploaded.
    let before = server.objects("split");
    let out = shard_with(&server, s(&fixture), &url, &["--tp", "2", "--ranks", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", context(&out));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("another plan"),
        "{}",
        context(&out)
    );
    assert_eq!(server.objects("split"), before);
}

#[test]
fn a_throttling_store_is_retried_then_reported() {
    let server = S3Server::start();
    let fixture = fixture("llama_gqa");
    let url = server.upload_dir(&fixture, "llama");
    // Two 503s: within the 3 retries the test environment allows.
    server.throttle(2);
    let out = server.wload().args(["inspect", &url]).output().unwrap();
    assert!(out.status.success(), "{}", context(&out));
    // More than the retries: reported as the store's failure, exit 1.
    server.throttle(1000);
    let out = server.wload().args(["inspect", &url]).output().unwrap();
    server.throttle(0);
    assert_eq!(out.status.code(), Some(1), "{}", context(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("s3://models/llama") && err.contains("WLOAD_OBJECT_RETRIES"),
        "{err}"
    );
    assert!(!err.contains("test-secret"), "{err}");
}

#[test]
fn an_interrupted_upload_leaves_no_object() {
    let server = S3Server::start();
    let tmp = tempfile::TempDir::new().unwrap();
    // Files over one upload part (8 MiB), so that they go up as multipart uploads.
    let ck = tmp.path();
    let vocab: u64 = 1 << 20;
    let mut config = tiny_config();
    config["vocab_size"] = vocab.into();
    config["num_hidden_layers"] = 0.into();
    write_json(&ck.join("config.json"), &config);
    let big = zeros((vocab * 8 * 4) as usize);
    write_safetensors(
        &ck.join("model.safetensors"),
        &[
            ("model.embed_tokens.weight", "F32", &[vocab, 8], &big),
            ("model.norm.weight", "F32", &[8], &zeros(32)),
            ("lm_head.weight", "F32", &[vocab, 8], &big),
        ],
    );
    server.delay_parts(300);
    let mut child = server_process(&server)
        .args([
            "shard",
            s(ck),
            "--tp",
            "2",
            "-o",
            &format!("s3://{BUCKET}/cut"),
        ])
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let t = std::time::Instant::now();
    while server.parts() == 0 && t.elapsed() < std::time::Duration::from_secs(60) {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if server.parts() == 0 {
        child.kill().unwrap();
        panic!(
            "no part was uploaded: {}",
            context(&child.wait_with_output().unwrap())
        );
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(130), "{}", context(&out));
    server.delay_parts(0);
    assert_eq!(server.objects("cut"), Vec::<String>::new());
}

/// `wload` as a plain process, with the server's environment.
fn server_process(server: &S3Server) -> std::process::Command {
    let mut cmd = wload_process();
    for (k, v) in server.env() {
        cmd.env(k, v);
    }
    cmd
}

/// A Llama of a few MiB with distinct bytes everywhere (hidden 256, 2 layers, 4 heads, 2 KV heads,
/// intermediate 512, vocab 512, bf16): large enough that the headers and config every process
/// fetches are a small part of it.
fn mid_llama(dir: &Path) {
    let mut config = tiny_config();
    for (k, v) in [
        ("hidden_size", 256),
        ("intermediate_size", 512),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 2),
        ("num_hidden_layers", 2),
        ("vocab_size", 512),
    ] {
        config[k] = serde_json::json!(v);
    }
    config["dtype"] = serde_json::json!("bfloat16");
    write_json(&dir.join("config.json"), &config);
    let (h, i, kv, v) = (256u64, 512u64, 128u64, 512u64);
    let mut specs: Vec<(String, Vec<u64>)> = vec![("model.embed_tokens.weight".into(), vec![v, h])];
    for l in 0..2 {
        for (n, shape) in [
            ("self_attn.q_proj.weight", vec![h, h]),
            ("self_attn.k_proj.weight", vec![kv, h]),
            ("self_attn.v_proj.weight", vec![kv, h]),
            ("self_attn.o_proj.weight", vec![h, h]),
            ("mlp.gate_proj.weight", vec![i, h]),
            ("mlp.up_proj.weight", vec![i, h]),
            ("mlp.down_proj.weight", vec![h, i]),
            ("input_layernorm.weight", vec![h]),
            ("post_attention_layernorm.weight", vec![h]),
        ] {
            specs.push((format!("model.layers.{l}.{n}"), shape));
        }
    }
    specs.push(("model.norm.weight".into(), vec![h]));
    specs.push(("lm_head.weight".into(), vec![v, h]));
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let data: Vec<Vec<u8>> = (specs.iter())
        .map(|(_, sh)| {
            let n = 2 * sh.iter().product::<u64>() as usize;
            (0..n)
                .map(|_| {
                    seed ^= seed << 13;
                    seed ^= seed >> 7;
                    seed ^= seed << 17;
                    // Finite bf16 values: the high byte never makes an all-ones exponent.
                    (seed >> 56) as u8 & 0xbf
                })
                .collect()
        })
        .collect();
    let tensors: Vec<Tensor> = (specs.iter().zip(&data))
        .map(|((n, sh), d)| (n.as_str(), "BF16", sh.as_slice(), d.as_slice()))
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

/// Per rank, per tensor, the checksum `load --checksums --json` reports.
fn load_checksums(v: &serde_json::Value) -> Vec<(u64, String, String)> {
    let mut out = Vec::new();
    for r in v["ranks"].as_array().unwrap() {
        for t in r["checksums"].as_array().unwrap() {
            let (name, sum) = (t["name"].as_str().unwrap(), t["xxh3"].as_str().unwrap());
            out.push((
                r["rank"].as_u64().unwrap(),
                name.to_string(),
                sum.to_string(),
            ));
        }
    }
    out.sort();
    out
}

/// vLLM's workers load one rank each, in processes of their own, all at once: together they
/// fetch each byte of the checkpoint from the store once (a row-parallel weight's column slices
/// and the replicated tensors through the node cache), and every rank holds what a load of the
/// local folder holds.
#[test]
fn ranks_in_processes_of_their_own_fetch_each_byte_from_the_store_once() {
    let fixture = tempfile::TempDir::new().unwrap();
    mid_llama(fixture.path());
    let weights = weight_bytes(fixture.path());
    for tp in [2u64, 4] {
        let server = S3Server::start();
        let url = server.upload_dir(fixture.path(), "llama");
        let cache = tempfile::TempDir::new().unwrap();
        let tp_s = tp.to_string();
        let local = wload_json(&[
            "load",
            s(fixture.path()),
            "--tp",
            &tp_s,
            "--device",
            "cpu",
            "--checksums",
            "--json",
        ]);
        server.take_get_bytes();
        let children: Vec<_> = (0..tp)
            .map(|r| {
                server_process(&server)
                    .args(["load", &url, "--tp", &tp_s, "--ranks", &r.to_string()])
                    .args(["--device", "cpu", "--checksums", "--json"])
                    .args(["--download-dir", s(cache.path())])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let mut sums = Vec::new();
        for c in children {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "tp {tp}: {}", context(&out));
            let v: serde_json::Value = json_doc(&["load"], &out);
            let why = v["io"]["why"].as_str().unwrap_or_default().to_string();
            assert!(why.contains("node cache"), "tp {tp}: {why}");
            sums.extend(load_checksums(&v));
        }
        sums.sort();
        assert_eq!(sums, load_checksums(&local), "tp {tp}");
        let got = server.take_get_bytes();
        assert!(
            (got as f64) <= 1.05 * weights as f64,
            "tp {tp}: the ranks fetched {got} bytes of a {weights}-byte checkpoint ({:.3}x)",
            got as f64 / weights as f64
        );
    }
}

/// An object replaced after its header was read (between planning and reading, the moment a
/// sync or a re-upload would hit) fails the run naming it, and nothing is published: neither
/// from `shard` nor from rank processes reading through the node cache.
#[test]
fn an_object_replaced_mid_run_is_refused_and_nothing_is_published() {
    let fixture = tempfile::TempDir::new().unwrap();
    mid_llama(fixture.path());
    let server = S3Server::start();
    let url = server.upload_dir(fixture.path(), "llama");
    let object = server.folder("llama").join("model.safetensors");
    // Same length, other bytes: only the etag tells.
    let mut other = fs::read(&object).unwrap();
    let last = other.len() - 1;
    other[last] ^= 0x01;
    let replacement = fixture.path().join("replacement");
    fs::write(&replacement, &other).unwrap();
    let swap = format!("cp {} {}", s(&replacement), s(&object));
    let tmp = tempfile::TempDir::new().unwrap();
    let out_dir = tmp.path().join("out");
    let out = server_process(&server)
        .args(["shard", &url, "--tp", "2", "-o", s(&out_dir)])
        .args(["--download-dir", s(&tmp.path().join("cache"))])
        .env("WLOAD_TEST_AT_READ", &swap)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", context(&out));
    let err = stderr(&out);
    assert!(
        err.contains("model.safetensors") && err.contains("etag"),
        "{err}"
    );
    assert!(
        !out_dir.exists(),
        "a refused run published {}",
        out_dir.display()
    );
    // Rank processes: the node cache is filled before the swap, the direct reads after it fail.
    fs::copy(fixture.path().join("model.safetensors"), &object).unwrap();
    let out = server_process(&server)
        .args(["load", &url, "--tp", "2", "--ranks", "0", "--device", "cpu"])
        .args(["--download-dir", s(&tmp.path().join("cache"))])
        .env("WLOAD_TEST_AT_READ", &swap)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{}", context(&out));
    assert!(stderr(&out).contains("etag"), "{}", context(&out));
}

/// `wload shard SOURCE --tp 4 --ranks launcher -o OUT` with the server's environment and no
/// launcher's variables but `vars`.
fn shard_under_launcher(
    server: &S3Server,
    vars: &[(&str, &str)],
    source: &Path,
    out: &str,
) -> std::process::Output {
    let mut cmd = server.wload();
    for k in LAUNCHER_VARS {
        cmd.env_remove(k);
    }
    for (k, v) in vars {
        cmd.env(k, v);
    }
    cmd.args([
        "shard",
        s(source),
        "--tp",
        "4",
        "--ranks",
        "launcher",
        "-o",
        out,
    ])
    .output()
    .unwrap()
}

/// Two runs that take their share from the launcher (`--ranks launcher`, srun's variables) into
/// one prefix: the same files as one run; `wload.json` appears only when the second completes
/// the output, with the bytes a whole run writes; `inspect` of the prefix names the missing ranks
/// after the first (fetching records, config and headers only) and says complete after the
/// second, as it does of a local copy.
#[test]
fn launcher_split_runs_publish_wload_json_when_the_last_completes() {
    let server = S3Server::start();
    let fixture = fixture("llama_gqa");
    let tmp = tempfile::TempDir::new().unwrap();
    let whole = tmp.path().join("whole");
    let out = run(&["shard", s(&fixture), "--tp", "4", "-o", s(&whole)]);
    assert!(out.status.success(), "{}", context(&out));
    let url = format!("s3://{BUCKET}/runs");
    for (procid, ranks) in [("1", "2-3"), ("0", "0-1")] {
        let vars = [("SLURM_PROCID", procid), ("SLURM_NTASKS", "2")];
        let out = shard_under_launcher(&server, &vars, &fixture, &url);
        assert!(out.status.success(), "{procid}: {}", context(&out));
        let said = String::from_utf8_lossy(&out.stdout);
        let from = format!("ranks {ranks}: run ");
        assert!(
            said.contains(&from)
                && said.contains(&format!("srun (SLURM_PROCID={procid}, SLURM_NTASKS=2)")),
            "{said}"
        );
        let last = procid == "0";
        let objects = server.objects("runs");
        assert_eq!(
            objects.contains(&"wload.json".to_string()),
            last,
            "{objects:?}"
        );
        assert_eq!(said.contains("this run completed it"), last, "{said}");
        server.take_get_bytes();
        let out = server.wload().args(["inspect", &url]).output().unwrap();
        let got = server.take_get_bytes();
        let text = format!("{}{}", context(&out), String::from_utf8_lossy(&out.stdout));
        if last {
            assert!(out.status.success(), "{text}");
            assert!(
                text.contains("runai_streamer_sharded") && text.contains(&url),
                "{text}"
            );
        } else {
            assert_eq!(out.status.code(), Some(3), "{text}");
            assert!(text.contains("no files for ranks 0-1"), "{text}");
        }
        // The records, config.json and rank-file headers: a few KiB, no tensor data.
        assert!(got < 64 * 1024, "inspect fetched {got} bytes");
    }
    same_outputs(&whole, &server.folder("runs"));
    // wload.json is what one run of every rank into a prefix writes, byte for byte.
    let out = server
        .wload()
        .args([
            "shard",
            s(&fixture),
            "--tp",
            "4",
            "-o",
            &format!("s3://{BUCKET}/one"),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", context(&out));
    let text = |p: &str| String::from_utf8(fs::read(server.folder(p).join("wload.json")).unwrap());
    assert_eq!(
        text("runs").unwrap(),
        text("one")
            .unwrap()
            .replace("s3://models/one", "s3://models/runs")
    );
    // A local copy holding wload.json and both records: one complete output.
    let out = run(&["inspect", s(&server.folder("runs"))]);
    assert!(out.status.success(), "{}", context(&out));
    // A later run of ranks already recorded: refused, nothing changed.
    let before = server.objects("runs");
    let vars = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "2")];
    let out = shard_under_launcher(&server, &vars, &fixture, &url);
    assert_eq!(out.status.code(), Some(2), "{}", context(&out));
    assert_eq!(server.objects("runs"), before);
    // --force of a whole run takes wload.json and the records for its own: the records go.
    let out = server
        .wload()
        .args(["shard", s(&fixture), "--tp", "2", "--force", "-o", &url])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", context(&out));
    let after = server.objects("runs");
    assert!(
        after.contains(&"wload.json".to_string())
            && !after.iter().any(|n| n.starts_with("wload-ranks-")),
        "{after:?}"
    );
}

#[test]
fn a_launcher_share_that_does_not_fit_the_plan_is_refused_naming_its_variables() {
    let server = S3Server::start();
    let fixture = fixture("llama_gqa");
    let url = format!("s3://{BUCKET}/odd");
    let vars = [("SLURM_PROCID", "0"), ("SLURM_NTASKS", "3")];
    let out = shard_under_launcher(&server, &vars, &fixture, &url);
    assert_eq!(out.status.code(), Some(2), "{}", context(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("SLURM_NTASKS=3") && err.contains("--tp 4"),
        "{err}"
    );
    assert!(server.objects("odd").is_empty());
}
