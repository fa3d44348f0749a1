//! Property/fuzz tests with fixed seeds: thousands of mutated safetensors headers, index files,
//! config.json / params.json files, `--hf-overrides` strings, mapping files and mapping expressions,
//! made from the golden fixtures and the shipped mappings. Each must end in `Ok` or a typed error:
//! never a panic, never a hang, never more than a second. A failure names the seed and the input
//! number and leaves the input in the temp folder, so it can be replayed.
//!
//! The inputs are generated deterministically from `(seed, input number)`, so a failure found here
//! is found again on every run and on every machine.

use std::fs;
use std::io::Write;
use std::panic::{self, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use fastrand::Rng;
use serde_json::{Map, Value, json};
use tempfile::TempDir;

use crate::support::*;

// Mapping files as applied (named so as not to shadow `wload::mapping`).
#[path = "mapping.rs"]
mod applied_mappings;
use wload::testing::{self as checkpoint, Expr};
use wload::{ConfigFormat, Error, LoadFormat};

mod hub;
mod runs;

/// No single input may take longer than this (the issue's bound), in CPU time of the thread that
/// checks it: the suite is one process whose other tests share the cores, and wall time would
/// count their work too.
const PER_INPUT: Duration = Duration::from_secs(1);
/// An input still running after this much wall time is a hang: the test fails at once. The thread
/// stuck on it cannot be stopped from outside, so it is left behind (it ends with the process);
/// the other tests in the binary go on.
const HANG: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------------
// The harness
// ---------------------------------------------------------------------------------------------

/// Runs `check` on `n` inputs, input `i` made by `make` from an `Rng` seeded with `(seed, i)`.
/// Each call runs under `catch_unwind` and a clock; every panic and every slow input is collected
/// and the test fails listing them (at most 10), with the inputs saved as files for replay.
///
/// The inputs are checked on a thread of their own while the test's thread watches it, so that a
/// hang fails this test rather than ending the test binary (all integration tests share it).
fn fuzz<I: 'static>(
    target: &str,
    seed: u64,
    n: usize,
    make: impl FnMut(&mut Rng) -> I + Send + 'static,
    save: impl Fn(&I) -> Vec<u8> + Send + 'static,
    check: impl FnMut(&I) + Send + 'static,
) {
    let current = Arc::new(AtomicUsize::new(usize::MAX));
    let started = Arc::new(std::sync::Mutex::new(Instant::now()));
    let worker = {
        let (current, started) = (current.clone(), started.clone());
        let target = target.to_string();
        std::thread::Builder::new()
            .name(format!("fuzz {target}"))
            .spawn(move || run_inputs(&target, seed, n, make, save, check, &current, &started))
            .expect("a thread for the inputs")
    };
    while !worker.is_finished() {
        std::thread::sleep(Duration::from_millis(50));
        let i = current.load(Ordering::Relaxed);
        let running = started.lock().unwrap().elapsed();
        // `current` is read again: the input may have finished between the two reads.
        if i != usize::MAX && running > HANG && current.load(Ordering::Relaxed) == i {
            panic!(
                "fuzz {target}: input {i} (seed {seed:#x}) still running after {running:?}: a hang"
            );
        }
    }
    let failures = worker.join().unwrap_or_else(|p| panic::resume_unwind(p));
    assert!(
        failures.is_empty(),
        "fuzz {target} (seed {seed:#x}): {} of {n} inputs failed:\n{}",
        failures.len(),
        failures
            .iter()
            .take(10)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}

/// The loop of [`fuzz`], on its own thread: checks every input, publishing which one runs and
/// since when, and returns the failures.
#[allow(clippy::too_many_arguments)]
fn run_inputs<I>(
    target: &str,
    seed: u64,
    n: usize,
    mut make: impl FnMut(&mut Rng) -> I,
    save: impl Fn(&I) -> Vec<u8>,
    mut check: impl FnMut(&I),
    current: &AtomicUsize,
    started: &std::sync::Mutex<Instant>,
) -> Vec<String> {
    let mut failures = Vec::new();
    let mut slowest = Duration::ZERO;
    let mut checking = Duration::ZERO;
    let t_all = Instant::now();
    for i in 0..n {
        let mut rng = Rng::with_seed(seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
        let input = make(&mut rng);
        *started.lock().unwrap() = Instant::now();
        current.store(i, Ordering::Relaxed);
        let cpu = thread_cpu_seconds();
        let outcome = panic::catch_unwind(AssertUnwindSafe(|| check(&input)));
        let took = Duration::from_secs_f64((thread_cpu_seconds() - cpu).max(0.0));
        current.store(usize::MAX, Ordering::Relaxed);
        slowest = slowest.max(took);
        checking += took;
        let problem = match outcome {
            Err(p) => Some(format!("panicked: {}", panic_text(&p))),
            Ok(()) if took > PER_INPUT => {
                Some(format!("took {took:?} of CPU (limit {PER_INPUT:?})"))
            }
            Ok(()) => None,
        };
        if let Some(problem) = problem {
            let file = std::env::temp_dir().join(format!("wload-fuzz-{target}-{seed:x}-{i}.bin"));
            let _ = fs::write(&file, save(&input));
            failures.push(format!(
                "input {i}: {problem} (input saved to {})",
                file.display()
            ));
        }
    }
    eprintln!(
        "fuzz {target}: {n} inputs in {:?} ({checking:?} of CPU in wload), slowest {slowest:?}",
        t_all.elapsed()
    );
    failures
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(non-string panic)".into())
}

// ---------------------------------------------------------------------------------------------
// Mutations
// ---------------------------------------------------------------------------------------------

/// Fragments that parsers of JSON and YAML tend to trip on.
const TOKENS: &[&str] = &[
    "0",
    "-0",
    "-1",
    "1.5",
    "1e999",
    "-1e999",
    "1e-999",
    "18446744073709551615",
    "18446744073709551616",
    "9223372036854775807",
    "-9223372036854775808",
    "340282366920938463463374607431768211456",
    "NaN",
    "Infinity",
    "null",
    "true",
    "[]",
    "{}",
    "\"\"",
    "\"\\u0000\"",
    "\"\\ud800\"",
    "\"\\uDFFF\\uD800\"",
    "[[[[[[[[[[",
    "]]]]]",
    "{\"a\":",
    "}}}}",
    ",",
    ":",
    "\"",
    "\\",
    "\u{feff}",
    "é",
    "\u{202e}",
    "\n",
    "\t",
    " ",
];

/// Interesting integers for dimensions and offsets.
fn big_number(rng: &mut Rng) -> Value {
    match rng.u8(..14) {
        0 => json!(0),
        1 => json!(1),
        2 => json!(-1),
        3 => json!(u64::MAX),
        4 => json!(u64::MAX / 2 + 1),
        5 => json!(1u64 << 32),
        6 => json!(i64::MIN),
        7 => json!(1.5),
        8 => json!(1e300),
        9 => json!("3"),
        10 => Value::Null,
        11 => json!([2]),
        12 => json!(rng.u64(..)),
        _ => json!(rng.u64(..4096)),
    }
}

/// Raw JSON text for a value, including things a `Value` cannot hold: nesting deeper than any
/// parser's limit, numbers beyond f64, and NaN.
fn hostile_json(rng: &mut Rng) -> String {
    match rng.u8(..8) {
        0 => {
            let depth = [10, 127, 129, 1000, 100_000][rng.usize(..5)];
            format!("{}{}", "[".repeat(depth), "]".repeat(depth))
        }
        1 => {
            let depth = [10, 129, 50_000][rng.usize(..3)];
            format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth))
        }
        2 => "1".repeat(rng.usize(20..400)),
        3 => "NaN".into(),
        4 => format!("\"{}\"", "x".repeat(rng.usize(..20_000))),
        5 => format!("[{}]", vec!["1"; rng.usize(..5_000)].join(",")),
        6 => TOKENS[rng.usize(..TOKENS.len())].to_string(),
        _ => big_number(rng).to_string(),
    }
}

