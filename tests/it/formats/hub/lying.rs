//! Hubs that lie, and caches that were tampered with.

use super::*;

// ---------------------------------------------------------------------------------------------
// Hubs that lie, and caches that were tampered with

/// A transfer (GET) of `file` answered by `answer` instead of the hub; the rest as usual.
fn on_transfer_of(
    file: &'static str,
    answer: impl Fn(&Seen, &Reply) -> Vec<u8> + Send + Sync + 'static,
) -> Hook {
    Box::new(move |seen, reply| {
        (seen.method == "GET" && resolved_file(&seen.path).as_deref() == Some(file))
            .then(|| answer(seen, reply))
    })
}

/// The headers of a hub answer, without its body's length.
fn head_of(reply: &Reply) -> Vec<(&str, String)> {
    reply.1.iter().map(|(k, v)| (*k, v.clone())).collect()
}

/// A server that sends more than it announced has nothing past the announced size written,
/// and is named for what it did; the partial file that would look complete is removed. A
/// Content-Length or Content-Range that disagrees with what was asked is refused before a byte
/// is written, and a transfer that ends short is resumed.
#[test]
fn a_hub_never_gets_more_bytes_written_than_it_announced() {
    let data = llama_repo().files[SHARDS[0]].clone();
    let len = data.len() as u64;
    let blobs_of = |home: &Path| repo_dir(&home.join("hub")).join("blobs");
    let largest = |home: &Path| {
        files_under(&home.join("hub"))
            .into_iter()
            .map(|(_, n)| n)
            .max()
            .unwrap_or(0)
    };
    let biggest_true = llama_repo()
        .files
        .values()
        .map(|v| v.len() as u64)
        .max()
        .unwrap();

    // No Content-Length, and 3 MiB past the file (the connection closed after them).
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    hub.hook(on_transfer_of(SHARDS[0], |_, reply| {
        let mut body = reply.2.clone();
        body.extend(std::iter::repeat_n(b'x', 3 << 20));
        raw(200, &head_of(reply), &body)
    }));
    let home = TempDir::new().unwrap();
    let err = fails_with(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &[]),
        1,
    );
    for want in [
        SHARDS[0],
        "more than",
        &format!("past the {len} bytes"),
        "Content-Length",
    ] {
        assert!(err.contains(want), "no '{want}' in: {err}");
    }
    assert!(!err.contains("416"), "no HTTP 416 was sent: {err}");
    assert!(
        largest(home.path()) <= biggest_true,
        "{:?}",
        files_under(home.path())
    );
    let part = blobs_of(home.path()).join(format!("{}.part", etag(&data)));
    assert!(
        !part.exists(),
        "a partial file of the whole size would look complete"
    );
    assert!(!blobs_of(home.path()).join(etag(&data)).exists());

    // A Content-Length over what remains: refused before anything is written.
    hub.hook(on_transfer_of(SHARDS[0], |_, reply| {
        let mut body = reply.2.clone();
        body.extend_from_slice(b"0123456789");
        let mut head = head_of(reply);
        head.push(("Content-Length", body.len().to_string()));
        raw(200, &head, &body)
    }));
    let err = fails_with(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &[]),
        1,
    );
    let announced = format!("announces {} bytes (Content-Length) where {len}", len + 10);
    assert!(err.contains(&announced) && err.contains(SHARDS[0]), "{err}");
    assert!(
        fs::metadata(&part).map_or(0, |m| m.len()) == 0,
        "nothing written"
    );

    // A resumed transfer answered with another range than asked: refused, the part kept.
    let half = data.len() / 2;
    fs::create_dir_all(blobs_of(home.path())).unwrap();
    fs::write(&part, &data[..half]).unwrap();
    hub.hook(on_transfer_of(SHARDS[0], move |_, reply| {
        let mut head = head_of(reply);
        head.retain(|(k, _)| *k != "Content-Range");
        head.push(("Content-Range", format!("bytes 0-{}/{}", len - 1, len)));
        head.push(("Content-Length", len.to_string()));
        raw(206, &head, &reply.2)
    }));
    let err = fails_with(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &[]),
        1,
    );
    assert!(
        err.contains(&format!("bytes {half}-{}/{len}", len - 1))
            && err.contains(&format!("Content-Range 'bytes 0-{}/{len}'", len - 1)),
        "{err}"
    );
    assert_eq!(
        fs::read(&part).unwrap(),
        data[..half],
        "what was there is kept"
    );

    // A range answer longer than asked, without a length: cut at the file's end.
    hub.hook(on_transfer_of(SHARDS[0], |_, reply| {
        let mut body = reply.2.clone();
        body.extend(std::iter::repeat_n(b'y', 5000));
        raw(reply.0, &head_of(reply), &body)
    }));
    let err = fails_with(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &[]),
        1,
    );
    assert!(err.contains("sent 5000 bytes past"), "{err}");
    assert!(largest(home.path()) <= biggest_true);

    // Fewer bytes than announced (the connection closes early): resumed, then complete.
    let cut = Arc::new(AtomicBool::new(true));
    let c = cut.clone();
    hub.hook(on_transfer_of(SHARDS[0], move |_, reply| {
        let mut head = head_of(reply);
        if c.swap(false, Ordering::SeqCst) {
            head.push(("Content-Length", reply.2.len().to_string()));
            return raw(reply.0, &head, &reply.2[..reply.2.len() / 3]);
        }
        head.push(("Content-Length", reply.2.len().to_string()));
        raw(reply.0, &head, &reply.2)
    }));
    ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &["--json"]),
    );
    assert_eq!(
        fs::read(blobs_of(home.path()).join(etag(&data))).unwrap(),
        data
    );
    assert!(!cut.load(Ordering::SeqCst), "the short transfer happened");
}

