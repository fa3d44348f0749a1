//! DeepSeek-V2 / V3 (`DeepseekV2ForCausalLM`, `DeepseekV3ForCausalLM`, mappings/deepseek_v*.yaml)
//! beyond the golden TP2 case (byte-identical to vLLM, run with the other golden cases). Every
//! checkpoint here is derived from the golden fixture deepseek_v3 (8 heads, MLA with q_lora_rank
//! 96 and kv_lora_rank 64, layer 0 dense, layer 1 MoE with 8 routed experts and one shared expert),
//! and every rank is checked against vLLM 0.33's rules (shared/vllm-spec.md §9, read from
//! models/deepseek_v2.py): the key list in state_dict order, dtypes, shapes and the bytes of the
//! checkpoint slices each rank must hold — for the V2-Lite shape without q_lora_rank, a
//! multi-token-prediction layer, block FP8, expert and pipeline parallelism, and the sizes vLLM
//! refuses.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support::*;

const H: usize = 128; // hidden_size
const HEADS: usize = 8;
const NOPE: usize = 32; // qk_nope_head_dim
const ROPE: usize = 16; // qk_rope_head_dim
const V: usize = 32; // v_head_dim
const Q_LORA: usize = 96;
const KV_LORA: usize = 64;
const I: usize = 256; // intermediate_size (the dense layer 0)
const E: usize = 8; // n_routed_experts
const MI: usize = 64; // moe_intermediate_size; one shared expert, so also the shared size
const BLOCK: usize = 32; // the block-FP8 tests' weight_block_size

const FIXTURE: &str = "deepseek_v3";

/// The tensors of some safetensors files, in file and header order.
fn read_list(files: &[PathBuf]) -> Vec<(String, Held)> {
    assert!(!files.is_empty(), "no safetensors files to read");
    let mut out = Vec::new();
    for f in files {
        let raw = RawFile::read(f);
        for t in header_tensors(f) {
            let held = Held {
                dtype: t.dtype,
                shape: t.shape,
                data: raw.data[t.start as usize..t.end as usize].to_vec(),
            };
            out.push((t.name, held));
        }
    }
    out
}

/// The files of one rank (`prefix`: `model-rank-{r}-part-` or `model-pp-{p}-tp-{t}-part-`) of
/// an output folder, in header order.
fn output(dir: &Path, prefix: &str) -> Vec<(String, Held)> {
    read_list(&files_with_prefix(dir, prefix))
}

fn by_name(list: Vec<(String, Held)>) -> Tensors {
    let n = list.len();
    let map: Tensors = list.into_iter().collect();
    assert_eq!(map.len(), n, "a key twice");
    map
}

fn names(list: &[(String, Held)]) -> Vec<&str> {
    list.iter().map(|(n, _)| n.as_str()).collect()
}

/// The golden fixture's tensors (six files).
fn fixture_tensors() -> Tensors {
    checkpoint_tensors(&fixture(FIXTURE))
}

fn fixture_config() -> Value {
    serde_json::from_slice(&fs::read(fixture(FIXTURE).join("config.json")).unwrap()).unwrap()
}

fn bf16(t: u64, shape: &[usize]) -> Held {
    Held {
        dtype: "BF16".into(),
        shape: shape.iter().map(|&d| d as u64).collect(),
        data: bf16_data(t, shape.iter().product()),
    }
}

fn f32_one() -> Vec<u8> {
    1f32.to_le_bytes().to_vec()
}

/// `model.layers.{i}.{n}`.
fn l(i: usize, n: &str) -> String {
    format!("model.layers.{i}.{n}")
}

/// What one rank of one configuration holds, in vLLM's state_dict order (models/deepseek_v2.py,
/// vLLM 0.33): the model registers `embed_tokens`, the layers, `norm`, then `lm_head`; a layer
/// `self_attn`, `mlp`, `input_layernorm`, `post_attention_layernorm`; DeepseekV2MLAAttention
/// (:1051–1110) `fused_qkv_a_proj`, `q_a_layernorm`, `q_b_proj` with q_lora_rank, else
/// `kv_a_proj_with_mqa`, `q_proj`; then `kv_a_layernorm`, `kv_b_proj`, `o_proj`, and MLAAttention's
/// four F32 scale buffers; DeepseekV2MoE (:320–395) the router (and its noaux_tc correction bias),
/// the shared experts, the routed experts. Names are the ones the sharded state keeps (§9
/// "Storage-shared modules"); a block-FP8 linear adds `weight_scale_inv` after its weight, the
/// fused MoE both scales after both weights.
#[derive(Clone, Copy)]
struct Layout {
    q_lora: bool,
    noaux: bool,
    fp8: bool,
}

impl Layout {
    const V3: Layout = Layout {
        q_lora: true,
        noaux: true,
        fp8: false,
    };

