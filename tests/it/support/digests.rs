//! Golden cases kept as digests: `expected/<case>/tp<N>/tensors.json` holds the size and SHA-256
//! of each rank file real vLLM wrote, and of each tensor in it, instead of the files themselves
//! (random weights do not compress; the repository must stay small enough to travel to a GPU
//! machine). A test that needs vLLM's files gets them from [`GoldenCase::vllm_dir`]: wload's own
//! output for the case, used only once every file matches its digest, so every byte is vLLM's —
//! but for the tensors vLLM computes with the device's `expf` (Mamba2's `A`), which the digest
//! keeps as values and which match within 1 ulp: there the folder holds wload's values.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, OnceLock};

use serde_json::Value;
use sha2::{Digest, Sha256};

use super::{GoldenCase, Tensors, case_dir, header_tensors, s, wload};

/// The digest file's name inside a case folder.
pub(crate) const DIGESTS: &str = "tensors.json";

/// One rank file as vLLM wrote it.
struct FileDigest {
    size: u64,
    sha256: String,
    /// The SHA-256 of the header (8-byte length and JSON), kept for files that hold computed
    /// tensors: with those within tolerance, the rest of the file is still compared exactly.
    header_sha256: Option<String>,
    /// `(name, dtype, shape, sha256)` in file order.
    tensors: Vec<(String, String, Vec<u64>, String)>,
    /// vLLM's values of the tensors it computed with the device's exp (Mamba2's F32 `A` =
    /// `-exp(A_log)`), as F32 bit patterns, by name: wload's must be within 1 ulp of them
    /// (tests/data/golden/tools/digest.py, vllm-spec §13.4).
    computed: HashMap<String, Vec<u32>>,
}

