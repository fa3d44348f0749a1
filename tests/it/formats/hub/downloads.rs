//! What is downloaded, cached, resumed and reused; the cache folder; revisions and local folders.

use super::*;

// ---------------------------------------------------------------------------------------------
// Tests

/// Only the index, the shards it lists and the side files are downloaded, into the cache layout
/// huggingface_hub uses; the shard output is vLLM's; a second run downloads nothing.
#[test]
fn downloads_only_what_vllm_reads() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    let home = TempDir::new().unwrap();
    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--json"],
    );
    // Only the weights' headers: `inspect` reads no tensor data.
    assert_eq!(origins(&v), all("header"), "{v:#}");
    assert_eq!(v["hub"]["fetched"]["tensor_data_bytes"], 0);
    assert_eq!(v["source"], REPO);
    assert_eq!(v["hub"]["commit"], SHA);
    assert_eq!(v["hub"]["revision"], "main");
    assert_eq!(v["hub"]["offline"], false);
    assert_eq!(v["format"]["index"], "model.safetensors.index.json");
    let dropped: BTreeSet<String> = v["dropped"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["file"].as_str().unwrap().to_string())
        .collect();
    assert!(
        dropped.contains("model-extra.safetensors") && dropped.contains("pytorch_model.bin"),
        "the repo's other weights are listed as not read: {dropped:?}"
    );
    // `inspect` reads no side file, so fetches none; of the shards, their metadata and headers.
    assert_eq!(hub.resolved(), read_set());
    let downloaded: BTreeSet<String> = v["hub"]["downloaded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    assert_eq!(
        downloaded,
        set(&["model.safetensors.index.json", "config.json"])
    );
    let api: Vec<String> = hub
        .seen()
        .iter()
        .filter(|s| s.path.starts_with("/api/"))
        .map(|s| s.path.clone())
        .collect();
    assert_eq!(api, [format!("/api/models/{REPO}/revision/main")]);
    assert!(hub.seen().iter().all(|s| s.auth.is_none()));
    // A command that reads the data downloads the shards, and only them.
    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &["--json"]),
    );
    assert_eq!(fetched_files(&v), set(&SHARDS));

    // The layout Python's huggingface_hub writes: refs/main → commit, snapshot links → blobs.
    let cache = home.path().join("hub");
    let rd = repo_dir(&cache);
    assert_eq!(fs::read_to_string(rd.join("refs/main")).unwrap(), SHA);
    assert!(
        !rd.join("refs").join(SHA).exists(),
        "no ref named by a commit"
    );
    let repo = llama_repo();
    for f in read_set() {
        let link = rd.join("snapshots").join(SHA).join(&f);
        let target = fs::read_link(&link).unwrap_or_else(|e| panic!("{f}: {e}"));
        let tag = etag(&repo.files[&f]);
        assert_eq!(target, Path::new("../../blobs").join(&tag), "{f}");
        assert_eq!(fs::read(&link).unwrap(), repo.files[&f], "{f}");
    }
    let leftovers: Vec<String> = fs::read_dir(rd.join("blobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part") || n.ends_with(".incomplete"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // `shard` copies the side files: it downloads them, and only them.
    hub.forget();
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = run(
        &mut wload_hub(Some(&hub), home.path()),
        &["shard", REPO, "--tp", "2", "-o", s(&out), "-q"],
    );
    assert!(o.status.success(), "{}", context(&o));
    assert_golden_tp2(&out);
    assert_eq!(hub.resolved(), side_only());
    // Another run: the hub is asked for the revision's commit only; every file is cached.
    hub.forget();
    let out = work.path().join("out2");
    let o = run(
        &mut wload_hub(Some(&hub), home.path()),
        &["shard", REPO, "--tp", "2", "-o", s(&out), "-q"],
    );
    assert!(o.status.success(), "{}", context(&o));
    assert_eq!(hub.resolved(), BTreeSet::new());
    assert_eq!(hub.seen().len(), 1, "{:?}", hub.seen());
    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(origins(&v), all("cache"));
    assert_eq!(v["hub"]["downloaded"], json!([]));

    // The human report says where each file came from.
    let o = run(&mut wload_hub(Some(&hub), home.path()), &["inspect", REPO]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{}", context(&o));
    assert!(text.contains("FROM") && text.contains("cache"), "{text}");
    assert!(text.contains(SHA), "{text}");
}

/// `plan`, `shard` and `load` take repo ids too; with the hub gone, the cache answers.
#[test]
fn second_run_needs_no_server() {
    let mut hub = Hub::start(one_repo(REPO, llama_repo()));
    let home = TempDir::new().unwrap();
    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["plan", REPO, "--tp", "2", "--json"],
    );
    assert_eq!(v["tp"], 2);
    assert_eq!(hub.resolved(), read_set());
    // The side files come with the first `shard`.
    let work = TempDir::new().unwrap();
    let o = run(
        &mut wload_hub(Some(&hub), home.path()),
        &[
            "shard",
            REPO,
            "--tp",
            "2",
            "-o",
            s(&work.path().join("first")),
            "-q",
        ],
    );
    assert!(o.status.success(), "{}", context(&o));
    assert_eq!(hub.resolved(), expected_downloads());
    hub.stop();

    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(origins(&v), all("cache"));
    assert!(
        v["hub"]["note"].as_str().is_some_and(|n| !n.is_empty()),
        "says the hub was not reachable: {v:#}"
    );
    let v = ok_json(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_OFFLINE", "1"),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(origins(&v), all("cache"));
    assert_eq!(v["hub"]["offline"], true);
    assert!(v["hub"].get("note").is_none(), "{v:#}");

    let out = work.path().join("out");
    let o = run(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_OFFLINE", "1"),
        &["shard", REPO, "--tp", "2", "-o", s(&out), "-q"],
    );
    assert!(o.status.success(), "{}", context(&o));
    assert_golden_tp2(&out);

    let o = run(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_OFFLINE", "1"),
        &["load", REPO, "--tp", "2", "--dry-run", "--read"],
    );
    assert!(o.status.success(), "{}", context(&o));
}

/// Offline, a needed file missing from the cache is named, with the repo, and nothing is asked
/// of the hub (which is running).
#[test]
fn offline_names_the_missing_file() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    let home = TempDir::new().unwrap();
    ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &["--json"]),
    );
    hub.forget();
    let snap = repo_dir(&home.path().join("hub"))
        .join("snapshots")
        .join(SHA);

    // A shard's link removed.
    fs::remove_file(snap.join(SHARDS[2])).unwrap();
    let err = fails_with(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_OFFLINE", "1"),
        &["inspect", REPO],
        1,
    );
    assert!(err.contains(SHARDS[2]) && err.contains(REPO), "{err}");
    assert!(err.contains("HF_HUB_OFFLINE"), "{err}");
    // The blob of a side file removed (its link dangles).
    let config = fs::canonicalize(snap.join("config.json")).unwrap();
    fs::remove_file(config).unwrap();
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let err = fails_with(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_OFFLINE", "1"),
        &["shard", REPO, "--tp", "2", "-o", s(&out)],
        1,
    );
    assert!(!out.exists());
    assert!(err.contains("config.json"), "{err}");
    assert!(
        hub.seen().is_empty(),
        "offline made requests: {:?}",
        hub.seen()
    );

    // A revision never fetched.
    let err = fails_with(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_OFFLINE", "1"),
        &["inspect", REPO, "--revision", "v2"],
        1,
    );
    assert!(err.contains("not in the Hugging Face cache"), "{err}");
    assert!(hub.seen().is_empty());

    // Online again, only what is missing is asked for: the shard whose blob is still there is
    // linked again, the config whose blob is gone is downloaded (over its dangling link).
    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(hub.resolved(), set(&[SHARDS[2], "config.json"]));
    assert_eq!(origins(&v)[SHARDS[2]], "cache");
    assert_eq!(v["hub"]["downloaded"], json!(["config.json"]));
    assert_eq!(origins(&v)[SHARDS[0]], "cache");
}