/// 1–4 byte-level edits of `base`: bit flips, overwrites, deletions, insertions of tokens or
/// random bytes (non-UTF-8 included), duplicated ranges, splices from `others`, truncation.
fn mutate_bytes(rng: &mut Rng, base: &[u8], others: &[&[u8]]) -> Vec<u8> {
    let mut v = base.to_vec();
    for _ in 0..rng.usize(1..=4) {
        let len = v.len();
        let at = if len == 0 { 0 } else { rng.usize(..=len) };
        match rng.u8(..10) {
            0 if len > 0 => {
                let i = rng.usize(..len);
                v[i] ^= 1 << rng.u8(..8);
            }
            1 if len > 0 => {
                let i = rng.usize(..len);
                v[i] =
                    [0x00, 0xff, 0x80, 0xc3, b'"', b'{', b'[', b'-', b'9', b'\\'][rng.usize(..10)];
            }
            2 if len > 0 => {
                let end = (at + rng.usize(1..64)).min(len);
                v.drain(at.min(end)..end);
            }
            3 => {
                let t = TOKENS[rng.usize(..TOKENS.len())].as_bytes();
                v.splice(at..at, t.iter().copied());
            }
            4 => {
                let junk: Vec<u8> = (0..rng.usize(1..16)).map(|_| rng.u8(..)).collect();
                v.splice(at..at, junk);
            }
            5 if len > 0 => {
                let s = rng.usize(..len);
                let e = (s + rng.usize(1..256)).min(len);
                let piece = v[s..e].to_vec();
                v.splice(at..at, piece);
            }
            6 if !others.is_empty() => {
                let o = others[rng.usize(..others.len())];
                if !o.is_empty() {
                    let s = rng.usize(..o.len());
                    let e = (s + rng.usize(1..512)).min(o.len());
                    let cut = (at + rng.usize(..64)).min(len);
                    v.splice(at..cut, o[s..e].iter().copied());
                }
            }
            7 => v.truncate(at),
            8 => {
                // A digit run replaced by a hostile number.
                if let Some(i) = (at..len).find(|&i| v[i].is_ascii_digit()) {
                    let e = (i..len).find(|&j| !v[j].is_ascii_digit()).unwrap_or(len);
                    let n = big_number(rng).to_string();
                    v.splice(i..e, n.bytes());
                }
            }
            _ => {
                let t = hostile_json(rng);
                v.splice(at..at, t.bytes());
            }
        }
    }
    v
}

