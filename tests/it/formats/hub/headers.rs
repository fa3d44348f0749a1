//! Header-only hub sources: `inspect`, `plan`, `sizes` and `load --dry-run` of a repo id fetch
//! the safetensors headers of the weight files with `Range` requests, never their tensor data;
//! the results equal those of the same checkpoint as a local folder; a second run needs no
//! server; a server that ignores `Range` costs no more than a header and what the socket held; a
//! header length that lies is refused naming the file; `shard` still downloads whole files.
//!
//! The repo's weight files are large (about 120 MiB together) but mostly zeros: the server holds
//! them as lazily zeroed memory and the local copy is written sparse, so the test stays fast.

use super::*;

const BIG: &str = "acme/big-llama";
const BIG_SHA: &str = "fedcba9876543210fedcba9876543210fedcba98";
const FILES: [&str; 3] = [
    "model-00001-of-00003.safetensors",
    "model-00002-of-00003.safetensors",
    "model-00003-of-00003.safetensors",
];

/// A two-layer Llama (hidden 1024, 8 heads, 2 KV heads, intermediate 4096, vocab 16384), BF16:
/// each file's tensors as name and shape.
fn big_specs() -> [Vec<(String, Vec<u64>)>; 3] {
    let layer = |i: u64| -> Vec<(String, Vec<u64>)> {
        [
            ("self_attn.q_proj.weight", vec![1024, 1024]),
            ("self_attn.k_proj.weight", vec![256, 1024]),
            ("self_attn.v_proj.weight", vec![256, 1024]),
            ("self_attn.o_proj.weight", vec![1024, 1024]),
            ("mlp.gate_proj.weight", vec![4096, 1024]),
            ("mlp.up_proj.weight", vec![4096, 1024]),
            ("mlp.down_proj.weight", vec![1024, 4096]),
            ("input_layernorm.weight", vec![1024]),
            ("post_attention_layernorm.weight", vec![1024]),
        ]
        .into_iter()
        .map(|(n, s)| (format!("model.layers.{i}.{n}"), s))
        .collect()
    };
    let mut last = layer(1);
    last.push(("model.norm.weight".into(), vec![1024]));
    last.push(("lm_head.weight".into(), vec![16384, 1024]));
    [
        vec![("model.embed_tokens.weight".into(), vec![16384, 1024])],
        layer(0),
        last,
    ]
}

/// One file: its header (padded to 8 bytes) and its whole length; `pad` bytes of metadata make
/// the header longer than the first range asked for.
fn big_header(tensors: &[(String, Vec<u64>)], pad: usize) -> (Vec<u8>, u64) {
    let mut header = serde_json::Map::new();
    header.insert(
        "__metadata__".into(),
        json!({"format": "pt", "pad": "x".repeat(pad)}),
    );
    let mut at = 0u64;
    for (name, shape) in tensors {
        let len = 2 * shape.iter().product::<u64>();
        header.insert(
            name.clone(),
            json!({"dtype": "BF16", "shape": shape, "data_offsets": [at, at + len]}),
        );
        at += len;
    }
    let mut text = serde_json::to_vec(&Value::Object(header)).unwrap();
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    let mut prefix = (text.len() as u64).to_le_bytes().to_vec();
    prefix.extend_from_slice(&text);
    let total = prefix.len() as u64 + at;
    (prefix, total)
}

fn big_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "num_hidden_layers": 2,
        "vocab_size": 16384,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false,
        "dtype": "bfloat16"
    })
}

fn big_index() -> Value {
    let mut map = serde_json::Map::new();
    for (file, specs) in FILES.iter().zip(big_specs()) {
        for (name, _) in specs {
            map.insert(name, json!(file));
        }
    }
    json!({"metadata": {}, "weight_map": map})
}

