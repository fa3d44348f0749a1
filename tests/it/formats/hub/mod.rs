//! Hugging Face Hub sources, against a small hub served in-process on 127.0.0.1 (the endpoints
//! wload calls: the repo's file list and `resolve`, with ETag, X-Repo-Commit and Range support)
//! and named by `HF_ENDPOINT`. Every test has its own server and its own `HF_HOME`, so nothing
//! touches the real cache or the network.
//!
//! What is checked: only the index, the shards it lists and the config are downloaded (and the
//! side files by `shard`), of the shards only their headers by the commands that read no tensor
//! data (`headers.rs`); a second run needs no server; `HF_HUB_OFFLINE=1` opens no connection and names a missing file;
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

mod downloads;
mod headers;
mod lying;
mod serve;
mod timeouts;

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
    /// Body bytes written to clients per file (GET answers of `resolve`), decoded names.
    served: Mutex<BTreeMap<String, u64>>,
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
            served: Mutex::new(BTreeMap::new()),
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

    /// Transfers answer 200 with the whole file, whatever Range was asked (as a CDN may).
    pub(crate) fn ignore_range(&self) {
        self.shared.ignore_range.store(true, Ordering::SeqCst);
    }

    /// Body bytes the server wrote for each file (decoded name) so far.
    pub(crate) fn served(&self) -> BTreeMap<String, u64> {
        self.shared.served.lock().unwrap().clone()
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
        // In pieces, counted as each is taken: a client that stops reading closes the
        // connection, and what it was sent until then is what it cost.
        let count = |n: usize| {
            if let Some(f) = file {
                let f = unquote(f.split_once('?').map_or(f, |(f, _)| f));
                *sh.served.lock().unwrap().entry(f).or_default() += n as u64;
            }
        };
        for piece in body.chunks(64 << 10) {
            conn.write_all(piece)?;
            count(piece.len());
        }
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
    json_doc(args, &out)
}

/// Runs `cmd ARGS…` and asserts a refusal with `code` (see [`assert_refused`]); returns stderr.
fn fails_with(cmd: &mut Command, args: &[&str], code: i32) -> String {
    assert_refusal_text(&run(cmd, args), code, &[])
}

/// `load REPO --tp 2 --dry-run --read` and `extra`: a run that reads every byte of the weights,
/// so downloads them whole (`inspect`, `plan`, `sizes` and a plain `--dry-run` fetch only their
/// headers).
pub(crate) fn read_all<'a>(repo: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut a = vec!["load", repo, "--tp", "2", "--dry-run", "--read"];
    a.extend_from_slice(extra);
    a
}

/// The files a run downloaded whole, from the `hub_fetched` of its JSON.
pub(crate) fn fetched_files(v: &Value) -> BTreeSet<String> {
    v["hub_fetched"]["files"]
        .as_array()
        .unwrap_or_else(|| panic!("no hub_fetched.files: {v:#}"))
        .iter()
        .map(|f| f.as_str().unwrap().to_string())
        .collect()
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
        // vLLM's example copies the source's weight index; wload leaves it out on purpose.
        if name.ends_with(".safetensors.index.json") {
            assert!(!out.join(&name).exists(), "{name} copied");
            continue;
        }
        assert!(
            fs::read(out.join(&name)).ok() == Some(fs::read(golden.join(&name)).unwrap()),
            "{name} differs from vLLM's"
        );
    }
}

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
