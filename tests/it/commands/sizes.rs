//! `wload sizes`: vLLM's verdict on each parallel layout, which must be `wload plan`'s.

use serde_json::Value;

use crate::support::*;

fn sizes_json(source: &str, extra: &[&str]) -> Value {
    let mut args = vec!["sizes", source, "--json"];
    args.extend_from_slice(extra);
    let doc = wload_json(&args);
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["schema_version"], 1);
    doc
}

/// `sizes --json` of a source no checked layout of which plans: exit 3, as `plan` of each, with
/// the whole report in the document.
fn sizes_json_refused(source: &str, extra: &[&str]) -> Value {
    let mut args = vec!["sizes", source, "--json"];
    args.extend_from_slice(extra);
    let doc = wload_json_exit(&args, 3);
    assert!(
        doc["error"]["message"]
            .as_str()
            .unwrap()
            .contains("no layout checked can be planned"),
        "{doc:#}"
    );
    doc
}

fn tps(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("a list of sizes")
        .iter()
        .map(|x| x.as_u64().unwrap())
        .collect()
}

/// Every verdict is what `wload plan` says for that layout: accepted when it plans, else refused
/// with plan's first problem as the reason and plan's problem count.
fn agrees_with_plan(source: &str, doc: &Value) {
    let checked = doc["checked"].as_array().expect("checked");
    assert!(!checked.is_empty());
    for v in checked {
        let (tp, pp) = (v["tp"].to_string(), v["pp"].to_string());
        let mut args = vec!["plan", source, "--tp", &tp, "--pp", &pp, "--json"];
        if v["expert_parallel"] == true {
            args.push("--enable-expert-parallel");
        }
        let out = run(&args);
        let plan = json_doc(&args, &out);
        assert_eq!(plan["ok"], v["accepted"], "{args:?}: sizes says {v}");
        if v["accepted"] == false {
            assert_eq!(out.status.code(), Some(3), "{args:?}");
            assert_eq!(plan["problems"][0]["message"], v["reason"], "{args:?}");
            // plan completes a "choose another --tp" fix with the sizes that work; sizes' lists
            // give those, so its fix is plan's without that tail.
            let fix = plan["problems"][0]["fix"].as_str().map(|f| {
                let cut = ["; TP sizes that work", "; no TP size up to"]
                    .iter()
                    .find_map(|tail| f.find(tail));
                f[..cut.unwrap_or(f.len())].to_string()
            });
            assert_eq!(
                fix.map(Value::from).unwrap_or(Value::Null),
                v["fix"],
                "{args:?}"
            );
            assert_eq!(plan["problem_count"], v["problems"], "{args:?}");
        } else {
            assert_eq!(v["reason"], Value::Null, "{v}");
        }
    }
}

#[test]
fn a_dense_model_lists_the_divisors_of_its_heads() {
    let src = "examples/tiny-llama";
    let doc = sizes_json(src, &[]);
    assert_eq!(doc["attention_heads"], 8);
    assert_eq!(tps(&doc["accepted_tp"]), [1, 2, 4, 8]);
    assert_eq!(
        doc["accepted_tp_expert_parallel"],
        Value::Null,
        "dense: no EP"
    );
    assert!(
        doc["checked"]
            .as_array()
            .unwrap()
            .iter()
            .all(|v| v["expert_parallel"] == false)
    );
    // Two layers: PP 2 only, at every TP accepted alone.
    assert_eq!(doc["accepted_pp"].as_array().unwrap().len(), 1);
    assert_eq!(doc["accepted_pp"][0]["pp"], 2);
    assert_eq!(tps(&doc["accepted_pp"][0]["tp"]), [1, 2, 4, 8]);
    let three = doc["checked"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["tp"] == 3)
        .expect("TP 3 is checked");
    assert!(
        three["reason"]
            .as_str()
            .unwrap()
            .starts_with("num_attention_heads (8) is not divisible by tp (3)"),
        "{three}"
    );
    agrees_with_plan(src, &doc);
}

#[test]
fn sizes_agree_with_plan_on_gqa_and_pipeline_fixtures() {
    for name in ["llama_gqa", "qwen2", "gemma2"] {
        let src = fixtures_dir().join(name);
        let doc = sizes_json(s(&src), &["--max-tp", "16", "--max-pp", "3"]);
        assert!(
            tps(&doc["accepted_tp"]).contains(&1),
            "{name}: TP 1 always fits"
        );
        agrees_with_plan(s(&src), &doc);
    }
}