fn sha256_hex(bytes: &[u8]) -> String {
    Sha256::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// The rank files of `tensors.json` in `dir`, by file name; `None` when `dir` holds vLLM's files.
fn read_digests(dir: &Path) -> Option<Vec<(String, FileDigest)>> {
    let text = fs::read(dir.join(DIGESTS)).ok()?;
    let v: Value = serde_json::from_slice(&text)
        .unwrap_or_else(|e| panic!("{}/{DIGESTS}: {e}", dir.display()));
    let files = v["files"].as_object().expect("tensors.json has files");
    let computed = |f: &Value| {
        (f["tensors"].as_array().expect("tensors").iter())
            .filter_map(|t| {
                let bits = t.get("f32_bits")?.as_array().expect("f32_bits");
                let bits = bits.iter().map(|b| {
                    u32::from_str_radix(b.as_str().expect("hex"), 16).expect("F32 bits in hex")
                });
                Some((
                    t["name"].as_str().expect("name").to_string(),
                    bits.collect(),
                ))
            })
            .collect()
    };
    let digest = |f: &Value| FileDigest {
        size: f["size"].as_u64().expect("size"),
        sha256: f["sha256"].as_str().expect("sha256").to_string(),
        header_sha256: f
            .get("header_sha256")
            .map(|h| h.as_str().expect("hex").into()),
        computed: computed(f),
        tensors: f["tensors"]
            .as_array()
            .expect("tensors")
            .iter()
            .map(|t| {
                let shape = t["shape"].as_array().expect("shape");
                (
                    t["name"].as_str().expect("name").to_string(),
                    t["dtype"].as_str().expect("dtype").to_string(),
                    shape.iter().map(|d| d.as_u64().expect("dim")).collect(),
                    t["sha256"].as_str().expect("sha256").to_string(),
                )
            })
            .collect(),
    };
    Some(files.iter().map(|(n, f)| (n.clone(), digest(f))).collect())
}

/// Asserts that `want` is, tensor for tensor (names, dtypes, shapes, SHA-256 of the bytes), what
/// real vLLM held on rank `rank` of the digest case `expected/<case>/tp<tp>`: a test that rebuilds
/// ranks from the checkpoint by its own slicing proves its rules on vLLM's case with this.
pub(crate) fn assert_matches_vllm_rank(want: &Tensors, case: &str, tp: u64, rank: u64) {
    let dir = case_dir(case, tp);
    let digests = read_digests(&dir).expect("a digest case");
    let prefix = format!("model-rank-{rank}-part-");
    let vllm: BTreeMap<&String, (&String, &Vec<u64>, &String)> = digests
        .iter()
        .filter(|(f, _)| f.starts_with(&prefix))
        .flat_map(|(_, d)| d.tensors.iter().map(|(n, t, sh, h)| (n, (t, sh, h))))
        .collect();
    let computed: HashMap<&String, &Vec<u32>> = (digests.iter())
        .filter(|(f, _)| f.starts_with(&prefix))
        .flat_map(|(_, d)| d.computed.iter())
        .collect();
    let ctx = format!("{case}/tp{tp} rank {rank}");
    assert_eq!(
        want.keys().collect::<Vec<_>>(),
        vllm.keys().copied().collect::<Vec<_>>(),
        "{ctx}: vLLM's key set"
    );
    for (name, t) in want {
        let (dtype, shape, sha) = vllm[name];
        assert_eq!((&t.dtype, &t.shape), (dtype, shape), "{ctx}: {name}");
        match computed.get(name) {
            Some(want) => {
                let off = ulps_off(&t.data, want);
                assert!(off.is_empty(), "{ctx}: {name}: {}", off.join("; "));
            }
            None => assert_eq!(&sha256_hex(&t.data), sha, "{ctx}: {name}: vLLM's bytes"),
        }
    }
}

/// How the F32 values in `got` differ from `want` (bit patterns) by more than 1 ulp, one line per
/// element; empty when every element is within 1 ulp. vLLM computes these values with the device's
/// `expf` (Mamba2's `A`), wload correctly rounded, so 1 ulp apart is the contract, not a failure.
fn ulps_off(got: &[u8], want: &[u32]) -> Vec<String> {
    if got.len() != want.len() * 4 {
        return vec![format!(
            "{} bytes, vLLM's {} F32 values",
            got.len(),
            want.len()
        )];
    }
    let ordered = |b: u32| {
        // Bit patterns as integers that count ulps across zero.
        if b >> 31 == 1 {
            -i64::from(b & 0x7FFF_FFFF)
        } else {
            i64::from(b)
        }
    };
    (got.chunks_exact(4).zip(want).enumerate())
        .filter_map(|(k, (g, &w))| {
            let g = u32::from_le_bytes(g.try_into().unwrap());
            let off = (ordered(g) - ordered(w)).abs();
            (off > 1).then(|| {
                format!(
                    "element {k}: {} ({g:#010x}), vLLM's {} ({w:#010x}): {off} ulps apart",
                    f32::from_bits(g),
                    f32::from_bits(w)
                )
            })
        })
        .collect()
}

/// Whether `dir` (a case folder) holds digests rather than vLLM's rank files.
pub(crate) fn is_digest_folder(dir: &Path) -> bool {
    dir.join(DIGESTS).is_file()
}

/// How the rank files in `got` differ from the digests in `dir`: missing or extra files, then
/// for a file that differs, each tensor that is missing, extra, reshaped or has other bytes.
pub(crate) fn digest_failures(dir: &Path, got: &Path) -> Vec<String> {
    let digests = read_digests(dir).expect("a digest folder");
    let mut fails = Vec::new();
    for (name, want) in &digests {
        let path = got.join(name);
        let Ok(bytes) = fs::read(&path) else {
            fails.push(format!("{name}: missing (vLLM wrote it)"));
            continue;
        };
        if bytes.len() as u64 == want.size && sha256_hex(&bytes) == want.sha256 {
            continue;
        }
        if within_tolerance(&path, &bytes, want) {
            continue;
        }
        fails.push(format!(
            "{name}: {} bytes, vLLM's {} bytes, other contents",
            bytes.len(),
            want.size
        ));
        fails.extend(tensor_differences(name, &path, &bytes, want));
    }
    let listed: Vec<&String> = digests.iter().map(|(n, _)| n).collect();
    for e in fs::read_dir(got).unwrap() {
        let n = e.unwrap().file_name().to_string_lossy().into_owned();
        let rank_file = n.starts_with("model-") && n.ends_with(".safetensors");
        if rank_file && !listed.contains(&&n) {
            fails.push(format!("{n}: vLLM wrote no such file"));
        }
    }
    fails
}

/// Whether the file at `path` (read as `bytes`) is vLLM's but for its computed tensors, each
/// element of which is within 1 ulp of vLLM's: the same size and header, every other tensor's
/// SHA-256 the same.
fn within_tolerance(path: &Path, bytes: &[u8], want: &FileDigest) -> bool {
    let Some(header) = &want.header_sha256 else {
        return false;
    };
    if bytes.len() as u64 != want.size || bytes.len() < 8 {
        return false;
    }
    let base = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    if base > bytes.len() || &sha256_hex(&bytes[..base]) != header {
        return false;
    }
    let got: HashMap<String, &[u8]> = header_tensors(path)
        .into_iter()
        .map(|t| {
            (
                t.name,
                &bytes[base + t.start as usize..base + t.end as usize],
            )
        })
        .collect();
    want.tensors.iter().all(|(name, _, _, sha)| {
        let Some(data) = got.get(name) else {
            return false;
        };
        match want.computed.get(name) {
            Some(values) => ulps_off(data, values).is_empty(),
            None => &sha256_hex(data) == sha,
        }
    })
}

/// The tensors of `path` (read as `bytes`) that differ from `want`'s, and an order difference.
fn tensor_differences(name: &str, path: &Path, bytes: &[u8], want: &FileDigest) -> Vec<String> {
    let mut fails = Vec::new();
    if bytes.len() < 8 {
        return vec![format!("{name}: not a safetensors file")];
    }
    let base = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let got: HashMap<String, (String, Vec<u64>, &[u8])> = header_tensors(path)
        .into_iter()
        .map(|t| {
            let data = &bytes[base + t.start as usize..base + t.end as usize];
            (t.name, (t.dtype, t.shape, data))
        })
        .collect();
    for (t, dtype, shape, sha) in &want.tensors {
        match (got.get(t), want.computed.get(t)) {
            (None, _) => fails.push(format!("{name}: '{t}' missing (vLLM has it)")),
            (Some((d, sh, _)), _) if d != dtype || sh != shape => fails.push(format!(
                "{name}: '{t}' is {d} {sh:?}, vLLM's {dtype} {shape:?}"
            )),
            (Some((_, _, data)), Some(values)) => fails.extend(
                ulps_off(data, values)
                    .into_iter()
                    .map(|e| format!("{name}: '{t}' (within 1 ulp expected): {e}")),
            ),
            (Some((_, _, data)), None) if &sha256_hex(data) != sha => {
                fails.push(format!("{name}: '{t}': other bytes"))
            }
            (Some(_), None) => {}
        }
    }
    for t in got.keys() {
        if !want.tensors.iter().any(|w| &w.0 == t) {
            fails.push(format!(
                "{name}: '{t}' unexpected (vLLM has no such tensor)"
            ));
        }
    }
    if fails.is_empty() {
        fails.push(format!(
            "{name}: the same tensors, but another header or order than vLLM's"
        ));
    }
    fails
}

/// The folder of vLLM's files for a digest case, made once per test process: wload shards the
/// fixture as vLLM ran, the recorded side files replace wload's, and every rank file must match
/// its digest (else this panics with the differences, naming each tensor).
pub(crate) fn materialized(case: &GoldenCase) -> PathBuf {
    static MADE: OnceLock<Mutex<HashMap<String, PathBuf>>> = OnceLock::new();
    let made = MADE.get_or_init(|| {
        remove_stale_folders();
        Mutex::new(HashMap::new())
    });
    // One case at a time: two tests of one case must not shard it twice into one folder.
    let mut made = made.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(dir) = made.get(&case.name) {
        return dir.clone();
    }
    let dir = process_root().join(case.name.replace('/', "-"));
    let _ = fs::remove_dir_all(&dir);
    fs::create_dir_all(process_root()).expect("create target/tmp/golden-vllm/<pid>");
    let mut cmd = wload();
    cmd.args([
        "-q",
        "shard",
        s(&case.fixture),
        "--tp",
        &case.tp.to_string(),
    ])
    .args(["-o", s(&dir)])
    .args(&case.flags);
    if let Some(m) = case.max_size {
        cmd.args(["--max-part-size", &m.to_string()]);
    }
    let run = cmd.output().expect("wload runs");
    assert!(
        run.status.success(),
        "{}: wload shard failed, so vLLM's files cannot be rebuilt from the digests: {}",
        case.name,
        String::from_utf8_lossy(&run.stderr)
    );
    let fails = digest_failures(&case.dir, &dir);
    assert!(
        fails.is_empty(),
        "{}: wload's output differs from vLLM's ({} in {}):\n{}",
        case.name,
        DIGESTS,
        case.dir.display(),
        fails.join("\n")
    );
    // vLLM's folder: its rank files (now proven identical, computed `A` values within 1 ulp) and
    // its side files, no wload.json.
    fs::remove_file(dir.join("wload.json")).expect("wload.json written");
    for e in fs::read_dir(&case.dir).unwrap() {
        let e = e.unwrap();
        let n = e.file_name().to_string_lossy().into_owned();
        if n != DIGESTS && !n.starts_with("oracle_meta_") {
            fs::copy(e.path(), dir.join(&n)).expect("copy a side file");
        }
    }
    made.insert(case.name.clone(), dir.clone());
    dir
}

/// `target/tmp/golden-vllm/<pid>`: this process's rebuilt folders.
fn process_root() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR"))
        .join("golden-vllm")
        .join(std::process::id().to_string())
}