    fn layer_keys(self, i: usize) -> Vec<String> {
        let mut keys: Vec<&str> = Vec::new();
        let linear = |keys: &mut Vec<&str>, weight: &'static str, scale: &'static str| {
            keys.push(weight);
            if self.fp8 {
                keys.push(scale);
            }
        };
        if self.q_lora {
            linear(
                &mut keys,
                "self_attn.fused_qkv_a_proj.weight",
                "self_attn.fused_qkv_a_proj.weight_scale_inv",
            );
            keys.push("self_attn.mla_attn.q_a_layernorm.weight");
            linear(
                &mut keys,
                "self_attn.mla_attn.q_b_proj.weight",
                "self_attn.mla_attn.q_b_proj.weight_scale_inv",
            );
        } else {
            linear(
                &mut keys,
                "self_attn.kv_a_proj_with_mqa.weight",
                "self_attn.kv_a_proj_with_mqa.weight_scale_inv",
            );
            linear(
                &mut keys,
                "self_attn.mla_attn.q_proj.weight",
                "self_attn.mla_attn.q_proj.weight_scale_inv",
            );
        }
        keys.push("self_attn.kv_a_layernorm.weight");
        linear(
            &mut keys,
            "self_attn.kv_b_proj.weight",
            "self_attn.kv_b_proj.weight_scale_inv",
        );
        linear(
            &mut keys,
            "self_attn.mla_attn.o_proj.weight",
            "self_attn.mla_attn.o_proj.weight_scale_inv",
        );
        keys.extend([
            "self_attn.mla_attn.mla_attn._k_scale",
            "self_attn.mla_attn.mla_attn._v_scale",
            "self_attn.mla_attn.mla_attn._q_scale",
            "self_attn.mla_attn.mla_attn._prob_scale",
        ]);
        if i == 0 {
            linear(
                &mut keys,
                "mlp.gate_up_proj.weight",
                "mlp.gate_up_proj.weight_scale_inv",
            );
            linear(
                &mut keys,
                "mlp.down_proj.weight",
                "mlp.down_proj.weight_scale_inv",
            );
        } else {
            keys.push("mlp.experts.gate.weight");
            if self.noaux {
                keys.push("mlp.experts.gate.e_score_correction_bias");
            }
            linear(
                &mut keys,
                "mlp.experts._shared_experts._layer.gate_up_proj.weight",
                "mlp.experts._shared_experts._layer.gate_up_proj.weight_scale_inv",
            );
            linear(
                &mut keys,
                "mlp.experts._shared_experts._layer.down_proj.weight",
                "mlp.experts._shared_experts._layer.down_proj.weight_scale_inv",
            );
            keys.extend([
                "mlp.experts.routed_experts.w13_weight",
                "mlp.experts.routed_experts.w2_weight",
            ]);
            if self.fp8 {
                keys.extend([
                    "mlp.experts.routed_experts.w13_weight_scale_inv",
                    "mlp.experts.routed_experts.w2_weight_scale_inv",
                ]);
            }
        }
        keys.extend(["input_layernorm.weight", "post_attention_layernorm.weight"]);
        keys.iter().map(|n| l(i, n)).collect()
    }

    /// Every key of a TP-only rank (both layers, embedding, norm, lm_head).
    fn keys(self) -> Vec<String> {
        let mut keys = vec!["model.embed_tokens.weight".to_string()];
        keys.extend(self.layer_keys(0));
        keys.extend(self.layer_keys(1));
        keys.extend(["model.norm.weight".into(), "lm_head.weight".into()]);
        keys
    }
}

