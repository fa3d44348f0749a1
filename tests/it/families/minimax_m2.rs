//! MiniMax-M2 (`MiniMaxM2ForCausalLM`, mappings/minimax_m2.yaml) beyond the golden TP 2 case, on
//! its fixture (spec §11.1 "MiniMax-M2"). The test rebuilds every rank from the checkpoint by
//! plain slicing, following vLLM's rules written out here: the q/k norms split over all heads
//! (`MiniMaxText01RMSNormTP`), the k norm following the KV heads when they are replicated, an F32
//! router and correction bias, Mixtral-style experts. The rules are first checked against real
//! vLLM's TP 2 ranks (their digests), then wload's TP 1, TP 4, EP and PP output against them,
//! byte for byte; TP 8 (more ranks than the 4 experts) is refused as vLLM refuses it.

use tempfile::TempDir;

use crate::support::*;

const CASE: &str = "minimax_m2";
const H: usize = 128; // hidden_size
const NH: usize = 8; // num_attention_heads
const NKV: usize = 2; // num_key_value_heads
const HD: usize = 32; // head_dim
const I: usize = 64; // intermediate_size (the experts')
const E: usize = 4; // num_local_experts

fn layer(i: usize, n: &str) -> String {
    format!("model.layers.{i}.{n}")
}

fn bf16(shape: &[usize], data: Vec<u8>) -> Held {
    Held::new("BF16", shape, data)
}

/// Layer `i`'s attention on rank `r` of `tp`: qkv rows `[q_r | k_r | v_r]`, o_proj columns, the
/// scale buffers, q_norm's slice of all heads, k_norm's slice of the KV heads the rank holds.
fn attention(want: &mut Tensors, c: &Tensors, i: usize, r: usize, tp: usize) {
    let src = |n: &str| &c[&layer(i, n)];
    let qr = NH * HD / tp;
    let qkv = [
        src("self_attn.q_proj.weight").rows(r * qr, (r + 1) * qr),
        kv_rows(src("self_attn.k_proj.weight"), r, tp, NKV, HD),
        kv_rows(src("self_attn.v_proj.weight"), r, tp, NKV, HD),
    ]
    .concat();
    let kvr = (NKV * HD / tp).max(HD);
    want.insert(
        layer(i, "self_attn.qkv_proj.weight"),
        bf16(&[qr + 2 * kvr, H], qkv),
    );
    let o = src("self_attn.o_proj.weight").cols(r * qr, (r + 1) * qr);
    want.insert(layer(i, "self_attn.o_proj.weight"), bf16(&[H, qr], o));
    let q_norm = src("self_attn.q_norm.weight").rows(r * qr, (r + 1) * qr);
    want.insert(
        layer(i, "self_attn.q_norm.weight"),
        bf16(&[qr], q_norm.to_vec()),
    );
    let k_norm = kv_rows(src("self_attn.k_norm.weight"), r, tp, NKV, HD);
    want.insert(
        layer(i, "self_attn.k_norm.weight"),
        bf16(&[kvr], k_norm.to_vec()),
    );
    for s in ["k", "v", "q", "prob"] {
        let one = Held::new("F32", &[], 1f32.to_le_bytes().to_vec());
        want.insert(layer(i, &format!("self_attn.attn._{s}_scale")), one);
    }
    for n in ["input_layernorm.weight", "post_attention_layernorm.weight"] {
        want.insert(layer(i, n), src(n).clone());
    }
}