/// Earlier test processes' folders (a process whose pid is gone), so runs do not pile up.
fn remove_stale_folders() {
    let root = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("golden-vllm");
    if !Path::new("/proc/self").exists() {
        return; // no way to tell a live process here
    }
    let Ok(entries) = fs::read_dir(&root) else {
        return;
    };
    for e in entries.flatten() {
        let pid = e.file_name().to_string_lossy().into_owned();
        if !Path::new("/proc").join(&pid).exists() {
            let _ = fs::remove_dir_all(e.path());
        }
    }
}

/// The 1-ulp rule counts ulps across zero and refuses 2 ulps, another length or another sign.
#[test]
fn computed_values_match_within_one_ulp_only() {
    let bytes = |v: &[u32]| v.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>();
    let want = [0xBF80_0000, 0x0000_0001, 0x8000_0000];
    assert!(ulps_off(&bytes(&[0xBF80_0001, 0x8000_0000, 0x0000_0001]), &want).is_empty());
    let off = ulps_off(&bytes(&[0xBF80_0002, 0x0000_0001, 0x3F80_0000]), &want);
    assert_eq!(off.len(), 2, "{off:?}");
    assert!(off[0].starts_with("element 0:") && off[1].starts_with("element 2:"));
    assert_eq!(ulps_off(&bytes(&[0xBF80_0000]), &want).len(), 1);
}