/// The repo on the hub (`lie` edits the second file's header bytes) and the same checkpoint as
/// a local folder, written sparse.
fn big_repo(lie: impl Fn(&mut Vec<u8>)) -> (HubRepo, TempDir, u64) {
    let local = TempDir::new().unwrap();
    let mut files = BTreeMap::new();
    let mut total = 0;
    for (i, (name, specs)) in FILES.iter().zip(big_specs()).enumerate() {
        // The last file's header is longer than the first range (100,000 bytes).
        let (mut prefix, len) = big_header(&specs, if i == 2 { 150_000 } else { 0 });
        if i == 1 {
            lie(&mut prefix);
        }
        total += len;
        // Zeroed memory is not touched until written: only the header's pages are.
        let mut data = vec![0u8; len as usize];
        data[..prefix.len()].copy_from_slice(&prefix);
        files.insert(name.to_string(), data);
        let f = fs::File::create(local.path().join(name)).unwrap();
        f.write_all_at(&prefix, 0).unwrap();
        f.set_len(len).unwrap();
    }
    for (name, v) in [
        ("config.json", big_config()),
        ("model.safetensors.index.json", big_index()),
    ] {
        let text = serde_json::to_vec_pretty(&v).unwrap();
        fs::write(local.path().join(name), &text).unwrap();
        files.insert(name.to_string(), text);
    }
    let repo = HubRepo {
        sha: BIG_SHA.into(),
        files,
        token: None,
        aliases: BTreeSet::new(),
    };
    (repo, local, total)
}

use std::os::unix::fs::FileExt;

/// `v` without what says where it came from or how long it took (and each file's origin).
fn facts(mut v: Value) -> Value {
    let o = v.as_object_mut().unwrap();
    for k in ["source", "timings", "hub", "hub_fetched", "wload_version"] {
        o.remove(k);
    }
    if let Some(files) = o.get_mut("files").and_then(Value::as_array_mut) {
        for f in files {
            f.as_object_mut().unwrap().remove("origin");
        }
    }
    v
}

/// The commands that read no tensor data, with their JSON flag.
const COMMANDS: [&[&str]; 3] = [
    &["sizes", "--json"],
    &["plan", "--tp", "2", "--json"],
    &["inspect", "--json"],
];

fn args<'a>(cmd: &[&'a str], source: &'a str) -> Vec<&'a str> {
    let mut a = vec![cmd[0], source];
    a.extend_from_slice(&cmd[1..]);
    a
}

/// What the run says it fetched (`hub.fetched` in `inspect`, `hub_fetched` elsewhere).
fn fetched(v: &Value) -> &Value {
    match v.get("hub_fetched") {
        Some(f) => f,
        None => &v["hub"]["fetched"],
    }
}

/// The header length (first 8 bytes) of `file` as the hub holds it.
fn hub_file(hub: &Hub, file: &str) -> [u8; 8] {
    hub.shared.repos[BIG].files[file][..8].try_into().unwrap()
}

fn weights_served(hub: &Hub) -> u64 {
    let served = hub.served();
    FILES.iter().filter_map(|f| served.get(*f)).sum()
}

#[test]
fn headers_only_commands_fetch_headers_and_agree_with_the_local_folder() {
    let (repo, local, total) = big_repo(|_| {});
    let mut hub = Hub::start(one_repo(BIG, repo));
    let home = TempDir::new().unwrap();
    let mut served_before = 0;
    for (i, cmd) in COMMANDS.iter().enumerate() {
        let remote = ok_json(&mut wload_hub(Some(&hub), home.path()), &args(cmd, BIG));
        let f = fetched(&remote);
        // Only the first run fetches the headers; later ones find them kept.
        let (files, headers) = if i == 0 { (3, true) } else { (0, false) };
        assert_eq!(f["header_files"], files, "{cmd:?}: {f:#}");
        assert_eq!(f["tensor_data_bytes"], 0, "{cmd:?}: {f:#}");
        let header_bytes = f["header_bytes"].as_u64().unwrap();
        // Exactly what the server sent of the weight files: headers only.
        let served = weights_served(&hub);
        assert_eq!(header_bytes, served - served_before, "{cmd:?}");
        served_before = served;
        if headers {
            // One speculative range of 100,000 bytes per file, and the rest of the long header.
            assert!(
                header_bytes > 0 && header_bytes <= 3 * 100_000 + 60_000,
                "{header_bytes} B of {total}"
            );
            let long = hub.transfers(FILES[2]);
            let end = 8 + u64::from_le_bytes(hub_file(&hub, FILES[2])) - 1;
            assert_eq!(
                long,
                [
                    Some("bytes=0-99999".to_string()),
                    Some(format!("bytes=100000-{end}"))
                ]
            );
        }
        let local = ok_json(&mut wload(), &args(cmd, local.path().to_str().unwrap()));
        assert_eq!(facts(remote), facts(local), "{cmd:?}");
    }
    // Nothing in the cache is a weight file, whole or in part, anywhere vLLM would look.
    let cache = home.path().join("hub");
    for (path, len) in files_under(&cache) {
        assert!(len < 1 << 20, "{} is {len} bytes", path.display());
    }
    let rd = cache.join("models--acme--big-llama");
    for f in FILES {
        assert!(!rd.join("snapshots").join(BIG_SHA).join(f).exists(), "{f}");
    }
    // Offline, and then with no server at all: the same answers, nothing fetched.
    let mut offline = wload_hub(Some(&hub), home.path());
    offline.env("HF_HUB_OFFLINE", "1");
    let v = ok_json(&mut offline, &["plan", BIG, "--tp", "2", "--json"]);
    assert_eq!(fetched(&v)["bytes"], 0);
    hub.stop();
    for cmd in COMMANDS {
        let line = args(cmd, BIG);
        let out = run(&mut wload_hub(Some(&hub), home.path()), &line);
        assert!(out.status.success(), "{cmd:?}: {}", context(&out));
        let v = json_doc(&line, &out);
        assert_eq!(fetched(&v)["bytes"], 0, "{cmd:?}");
        assert!(
            stderr(&out).contains("hub: fetched 0 B"),
            "{}",
            context(&out)
        );
    }
}

