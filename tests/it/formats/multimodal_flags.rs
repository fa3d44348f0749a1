//! vLLM's multimodal flags `--language-model-only` and `--mm-encoder-tp-mode`: what a mapping's
//! expressions see of them, and how an output records them (wload.json, the serve line) for
//! `load` to take back. On a text-only model vLLM ignores both (it builds no MultiModalConfig,
//! `config/model.py:831`), so the files are those written without them.

use std::fs;
use std::path::Path;

use serde_json::Value;
use tempfile::TempDir;

use crate::support::*;

fn manifest(out: &Path) -> Value {
    serde_json::from_slice(&fs::read(out.join("wload.json")).unwrap()).unwrap()
}

fn serve_argv(m: &Value) -> Vec<String> {
    m["serve"]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect()
}

/// Set, both flags are recorded, passed on in the serve line, and taken back by `load`; left
/// out, neither appears anywhere (vLLM's defaults), and the files are the same bytes.
#[test]
fn the_flags_are_recorded_served_and_taken_back_by_load() {
    let src = fixture("llama_gqa");
    let tmp = TempDir::new().unwrap();
    let (plain, mm) = (tmp.path().join("plain"), tmp.path().join("mm"));
    shard_ok(&src, 2, &plain, &["-q"]);
    let flags = [
        "-q",
        "--language-model-only",
        "--mm-encoder-tp-mode",
        "data",
    ];
    shard_ok(&src, 2, &mm, &flags);

    let m = manifest(&plain);
    assert!(m.get("language_model_only").is_none(), "{m:#}");
    assert!(m.get("mm_encoder_tp_mode").is_none(), "{m:#}");
    let argv = serve_argv(&m);
    assert!(
        !argv.iter().any(|a| a.contains("language-model-only")),
        "{argv:?}"
    );
    assert!(!argv.iter().any(|a| a.contains("mm-encoder")), "{argv:?}");

    let m = manifest(&mm);
    assert_eq!(m["language_model_only"], true, "{m:#}");
    assert_eq!(m["mm_encoder_tp_mode"], "data", "{m:#}");
    let argv = serve_argv(&m);
    assert!(
        argv.contains(&"--language-model-only".to_string()),
        "{argv:?}"
    );
    let at = argv
        .iter()
        .position(|a| a == "--mm-encoder-tp-mode")
        .expect("--mm-encoder-tp-mode in the serve line");
    assert_eq!(argv[at + 1], "data", "{argv:?}");
    assert!(
        m["serve"]["shell"]
            .as_str()
            .unwrap()
            .contains("--mm-encoder-tp-mode data")
    );

    for r in 0..2 {
        let name = format!("model-rank-{r}-part-0.safetensors");
        assert_eq!(
            fs::read(plain.join(&name)).unwrap(),
            fs::read(mm.join(&name)).unwrap(),
            "{name}: a text-only model is the same with the flags"
        );
    }

    let load = run(&["load", s(&mm), "--dry-run"]);
    assert!(load.status.success(), "{}", context(&load));
    let said = format!("{}{}", stdout(&load), stderr(&load));
    assert!(said.contains("--language-model-only"), "{}", context(&load));
    assert!(
        said.contains("--mm-encoder-tp-mode data"),
        "{}",
        context(&load)
    );
}

/// `plan --json` states the flags when set; a mapping's checks read them as
/// `language_model_only` and `mm_encoder_tp_mode`.
#[test]
fn mapping_expressions_see_the_flags() {
    let src = fixture("llama_gqa");
    let plan = clean_plan_json(&src, &["--tp", "2", "--language-model-only"]);
    assert_eq!(plan["language_model_only"], true);
    assert!(plan.get("mm_encoder_tp_mode").is_none());

    let tmp = TempDir::new().unwrap();
    let mapping = tmp.path().join("acme.yaml");
    fs::write(
        &mapping,
        "extends: llama\nfamily: acme\narchitectures: [LlamaForCausalLM]\nchecks:\n  - rule: \"!language_model_only && mm_encoder_tp_mode == 'weights'\"\n    message: \"mode {mm_encoder_tp_mode}\"\n    fix: \"no flags\"\n",
    )
    .unwrap();
    let m = s(&mapping);
    let ok = run(&["plan", s(&src), "--tp", "2", "--mapping", m]);
    assert!(ok.status.success(), "{}", context(&ok));
    for extra in [
        &["--language-model-only"][..],
        &["--mm-encoder-tp-mode", "data"][..],
    ] {
        let mut args = vec!["plan", s(&src), "--tp", "2", "--mapping", m];
        args.extend_from_slice(extra);
        let refused = run(&args);
        assert_refusal_text(&refused, 3, &["no flags"]);
    }
    let data = run(&[
        "plan",
        s(&src),
        "--tp",
        "2",
        "--mapping",
        m,
        "--mm-encoder-tp-mode",
        "data",
    ]);
    assert!(stderr(&data).contains("mode data"), "{}", context(&data));
    let sizes = run(&[
        "sizes",
        s(&src),
        "--mapping",
        m,
        "--language-model-only",
        "--json",
    ]);
    // Nothing accepted: refused as plan refuses each size, the whole report in the document.
    assert_eq!(sizes.status.code(), Some(3), "{}", context(&sizes));
    let v: Value = json_doc(&["sizes"], &sizes);
    assert!(v["accepted_tp"].as_array().unwrap().is_empty(), "{v:#}");
}