/// Unknown repos and revisions (404) and gated repos (401) fail with exit 1 and say what to do;
/// HF_TOKEN opens the gated one.
#[test]
fn unknown_and_gated_repos() {
    let mut gated = llama_repo();
    gated.token = Some("hf_secret".into());
    let mut repos = one_repo(REPO, llama_repo());
    repos.insert("acme/gated".into(), gated);
    let hub = Hub::start(repos);
    let home = TempDir::new().unwrap();

    let err = fails_with(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", "acme/nothing-here"],
        1,
    );
    assert!(
        err.contains("acme/nothing-here") && err.contains("not found"),
        "{err}"
    );
    let err = fails_with(
        &mut wload_hub(Some(&hub), home.path()),
        &["plan", REPO, "--tp", "2", "--revision", "no-such-branch"],
        1,
    );
    assert!(err.contains("no-such-branch"), "{err}");

    let err = fails_with(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", "acme/gated"],
        1,
    );
    assert!(
        err.contains("acme/gated") && err.contains("401") && err.contains("HF_TOKEN"),
        "{err}"
    );
    let err = fails_with(
        wload_hub(Some(&hub), home.path()).env("HF_TOKEN", "hf_wrong"),
        &["inspect", "acme/gated"],
        1,
    );
    assert!(err.contains("HF_TOKEN is set"), "{err}");

    hub.forget();
    let v = ok_json(
        wload_hub(Some(&hub), home.path()).env("HF_TOKEN", "hf_secret"),
        &["inspect", "acme/gated", "--json"],
    );
    assert_eq!(origins(&v), all("header"));
    assert!(
        hub.seen()
            .iter()
            .all(|s| s.auth.as_deref() == Some("Bearer hf_secret")),
        "{:?}",
        hub.seen()
    );
    // The token file `hf auth login` writes is read too.
    fs::write(home.path().join("token"), "hf_secret\n").unwrap();
    let other = TempDir::new().unwrap();
    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &[
            "inspect",
            "acme/gated",
            "--download-dir",
            s(other.path()),
            "--json",
        ],
    );
    assert_eq!(origins(&v), all("header"));

    // A hub that is not there at all, with nothing cached.
    let mut gone = Hub::start(BTreeMap::new());
    gone.stop();
    let empty = TempDir::new().unwrap();
    let err = fails_with(
        &mut wload_hub(Some(&gone), empty.path()),
        &["inspect", REPO],
        1,
    );
    assert!(err.contains("cannot reach") && err.contains(REPO), "{err}");
}