#[test]
fn load_dry_run_fetches_headers_and_says_so() {
    let (repo, _local, _) = big_repo(|_| {});
    let hub = Hub::start(one_repo(BIG, repo));
    let home = TempDir::new().unwrap();
    let out = run(
        &mut wload_hub(Some(&hub), home.path()),
        &["load", BIG, "--tp", "2", "--dry-run", "--json"],
    );
    assert!(out.status.success(), "{}", context(&out));
    let v: Value = json_doc(&["load"], &out);
    assert_eq!(v["hub_fetched"]["header_files"], 3, "{v:#}");
    assert_eq!(v["hub_fetched"]["tensor_data_bytes"], 0);
    assert_eq!(
        v["hub_fetched"]["header_bytes"].as_u64().unwrap(),
        weights_served(&hub)
    );
    let line = stderr(&out);
    assert!(
        line.contains("hub: fetched ")
            && line.contains("(headers of 3 files, ")
            && line.contains("0 B of tensor data"),
        "{line}"
    );
}

#[test]
fn a_server_that_ignores_range_costs_only_the_header() {
    let (repo, local, total) = big_repo(|_| {});
    let hub = Hub::start(one_repo(BIG, repo));
    hub.ignore_range();
    let home = TempDir::new().unwrap();
    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["sizes", BIG, "--json"],
    );
    let f = fetched(&v);
    assert_eq!(f["header_files"], 3);
    // Read as far as the header goes (the first range, or the long header), then the
    // connection dropped.
    assert!(
        f["header_bytes"].as_u64().unwrap() <= 3 * 100_000 + 60_000,
        "{f:#}"
    );
    // What the server got into the socket before it was closed: far from the files.
    let served = weights_served(&hub);
    assert!(served < total / 4, "{served} of {total} bytes served");
    let local = ok_json(&mut wload(), &["sizes", s(local.path()), "--json"]);
    assert_eq!(facts(v), facts(local));
}

#[test]
fn a_header_length_past_the_file_is_refused_naming_it() {
    let (repo, _local, _) = big_repo(|prefix| {
        prefix[..8].copy_from_slice(&90_000_000u64.to_le_bytes());
    });
    let hub = Hub::start(one_repo(BIG, repo));
    let home = TempDir::new().unwrap();
    let err = fails_with(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", BIG],
        3,
    );
    assert!(
        err.contains(FILES[1]) && err.contains("header length 90000000 runs past the end"),
        "{err}"
    );
    assert!(weights_served(&hub) < 1 << 20);
}

#[test]
fn shard_still_downloads_the_files() {
    let (repo, local, total) = big_repo(|_| {});
    let hub = Hub::start(one_repo(BIG, repo));
    let home = TempDir::new().unwrap();
    let out_dir = TempDir::new().unwrap();
    let from_hub = out_dir.path().join("hub");
    let from_local = out_dir.path().join("local");
    let out = run(
        &mut wload_hub(Some(&hub), home.path()),
        &["shard", BIG, "--tp", "2", "-o", s(&from_hub)],
    );
    assert!(out.status.success(), "{}", context(&out));
    assert!(
        stderr(&out).contains("of tensor data") && weights_served(&hub) == total,
        "{}",
        context(&out)
    );
    shard_ok(local.path(), 2, &from_local, &[]);
    for r in 0..2 {
        let name = format!("model-rank-{r}-part-0.safetensors");
        assert!(
            fs::read(from_hub.join(&name)).unwrap() == fs::read(from_local.join(&name)).unwrap(),
            "{name} differs"
        );
    }
}