/// A JSON object written entry by entry, so that it can hold repeated keys and raw hostile text.
fn object_text(entries: &[(String, String)]) -> String {
    let body: Vec<String> = entries
        .iter()
        .map(|(k, v)| format!("{}:{v}", Value::String(k.clone())))
        .collect();
    format!("{{{}}}", body.join(","))
}

fn entries_of(v: &Value) -> Vec<(String, String)> {
    v.as_object()
        .map(|m| m.iter().map(|(k, v)| (k.clone(), v.to_string())).collect())
        .unwrap_or_default()
}

/// Fixture files of one kind (by file name), each read once.
fn fixture_files(pred: impl Fn(&str) -> bool) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    for name in fixture_names() {
        let dir = fixtures_dir().join(&name);
        let mut entries: Vec<_> = fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        entries.sort();
        for p in entries {
            if pred(p.file_name().unwrap().to_str().unwrap()) {
                out.push((p.clone(), fs::read(&p).unwrap()));
            }
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// (a) safetensors headers
// ---------------------------------------------------------------------------------------------

/// A safetensors file as the header reader meets it: the first bytes, and the file's size (the
/// rest is a hole, so that multi-GB claims cost nothing).
struct StFile {
    head: Vec<u8>,
    size: u64,
}

/// (header JSON text, data region length) of every fixture shard.
fn header_corpus() -> &'static Vec<(Vec<u8>, u64)> {
    static C: OnceLock<Vec<(Vec<u8>, u64)>> = OnceLock::new();
    C.get_or_init(|| {
        fixture_files(|n| n.ends_with(".safetensors"))
            .into_iter()
            .map(|(_, b)| {
                let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
                (b[8..8 + n].to_vec(), (b.len() - 8 - n) as u64)
            })
            .collect()
    })
}

const DTYPES: &[&str] = &[
    "F32", "BF16", "F16", "F64", "I64", "U8", "BOOL", "F4", "F6_E2M3", "F8_E4M3", "C64", "bf16",
    "", "F128", "float32",
];

/// One structural edit of a header's entries.
fn mutate_header_entries(rng: &mut Rng, e: &mut Vec<(String, String)>, data_len: u64) {
    let tensor = |rng: &mut Rng, e: &Vec<(String, String)>| {
        let idx: Vec<usize> = (0..e.len()).filter(|&i| e[i].0 != "__metadata__").collect();
        (!idx.is_empty()).then(|| idx[rng.usize(..idx.len())])
    };
    let Some(t) = tensor(rng, e) else {
        e.push(("x".into(), hostile_json(rng)));
        return;
    };
    let mut obj: Map<String, Value> = serde_json::from_str(&e[t].1).unwrap_or_default();
    match rng.u8(..14) {
        0 => {
            let dims = rng.usize(..6);
            obj.insert(
                "shape".into(),
                Value::Array((0..dims).map(|_| big_number(rng)).collect()),
            );
        }
        1 => {
            let pairs = [
                json!([0, u64::MAX]),
                json!([u64::MAX, u64::MAX]),
                json!([u64::MAX, 0]),
                json!([5, 3]),
                json!([-1, 4]),
                json!([0]),
                json!([0, 1, 2]),
                json!([0.5, 8]),
                json!(null),
                json!([data_len, data_len + 8]),
                json!([data_len / 2, data_len]),
            ];
            obj.insert(
                "data_offsets".into(),
                pairs[rng.usize(..pairs.len())].clone(),
            );
        }
        2 => {
            obj.insert("dtype".into(), json!(DTYPES[rng.usize(..DTYPES.len())]));
        }
        3 => {
            let keys: Vec<String> = obj.keys().cloned().collect();
            if !keys.is_empty() {
                obj.remove(&keys[rng.usize(..keys.len())]);
            }
        }
        4 => {
            obj.insert("extra".into(), json!(1));
        }
        5 => {
            // The same name twice, possibly with other offsets.
            let copy = e[t].clone();
            e.insert(rng.usize(..=e.len()), copy);
            return;
        }
        6 => {
            e.remove(t);
            return;
        }
        7 => {
            let m = [
                "null",
                "{\"a\":1}",
                "[]",
                "{\"format\":\"pt\",\"format\":\"np\"}",
                "7",
            ];
            e.push(("__metadata__".into(), m[rng.usize(..m.len())].into()));
            return;
        }
        8 => {
            e[t].1 = hostile_json(rng);
            return;
        }
        9 => {
            // Many empty tensors: the header grows, each must still parse in linear time.
            for k in 0..rng.usize(1..2000) {
                let at = rng.u64(..=data_len);
                e.push((
                    format!("zero.{k}"),
                    format!(r#"{{"dtype":"F32","shape":[0],"data_offsets":[{at},{at}]}}"#),
                ));
            }
            return;
        }
        10 => {
            // Offsets of two tensors exchanged: overlaps and gaps.
            if let Some(u) = tensor(rng, e) {
                let other: Map<String, Value> = serde_json::from_str(&e[u].1).unwrap_or_default();
                if let Some(o) = other.get("data_offsets") {
                    obj.insert("data_offsets".into(), o.clone());
                }
            }
        }
        11 => {
            let names = [
                String::new(),
                "é\u{0}".into(),
                "a".repeat(100_000),
                "__metadata__".into(),
            ];
            e[t].0 = names[rng.usize(..names.len())].clone();
        }
        12 => {
            let shapes = [
                json!([0, u64::MAX, u64::MAX]),
                json!([u64::MAX, u64::MAX, 0]),
                json!(vec![1; 5000]),
                json!([1u64 << 62, 4]),
                json!([3]),
            ];
            obj.insert("shape".into(), shapes[rng.usize(..shapes.len())].clone());
            obj.insert(
                "dtype".into(),
                json!(["F4", "F32", "F6_E3M2"][rng.usize(..3)]),
            );
        }
        _ => {
            let keys: Vec<String> = obj.keys().cloned().collect();
            if !keys.is_empty() {
                let k = &keys[rng.usize(..keys.len())];
                obj.insert(k.clone(), big_number(rng));
            }
        }
    }
    e[t].1 = Value::Object(obj).to_string();
}

fn make_header(rng: &mut Rng) -> StFile {
    let corpus = header_corpus();
    let (text, data_len) = &corpus[rng.usize(..corpus.len())];
    if rng.u8(..40) == 0 {
        // Shorter than the length prefix, or exactly it.
        let len = rng.usize(..=9);
        return StFile {
            head: (0..len).map(|_| rng.u8(..)).collect(),
            size: len as u64,
        };
    }
    let mut text = text.clone();
    let mode = rng.u8(..10);
    if mode < 6 {
        let v: Value = serde_json::from_slice(&text).unwrap();
        let mut entries = entries_of(&v);
        for _ in 0..rng.usize(1..=3) {
            mutate_header_entries(rng, &mut entries, *data_len);
        }
        text = object_text(&entries).into_bytes();
    }
    if mode >= 4 {
        let others: Vec<&[u8]> = corpus.iter().map(|(t, _)| t.as_slice()).collect();
        text = mutate_bytes(rng, &text, &others);
    }
    let len = text.len() as u64;
    let prefix = match rng.u8(..12) {
        0 => u64::MAX,
        1 => checkpoint::MAX_HEADER_LEN + 1,
        2 => len + 1,
        3 => len.saturating_sub(1),
        4 => rng.u64(..),
        _ => len,
    };
    let mut head = prefix.to_le_bytes().to_vec();
    head.extend_from_slice(&text);
    let natural = 8 + len + data_len;
    let size = match rng.u8(..10) {
        0 => rng.u64(..=natural),
        1 => natural + rng.u64(1..4096),
        2 => 8 + len + (1 << 40),
        _ => natural,
    };
    // The head is written whole, so the file is never shorter than it.
    StFile {
        size: size.max(head.len() as u64),
        head,
    }
}

#[test]
fn fuzz_safetensors_headers() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("model.safetensors");
    fuzz(
        "headers",
        0x5AFE_7E45,
        5000,
        make_header,
        |f| f.head.clone(),
        move |f| {
            let mut file = fs::File::create(&path).unwrap();
            file.write_all(&f.head).unwrap();
            file.set_len(f.size).unwrap();
            drop(file);
            if let Ok(w) = checkpoint::read_header(&path, "model.safetensors", 0) {
                // What the reader accepts, the rest of wload may rely on.
                let data_len = w.size - w.data_start();
                let mut covered = 0u64;
                for t in &w.tensors {
                    assert!(
                        t.offset >= w.data_start() && t.offset - w.data_start() + t.len <= data_len
                    );
                    let numel = t.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
                    assert_eq!(
                        numel.and_then(|n| t.dtype.byte_size(n)),
                        Some(t.len),
                        "{}",
                        t.name
                    );
                    covered += t.len;
                }
                assert_eq!(covered, data_len);
                let _ = checkpoint::Checkpoint::from_files(vec![w.clone(), w]);
            }
        },
    );
}

// ---------------------------------------------------------------------------------------------
// (b) model.safetensors.index.json
// ---------------------------------------------------------------------------------------------

fn index_corpus() -> &'static Vec<Vec<u8>> {
    static C: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    C.get_or_init(|| {
        fixture_files(|n| n == "model.safetensors.index.json")
            .into_iter()
            .map(|(_, b)| b)
            .collect()
    })
}