#[test]
fn an_fp8_block_moe_is_refused_where_its_scales_do_not_align() {
    let src = fixtures_dir().join("qwen3_moe_fp8_block");
    let doc = sizes_json(s(&src), &["--max-tp", "8"]);
    assert_eq!(doc["experts"], 8);
    // 8 heads would allow 4 and 8, but the 32-wide scale blocks do not split that far.
    assert_eq!(tps(&doc["accepted_tp"]), [1, 2]);
    assert_eq!(tps(&doc["accepted_tp_expert_parallel"]), [2]);
    let four = doc["checked"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["tp"] == 4 && v["pp"] == 1 && v["expert_parallel"] == false)
        .unwrap();
    assert!(four["reason"].as_str().unwrap().contains("block"), "{four}");
    // Qwen3-MoE needs a MoE layer on every stage; its first layer is dense.
    assert_eq!(tps(&doc["accepted_pp"][0]["tp"]), Vec::<u64>::new());
    agrees_with_plan(s(&src), &doc);
}

#[test]
fn a_moe_checks_expert_parallelism_too() {
    for name in ["mixtral", "qwen2_moe"] {
        let src = fixtures_dir().join(name);
        let doc = sizes_json(s(&src), &["--max-tp", "8", "--max-pp", "2"]);
        assert!(doc["experts"].as_u64().is_some(), "{name}");
        assert!(
            doc["checked"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v["expert_parallel"] == true),
            "{name}: EP layouts checked"
        );
        agrees_with_plan(s(&src), &doc);
    }
}

#[test]
fn the_table_sums_up_what_vllm_accepts() {
    let out = run(&["sizes", "examples/tiny-llama", "--max-tp", "8"]);
    assert!(out.status.success(), "{}", context(&out));
    let text = stdout(&out);
    assert!(text.contains("vLLM accepts --tp 1, 2, 4, 8\n"), "{text}");
    assert!(text.contains("  with --pp 2: --tp 1, 2, 4, 8\n"), "{text}");
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("3   1  no  refuses"))
        .unwrap_or_else(|| panic!("no row for TP 3:\n{text}"));
    assert!(row.contains("num_attention_heads (8)"), "{row}");
    assert!(!text.contains("  16 "), "--max-tp 8 stops at 8:\n{text}");
}

#[test]
fn an_unreadable_source_is_still_an_error() {
    let out = run(&["sizes", "/no/such/checkpoint"]);
    assert_eq!(out.status.code(), Some(2), "{}", context(&out));
    let out = run(&["sizes", "examples/tiny-llama", "--max-tp", "0"]);
    assert_eq!(out.status.code(), Some(2), "{}", context(&out));
}

/// `VLLM_PP_LAYER_PARTITION` applies whatever the size, as in vLLM: every layout without PP is
/// refused, and the PP size it describes is checked at every TP size.
#[test]
fn a_layer_partition_pins_the_pp_size() {
    let out = wload_process()
        .args(["sizes", "examples/tiny-llama", "--max-tp", "4", "--json"])
        .env("VLLM_PP_LAYER_PARTITION", "1,1")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", context(&out));
    let doc: Value = json_doc(&["sizes"], &out);
    assert_eq!(tps(&doc["accepted_tp"]), Vec::<u64>::new());
    assert_eq!(doc["accepted_pp"].as_array().unwrap().len(), 1, "{doc}");
    assert_eq!(doc["accepted_pp"][0]["pp"], 2);
    assert_eq!(tps(&doc["accepted_pp"][0]["tp"]), [1, 2, 4]);
    let one = &doc["checked"][0];
    assert!(
        one["reason"]
            .as_str()
            .unwrap()
            .contains("VLLM_PP_LAYER_PARTITION"),
        "{one}"
    );
}