/// Partial downloads are resumed with a Range request: huggingface_hub's `<etag>.incomplete`
/// and hf-hub's `<etag>.part`; a complete partial file (stopped before its rename) is taken as it
/// is, as huggingface_hub does, without transferring it again.
#[test]
fn interrupted_downloads_resume() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    let home = TempDir::new().unwrap();
    let repo = llama_repo();
    let blobs = repo_dir(&home.path().join("hub")).join("blobs");
    fs::create_dir_all(&blobs).unwrap();
    let partial = |file: &str, suffix: &str, len: usize| {
        let data = &repo.files[file];
        fs::write(
            blobs.join(format!("{}.{suffix}", etag(data))),
            &data[..len.min(data.len())],
        )
        .unwrap();
        data.len()
    };
    let half0 = partial(SHARDS[0], "incomplete", usize::MAX) / 2;
    partial(SHARDS[0], "incomplete", half0);
    let third1 = partial(SHARDS[1], "part", usize::MAX) / 3;
    partial(SHARDS[1], "part", third1);
    partial(SHARDS[2], "part", usize::MAX);

    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &["--json"]),
    );
    assert_eq!(fetched_files(&v), read_set());
    let ranges: BTreeMap<String, Vec<String>> =
        hub.seen().iter().fold(BTreeMap::new(), |mut m, s| {
            if let (Some((_, rest)), Some(r)) = (s.path.split_once("/resolve/"), &s.range) {
                let file = rest.split_once('/').unwrap().1.to_string();
                m.entry(file).or_default().push(r.clone());
            }
            m
        });
    assert!(
        ranges[SHARDS[0]].contains(&format!("bytes={half0}-")),
        "{ranges:?}"
    );
    assert!(
        ranges[SHARDS[1]].contains(&format!("bytes={third1}-")),
        "{ranges:?}"
    );
    assert!(
        ranges[SHARDS[3]].contains(&"bytes=0-".to_string()),
        "{ranges:?}"
    );
    assert!(!ranges.contains_key(SHARDS[2]), "{ranges:?}");
    for f in SHARDS {
        let data = &repo.files[f];
        assert_eq!(fs::read(blobs.join(etag(data))).unwrap(), *data, "{f}");
    }
    let leftovers: Vec<String> = fs::read_dir(&blobs)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".part") || n.ends_with(".incomplete"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

/// A transfer that breaks off is resumed by the same run, from where it stopped.
#[test]
fn broken_transfer_resumes_in_the_same_run() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    hub.cut_once(SHARDS[0]);
    let home = TempDir::new().unwrap();
    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &["--json"]),
    );
    assert_eq!(fetched_files(&v), read_set());
    let repo = llama_repo();
    let data = &repo.files[SHARDS[0]];
    let ranges: Vec<String> = hub
        .seen()
        .iter()
        .filter(|s| s.path.ends_with(SHARDS[0]))
        .filter_map(|s| s.range.clone())
        .collect();
    // Resumed past the start (from the half that arrived; not exactly, should the client drop
    // a last partial read).
    assert!(
        ranges.iter().any(|r| r
            .strip_prefix("bytes=")
            .and_then(|r| r.strip_suffix('-'))
            .and_then(|n| n.parse::<usize>().ok())
            .is_some_and(|n| n > 0 && n <= data.len() / 2)),
        "{ranges:?}"
    );
    let blob = repo_dir(&home.path().join("hub"))
        .join("blobs")
        .join(etag(data));
    assert_eq!(fs::read(blob).unwrap(), *data);
}

