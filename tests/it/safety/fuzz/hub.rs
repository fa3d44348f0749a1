//! Hostile hub answers, seeded: each input is one `wload inspect` of the llama_gqa repo against
//! the fake hub of `tests/it/formats/hub.rs`, with some of its answers replaced: the file list (status,
//! mutated JSON, hostile commits and names, too many entries, cut short), one file's metadata
//! (missing or hostile ETag, X-Repo-Commit, X-Linked-Size, X-Linked-Etag, redirects) and one
//! file's transfer (status, Content-Range, Content-Length, Content-Encoding, bodies cut short or
//! running long, redirects to other schemes, loops and closed ports), once or every time.
//!
//! Whatever the hub does, wload must end within the time bound and in bounded memory, with
//! exit 0, 1 or 3 and a message (never a panic or a signal), write no blob larger than any size
//! the hub announced, and on exit 0 hold only files whose length is one the hub announced for
//! them and whose bytes are the hub's (no body here is altered, only cut or extended).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fastrand::Rng;
use tempfile::TempDir;

use super::{TOKENS, fuzz, mutate_bytes};
use crate::formats::hub::{
    Hook, Hub, REPO, Reply, SHA, Seen, files_under, llama_repo, one_repo, raw, repo_dir,
    resolved_file, run_bounded,
};
use crate::support::assert_schema;

/// Inputs per run: each starts wload once (and retries with back-off), so a few dozen keep the
/// test within its 30 s.
const INPUTS: usize = 80;
/// The longest one input's wload may run (its timeouts are 1 s, its retries a few).
const PER_RUN: Duration = Duration::from_secs(20);
/// Peak memory allowed to one run (resident, and heap as `RLIMIT_DATA`).
const MAX_RSS_KIB: u64 = 256 << 10;