/// What config.json leaves out is the config class's default, as `plan` takes it: a Mixtral
/// config without `num_local_experts` has 8 experts (more than the tiny checkpoint holds, so
/// every layout is refused, expert-parallel ones included, each for plan's reason), and a Qwen2
/// config without `num_key_value_heads` has 32 kv heads.
#[test]
fn missing_fields_are_the_family_defaults() {
    let mixtral = fixture_with("mixtral", |m| {
        m.remove("num_local_experts").expect("stated");
    });
    let src = s(mixtral.path());
    let doc = sizes_json_refused(src, &["--max-tp", "2", "--max-pp", "1"]);
    assert_eq!(doc["experts"], 8, "{doc}");
    assert_eq!(tps(&doc["accepted_tp_expert_parallel"]), Vec::<u64>::new());
    let ep = doc["checked"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["expert_parallel"] == true)
        .count();
    assert_eq!(ep, 1, "TP 2 with EP is checked: {doc}");
    agrees_with_plan(src, &doc);

    let qwen2 = fixture_with("qwen2", |m| {
        m.remove("num_key_value_heads").expect("stated");
    });
    let doc = sizes_json_refused(s(qwen2.path()), &["--max-tp", "2", "--max-pp", "1"]);
    assert_eq!(doc["kv_heads"], 32, "{doc}");
    assert_eq!(doc["experts"], Value::Null);
}

/// A config claiming 99,999 layers took `sizes` a minute and 1.3 GiB (every layout planned every
/// layer): it is refused at once for every layout, naming the 4096-layer limit.
#[test]
fn sizes_of_a_config_with_too_many_layers_answers_at_once() {
    let dir = copy_fixture("llama_gqa");
    let mut c = read_config(dir.path());
    c.insert("num_hidden_layers".into(), 99_999.into());
    write_config(dir.path(), c);
    let t = std::time::Instant::now();
    let doc = sizes_json_refused(s(dir.path()), &[]);
    assert!(t.elapsed().as_secs() < 20, "took {:?}", t.elapsed());
    let checked = doc["checked"].as_array().expect("checked");
    assert!(!checked.is_empty());
    assert!(checked.iter().all(|v| v["accepted"] == false), "{doc}");
    // Where the heads allow the size, the layer count is the reason.
    let tp1 = checked.iter().find(|v| v["tp"] == 1).expect("tp 1");
    assert!(
        tp1["reason"]
            .as_str()
            .unwrap_or("")
            .contains("at most 4096"),
        "{tp1}"
    );
}

/// Every candidate size missing from a list carries its reason: TP 1 and the sizes that split
/// the heads are not checked with expert parallelism (vLLM's FusedMoEParallelConfig uses EP only
/// when TP × DP > 1), the TP sizes refused alone are not checked with --pp, and PP sizes above
/// the layers are not checked at all; the human summary says each.
#[test]
fn every_size_left_out_of_a_list_says_why() {
    let fx = fixtures_dir().join("qwen2_moe");
    let src = s(&fx);
    let doc = sizes_json(src, &["--max-tp", "8", "--max-pp", "4"]);
    let not_checked = doc["not_checked"].as_array().expect("not_checked");
    let skipped = |tp: u64, pp: u64, ep: bool| {
        not_checked
            .iter()
            .find(|n| n["tp"] == tp && n["pp"] == pp && n["expert_parallel"] == ep)
            .map(|n| n["reason"].as_str().unwrap().to_string())
    };
    let checked = |tp: u64, pp: u64, ep: bool| {
        doc["checked"]
            .as_array()
            .unwrap()
            .iter()
            .any(|v| v["tp"] == tp && v["pp"] == pp && v["expert_parallel"] == ep)
    };
    let tps: Vec<u64> = (1..=8).collect();
    for &tp in &tps {
        assert!(checked(tp, 1, false), "tp {tp} alone: {doc}");
        assert!(
            checked(tp, 1, true) != skipped(tp, 1, true).is_some(),
            "tp {tp} with EP: checked or not checked with a reason, once: {doc}"
        );
        assert!(
            checked(tp, 2, false) != skipped(tp, 2, false).is_some(),
            "tp {tp} at --pp 2: {doc}"
        );
    }
    let tp1 = skipped(1, 1, true).expect("EP at TP 1 is not checked");
    assert!(tp1.contains("TP × DP > 1"), "{tp1}");
    let tp3 = skipped(3, 1, true).expect("EP at TP 3 is not checked");
    assert!(tp3.contains("8 attention heads"), "{tp3}");
    assert!(
        skipped(3, 2, false)
            .unwrap()
            .contains("refused without --pp")
    );
    // Two layers: --pp 3 and 4 are left out, once, for every TP size.
    let beyond: Vec<&Value> = not_checked.iter().filter(|n| n["tp"].is_null()).collect();
    assert_eq!(beyond.len(), 1, "{doc}");
    assert_eq!(beyond[0]["pp"], 3);
    assert!(beyond[0]["reason"].as_str().unwrap().contains("2 layers"));

    let out = run(&["sizes", src, "--max-tp", "8", "--max-pp", "4"]);
    let text = stdout(&out);
    for line in [
        "  with --enable-expert-parallel: --tp 2, 4, 8",
        "    not checked: --tp 1 (vLLM uses expert parallelism only when TP × DP > 1: at TP 1 the flag changes nothing)",
        "    not checked: --tp 3, 5, 6, 7 (the size does not divide the 8 attention heads, which expert parallelism does not change)",
        "    not checked: --tp 3, 5, 6, 7 (refused without --pp, and each stage splits its tensors as TP alone does)",
        "  not checked: --pp 3 and above: the model has 2 layers, and vLLM gives each stage at least one",
    ] {
        assert!(text.lines().any(|l| l == line), "{line:?} in:\n{text}");
    }
}

