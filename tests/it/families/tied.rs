//! Tied embeddings whose checkpoint also ships an lm_head: vLLM builds them untied, loads both and
//! re-ties them only when equal (weight_tying.py). The sharded output must then hold one key
//! (`lm_head.weight`, at the embedding's place) and keep `tie_word_embeddings: true`; when they
//! differ, both keys and `tie_word_embeddings: false` in config.json, or vLLM cannot load it.

use std::fs;
use std::path::Path;

use crate::support::*;
use serde_json::Value;
use tempfile::TempDir;

/// The tied fixture plus an `lm_head.weight` file: a copy of the embedding, or with one element
/// changed.
fn tied_with_lm_head(equal: bool) -> TempDir {
    let tmp = copy_fixture("llama_tied_fp16");
    let dir = tmp.path();
    let Held {
        dtype,
        shape,
        mut data,
    } = checkpoint_tensors(dir)
        .remove("model.embed_tokens.weight")
        .expect("the fixture has an embedding");
    if !equal {
        data[0] ^= 0x01;
    }
    write_safetensors(
        &dir.join("model-lm-head.safetensors"),
        &[(
            "lm_head.weight",
            dtype.as_str(),
            shape.as_slice(),
            data.as_slice(),
        )],
    );
    // The index must name the new file, or vLLM (and wload) would drop it.
    let ipath = dir.join("model.safetensors.index.json");
    let mut index: Value = serde_json::from_slice(&fs::read(&ipath).unwrap()).unwrap();
    index["weight_map"]["lm_head.weight"] = Value::from("model-lm-head.safetensors");
    write_json(&ipath, &index);
    tmp
}

fn keys(path: &Path) -> Vec<String> {
    header_tensors(path).into_iter().map(|t| t.name).collect()
}

fn tie_in_config(out: &Path) -> Value {
    let cfg: Value = serde_json::from_slice(&fs::read(out.join("config.json")).unwrap()).unwrap();
    cfg["tie_word_embeddings"].clone()
}

#[test]
fn equal_lm_head_is_retied_like_vllm() {
    let src = tied_with_lm_head(true);
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(src.path(), 2, &out, &["-q"]);
    let expected = expected("llama_tied_fp16", 2);
    for r in 0..2 {
        let name = format!("model-rank-{r}-part-0.safetensors");
        // Same files as vLLM wrote for the checkpoint without the redundant lm_head.
        assert!(
            fs::read(out.join(&name)).unwrap() == fs::read(expected.join(&name)).unwrap(),
            "rank {r} differs from vLLM's tied output"
        );
    }
    assert_eq!(tie_in_config(&out), Value::Bool(true));
}

#[test]
fn different_lm_head_stays_untied_and_config_says_so() {
    let src = tied_with_lm_head(false);
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    shard_ok(src.path(), 2, &out, &["-q"]);
    let k = keys(&out.join("model-rank-0-part-0.safetensors"));
    assert!(k.contains(&"lm_head.weight".to_string()), "{k:?}");
    assert!(
        k.contains(&"model.embed_tokens.weight".to_string()),
        "{k:?}"
    );
    assert_eq!(tie_in_config(&out), Value::Bool(false));
    // The plan says the decision depends on the data.
    let plan = wload_json(&["plan", s(src.path()), "--tp", "2", "--json"]);
    assert_eq!(plan["retie"]["keep"], "lm_head.weight");
}