/// A size announced beyond the free space is refused before a byte is written, naming both.
#[test]
fn a_download_that_cannot_fit_is_refused_first() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    hub.hook(Box::new(|seen, reply| {
        (seen.method == "HEAD" && resolved_file(&seen.path).as_deref() == Some(SHARDS[1])).then(
            || {
                let mut head = head_of(reply);
                head.push(("X-Linked-Size", (1u64 << 60).to_string()));
                raw(200, &head, b"")
            },
        )
    }));
    let home = TempDir::new().unwrap();
    let err = fails_with(
        &mut wload_hub(Some(&hub), home.path()),
        &read_all(REPO, &[]),
        1,
    );
    assert!(
        err.contains(SHARDS[1]) && err.contains(&(1u64 << 60).to_string()) && err.contains("free"),
        "{err}"
    );
    assert!(hub.transfers(SHARDS[1]).is_empty(), "nothing asked for");
}

/// File names, and revisions, go into URLs percent-encoded as huggingface_hub encodes them
/// (`quote(filename)`, `quote(revision, safe="")`): a space, `#`, `%` or `?` in a name, or a
/// `/` or `#` in a revision, reach the hub as they are, and the files land under their names.
#[test]
fn names_and_revisions_are_percent_encoded() {
    let odd = [
        "LICENSE (1).txt",
        "notes#1.md",
        "100%.md",
        "what?.md",
        "ü.txt",
        "a+b=c&d.json",
    ];
    let mut repo = llama_repo();
    for (i, f) in odd.iter().enumerate() {
        repo.files
            .insert(f.to_string(), format!("file {i}\n").into_bytes());
    }
    repo.aliases = ["refs/pr/1".to_string(), "release#2".to_string()].into();
    let hub = Hub::start(one_repo(REPO, repo.clone()));
    let home = TempDir::new().unwrap();
    let work = TempDir::new().unwrap();
    for (i, rev) in ["refs/pr/1", "release#2"].iter().enumerate() {
        let out = work.path().join(format!("out{i}"));
        let o = run(
            &mut wload_hub(Some(&hub), home.path()),
            &[
                "shard",
                REPO,
                "--revision",
                rev,
                "--tp",
                "2",
                "-o",
                s(&out),
                "-q",
            ],
        );
        assert!(o.status.success(), "{rev}: {}", context(&o));
        for f in odd {
            assert_eq!(fs::read(out.join(f)).unwrap(), repo.files[f], "{f}");
        }
    }
    let paths: BTreeSet<String> = hub.seen().into_iter().map(|s| s.path).collect();
    for want in [
        format!("/api/models/{REPO}/revision/refs%2Fpr%2F1"),
        format!("/api/models/{REPO}/revision/release%232"),
        format!("/{REPO}/resolve/{SHA}/LICENSE%20%281%29.txt"),
        format!("/{REPO}/resolve/{SHA}/notes%231.md"),
        format!("/{REPO}/resolve/{SHA}/100%25.md"),
        format!("/{REPO}/resolve/{SHA}/what%3F.md"),
        format!("/{REPO}/resolve/{SHA}/%C3%BC.txt"),
        format!("/{REPO}/resolve/{SHA}/a%2Bb%3Dc%26d.json"),
    ] {
        assert!(paths.contains(&want), "{want} not among {paths:#?}");
    }
    // huggingface_hub's refs for such revisions: a file per path.
    let rd = repo_dir(&home.path().join("hub"));
    assert_eq!(fs::read_to_string(rd.join("refs/refs/pr/1")).unwrap(), SHA);
    assert_eq!(fs::read_to_string(rd.join("refs/release#2")).unwrap(), SHA);
}

