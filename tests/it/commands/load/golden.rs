//! Golden cases load exactly what vLLM held (planned, pre-sharded, tiny chunks, stub GPU), dry
//! runs pass (one test per case: tests/it/golden.rs), and vLLM's folders with a different dtype or EP.

use super::*;

/// Golden case `case` planned on the fly from its fixture: per rank, the tensors and their bytes
/// are vLLM's (`golden::<case>::load`).
pub(crate) fn fixture_loads_exactly_what_vllm_held(case: &GoldenCase) {
    load_fixture(case, &cpu(), &[]);
}

/// The same with the engine reading a few bytes at a time (test builds only:
/// `WLOAD_TEST_CHUNK_BYTES`), so that every slice and conversion crosses chunk boundaries on its
/// way into host memory; `i` is the case's place in the list (`golden::<case>::load_tiny_chunks`).
pub(crate) fn fixture_loads_exactly_what_vllm_held_with_tiny_chunks(i: usize, case: &GoldenCase) {
    // Not multiples of each other or of the fixtures' row sizes; 6 bytes splits f32 elements.
    const CHUNKS: [u64; 4] = [6, 100, 1000, 4100];
    let chunk = CHUNKS[i % CHUNKS.len()].to_string();
    load_fixture(case, &cpu(), &[("WLOAD_TEST_CHUNK_BYTES", chunk)]);
}

/// Golden case `case` (the `i`-th of the list) through the CUDA path, on the stub GPU (see
/// [`STUB_C`](super::cuda)): staged through small pinned slots reused many times, with copies
/// that land only when waited for, read buffered, direct and mapped; `--check` copies every
/// tensor back, and each rank must be vLLM's (`golden::<case>::load_stub_gpu`).
pub(crate) fn fixture_loads_exactly_what_vllm_held_through_the_stub_gpu(
    i: usize,
    case: &GoldenCase,
) {
    let test = format!("golden::{}::load_stub_gpu", case.name.replace('/', "_"));
    let Some((_dir, lp)) = stub_driver(&test) else {
        return;
    };
    // (io, engine chunk, slot): chunks and slots not multiples of each other or of rows.
    const WAYS: [(&str, u64, u64); 4] = [
        ("buffered", 16 << 20, 16 << 20),
        ("direct", 1000, 4100),
        ("mmap", 4100, 1000),
        ("auto", 100, 300),
    ];
    let (io, chunk, slot) = WAYS[i % WAYS.len()];
    load_fixture(
        case,
        &["--device", "cuda", "--check", "--io", io].map(String::from),
        &[
            ("LD_LIBRARY_PATH", lp.clone()),
            ("STUB_CU_INIT", "0".into()),
            ("STUB_GPUS", "16".into()),
            ("STUB_CTX", "ok".into()),
            ("WLOAD_TEST_CHUNK_BYTES", chunk.to_string()),
            ("WLOAD_TEST_SLOT_BYTES", slot.to_string()),
        ],
    );
}

/// Loads the fixture of `case` with `extra` arguments (the device among them) and `env`, and
/// compares each rank with vLLM's.
fn load_fixture(case: &GoldenCase, extra: &[String], env: &[(&str, String)]) {
    let tp = case.tp.to_string();
    let mut args = vec![s(&case.fixture), "--tp", &tp, "--checksums", "--json"];
    args.extend(extra.iter().map(String::as_str));
    args.extend(flags(case));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let report = json_ok(&args, &env);
    let mut f = compare(&case.name, case, &report, &tp_ranks(case));
    if report["kind"] != "checkpoint" {
        f.push(format!(
            "{}: kind {} (expected checkpoint)",
            case.name, report["kind"]
        ));
    }
    if report["dry_run"] != false {
        f.push(format!("{}: dry_run {}", case.name, report["dry_run"]));
    }
    assert_none("loading the fixture", &f);
}

/// vLLM's own output folder of `case` (config.json, no wload.json) loads as a pre-sharded source,
/// unchanged (`golden::<case>::load_pre_sharded`).
pub(crate) fn vllm_folder_loads_as_pre_sharded(case: &GoldenCase) {
    let tp = case.tp.to_string();
    let dir = case.vllm_dir();
    let mut args = vec![
        s(&dir),
        "--tp",
        &tp,
        "--device",
        "cpu",
        "--checksums",
        "--json",
    ];
    args.extend(flags(case));
    let report = json_ok(&args, &[]);
    let mut f = compare(&case.name, case, &report, &tp_ranks(case));
    if report["kind"] != "pre-sharded" {
        f.push(format!(
            "{}: kind {} (expected pre-sharded)",
            case.name, report["kind"]
        ));
    }
    if report["warnings"].as_array().is_none_or(|w| !w.is_empty()) {
        f.push(format!("{}: warnings {}", case.name, report["warnings"]));
    }
    assert_none("loading vLLM's folder", &f);
}