/// The plan's tensor names for (global) rank `r`, in its order.
fn plan_keys(plan: &Value, r: usize) -> Vec<String> {
    plan["ranks"][r]["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect()
}

/// Asserts that every key of `got` that `pick` selects is byte-identical (dtype, shape, data) to
/// the same key of vLLM's TP2 output of the fixture, rank `r`; returns how many were compared.
fn assert_as_golden(got: &Tensors, r: usize, pick: impl Fn(&str) -> bool, ctx: &str) -> usize {
    let want = rank_tensors(&expected(FIXTURE, 2), r as u64);
    let mut n = 0;
    for (name, t) in got.iter().filter(|(n, _)| pick(n)) {
        let w = want
            .get(name)
            .unwrap_or_else(|| panic!("{ctx}: vLLM's TP2 output has no '{name}'"));
        assert!(t == w, "{ctx}: '{name}' differs from vLLM's TP2 output");
        n += 1;
    }
    n
}

/// The routed experts of layer 1 on one rank, from the checkpoint: experts `experts`, each
/// `[gate rows ; up rows]` for w13 and the matching down_proj columns for w2, with `from..to` the
/// intermediate rows this rank holds (the whole 0..MI under expert parallelism).
fn routed(
    ck: &Tensors,
    experts: std::ops::Range<usize>,
    from: usize,
    to: usize,
) -> (Vec<u8>, Vec<u8>) {
    let c = |e: usize, n: &str| &ck[&l(1, &format!("mlp.experts.{e}.{n}.weight"))];
    let mut w13 = Vec::new();
    let mut w2 = Vec::new();
    for e in experts {
        w13.extend_from_slice(c(e, "gate_proj").rows(from, to));
        w13.extend_from_slice(c(e, "up_proj").rows(from, to));
        w2.extend(c(e, "down_proj").cols(from, to));
    }
    (w13, w2)
}

// --- 1. DeepSeek-V2-Lite: no q_lora_rank, greedy routing ---------------------------------------

/// The fixture reshaped as DeepSeek-V2-Lite ships: `q_lora_rank: null` (a plain q_proj instead of
/// q_a_proj / q_a_layernorm / q_b_proj), topk_method greedy (no correction bias).
fn v2_lite_parts() -> (Value, Tensors) {
    let mut ck = fixture_tensors();
    for i in 0..2 {
        for n in [
            "self_attn.q_a_proj.weight",
            "self_attn.q_a_layernorm.weight",
            "self_attn.q_b_proj.weight",
        ] {
            ck.remove(&l(i, n)).expect("the fixture has q_lora tensors");
        }
        let q = bf16(100 + i as u64, &[HEADS * (NOPE + ROPE), H]);
        ck.insert(l(i, "self_attn.q_proj.weight"), q);
    }
    ck.remove(&l(1, "mlp.gate.e_score_correction_bias"))
        .expect("the fixture has a correction bias");
    let mut cfg = fixture_config();
    cfg["architectures"] = json!(["DeepseekV2ForCausalLM"]);
    cfg["model_type"] = json!("deepseek_v2");
    cfg["q_lora_rank"] = Value::Null;
    cfg["topk_method"] = json!("greedy");
    cfg["scoring_func"] = json!("softmax");
    cfg["num_nextn_predict_layers"] = json!(0);
    (cfg, ck)
}

fn v2_lite() -> (TempDir, Tensors) {
    let (cfg, ck) = v2_lite_parts();
    (write_checkpoint(&cfg, &ck), ck)
}

#[test]
fn v2_lite_without_q_lora_holds_vllms_keys_and_slices_at_tp2() {
    let (src, ck) = v2_lite();
    let layout = Layout {
        q_lora: false,
        noaux: false,
        fp8: false,
    };
    let plan = clean_plan_json(src.path(), &["--tp", "2"]);
    assert_eq!(plan["family"], "deepseek_v2");
    assert_eq!(plan["architecture"], "DeepseekV2ForCausalLM");
    let tmp = TempDir::new().unwrap();
    shard_ok(src.path(), 2, tmp.path(), &["-q"]);
    let (q_r, kvb_r, o_r) = (
        HEADS * (NOPE + ROPE) / 2,
        HEADS * (NOPE + V) / 2,
        HEADS * V / 2,
    );
    for r in 0..2 {
        let ctx = format!("v2-lite tp2 rank {r}");
        assert_eq!(
            plan_keys(&plan, r),
            layout.keys(),
            "{ctx}: keys in vLLM's order"
        );
        let got = rank_tensors(tmp.path(), r as u64);
        let mut sorted = layout.keys();
        sorted.sort();
        assert_eq!(
            got.keys().cloned().collect::<Vec<_>>(),
            sorted,
            "{ctx}: keys on disk"
        );
        for i in 0..2 {
            let c = |n: &str| &ck[&l(i, n)];
            // kv_a_proj_with_mqa is a ReplicatedLinear of its own, not fused: whole.
            let kv_a = &c("self_attn.kv_a_proj_with_mqa.weight").data;
            let name = l(i, "self_attn.kv_a_proj_with_mqa.weight");
            assert_tensor(&got, &name, "BF16", &[KV_LORA + ROPE, H], kv_a, &ctx);
            // q_proj: contiguous head blocks, rank r heads [4r, 4r + 4).
            let q = c("self_attn.q_proj.weight").rows(r * q_r, (r + 1) * q_r);
            let name = l(i, "self_attn.mla_attn.q_proj.weight");
            assert_tensor(&got, &name, "BF16", &[q_r, H], q, &ctx);
            let kvb = c("self_attn.kv_b_proj.weight").rows(r * kvb_r, (r + 1) * kvb_r);
            let name = l(i, "self_attn.kv_b_proj.weight");
            assert_tensor(&got, &name, "BF16", &[kvb_r, KV_LORA], kvb, &ctx);
            let o = c("self_attn.o_proj.weight").cols(r * o_r, (r + 1) * o_r);
            let name = l(i, "self_attn.mla_attn.o_proj.weight");
            assert_tensor(&got, &name, "BF16", &[H, o_r], &o, &ctx);
            for b in ["_k_scale", "_v_scale", "_q_scale", "_prob_scale"] {
                let name = l(i, &format!("self_attn.mla_attn.mla_attn.{b}"));
                assert_tensor(&got, &name, "F32", &[], &f32_one(), &ctx);
            }
        }
        // The router: BF16, whole, under the name the sharded state keeps.
        let router = &ck[&l(1, "mlp.gate.weight")].data;
        let name = l(1, "mlp.experts.gate.weight");
        assert_tensor(&got, &name, "BF16", &[E, H], router, &ctx);
        // Everything the q_lora change does not touch — embedding and lm_head (vocab padded),
        // norms, kv_a_layernorm, kv_b_proj, o_proj, the dense MLP, shared and routed experts —
        // is what vLLM wrote for the V3 fixture.
        let untouched = |n: &str| !n.contains(".q_proj.") && !n.contains(".kv_a_proj_with_mqa.");
        let compared = assert_as_golden(&got, r, untouched, &ctx);
        assert_eq!(compared, layout.keys().len() - 4, "{ctx}: compared to vLLM");
    }
    // Rank 1's routed experts, from the checkpoint: intermediate rows [32, 64) of every expert.
    let got = rank_tensors(tmp.path(), 1);
    let (w13, w2) = routed(&ck, 0..E, MI / 2, MI);
    let p = l(1, "mlp.experts.routed_experts");
    let ctx = "v2-lite tp2 rank 1";
    assert_tensor(
        &got,
        &format!("{p}.w13_weight"),
        "BF16",
        &[E, MI, H],
        &w13,
        ctx,
    );
    assert_tensor(
        &got,
        &format!("{p}.w2_weight"),
        "BF16",
        &[E, H, MI / 2],
        &w2,
        ctx,
    );
}

// --- 2. The multi-token-prediction layer -------------------------------------------------------

/// The fixture with the MTP layer DeepSeek-V3 ships at index num_hidden_layers (2 here): a full
/// MoE decoder layer plus its own embedding, eh_proj, enorm, hnorm and shared head.
fn with_mtp_layer(nextn: u64) -> (TempDir, Vec<String>) {
    let mut ck = fixture_tensors();
    let layer1: Vec<(String, Held)> = ck
        .iter()
        .filter(|(n, _)| n.starts_with("model.layers.1."))
        .map(|(n, t)| {
            (
                n.replacen("model.layers.1.", "model.layers.2.", 1),
                t.clone(),
            )
        })
        .collect();
    ck.extend(layer1);
    for (t, (n, shape)) in [
        ("eh_proj.weight", vec![H, 2 * H]),
        ("enorm.weight", vec![H]),
        ("hnorm.weight", vec![H]),
        ("shared_head.norm.weight", vec![H]),
        ("shared_head.head.weight", vec![1000, H]),
        ("embed_tokens.weight", vec![1000, H]),
    ]
    .into_iter()
    .enumerate()
    {
        ck.insert(l(2, n), bf16(200 + t as u64, &shape));
    }
    let mut cfg = fixture_config();
    cfg["num_nextn_predict_layers"] = json!(nextn);
    let mtp = ck
        .keys()
        .filter(|n| n.starts_with("model.layers.2."))
        .cloned()
        .collect();
    (write_checkpoint(&cfg, &ck), mtp)
}

#[test]
fn the_mtp_layer_is_skipped_and_the_rest_is_vllms() {
    let (src, mtp) = with_mtp_layer(1);
    assert_eq!(
        mtp.len(),
        44,
        "a full MoE layer (38 tensors) plus 6 MTP-only ones"
    );
    let plan = clean_plan_json(src.path(), &["--tp", "2"]);
    let skipped = skipped_tensors(&plan, "MTP");
    assert_eq!(skipped, mtp);
    let sources = plan["sources"].as_array().unwrap();
    assert!(
        sources
            .iter()
            .all(|t| !t["name"].as_str().unwrap().starts_with("model.layers.2.")),
        "no piece reads the MTP layer"
    );
    // Every rank is exactly vLLM's TP2 output of the fixture without the MTP layer, in order.
    let tmp = TempDir::new().unwrap();
    shard_ok(src.path(), 2, tmp.path(), &["-q"]);
    for r in 0..2 {
        let prefix = format!("model-rank-{r}-part-");
        let got = output(tmp.path(), &prefix);
        let want = output(&expected(FIXTURE, 2), &prefix);
        assert_eq!(names(&got), names(&want), "rank {r}: keys or their order");
        assert!(
            got == want,
            "rank {r}: tensors differ from vLLM's TP2 output"
        );
    }
}

#[test]
fn layer_2_tensors_without_nextn_layers_are_refused() {
    let (src, _) = with_mtp_layer(0);
    let o = run(&["plan", s(src.path()), "--tp", "2"]);
    assert_refusal_text(
        &o,
        3,
        &["model.layers.2.eh_proj.weight", "matches no parameter"],
    );
}

// --- 3. DeepSeek-V3 block FP8 ------------------------------------------------------------------

/// A decoder projection a block-FP8 DeepSeek-V3 release quantizes: every 2-D linear of the
/// layers (the router `mlp.gate` is no `_proj` and stays unquantized).
fn is_projection(name: &str) -> bool {
    name.starts_with("model.layers.")
        && (name.ends_with("_proj.weight") || name.ends_with(".kv_a_proj_with_mqa.weight"))
}

/// `n` distinct F32 scale values for tensor number `t` (exact integers below 2^24).
fn scale_data(t: usize, n: usize) -> Vec<u8> {
    (0..n)
        .flat_map(|k| ((t * 4096 + k + 1) as f32).to_le_bytes())
        .collect()
}

/// `cfg` and `ck` made a block-FP8 (32×32) release: every projection but the ones `keep` names
/// F8_E4M3 (bytes from a hash, never E4M3's NaN pattern) with an F32 `weight_scale_inv`
/// `[ceil(out/32), ceil(in/32)]` of distinct values; the config says so.
fn quantize(cfg: &mut Value, ck: &mut Tensors, keep: impl Fn(&str) -> bool) {
    let projections: Vec<String> = ck
        .keys()
        .filter(|n| is_projection(n) && !keep(n))
        .cloned()
        .collect();
    for (t, name) in projections.into_iter().enumerate() {
        let w = ck.get_mut(&name).unwrap();
        let n = w.shape.iter().product::<u64>();
        w.data = (0..n)
            .map(|k| mix((t as u64) << 32 | k) as u8 & 0xF7)
            .collect();
        w.dtype = "F8_E4M3".into();
        let b = BLOCK as u64;
        let blocks = vec![w.shape[0].div_ceil(b), w.shape[1].div_ceil(b)];
        let scale = Held {
            dtype: "F32".into(),
            data: scale_data(t, blocks.iter().product::<u64>() as usize),
            shape: blocks,
        };
        ck.insert(format!("{name}_scale_inv"), scale);
    }
    cfg["quantization_config"] = json!({
        "quant_method": "fp8",
        "activation_scheme": "dynamic",
        "fmt": "e4m3",
        "weight_block_size": [BLOCK, BLOCK]
    });
}

/// The fixture as a block-FP8 release ships it ([`quantize`]).
fn block_fp8(keep: impl Fn(&str) -> bool) -> (TempDir, Tensors) {
    let (mut cfg, mut ck) = (fixture_config(), fixture_tensors());
    quantize(&mut cfg, &mut ck, keep);
    (write_checkpoint(&cfg, &ck), ck)
}

/// What rank `r` of TP2 holds of the block-FP8 tensors of layer `i`, from the checkpoint `ck`:
/// (name, dtype, shape, bytes), weights and scales cut by whole 32-row / 32-column blocks.
fn fp8_expected(
    ck: &Tensors,
    i: usize,
    r: usize,
) -> Vec<(String, &'static str, Vec<usize>, Vec<u8>)> {
    let c = |n: &str| &ck[&l(i, n)];
    let w = |n: &str| c(&format!("{n}.weight"));
    let sc = |n: &str| c(&format!("{n}.weight_scale_inv"));
    // Column-parallel: rows [r·out/2, (r+1)·out/2) of the weight, the matching scale rows.
    let column = |n: &str| {
        let (out, blocks) = (w(n).shape[0] as usize, sc(n).shape[0] as usize);
        let weight = w(n).rows(r * out / 2, (r + 1) * out / 2).to_vec();
        let scale = sc(n).rows(r * blocks / 2, (r + 1) * blocks / 2).to_vec();
        (weight, scale)
    };
    // Row-parallel: the input columns and the matching scale columns.
    let row = |n: &str| {
        let (inp, blocks) = (w(n).shape[1] as usize, sc(n).shape[1] as usize);
        let weight = w(n).cols(r * inp / 2, (r + 1) * inp / 2);
        let scale = sc(n).cols(r * blocks / 2, (r + 1) * blocks / 2);
        (weight, scale)
    };
    let merged = |gate: &str, up: &str| {
        let ((gw, gs), (uw, us)) = (column(gate), column(up));
        ([gw, uw].concat(), [gs, us].concat())
    };
    let mut out = Vec::new();
    let mut push = |name: &str, shape: Vec<usize>, (weight, scale): (Vec<u8>, Vec<u8>)| {
        let blocks = vec![shape[0].div_ceil(BLOCK), shape[1].div_ceil(BLOCK)];
        out.push((l(i, &format!("{name}.weight")), "F8_E4M3", shape, weight));
        out.push((
            l(i, &format!("{name}.weight_scale_inv")),
            "F32",
            blocks,
            scale,
        ));
    };
    // fused_qkv_a_proj: [q_a ; kv_a] rows and [q_a blocks (3) ; kv_a blocks (3)], not split.
    // kv_a's 80 rows end in a partial block; its blocks end where the ceil(176/32) = 6-row
    // parameter does only because q_lora_rank is a whole number of blocks (see the q_lora_rank
    // 80 test below).
    let fused = (
        [
            &w("self_attn.q_a_proj").data[..],
            &w("self_attn.kv_a_proj_with_mqa").data,
        ]
        .concat(),
        [
            &sc("self_attn.q_a_proj").data[..],
            &sc("self_attn.kv_a_proj_with_mqa").data,
        ]
        .concat(),
    );
    push(
        "self_attn.fused_qkv_a_proj",
        vec![Q_LORA + KV_LORA + ROPE, H],
        fused,
    );
    let q_b = column("self_attn.q_b_proj");
    push(
        "self_attn.mla_attn.q_b_proj",
        vec![HEADS * (NOPE + ROPE) / 2, Q_LORA],
        q_b,
    );
    let kv_b = column("self_attn.kv_b_proj");
    push(
        "self_attn.kv_b_proj",
        vec![HEADS * (NOPE + V) / 2, KV_LORA],
        kv_b,
    );
    let o = row("self_attn.o_proj");
    push("self_attn.mla_attn.o_proj", vec![H, HEADS * V / 2], o);
    if i == 0 {
        let gate_up = merged("mlp.gate_proj", "mlp.up_proj");
        push("mlp.gate_up_proj", vec![I, H], gate_up);
        push("mlp.down_proj", vec![H, I / 2], row("mlp.down_proj"));
        return out;
    }
    let shared = merged("mlp.shared_experts.gate_proj", "mlp.shared_experts.up_proj");
    let s = "mlp.experts._shared_experts._layer";
    push(&format!("{s}.gate_up_proj"), vec![MI, H], shared);
    let down = row("mlp.shared_experts.down_proj");
    push(&format!("{s}.down_proj"), vec![H, MI / 2], down);
    // Routed experts: per expert [gate_r ; up_r] rows and scale rows, down_proj columns.
    let (mut w13, mut w13s, mut w2, mut w2s) = (vec![], vec![], vec![], vec![]);
    for e in 0..E {
        let ex = |p: &str| format!("mlp.experts.{e}.{p}");
        let (weight, scale) = merged(&ex("gate_proj"), &ex("up_proj"));
        w13.extend(weight);
        w13s.extend(scale);
        let (weight, scale) = row(&ex("down_proj"));
        w2.extend(weight);
        w2s.extend(scale);
    }
    let p = |n: &str| l(i, &format!("mlp.experts.routed_experts.{n}"));
    let (ib, hb) = (MI / 2 / BLOCK, H / BLOCK);
    out.push((p("w13_weight"), "F8_E4M3", vec![E, MI, H], w13));
    out.push((p("w2_weight"), "F8_E4M3", vec![E, H, MI / 2], w2));
    out.push((p("w13_weight_scale_inv"), "F32", vec![E, 2 * ib, hb], w13s));
    out.push((p("w2_weight_scale_inv"), "F32", vec![E, hb, ib], w2s));
    out
}

#[test]
fn block_fp8_v3_holds_vllms_scales_at_tp2() {
    let (src, ck) = block_fp8(|_| false);
    let layout = Layout {
        fp8: true,
        ..Layout::V3
    };
    let plan = clean_plan_json(src.path(), &["--tp", "2"]);
    let tmp = TempDir::new().unwrap();
    shard_ok(src.path(), 2, tmp.path(), &["-q"]);
    for r in 0..2 {
        let ctx = format!("block fp8 tp2 rank {r}");
        // No `attn.{q,k,v,prob}_scale` parameters: MLA gets no FP8 kv-cache method.
        assert_eq!(
            plan_keys(&plan, r),
            layout.keys(),
            "{ctx}: keys in vLLM's order"
        );
        let got = rank_tensors(tmp.path(), r as u64);
        assert_eq!(got.len(), layout.keys().len(), "{ctx}: keys on disk");
        let mut quantized = 0;
        for i in 0..2 {
            for (name, dtype, shape, bytes) in fp8_expected(&ck, i, r) {
                assert_tensor(&got, &name, dtype, &shape, &bytes, &ctx);
                quantized += 1;
            }
        }
        assert_eq!(quantized, 12 + 16, "{ctx}: FP8 tensors checked");
        // The fused scale, by value: q_a's three block rows, then kv_a's three, on both ranks.
        let fused = &got[&l(1, "self_attn.fused_qkv_a_proj.weight_scale_inv")];
        assert_eq!(fused.shape, [6, 4], "{ctx}");
        let q_a = &ck[&l(1, "self_attn.q_a_proj.weight_scale_inv")];
        let kv_a = &ck[&l(1, "self_attn.kv_a_proj_with_mqa.weight_scale_inv")];
        assert_eq!(
            (q_a.shape.as_slice(), kv_a.shape.as_slice()),
            ([3, 4].as_slice(), [3, 4].as_slice())
        );
        assert_eq!(
            fused.data[..48],
            q_a.data[..],
            "{ctx}: fused scale rows 0–2"
        );
        assert_eq!(
            fused.data[48..],
            kv_a.data[..],
            "{ctx}: fused scale rows 3–5"
        );
        // Unquantized: the router BF16, its bias F32, norms, embedding, lm_head — vLLM's bytes.
        let plain = |n: &str| !got[n].dtype.starts_with("F8") && !n.ends_with("_scale_inv");
        let compared = assert_as_golden(&got, r, plain, &ctx);
        assert_eq!(compared, layout.keys().len() - quantized, "{ctx}");
        assert_eq!(
            got[&l(1, "mlp.experts.gate.weight")].dtype,
            "BF16",
            "{ctx}: router"
        );
        let bias = &got[&l(1, "mlp.experts.gate.e_score_correction_bias")];
        assert_eq!(bias.dtype, "F32", "{ctx}: correction bias");
    }
}

/// A first version of the block-FP8 fixture left kv_a_proj_with_mqa BF16 while q_a_proj was FP8:
/// vLLM loads that silently into the one FP8 fused parameter (§9, caveat) — wrong values, no
/// error. wload refuses it, naming the tensor.
#[test]
fn block_fp8_with_a_bf16_kv_a_proj_is_refused() {
    let (src, _) = block_fp8(|n| n.ends_with(".kv_a_proj_with_mqa.weight"));
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    let o = shard(src.path(), 2, &out, &[]);
    assert_refusal_text(&o, 3, &["kv_a_proj_with_mqa"]);
    assert!(!out.exists(), "nothing written");
}

/// An FP8 release that leaves layer 1's o_proj and shared experts in BF16 lists them as vLLM
/// builds them (`self_attn.o_proj`, `mlp.shared_experts.*`: the quant config is asked with the
/// module's prefix), not as the sharded state keeps them (`self_attn.mla_attn.o_proj`,
/// `mlp.experts._shared_experts._layer.*`): they stay BF16, without scales, vLLM's bytes.
#[test]
fn block_fp8_ignored_layers_name_the_modules_as_vllm_builds_them() {
    let kept = |n: &str| {
        n.starts_with(&l(1, "self_attn.o_proj.")) || n.starts_with(&l(1, "mlp.shared_experts."))
    };
    let (mut cfg, mut ck) = (fixture_config(), fixture_tensors());
    quantize(&mut cfg, &mut ck, kept);
    cfg["quantization_config"]["ignored_layers"] = json!([
        l(1, "self_attn.o_proj"),
        l(1, "mlp.shared_experts.gate_proj"),
        l(1, "mlp.shared_experts.up_proj"),
        l(1, "mlp.shared_experts.down_proj"),
    ]);
    let src = write_checkpoint(&cfg, &ck);
    let tmp = TempDir::new().unwrap();
    shard_ok(src.path(), 2, tmp.path(), &["-q"]);
    let s = "mlp.experts._shared_experts._layer";
    let bf16 = [
        l(1, "self_attn.mla_attn.o_proj.weight"),
        l(1, &format!("{s}.gate_up_proj.weight")),
        l(1, &format!("{s}.down_proj.weight")),
    ];
    for r in 0..2 {
        let ctx = format!("rank {r}");
        let got = rank_tensors(tmp.path(), r as u64);
        for name in &bf16 {
            assert_eq!(got[name].dtype, "BF16", "{ctx}: {name}");
            let scale = format!("{name}_scale_inv");
            assert!(!got.contains_key(&scale), "{ctx}: {scale}");
        }
        let compared = assert_as_golden(&got, r, |n: &str| bf16.iter().any(|b| b == n), &ctx);
        assert_eq!(compared, bf16.len(), "{ctx}");
        let o0 = &got[&l(0, "self_attn.mla_attn.o_proj.weight")];
        assert_eq!(o0.dtype, "F8_E4M3", "{ctx}: layer 0's o_proj is not listed");
    }
}

/// Block FP8 without q_lora_rank (as DeepSeek-V2-Lite FP8 releases ship it): kv_a_proj_with_mqa
/// is a ReplicatedLinear built with the quant config, so it is FP8 with its whole scale on every
/// rank; q_proj is column-parallel, scale rows split with it.
#[test]
fn block_fp8_v2_lite_quantizes_the_replicated_kv_a_proj_whole() {
    let (mut cfg, mut ck) = v2_lite_parts();
    quantize(&mut cfg, &mut ck, |_| false);
    let src = write_checkpoint(&cfg, &ck);
    let layout = Layout {
        q_lora: false,
        noaux: false,
        fp8: true,
    };
    let plan = clean_plan_json(src.path(), &["--tp", "2"]);
    let tmp = TempDir::new().unwrap();
    shard_ok(src.path(), 2, tmp.path(), &["-q"]);
    let q_r = HEADS * (NOPE + ROPE) / 2;
    for r in 0..2 {
        let ctx = format!("v2-lite block fp8 tp2 rank {r}");
        assert_eq!(
            plan_keys(&plan, r),
            layout.keys(),
            "{ctx}: keys in vLLM's order"
        );
        let got = rank_tensors(tmp.path(), r as u64);
        assert_eq!(got.len(), layout.keys().len(), "{ctx}: keys on disk");
        for i in 0..2 {
            let c = |n: &str| &ck[&l(i, n)];
            let kv_a = "self_attn.kv_a_proj_with_mqa.weight";
            let want = &c(kv_a).data;
            assert_tensor(
                &got,
                &l(i, kv_a),
                "F8_E4M3",
                &[KV_LORA + ROPE, H],
                want,
                &ctx,
            );
            // 80 rows: two whole blocks and a partial one.
            let scale = format!("{kv_a}_scale_inv");
            assert_tensor(
                &got,
                &l(i, &scale),
                "F32",
                &[3, H / BLOCK],
                &c(&scale).data,
                &ctx,
            );
            let q = c("self_attn.q_proj.weight").rows(r * q_r, (r + 1) * q_r);
            let name = l(i, "self_attn.mla_attn.q_proj.weight");
            assert_tensor(&got, &name, "F8_E4M3", &[q_r, H], q, &ctx);
            let blocks = q_r / BLOCK;
            let qs = c("self_attn.q_proj.weight_scale_inv").rows(r * blocks, (r + 1) * blocks);
            let name = l(i, "self_attn.mla_attn.q_proj.weight_scale_inv");
            assert_tensor(&got, &name, "F32", &[blocks, H / BLOCK], qs, &ctx);
        }
    }
}

// --- 4. Expert parallel ------------------------------------------------------------------------

#[test]
fn expert_parallel_places_whole_experts_and_keeps_the_rest_as_vllms_tp2() {
    let ck = fixture_tensors();
    let tmp = TempDir::new().unwrap();
    shard_ok(
        &fixture(FIXTURE),
        2,
        tmp.path(),
        &["--enable-expert-parallel", "-q"],
    );
    let p = l(1, "mlp.experts.routed_experts");
    for r in 0..2 {
        let ctx = format!("ep2 rank {r}");
        let prefix = format!("model-rank-{r}-part-");
        let list = output(tmp.path(), &prefix);
        let golden = output(&expected(FIXTURE, 2), &prefix);
        assert_eq!(names(&list), names(&golden), "{ctx}: keys or their order");
        let got = by_name(list);
        let others = |n: &str| !n.starts_with(&format!("{p}.w"));
        let compared = assert_as_golden(&got, r, others, &ctx);
        assert_eq!(compared, Layout::V3.keys().len() - 2, "{ctx}");
        // Linear placement: rank r holds experts [4r, 4r + 4), whole.
        let (w13, w2) = routed(&ck, r * E / 2..(r + 1) * E / 2, 0, MI);
        let name = format!("{p}.w13_weight");
        assert_tensor(&got, &name, "BF16", &[E / 2, 2 * MI, H], &w13, &ctx);
        let name = format!("{p}.w2_weight");
        assert_tensor(&got, &name, "BF16", &[E / 2, H, MI], &w2, &ctx);
    }
}

// --- 5. Pipeline parallel ----------------------------------------------------------------------

#[test]
fn pipeline_stages_follow_the_llama_rule_and_split_the_tp1_output() {
    let tmp = TempDir::new().unwrap();
    let (tp1, pp2) = (tmp.path().join("tp1"), tmp.path().join("pp2"));
    shard_ok(&fixture(FIXTURE), 1, &tp1, &["-q"]);
    shard_ok(&fixture(FIXTURE), 1, &pp2, &["--pp", "2", "-q"]);
    let whole = output(&tp1, "model-rank-0-part-");
    assert_eq!(whole.len(), Layout::V3.keys().len(), "tp1: every key");
    let tops = [
        vec!["model.embed_tokens.weight"],
        vec!["model.norm.weight", "lm_head.weight"],
    ];
    for (p, top) in tops.iter().enumerate() {
        let ctx = format!("pp2 stage {p}");
        let got = output(&pp2, &format!("model-pp-{p}-tp-0-part-"));
        // Stage p: its layer and, as for Llama, the embedding first, norm and lm_head last.
        let want: Vec<(String, Held)> = whole
            .iter()
            .filter(|(n, _)| {
                n.starts_with(&format!("model.layers.{p}.")) || top.contains(&n.as_str())
            })
            .cloned()
            .collect();
        assert_eq!(
            want.len(),
            Layout::V3.layer_keys(p).len() + top.len(),
            "{ctx}"
        );
        assert_eq!(names(&got), names(&want), "{ctx}: keys or their order");
        assert!(got == want, "{ctx}: tensors differ from the TP1 output's");
    }
}

// --- 6. What vLLM refuses ----------------------------------------------------------------------

#[test]
fn a_tp_above_the_head_count_is_refused() {
    let o = run(&["plan", s(&fixture(FIXTURE)), "--tp", "16"]);
    assert_refusal_text(
        &o,
        3,
        &["num_attention_heads (8) is not divisible by tp (16)"],
    );
}

/// At TP 4 the shared experts' down_proj has 64 / 4 = 16 input columns per rank, half a 32-column
/// block: vLLM's `validate_fp8_block_shape` refuses with this exact message.
#[test]
fn block_fp8_with_a_shared_partition_below_the_block_is_refused() {
    let (src, _) = block_fp8(|_| false);
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    let o = shard(src.path(), 4, &out, &[]);
    assert_refusal_text(
        &o,
        3,
        &[
            "model.layers.1.mlp.experts._shared_experts._layer.down_proj.weight_scale_inv",
            "Weight input_size_per_partition = 16 is not divisible by weight quantization block_k = 32.",
        ],
    );
    assert!(!out.exists(), "nothing written");
}

// --- Config fields left out: vLLM reads config.json through transformers' config classes ------

/// The TP2 plan of rank 0 as (name, shape) pairs, for a plan that must succeed.
fn rank0_shapes(src: &Path) -> BTreeMap<String, Vec<u64>> {
    clean_plan_json(src, &["--tp", "2"])["ranks"][0]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            let (name, _, shape) = json_tensor(t);
            (name, shape)
        })
        .collect()
}