/// `HF_TOKEN` goes only where the endpoint is (same scheme, host and port), as httpx does for
/// huggingface_hub: not to another port of the same host; the hub's own relative redirects keep
/// it.
#[test]
fn the_token_stays_on_the_endpoints_origin() {
    let mut gated = llama_repo();
    gated.token = Some("hf_secret".into());
    let hub = Hub::start(one_repo(REPO, gated));
    // The "CDN": the same files, no token needed.
    let cdn = Hub::start(one_repo(REPO, llama_repo()));
    let cdn_port = cdn.addr.port();
    hub.hook(Box::new(move |seen, reply| {
        let file = resolved_file(&seen.path)?;
        let to = match (seen.method.as_str(), file.as_str()) {
            ("GET", f) if f == SHARDS[0] => format!("http://127.0.0.1:{cdn_port}{}", seen.path),
            // A relative hop on the hub itself: the token must follow it, or this answers 401.
            ("GET", f) if f == SHARDS[2] && !seen.path.contains('?') => {
                format!("{}?hop=1", seen.path)
            }
            _ => return None,
        };
        let mut head = head_of(reply);
        head.push(("Location", to));
        Some(raw(302, &head, b""))
    }));
    let home = TempDir::new().unwrap();
    let v = ok_json(
        wload_hub(Some(&hub), home.path()).env("HF_TOKEN", "hf_secret"),
        &["inspect", REPO, "--json"],
    );
    // The headers, by Range requests that follow the same redirects as downloads.
    assert_eq!(origins(&v), all("header"));
    let to_cdn = cdn.seen();
    assert!(!to_cdn.is_empty(), "the redirect was followed");
    assert!(
        to_cdn.iter().all(|s| s.auth.is_none()),
        "the token left the endpoint: {to_cdn:?}"
    );
    let hop = hub
        .seen()
        .into_iter()
        .find(|s| s.path.ends_with("?hop=1"))
        .unwrap();
    assert_eq!(hop.auth.as_deref(), Some("Bearer hf_secret"));
}

/// A redirect to anything but http(s) (`file:`, `ftp:`), or a redirect loop, is named as such
/// with the URL, exit 1: not "not found", not a network failure.
#[test]
fn redirects_to_other_schemes_and_loops_are_named() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    let home = TempDir::new().unwrap();
    let redirect = |to: &'static str| -> Hook {
        Box::new(move |seen, _| {
            seen.path
                .starts_with("/api/")
                .then(|| raw(302, &[("Location", to.to_string())], b""))
        })
    };
    hub.hook(redirect("file:///etc/passwd"));
    let err = fails_with(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO],
        1,
    );
    for want in ["redirected", "file:///etc/passwd", "only http and https"] {
        assert!(err.contains(want), "no '{want}' in: {err}");
    }
    assert!(!err.contains("not found"), "{err}");
    hub.hook(redirect("/api/again"));
    let err = fails_with(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO],
        1,
    );
    assert!(err.contains("more than 10 redirects"), "{err}");
    // A file's transfer sent to ftp:.
    hub.hook(on_transfer_of(SHARDS[3], |_, _| {
        raw(307, &[("Location", "ftp://127.0.0.1/x".into())], b"")
    }));
    let err = fails_with(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO],
        1,
    );
    assert!(
        err.contains(SHARDS[3]) && err.contains("ftp://127.0.0.1/x") && err.contains("ftp:"),
        "{err}"
    );
}