/// A vision-language model whose tower wload does not map (a mapping's `by: wload` check; the
/// shipped ones map every tower): the table says it is wload that cannot plan it (not vLLM that
/// refuses), the summary gives the sizes `--language-model-only` takes, and the run fails as
/// `plan` does (exit 3), with that flag as the fix.
#[test]
fn a_tower_wload_does_not_map_is_said_to_be_wloads_limit_with_the_flag_that_helps() {
    let src = fixtures_dir().join("llama4");
    let tmp = tempfile::TempDir::new().unwrap();
    let mapping = tmp.path().join("unmapped_tower.yaml");
    std::fs::write(
        &mapping,
        "extends: llama4\nfamily: unmapped_tower\narchitectures: [Llama4ForConditionalGeneration]\nchecks:\n  - rule: language_model_only\n    message: \"this mapping does not map the vision model\"\n    fix: pass --language-model-only (vLLM then builds the text model alone)\n    by: wload\n",
    )
    .unwrap();
    let m = ["--mapping", s(&mapping)];
    let run = |args: &[&str]| run(&[args, &m].concat());
    let wload_json_exit = |args: &[&str], code| wload_json_exit(&[args, &m].concat(), code);
    let sizes_json = |src, args: &[&str]| sizes_json(src, &[args, &m].concat());
    let out = run(&["sizes", s(&src)]);
    assert_eq!(out.status.code(), Some(3), "{}", context(&out));
    let (so, err) = (stdout(&out), stderr(&out));
    assert!(so.contains("wload cannot"), "{so}");
    assert!(!so.contains("vLLM requires `language_model_only`"), "{so}");
    assert!(so.contains("(wload's limit, not vLLM's)"), "{so}");
    assert!(
        so.contains("with --language-model-only (the text model alone): --tp 1, 2, 4, 8"),
        "{so}"
    );
    assert!(err.contains("fix: pass --language-model-only"), "{err}");
    let doc = wload_json_exit(&["sizes", s(&src), "--json"], 3);
    assert_eq!(tps(&doc["accepted_tp_language_model_only"]), [1, 2, 4, 8]);
    // With the flag, the sizes the summary named, and plan agrees.
    let doc = sizes_json(s(&src), &["--language-model-only"]);
    assert_eq!(tps(&doc["accepted_tp"]), [1, 2, 4, 8]);
    assert!(
        doc.get("accepted_tp_language_model_only").is_none(),
        "{doc:#}"
    );
    let plan = run(&["plan", s(&src), "--tp", "8", "--language-model-only"]);
    assert!(plan.status.success(), "{}", context(&plan));
}

/// `-q`: the summary lines alone, no table.
#[test]
fn quiet_sizes_print_the_summary_alone() {
    let src = fixtures_dir().join("llama_gqa");
    let out = run(&["sizes", s(&src), "-q"]);
    assert!(out.status.success(), "{}", context(&out));
    let so = stdout(&out);
    assert!(so.starts_with("vLLM accepts --tp 1, 2, 4, 8\n"), "{so}");
    assert!(
        !so.contains("FIRST REASON") && !so.contains("source "),
        "{so}"
    );
}
