//! OLMo 3 (`Olmo3ForCausalLM`, mappings/olmo3.yaml), which vLLM 0.33 builds with its Transformers
//! modeling backend (`TransformersForCausalLM`, vllm-spec §13.5), on the golden fixture
//! `olmo3_synth`. The test rebuilds every rank from the checkpoint by plain slicing, following
//! the backend's fusion rules written out here: `qkv_proj` rows `[q_r; k_r; v_r]` (kv heads
//! replicated past their count), `q_norm` / `k_norm` whole on every rank although q and k are
//! split, `gate_up_proj` `[gate_r; up_r]`, o_proj / down_proj columns, the two post-sublayer
//! norms, the vocab padded to 320 and split. The rules are first checked against real vLLM's
//! TP 2 ranks (their digests), then wload's TP 1 and TP 4 output against them, byte for byte.
//! The other architectures vLLM sends to the backend are refused by name, with the reason.

use serde_json::json;
use tempfile::TempDir;

use crate::support::*;

const CASE: &str = "olmo3_synth";
const H: usize = 128; // hidden_size
const NH: usize = 4; // num_attention_heads
const NKV: usize = 2; // num_key_value_heads
const HD: usize = 32; // hidden_size / num_attention_heads
const I: usize = 256; // intermediate_size

fn layer(i: usize, n: &str) -> String {
    format!("model.layers.{i}.{n}")
}

fn bf16(shape: &[usize], data: Vec<u8>) -> Held {
    Held::new("BF16", shape, data)
}

/// Layer `i` on rank `r` of `tp`, as the Transformers backend holds it.
fn layer_tensors(want: &mut Tensors, c: &Tensors, i: usize, r: usize, tp: usize) {
    let src = |n: &str| &c[&layer(i, n)];
    let qr = NH * HD / tp;
    let kvr = (NKV * HD / tp).max(HD);
    let qkv = [
        src("self_attn.q_proj.weight").rows(r * qr, (r + 1) * qr),
        kv_rows(src("self_attn.k_proj.weight"), r, tp, NKV, HD),
        kv_rows(src("self_attn.v_proj.weight"), r, tp, NKV, HD),
    ]
    .concat();
    want.insert(
        layer(i, "self_attn.qkv_proj.weight"),
        bf16(&[qr + 2 * kvr, H], qkv),
    );
    let o = src("self_attn.o_proj.weight").cols(r * qr, (r + 1) * qr);
    want.insert(layer(i, "self_attn.o_proj.weight"), bf16(&[H, qr], o));
    // OLMo's norms run over the whole projection: vLLM keeps them whole on every rank.
    for n in [
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
        "post_attention_layernorm.weight",
        "post_feedforward_layernorm.weight",
    ] {
        want.insert(layer(i, n), src(n).clone());
    }
    for s in ["k", "v", "q", "prob"] {
        let one = Held::new("F32", &[], 1f32.to_le_bytes().to_vec());
        want.insert(layer(i, &format!("self_attn.attn._{s}_scale")), one);
    }
    let ir = I / tp;
    let gate_up = [
        src("mlp.gate_proj.weight").rows(r * ir, (r + 1) * ir),
        src("mlp.up_proj.weight").rows(r * ir, (r + 1) * ir),
    ]
    .concat();
    want.insert(
        layer(i, "mlp.gate_up_proj.weight"),
        bf16(&[2 * ir, H], gate_up),
    );
    let down = src("mlp.down_proj.weight").cols(r * ir, (r + 1) * ir);
    want.insert(layer(i, "mlp.down_proj.weight"), bf16(&[H, ir], down));
}

/// Every tensor rank `r` of `tp` must hold, rebuilt from the checkpoint `c` by the rules alone.
fn want_rank(c: &Tensors, r: usize, tp: usize) -> Tensors {
    let mut want = Tensors::new();
    for n in ["model.embed_tokens.weight", "lm_head.weight"] {
        want.insert(n.into(), vocab_rows(&c[n], r, tp));
    }
    want.insert("model.norm.weight".into(), c["model.norm.weight"].clone());
    for i in 0..2 {
        layer_tensors(&mut want, c, i, r, tp);
    }
    want
}

/// The rules rebuild real vLLM's TP 2 ranks exactly (27 tensors each): what the test below
/// checks wload against at other sizes is vLLM's behaviour, not a guess.
#[test]
fn the_rules_rebuild_vllms_tp2_ranks() {
    let c = checkpoint_tensors(&fixture(CASE));
    for r in 0..2 {
        let want = want_rank(&c, r, 2);
        assert_eq!(want.len(), 27);
        assert_matches_vllm_rank(&want, CASE, 2, r as u64);
    }
}

/// TP 1 (everything whole but the padded vocab) and TP 4 (2 kv heads over 4 ranks: each
/// replicated on two, the norms still whole): every tensor by the rules.
#[test]
fn tp1_and_tp4_follow_the_backends_rules() {
    let c = checkpoint_tensors(&fixture(CASE));
    let tmp = TempDir::new().unwrap();
    for tp in [1usize, 4] {
        let dir = tmp.path().join(format!("tp{tp}"));
        shard_ok(&fixture(CASE), tp as u64, &dir, &["-q"]);
        for r in 0..tp {
            let got = rank_tensors(&dir, r as u64);
            assert_same_tensors(&got, &want_rank(&c, r, tp), &format!("tp{tp} rank {r}"));
        }
    }
}

/// Another architecture vLLM sends to the Transformers backend is refused by name, with the
/// reason and the way out; an OLMo 3 with attention biases (unchecked there) by wload's check.
#[test]
fn other_transformers_backend_models_are_refused_by_name() {
    let tmp = TempDir::new().unwrap();
    let olmo2 = fixture_with(CASE, |c| {
        c.insert("architectures".into(), json!(["Olmo2ForCausalLM"]));
        c.insert("model_type".into(), json!("olmo2"));
    });
    let run = shard(olmo2.path(), 2, &tmp.path().join("o2"), &["-q"]);
    let text = assert_refusal_text(
        &run,
        3,
        &[
            "Olmo2ForCausalLM",
            "Transformers modeling backend (TransformersForCausalLM",
            "only for Olmo3ForCausalLM",
            "--mapping FILE",
        ],
    );
    assert!(!text.contains("no mapping for architecture"), "{text}");
    assert!(!tmp.path().join("o2").exists());
    let biased = fixture_with(CASE, |c| {
        c.insert("attention_bias".into(), json!(true));
    });
    let run = shard(biased.path(), 2, &tmp.path().join("b"), &["-q"]);
    assert_refusal_text(
        &run,
        3,
        &["attention_bias is true", "without attention biases"],
    );
}