/// A ref that is not a commit hash (`../../x`) is not followed outside the cache, offline or
/// with the hub gone; nor is a snapshot link that leads outside the repo's blobs.
#[test]
fn tampered_cache_refs_and_links_are_refused() {
    let mut hub = Hub::start(one_repo(REPO, llama_repo()));
    let home = TempDir::new().unwrap();
    ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--json"],
    );
    hub.stop();
    let cache = home.path().join("hub");
    let rd = repo_dir(&cache);
    // What `../../x` names from snapshots/: a complete checkpoint, so following it would work.
    let outside = cache.join("x");
    fs::create_dir_all(&outside).unwrap();
    for e in fs::read_dir(fixtures_dir().join("llama_gqa")).unwrap() {
        let e = e.unwrap();
        fs::copy(e.path(), outside.join(e.file_name())).unwrap();
    }
    fs::write(rd.join("refs/main"), "../../x").unwrap();
    for env in [&[("HF_HUB_OFFLINE", "1")][..], &[]] {
        let mut cmd = wload_hub(Some(&hub), home.path());
        cmd.envs(env.iter().copied());
        let err = fails_with(&mut cmd, &["inspect", REPO], 1);
        let at = rd.join("refs/main");
        for want in [at.to_str().unwrap(), "../../x", "not a commit hash"] {
            assert!(err.contains(want), "{env:?}: no '{want}' in: {err}");
        }
    }
    fs::write(rd.join("refs/main"), SHA).unwrap();
    // A snapshot link to a file outside the blobs (a copy of the real config).
    let link = rd.join("snapshots").join(SHA).join("config.json");
    fs::remove_file(&link).unwrap();
    std::os::unix::fs::symlink(outside.join("config.json"), &link).unwrap();
    let err = fails_with(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_OFFLINE", "1"),
        &["inspect", REPO],
        1,
    );
    assert!(
        err.contains(link.to_str().unwrap()) && err.contains("outside the repo's blobs"),
        "{err}"
    );
}

/// The cache's saved file list, when it cannot be used (over the limit, or not wload's JSON),
/// is named offline with the limit, exit 1, rather than silently replaced by the snapshot's
/// files; online, the hub's answer replaces it.
#[test]
fn an_unusable_saved_file_list_is_named() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    let home = TempDir::new().unwrap();
    ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--json"],
    );
    let saved = repo_dir(&home.path().join("hub"))
        .join(".wload")
        .join(format!("{SHA}.json"));
    let good = fs::read(&saved).unwrap();
    let offline = || {
        let mut c = wload_hub(Some(&hub), home.path());
        c.env("HF_HUB_OFFLINE", "1");
        c
    };
    // Sparse: 65 MiB on paper, nothing on disk.
    fs::File::create(&saved).unwrap().set_len(65 << 20).unwrap();
    let err = fails_with(&mut offline(), &["inspect", REPO], 1);
    assert!(
        err.contains(saved.to_str().unwrap())
            && err.contains("64.0 MiB")
            && err.contains("HF_HUB_OFFLINE"),
        "{err}"
    );
    fs::write(&saved, b"{\"repo\": ").unwrap();
    let err = fails_with(&mut offline(), &["inspect", REPO], 1);
    assert!(
        err.contains(saved.to_str().unwrap()) && err.contains("JSON"),
        "{err}"
    );
    // Online, by commit (where the saved list would spare the request): asked again, saved again.
    hub.forget();
    ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--revision", SHA, "--json"],
    );
    assert_eq!(hub.seen().len(), 1, "{:?}", hub.seen());
    assert_eq!(fs::read(&saved).unwrap(), good);
}

/// Heap a run that reads an oversized file list may use before its allocations fail: the
/// 64 MiB it may read, and room for the rest.
const LIST_DATA_MIB: u64 = 256;