/// `llama_gqa__dtype_float16` loaded without `--dtype float16`: the files are F16 where vLLM's
/// parameters are BF16. vLLM only warns (and converts), so wload warns and loads.
#[test]
fn pre_sharded_dtype_mismatch_only_warns() {
    let dir = expected("llama_gqa__dtype_float16", 2);
    let report = json_ok(&[s(&dir), "--tp", "2", "--device", "cpu", "--json"], &[]);
    let warnings: Vec<&str> = report["warnings"]
        .as_array()
        .expect("warnings")
        .iter()
        .filter_map(Value::as_str)
        .collect();
    // One warning per F16 tensor (the F32 scale buffers match vLLM's parameters).
    let f16 = (0..2)
        .flat_map(|r| {
            let f = dir.join(format!("model-rank-{r}-part-0.safetensors"));
            header_tensors(&f)
        })
        .filter(|t| t.dtype == "F16")
        .count();
    assert!(f16 > 0);
    assert_eq!(warnings.len(), f16, "{warnings:#?}");
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("lm_head.weight") && w.contains("F16") && w.contains("BF16")),
        "{warnings:#?}"
    );
    assert_eq!(reported_ranks(&report), vec![0, 1]);

    // The human output shows the warnings too (on stderr or stdout) and still succeeds.
    let out = load(&[s(&dir), "--tp", "2", "--device", "cpu", "--dry-run"]);
    assert!(out.status.success(), "{}", context(&out));
    let all = stdout(&out) + &stderr(&out);
    assert!(all.contains("F16"), "the dtype warning is shown: {all}");
}

/// vLLM converts a mismatched dtype on load (`param.copy_(loaded)`), so a rank of vLLM serving
/// `llama_gqa__dtype_float16/tp2` with `--dtype auto` holds BF16 tensors; wload keeps the file's F16.
#[test]
fn pre_sharded_dtype_mismatch_is_converted_like_vllm() {
    let dir = expected("llama_gqa__dtype_float16", 2);
    let report = json_ok(
        &[
            s(&dir),
            "--tp",
            "2",
            "--device",
            "cpu",
            "--checksums",
            "--json",
            "--ranks",
            "0",
        ],
        &[],
    );
    let got = reported_rank(&report, 0).expect("checksums");
    let file = dir.join("model-rank-0-part-0.safetensors");
    let bytes = fs::read(&file).unwrap();
    let base = 8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut failures = Vec::new();
    for t in header_tensors(&file) {
        if t.dtype != "F16" {
            continue;
        }
        let data = &bytes[base + t.start as usize..base + t.end as usize];
        let bf16: Vec<u8> = data
            .chunks_exact(2)
            .flat_map(|c| {
                let f = half::f16::from_le_bytes([c[0], c[1]]).to_f32();
                half::bf16::from_f32(f).to_le_bytes()
            })
            .collect();
        let want = Held {
            dtype: "BF16".into(),
            shape: t.shape.clone(),
            xxh3: hex(&bf16),
        };
        if got.get(&t.name) != Some(&want) {
            failures.push(format!(
                "'{}': got {:?}, vLLM {want:?}",
                t.name,
                got.get(&t.name)
            ));
        }
    }
    assert_none("dtype conversion", &failures);
}

/// Mixtral sharded with `--enable-expert-parallel`, loaded without it: the expert tensors have the
/// EP shapes ([experts/tp, 2·inter, hidden]) where TP wants [experts, 2·inter/tp, hidden]; vLLM's
/// copy_ would fail, so this is refused.
#[test]
fn expert_parallel_folder_without_the_flag_is_refused() {
    let dir = expected("mixtral__ep", 2);
    assert_fails(
        &[s(&dir), "--tp", "2", "--device", "cpu", "--dry-run"],
        &[],
        3,
        &["w13_weight", "shape"],
    );
}

/// `--dry-run` passes for golden case `case`, from the fixture and from vLLM's folder, and so
/// does `--dry-run --read`, whose hashes are the files' own (`golden::<case>::dry_run`).
pub(crate) fn dry_runs_pass(case: &GoldenCase) {
    let world = case.world_size();
    let tp = case.tp.to_string();
    let mut f = Vec::new();
    let vllm = case.vllm_dir();
    for (label, dir) in [("fixture", &case.fixture), ("vllm", &vllm)] {
        for read in [false, true] {
            let label = format!(
                "{} ({label}){}",
                case.name,
                if read { " --read" } else { "" }
            );
            let mut args = vec![
                s(dir),
                "--tp",
                &tp,
                "--device",
                "cpu",
                "--dry-run",
                "--json",
            ];
            if read {
                args.push("--read");
            }
            args.extend(flags(case));
            match try_json(&args, &[]) {
                Err(e) => f.push(format!("{label}: {e}")),
                Ok(r) => {
                    if r["dry_run"] != true || reported_ranks(&r) != (0..world).collect::<Vec<_>>()
                    {
                        f.push(format!(
                            "{label}: dry_run {} ranks {:?}",
                            r["dry_run"],
                            reported_ranks(&r)
                        ));
                    }
                    if read {
                        f.extend(check_files_read(&label, dir, &r));
                    }
                }
            }
        }
    }
    assert_none("dry runs", &f);
}