/// Layer `i`'s MoE block on rank `r`: router and correction bias F32 (the BF16 checkpoint cast)
/// and whole; routed experts `[w1_r ; w3_r]` and w2 columns, or with EP the experts
/// `[r E/tp, (r+1) E/tp)` whole.
fn moe(want: &mut Tensors, c: &Tensors, i: usize, r: usize, tp: usize, ep: bool) {
    let m = |n: &str| layer(i, &format!("block_sparse_moe.{n}"));
    for n in ["gate.weight", "e_score_correction_bias"] {
        want.insert(m(n), c[&m(n)].to_f32());
    }
    let (experts, a, b) = if ep {
        (r * E / tp..(r + 1) * E / tp, 0, I)
    } else {
        (0..E, r * I / tp, (r + 1) * I / tp)
    };
    let (mut w13, mut w2) = (vec![], vec![]);
    for e in experts.clone() {
        let w = |k: u8| &c[&m(&format!("experts.{e}.w{k}.weight"))];
        w13.extend([w(1).rows(a, b), w(3).rows(a, b)].concat());
        w2.extend(w(2).cols(a, b));
    }
    let n = experts.len();
    let routed = |x: &str| m(&format!("experts.routed_experts.{x}"));
    want.insert(routed("w13_weight"), bf16(&[n, 2 * (b - a), H], w13));
    want.insert(routed("w2_weight"), bf16(&[n, H, b - a], w2));
}

/// Every tensor rank `r` of `tp` must hold (with `ep`: expert parallelism), rebuilt from the
/// checkpoint `c` by the rules alone.
fn want_rank(c: &Tensors, r: usize, tp: usize, ep: bool) -> Tensors {
    let mut want = Tensors::new();
    for n in ["model.embed_tokens.weight", "lm_head.weight"] {
        want.insert(n.into(), vocab_rows(&c[n], r, tp));
    }
    want.insert("model.norm.weight".into(), c["model.norm.weight"].clone());
    for i in 0..2 {
        attention(&mut want, c, i, r, tp);
        moe(&mut want, c, i, r, tp, ep);
    }
    want
}

fn checkpoint() -> Tensors {
    checkpoint_tensors(&fixture(CASE))
}

/// `wload shard` of the fixture with `flags` into `dir/name`.
fn sharded(dir: &TempDir, name: &str, tp: u64, flags: &[&str]) -> std::path::PathBuf {
    let out = dir.path().join(name);
    shard_ok(&fixture(CASE), tp, &out, &[&["-q"], flags].concat());
    out
}

/// The rules rebuild real vLLM's TP 2 ranks exactly: what the tests below check wload against
/// at other sizes is vLLM's behaviour, not a guess.
#[test]
fn the_rules_rebuild_vllms_tp2_ranks() {
    let c = checkpoint();
    for r in 0..2 {
        assert_matches_vllm_rank(&want_rank(&c, r, 2, false), CASE, 2, r as u64);
    }
}

/// TP 1 (everything whole but the padded vocab) and TP 4 (2 KV heads over 4 ranks: rank r holds
/// KV head r / 2, and k_norm `[hd]` is that head's slice): every tensor by the rules.
#[test]
fn tp1_and_tp4_follow_vllms_rules() {
    let c = checkpoint();
    let tmp = TempDir::new().unwrap();
    for tp in [1usize, 4] {
        let dir = sharded(&tmp, &format!("tp{tp}"), tp as u64, &[]);
        for r in 0..tp {
            let got = rank_tensors(&dir, r as u64);
            let ctx = format!("tp{tp} rank {r}");
            assert_same_tensors(&got, &want_rank(&c, r, tp, false), &ctx);
        }
    }
    let dir = tmp.path().join("tp4");
    let k_norm = layer(0, "self_attn.k_norm.weight");
    let whole = &c[&k_norm];
    for r in 0..4 {
        let got = &rank_tensors(&dir, r as u64)[&k_norm];
        assert_eq!(got.shape, [HD as u64], "tp4 rank {r}: one head's norm");
        let head = r / 2;
        assert_eq!(
            got.data,
            whole.rows(head * HD, (head + 1) * HD),
            "tp4 rank {r}"
        );
    }
}

