//! The quantization section and the tensor roles.

use super::*;

/// The rows of the human report's `quantization` section, up to the blank line after it.
fn quant_section(human: &str) -> String {
    let start = human
        .find("\nquantization\n")
        .unwrap_or_else(|| panic!("no quantization section:\n{human}"));
    let rest = &human[start + 1..];
    rest[..rest.find("\n\n").unwrap_or(rest.len())].to_string()
}

#[test]
fn fp8_fixtures_show_method_scheme_block_and_ignored_modules() {
    let qwen_ignored = [
        "lm_head",
        "model.layers.0.input_layernorm",
        "model.layers.0.post_attention_layernorm",
        "model.layers.1.input_layernorm",
        "model.layers.1.post_attention_layernorm",
        "model.layers.1.mlp.gate",
    ];
    let cases = [
        (
            "llama_gqa_fp8_tensor",
            json!({"method": "fp8", "scheme": "per-tensor", "weight_block_size": null,
                "activation_scheme": "static", "ignored": [], "supported": true, "refusal": null}),
            vec![
                "  method               fp8\n",
                "  weights              FP8, one scale per tensor (weight_scale)\n",
                "  activations          static (an input_scale per linear layer)\n",
                "  ignored              none\n",
            ],
        ),
        (
            "llama_gqa_fp8_block",
            json!({"method": "fp8", "scheme": "block", "weight_block_size": [32, 32],
                "activation_scheme": "dynamic", "ignored": [], "supported": true, "refusal": null}),
            vec![
                "  weights              FP8, one scale per 32×32 block (weight_scale_inv)\n",
                "  activations          dynamic (scaled at run time)\n",
            ],
        ),
        (
            "llama_gqa_ct_fp8_dynamic",
            json!({"method": "compressed-tensors", "scheme": "per-channel", "weight_block_size": null,
                "activation_scheme": "dynamic", "ignored": ["lm_head"], "supported": true, "refusal": null}),
            vec![
                "  method               compressed-tensors\n",
                "  weights              FP8, one scale per output channel (weight_scale)\n",
                "  ignored              1: lm_head\n",
            ],
        ),
        (
            "qwen3_moe_fp8_block",
            json!({"method": "fp8", "scheme": "block", "weight_block_size": [32, 32],
                "activation_scheme": "dynamic", "ignored": qwen_ignored, "supported": true,
                "refusal": null}),
            vec![
                "  weights              FP8, one scale per 32×32 block (weight_scale_inv)\n",
                "  ignored              6: lm_head, model.layers.0.input_layernorm, model.layers.0.post_attention_layernorm, model.layers.1.input_layernorm, model.layers.1.post_attention_layernorm, model.layers.1.mlp.gate\n",
            ],
        ),
    ];
    for (fixture, quant, lines) in cases {
        let dir = fixtures_dir().join(fixture);
        let out = wload_json(&["inspect", s(&dir), "--json"]);
        assert_eq!(out["quantization"], quant, "{fixture}");
        let section = quant_section(&inspect_human(&dir)) + "\n";
        for line in lines
            .iter()
            .chain(&["  wload                supported: plan, shard and load accept it\n"])
        {
            assert!(
                section.contains(line),
                "{fixture}: no {line:?} in\n{section}"
            );
        }
    }
}

/// The role a tensor name's suffix gives, computed here independently of the crate.
fn expected_role(name: &str) -> &'static str {
    let last = name.rsplit('.').next().unwrap();
    match last {
        "weight" => "weight",
        "weight_scale" | "weight_scale_inv" => "weight_scale",
        "input_scale" => "input_scale",
        "k_scale" | "v_scale" => "kv_cache_scale",
        "bias" => "bias",
        _ => "other",
    }
}

#[test]
fn every_fp8_fixture_tensor_has_its_role_and_roles_are_totalled() {
    for fixture in [
        "llama_gqa_fp8_tensor",
        "llama_gqa_fp8_block",
        "llama_gqa_ct_fp8_dynamic",
        "qwen3_moe_fp8_block",
    ] {
        let dir = fixtures_dir().join(fixture);
        let out = wload_json(&["inspect", s(&dir), "--json"]);
        let mut expected: std::collections::BTreeMap<(String, String), u64> = Default::default();
        for t in header_tensors(&dir.join("model.safetensors")) {
            *expected
                .entry((expected_role(&t.name).to_string(), t.dtype))
                .or_default() += 1;
        }
        for t in out["tensors"].as_array().unwrap() {
            let name = t["name"].as_str().unwrap();
            assert_eq!(t["role"], expected_role(name), "{fixture}: {name}");
        }
        let got: std::collections::BTreeMap<(String, String), u64> = out["totals"]["by_role"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| {
                let key = (
                    r["role"].as_str().unwrap().into(),
                    r["dtype"].as_str().unwrap().into(),
                );
                (key, r["tensors"].as_u64().unwrap())
            })
            .collect();
        assert_eq!(got, expected, "{fixture}");
        assert!(
            got.keys().any(|(r, d)| r == "weight" && d == "F8_E4M3"),
            "{fixture}: {got:?}"
        );
        assert!(
            got.keys().any(|(r, _)| r == "weight_scale"),
            "{fixture}: {got:?}"
        );
    }
    let section = quant_section(&inspect_human(&fixtures_dir().join("llama_gqa_fp8_tensor")));
    assert!(
        section.contains(
            "  tensors              7 BF16 weights, 14 F8_E4M3 weights, 14 F32 weight scales, 14 F32 input scales"
        ),
        "{section}"
    );
}

