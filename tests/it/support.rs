//! Helpers shared by the integration tests: the one way to run the binary ([`wload`],
//! [`wload_process`], [`run`], [`shard`]) and to check a refusal ([`assert_refused`]), golden
//! fixtures copied into temp folders, and a minimal safetensors writer/reader that does not use the
//! crate's own code, so that the tests check wload against an independent reading of the format.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use assert_cmd::Command;
use serde_json::{Map, Value, json};
use tempfile::TempDir;

/// `wload` as built by cargo for this test run, with a clean environment for the variables that
/// change its behaviour, killed (and the test failed) after [`RUN_LIMIT`].
pub fn wload() -> Command {
    let mut cmd = Command::from_std(wload_process());
    cmd.timeout(RUN_LIMIT);
    cmd
}

/// The same as [`wload`], as a plain child process: for the tests that spawn it, signal it or wait
/// on it themselves (and bound that wait themselves).
pub fn wload_process() -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_wload"));
    cmd.env_remove("RUST_BACKTRACE")
        .env_remove("RUST_LIB_BACKTRACE")
        .env_remove("HF_HUB_OFFLINE");
    cmd
}

/// Runs `wload <args>`, expects success, and parses stdout as JSON.
pub fn wload_json(args: &[&str]) -> Value {
    let out = wload().args(args).output().expect("wload runs");
    assert!(
        out.status.success(),
        "wload {args:?} failed with {}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "wload {args:?}: stdout is not JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The crate root.
pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where the golden fixtures (tiny Hugging Face checkpoints) live.
pub fn fixtures_dir() -> PathBuf {
    manifest_dir().join("tests/data/golden/fixtures")
}

/// Every fixture folder, sorted by name.
pub fn fixture_names() -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(fixtures_dir())
        .expect("fixtures folder exists")
        .map(|e| e.expect("readable fixtures folder"))
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// Copies the fixture `name` into a fresh temp folder (files made writable, since the checked-in
/// copies may be read-only) and returns the folder.
pub fn copy_fixture(name: &str) -> TempDir {
    let src = fixtures_dir().join(name);
    let tmp = TempDir::new().expect("temp dir");
    for entry in fs::read_dir(&src).unwrap_or_else(|e| panic!("{}: {e}", src.display())) {
        let entry = entry.expect("readable fixture");
        if !entry.file_type().expect("file type").is_file() {
            continue;
        }
        let to = tmp.path().join(entry.file_name());
        fs::copy(entry.path(), &to).expect("copy fixture file");
        let mut perms = fs::metadata(&to).expect("metadata").permissions();
        #[allow(clippy::permissions_set_readonly_false)]
        perms.set_readonly(false);
        fs::set_permissions(&to, perms).expect("make writable");
    }
    tmp
}

/// One tensor for [`write_safetensors`]: name, dtype as safetensors spells it, shape, data bytes.
pub type Tensor<'a> = (&'a str, &'a str, &'a [u64], &'a [u8]);

/// The bytes of a valid safetensors file holding `tensors`, packed in the given order, with a
/// `__metadata__` entry and the header padded with spaces to a multiple of 8 (as the Python library
/// does).
pub fn safetensors_bytes(tensors: &[Tensor]) -> Vec<u8> {
    let mut header = Map::new();
    header.insert("__metadata__".into(), json!({"format": "pt"}));
    let mut data = Vec::new();
    for (name, dtype, shape, bytes) in tensors {
        let start = data.len();
        data.extend_from_slice(bytes);
        header.insert(
            (*name).to_string(),
            json!({"dtype": dtype, "shape": shape, "data_offsets": [start, data.len()]}),
        );
    }
    let mut text = serde_json::to_vec(&Value::Object(header)).expect("serialisable header");
    while !text.len().is_multiple_of(8) {
        text.push(b' ');
    }
    assemble(&text, &data)
}

/// Writes a valid safetensors file (see [`safetensors_bytes`]).
pub fn write_safetensors(path: &Path, tensors: &[Tensor]) {
    write_raw(path, &safetensors_bytes(tensors));
}

/// `len(header) as u64 LE` + header + data: a safetensors file whatever the header says.
pub fn assemble(header: &[u8], data: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + header.len() + data.len());
    out.extend_from_slice(&(header.len() as u64).to_le_bytes());
    out.extend_from_slice(header);
    out.extend_from_slice(data);
    out
}

/// Writes `bytes` as they are (for corrupted files).
pub fn write_raw(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
}

/// A safetensors file read without the crate: the header's JSON text and the data region.
pub struct RawFile {
    pub header_text: Vec<u8>,
    pub data: Vec<u8>,
}

impl RawFile {
    pub fn read(path: &Path) -> RawFile {
        let bytes = fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(bytes.len() >= 8, "{}: shorter than 8 bytes", path.display());
        let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
        assert!(
            8 + n <= bytes.len(),
            "{}: header past the end",
            path.display()
        );
        RawFile {
            header_text: bytes[8..8 + n].to_vec(),
            data: bytes[8 + n..].to_vec(),
        }
    }

    /// The header as a JSON object (order preserved), `__metadata__` included.
    pub fn header(&self) -> Map<String, Value> {
        match serde_json::from_slice(&self.header_text).expect("header is JSON") {
            Value::Object(m) => m,
            other => panic!("header is not an object: {other}"),
        }
    }

    pub fn write(&self, path: &Path) {
        write_raw(path, &assemble(&self.header_text, &self.data));
    }
}

/// Rewrites the header of the safetensors file at `path` with `edit`, keeping the data region.
pub fn edit_header(path: &Path, edit: impl FnOnce(&mut Map<String, Value>)) {
    let mut raw = RawFile::read(path);
    let mut header = raw.header();
    edit(&mut header);
    raw.header_text = serde_json::to_vec(&Value::Object(header)).unwrap();
    raw.write(path);
}

/// One tensor entry of a header, as the test reads it independently of the crate.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct HeaderTensor {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub start: u64,
    pub end: u64,
}