/// `--enable-expert-parallel` at TP 2: rank 0 holds experts 0 and 1 whole, rank 1 experts 2 and
/// 3; the router, the bias, attention and everything else are TP 2's. At TP 4, one expert a
/// rank.
#[test]
fn expert_parallel_places_whole_experts_and_keeps_the_rest_as_tp2() {
    let c = checkpoint();
    let tmp = TempDir::new().unwrap();
    let ep = sharded(&tmp, "ep", 2, &["--enable-expert-parallel"]);
    let tp = sharded(&tmp, "tp", 2, &[]);
    let experts = |got: &Tensors, ctx: &str| {
        let w2 = &got[&layer(1, "block_sparse_moe.experts.routed_experts.w2_weight")];
        assert_eq!(w2.shape, [2, H as u64, I as u64], "{ctx}");
    };
    assert_expert_parallel((&ep, &tp), 2, |r| want_rank(&c, r, 2, true), experts);
    // At TP 4 each rank holds one expert whole.
    let ep4 = sharded(&tmp, "ep4", 4, &["--enable-expert-parallel"]);
    for r in 0..4 {
        let got = rank_tensors(&ep4, r as u64);
        assert_same_tensors(&got, &want_rank(&c, r, 4, true), &format!("ep4 rank {r}"));
    }
}

/// `--pp 2` (with TP 2): stage 0 holds the embedding and layer 0, stage 1 layer 1, the final
/// norm and lm_head (minimax_m2.py's PPMissingLayers); each tensor as at TP 2.
#[test]
fn pipeline_stages_hold_embedding_first_and_head_last() {
    let c = checkpoint();
    let tmp = TempDir::new().unwrap();
    let dir = sharded(&tmp, "pp", 2, &["--pp", "2"]);
    assert_two_stages(&dir, "model.layers.", |t| want_rank(&c, t, 2, false));
    let first = stage_tensors(&dir, 0, 1);
    assert!(first.contains_key("model.embed_tokens.weight"));
    assert!(!first.contains_key("lm_head.weight"));
    assert!(stage_tensors(&dir, 1, 0).contains_key("lm_head.weight"));
}

/// vLLM refuses a TP larger than the expert count (minimax_m2.py:79–83), expert parallel or not:
/// TP 8 with 4 experts is refused (exit 3) with the fix, nothing is written; `sizes` accepts TP
/// 1, 2, 4 and names the reason for 8, and for 3 the head count.
#[test]
fn more_ranks_than_experts_is_refused() {
    let src = fixture(CASE);
    let msg = "Tensor parallel size 8 is greater than the number of experts 4.";
    let fix = "choose a --tp of at most 4";
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("tp8");
    assert_refusal_text(&shard(&src, 8, &out, &[]), 3, &[msg, fix]);
    assert!(!out.exists(), "nothing written");
    let ep = run(&["plan", s(&src), "--tp", "8", "--enable-expert-parallel"]);
    assert_refusal_text(&ep, 3, &[msg, fix]);
    let sizes = wload_json(&["sizes", s(&src), "--max-tp", "8", "--json"]);
    assert_eq!(
        sizes["accepted_tp"],
        serde_json::json!([1, 2, 4]),
        "{sizes:#}"
    );
    let ep_tps = &sizes["accepted_tp_expert_parallel"];
    assert_eq!(ep_tps, &serde_json::json!([2, 4]), "{sizes:#}");
    let reason = |tp: u64, ep: bool| {
        let row = sizes["checked"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["tp"] == tp && c["pp"] == 1 && c["expert_parallel"] == ep)
            .unwrap_or_else(|| panic!("tp {tp} ep {ep} checked: {sizes:#}"));
        assert_eq!(row["accepted"], false, "{row}");
        row["reason"].as_str().unwrap().to_string()
    };
    assert!(reason(8, false).starts_with(msg));
    assert!(reason(8, true).starts_with(msg));
    let heads = "num_attention_heads (8) is not divisible by tp (3)";
    assert!(reason(3, false).starts_with(heads));
    assert_refusal_text(&run(&["plan", s(&src), "--tp", "3"]), 3, &[heads]);
}