/// What replaces the file list.
#[derive(Debug, Clone)]
enum Listing {
    Honest,
    /// Status and headers, no body.
    Status(u16, Vec<(&'static str, String)>),
    /// The honest JSON with byte-level edits.
    Bytes(Vec<u8>),
    /// `sha` replaced.
    Sha(String),
    /// Extra names among the siblings.
    Names(Vec<String>),
    /// More entries than wload takes.
    TooMany,
    /// The honest body announced whole and cut at this fraction.
    Cut(u8),
}

/// What replaces one file's metadata (its HEAD).
#[derive(Debug, Clone)]
enum Head {
    Honest,
    Drop(&'static str),
    Set(&'static str, String),
    Status(u16, Vec<(&'static str, String)>),
}

/// What replaces one file's transfer (its GET).
#[derive(Debug, Clone)]
struct Get {
    status: Option<u16>,
    /// `None`: as the hub sends it; `Some(None)`: removed.
    content_range: Option<Option<String>>,
    /// Content-Length: `None` none, else the body's length plus this.
    length: Option<i64>,
    /// The body cut to this fraction (of 255), or extended by this many bytes.
    body: Body,
    extra: Vec<(&'static str, String)>,
}

#[derive(Debug, Clone, Copy)]
enum Body {
    Same,
    Cut(u8),
    Longer(usize),
}

#[derive(Debug, Clone)]
struct Case {
    listing: Listing,
    listing_always: bool,
    /// Which read file (index into [`read_files`]) gets `head` and `get`.
    file: usize,
    head: Head,
    head_always: bool,
    get: Option<Get>,
    get_always: bool,
}

/// The files `inspect` reads of llama_gqa: the index, the config and the shards.
fn read_files() -> Vec<String> {
    let repo = llama_repo();
    repo.files
        .keys()
        .filter(|f| {
            f.as_str() == "config.json"
                || f.as_str() == "model.safetensors.index.json"
                || (f.starts_with("model-0") && f.ends_with(".safetensors"))
        })
        .cloned()
        .collect()
}

fn pick<T: Clone>(rng: &mut Rng, items: &[T]) -> T {
    items[rng.usize(..items.len())].clone()
}

/// A header value a hub should never send.
fn hostile_value(rng: &mut Rng) -> String {
    match rng.u8(..8) {
        0 => "../../x".into(),
        1 => "x".repeat(rng.usize(100..400)),
        2 => "\u{1b}[2J\u{1b}]0;owned\u{7}".into(),
        3 => String::new(),
        4 => "W/\"\"".into(),
        5 => "a/b".into(),
        6 => ".hidden".into(),
        _ => pick(rng, TOKENS).into(),
    }
}

/// A redirect somewhere wload must not go, or may go only to fail.
fn bad_redirect(rng: &mut Rng, path: &str) -> Vec<(&'static str, String)> {
    let to = match rng.u8(..6) {
        0 => "file:///etc/passwd".to_string(),
        1 => "ftp://127.0.0.1/x".to_string(),
        2 => path.to_string(),
        3 => "http://127.0.0.1:9/x".to_string(),
        4 => "javascript:alert(1)".to_string(),
        _ => hostile_value(rng),
    };
    vec![("Location", to)]
}

fn make_listing(rng: &mut Rng) -> Listing {
    let honest = format!(
        r#"{{"id":"{REPO}","sha":"{SHA}","siblings":[{}]}}"#,
        llama_repo()
            .files
            .keys()
            .map(|f| format!(r#"{{"rfilename":"{f}"}}"#))
            .collect::<Vec<_>>()
            .join(",")
    );
    // Two in three file lists are honest, so that most inputs reach the files.
    match rng.u8(..24) {
        0 => Listing::Status(
            pick(rng, &[200, 301, 404, 401, 403, 429, 500, 503, 204, 418]),
            Vec::new(),
        ),
        1 => Listing::Status(302, bad_redirect(rng, "/api/loop")),
        2 | 3 => Listing::Bytes(mutate_bytes(rng, honest.as_bytes(), &[])),
        4 => Listing::Sha({
            let h = hostile_value(rng);
            pick(
                rng,
                &[
                    "../../x".to_string(),
                    "fedcba9876543210fedcba9876543210fedcba98".into(),
                    "0123456789abcdef0123456789abcdef0123456".into(),
                    h,
                ],
            )
        }),
        5 => Listing::Names(
            (0..rng.usize(1..6))
                .map(|_| {
                    pick(
                        rng,
                        &[
                            "../../etc/passwd".to_string(),
                            "/abs.json".into(),
                            "a\\u0000b".into(),
                            String::new(),
                            "x".repeat(300),
                            "config.json/".into(),
                            "config.json".into(),
                            "model-00009-of-00006.safetensors".into(),
                            "sub/../../x".into(),
                            "\\u001b[2J.md".into(),
                        ],
                    )
                })
                .collect(),
        ),
        6 => Listing::TooMany,
        7 => Listing::Cut(rng.u8(..255)),
        _ => Listing::Honest,
    }
}

fn make_head(rng: &mut Rng) -> Head {
    let size = |rng: &mut Rng| match rng.u8(..7) {
        0 => "0".to_string(),
        1 => "-1".into(),
        2 => (1u64 << 60).to_string(),
        3 => "18446744073709551616".into(),
        4 => "12abc".into(),
        5 => rng.u64(1..2_000_000).to_string(),
        _ => hostile_value(rng),
    };
    match rng.u8(..10) {
        0 => Head::Drop(pick(rng, &["ETag", "X-Repo-Commit", "Content-Length"])),
        1 => Head::Set("ETag", hostile_value(rng)),
        2 => Head::Set("X-Linked-Etag", hostile_value(rng)),
        3 | 4 => Head::Set("X-Linked-Size", size(rng)),
        5 => Head::Set("X-Repo-Commit", {
            let h = hostile_value(rng);
            pick(
                rng,
                &["fedcba9876543210fedcba9876543210fedcba98".to_string(), h],
            )
        }),
        6 => Head::Status(pick(rng, &[404, 401, 500, 416, 204]), Vec::new()),
        7 => Head::Status(pick(rng, &[301, 302, 307]), bad_redirect(rng, "/loop")),
        _ => Head::Honest,
    }
}

fn make_get(rng: &mut Rng) -> Get {
    let content_range = match rng.u8(..6) {
        0 => Some(None),
        1 => Some(Some({
            let h = hostile_value(rng);
            pick(
                rng,
                &[
                    "bytes 0-0/1".to_string(),
                    "bytes 5-4/10".into(),
                    "bytes */100".into(),
                    "bytes 0-99999999/100000000".into(),
                    h,
                ],
            )
        })),
        _ => None,
    };
    let extra = match rng.u8(..8) {
        0 => vec![("Content-Encoding", "gzip".to_string())],
        1 => bad_redirect(rng, "/loop"),
        _ => Vec::new(),
    };
    Get {
        status: (rng.u8(..3) == 0).then(|| pick(rng, &[200, 206, 302, 404, 416, 500, 204])),
        content_range,
        length: match rng.u8(..4) {
            0 => None,
            1 => Some(rng.i64(-1000..1000)),
            _ => Some(0),
        },
        body: match rng.u8(..4) {
            0 => Body::Cut(rng.u8(..255)),
            1 => Body::Longer(pick(rng, &[1, 17, 4096, 2 << 20])),
            _ => Body::Same,
        },
        extra,
    }
}

fn make_case(rng: &mut Rng) -> Case {
    let get = (rng.u8(..4) != 0).then(|| make_get(rng));
    // A body cut short every time still brings new bytes each time, and each try that does
    // starts the retry count again (as in huggingface_hub): a slow drip, not a hang, but longer
    // than an input may take.
    let drips = get.as_ref().is_some_and(|g| matches!(g.body, Body::Cut(_)));
    Case {
        listing: make_listing(rng),
        listing_always: rng.bool(),
        file: rng.usize(..read_files().len()),
        head: make_head(rng),
        head_always: rng.bool(),
        get,
        get_always: rng.bool() && !drips,
    }
}

/// The listing's replacement for one request.
fn listing_answer(l: &Listing, reply: &Reply) -> Option<Vec<u8>> {
    let json = |body: &[u8]| raw(200, &[("Content-Length", body.len().to_string())], body);
    let honest = String::from_utf8_lossy(&reply.2).into_owned();
    Some(match l {
        Listing::Honest => return None,
        Listing::Status(s, head) => raw(*s, head, b""),
        Listing::Bytes(b) => json(b),
        Listing::Sha(sha) => json(honest.replace(SHA, sha).as_bytes()),
        Listing::Names(names) => {
            let extra: String = names
                .iter()
                .map(|n| format!(r#"{{"rfilename":"{n}"}},"#))
                .collect();
            json(
                honest
                    .replace(r#""siblings":["#, &format!(r#""siblings":[{extra}"#))
                    .as_bytes(),
            )
        }
        Listing::TooMany => {
            let many = vec![r#"{"rfilename":"f"}"#; 100_001].join(",");
            json(
                honest
                    .replace(r#""siblings":["#, &format!(r#""siblings":[{many},"#))
                    .as_bytes(),
            )
        }
        Listing::Cut(f) => {
            let n = reply.2.len() * usize::from(*f) / 255;
            raw(
                200,
                &[("Content-Length", reply.2.len().to_string())],
                &reply.2[..n],
            )
        }
    })
}

/// One file's metadata replacement, and the size it announces (when it is a number).
fn head_answer(h: &Head, reply: &Reply) -> Option<(Vec<u8>, Option<u64>)> {
    let mut head: Vec<(&str, String)> = reply.1.iter().map(|(k, v)| (*k, v.clone())).collect();
    head.push(("Content-Length", reply.2.len().to_string()));
    match h {
        Head::Honest => return None,
        Head::Drop(name) => head.retain(|(k, _)| k != name),
        Head::Set(name, v) => {
            head.retain(|(k, _)| k != name);
            head.push((name, v.clone()));
        }
        Head::Status(s, extra) => {
            head.extend(extra.iter().cloned());
            return Some((raw(*s, &head, b""), None));
        }
    }
    let size = head
        .iter()
        .find(|(k, _)| *k == "X-Linked-Size")
        .or_else(|| head.iter().find(|(k, _)| *k == "Content-Length"))
        .and_then(|(_, v)| v.trim().parse().ok());
    Some((raw(reply.0, &head, b""), size))
}

fn get_answer(g: &Get, reply: &Reply) -> Vec<u8> {
    let mut head: Vec<(&str, String)> = reply.1.iter().map(|(k, v)| (*k, v.clone())).collect();
    if let Some(cr) = &g.content_range {
        head.retain(|(k, _)| *k != "Content-Range");
        if let Some(v) = cr {
            head.push(("Content-Range", v.clone()));
        }
    }
    let honest_len = reply.2.len();
    let body = match g.body {
        Body::Same => reply.2.clone(),
        Body::Cut(f) => reply.2[..honest_len * usize::from(f) / 255].to_vec(),
        Body::Longer(n) => {
            let mut b = reply.2.clone();
            b.extend(std::iter::repeat_n(b'z', n));
            b
        }
    };
    if let Some(d) = g.length {
        let n = (body.len() as i64 + d).max(0);
        head.push(("Content-Length", n.to_string()));
    }
    head.extend(g.extra.iter().cloned());
    raw(g.status.unwrap_or(reply.0), &head, &body)
}

/// Sizes the hub announced per file in this run (its honest sizes among them).
type Announced = Arc<Mutex<BTreeMap<String, BTreeSet<u64>>>>;

/// The hook that plays `case`, recording what it announces.
fn hook(case: &Case, announced: Announced) -> Hook {
    let case = case.clone();
    let target = read_files()[case.file].clone();
    let (listing_done, head_done, get_done) = (
        AtomicBool::new(false),
        AtomicBool::new(false),
        AtomicBool::new(false),
    );
    // Whether a mutation applies to this request: every time, or the first time only.
    let turn = |always: bool, done: &AtomicBool| always || !done.swap(true, Ordering::SeqCst);
    Box::new(move |seen: &Seen, reply: &Reply| {
        if seen.path.starts_with("/api/") {
            return turn(case.listing_always, &listing_done)
                .then(|| listing_answer(&case.listing, reply))
                .flatten();
        }
        let file = resolved_file(&seen.path)?;
        if seen.method == "HEAD" {
            let honest = reply.2.len() as u64;
            let mine = file == target && turn(case.head_always, &head_done);
            let answer = mine.then(|| head_answer(&case.head, reply)).flatten();
            let size = answer.as_ref().map_or(Some(honest), |(_, s)| *s);
            let mut a = announced.lock().unwrap();
            a.entry(file)
                .or_default()
                .extend(size.into_iter().chain([honest]));
            return answer.map(|(bytes, _)| bytes);
        }
        let g = case.get.as_ref().filter(|_| file == target)?;
        turn(case.get_always, &get_done).then(|| get_answer(g, reply))
    })
}

fn check(case: &Case) {
    let hub = Hub::start(one_repo(REPO, llama_repo()));
    let announced: Announced = Arc::default();
    hub.hook(hook(case, announced.clone()));
    let home = TempDir::new().unwrap();
    let env = [
        ("HF_HUB_ETAG_TIMEOUT", "1"),
        ("HF_HUB_DOWNLOAD_TIMEOUT", "1"),
    ];
    let b = run_bounded(
        &hub.url(),
        home.path(),
        &env,
        &["inspect", REPO, "--json"],
        MAX_RSS_KIB >> 10,
        PER_RUN,
    );
    let ctx = format!(
        "exit {:?}, signal {:?}, stderr: {}",
        b.code, b.signal, b.stderr
    );
    assert!(!b.timed_out, "still running after {PER_RUN:?}: {ctx}");
    assert!(matches!(b.code, Some(0 | 1 | 3)), "{ctx}");
    assert!(!b.stderr.contains("panicked"), "{ctx}");
    assert!(
        b.max_rss_kib < MAX_RSS_KIB,
        "peak memory {} KiB: {ctx}",
        b.max_rss_kib
    );
    if b.code != Some(0) {
        assert!(b.stderr.starts_with("error: "), "{ctx}");
    }
    let announced = announced.lock().unwrap().clone();
    let largest = announced
        .values()
        .flatten()
        .copied()
        .filter(|n| *n < 1 << 30)
        .max();
    let rd = repo_dir(&home.path().join("hub"));
    for (path, len) in files_under(&rd.join("blobs")) {
        assert!(
            largest.is_some_and(|l| len <= l),
            "{} holds {len} bytes, more than any size announced ({announced:?}): {ctx}",
            path.display()
        );
    }
    if b.code != Some(0) {
        return;
    }
    let repo = llama_repo();
    let v: serde_json::Value = serde_json::from_slice(&b.stdout).expect("a JSON report");
    assert_schema(&["inspect"], &v);
    let snapshot = rd
        .join("snapshots")
        .join(v["hub"]["commit"].as_str().unwrap_or(SHA));
    for f in read_files() {
        let Ok(got) = std::fs::read(snapshot.join(&f)) else {
            continue;
        };
        let sizes = announced.get(&f).cloned().unwrap_or_default();
        assert!(
            sizes.is_empty() || sizes.contains(&(got.len() as u64)),
            "{f}: {} bytes, announced {sizes:?}: {ctx}",
            got.len()
        );
        let truth = &repo.files[&f];
        assert!(
            truth.starts_with(&got) || got.starts_with(truth),
            "{f}: bytes that are not the hub's: {ctx}"
        );
    }
}

#[test]
fn fuzz_hub_answers() {
    fuzz(
        "hub-answers",
        0x4855_4224,
        INPUTS,
        make_case,
        |c| format!("{c:#?}").into_bytes(),
        check,
    );
}
