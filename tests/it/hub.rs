//! Hugging Face Hub sources, against a small hub served in-process on 127.0.0.1 (the endpoints
//! wload calls: the repo's file list and `resolve`, with ETag, X-Repo-Commit and Range support)
//! and named by `HF_ENDPOINT`. Every test has its own server and its own `HF_HOME`, so nothing
//! touches the real cache or the network.
//!
//! What is checked: only the index, the shards it lists and the config are downloaded (and the
//! side files by `shard`); a second run needs no server; `HF_HUB_OFFLINE=1` opens no connection and names a missing file;
//! unknown (404) and gated (401) repos fail with exit 1; partial downloads are resumed with a
//! Range request; a cache laid out by Python's huggingface_hub works as it is; and the cache
//! folder follows `--download-dir` > `HF_HUB_CACHE` > `$HF_HOME/hub`. Hubs that lie (more bytes
//! than announced, wrong ranges, redirects to `file:` or another port, oversized file lists) and
//! tampered caches (refs, links, saved lists) are refused by name; `fuzz/hub.rs` plays many more.

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Output;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use assert_cmd::Command;
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::*;

pub(crate) const REPO: &str = "acme/llama-gqa";
pub(crate) const SHA: &str = "0123456789abcdef0123456789abcdef01234567";
pub(crate) const SHARDS: [&str; 6] = [
    "model-00001-of-00006.safetensors",
    "model-00002-of-00006.safetensors",
    "model-00003-of-00006.safetensors",
    "model-00004-of-00006.safetensors",
    "model-00005-of-00006.safetensors",
    "model-00006-of-00006.safetensors",
];
/// Top-level files that are not weights: what `shard` copies, so what is downloaded with them.
const SIDE: [&str; 6] = [
    "README.md",
    "config.json",
    "fixture_info.json",
    "generation_config.json",
    "model.safetensors.index.json",
    "tokenizer_config.json",
];

// ---------------------------------------------------------------------------------------------
// The hub

/// One repo the server holds.
#[derive(Clone)]
pub(crate) struct HubRepo {
    pub(crate) sha: String,
    pub(crate) files: BTreeMap<String, Vec<u8>>,
    /// Files answer 401 unless `Authorization: Bearer <token>` is sent (the listing stays public,
    /// as for gated repos on the real hub).
    pub(crate) token: Option<String>,
    /// Branch and tag names besides `main` that point to `sha`.
    pub(crate) aliases: BTreeSet<String>,
}

/// A request the server saw.
#[derive(Debug, Clone)]
pub(crate) struct Seen {
    pub(crate) method: String,
    /// As sent: percent-encoded.
    pub(crate) path: String,
    pub(crate) range: Option<String>,
    pub(crate) auth: Option<String>,
}

/// Replaces the server's answer to a request: given the request and the answer the hub would
/// give, the raw bytes to send instead (status line, headers and body), or `None` to answer
/// as the hub does. The connection is closed after them.
pub(crate) type Hook = Box<dyn Fn(&Seen, &Reply) -> Option<Vec<u8>> + Send + Sync>;

struct Shared {
    repos: BTreeMap<String, HubRepo>,
    seen: Mutex<Vec<Seen>>,
    stop: AtomicBool,
    /// Files whose next transfer breaks off halfway (the connection closes).
    cut: Mutex<BTreeSet<String>>,
    /// Files whose next transfers stall, how many: the first sends its headers and half its
    /// body, later ones their headers only; then nothing, with the connection left open.
    stall: Mutex<BTreeMap<String, (u32, bool)>>,
    /// Transfers answer with the whole file, whatever Range was asked (as a CDN may).
    ignore_range: AtomicBool,
    hook: Mutex<Option<Arc<Hook>>>,
}