/// A new commit that changes only the config links the shards' blobs it already has and
/// downloads the config alone.
#[test]
fn new_commit_reuses_cached_blobs() {
    let home = TempDir::new().unwrap();
    {
        let hub = Hub::start(one_repo(REPO, llama_repo()));
        ok_json(
            &mut wload_hub(Some(&hub), home.path()),
            &read_all(REPO, &["--json"]),
        );
    }
    let sha2 = "fedcba9876543210fedcba9876543210fedcba98";
    let mut repo = llama_repo();
    repo.sha = sha2.into();
    // The one change is to a file `inspect` reads.
    let mut config: Value = serde_json::from_slice(&repo.files["config.json"]).unwrap();
    config["_comment"] = json!("v2");
    repo.files
        .insert("config.json".into(), config.to_string().into_bytes());
    let hub = Hub::start(one_repo(REPO, repo));
    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(v["hub"]["commit"], sha2);
    assert_eq!(origins(&v), all("cache"));
    assert_eq!(v["hub"]["downloaded"], json!(["config.json"]));
    // Metadata requests are HEADs; only the config's content is transferred.
    let full: Vec<String> = hub
        .seen()
        .into_iter()
        .filter(|s| s.path.contains("/resolve/") && s.method != "HEAD")
        .map(|s| s.path)
        .collect();
    assert!(
        !full.is_empty() && full.iter().all(|p| p.ends_with("/config.json")),
        "{full:?}"
    );
    let rd = repo_dir(&home.path().join("hub"));
    assert_eq!(fs::read_to_string(rd.join("refs/main")).unwrap(), sha2);
    let link = rd.join("snapshots").join(sha2).join(SHARDS[0]);
    assert_eq!(
        fs::read_link(&link).unwrap(),
        Path::new("../../blobs").join(etag(&llama_repo().files[SHARDS[0]]))
    );
}

/// Builds, by hand, the cache Python's huggingface_hub leaves after vLLM loaded the repo: blobs
/// named by etag, `refs/main`, and a snapshot of relative links holding only the weights, index,
/// config and generation config.
fn python_cache(cache: &Path, repo: &HubRepo) {
    let rd = repo_dir(cache);
    fs::create_dir_all(rd.join("blobs")).unwrap();
    fs::create_dir_all(rd.join("refs")).unwrap();
    fs::create_dir_all(rd.join(".no_exist").join(SHA)).unwrap();
    fs::write(rd.join("refs/main"), SHA).unwrap();
    let snap = rd.join("snapshots").join(SHA);
    fs::create_dir_all(&snap).unwrap();
    for f in SHARDS.iter().chain(&[
        "model.safetensors.index.json",
        "config.json",
        "generation_config.json",
    ]) {
        let tag = etag(&repo.files[*f]);
        fs::write(rd.join("blobs").join(&tag), &repo.files[*f]).unwrap();
        std::os::unix::fs::symlink(Path::new("../../blobs").join(&tag), snap.join(f)).unwrap();
    }
}