/// transformers' DeepseekV3Config (and V2's) default `q_lora_rank` to 1536
/// (configuration_deepseek_v3.py: `q_lora_rank: int | None = 1536`), so vLLM builds
/// fused_qkv_a_proj for a config.json that leaves the field out, and loads a checkpoint with
/// 1536-row q_a_proj.
#[test]
fn a_config_without_q_lora_rank_means_transformers_1536() {
    const Q: usize = 1536;
    let mut ck = fixture_tensors();
    for i in 0..2 {
        let t = 300 + 3 * i as u64;
        ck.insert(l(i, "self_attn.q_a_proj.weight"), bf16(t, &[Q, H]));
        ck.insert(l(i, "self_attn.q_a_layernorm.weight"), bf16(t + 1, &[Q]));
        let q_b = bf16(t + 2, &[HEADS * (NOPE + ROPE), Q]);
        ck.insert(l(i, "self_attn.q_b_proj.weight"), q_b);
    }
    let mut cfg = fixture_config();
    cfg.as_object_mut().unwrap().remove("q_lora_rank");
    let src = write_checkpoint(&cfg, &ck);
    let shapes = rank0_shapes(src.path());
    let fused = Q + KV_LORA + ROPE;
    let key = l(0, "self_attn.fused_qkv_a_proj.weight");
    assert_eq!(shapes.get(&key), Some(&vec![fused as u64, H as u64]));
}

