//! CUDA without a driver, with a stub driver that has no GPU, and on a real GPU when there is one.

use super::*;

// ---------------------------------------------------------------------------------------------
// 5. CUDA without a driver, and with a stub driver that has no GPU
// ---------------------------------------------------------------------------------------------

/// Whether a real libcuda is visible to the dynamic loader (then the no-driver test cannot run).
fn system_has_libcuda() -> bool {
    let in_cache = StdCommand::new("ldconfig")
        .arg("-p")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains("libcuda.so"))
        .unwrap_or(false);
    let in_path = std::env::var("LD_LIBRARY_PATH").is_ok_and(|p| {
        p.split(':').filter(|d| !d.is_empty()).any(|d| {
            fs::read_dir(d).is_ok_and(|rd| {
                rd.flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with("libcuda.so"))
            })
        })
    });
    in_cache || in_path
}

/// Without a driver: exit 1, and the message says to use `--device cpu`. Needs a machine without
/// libcuda, such as CI's.
#[test]
fn cuda_without_a_driver_exits_1() {
    if system_has_libcuda() {
        return missing_environment(
            "cuda_without_a_driver_exits_1",
            "a libcuda is installed here, so wload cannot be seen without a driver",
        );
    }
    let fx = fixtures_dir().join(GQA);
    let f = s(&fx);
    assert_fails(
        &[f, "--tp", "2", "--device", "cuda"],
        &[],
        1,
        &["no CUDA driver", "--device cpu"],
    );
    // A dry run touches no device, so it works without a driver.
    let out = load(&[f, "--tp", "2", "--device", "cuda", "--dry-run"]);
    assert!(out.status.success(), "{}", context(&out));
}

/// The stub driver, driven by the environment: `cuInit` returns `STUB_CU_INIT` (default 100,
/// CUDA_ERROR_NO_DEVICE), `cuDeviceGetCount` reports `STUB_GPUS` (default 0), `cuDeviceGet`
/// accepts ordinals below that, and creating a context fails with CUDA_ERROR_UNKNOWN (999) unless
/// `STUB_CTX=ok`; the error functions answer with fixed strings.
///
/// With `STUB_CTX=ok` it is a GPU in host memory, as unforgiving as a real one where a loader can
/// go wrong: device and pinned allocations start as garbage (0xAB), copies queued on a stream run
/// only when the stream or an event recorded after them is synchronised (so a staging buffer
/// reused before its copy is done sends the wrong bytes, and `--check` sees it), and a
/// synchronous copy back does not wait for other streams. `STUB_GPU_MEM` caps device memory
/// (CUDA_ERROR_OUT_OF_MEMORY beyond it). Stream 0 is the legacy default stream; addresses of
/// 64 KiB and up are device memory of GPU `STUB_PTR_ORDINAL` (default 0) to
/// `cuPointerGetAttribute`, lower ones unknown. These are all the symbols wload calls (a missing
/// one would make cudarc panic). The Python package's tests build it too (python/tests).
pub(crate) const STUB_C: &str = include_str!("../../../data/stub_libcuda.c");

/// Builds the stub as `<dir>/libcuda.so.1` plus a `libcuda.so` link (cudarc's candidates start
/// with `libcuda.so` and include `libcuda.so.1`; `LD_LIBRARY_PATH` puts the stub ahead of any
/// installed driver); `None` when there is no C compiler.
fn build_stub(dir: &Path) -> Option<()> {
    let src = dir.join("stub.c");
    fs::write(&src, STUB_C).unwrap();
    let lib = dir.join("libcuda.so.1");
    let out = StdCommand::new("cc")
        .args(["-shared", "-fPIC", "-o"])
        .arg(&lib)
        .arg(&src)
        .output()
        .ok()?;
    assert!(
        out.status.success(),
        "cc failed to build the stub libcuda:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::os::unix::fs::symlink("libcuda.so.1", dir.join("libcuda.so")).unwrap();
    Some(())
}

/// A stub driver on `LD_LIBRARY_PATH`; `None` when there is no C compiler to build it (a failure
/// in CI, see [`missing_environment`]).
pub(crate) fn stub_driver(test: &str) -> Option<(TempDir, String)> {
    let dir = TempDir::new().unwrap();
    if build_stub(dir.path()).is_none() {
        missing_environment(test, "no C compiler (cc) to build the stub libcuda");
        return None;
    }
    let lp = match std::env::var("LD_LIBRARY_PATH") {
        Ok(p) if !p.is_empty() => format!("{}:{p}", dir.path().display()),
        _ => dir.path().display().to_string(),
    };
    Some((dir, lp))
}

#[test]
fn cuda_stub_driver_without_gpus() {
    let Some((_dir, lp)) = stub_driver("cuda_stub_driver_without_gpus") else {
        return;
    };
    let fx = fixtures_dir().join(GQA);
    let f = s(&fx);
    let base = [("RUST_BACKTRACE", "1"), ("LD_LIBRARY_PATH", lp.as_str())];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut v = base.to_vec();
        v.extend_from_slice(extra);
        v
    };

    // cuInit fails with CUDA_ERROR_NO_DEVICE: the driver's own words, exit 1, no panic.
    assert_fails(
        &[f, "--tp", "2", "--device", "cuda"],
        &base,
        1,
        &[
            "CUDA_ERROR_NO_DEVICE",
            "stub: no CUDA-capable device",
            "initialising",
        ],
    );

    // cuInit succeeds, no GPUs: how many are needed, and for which ranks.
    let zero = with(&[("STUB_CU_INIT", "0"), ("STUB_GPUS", "0")]);
    assert_fails(
        &[f, "--tp", "2", "--device", "cuda"],
        &zero,
        1,
        &["2 GPUs needed", "ranks 0-1", "only 0 visible"],
    );
    // A torchrun process with LOCAL_RANK 1 of 2 holds ranks 2,3 on local GPUs 2,3.
    let mut local = zero.clone();
    local.extend([("RANK", "1"), ("WORLD_SIZE", "2"), ("LOCAL_RANK", "1")]);
    assert_fails(
        &[f, "--tp", "4", "--device", "cuda"],
        &local,
        1,
        &["4 GPUs needed", "ranks 2-3", "only 0 visible"],
    );
    // A dry run does not call the driver at all.
    let out = load_env(&[f, "--tp", "2", "--device", "cuda", "--dry-run"], &base);
    assert!(out.status.success(), "{}", context(&out));
}

