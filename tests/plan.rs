//! `wload plan` against real vLLM 0.33 output: for every golden case, each rank's key set, order,
//! dtypes and shapes equal what vLLM saved.

mod common;

use std::collections::BTreeMap;

use common::*;
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
        if ranks.len() as u64 != case.tp {
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