/// transformers' DeepseekV3Config has no `topk_method` field, and vLLM creates the correction
/// bias only when `getattr(config, "topk_method", None) == "noaux_tc"` (deepseek_v2.py:327–332):
/// a config.json without it gets no `e_score_correction_bias` parameter, and vLLM loads a
/// checkpoint without one.
#[test]
fn a_v3_config_without_topk_method_has_no_correction_bias() {
    let mut ck = fixture_tensors();
    ck.remove(&l(1, "mlp.gate.e_score_correction_bias"))
        .unwrap();
    let mut cfg = fixture_config();
    cfg.as_object_mut().unwrap().remove("topk_method");
    let src = write_checkpoint(&cfg, &ck);
    let shapes = rank0_shapes(src.path());
    assert!(!shapes.contains_key(&l(1, "mlp.experts.gate.e_score_correction_bias")));
}

/// transformers' DeepseekV2Config defaults `n_shared_experts` to 2
/// (configuration_deepseek_v2.py: `n_shared_experts: int = 2`): vLLM builds shared experts of
/// moe_intermediate_size × 2 for a config.json that leaves the field out.
#[test]
fn a_v2_config_without_n_shared_experts_means_two() {
    let (mut cfg, mut ck) = v2_lite_parts();
    cfg.as_object_mut().unwrap().remove("n_shared_experts");
    let s = "mlp.shared_experts";
    ck.insert(
        l(1, &format!("{s}.gate_proj.weight")),
        bf16(400, &[2 * MI, H]),
    );
    ck.insert(
        l(1, &format!("{s}.up_proj.weight")),
        bf16(401, &[2 * MI, H]),
    );
    ck.insert(
        l(1, &format!("{s}.down_proj.weight")),
        bf16(402, &[H, 2 * MI]),
    );
    let src = write_checkpoint(&cfg, &ck);
    let shapes = rank0_shapes(src.path());
    let key = l(1, "mlp.experts._shared_experts._layer.gate_up_proj.weight");
    assert_eq!(shapes.get(&key), Some(&vec![2 * MI as u64, H as u64]));
}