/// Two GPUs whose contexts cannot be created: the device and the operation are named, exit 1.
#[test]
fn cuda_stub_driver_context_failure() {
    let Some((_dir, lp)) = stub_driver("cuda_stub_driver_context_failure") else {
        return;
    };
    let fx = fixtures_dir().join(GQA);
    let env = [
        ("RUST_BACKTRACE", "1"),
        ("LD_LIBRARY_PATH", lp.as_str()),
        ("STUB_CU_INIT", "0"),
        ("STUB_GPUS", "2"),
    ];
    assert_fails(
        &[s(&fx), "--tp", "2", "--device", "cuda"],
        &env,
        1,
        &["cuda:0", "creating a context", "CUDA_ERROR_UNKNOWN"],
    );
}

/// Slurm with one GPU per task (`srun --gpus-per-task=1`, or `--gpu-bind`) sets each task's
/// CUDA_VISIBLE_DEVICES to its own GPU, so task 1 sees one device, at ordinal 0. wload puts task
/// 1's rank on local ordinal SLURM_LOCALID × ranks-per-task = 1 and refuses ("2 GPUs needed for
/// ranks 1, but only 1 visible") instead of using the one GPU it was given.
#[test]
fn slurm_task_with_its_own_gpu_uses_ordinal_0() {
    let Some((_dir, lp)) = stub_driver("slurm_task_with_its_own_gpu_uses_ordinal_0") else {
        return;
    };
    let fx = fixtures_dir().join(GQA);
    let env = [
        ("LD_LIBRARY_PATH", lp.as_str()),
        ("STUB_CU_INIT", "0"),
        ("STUB_GPUS", "1"),
        ("CUDA_VISIBLE_DEVICES", "1"),
        ("SLURM_PROCID", "1"),
        ("SLURM_NTASKS", "2"),
        ("SLURM_LOCALID", "1"),
    ];
    // Getting as far as creating the context on cuda:0 (which the stub then fails) is the point.
    assert_fails(
        &[s(&fx), "--tp", "2", "--device", "cuda"],
        &env,
        1,
        &["cuda:0", "creating a context"],
    );
}

/// With a real driver and at least one GPU (never in CI), every golden case's rank 0 and all ranks
/// of one case load onto GPU 0 one rank at a time, with the same bytes as vLLM.
#[test]
fn cuda_loads_golden_cases_when_a_gpu_is_present() {
    const TEST: &str = "cuda_loads_golden_cases_when_a_gpu_is_present";
    // Not a missing environment: CI has no GPU, so this runs only where one is.
    if !system_has_libcuda() {
        skipped(TEST, "no libcuda here (needs an NVIDIA driver and GPU)");
        return;
    }
    let fx = fixtures_dir().join(GQA);
    let probe = load(&[
        s(&fx),
        "--tp",
        "1",
        "--device",
        "cuda",
        "--ranks",
        "0",
        "--json",
    ]);
    if !probe.status.success() {
        // Only "there is no GPU" is a reason to skip; any other failure of the CUDA path is a bug
        // this test exists to catch.
        let err = stderr(&probe);
        let no_gpu = ["only 0 visible", "CUDA_ERROR_NO_DEVICE", "no CUDA driver"];
        assert!(
            no_gpu.iter().any(|w| err.contains(w)),
            "{TEST}: a driver is installed but loading one rank failed: {}",
            context(&probe)
        );
        skipped(TEST, &format!("no usable GPU ({})", err.trim()));
        return;
    }
    let cases = golden_cases();
    let mut failures = Vec::new();
    for case in &cases {
        let ranks: Vec<u64> = if case.name == "llama_gqa/tp8" {
            tp_ranks(case)
        } else {
            vec![0]
        };
        for r in ranks {
            let tp = case.tp.to_string();
            let rs = r.to_string();
            let mut args = vec![
                s(&case.fixture),
                "--tp",
                &tp,
                "--device",
                "cuda",
                "--ranks",
                &rs,
                "--check",
                "--checksums",
                "--json",
            ];
            args.extend(flags(case));
            match try_json(&args, &[]) {
                Err(e) => failures.push(format!("{}: {e}", case.name)),
                Ok(report) => failures.extend(compare(
                    &format!("{} on cuda", case.name),
                    case,
                    &report,
                    &[r],
                )),
            }
        }
    }
    assert_none("CUDA loads", &failures);
}