pub(crate) struct Hub {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl Hub {
    pub(crate) fn start(repos: BTreeMap<String, HubRepo>) -> Hub {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
        let addr = listener.local_addr().unwrap();
        let shared = Arc::new(Shared {
            repos,
            seen: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
            cut: Mutex::new(BTreeSet::new()),
            stall: Mutex::new(BTreeMap::new()),
            ignore_range: AtomicBool::new(false),
            hook: Mutex::new(None),
        });
        let sh = shared.clone();
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if sh.stop.load(Ordering::SeqCst) {
                    break;
                }
                let Ok(conn) = conn else { continue };
                let sh = sh.clone();
                std::thread::spawn(move || {
                    let _ = serve(&sh, conn);
                });
            }
        });
        Hub {
            addr,
            shared,
            thread: Some(thread),
        }
    }

    pub(crate) fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Answers with `hook` from now on (see [`Hook`]).
    pub(crate) fn hook(&self, hook: Hook) {
        *self.shared.hook.lock().unwrap() = Some(Arc::new(hook));
    }

    pub(crate) fn seen(&self) -> Vec<Seen> {
        self.shared.seen.lock().unwrap().clone()
    }

    /// The next transfer of `file` (more than a byte) stops halfway through its body.
    fn cut_once(&self, file: &str) {
        self.shared.cut.lock().unwrap().insert(file.to_string());
    }

    /// The next `times` transfers of `file` stall (see [`Shared::stall`]).
    fn stall(&self, file: &str, times: u32) {
        self.shared
            .stall
            .lock()
            .unwrap()
            .insert(file.to_string(), (times, false));
    }

    /// The `Range` of each transfer (GET) of `file`, in order.
    fn transfers(&self, file: &str) -> Vec<Option<String>> {
        self.seen()
            .into_iter()
            .filter(|s| s.method == "GET" && s.path.ends_with(&format!("/{file}")))
            .map(|s| s.range)
            .collect()
    }

    fn forget(&self) {
        self.shared.seen.lock().unwrap().clear();
    }

    /// The files whose contents were asked for (`resolve`), each once, decoded.
    fn resolved(&self) -> BTreeSet<String> {
        self.seen()
            .iter()
            .filter_map(|s| s.path.split_once("/resolve/"))
            .map(|(_, rest)| unquote(rest.split_once('/').unwrap().1))
            .collect()
    }

    /// Stops listening: later connections are refused.
    fn stop(&mut self) {
        if let Some(t) = self.thread.take() {
            self.shared.stop.store(true, Ordering::SeqCst);
            let _ = TcpStream::connect(self.addr);
            t.join().unwrap();
        }
    }
}

impl Drop for Hub {
    fn drop(&mut self) {
        self.stop();
    }
}

pub(crate) fn etag(data: &[u8]) -> String {
    format!("{:032x}", xxhash_rust::xxh3::xxh3_128(data))
}