/// With q_lora_rank 80 the fused q_a / kv_a projection has 80 + 80 = 160 rows and a scale
/// parameter of ceil(160/32) = 5 block rows (fp8_utils.py `create_fp8_scale_parameter`), yet
/// vLLM's loader puts kv_a's ceil(80/32) = 3 scale rows at block row ceil(80/32) = 3 (linear.py
/// `adjust_block_scale_shard`, then `narrow(0, 3, 3)` of 5 rows): its load fails.
#[test]
fn block_fp8_with_a_q_lora_rank_off_the_block_is_refused() {
    const Q: usize = 80;
    let (mut cfg, mut ck) = (fixture_config(), fixture_tensors());
    for i in 0..2 {
        let t = 500 + 3 * i as u64;
        ck.insert(l(i, "self_attn.q_a_proj.weight"), bf16(t, &[Q, H]));
        ck.insert(l(i, "self_attn.q_a_layernorm.weight"), bf16(t + 1, &[Q]));
        let q_b = bf16(t + 2, &[HEADS * (NOPE + ROPE), Q]);
        ck.insert(l(i, "self_attn.q_b_proj.weight"), q_b);
    }
    cfg["q_lora_rank"] = json!(Q);
    // Unquantized, the same checkpoint is fine.
    let plain = write_checkpoint(&cfg, &ck);
    let shapes = rank0_shapes(plain.path());
    let key = l(0, "self_attn.fused_qkv_a_proj.weight");
    assert_eq!(shapes.get(&key), Some(&vec![160, H as u64]));
    quantize(&mut cfg, &mut ck, |_| false);
    let src = write_checkpoint(&cfg, &ck);
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    let o = shard(src.path(), 2, &out, &[]);
    assert_refusal_text(
        &o,
        3,
        &["model.layers.0.self_attn.fused_qkv_a_proj.weight_scale_inv"],
    );
    assert!(!out.exists(), "nothing written");
}