fn make_index(rng: &mut Rng) -> Vec<u8> {
    let corpus = index_corpus();
    let mut text = corpus[rng.usize(..corpus.len())].clone();
    if rng.bool() {
        let v: Value = serde_json::from_slice(&text).unwrap();
        let mut top = entries_of(&v);
        let mut map = entries_of(&v["weight_map"]);
        for _ in 0..rng.usize(1..=3) {
            let i = rng
                .usize(..map.len().max(1))
                .min(map.len().saturating_sub(1));
            match rng.u8(..9) {
                0 if !map.is_empty() => {
                    let files = [
                        "../model-00001-of-00006.safetensors",
                        "/etc/passwd",
                        "",
                        ".",
                        "sub/x.safetensors",
                        "missing.safetensors",
                        "model-00001-of-00006.safetensors\u{0}",
                        "C:\\x.safetensors",
                    ];
                    map[i].1 = Value::from(files[rng.usize(..files.len())]).to_string();
                }
                1 if !map.is_empty() => map[i].1 = hostile_json(rng),
                2 if !map.is_empty() => {
                    let dup = map[i].clone();
                    map.push(dup);
                }
                3 => {
                    for k in 0..rng.usize(1..5_000) {
                        map.push((
                            format!("t.{k}"),
                            "\"model-00001-of-00006.safetensors\"".into(),
                        ));
                    }
                }
                4 => top.push(("weight_map".into(), hostile_json(rng))),
                5 => top.retain(|(k, _)| k != "weight_map"),
                6 if !map.is_empty() => map[i].0 = "\u{e9}\\".into(),
                7 => top.push(("metadata".into(), hostile_json(rng))),
                _ => map.clear(),
            }
        }
        for (k, v) in top.iter_mut() {
            if k == "weight_map" && v.starts_with('{') {
                *v = object_text(&map);
            }
        }
        text = object_text(&top).into_bytes();
    }
    if rng.bool() {
        let others: Vec<&[u8]> = corpus.iter().map(Vec::as_slice).collect();
        text = mutate_bytes(rng, &text, &others);
    }
    text
}

