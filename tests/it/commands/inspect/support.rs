//! `inspect`'s architecture verdict: one `support` line near the top and a `support` object, the
//! structure section marked when no mapping backs it, and for an architecture `plan` refuses,
//! everything printed and then plan's error with its exit status (3), so that CI can gate on it.

use super::*;

/// The llama_gqa fixture under another architecture name.
fn as_architecture(arch: &str) -> TempDir {
    fixture_with("llama_gqa", |m| {
        m.insert("architectures".into(), json!([arch]));
    })
}

#[test]
fn a_supported_architecture_says_which_mapping_serves_it() {
    let dir = fixtures_dir().join("llama_gqa");
    let out = run(&["inspect", s(&dir)]);
    assert!(out.status.success(), "{}", context(&out));
    let lines: Vec<String> = stdout(&out).lines().map(str::to_string).collect();
    assert_eq!(
        lines[3],
        "support supported: LlamaForCausalLM by the built-in llama mapping; vLLM 0.33 builds it; plan, shard and load accept it"
    );
    let v = wload_json(&["inspect", s(&dir), "--json"]);
    assert_eq!(v["ok"], true);
    let sup = &v["support"];
    assert_eq!(sup["supported"], true);
    assert_eq!(sup["architecture"], "LlamaForCausalLM");
    assert_eq!(sup["family"], "llama");
    assert_eq!(sup["mapping_file"], Value::Null);
    assert_eq!(sup["vllm"], "supported");
    assert_eq!(sup["structure_from"], "mapping");
    assert_eq!(sup["closest"], json!([]));
}

/// An architecture without a mapping: files, tensors and totals all printed, the verdict with
/// the closest supported names, the structure marked as the config's alone, then plan's own
/// refusal on stderr and exit 3; `--json` carries the same report with `"ok": false`.
#[test]
fn an_unsupported_architecture_is_reported_whole_and_exits_3() {
    let tmp = as_architecture("LLaMAForCausalLM");
    let d = s(tmp.path());
    let out = run(&["inspect", d]);
    let plan = run(&["plan", d, "--tp", "2"]);
    assert_eq!(out.status.code(), Some(3), "{}", context(&out));
    assert_eq!(stderr(&out), stderr(&plan), "inspect refuses as plan does");
    assert!(stderr(&out).starts_with("error: no mapping for architecture 'LLaMAForCausalLM'"));
    let human = stdout(&out);
    let support = human.lines().nth(3).unwrap();
    for needle in [
        "support unsupported: wload has no mapping for LLaMAForCausalLM",
        "closest supported: LlamaForCausalLM",
        "plan and shard refuse it (exit 3)",
        "whether vLLM 0.33 builds it, wload does not know",
        "--mapping FILE",
    ] {
        assert!(support.contains(needle), "{needle:?} in {support}");
    }
    for section in ["\nfiles (6 read)\n", "\ntensors (21)\n", "\ntotals\n"] {
        assert!(human.contains(section), "{section:?} in {human}");
    }
    assert!(
        human.contains("\nstructure (read from config.json only: without a mapping,"),
        "{human}"
    );
    assert!(
        human.contains("experts              none named in config.json"),
        "{human}"
    );
    assert!(!human.contains("dense MLP"), "{human}");

    let out = run(&["inspect", d, "--json"]);
    assert_eq!(out.status.code(), Some(3), "{}", context(&out));
    let v: Value = json_doc(&["inspect"], &out);
    assert_eq!(v["ok"], false);
    assert_eq!(v["exit_status"], 3);
    assert_eq!(v["error"]["kind"], "checkpoint");
    assert_eq!(v["schema_version"], 1);
    let sup = &v["support"];
    assert_eq!(sup["supported"], false);
    assert_eq!(sup["vllm"], "unknown");
    assert_eq!(sup["structure_from"], "config.json");
    assert_eq!(sup["closest"][0], "LlamaForCausalLM");
    assert_eq!(v["tensors"].as_array().unwrap().len(), 21);
    assert_eq!(v["totals"]["tensors"], 21);
}

/// Nothing close: the verdict says so rather than offering unrelated names; no architecture at
/// all: the verdict and the refusal say the config names none.
#[test]
fn far_and_missing_architectures() {
    let tmp = as_architecture("AcmeForCausalLM");
    let v = json_doc(&["inspect"], &run(&["inspect", s(tmp.path()), "--json"]));
    assert_eq!(v["support"]["closest"], json!([]));
    let summary = v["support"]["summary"].as_str().unwrap();
    assert!(
        summary.contains("no supported architecture has a close name"),
        "{summary}"
    );

    let tmp = fixture_with("llama_gqa", |m| {
        m.remove("architectures");
    });
    let out = run(&["inspect", s(tmp.path())]);
    assert_eq!(out.status.code(), Some(3), "{}", context(&out));
    assert!(
        stderr(&out).starts_with("error: config.json has no 'architectures'"),
        "{}",
        context(&out)
    );
    assert!(
        stdout(&out).contains("support unsupported: config.json names no architecture"),
        "{}",
        stdout(&out)
    );
}

/// `--mapping FILE` makes an unknown architecture supported (plan accepts it then): exit 0, the
/// file named, vLLM's support unknown.
#[test]
fn a_mapping_file_supports_an_architecture_vllm_may_not_know() {
    let tmp = as_architecture("AcmeForCausalLM");
    let file = tmp.path().join("acme.yaml");
    let llama = fs::read_to_string(manifest_dir().join("mappings/llama.yaml")).unwrap();
    let acme: Vec<String> = llama
        .lines()
        .map(|l| match l.starts_with("architectures:") {
            true => "architectures: [AcmeForCausalLM]".to_string(),
            false => l.to_string(),
        })
        .collect();
    fs::write(&file, acme.join("\n")).unwrap();
    let v = wload_json(&["inspect", s(tmp.path()), "--mapping", s(&file), "--json"]);
    let sup = &v["support"];
    assert_eq!(sup["supported"], true);
    assert_eq!(sup["family"], "llama");
    assert_eq!(sup["mapping_file"], s(&file));
    assert_eq!(sup["vllm"], "unknown");
    assert!(
        sup["summary"]
            .as_str()
            .unwrap()
            .contains("whether vLLM 0.33 builds it, wload does not know"),
        "{sup}"
    );
}
