//! Mistral's native format (consolidated.safetensors + params.json): names are remapped and q/k rows
//! permuted from Mistral's interleaved rotary layout, as vLLM's `maybe_remap_mistral` does. The test
//! turns the llama_gqa fixture into its Mistral-native form; vLLM builds the same module tree for
//! MistralForCausalLM as for Llama, so the shards must equal vLLM's llama_gqa output byte for byte.

use std::fs;
use std::path::Path;

use crate::support::*;
use serde_json::json;
use tempfile::TempDir;

/// HF name → Mistral-native name.
fn native_name(hf: &str) -> String {
    let map = [
        ("model.embed_tokens.weight", "tok_embeddings.weight"),
        ("model.norm.weight", "norm.weight"),
        ("lm_head.weight", "output.weight"),
    ];
    if let Some((_, n)) = map.iter().find(|(h, _)| *h == hf) {
        return n.to_string();
    }
    hf.replace("model.layers.", "layers.")
        .replace("self_attn.q_proj", "attention.wq")
        .replace("self_attn.k_proj", "attention.wk")
        .replace("self_attn.v_proj", "attention.wv")
        .replace("self_attn.o_proj", "attention.wo")
        .replace("mlp.gate_proj", "feed_forward.w1")
        .replace("mlp.down_proj", "feed_forward.w2")
        .replace("mlp.up_proj", "feed_forward.w3")
        .replace("input_layernorm", "attention_norm")
        .replace("post_attention_layernorm", "ffn_norm")
}

/// The inverse of vLLM's permute: HF half-split rows back to Mistral's interleaved rows, per head.
fn interleave(data: &[u8], rows: usize, row_bytes: usize, head_dim: usize) -> Vec<u8> {
    let mut out = vec![0u8; data.len()];
    for h in 0..rows / head_dim {
        for n in 0..head_dim {
            // HF row n of the head came from Mistral row 2n (first half) or 2(n - hd/2) + 1.
            let old = if n < head_dim / 2 {
                2 * n
            } else {
                2 * (n - head_dim / 2) + 1
            };
            let (src, dst) = (
                (h * head_dim + n) * row_bytes,
                (h * head_dim + old) * row_bytes,
            );
            out[dst..dst + row_bytes].copy_from_slice(&data[src..src + row_bytes]);
        }
    }
    out
}

fn native_checkpoint() -> TempDir {
    let fixture = fixtures_dir().join("llama_gqa");
    let cfg: serde_json::Value =
        serde_json::from_slice(&fs::read(fixture.join("config.json")).unwrap()).unwrap();
    let hd = cfg["head_dim"].as_u64().unwrap() as usize;
    let mut owned: Vec<(String, String, Vec<u64>, Vec<u8>)> = Vec::new();
    for (name, t) in checkpoint_tensors(&fixture) {
        let mut data = t.data;
        if name.contains("q_proj.weight") || name.contains("k_proj.weight") {
            let row = data.len() / t.shape[0] as usize;
            data = interleave(&data, t.shape[0] as usize, row, hd);
        }
        owned.push((native_name(&name), t.dtype, t.shape, data));
    }
    owned.sort_by(|a, b| a.0.cmp(&b.0));
    let dir = TempDir::new().unwrap();
    let tensors: Vec<Tensor> = owned
        .iter()
        .map(|(n, d, s, b)| (n.as_str(), d.as_str(), s.as_slice(), b.as_slice()))
        .collect();
    write_safetensors(&dir.path().join("consolidated.safetensors"), &tensors);
    write_json(
        &dir.path().join("params.json"),
        &json!({
            "dim": cfg["hidden_size"], "n_layers": cfg["num_hidden_layers"],
            "n_heads": cfg["num_attention_heads"], "n_kv_heads": cfg["num_key_value_heads"],
            "head_dim": cfg["head_dim"], "hidden_dim": cfg["intermediate_size"],
            "vocab_size": cfg["vocab_size"], "norm_eps": 1e-6, "rope_theta": 10000.0,
            "dtype": "bfloat16"
        }),
    );
    dir
}