/// The tensors of a safetensors file's header, `__metadata__` skipped, in header order.
pub fn header_tensors(path: &Path) -> Vec<HeaderTensor> {
    RawFile::read(path)
        .header()
        .into_iter()
        .filter(|(k, _)| k != "__metadata__")
        .map(|(name, v)| {
            let shape = v["shape"]
                .as_array()
                .unwrap_or_else(|| panic!("{}: {name}: no shape", path.display()))
                .iter()
                .map(|d| d.as_u64().expect("shape dims are integers"))
                .collect();
            let offs = v["data_offsets"].as_array().expect("data_offsets");
            HeaderTensor {
                dtype: v["dtype"].as_str().expect("dtype string").to_string(),
                shape,
                start: offs[0].as_u64().unwrap(),
                end: offs[1].as_u64().unwrap(),
                name,
            }
        })
        .collect()
}

/// A config.json for a tiny Llama: 1 layer, hidden 8, 2 heads, vocab 16.
pub fn tiny_config() -> Value {
    json!({
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": 8,
        "intermediate_size": 16,
        "num_attention_heads": 2,
        "num_key_value_heads": 1,
        "num_hidden_layers": 1,
        "vocab_size": 16,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": false,
        "dtype": "float32"
    })
}

pub fn write_json(path: &Path, v: &Value) {
    write_raw(path, serde_json::to_string_pretty(v).unwrap().as_bytes());
}

/// `n` zero bytes.
pub fn zeros(n: usize) -> Vec<u8> {
    vec![0u8; n]
}

/// A tiny valid checkpoint in a temp folder: config.json plus `model.safetensors` with an
/// embedding, one norm and an lm_head, all F32.
pub fn tiny_checkpoint() -> TempDir {
    let tmp = TempDir::new().expect("temp dir");
    write_json(&tmp.path().join("config.json"), &tiny_config());
    write_safetensors(
        &tmp.path().join("model.safetensors"),
        &[
            (
                "model.embed_tokens.weight",
                "F32",
                &[16, 8],
                &zeros(16 * 8 * 4),
            ),
            ("model.norm.weight", "F32", &[8], &zeros(8 * 4)),
            ("lm_head.weight", "F32", &[16, 8], &zeros(16 * 8 * 4)),
        ],
    );
    tmp
}

/// The path as a `&str`, for command lines.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("temp paths are UTF-8")
}

/// One golden case: `expected/<case>/tp<N>` with the fixture and the flags vLLM ran with.
pub struct GoldenCase {
    pub name: String,
    pub dir: PathBuf,
    pub fixture: PathBuf,
    pub tp: u64,
    /// wload flags equivalent to the case's vLLM flags.
    pub flags: Vec<String>,
    /// Part size limit, for `__maxsize_<bytes>` cases.
    pub max_size: Option<u64>,
}