/// Answers one request on `conn` and closes it.
fn serve(sh: &Shared, mut conn: TcpStream) -> std::io::Result<()> {
    conn.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(conn.try_clone()?);
    let mut line = String::new();
    reader.read_line(&mut line)?;
    let mut parts = line.split_whitespace();
    let (method, path) = (
        parts.next().unwrap_or("").to_string(),
        parts.next().unwrap_or("").to_string(),
    );
    let mut headers = BTreeMap::new();
    loop {
        let mut h = String::new();
        if reader.read_line(&mut h)? == 0 || h.trim().is_empty() {
            break;
        }
        if let Some((k, v)) = h.split_once(':') {
            headers.insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    if path.is_empty() {
        return Ok(());
    }
    let seen = Seen {
        method: method.clone(),
        path: path.clone(),
        range: headers.get("range").cloned(),
        auth: headers.get("authorization").cloned(),
    };
    sh.seen.lock().unwrap().push(seen.clone());
    let reply = route(sh, &path, &headers);
    let hook = sh.hook.lock().unwrap().clone();
    if let Some(bytes) = hook.and_then(|h| h(&seen, &reply)) {
        // A client that stops reading (as it should, past a size) resets the connection.
        let _ = conn.write_all(&bytes);
        let _ = conn.flush();
        return conn.shutdown(std::net::Shutdown::Both);
    }
    let (status, extra, body) = reply;
    let reason = match status {
        200 => "OK",
        206 => "Partial Content",
        401 => "Unauthorized",
        404 => "Not Found",
        416 => "Range Not Satisfiable",
        _ => "Error",
    };
    let mut head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in extra {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    conn.write_all(head.as_bytes())?;
    let file = path
        .split_once("/resolve/")
        .map(|(_, r)| r.split_once('/').unwrap().1);
    let cut = method != "HEAD"
        && body.len() > 1
        && file.is_some_and(|f| sh.cut.lock().unwrap().remove(f));
    if cut {
        conn.write_all(&body[..body.len() / 2])?;
        conn.flush()?;
        return conn.shutdown(std::net::Shutdown::Both);
    }
    let stall = file.filter(|_| method == "GET").and_then(|f| {
        let mut stalls = sh.stall.lock().unwrap();
        let (left, sent) = stalls.get_mut(f).filter(|(left, _)| *left > 0)?;
        *left -= 1;
        Some(!std::mem::replace(sent, true))
    });
    if let Some(first) = stall {
        if first {
            conn.write_all(&body[..body.len() / 2])?;
        }
        conn.flush()?;
        // Silent until the client gives up and closes (or the read timeout above ends it).
        let _ = reader.read_line(&mut String::new());
        return Ok(());
    }
    if method != "HEAD" {
        conn.write_all(&body)?;
    }
    conn.flush()
}

/// Status, headers (other than Content-Length) and body.
pub(crate) type Reply = (u16, Vec<(&'static str, String)>, Vec<u8>);

/// Percent-decoding, as the hub reads request paths.
fn unquote(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let hex = |c: u8| (c as char).to_digit(16);
        match (
            b[i],
            b.get(i + 1).copied().and_then(hex),
            b.get(i + 2).copied().and_then(hex),
        ) {
            (b'%', Some(h), Some(l)) => {
                out.push((h * 16 + l) as u8);
                i += 3;
            }
            (c, _, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A raw HTTP/1.1 answer: `head` lines as given (a Content-Length only if among them), then
/// `body`.
pub(crate) fn raw(status: u16, head: &[(&str, String)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("HTTP/1.1 {status} X\r\nConnection: close\r\n");
    for (k, v) in head {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

fn route(sh: &Shared, path: &str, headers: &BTreeMap<String, String>) -> Reply {
    let not_found = |code: &str| {
        (
            404,
            vec![("X-Error-Code", code.to_string())],
            br#"{"error":"not found"}"#.to_vec(),
        )
    };
    if let Some(rest) = path.strip_prefix("/api/models/") {
        let Some((repo, rev)) = rest.split_once("/revision/") else {
            return not_found("RepoNotFound");
        };
        let Some(r) = sh.repos.get(repo) else {
            return not_found("RepoNotFound");
        };
        let rev = unquote(rev);
        if rev != "main" && rev != r.sha && !r.aliases.contains(&rev) {
            return not_found("RevisionNotFound");
        }
        let body = json!({
            "id": repo,
            "sha": r.sha,
            "siblings": r.files.keys().map(|f| json!({"rfilename": f})).collect::<Vec<_>>(),
        });
        return (
            200,
            vec![("Content-Type", "application/json".into())],
            body.to_string().into_bytes(),
        );
    }
    let Some((repo, rest)) = path.trim_start_matches('/').split_once("/resolve/") else {
        return not_found("EntryNotFound");
    };
    let Some(r) = sh.repos.get(repo) else {
        return not_found("RepoNotFound");
    };
    if let Some(token) = &r.token
        && headers.get("authorization") != Some(&format!("Bearer {token}"))
    {
        return (
            401,
            vec![("X-Error-Code", "GatedRepo".into())],
            b"Access to this model is restricted".to_vec(),
        );
    }
    let Some((rev, file)) = rest.split_once('/') else {
        return not_found("EntryNotFound");
    };
    let (rev, file) = (
        unquote(rev),
        unquote(file.split_once('?').map_or(file, |(f, _)| f)),
    );
    if rev != "main" && rev != r.sha && !r.aliases.contains(&rev) {
        return not_found("RevisionNotFound");
    }
    let Some(data) = r.files.get(&file) else {
        return not_found("EntryNotFound");
    };
    let len = data.len() as u64;
    let mut extra = vec![
        ("ETag", format!("\"{}\"", etag(data))),
        ("X-Repo-Commit", r.sha.clone()),
        ("Accept-Ranges", "bytes".into()),
        ("Content-Type", "application/octet-stream".into()),
    ];
    let range = headers.get("range").and_then(|r| r.strip_prefix("bytes="));
    let Some(range) = range.filter(|_| !sh.ignore_range.load(Ordering::SeqCst)) else {
        return (200, extra, data.clone());
    };
    let (a, b) = range.split_once('-').unwrap();
    let a: u64 = a.parse().unwrap();
    let b: u64 = if b.is_empty() {
        len.saturating_sub(1)
    } else {
        b.parse::<u64>().unwrap().min(len.saturating_sub(1))
    };
    if a >= len {
        extra.push(("Content-Range", format!("bytes */{len}")));
        return (416, extra, Vec::new());
    }
    extra.push(("Content-Range", format!("bytes {a}-{b}/{len}")));
    (206, extra, data[a as usize..=b as usize].to_vec())
}

/// The llama_gqa golden fixture as a hub repo, plus files a run must not download: a shard the
/// index does not list, `.bin` weights, an `original/` folder and a dotfile.
pub(crate) fn llama_repo() -> HubRepo {
    let dir = fixtures_dir().join("llama_gqa");
    let mut files = BTreeMap::new();
    for e in fs::read_dir(&dir).unwrap() {
        let e = e.unwrap();
        files.insert(
            e.file_name().to_string_lossy().into_owned(),
            fs::read(e.path()).unwrap(),
        );
    }
    let extra = files[SHARDS[0]].clone();
    files.insert("model-extra.safetensors".into(), extra);
    files.insert("pytorch_model.bin".into(), b"pickled weights".to_vec());
    files.insert("original/consolidated.00.pth".into(), b"weights".to_vec());
    files.insert("original/params.json".into(), b"{}".to_vec());
    files.insert(
        ".gitattributes".into(),
        b"*.safetensors filter=lfs".to_vec(),
    );
    files.insert("README.md".into(), b"# a tiny llama\n".to_vec());
    files.insert(
        "tokenizer_config.json".into(),
        br#"{"model_max_length": 4096}"#.to_vec(),
    );
    HubRepo {
        sha: SHA.into(),
        files,
        token: None,
        aliases: BTreeSet::new(),
    }
}

pub(crate) fn one_repo(name: &str, repo: HubRepo) -> BTreeMap<String, HubRepo> {
    BTreeMap::from([(name.to_string(), repo)])
}

// ---------------------------------------------------------------------------------------------
// Running wload

/// Variables that could reach the real cache, a token or a proxy, or change the timeouts.
pub(crate) const CLEARED: [&str; 16] = [
    "HF_HUB_CACHE",
    "HUGGINGFACE_HUB_CACHE",
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "HF_TOKEN_PATH",
    "HF_HUB_OFFLINE",
    "TRANSFORMERS_OFFLINE",
    "XDG_CACHE_HOME",
    "HTTP_PROXY",
    "http_proxy",
    "HTTPS_PROXY",
    "https_proxy",
    "ALL_PROXY",
    "all_proxy",
    "HF_HUB_ETAG_TIMEOUT",
    "HF_HUB_DOWNLOAD_TIMEOUT",
];

/// `wload` with the hub at `hub` (a closed port when `None`) and `HF_HOME` in `home`, and every
/// other variable that could reach the real cache, a token or a proxy removed. A run that takes
/// over a minute fails the test rather than hanging the suite.
pub(crate) fn wload_hub(hub: Option<&Hub>, home: &Path) -> Command {
    let endpoint = hub.map_or_else(|| "http://127.0.0.1:9".to_string(), Hub::url);
    wload_at(&endpoint, home)
}

fn wload_at(endpoint: &str, home: &Path) -> Command {
    let mut cmd = wload();
    for k in CLEARED {
        cmd.env_remove(k);
    }
    cmd.env("HF_HOME", home)
        .env("HF_ENDPOINT", endpoint)
        .timeout(Duration::from_secs(60));
    cmd
}

fn run(cmd: &mut Command, args: &[&str]) -> Output {
    cmd.args(args).output().expect("wload runs")
}

fn ok_json(cmd: &mut Command, args: &[&str]) -> Value {
    let out = run(cmd, args);
    assert!(out.status.success(), "wload {args:?}: {}", context(&out));
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", context(&out)))
}

/// Runs `cmd ARGS…` and asserts a refusal with `code` (see [`assert_refused`]); returns stderr.
fn fails_with(cmd: &mut Command, args: &[&str], code: i32) -> String {
    assert_refused(&run(cmd, args), code, &[])
}

/// Each read weight file's origin, from `inspect --json`.
fn origins(v: &Value) -> BTreeMap<String, String> {
    v["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["file"].as_str().unwrap().to_string(),
                f["origin"].as_str().unwrap_or("<none>").to_string(),
            )
        })
        .collect()
}

fn all(origin: &str) -> BTreeMap<String, String> {
    SHARDS
        .iter()
        .map(|s| (s.to_string(), origin.to_string()))
        .collect()
}

pub(crate) fn repo_dir(cache: &Path) -> PathBuf {
    cache.join("models--acme--llama-gqa")
}

fn set(items: &[&str]) -> BTreeSet<String> {
    items.iter().map(|s| s.to_string()).collect()
}

/// What every command but `shard` reads of [`llama_repo`], so all it downloads: the index, the
/// config and the shards the index lists.
fn read_set() -> BTreeSet<String> {
    SHARDS
        .iter()
        .chain(&["model.safetensors.index.json", "config.json"])
        .map(|s| s.to_string())
        .collect()
}

/// What `shard` downloads besides [`read_set`].
fn side_only() -> BTreeSet<String> {
    expected_downloads()
        .difference(&read_set())
        .cloned()
        .collect()
}

/// What `shard` downloads of [`llama_repo`]: what it reads and the side files it copies.
fn expected_downloads() -> BTreeSet<String> {
    SHARDS
        .iter()
        .chain(SIDE.iter())
        .map(|s| s.to_string())
        .collect()
}

/// Part and side files of `out` equal vLLM's for llama_gqa at TP 2.
fn assert_golden_tp2(out: &Path) {
    let golden = expected("llama_gqa", 2);
    for e in fs::read_dir(&golden).unwrap() {
        let name = e.unwrap().file_name().to_string_lossy().into_owned();
        if name.starts_with("oracle_meta_") {
            continue;
        }
        assert!(
            fs::read(out.join(&name)).ok() == Some(fs::read(golden.join(&name)).unwrap()),
            "{name} differs from vLLM's"
        );
    }
}

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
    assert_eq!(origins(&v), all("download"), "{v:#}");
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
    // `inspect` reads no side file, so fetches none.
    assert_eq!(hub.resolved(), read_set());
    let downloaded: BTreeSet<String> = v["hub"]["downloaded"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect();
    assert_eq!(downloaded, read_set());
    let api: Vec<String> = hub
        .seen()
        .iter()
        .filter(|s| s.path.starts_with("/api/"))
        .map(|s| s.path.clone())
        .collect();
    assert_eq!(api, [format!("/api/models/{REPO}/revision/main")]);
    assert!(hub.seen().iter().all(|s| s.auth.is_none()));

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
        &["inspect", REPO, "--json"],
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
    assert_eq!(origins(&v), all("download"));
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
    assert_eq!(origins(&v), all("download"));

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
        &["inspect", REPO, "--json"],
    );
    assert_eq!(origins(&v), all("download"));
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
        &["inspect", REPO, "--json"],
    );
    assert_eq!(origins(&v), all("download"));
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
            &["inspect", REPO, "--json"],
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

    // Online: only that shard is downloaded (`inspect` reads no side file).
    let v = ok_json(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_CACHE", cache.path()),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(hub.resolved(), set(&[SHARDS[4]]));
    assert_eq!(origins(&v)[SHARDS[4]], "download");
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
    assert_eq!(origins(&v), all("download"));
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
    assert_eq!(origins(&v), all("download"));
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
    assert_eq!(origins(&v), all("download"));
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
    assert_eq!(origins(&v), all("cache"));
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

// ---------------------------------------------------------------------------------------------
// Timeouts and Ctrl-C

/// A hub that accepts each connection and never answers (nor closes it).
struct Silent {
    addr: SocketAddr,
    held: Arc<Mutex<Vec<TcpStream>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Silent {
    fn start() -> Silent {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a local port");
        let addr = listener.local_addr().unwrap();
        let held = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, st) = (held.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            for conn in listener.incoming() {
                if st.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(c) = conn {
                    h.lock().unwrap().push(c);
                }
            }
        });
        Silent {
            addr,
            held,
            stop,
            thread: Some(thread),
        }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn accepted(&self) -> usize {
        self.held.lock().unwrap().len()
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect(self.addr);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

/// Runs `cmd` and times it; `fails_with`'s checks, and a bound on the time.
fn fails_within(cmd: &mut Command, args: &[&str], code: i32, limit: Duration) -> String {
    let t = std::time::Instant::now();
    let err = fails_with(cmd.timeout(Duration::from_secs(30)), args, code);
    let took = t.elapsed();
    assert!(
        took < limit,
        "{args:?} took {took:?} (limit {limit:?}): {err}"
    );
    err
}

/// A hub that accepts the connection and never answers: `inspect` and `shard` give up after
/// `HF_HUB_ETAG_TIMEOUT` seconds and say which variable to raise.
#[test]
fn silent_hub_times_out() {
    let silent = Silent::start();
    let home = TempDir::new().unwrap();
    let out = home.path().join("out");
    for args in [
        &["inspect", REPO][..],
        &["shard", REPO, "--tp", "2", "-o", out.to_str().unwrap()],
    ] {
        let err = fails_within(
            wload_at(&silent.url(), home.path()).env("HF_HUB_ETAG_TIMEOUT", "1"),
            args,
            1,
            Duration::from_secs(6),
        );
        for want in [
            REPO,
            &silent.url(),
            "1 s",
            "HF_HUB_ETAG_TIMEOUT",
            "file list",
        ] {
            assert!(err.contains(want), "{args:?}: no '{want}' in: {err}");
        }
    }
    assert!(silent.accepted() >= 2, "the connections were accepted");
    assert!(!out.exists());
}

/// A transfer that sends half the file and then nothing is retried with a Range request from
/// where it stopped, a few times, then given up with a message naming the file, the endpoint and
/// `HF_HUB_DOWNLOAD_TIMEOUT`; what arrived stays for the next run, which completes it.
#[test]
fn stalled_transfer_gives_up_and_the_next_run_resumes() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    hub.stall(SHARDS[0], u32::MAX);
    let home = TempDir::new().unwrap();
    let err = fails_within(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_DOWNLOAD_TIMEOUT", "1"),
        &["inspect", REPO],
        1,
        Duration::from_secs(15),
    );
    for want in [
        SHARDS[0],
        &hub.url(),
        "1 s",
        "HF_HUB_DOWNLOAD_TIMEOUT",
        ".part",
    ] {
        assert!(err.contains(want), "no '{want}' in: {err}");
    }
    let data = llama_repo().files[SHARDS[0]].clone();
    let half = data.len() / 2;
    // The first try got half; three more (DOWNLOAD_ATTEMPTS in a row without new bytes) each
    // asked for the rest.
    let resumed = Some(format!("bytes={half}-"));
    let tries = hub.transfers(SHARDS[0]);
    assert_eq!(tries.len(), 4, "{tries:?}");
    assert_eq!(tries[0].as_deref(), Some("bytes=0-"), "{tries:?}");
    assert!(tries[1..].iter().all(|r| *r == resumed), "{tries:?}");
    let blobs = repo_dir(&home.path().join("hub")).join("blobs");
    let part = blobs.join(format!("{}.part", etag(&data)));
    assert_eq!(fs::read(&part).unwrap(), data[..half]);

    let hub = Hub::start(one_repo(REPO, llama_repo()));
    ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(hub.transfers(SHARDS[0]), [resumed]);
    assert_eq!(fs::read(blobs.join(etag(&data))).unwrap(), data);
    assert!(!part.exists());
}

/// A transfer that stalls once is resumed by the same run, and the file is whole.
#[test]
fn transfer_that_stalls_once_completes() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    hub.stall(SHARDS[0], 1);
    let home = TempDir::new().unwrap();
    let t = std::time::Instant::now();
    let v = ok_json(
        wload_hub(Some(&hub), home.path())
            .env("HF_HUB_DOWNLOAD_TIMEOUT", "1")
            .timeout(Duration::from_secs(30)),
        &["inspect", REPO, "--json"],
    );
    assert!(t.elapsed() < Duration::from_secs(8), "{:?}", t.elapsed());
    assert_eq!(origins(&v), all("download"));
    let data = llama_repo().files[SHARDS[0]].clone();
    assert_eq!(
        hub.transfers(SHARDS[0]),
        [
            Some("bytes=0-".to_string()),
            Some(format!("bytes={}-", data.len() / 2))
        ]
    );
    let blob = repo_dir(&home.path().join("hub"))
        .join("blobs")
        .join(etag(&data));
    assert_eq!(fs::read(blob).unwrap(), data);
}

/// A timeout that huggingface_hub would not read either is a usage error naming the variable,
/// found before any connection is made.
#[test]
fn malformed_timeouts_are_usage_errors() {
    let home = TempDir::new().unwrap();
    for (var, value) in [
        ("HF_HUB_ETAG_TIMEOUT", "1.5"),
        ("HF_HUB_ETAG_TIMEOUT", "ten"),
        ("HF_HUB_DOWNLOAD_TIMEOUT", "-3"),
    ] {
        let err = fails_within(
            wload_hub(None, home.path()).env(var, value),
            &["inspect", REPO],
            2,
            Duration::from_secs(5),
        );
        assert!(
            err.contains(&format!("{var}='{value}'")) && err.contains("seconds"),
            "{err}"
        );
    }
    // A whole number is taken, and 0 means the default, as in huggingface_hub: these fail only
    // because nothing listens at the endpoint.
    for value in ["30", "0", " 1_0 "] {
        let err = fails_within(
            wload_hub(None, home.path()).env("HF_HUB_ETAG_TIMEOUT", value),
            &["inspect", REPO],
            1,
            Duration::from_secs(5),
        );
        assert!(err.contains("cannot reach"), "{value}: {err}");
    }
}

/// `wload` as a plain child process, for the tests that signal it, with SIGINT as a terminal
/// gives it: a suite started in the background by a shell without job control has it ignored,
/// and children inherit that.
fn spawn_wload(endpoint: &str, home: &Path, args: &[&str]) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = wload_process();
    // SAFETY: `signal` is async-signal-safe, as code between fork and exec must be.
    unsafe {
        cmd.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    for k in CLEARED {
        cmd.env_remove(k);
    }
    cmd.env("HF_HOME", home)
        .env("HF_ENDPOINT", endpoint)
        .args(args)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("wload starts")
}

/// Waits for `cond`, failing the test after `limit`.
fn wait_for(what: &str, limit: Duration, cond: impl Fn() -> bool) {
    let t = std::time::Instant::now();
    while !cond() {
        assert!(t.elapsed() < limit, "{what}: not within {limit:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Sends SIGINT and expects the process to end, as interrupted, within two seconds (it is killed
/// and the test fails otherwise).
fn interrupt(child: &mut std::process::Child) {
    use std::os::unix::process::ExitStatusExt;
    // SAFETY: a signal to a child this test started and has not reaped.
    assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGINT) }, 0);
    let t = std::time::Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if t.elapsed() > Duration::from_secs(2) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("Ctrl-C did not stop wload within 2 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    assert!(
        status.signal() == Some(libc::SIGINT) || status.code() == Some(130),
        "{status:?}"
    );
}

/// Ctrl-C stops a run at once while the hub is silent and while a transfer is stalled (with the
/// default 10 s timeouts), and the partial file it leaves is resumed by the next run.
#[test]
fn ctrl_c_stops_a_waiting_run_and_the_next_run_resumes() {
    let home = TempDir::new().unwrap();
    let silent = Silent::start();
    let load: &[&str] = &["load", REPO, "--tp", "1", "--dry-run", "--device", "cpu"];
    for (i, args) in [&["inspect", REPO][..], load].into_iter().enumerate() {
        let mut child = spawn_wload(&silent.url(), home.path(), args);
        wait_for(
            "a connection to the silent hub",
            Duration::from_secs(20),
            || silent.accepted() > i,
        );
        interrupt(&mut child);
    }

    let hub = Hub::start(one_repo(REPO, llama_repo()));
    hub.stall(SHARDS[0], 1);
    let data = llama_repo().files[SHARDS[0]].clone();
    let half = data.len() / 2;
    let blobs = repo_dir(&home.path().join("hub")).join("blobs");
    let part = blobs.join(format!("{}.part", etag(&data)));
    let out = home.path().join("out");
    let mut child = spawn_wload(
        &hub.url(),
        home.path(),
        &["shard", REPO, "--tp", "2", "-o", out.to_str().unwrap()],
    );
    wait_for(
        "half the shard in its .part",
        Duration::from_secs(20),
        || fs::metadata(&part).is_ok_and(|m| m.len() == half as u64),
    );
    interrupt(&mut child);
    assert_eq!(fs::read(&part).unwrap(), data[..half]);
    assert!(!out.exists());

    hub.forget();
    ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(hub.transfers(SHARDS[0]), [Some(format!("bytes={half}-"))]);
    assert_eq!(fs::read(blobs.join(etag(&data))).unwrap(), data);
}

/// A server that answers a resumed request with the whole file (200, not 206) gets the file
/// written from its start, not appended to the partial one.
#[test]
fn ignored_range_restarts_the_file() {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    hub.shared.ignore_range.store(true, Ordering::SeqCst);
    let home = TempDir::new().unwrap();
    let data = llama_repo().files[SHARDS[0]].clone();
    let half = data.len() / 2;
    let blobs = repo_dir(&home.path().join("hub")).join("blobs");
    fs::create_dir_all(&blobs).unwrap();
    fs::write(blobs.join(format!("{}.part", etag(&data))), &data[..half]).unwrap();
    ok_json(
        &mut wload_hub(Some(&hub), home.path()),
        &["inspect", REPO, "--json"],
    );
    assert_eq!(hub.transfers(SHARDS[0]), [Some(format!("bytes={half}-"))]);
    assert_eq!(fs::read(blobs.join(etag(&data))).unwrap(), data);
}

/// A download of the same blob by another process (holding `blobs/<etag>.lock`) is waited for
/// while its partial file grows (longer than `HF_HUB_DOWNLOAD_TIMEOUT`), and its complete file
/// is then taken without a transfer; a holder that writes nothing is given up on.
#[test]
fn a_download_in_another_process_is_waited_for() {
    use std::os::fd::AsRawFd;
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    let home = TempDir::new().unwrap();
    let data = llama_repo().files[SHARDS[0]].clone();
    let blobs = repo_dir(&home.path().join("hub")).join("blobs");
    fs::create_dir_all(&blobs).unwrap();
    let lock = fs::File::create(blobs.join(format!("{}.lock", etag(&data)))).unwrap();
    // SAFETY: flock on a descriptor this test owns.
    assert_eq!(unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) }, 0);
    let part = blobs.join(format!("{}.part", etag(&data)));
    fs::write(&part, &data[..data.len() / 2]).unwrap();
    // A holder that writes nothing is given up on after the timeout.
    let err = fails_within(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_DOWNLOAD_TIMEOUT", "1"),
        &["inspect", REPO],
        1,
        Duration::from_secs(6),
    );
    assert!(
        err.contains(SHARDS[0]) && err.contains("held by another download"),
        "{err}"
    );
    hub.forget();
    let writer = {
        let (part, data) = (part.clone(), data.clone());
        std::thread::spawn(move || {
            // The other download goes on, slowly, for longer than HF_HUB_DOWNLOAD_TIMEOUT, then
            // completes and lets go.
            for _ in 0..8 {
                std::thread::sleep(Duration::from_millis(300));
                let mut f = fs::OpenOptions::new().append(true).open(&part).unwrap();
                let len = fs::metadata(&part).unwrap().len() as usize;
                f.write_all(&data[len..(len + 1).min(data.len())]).unwrap();
            }
            let len = fs::metadata(&part).unwrap().len() as usize;
            let mut f = fs::OpenOptions::new().append(true).open(&part).unwrap();
            f.write_all(&data[len..]).unwrap();
            drop(lock);
        })
    };
    let v = ok_json(
        wload_hub(Some(&hub), home.path()).env("HF_HUB_DOWNLOAD_TIMEOUT", "1"),
        &["inspect", REPO, "--json"],
    );
    writer.join().unwrap();
    assert_eq!(origins(&v)[SHARDS[0]], "download");
    assert_eq!(hub.transfers(SHARDS[0]), Vec::<Option<String>>::new());
    assert_eq!(fs::read(blobs.join(etag(&data))).unwrap(), data);
}

// ---------------------------------------------------------------------------------------------
// Hubs that lie, and caches that were tampered with

/// How a child ended, and the most memory it was seen to hold.
pub(crate) struct Bounded {
    /// The exit code, `None` when a signal ended it.
    pub(crate) code: Option<i32>,
    pub(crate) signal: Option<i32>,
    pub(crate) stdout: Vec<u8>,
    pub(crate) stderr: String,
    /// Peak resident memory (`VmHWM` of /proc/PID/status, read every few milliseconds until it
    /// exits), KiB. Not `wait4`'s `ru_maxrss`: Linux keeps in it the memory of the process that
    /// spawned the child (this test binary) from before `exec`.
    pub(crate) max_rss_kib: u64,
    /// Killed at the time limit.
    pub(crate) timed_out: bool,
}

/// `wload ARGS` against `endpoint` with `HF_HOME` in `home` (the environment [`wload_at`]
/// gives it, plus `env`), with at most `data_mib` MiB of heap and other private memory
/// (`RLIMIT_DATA`: past it an allocation fails and the process aborts, whatever the measuring
/// missed), watched for its peak memory, and killed after `limit`.
pub(crate) fn run_bounded(
    endpoint: &str,
    home: &Path,
    env: &[(&str, &str)],
    args: &[&str],
    data_mib: u64,
    limit: Duration,
) -> Bounded {
    use std::io::Read;
    use std::os::unix::process::{CommandExt, ExitStatusExt};
    let mut cmd = wload_process();
    for k in CLEARED {
        cmd.env_remove(k);
    }
    cmd.env("HF_HOME", home).env("HF_ENDPOINT", endpoint);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let bytes = data_mib << 20;
    // SAFETY: `setrlimit` is a plain system call, safe between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let lim = libc::rlimit {
                rlim_cur: bytes,
                rlim_max: bytes,
            };
            if libc::setrlimit(libc::RLIMIT_DATA, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("wload starts");
    let drain = |mut r: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            let _ = r.read_to_end(&mut v);
            v
        })
    };
    let out = drain(Box::new(child.stdout.take().unwrap()));
    let err = drain(Box::new(child.stderr.take().unwrap()));
    let status_file = format!("/proc/{}/status", child.id());
    let hwm = || -> Option<u64> {
        let text = fs::read_to_string(&status_file).ok()?;
        let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    let t = std::time::Instant::now();
    let (mut peak, mut timed_out) = (0, false);
    let status = loop {
        peak = peak.max(hwm().unwrap_or(0));
        if let Some(s) = child.try_wait().expect("wait for wload") {
            break s;
        }
        if t.elapsed() > limit && !timed_out {
            timed_out = true;
            let _ = child.kill();
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    Bounded {
        code: status.code(),
        signal: status.signal(),
        stdout: out.join().unwrap(),
        stderr: String::from_utf8_lossy(&err.join().unwrap()).into_owned(),
        max_rss_kib: peak,
        timed_out,
    }
}

/// Every regular file under `dir` (not following links) with its length.
pub(crate) fn files_under(dir: &Path) -> Vec<(PathBuf, u64)> {
    let mut out = Vec::new();
    let Ok(rd) = fs::read_dir(dir) else {
        return out;
    };
    for e in rd.flatten() {
        let Ok(m) = e.path().symlink_metadata() else {
            continue;
        };
        if m.is_dir() {
            out.extend(files_under(&e.path()));
        } else if m.is_file() {
            out.push((e.path(), m.len()));
        }
    }
    out
}

/// The decoded file a `resolve` request asks for.
pub(crate) fn resolved_file(path: &str) -> Option<String> {
    let (_, rest) = path.split_once("/resolve/")?;
    let file = rest.split_once('/')?.1;
    Some(unquote(file.split_once('?').map_or(file, |(f, _)| f)))
}

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
        &["inspect", REPO],
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
        &["inspect", REPO],
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
        &["inspect", REPO],
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
        &["inspect", REPO],
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
        &["inspect", REPO, "--json"],
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
        &["inspect", REPO],
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
    assert_eq!(origins(&v), all("download"));
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

/// `inspect`, `plan`, `sizes` and `load` download only what they read (config, index, the
/// shards), not a 1 MiB video beside them; `shard`, which copies the side files, downloads them.
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
    assert_eq!(hub.resolved(), side);
    assert!(out.join("demo.mp4").is_file());
}