/// The same for any merged column layer at TP 1: a dense MLP of intermediate_size 80 has a
/// gate_up scale parameter of ceil(160/32) = 5 rows, and vLLM's loader puts up's 3 scale rows at
/// block row 3 (`narrow(0, 3, 3)` of 5): its load fails. (`_maybe_allow_fp8_block_shape_mismatch`
/// lets the merged layer past `validate_fp8_block_shape`, so the failure comes at load time.)
#[test]
fn block_fp8_merged_gate_up_off_the_block_at_tp1_is_refused() {
    let (mut cfg, mut ck) = (fixture_config(), fixture_tensors());
    ck.insert(l(0, "mlp.gate_proj.weight"), bf16(600, &[80, H]));
    ck.insert(l(0, "mlp.up_proj.weight"), bf16(601, &[80, H]));
    ck.insert(l(0, "mlp.down_proj.weight"), bf16(602, &[H, 80]));
    cfg["intermediate_size"] = json!(80);
    quantize(&mut cfg, &mut ck, |_| false);
    let src = write_checkpoint(&cfg, &ck);
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    let o = shard(src.path(), 1, &out, &[]);
    assert_refusal_text(&o, 3, &["model.layers.0.mlp.gate_up_proj.weight_scale_inv"]);
    assert!(!out.exists(), "nothing written");
}