/// Every golden case in tests/data/golden/expected, sorted.
pub fn golden_cases() -> Vec<GoldenCase> {
    let root = manifest_dir().join("tests/data/golden/expected");
    let mut out = Vec::new();
    let mut cases: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    cases.sort();
    for case in cases {
        let cname = case.file_name().unwrap().to_string_lossy().into_owned();
        let mut parts = cname.split("__");
        let fixture = fixtures_dir().join(parts.next().unwrap());
        let mut flags = Vec::new();
        let mut max_size = None;
        for p in parts {
            if let Some(d) = p.strip_prefix("dtype_") {
                flags.extend(["--dtype".to_string(), d.to_string()]);
            } else if p == "ep" {
                flags.push("--enable-expert-parallel".to_string());
            } else if let Some(m) = p.strip_prefix("maxsize_") {
                max_size = Some(m.parse().unwrap());
            } else {
                panic!("unknown golden case suffix {p} in {cname}");
            }
        }
        let mut tps: Vec<_> = fs::read_dir(&case)
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        tps.sort();
        for dir in tps {
            let tp: u64 = dir.file_name().unwrap().to_string_lossy()[2..]
                .parse()
                .unwrap();
            out.push(GoldenCase {
                name: format!("{cname}/tp{tp}"),
                dir,
                fixture: fixture.clone(),
                tp,
                flags: flags.clone(),
                max_size,
            });
        }
    }
    out
}

impl GoldenCase {
    /// vLLM's state_dict order for `rank` (the oracle's `saved_key_order`).
    pub fn saved_key_order(&self, rank: u64) -> Vec<String> {
        let meta: Value = serde_json::from_slice(
            &fs::read(self.dir.join(format!("oracle_meta_rank{rank}.json"))).unwrap(),
        )
        .unwrap();
        meta["saved_key_order"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap().to_string())
            .collect()
    }

    /// The part files vLLM wrote for `rank`, sorted by part number.
    pub fn rank_files(&self, rank: u64) -> Vec<PathBuf> {
        let prefix = format!("model-rank-{rank}-part-");
        let mut v: Vec<(u64, PathBuf)> = fs::read_dir(&self.dir)
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter_map(|p| {
                let n = p.file_name()?.to_string_lossy().into_owned();
                let part = n
                    .strip_prefix(&prefix)?
                    .strip_suffix(".safetensors")?
                    .parse()
                    .ok()?;
                Some((part, p))
            })
            .collect();
        v.sort();
        v.into_iter().map(|(_, p)| p).collect()
    }
}

/// (name, dtype, shape) of one tensor entry in wload's JSON output (inspect rows, plan tensors).
pub fn json_tensor(t: &Value) -> (String, String, Vec<u64>) {
    (
        t["name"].as_str().expect("name").to_string(),
        t["dtype"].as_str().expect("dtype").to_string(),
        t["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .map(|d| d.as_u64().expect("shape dims are integers"))
            .collect(),
    )
}

/// Whether this run is CI (`CI` set, and not `false` or `0`): there every test that needs root or a
/// toolchain must really run, so a missing environment is a failure, not a skip.
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !matches!(v.trim(), "" | "false" | "0"))
}

/// `test` cannot run because its environment (root, a tool, a kernel feature) is missing: `why`.
/// In CI that fails the test; elsewhere the skip is printed and the caller returns. Not for tests
/// that can never run in CI (a real GPU): those call [`skipped`] directly.
pub fn missing_environment(test: &str, why: &str) {
    if in_ci() {
        panic!("{test}: {why}; CI must provide this (CI is set, so this is not skipped)");
    }
    skipped(test, why);
}

/// Prints `SKIPPED: <test>: <why>` where `cargo test` shows it: straight to stderr, because the
/// harness swallows `eprintln!` output of tests that pass.
pub fn skipped(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED: {test}: {why}");
}