/// The hub's file list is read with a cap on its bytes (64 MiB) and entries (100,000), each
/// named when exceeded, in bounded memory: a 235 MB list used to cost 0.8 GiB.
#[test]
fn the_file_list_is_bounded_in_bytes_entries_and_memory() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    let home = TempDir::new().unwrap();
    let big: Arc<Vec<u8>> = {
        // Valid JSON all through: siblings with long names, to past 64 MiB.
        let mut v = format!("{{\"sha\":\"{SHA}\",\"siblings\":[").into_bytes();
        let name = "n".repeat(4000);
        let mut i = 0;
        while v.len() < 70 << 20 {
            v.extend_from_slice(format!("{{\"rfilename\":\"{i}{name}\"}},").as_bytes());
            i += 1;
        }
        v.extend_from_slice(b"{\"rfilename\":\"last\"}]}");
        Arc::new(v)
    };
    let body = big.clone();
    hub.hook(Box::new(move |seen, _| {
        seen.path
            .starts_with("/api/")
            .then(|| raw(200, &[("Content-Length", body.len().to_string())], &body))
    }));
    let b = run_bounded(
        &hub.url(),
        home.path(),
        &[],
        &["inspect", REPO],
        LIST_DATA_MIB,
        Duration::from_secs(60),
    );
    assert_eq!(b.code, Some(1), "{}", b.stderr);
    assert!(
        b.stderr.contains("larger than 64 MiB") && b.stderr.contains(REPO),
        "{}",
        b.stderr
    );
    assert!(
        b.max_rss_kib < 128 << 10,
        "peak memory {} KiB",
        b.max_rss_kib
    );

    let many = {
        let mut v = format!("{{\"sha\":\"{SHA}\",\"siblings\":[").into_bytes();
        for i in 0..100_001 {
            v.extend_from_slice(format!("{{\"rfilename\":\"f{i}\"}},").as_bytes());
        }
        v.pop();
        v.extend_from_slice(b"]}");
        Arc::new(v)
    };
    hub.hook(Box::new(move |seen, _| {
        seen.path
            .starts_with("/api/")
            .then(|| raw(200, &[("Content-Length", many.len().to_string())], &many))
    }));
    let b = run_bounded(
        &hub.url(),
        home.path(),
        &[],
        &["inspect", REPO],
        LIST_DATA_MIB,
        Duration::from_secs(60),
    );
    assert_eq!(b.code, Some(1), "{}", b.stderr);
    assert!(b.stderr.contains("more than 100000 files"), "{}", b.stderr);
}

/// `inspect`, `plan`, `sizes` and `load --dry-run` ask only for what they read (config, index,
/// the shards' headers), not a 1 MiB video beside them; `shard`, which copies the side files,
/// downloads them (and the shards, whose headers alone were fetched before).
#[test]
fn only_shard_downloads_side_files() {
    let mut repo = llama_repo();
    repo.files.insert("demo.mp4".into(), vec![7; 1 << 20]);
    let hub = Hub::start(one_repo(REPO, repo));
    let work = TempDir::new().unwrap();
    let commands: [&[&str]; 4] = [
        &["inspect", REPO],
        &["plan", REPO, "--tp", "2"],
        &["sizes", REPO],
        &["load", REPO, "--tp", "1", "--dry-run", "--device", "cpu"],
    ];
    for (i, args) in commands.into_iter().enumerate() {
        let home = work.path().join(format!("h{i}"));
        hub.forget();
        let o = run(&mut wload_hub(Some(&hub), &home), args);
        assert!(o.status.success(), "{args:?}: {}", context(&o));
        assert_eq!(hub.resolved(), read_set(), "{args:?}");
    }
    let home = work.path().join("h0");
    hub.forget();
    let out = work.path().join("out");
    let o = run(
        &mut wload_hub(Some(&hub), &home),
        &["shard", REPO, "--tp", "2", "-o", s(&out), "-q"],
    );
    assert!(o.status.success(), "{}", context(&o));
    let mut side = side_only();
    side.insert("demo.mp4".into());
    side.extend(SHARDS.map(String::from));
    assert_eq!(hub.resolved(), side);
    assert!(out.join("demo.mp4").is_file());
}