#[test]
fn fuzz_index_files() {
    // A folder with every shard name the fixture indexes use (empty: resolution reads no header).
    let dir = TempDir::new().unwrap();
    write_json(&dir.path().join("config.json"), &tiny_config());
    for n in [5, 6] {
        for k in 1..=n {
            fs::write(
                dir.path()
                    .join(format!("model-{k:05}-of-{n:05}.safetensors")),
                b"",
            )
            .unwrap();
        }
    }
    let index = dir.path().join("model.safetensors.index.json");
    fuzz(
        "index",
        0x1DE7_0001,
        3000,
        make_index,
        Vec::clone,
        move |text| {
            fs::write(&index, text).unwrap();
            match wload::testing::resolve_local(dir.path(), LoadFormat::Auto, ConfigFormat::Auto) {
                Ok(r) => {
                    for f in &r.files {
                        assert!(dir.path().join(&f.file).is_file(), "kept {}", f.file);
                    }
                }
                Err(e) => {
                    let e = Error::from(e);
                    // A malformed index is the checkpoint's fault, never an I/O failure.
                    assert_eq!(e.exit_status() as u8, 3, "{e}");
                    assert!(
                        e.to_string().contains("model.safetensors.index.json"),
                        "{e}"
                    );
                }
            }
        },
    );
}

// ---------------------------------------------------------------------------------------------
// (c) config.json, params.json and --hf-overrides
// ---------------------------------------------------------------------------------------------

fn params_json() -> Value {
    json!({
        "dim": 128, "n_layers": 2, "head_dim": 16, "hidden_dim": 256, "n_heads": 8,
        "n_kv_heads": 2, "norm_eps": 1e-5, "vocab_size": 1000, "rope_theta": 1e6,
        "tied_embeddings": false,
        "moe": {"num_experts": 4, "num_experts_per_tok": 2, "num_shared_experts": 0}
    })
}

fn config_corpus() -> &'static Vec<Vec<u8>> {
    static C: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    C.get_or_init(|| {
        let mut v: Vec<Vec<u8>> = fixture_files(|n| n == "config.json")
            .into_iter()
            .map(|(_, b)| b)
            .collect();
        v.push(serde_json::to_vec_pretty(&params_json()).unwrap());
        v.push(
            serde_json::to_vec(&json!({"architectures": ["LlavaForConditionalGeneration"],
                "text_config": tiny_config()}))
            .unwrap(),
        );
        v
    })
}

const CONFIG_FIELDS: &[&str] = &[
    "architectures",
    "hidden_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "intermediate_size",
    "num_local_experts",
    "tie_word_embeddings",
    "quantization_config",
    "text_config",
    "moe",
    "dim",
    "n_layers",
    "dtype",
];

fn mutate_config_entries(rng: &mut Rng, e: &mut Vec<(String, String)>) {
    let field = CONFIG_FIELDS[rng.usize(..CONFIG_FIELDS.len())].to_string();
    let value = match rng.u8(..4) {
        0 => hostile_json(rng),
        1 => big_number(rng).to_string(),
        2 => json!({"num_hidden_layers": big_number(rng), "quant_method": 5}).to_string(),
        _ => json!([big_number(rng), "x"]).to_string(),
    };
    match rng.u8(..3) {
        // A repeated key: serde_json keeps the last.
        0 => e.push((field, value)),
        1 => e.retain(|(k, _)| *k != field),
        _ => match e.iter_mut().find(|(k, _)| *k == field) {
            Some(slot) => slot.1 = value,
            None => e.push((field, value)),
        },
    }
}

