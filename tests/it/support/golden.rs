//! The golden fixtures (tiny Hugging Face checkpoints) and what vLLM wrote for them.

use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Map, Value};
use tempfile::TempDir;

use super::{is_digest_folder, materialized, write_json};

/// The crate root.
pub(crate) fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Where the golden fixtures (tiny Hugging Face checkpoints) live.
pub(crate) fn fixtures_dir() -> PathBuf {
    manifest_dir().join("tests/data/golden/fixtures")
}

/// Every fixture folder, sorted by name.
pub(crate) fn fixture_names() -> Vec<String> {
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
pub(crate) fn copy_fixture(name: &str) -> TempDir {
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

/// `dir`'s config.json, as an object.
pub(crate) fn read_config(dir: &Path) -> Map<String, Value> {
    let text = fs::read(dir.join("config.json")).expect("config.json");
    match serde_json::from_slice(&text).expect("config.json is JSON") {
        Value::Object(m) => m,
        other => panic!("config.json is not an object: {other}"),
    }
}

pub(crate) fn write_config(dir: &Path, m: Map<String, Value>) {
    write_json(&dir.join("config.json"), &Value::Object(m));
}

/// A copy of the fixture `name` whose config.json is changed by `edit`.
pub(crate) fn fixture_with(name: &str, edit: impl FnOnce(&mut Map<String, Value>)) -> TempDir {
    let dir = copy_fixture(name);
    let mut m = read_config(dir.path());
    edit(&mut m);
    write_config(dir.path(), m);
    dir
}

/// One golden case: `expected/<case>/tp<N>` with the fixture and the flags vLLM ran with.
pub(crate) struct GoldenCase {
    pub name: String,
    pub dir: PathBuf,
    pub fixture: PathBuf,
    pub tp: u64,
    /// Pipeline stages (`__pp<N>` cases: `--pp N`, files `model-pp-{p}-tp-{t}-part-{k}`).
    pub pp: u64,
    /// wload flags equivalent to the case's vLLM flags.
    pub flags: Vec<String>,
    /// Part size limit, for `__maxsize_<bytes>` cases.
    pub max_size: Option<u64>,
}

/// Every golden case in tests/data/golden/expected, sorted.
pub(crate) fn golden_cases() -> Vec<GoldenCase> {
    let root = manifest_dir().join("tests/data/golden/expected");
    let mut out = Vec::new();
    let mut cases: Vec<_> = fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    cases.sort();
    for case in cases {
        let cname = case.file_name().unwrap().to_string_lossy().into_owned();
        let mut parts = cname.split("__").peekable();
        let mut fixture_name = parts.next().unwrap().to_string();
        // `llama_gqa__fp8_block` was made from the fixture `llama_gqa_fp8_block` (golden README).
        if let Some(scheme) = parts.next_if(|p| p.starts_with("fp8_")) {
            fixture_name = format!("{fixture_name}_{scheme}");
        }
        let fixture = fixtures_dir().join(fixture_name);
        let mut flags = Vec::new();
        let mut max_size = None;
        let mut pp = 1;
        let mut backend = None;
        for p in parts {
            if let Some(d) = p.strip_prefix("dtype_") {
                flags.extend(["--dtype".to_string(), d.to_string()]);
            } else if p == "ep" {
                flags.push("--enable-expert-parallel".to_string());
            } else if let Some(n) = p.strip_prefix("pp") {
                pp = n.parse().unwrap();
                flags.extend(["--pp".to_string(), n.to_string()]);
            } else if p == "lmonly" {
                flags.push("--language-model-only".to_string());
            } else if p == "mmdata" {
                flags.extend(["--mm-encoder-tp-mode".to_string(), "data".to_string()]);
            } else if let Some(b) = p.strip_prefix("moe_") {
                backend = Some(b.to_string());
            } else if let Some(m) = p.strip_prefix("maxsize_") {
                max_size = Some(m.parse().unwrap());
            } else {
                panic!("unknown golden case suffix {p} in {cname}");
            }
        }
        // A Mistral-native fixture (params.json, no config.json): vLLM finds params.json by itself
        // only next to consolidated*.safetensors, which its own rank-file folder lacks, so the
        // folder is read as `vllm serve` reads it, with --config-format mistral.
        if fixture.join("params.json").is_file() && !fixture.join("config.json").exists() {
            flags.extend(["--config-format".to_string(), "mistral".to_string()]);
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
            let mut flags = flags.clone();
            if let Some(b) = backend.clone().or_else(|| oracle_moe_backend(&dir)) {
                flags.extend(["--moe-backend".to_string(), b]);
            }
            out.push(GoldenCase {
                name: format!("{cname}/tp{tp}"),
                dir,
                fixture: fixture.clone(),
                tp,
                pp,
                flags,
                max_size,
            });
        }
    }
    out
}

/// The MXFP4 or NVFP4 MoE backend the oracle pinned, as its `patches` record the selection
/// (`mxfp4.select_mxfp4_moe_backend -> … (TRITON, …)`, `select_nvfp4_moe_backend -> (MARLIN, …)`):
/// vLLM laid the experts out for it (MXFP4's padding, NVFP4's input scales under EP), so wload
/// is told the same (`--moe-backend triton`, `marlin`).
fn oracle_moe_backend(dir: &Path) -> Option<String> {
    let meta: Value =
        serde_json::from_slice(&fs::read(dir.join("oracle_meta_rank0.json")).ok()?).ok()?;
    meta["patches"]
        .as_array()?
        .iter()
        .filter_map(Value::as_str)
        .find_map(|p| {
            let rest = (p.split_once("select_mxfp4_moe_backend ->"))
                .or_else(|| p.split_once("select_nvfp4_moe_backend ->"))?
                .1;
            // The first `(NAME, ExpertsClass)` pair: the backend's enum name.
            rest.split('(').skip(1).find_map(|group| {
                let (name, _) = group.split_once(',')?;
                let upper = name.chars().all(|c| c.is_ascii_uppercase() || c == '_');
                (upper && !name.is_empty()).then(|| name.to_lowercase())
            })
        })
}

impl GoldenCase {
    /// How many ranks vLLM ran: `tp × pp`.
    pub(crate) fn world_size(&self) -> u64 {
        self.tp * self.pp
    }

    /// How global rank `rank`'s part file names start: vLLM's TP-only pattern, or with pipeline
    /// parallelism `model-pp-{rank / tp}-tp-{rank % tp}-part-`.
    pub(crate) fn rank_prefix(&self, rank: u64) -> String {
        if self.pp > 1 {
            format!("model-pp-{}-tp-{}-part-", rank / self.tp, rank % self.tp)
        } else {
            format!("model-rank-{rank}-part-")
        }
    }

    /// vLLM's state_dict order for `rank` (the oracle's `saved_key_order`).
    pub(crate) fn saved_key_order(&self, rank: u64) -> Vec<String> {
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

    /// The part files vLLM wrote for `rank`, sorted by part number (of a digest case: rebuilt
    /// and checked against the digests, [`GoldenCase::vllm_dir`]).
    pub(crate) fn rank_files(&self, rank: u64) -> Vec<PathBuf> {
        files_with_prefix(&self.vllm_dir(), &self.rank_prefix(rank))
    }

    /// A folder holding exactly what vLLM wrote: `dir` itself, or for a case kept as digests
    /// (`tensors.json`, tests/data/golden/README.md) wload's output once every file matches.
    pub(crate) fn vllm_dir(&self) -> PathBuf {
        if is_digest_folder(&self.dir) {
            materialized(self)
        } else {
            self.dir.clone()
        }
    }
}

/// The part files in `dir` named `{prefix}{part}.safetensors`, in part order.
pub(crate) fn files_with_prefix(dir: &Path, prefix: &str) -> Vec<PathBuf> {
    let mut v: Vec<(u64, PathBuf)> = fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter_map(|p| {
            let n = p.file_name()?.to_string_lossy().into_owned();
            let part = n
                .strip_prefix(prefix)?
                .strip_suffix(".safetensors")?
                .parse()
                .ok()?;
            Some((part, p))
        })
        .collect();
    v.sort();
    v.into_iter().map(|(_, p)| p).collect()
}

/// The fixture most tests use: 8 q / 4 kv heads, six source files, ≈1.1 MiB of output at any TP.
pub(crate) const GQA: &str = "llama_gqa";

/// The golden fixture `name` (read-only: copy it with [`copy_fixture`] to change it).
pub(crate) fn fixture(name: &str) -> PathBuf {
    fixtures_dir().join(name)
}

/// The golden case folder `expected/<case>/tp<tp>` as the repository holds it: vLLM's rank files,
/// or their digests.
pub(crate) fn case_dir(case: &str, tp: u64) -> PathBuf {
    manifest_dir()
        .join("tests/data/golden/expected")
        .join(case)
        .join(format!("tp{tp}"))
}

/// A folder holding what vLLM wrote for the golden case `expected/<case>/tp<tp>`: the case folder
/// itself, or for a case kept as digests the folder rebuilt and proven against them
/// ([`GoldenCase::vllm_dir`]).
pub(crate) fn expected(case: &str, tp: u64) -> PathBuf {
    let dir = case_dir(case, tp);
    if !is_digest_folder(&dir) {
        return dir;
    }
    golden_cases()
        .into_iter()
        .find(|c| c.dir == dir)
        .unwrap_or_else(|| panic!("no golden case {case}/tp{tp}"))
        .vllm_dir()
}
