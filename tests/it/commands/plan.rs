//! `wload plan` against real vLLM 0.33 output: for every golden case, each rank's key set, order,
//! dtypes and shapes equal what vLLM saved.

use std::collections::BTreeMap;

use crate::support::*;
use serde_json::Value;

#[test]
fn plan_matches_vllm_for_every_golden_case() {
    let mut failures = Vec::new();
    let cases = golden_cases();
    assert!(cases.len() >= 15, "golden cases are missing");
    for case in &cases {
        let tp = case.tp.to_string();
        let mut args = vec!["plan", s(&case.fixture), "--tp", &tp, "--json"];
        args.extend(case.flags.iter().map(String::as_str));
        let plan = wload_json(&args);
        let ranks = plan["ranks"].as_array().unwrap();
        if ranks.len() as u64 != case.world_size() {
            failures.push(format!("{}: {} ranks planned", case.name, ranks.len()));
            continue;
        }
        for (r, rank) in ranks.iter().enumerate() {
            let r = r as u64;
            assert_eq!(rank["rank"].as_u64(), Some(r));
            let planned: Vec<(String, String, Vec<u64>)> = rank["tensors"]
                .as_array()
                .unwrap()
                .iter()
                .map(json_tensor)
                .collect();
            let mut expected = BTreeMap::new();
            for f in case.rank_files(r) {
                for t in header_tensors(&f) {
                    expected.insert(t.name.clone(), (t.dtype.clone(), t.shape.clone()));
                }
            }
            let got: BTreeMap<_, _> = planned
                .iter()
                .map(|(n, d, s)| (n.clone(), (d.clone(), s.clone())))
                .collect();
            for (name, want) in &expected {
                match got.get(name) {
                    None => failures.push(format!("{} rank {r}: missing {name}", case.name)),
                    Some(g) if g != want => failures.push(format!(
                        "{} rank {r}: {name} is {g:?}, vLLM has {want:?}",
                        case.name
                    )),
                    _ => {}
                }
            }
            for name in got.keys().filter(|n| !expected.contains_key(*n)) {
                failures.push(format!("{} rank {r}: unexpected {name}", case.name));
            }
            let order: Vec<String> = planned.iter().map(|t| t.0.clone()).collect();
            if order != case.saved_key_order(r) {
                failures.push(format!(
                    "{} rank {r}: order differs from vLLM's state_dict order",
                    case.name
                ));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// Bytes per rank add up: every tensor's bytes = numel × itemsize, and the rank total is their sum.
#[test]
fn plan_json_has_the_documented_shape() {
    let p = wload_json(&[
        "plan",
        s(&fixtures_dir().join("llama_gqa")),
        "--tp",
        "2",
        "--json",
    ]);
    assert_eq!(p["tp"], 2);
    assert_eq!(p["dtype"], "BF16");
    assert_eq!(p["family"], "llama");
    for rank in p["ranks"].as_array().unwrap() {
        let mut sum = 0;
        for t in rank["tensors"].as_array().unwrap() {
            let numel: u64 = t["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap())
                .product();
            let item = match t["dtype"].as_str().unwrap() {
                "F32" => 4,
                _ => 2,
            };
            assert_eq!(t["bytes"].as_u64().unwrap(), numel * item, "{}", t["name"]);
            assert!(!t["pieces"].as_array().unwrap().is_empty());
            sum += numel * item;
        }
        assert_eq!(rank["bytes"].as_u64(), Some(sum));
    }
    // --rank keeps one rank.
    let one = wload_json(&[
        "plan",
        s(&fixtures_dir().join("llama_gqa")),
        "--tp",
        "4",
        "--rank",
        "3",
        "--json",
    ]);
    let ranks = one["ranks"].as_array().unwrap();
    assert_eq!(ranks.len(), 1);
    assert_eq!(ranks[0]["rank"], Value::from(3));
}

// ---------------------------------------------------------------------------------------------
// Cost: planning is linear in the number of tensors and parameters

/// Opens `dir` in-process, as `wload plan` does.
fn open_dir(dir: &std::path::Path, layers_override: Option<u64>) -> wload::Opened {
    wload::open(
        &wload::SourceOptions {
            source: dir.to_path_buf(),
            load_format: wload::LoadFormat::Auto,
            config_format: wload::ConfigFormat::Auto,
            hf_overrides: layers_override.map(|n| {
                serde_json::Map::from_iter([("num_hidden_layers".to_string(), Value::from(n))])
            }),
            revision: None,
            download_dir: None,
            download_progress: Default::default(),
            side_files: false,
            headers_only: false,
        },
        wload::Want::Checkpoint,
    )
    .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
}

/// The least thread CPU time of `runs` plans of `opened` at `--tp 2`, and what the last one
/// returned. The minimum, because cache and allocator noise only ever add time; more runs for a
/// small checkpoint, whose few milliseconds are the easiest to disturb.
fn time_plan(opened: &wload::Opened, runs: usize) -> (f64, Result<wload::Plan, wload::PlanError>) {
    let mapping =
        wload::testing::select_mapping(None, opened.config.architecture()).expect("mapping");
    let opts = wload::PlanOptions {
        tp: 2,
        pp: 1,
        pp_partition: None,
        expert_parallel: false,
        dtype: wload::DtypeChoice::Auto,
        mapping: None,
        shapes_only: false,
        moe_backend: None,
        multimodal: Default::default(),
        replicate_embed: false,
    };
    let mut best = f64::INFINITY;
    let mut last = None;
    for _ in 0..runs {
        let t = thread_cpu_seconds();
        let model = wload::testing::Model::new(&opened.config);
        let r = wload::testing::plan(&mapping, &model, &opened.checkpoint, &opts);
        best = best.min(thread_cpu_seconds() - t);
        last = Some(r);
    }
    (best, last.expect("at least one run"))
}

/// 8× the layers must cost about 8× the time: a quadratic step would cost 64×. 20× leaves room
/// for noise without letting a quadratic step through (the old problem list took about 50×).
fn assert_linear(what: &str, small: f64, large: f64) {
    let ratio = large / small;
    eprintln!("{what}: {small:.4} s → {large:.4} s ({ratio:.1}×)");
    assert!(
        ratio < 20.0,
        "{what}: 8× the layers took {ratio:.1}× the CPU time ({small:.4} s → {large:.4} s); planning should be linear"
    );
}

#[test]
fn a_checkpoint_of_2000_layers_that_fits_plans_in_linear_time() {
    let (small, large) = (250, 2000);
    let mut secs = Vec::new();
    for layers in [small, large] {
        let dir = tempfile::TempDir::new().unwrap();
        many_layers_checkpoint(dir.path(), layers, |n| n);
        let opened = open_dir(dir.path(), None);
        let (t, r) = time_plan(&opened, if layers == small { 7 } else { 3 });
        let plan = r.unwrap_or_else(|e| panic!("{layers} layers: {e}"));
        // Per layer: qkv, o_proj, 4 attention scales, gate_up, down, 2 norms; plus embedding,
        // final norm and lm_head.
        for rank in &plan.ranks {
            assert_eq!(
                rank.tensors.len() as u64,
                10 * layers + 3,
                "rank {}",
                rank.rank
            );
        }
        assert_eq!(plan.sources.len() as u64, 9 * layers + 3);
        secs.push(t);
    }
    assert_linear("a checkpoint that fits", secs[0], secs[1]);
}

#[test]
fn a_config_claiming_thousands_of_missing_layers_is_refused_in_linear_time() {
    // One layer in the checkpoint, many in the config: six problems per missing layer (qkv,
    // o_proj, gate_up, down and the two norms), each of which must be checked against those
    // found before it to be reported once.
    let dir = tempfile::TempDir::new().unwrap();
    many_layers_checkpoint(dir.path(), 1, |n| n);
    let (small, large) = (500, 4000);
    let mut secs = Vec::new();
    for layers in [small, large] {
        let opened = open_dir(dir.path(), Some(layers));
        let (t, r) = time_plan(&opened, if layers == small { 7 } else { 3 });
        match r {
            Err(wload::PlanError::Invalid(ps)) => {
                assert_eq!(ps.len() as u64, 6 * (layers - 1), "{layers} layers")
            }
            other => panic!("{layers} layers: expected problems, got {other:?}"),
        }
        secs.push(t);
    }
    assert_linear("a checkpoint that does not fit", secs[0], secs[1]);
}

// ---------------------------------------------------------------------------------------------
// The verdict, the totals and the rank table

/// `wload plan` on a terminal ends with its verdict and totals (not on the last tensor row),
/// lists the ranks in a table before their tensors, and with `-q` prints the verdict line alone.
#[test]
fn the_human_plan_ends_with_its_verdict_and_totals() {
    let fx = fixtures_dir().join("llama_gqa");
    let src = s(&fx);
    let verdict = "ok: TP 2 × PP 1, 2 ranks, 23 tensors per rank, 545.3 KiB per rank (max), 1.1 MiB in all; vLLM would load this";
    let out = run(&["plan", src, "--tp", "2"]);
    assert!(out.status.success(), "{}", context(&out));
    let text = stdout(&out);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.last(), Some(&verdict), "{text}");
    let table = lines
        .iter()
        .position(|l| l.split_whitespace().eq(["RANK", "TENSORS", "BYTES"]))
        .unwrap_or_else(|| panic!("a rank table:\n{text}"));
    assert_eq!(
        lines[table + 1].split_whitespace().collect::<Vec<_>>(),
        ["0", "23", "545.3", "KiB"]
    );
    let first_rank = lines.iter().position(|l| l.starts_with("rank 0 ")).unwrap();
    assert!(
        table < first_rank,
        "the table comes before the tensors:\n{text}"
    );

    let quiet = run(&["plan", src, "--tp", "2", "-q"]);
    assert!(quiet.status.success(), "{}", context(&quiet));
    assert_eq!(stdout(&quiet), format!("{verdict}\n"));

    // Stages hold different tensors: the range, and the table's stage columns.
    let out = run(&["plan", src, "--tp", "2", "--pp", "2"]);
    let text = stdout(&out);
    assert!(
        text.lines().last().unwrap().starts_with(
            "ok: TP 2 × PP 2, 4 ranks, 11–12 tensors per rank, 272.8 KiB per rank (max), 1.1 MiB in all"
        ),
        "{text}"
    );
    assert!(
        text.lines().any(|l| l
            .split_whitespace()
            .eq(["RANK", "STAGE", "TP", "RANK", "TENSORS", "BYTES"])),
        "{text}"
    );
    // --rank shows one rank; the totals stay the plan's.
    let one = run(&["plan", src, "--tp", "4", "--rank", "2", "-q"]);
    assert!(
        stdout(&one).starts_with("ok: TP 4 × PP 1, 4 ranks (rank 2 shown), 23 tensors per rank"),
        "{}",
        context(&one)
    );
}

/// `plan --json` carries the same verdict and totals, over every rank even with `--rank`.
#[test]
fn plan_json_has_the_verdict_and_totals() {
    let fx = fixtures_dir().join("llama_gqa");
    let p = wload_json(&["plan", s(&fx), "--tp", "2", "--pp", "2", "--json"]);
    assert_eq!(p["schema_version"], 1);
    assert_eq!(p["verdict"], "accepted");
    let t = &p["totals"];
    let ranks = p["ranks"].as_array().unwrap();
    let counts: Vec<u64> = ranks
        .iter()
        .map(|r| r["tensors"].as_array().unwrap().len() as u64)
        .collect();
    let bytes: Vec<u64> = ranks.iter().map(|r| r["bytes"].as_u64().unwrap()).collect();
    assert_eq!(t["ranks"], 4);
    assert_eq!(t["tensors"], counts.iter().sum::<u64>());
    assert_eq!(t["tensors_per_rank_min"], *counts.iter().min().unwrap());
    assert_eq!(t["tensors_per_rank_max"], *counts.iter().max().unwrap());
    assert_eq!(t["bytes"], bytes.iter().sum::<u64>());
    assert_eq!(t["bytes_per_rank_min"], *bytes.iter().min().unwrap());
    assert_eq!(t["bytes_per_rank_max"], *bytes.iter().max().unwrap());
    assert_ne!(t["tensors_per_rank_min"], t["tensors_per_rank_max"]);

    let one = wload_json(&[
        "plan",
        s(&fx),
        "--tp",
        "2",
        "--pp",
        "2",
        "--rank",
        "3",
        "--json",
    ]);
    assert_eq!(one["ranks"].as_array().unwrap().len(), 1);
    assert_eq!(one["totals"], p["totals"], "--rank keeps the plan's totals");
}

/// A refusal whose fix is another `--tp` lists the sizes that work, found by the planner's own
/// checks (the heads of llama_gqa at TP 3; block-FP8 scales that do not split at TP 4).
#[test]
fn a_refused_tp_names_the_sizes_that_work() {
    let gqa = fixtures_dir().join("llama_gqa");
    let out = run(&["plan", s(&gqa), "--tp", "3"]);
    assert_refusal_text(
        &out,
        3,
        &["fix: choose a --tp that divides 8; TP sizes that work: 1, 2, 4, 8"],
    );
    let fp8 = fixtures_dir().join("llama_gqa_fp8_block");
    let out = run(&["plan", s(&fp8), "--tp", "4"]);
    assert_refusal_text(
        &out,
        3,
        &["choose another --tp (now 4); TP sizes that work: 1, 2"],
    );
    // The JSON's fixes say the same; and each size named does plan.
    let doc = json_doc(&["plan"], &run(&["plan", s(&fp8), "--tp", "4", "--json"]));
    let fix = doc["problems"][0]["fix"].as_str().unwrap();
    assert!(fix.ends_with("TP sizes that work: 1, 2"), "{fix}");
    for tp in ["1", "2"] {
        assert!(run(&["plan", s(&fp8), "--tp", tp, "-q"]).status.success());
    }
}

/// `--enable-expert-parallel` on a model without experts is refused (exit 2) by every command
/// that plans, naming the model, instead of passing into wload.json and the serve line.
#[test]
fn expert_parallel_on_a_dense_model_is_a_usage_error() {
    let fx = fixtures_dir().join("llama_gqa");
    let work = tempfile::TempDir::new().unwrap();
    let o = work.path().join("out");
    let (src, o) = (s(&fx), o.to_str().unwrap());
    let ep = "--enable-expert-parallel";
    for args in [
        &["plan", src, "--tp", "2", ep][..],
        &["shard", src, "--tp", "2", "-o", o, ep],
        &["load", src, "--tp", "2", "--device", "cpu", "--dry-run", ep],
    ] {
        let out = run(args);
        assert_refusal_text(
            &out,
            2,
            &[
                "--enable-expert-parallel: LlamaForCausalLM",
                "has no experts",
            ],
        );
    }
    assert!(!work.path().join("out").exists());
    // A pre-sharded folder of the dense model, without the wload.json that would refuse it too.
    let sharded = work.path().join("tp2");
    shard_ok(&fx, 2, &sharded, &[]);
    std::fs::remove_file(sharded.join("wload.json")).unwrap();
    let args = ["load", s(&sharded), "--tp", "2", "--dry-run", ep];
    assert_refusal_text(&run(&args), 2, &["has no experts"]);
    // A MoE takes it.
    let moe = fixtures_dir().join("mixtral");
    let out = run(&["plan", s(&moe), "--tp", "2", ep, "-q"]);
    assert!(out.status.success(), "{}", context(&out));
    assert!(
        stdout(&out).starts_with("ok: TP 2 × PP 1 + EP, 2 ranks"),
        "{}",
        context(&out)
    );
}