/// A cache laid out by Python's huggingface_hub is used as it is: offline with nothing
/// requested, and online with only the missing side files downloaded.
#[test]
fn python_cache_layout_is_used_as_is() {
    let cache = TempDir::new().unwrap();
    let home = TempDir::new().unwrap();
    let repo = llama_repo();
    python_cache(cache.path(), &repo);
    let hub = Hub::start(one_repo(REPO, repo));

    let v = ok_json(
        wload_hub(Some(&hub), home.path())
            .env("HF_HUB_CACHE", cache.path())
            .env("HF_HUB_OFFLINE", "1"),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(origins(&v), all("cache"));
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = run(
        wload_hub(Some(&hub), home.path())
            .env("HF_HUB_CACHE", cache.path())
            .env("HF_HUB_OFFLINE", "1"),
        &["shard", REPO, "--tp", "2", "-o", s(&out), "-q"],
    );
    assert!(o.status.success(), "{}", context(&o));
    assert_golden_tp2(&out);
    assert!(hub.seen().is_empty());

    // By commit, offline: the same snapshot.
    let v = ok_json(
        wload_hub(Some(&hub), home.path())
            .env("HF_HUB_CACHE", cache.path())
            .env("HF_HUB_OFFLINE", "1"),
        &["inspect", REPO, "--revision", SHA, "--json"],
    );
    assert_eq!(origins(&v), all("cache"));

    // A shard missing from it (link and blob): named offline.
    let snap = repo_dir(cache.path()).join("snapshots").join(SHA);
    fs::remove_file(fs::canonicalize(snap.join(SHARDS[4])).unwrap()).unwrap();
    fs::remove_file(snap.join(SHARDS[4])).unwrap();
    let err = fails_with(
        wload_hub(Some(&hub), home.path())
            .env("HF_HUB_CACHE", cache.path())
            .env("HF_HUB_OFFLINE", "1"),
        &["inspect", REPO],
        1,
    );
    assert!(err.contains(SHARDS[4]), "{err}");
    assert!(hub.seen().is_empty());

    // Online: only that shard is asked for, and only its header (`inspect` reads no side file
    // and no tensor data).
    let v = ok_json(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_CACHE", cache.path()),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(hub.resolved(), set(&[SHARDS[4]]));
    assert_eq!(origins(&v)[SHARDS[4]], "header");
    assert_eq!(origins(&v)[SHARDS[0]], "cache");
}

/// `--download-dir` over `HF_HUB_CACHE` over `$HF_HOME/hub`.
#[test]
fn cache_folder_precedence() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    let home = TempDir::new().unwrap();
    let hub_cache = TempDir::new().unwrap();
    let download = TempDir::new().unwrap();
    let where_ = |v: &Value| PathBuf::from(v["hub"]["cache_dir"].as_str().unwrap());

    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(where_(&v), home.path().join("hub"));
    assert!(
        repo_dir(&home.path().join("hub"))
            .join("refs/main")
            .is_file()
    );

    let v = ok_json(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_CACHE", hub_cache.path()),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(where_(&v), hub_cache.path());
    assert_eq!(origins(&v), all("header"));
    assert!(repo_dir(hub_cache.path()).join("refs/main").is_file());

    let v = ok_json(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_CACHE", hub_cache.path()),
        &[
            "inspect",
            REPO,
            "--download-dir",
            s(download.path()),
            "--json",
        ],
    );
    assert_eq!(where_(&v), download.path());
    assert_eq!(origins(&v), all("header"));
    assert!(repo_dir(download.path()).join("refs/main").is_file());
}

/// A commit as `--revision`, once its files are cached, is answered without any request; a local
/// folder named like a repo id is still a folder.
#[test]
fn commit_revisions_and_local_folders() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    let home = TempDir::new().unwrap();
    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--revision", SHA, "--json"],
    );
    assert_eq!(origins(&v), all("header"));
    assert!(
        !repo_dir(&home.path().join("hub"))
            .join("refs")
            .join(SHA)
            .exists(),
        "no ref named by a commit"
    );
    hub.forget();
    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--revision", SHA, "--json"],
    );
    // The headers kept by the first run, with no request at all.
    assert_eq!(origins(&v), all("cached-header"));
    assert!(hub.seen().is_empty(), "{:?}", hub.seen());

    // `acme/llama-gqa` as a relative folder: read from disk, no hub involved.
    let work = TempDir::new().unwrap();
    let local = work.path().join(REPO);
    fs::create_dir_all(&local).unwrap();
    for e in fs::read_dir(fixtures_dir().join("llama_gqa")).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), local.join(e.file_name())).unwrap();
    }
    let v = ok_json(
        wload_hub(Some(&hub), home.path()).current_dir(work.path()),
        &["inspect", REPO, "--json"],
    );
    assert!(v.get("hub").is_none(), "{v:#}");
    assert_eq!(origins(&v), all("<none>"));
    assert!(hub.seen().is_empty());
}

/// `load` finds a pre-sharded repo (model-rank-*-part-* files) on the hub and fetches its rank
/// files, not a checkpoint's.
#[test]
fn load_takes_a_pre_sharded_repo() {
    let golden = expected("llama_gqa", 2);
    let mut files = BTreeMap::new();
    for e in fs::read_dir(&golden).unwrap() {
        let e = e.unwrap();
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("oracle_meta_") {
            files.insert(name, fs::read(e.path()).unwrap());
        }
    }
    let hub = Hub::start(one_repo(
        "acme/llama-tp2",
        HubRepo {
            sha: SHA.into(),
            files,
            token: None,
            aliases: BTreeSet::new(),
        },
    ));
    let home = TempDir::new().unwrap();
    let v = ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["load", "acme/llama-tp2", "--tp", "2", "--dry-run", "--json"],
    );
    assert_eq!(v["kind"], "pre-sharded", "{v:#}");
    assert!(
        hub.resolved().contains("model-rank-1-part-0.safetensors"),
        "{:?}",
        hub.resolved()
    );
}