fn data_of(path: &Path) -> Vec<(String, String, Vec<u64>, Vec<u8>)> {
    let bytes = fs::read(path).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let mut v: Vec<_> = header_tensors(path)
        .into_iter()
        .map(|t| {
            let d = bytes[8 + n + t.start as usize..8 + n + t.end as usize].to_vec();
            (t.name, t.dtype, t.shape, d)
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

#[test]
fn native_mistral_checkpoint_shards_like_its_hf_twin() {
    let src = native_checkpoint();
    let inspect = wload_json(&["inspect", s(src.path()), "--json"]);
    assert_eq!(inspect["format"]["load_format"], "mistral");
    assert_eq!(inspect["config"]["architecture"], "MistralForCausalLM");

    for tp in [2u64, 8] {
        let out = TempDir::new().unwrap();
        let dst = out.path().join("out");
        shard_ok(src.path(), tp, &dst, &["-q"]);
        let expected = expected("llama_gqa", tp);
        for r in 0..tp {
            let name = format!("model-rank-{r}-part-0.safetensors");
            let (want, got) = (data_of(&expected.join(&name)), data_of(&dst.join(&name)));
            assert_eq!(want.len(), got.len(), "tp{tp} rank {r}: tensor count");
            for (w, g) in want.iter().zip(&got) {
                assert_eq!((&w.0, &w.1, &w.2), (&g.0, &g.1, &g.2), "tp{tp} rank {r}");
                assert!(w.3 == g.3, "tp{tp} rank {r}: {} differs", w.0);
            }
        }
        // The source's params.json travels with the shards (vLLM's example copies it).
        assert!(dst.join("params.json").exists());
    }
}

/// Without the permutation the q/k rows would differ: the test above can fail.
#[test]
fn interleaving_really_moves_rows() {
    let data: Vec<u8> = (0..8).collect();
    assert_eq!(interleave(&data, 4, 2, 4), vec![0, 1, 4, 5, 2, 3, 6, 7]);
}

/// A Mistral-native output has params.json and no config.json, and no consolidated*.safetensors
/// for vLLM to notice: the serve command says `--config-format mistral` (and, with Mistral's
/// tokenizer file, `--tokenizer-mode mistral`); `load` infers it from wload.json, and without a
/// manifest says to pass it.
#[test]
fn a_mistral_native_output_is_served_and_loaded_with_its_config_format() {
    let src = native_checkpoint();
    let work = TempDir::new().unwrap();
    let out = work.path().join("out");
    let o = shard_ok(src.path(), 2, &out, &[]);
    assert!(!out.join("config.json").exists());
    let m: serde_json::Value =
        serde_json::from_slice(&fs::read(out.join("wload.json")).unwrap()).unwrap();
    let argv: Vec<&str> = m["serve"]["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(
        argv,
        [
            "vllm",
            "serve",
            s(&out),
            "--load-format",
            "sharded_state",
            "--tensor-parallel-size",
            "2",
            "--dtype",
            "bfloat16",
            "--config-format",
            "mistral",
            "--skip-tokenizer-init"
        ]
    );
    assert!(
        stdout(&o).contains("--config-format mistral"),
        "{}",
        stdout(&o)
    );

    let l = run(&["load", s(&out), "--dry-run", "--read"]);
    assert!(l.status.success(), "{}", context(&l));
    assert!(
        stderr(&l).contains("--config-format mistral taken from"),
        "{}",
        stderr(&l)
    );

    fs::remove_file(out.join("wload.json")).unwrap();
    assert_refusal_text(
        &run(&["load", s(&out), "--tp", "2", "--dry-run"]),
        3,
        &[
            "no config.json",
            "params.json",
            "pass --config-format mistral",
        ],
    );
    let l = run(&[
        "load",
        s(&out),
        "--tp",
        "2",
        "--config-format",
        "mistral",
        "--dry-run",
    ]);
    assert!(l.status.success(), "{}", context(&l));

    // With Mistral's own tokenizer file, vLLM would pick the HF tokenizer here without the flag.
    fs::write(src.path().join("tekken.json"), b"{}").unwrap();
    let out2 = work.path().join("out2");
    let o = shard_ok(src.path(), 1, &out2, &[]);
    assert!(
        stdout(&o).contains("--config-format mistral --tokenizer-mode mistral"),
        "{}",
        stdout(&o)
    );
}