struct ConfigCase {
    text: Vec<u8>,
    mistral: bool,
    overrides: Option<String>,
}

fn make_config(rng: &mut Rng) -> ConfigCase {
    let corpus = config_corpus();
    let k = rng.usize(..corpus.len());
    let mut text = corpus[k].clone();
    let mistral = k == corpus.len() - 2 || rng.u8(..8) == 0;
    if rng.u8(..3) != 0 {
        let v: Value = serde_json::from_slice(&text).unwrap();
        let mut entries = entries_of(&v);
        for _ in 0..rng.usize(1..=3) {
            mutate_config_entries(rng, &mut entries);
        }
        text = object_text(&entries).into_bytes();
    }
    if rng.bool() {
        let others: Vec<&[u8]> = corpus.iter().map(Vec::as_slice).collect();
        text = mutate_bytes(rng, &text, &others);
    }
    let overrides = rng.bool().then(|| {
        let mut o = Vec::new();
        for _ in 0..rng.usize(1..=3) {
            mutate_config_entries(rng, &mut o);
        }
        let t = object_text(&o);
        if rng.bool() {
            String::from_utf8_lossy(&mutate_bytes(rng, t.as_bytes(), &[])).into_owned()
        } else {
            t
        }
    });
    ConfigCase {
        text,
        mistral,
        overrides,
    }
}

#[test]
fn fuzz_configs_and_overrides() {
    let dir = TempDir::new().unwrap();
    fuzz(
        "config",
        0xC0F1_6000,
        5000,
        make_config,
        |c| {
            let mut b = c.text.clone();
            b.extend_from_slice(b"\n--hf-overrides ");
            b.extend_from_slice(c.overrides.as_deref().unwrap_or("").as_bytes());
            b
        },
        move |c| {
            let file = if c.mistral {
                "params.json"
            } else {
                "config.json"
            };
            fs::write(dir.path().join(file), &c.text).unwrap();
            let overrides = match c.overrides.as_deref().map(wload::parse_overrides) {
                Some(Err(e)) => {
                    assert_eq!(e.exit_status(), wload::ExitStatus::Usage, "{e}");
                    None
                }
                Some(Ok(o)) => Some(o),
                None => None,
            };
            let format = if c.mistral {
                ConfigFormat::Mistral
            } else {
                ConfigFormat::Hf
            };
            if let Err(e) =
                wload::testing::load_config(dir.path(), file, format, overrides.as_ref())
            {
                let e = Error::from(e);
                // The file's faults are exit 3, the flag's exit 2; a config never reads as I/O.
                let code = e.exit_status() as u8;
                assert!(code == 2 || code == 3, "exit {code}: {e}");
                if code == 3 {
                    assert!(e.to_string().contains(file), "{e}");
                }
            }
        },
    );
}

// ---------------------------------------------------------------------------------------------
// (d) mapping files and their expressions
// ---------------------------------------------------------------------------------------------

fn mapping_corpus() -> Vec<&'static str> {
    wload::testing::EMBEDDED
        .iter()
        .map(|(_, t)| *t)
        .chain([wload::testing::COMMON])
        .collect()
}

/// YAML features a hand-written mapping may contain, for better or worse.
const YAML_BITS: &[&str] = &[
    "&a ",
    "*a",
    "<<: *a\n",
    "!!binary ",
    "!!python/object:os.system ",
    "---\n",
    "...\n",
    "%YAML 1.2\n",
    "? ",
    "\t",
    "  - ",
    "extends: llama\n",
    "extends: nonexistent\n",
    "extends: [llama]\n",
    "0x10",
    ".nan",
    "-.inf",
    "~",
    "'",
    "|\n",
    ">-\n",
    "{",
    "[",
    "(((",
    "1e999",
    "pattern: '(((((('\n",
    "pattern: 'a{1000}{1000}{1000}'\n",
];

fn billion_laughs(rng: &mut Rng) -> String {
    let levels = rng.usize(3..10);
    let mut s = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x]\n");
    for l in 1..levels {
        let refs = vec![format!("*a{}", l - 1); 9].join(", ");
        s.push_str(&format!("a{l}: &a{l} [{refs}]\n"));
    }
    s.push_str(&format!("family: *a{}\n", levels - 1));
    s
}