/// A range answer that disagrees with what was asked (another total size than the file's) is
/// refused naming the file and the header; nothing of it is kept.
#[test]
fn a_range_answer_that_disagrees_is_refused_naming_the_file() {
    let (repo, _local, _) = big_repo(|_| {});
    let refused = etag(&repo.files[FILES[0]]);
    let hub = Hub::start(one_repo(BIG, repo));
    hub.hook(Box::new(|seen, reply| {
        let ours = seen.method == "GET" && resolved_file(&seen.path).as_deref() == Some(FILES[0]);
        ours.then(|| {
            let mut head: Vec<(&str, String)> = (reply.1.iter())
                .filter(|(k, _)| *k != "Content-Range")
                .map(|(k, v)| (*k, v.clone()))
                .collect();
            let n = reply.2.len();
            head.push(("Content-Range", format!("bytes 0-{}/{}", n - 1, 1u64 << 40)));
            head.push(("Content-Length", n.to_string()));
            raw(206, &head, &reply.2)
        })
    }));
    let home = TempDir::new().unwrap();
    let err = fails_with(&mut wload_hub(Some(&hub), home.path()), &["sizes", BIG], 1);
    assert!(
        err.contains(FILES[0]) && err.contains("header") && err.contains("Content-Range"),
        "{err}"
    );
    let kept = home
        .path()
        .join("hub/models--acme--big-llama/wload-headers/blobs");
    assert!(!kept.join(refused).exists());
}

/// The commit record of the header cache is read as every small file is: a named pipe or a link
/// to /dev/zero in its place neither hangs nor fills memory. Offline it is refused by name (it
/// is why nothing is cached); online the hub is asked again and the record replaced.
#[test]
fn a_commit_record_that_is_not_a_file_is_refused_offline_and_replaced_online() {
    let (repo, _local, _) = big_repo(|_| {});
    let hub = Hub::start(one_repo(BIG, repo));
    let home = TempDir::new().unwrap();
    ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", BIG, "--json"],
    );
    let record = home
        .path()
        .join("hub/models--acme--big-llama/wload-headers/commits")
        .join(format!("{BIG_SHA}.json"));
    assert!(record.is_file(), "{} was not written", record.display());
    let fifo = |p: &Path| {
        let c = std::ffi::CString::new(p.to_str().unwrap()).unwrap();
        // SAFETY: a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    };
    type Make<'a> = &'a dyn Fn(&Path);
    let bad: [(&str, Make); 3] = [
        ("a named pipe", &fifo),
        ("a device", &|p: &Path| {
            std::os::unix::fs::symlink("/dev/zero", p).unwrap()
        }),
        ("not wload's JSON", &|p: &Path| {
            fs::write(p, b"{\"x\":").unwrap()
        }),
    ];
    for (what, make) in bad {
        fs::remove_file(&record).unwrap();
        make(&record);
        let mut offline = wload_hub(Some(&hub), home.path());
        offline
            .env("HF_HUB_OFFLINE", "1")
            .timeout(Duration::from_secs(20));
        let err = fails_with(&mut offline, &["inspect", BIG], 1);
        assert!(
            err.contains(&record.display().to_string())
                && err.contains(what)
                && err.contains("remove it"),
            "{what}: {err}"
        );
        // Online, the hub is asked again and the record written over the bad one, so that
        // the next offline run works.
        let mut online = wload_hub(Some(&hub), home.path());
        online.timeout(Duration::from_secs(20));
        ok_json(&mut online, &["inspect", BIG, "--json"]);
        let meta = fs::symlink_metadata(&record).unwrap();
        assert!(meta.is_file(), "{what}: the record was not replaced");
        let mut offline = wload_hub(Some(&hub), home.path());
        offline.env("HF_HUB_OFFLINE", "1");
        ok_json(&mut offline, &["inspect", BIG, "--json"]);
    }
}
