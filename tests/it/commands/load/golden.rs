//! Golden cases load exactly what vLLM held (planned, pre-sharded, tiny chunks, stub GPU); dry runs pass.

use super::*;

// ---------------------------------------------------------------------------------------------
// 1–3. Golden cases
// ---------------------------------------------------------------------------------------------

/// The golden cases grouped by the fixture command they share: a `__maxsize_` case differs from its
/// base case only in part boundaries, which `load` does not see.
fn fixture_groups() -> Vec<Vec<GoldenCase>> {
    let mut groups: BTreeMap<(PathBuf, u64, Vec<String>), Vec<GoldenCase>> = BTreeMap::new();
    for c in golden_cases() {
        groups
            .entry((c.fixture.clone(), c.tp, c.flags.clone()))
            .or_default()
            .push(c);
    }
    groups.into_values().collect()
}

/// Planned on the fly from the fixture: per rank, the tensors and their bytes are vLLM's.
#[test]
fn fixtures_load_exactly_what_vllm_held() {
    load_fixtures(|_| (cpu(), Vec::new()));
}

/// The same with the engine reading a few bytes at a time (test builds only:
/// `WLOAD_TEST_CHUNK_BYTES`), so that every slice and conversion crosses chunk boundaries on its
/// way into host memory.
#[test]
fn fixtures_load_exactly_what_vllm_held_with_tiny_chunks() {
    // Not multiples of each other or of the fixtures' row sizes; 6 bytes splits f32 elements.
    const CHUNKS: [u64; 4] = [6, 100, 1000, 4100];
    load_fixtures(|i| {
        (
            cpu(),
            vec![(
                "WLOAD_TEST_CHUNK_BYTES",
                CHUNKS[i % CHUNKS.len()].to_string(),
            )],
        )
    });
}

/// Every golden fixture group through the CUDA path, on the stub GPU (see [`STUB_C`]): staged
/// through small pinned slots reused many times, with copies that land only when waited for,
/// read buffered, direct and mapped; `--check` copies every tensor back, and each rank must be
/// vLLM's.
#[test]
fn fixtures_load_exactly_what_vllm_held_through_the_stub_gpu() {
    let Some((_dir, lp)) = stub_driver("fixtures_load_exactly_what_vllm_held_through_the_stub_gpu")
    else {
        return;
    };
    // (io, engine chunk, slot): chunks and slots not multiples of each other or of rows.
    const WAYS: [(&str, u64, u64); 4] = [
        ("buffered", 16 << 20, 16 << 20),
        ("direct", 1000, 4100),
        ("mmap", 4100, 1000),
        ("auto", 100, 300),
    ];
    load_fixtures(|i| {
        let (io, chunk, slot) = WAYS[i % WAYS.len()];
        (
            ["--device", "cuda", "--check", "--io", io]
                .map(String::from)
                .to_vec(),
            vec![
                ("LD_LIBRARY_PATH", lp.clone()),
                ("STUB_CU_INIT", "0".into()),
                ("STUB_GPUS", "16".into()),
                ("STUB_CTX", "ok".into()),
                ("WLOAD_TEST_CHUNK_BYTES", chunk.to_string()),
                ("WLOAD_TEST_SLOT_BYTES", slot.to_string()),
            ],
        )
    });
}

/// Loads every golden fixture group with the arguments and variables `way(group index)` gives
/// (the device among them) and compares each rank with vLLM's.
#[allow(clippy::type_complexity)]
fn load_fixtures(way: impl Fn(usize) -> (Vec<String>, Vec<(&'static str, String)>) + Sync) {
    let groups: Vec<(usize, Vec<GoldenCase>)> = fixture_groups().into_iter().enumerate().collect();
    assert!(
        groups.len() >= 10,
        "golden case groups found: {}",
        groups.len()
    );
    let failures = par_flat_map(&groups, |(i, group)| {
        let case = &group[0];
        let tp = case.tp.to_string();
        let (extra, env) = way(*i);
        let mut args = vec![s(&case.fixture), "--tp", &tp, "--checksums", "--json"];
        args.extend(extra.iter().map(String::as_str));
        args.extend(flags(case));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        match try_json(&args, &env) {
            Err(e) => vec![format!("{}: {e}", case.name)],
            Ok(report) => {
                let mut f: Vec<String> = group
                    .iter()
                    .flat_map(|c| compare(&c.name, c, &report, &tp_ranks(c)))
                    .collect();
                if report["kind"] != "checkpoint" {
                    f.push(format!(
                        "{}: kind {} (expected checkpoint)",
                        case.name, report["kind"]
                    ));
                }
                if report["dry_run"] != false {
                    f.push(format!("{}: dry_run {}", case.name, report["dry_run"]));
                }
                f
            }
        }
    });
    assert_none("loading the fixtures", &failures);
}

/// vLLM's own output folders (config.json, no wload.json) load as pre-sharded sources, unchanged.
#[test]
fn vllm_folders_load_as_pre_sharded() {
    let cases = golden_cases();
    let failures = par_flat_map(&cases, |case| {
        let tp = case.tp.to_string();
        let mut args = vec![
            s(&case.dir),
            "--tp",
            &tp,
            "--device",
            "cpu",
            "--checksums",
            "--json",
        ];
        args.extend(flags(case));
        match try_json(&args, &[]) {
            Err(e) => vec![format!("{}: {e}", case.name)],
            Ok(report) => {
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
                f
            }
        }
    });
    assert_none("loading vLLM's folders", &failures);
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

/// `--dry-run` passes for every good case, from the fixture and from vLLM's folder, and so does
/// `--dry-run --read`, whose hashes are the files' own. `--read` hashes the files the plan reads,
/// which for a fixture are all of them whatever the TP: it runs once per fixture folder.
#[test]
fn dry_runs_pass_for_every_good_case() {
    // (label, source, (tp, world size), flags, with --read too)
    type Job = (String, PathBuf, (u64, u64), Vec<String>, bool);
    let mut jobs: Vec<Job> = Vec::new();
    let mut fixtures_read = BTreeSet::new();
    for g in fixture_groups() {
        let c = &g[0];
        let read = fixtures_read.insert(c.fixture.clone());
        jobs.push((
            format!("{} (fixture)", c.name),
            c.fixture.clone(),
            (c.tp, c.world_size()),
            c.flags.clone(),
            read,
        ));
    }
    for c in golden_cases() {
        jobs.push((
            format!("{} (vllm)", c.name),
            c.dir.clone(),
            (c.tp, c.world_size()),
            c.flags.clone(),
            true,
        ));
    }
    let failures = par_flat_map(&jobs, |(label, dir, (tp, world), flags, with_read)| {
        let tp_s = tp.to_string();
        let mut f = Vec::new();
        for read in [false, true] {
            if read && !with_read {
                continue;
            }
            let label = format!("{label}{}", if read { " --read" } else { "" });
            let mut args = vec![
                s(dir),
                "--tp",
                &tp_s,
                "--device",
                "cpu",
                "--dry-run",
                "--json",
            ];
            if read {
                args.push("--read");
            }
            args.extend(flags.iter().map(String::as_str));
            match try_json(&args, &[]) {
                Err(e) => f.push(format!("{label}: {e}")),
                Ok(r) => {
                    if r["dry_run"] != true || reported_ranks(&r) != (0..*world).collect::<Vec<_>>()
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
        f
    });
    assert_none("dry runs", &failures);
}