fn make_mapping(rng: &mut Rng) -> Vec<u8> {
    let corpus = mapping_corpus();
    let base = corpus[rng.usize(..corpus.len())].as_bytes();
    match rng.u8(..20) {
        0 => return billion_laughs(rng).into_bytes(),
        1 => {
            let depth = [100, 1000, 100_000][rng.usize(..3)];
            return format!("family: {}{}", "[".repeat(depth), "]".repeat(depth)).into_bytes();
        }
        2 => {
            let depth = [100, 500][rng.usize(..2)];
            let mut s = String::new();
            for d in 0..depth {
                s.push_str(&" ".repeat(d));
                s.push_str("a:\n");
            }
            return s.into_bytes();
        }
        _ => {}
    }
    let mut v = base.to_vec();
    if rng.bool() {
        for _ in 0..rng.usize(1..=3) {
            let bit = YAML_BITS[rng.usize(..YAML_BITS.len())].as_bytes();
            let at = line_start(&v, rng.usize(..=v.len()));
            v.splice(at..at, bit.iter().copied());
        }
    }
    if rng.u8(..3) != 0 {
        let others: Vec<&[u8]> = corpus.iter().map(|t| t.as_bytes()).collect();
        v = mutate_bytes(rng, &v, &others);
    }
    v
}

fn line_start(v: &[u8], at: usize) -> usize {
    v[..at]
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(0, |i| i + 1)
}

#[test]
fn fuzz_mapping_files() {
    let dir = TempDir::new().unwrap();
    let path = dir.path().join("fuzz.yaml");
    fuzz(
        "mapping",
        0x3A99_1E55,
        2000,
        make_mapping,
        Vec::clone,
        move |bytes| {
            // `--mapping FILE` reads bytes; the parser proper takes text.
            fs::write(&path, bytes).unwrap();
            let r = wload::testing::select_mapping(Some(&path), None);
            if let Err(e) = r {
                let e = Error::from(e);
                // A bad --mapping FILE is the user's file: a usage error that names it.
                assert_eq!(e.exit_status() as u8, 2, "{e}");
                assert!(e.to_string().contains("fuzz.yaml"), "{e}");
            }
        },
    );
}

const EXPR_WORDS: &[&str] = &[
    "hidden_size",
    "heads",
    "big",
    "neg",
    "min64",
    "zero",
    "list",
    "nothing",
    "f",
    "tp",
    "i",
    "1",
    "0",
    "-1",
    "9223372036854775807",
    "1e308",
    "2.5",
    "'s'",
    "[1, 2]",
    "[",
    "]",
    "(",
    ")",
    "+",
    "-",
    "*",
    "/",
    "//",
    "%",
    "??",
    "||",
    "&&",
    "!",
    "not",
    "and",
    "or",
    "in",
    "==",
    "!=",
    "<",
    "<=",
    ">",
    ">=",
    ",",
    "ceil_div(",
    "min(",
    "max(",
    "len(",
    "true",
    "null",
    "é",
    "$",
];