/// Writes into `dir` a Llama checkpoint with `layers` layers of tiny BF16 tensors (hidden 8,
/// 2 heads, 1 KV head, intermediate 16, vocab 16) in one `model.safetensors`, every tensor name
/// passed through `rename` (to plant the same fault in every layer). For tests of scale.
pub fn many_layers_checkpoint(dir: &Path, layers: u64, rename: impl Fn(String) -> String) {
    let mut config = tiny_config();
    config["num_hidden_layers"] = json!(layers);
    write_json(&dir.join("config.json"), &config);
    let per_layer: [(&str, &[u64]); 9] = [
        ("self_attn.q_proj.weight", &[8, 8]),
        ("self_attn.k_proj.weight", &[4, 8]),
        ("self_attn.v_proj.weight", &[4, 8]),
        ("self_attn.o_proj.weight", &[8, 8]),
        ("mlp.gate_proj.weight", &[16, 8]),
        ("mlp.up_proj.weight", &[16, 8]),
        ("mlp.down_proj.weight", &[8, 16]),
        ("input_layernorm.weight", &[8]),
        ("post_attention_layernorm.weight", &[8]),
    ];
    let mut specs: Vec<(String, &[u64])> = vec![("model.embed_tokens.weight".into(), &[16, 8])];
    for i in 0..layers {
        specs.extend(
            per_layer
                .iter()
                .map(|(n, sh)| (format!("model.layers.{i}.{n}"), *sh)),
        );
    }
    specs.push(("model.norm.weight".into(), &[8]));
    specs.push(("lm_head.weight".into(), &[16, 8]));
    let specs: Vec<(String, &[u64])> = specs.into_iter().map(|(n, sh)| (rename(n), sh)).collect();
    let data = zeros(16 * 8 * 2);
    let tensors: Vec<Tensor> = specs
        .iter()
        .map(|(n, sh)| {
            let bytes = 2 * sh.iter().product::<u64>() as usize;
            (n.as_str(), "BF16", *sh, &data[..bytes])
        })
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &tensors);
}

/// The longest any one `wload` run may take before the test fails; a regression to a hang then
/// fails its test instead of blocking the whole suite (which is now one process).
pub const RUN_LIMIT: Duration = Duration::from_secs(300);

/// The fixture most tests use: 8 q / 4 kv heads, six source files, ≈1.1 MiB of output at any TP.
pub const GQA: &str = "llama_gqa";

/// The golden fixture `name` (read-only: copy it with [`copy_fixture`] to change it).
pub fn fixture(name: &str) -> PathBuf {
    fixtures_dir().join(name)
}

/// The golden case folder `expected/<case>/tp<tp>`: what vLLM wrote.
pub fn expected(case: &str, tp: u64) -> PathBuf {
    manifest_dir()
        .join("tests/data/golden/expected")
        .join(case)
        .join(format!("tp{tp}"))
}

/// `wload ARGS…` run to completion (see [`wload`] for its environment and time limit).
pub fn run(args: &[&str]) -> Output {
    wload().args(args).output().expect("wload runs")
}

/// `wload shard SOURCE --tp TP -o OUT EXTRA…`, run to completion.
pub fn shard(source: &Path, tp: u64, out: &Path, extra: &[&str]) -> Output {
    let tp = tp.to_string();
    let mut args = vec!["shard", s(source), "--tp", &tp, "-o", s(out)];
    args.extend_from_slice(extra);
    run(&args)
}

/// [`shard`], expected to succeed.
pub fn shard_ok(source: &Path, tp: u64, out: &Path, extra: &[&str]) -> Output {
    let o = shard(source, tp, out, extra);
    assert!(
        o.status.success(),
        "wload shard {} --tp {tp} {extra:?} failed: {}",
        source.display(),
        context(&o)
    );
    o
}

pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Exit status, stderr and the start of stdout, for assertion messages.
pub fn context(out: &Output) -> String {
    let so = stdout(out);
    let end = (0..=so.len().min(2000))
        .rev()
        .find(|&i| so.is_char_boundary(i))
        .unwrap_or(0);
    format!(
        "exit {:?}\nstderr:\n{}\nstdout (start):\n{}",
        out.status.code(),
        stderr(out),
        &so[..end]
    )
}

/// A refusal as wload makes one: exit status `code`, stderr starting with `error: ` and containing
/// every one of `needles` (exact substrings), no panic, nothing on stdout. Returns stderr.
pub fn assert_refused(out: &Output, code: i32, needles: &[&str]) -> String {
    let ctx = context(out);
    assert_eq!(out.status.code(), Some(code), "{ctx}");
    let err = stderr(out);
    assert!(err.starts_with("error: "), "an `error: ` message; {ctx}");
    for n in needles {
        assert!(err.contains(n), "stderr should contain {n:?}; {ctx}");
    }
    assert!(!err.contains("panicked"), "{ctx}");
    assert!(out.stdout.is_empty(), "nothing on stdout; {ctx}");
    err
}

/// CPU time of the calling thread: unlike wall time, not inflated while other processes (or
/// other tests) hold the cores.
pub fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime(CLOCK_THREAD_CPUTIME_ID)");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}