#[test]
fn an_unsupported_quant_method_is_described_then_refused_as_plan_refuses_it() {
    let tmp = copy_fixture("llama_gqa_fp8_tensor");
    let path = tmp.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    config["quantization_config"] = json!({"quant_method": "hqq", "bits": 4, "group_size": 128,
        "modules_to_not_convert": ["lm_head"]});
    write_json(&path, &config);

    // Everything described, then the exit status plan gives (a CI gate must not pass it).
    let out = wload_json_exit(&["inspect", s(tmp.path()), "--json"], 3);
    let q = &out["quantization"];
    assert_eq!(q["method"], "hqq");
    assert_eq!(q["supported"], false);
    assert_eq!(q["scheme"], Value::Null);
    assert_eq!(q["ignored"], json!(["lm_head"]));
    let message = q["refusal"]["message"].as_str().unwrap();
    assert!(message.contains("\"hqq\" is not supported"), "{message}");
    assert!(
        q["refusal"]["fix"]
            .as_str()
            .unwrap()
            .contains("unquantized"),
        "{q}"
    );

    let human = run(&["inspect", s(tmp.path())]);
    assert_eq!(human.status.code(), Some(3), "{}", context(&human));
    let section = quant_section(&stdout(&human));
    assert!(
        section.contains("  method               hqq\n"),
        "{section}"
    );
    assert!(
        section.contains(&format!(
            "  wload                refused by plan, shard and load: {message}\n"
        )),
        "{section}"
    );
    assert!(
        section.contains("  fix                  use the unquantized"),
        "{section}"
    );

    // What inspect says plan does, plan does.
    let plan = run(&["plan", s(tmp.path()), "--tp", "1"]);
    assert_refusal_text(&plan, 3, &[message]);
}

#[test]
fn an_unquantized_checkpoint_has_no_quantization_section_and_plain_roles() {
    let dir = fixtures_dir().join("llama_gqa");
    assert!(!inspect_human(&dir).contains("\nquantization\n"));
    let out = wload_json(&["inspect", s(&dir), "--json"]);
    assert_eq!(out["quantization"], Value::Null);
    let roles: BTreeSet<&str> = out["totals"]["by_role"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["role"].as_str().unwrap())
        .collect();
    assert_eq!(roles, BTreeSet::from(["weight"]));
}

#[test]
fn scale_tensors_without_a_quantization_config_are_pointed_out() {
    let tmp = copy_fixture("llama_gqa_fp8_block");
    let path = tmp.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    config
        .as_object_mut()
        .unwrap()
        .remove("quantization_config");
    write_json(&path, &config);
    let section = quant_section(&inspect_human(tmp.path()));
    assert!(
        section.contains("  method               none: the config has no quantization_config, yet the checkpoint has scale tensors\n"),
        "{section}"
    );
    assert!(section.contains("14 F32 weight scales"), "{section}");
    assert_eq!(
        wload_json(&["inspect", s(tmp.path()), "--json"])["quantization"],
        Value::Null
    );
}

#[test]
fn a_long_ignored_list_is_cut_short_unless_verbose() {
    let tmp = copy_fixture("llama_gqa_fp8_block");
    let path = tmp.path().join("config.json");
    let mut config: Value = serde_json::from_slice(&fs::read(&path).unwrap()).unwrap();
    let names: Vec<String> = (0..300)
        .map(|i| format!("model.layers.{i}.mlp.gate"))
        .collect();
    config["quantization_config"]["modules_to_not_convert"] = json!(names);
    write_json(&path, &config);
    let short = quant_section(&inspect_human(tmp.path()));
    assert!(
        short.contains("  ignored              300: model.layers.0.mlp.gate, "),
        "{short}"
    );
    assert!(
        short.contains("model.layers.7.mlp.gate, and 292 more (-v lists all)\n"),
        "{short}"
    );
    assert!(!short.contains("model.layers.8.mlp.gate"), "{short}");
    let out = run(&["inspect", "-v", s(tmp.path())]);
    assert!(out.status.success(), "{}", context(&out));
    let long = quant_section(&stdout(&out));
    assert!(long.contains("model.layers.299.mlp.gate\n"), "{long}");
    let json = wload_json(&["inspect", s(tmp.path()), "--json"]);
    assert_eq!(json["quantization"]["ignored"], json!(names));
}

#[test]
fn the_json_schema_doc_names_every_quantization_and_role_field() {
    let doc = fs::read_to_string(manifest_dir().join("docs/inspect-json.md")).unwrap();
    let out = wload_json(&[
        "inspect",
        s(&fixtures_dir().join("llama_gqa_fp8_tensor")),
        "--json",
    ]);
    let mut keys: Vec<String> = Vec::new();
    for obj in [
        &out["quantization"],
        &out["tensors"][0],
        &out["totals"]["by_role"][0],
    ] {
        keys.extend(obj.as_object().unwrap().keys().cloned());
    }
    keys.extend(["by_role".into(), "quantization".into()]);
    for role in out["totals"]["by_role"].as_array().unwrap() {
        keys.push(role["role"].as_str().unwrap().into());
    }
    for k in keys {
        assert!(
            doc.contains(&format!("\"{k}\"")) || doc.contains(&format!("`{k}`")),
            "docs/inspect-json.md does not name {k:?}"
        );
    }
}

#[test]
fn the_role_summary_under_a_filter_counts_the_matching_tensors_and_says_so() {
    let dir = fixtures_dir().join("llama_gqa_fp8_tensor");
    let out = run(&["inspect", s(&dir), "--filter", r"layers\.0\..*_scale$"]);
    assert!(out.status.success(), "{}", context(&out));
    let section = quant_section(&stdout(&out));
    assert!(
        section.contains(
            "  tensors              7 F32 weight scales, 7 F32 input scales (of those matching /layers\\.0\\..*_scale$/)"
        ),
        "{section}"
    );
}