fn make_expr(rng: &mut Rng) -> String {
    if rng.u8(..30) == 0 {
        // Nesting far deeper than any mapping needs.
        let depth = [200, 5000, 100_000][rng.usize(..3)];
        let (open, close) = [
            ("(", ")"),
            ("-", ""),
            ("!", ""),
            ("not ", ""),
            ("min(", ")"),
        ][rng.usize(..5)];
        return format!("{}1{}", open.repeat(depth), close.repeat(depth));
    }
    if rng.u8(..30) == 0 {
        // A long flat chain.
        return vec!["1"; rng.usize(1000..50_000)].join(" + ");
    }
    (0..rng.usize(1..12))
        .map(|_| EXPR_WORDS[rng.usize(..EXPR_WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn fuzz_mapping_expressions() {
    let scope = |k: &str| -> Option<Value> {
        Some(match k {
            "hidden_size" => json!(4096),
            "heads" => json!(32),
            "big" => json!(i64::MAX),
            "neg" => json!(-1),
            "min64" => json!(i64::MIN),
            "zero" => json!(0),
            "list" => json!([1, 2, 3]),
            "nothing" => Value::Null,
            "f" => json!(1e308),
            "tp" => json!(2),
            "i" => json!(u64::MAX),
            _ => return None,
        })
    };
    fuzz(
        "expr",
        0xE4_9000,
        10_000,
        make_expr,
        |s| s.clone().into_bytes(),
        move |src| {
            if let Ok(e) = Expr::parse(src) {
                let _ = e.eval(&scope);
                let _ = e.eval_u64(&scope);
                let _ = e.eval_bool(&scope);
            }
        },
    );
}

// ---------------------------------------------------------------------------------------------
// The nastiest findings, through the binary: exit status and message
// ---------------------------------------------------------------------------------------------

/// Runs wload, expects `code`, returns stderr; bounded in time so that a regression to a hang fails.
fn wload_fails(args: &[&str], code: i32) -> String {
    let out = wload()
        .args(args)
        .timeout(Duration::from_secs(60))
        .output()
        .expect("wload runs");
    assert_refused(&out, code, &[])
}

/// Was: the binary overflowed its stack and aborted (SIGABRT) on a deeply nested expression.
#[test]
fn binary_deep_expression_in_a_mapping_is_a_usage_error() {
    let tmp = tiny_checkpoint();
    let file = tmp.path().join("deep.yaml");
    let deep = format!("{}1{}", "(".repeat(100_000), ")".repeat(100_000));
    fs::write(
        &file,
        format!("extends: llama\nfamily: deep\narchitectures: [LlamaForCausalLM]\nderive:\n  x: \"{deep}\"\n"),
    )
    .unwrap();
    let err = wload_fails(
        &["plan", s(tmp.path()), "--tp", "1", "--mapping", s(&file)],
        2,
    );
    assert!(err.contains("deep.yaml: invalid mapping"), "{err}");
    assert!(err.contains("more than 256 tokens"), "{err}");
}

/// Was: a panic (exit 101, "attempt to divide with overflow") while deriving values.
#[test]
fn binary_integer_overflow_in_a_mapping_expression_is_an_error() {
    let tmp = tiny_checkpoint();
    let file = tmp.path().join("boom.yaml");
    fs::write(
        &file,
        "extends: llama\nfamily: boom\narchitectures: [LlamaForCausalLM]\nderive:\n  boom: (0 - 9223372036854775807 - 1) // -1\n",
    )
    .unwrap();
    let out = wload()
        .args(["plan", s(tmp.path()), "--tp", "1", "--mapping", s(&file)])
        .timeout(Duration::from_secs(60))
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        matches!(out.status.code(), Some(2 | 3)),
        "{:?}\n{err}",
        out.status
    );
    assert!(err.contains("boom"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// Was: seconds of alias expansion before serde_saphyr's default budget gave up.
#[test]
fn binary_yaml_alias_bomb_is_refused_quickly() {
    let tmp = tiny_checkpoint();
    let file = tmp.path().join("laughs.yaml");
    fs::write(&file, billion_laughs(&mut Rng::with_seed(9))).unwrap();
    let t = Instant::now();
    let err = wload_fails(
        &["plan", s(tmp.path()), "--tp", "1", "--mapping", s(&file)],
        2,
    );
    assert!(err.contains("laughs.yaml: invalid mapping"), "{err}");
    assert!(err.contains("budget"), "{err}");
    assert!(t.elapsed() < Duration::from_secs(10), "{:?}", t.elapsed());
}

/// Was: exit 1 "cannot read: stream did not contain valid UTF-8", as if the disk had failed.
#[test]
fn binary_config_that_is_not_utf8_is_a_checkpoint_error() {
    let tmp = tiny_checkpoint();
    let mut text = serde_json::to_vec(&tiny_config()).unwrap();
    text.splice(1..1, *b"\"n\xffme\": 1, ");
    fs::write(tmp.path().join("config.json"), text).unwrap();
    let err = wload_fails(&["inspect", s(tmp.path())], 3);
    assert!(err.contains("config.json: not valid JSON"), "{err}");
}

/// Was: exit 1 as for the config; and an index naming none of the files got a hint about files
/// "this format does not read".
#[test]
fn binary_bad_index_is_a_checkpoint_error_naming_the_index() {
    let tmp = tiny_checkpoint();
    let index = tmp.path().join("model.safetensors.index.json");
    fs::write(
        &index,
        b"{\"weight_map\": {\"a\": \"model\xff.safetensors\"}}",
    )
    .unwrap();
    let err = wload_fails(&["inspect", s(tmp.path())], 3);
    assert!(
        err.contains("model.safetensors.index.json: not valid JSON: invalid UTF-8 at byte 27"),
        "{err}"
    );

    fs::write(&index, b"{\"weight_map\": {}}").unwrap();
    let err = wload_fails(&["inspect", s(tmp.path())], 3);
    assert!(
        err.contains(
            "model.safetensors.index.json names none of the 1 files matching *.safetensors"
        ),
        "{err}"
    );
}

/// A shape whose product overflows only before a zero dimension: refused as safetensors does,
/// with the tensor named, never an overflow panic.
#[test]
fn binary_overflowing_shape_is_a_checkpoint_error() {
    let tmp = tiny_checkpoint();
    edit_header(&tmp.path().join("model.safetensors"), |h| {
        h["model.norm.weight"]["shape"] = json!([u64::MAX, u64::MAX, 0]);
    });
    let err = wload_fails(&["inspect", s(tmp.path())], 3);
    assert!(err.contains("tensor 'model.norm.weight' shape"), "{err}");
    assert!(err.contains("more than 2^64"), "{err}");
}

/// Was: `--mapping /dev/zero` read forever (memory growing), and a named pipe as config.json
/// blocked on open. Small text files are read only when regular and of a sane size.
#[test]
fn binary_special_files_as_text_inputs_never_block() {
    let tmp = tiny_checkpoint();
    let err = wload_fails(
        &["plan", s(tmp.path()), "--tp", "1", "--mapping", "/dev/zero"],
        2,
    );
    assert!(
        err.contains("/dev/zero") && err.contains("is a device"),
        "{err}"
    );

    let cfg = tmp.path().join("config.json");
    fs::remove_file(&cfg).unwrap();
    let c = std::ffi::CString::new(s(&cfg)).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let err = wload_fails(&["inspect", s(tmp.path())], 3);
    assert!(
        err.contains("config.json") && err.contains("named pipe"),
        "{err}"
    );
}
