//! Kimi K2.5 / K2.6 (`KimiK25ForConditionalGeneration`) on the golden fixture `kimi_k25_w4a16`
//! (spec §12.1, §12.4, §12.5): the MoonViT tower held whole on every rank when its 6 heads do not
//! divide TP (vLLM falls back to data parallelism by itself, `vision.py:141–156`), the same state
//! as `--mm-encoder-tp-mode data`; the text model at TP 4 / TP 8 with expert parallelism and over
//! two pipeline stages; vLLM's refusal at TP 4 without expert parallelism, in its words; the tower
//! unquantized under compressed-tensors whatever the ignore list says. The TP 2 outputs with and
//! without the tower are golden cases (`golden::kimi_k25_w4a16*`), byte-identical to vLLM's.

use std::path::{Path, PathBuf};

use serde_json::Value;
use tempfile::TempDir;

use crate::support::*;

const CASE: &str = "kimi_k25_w4a16";
/// The routed experts' layer.
const MOE: &str = "language_model.model.layers.1.mlp.experts";
/// vLLM's refusal at TP 4 without EP (compressed_tensors_moe_wna16.py:244–253), verbatim.
const GROUP_REFUSAL: &str = "CompressedTensors WNA16 MoE with static group scales requires the MoE intermediate size per tensor-parallel partition (16) to be divisible by group_size (32). Scale groups would otherwise cross TP shard boundaries; use a compatible TP size or enable expert parallelism.";

fn sharded(dir: &Path, name: &str, tp: u64, flags: &[&str]) -> PathBuf {
    sharded_from(&fixture(CASE), dir, name, tp, flags)
}

fn sharded_from(src: &Path, dir: &Path, name: &str, tp: u64, flags: &[&str]) -> PathBuf {
    let out = dir.join(name);
    let mut all = vec!["-q"];
    all.extend_from_slice(flags);
    shard_ok(src, tp, &out, &all);
    out
}

/// The tower's and projector's keys, as vLLM names them.
fn is_tower(name: &str) -> bool {
    name.starts_with("vision_tower.") || name.starts_with("mm_projector.")
}

/// The checkpoint tensor a tower key is loaded from (the wrapper's mapper renames the
/// projector's `proj.0` / `proj.2`, kimi_k25.py:311–320).
fn checkpoint_name(key: &str) -> String {
    key.replace("mm_projector.linear_1", "mm_projector.proj.0")
        .replace("mm_projector.linear_2", "mm_projector.proj.2")
}

/// Every tower and projector tensor of `t` is the checkpoint's whole tensor; returns how many.
fn assert_whole_tower(t: &Tensors, ckpt: &Tensors, ctx: &str) -> usize {
    let mut n = 0;
    for (name, held) in t.iter().filter(|(k, _)| is_tower(k)) {
        let src = &ckpt[&checkpoint_name(name)];
        assert_eq!(
            (&held.dtype, &held.shape),
            (&src.dtype, &src.shape),
            "{ctx} {name}"
        );
        assert!(
            held.data == src.data,
            "{ctx} {name}: the checkpoint's tensor"
        );
        n += 1;
    }
    n
}

/// The expert `e`'s `[gate; up]` rows of `what` (`weight_packed`, `weight_scale`).
fn w13(ckpt: &Tensors, e: usize, what: &str) -> Vec<u8> {
    let part = |p: &str| &ckpt[&format!("{MOE}.{e}.{p}_proj.{what}")].data;
    [part("gate").as_slice(), part("up").as_slice()].concat()
}

fn manifest(dir: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(dir.join("wload.json")).unwrap()).unwrap()
}

/// At TP 4 the 6 vision heads do not divide: every rank holds the whole tower, with no flag,
/// byte for byte the state `--mm-encoder-tp-mode data` gives; the text model is TP 4 with whole
/// experts (spec §12.4, `kimi_k25_w4a16__ep/tp4`), and the serve line needs no encoder flag.
#[test]
fn the_tower_is_whole_when_its_heads_do_not_divide_tp_as_in_data_mode() {
    let tmp = TempDir::new().unwrap();
    let auto = sharded(tmp.path(), "auto", 4, &["--enable-expert-parallel"]);
    let data = sharded(
        tmp.path(),
        "data",
        4,
        &["--enable-expert-parallel", "--mm-encoder-tp-mode", "data"],
    );
    let ckpt = checkpoint_tensors(&fixture(CASE));
    for r in 0..4u64 {
        let ctx = format!("tp4 rank {r}");
        let t = rank_tensors(&auto, r);
        assert_same_tensors(
            &t,
            &rank_tensors(&data, r),
            &format!("{ctx}: as in data mode"),
        );
        assert_eq!(
            assert_whole_tower(&t, &ckpt, &ctx),
            35,
            "{ctx}: 29 tower + 6 projector"
        );
        assert_eq!(
            t["vision_tower.encoder.blocks.0.wqkv.weight"].shape,
            [288, 96]
        );
        let attn = "language_model.model.layers.0.self_attn";
        assert_eq!(
            t[&format!("{attn}.mla_attn.q_b_proj.weight")].shape,
            [96, 96],
            "{ctx}"
        );
        assert_eq!(
            t[&format!("{attn}.kv_b_proj.weight")].shape,
            [128, 64],
            "{ctx}"
        );
        assert_eq!(
            t[&format!("{attn}.mla_attn.o_proj.weight")].shape,
            [128, 64],
            "{ctx}"
        );
        assert_eq!(
            t["language_model.model.embed_tokens.weight"].shape,
            [256, 128]
        );
        let packed = &t[&format!("{MOE}.routed_experts.w13_weight_packed")];
        assert_eq!(packed.shape, [2, 128, 16], "{ctx}");
        let e = 2 * r as usize;
        let want = [
            w13(&ckpt, e, "weight_packed"),
            w13(&ckpt, e + 1, "weight_packed"),
        ]
        .concat();
        assert!(packed.data == want, "{ctx}: experts {e} and {}", e + 1);
    }
    let (m_auto, m_data) = (manifest(&auto), manifest(&data));
    assert_eq!(m_data["mm_encoder_tp_mode"], "data");
    assert_ne!(m_auto["mm_encoder_tp_mode"], "data", "{m_auto:#}");
    let argv = m_auto["serve"]["argv"].to_string();
    assert!(!argv.contains("--mm-encoder-tp-mode"), "{argv}");
}

/// At TP 2 the heads divide: the tower is split (wqkv `[q_r; k_r; v_r]`, the golden case), and
/// `--mm-encoder-tp-mode data` holds it whole with the same keys and the same text (spec §12.1
/// `__mmdata`).
#[test]
fn at_tp2_the_tower_splits_and_data_mode_holds_it_whole() {
    let tmp = TempDir::new().unwrap();
    let weights = sharded(tmp.path(), "weights", 2, &[]);
    let data = sharded(tmp.path(), "data", 2, &["--mm-encoder-tp-mode", "data"]);
    let ckpt = checkpoint_tensors(&fixture(CASE));
    let qkv = &ckpt["vision_tower.encoder.blocks.1.wqkv.weight"];
    for r in 0..2u64 {
        let (w, d) = (rank_tensors(&weights, r), rank_tensors(&data, r));
        let ctx = format!("tp2 rank {r}");
        assert_eq!(
            w.keys().collect::<Vec<_>>(),
            d.keys().collect::<Vec<_>>(),
            "{ctx}"
        );
        assert_eq!(assert_whole_tower(&d, &ckpt, &ctx), 35, "{ctx}");
        for (name, t) in d.iter().filter(|(k, _)| !is_tower(k)) {
            assert!(
                t.data == w[name].data,
                "{ctx} {name}: text as in weights mode"
            );
        }
        // Split: 3 of the 6 heads (16 rows each) of q, of k and of v.
        let split = &w["vision_tower.encoder.blocks.1.wqkv.weight"];
        let r = r as usize;
        let want: Vec<u8> = (0..3)
            .flat_map(|s| qkv.rows(s * 96 + r * 48, s * 96 + (r + 1) * 48).to_vec())
            .collect();
        assert_eq!(split.shape, [144, 96], "{ctx}");
        assert!(split.data == want, "{ctx}: [q_r; k_r; v_r]");
        let wo = &w["vision_tower.encoder.blocks.1.wo.bias"];
        assert!(
            wo.data == ckpt["vision_tower.encoder.blocks.1.wo.bias"].data,
            "{ctx}"
        );
    }
}

/// TP 4 without expert parallelism: the INT4 group (32) crosses a rank's share of the experts'
/// intermediate size (64 / 4 = 16); vLLM refuses in these words and names the fix, served with
/// the tower or without. With `--enable-expert-parallel` the same TP is accepted.
#[test]
fn tp4_without_expert_parallelism_is_refused_in_vllms_words() {
    let src = fixture(CASE);
    for flags in [&[][..], &["--language-model-only"][..]] {
        let mut args = vec!["plan", s(&src), "--tp", "4"];
        args.extend_from_slice(flags);
        let refused = run(&args);
        assert_refusal_text(
            &refused,
            3,
            &[MOE, GROUP_REFUSAL, "--enable-expert-parallel"],
        );
        args.push("--enable-expert-parallel");
        let ok = run(&args);
        assert!(ok.status.success(), "{flags:?}: {}", context(&ok));
    }
    let tmp = TempDir::new().unwrap();
    let out = tmp.path().join("out");
    let refused = shard(&src, 4, &out, &["--language-model-only"]);
    assert_refusal_text(&refused, 3, &[GROUP_REFUSAL]);
}

/// The deployment width (spec §12.4, `kimi_k25_w4a16__lmonly__ep/tp8`): one MLA head and one
/// whole expert per rank, the BF16 dense and shared MLPs split 8 ways.
#[test]
fn tp8_with_expert_parallelism_holds_one_head_and_one_expert_per_rank() {
    let tmp = TempDir::new().unwrap();
    let out = sharded(
        tmp.path(),
        "tp8",
        8,
        &["--language-model-only", "--enable-expert-parallel"],
    );
    let ckpt = checkpoint_tensors(&fixture(CASE));
    let l = "language_model.model.layers";
    for r in 0..8u64 {
        let t = rank_tensors(&out, r);
        let ctx = format!("tp8 rank {r}");
        assert!(!t.keys().any(|k| is_tower(k)), "{ctx}");
        let shape = |k: &str| t[&format!("{l}.{k}")].shape.clone();
        assert_eq!(
            shape("0.self_attn.mla_attn.q_b_proj.weight"),
            [48, 96],
            "{ctx}"
        );
        assert_eq!(shape("0.self_attn.kv_b_proj.weight"), [64, 64], "{ctx}");
        assert_eq!(
            shape("0.self_attn.mla_attn.o_proj.weight"),
            [128, 32],
            "{ctx}"
        );
        assert_eq!(shape("0.mlp.gate_up_proj.weight"), [64, 128], "{ctx}");
        assert_eq!(shape("0.mlp.down_proj.weight"), [128, 32], "{ctx}");
        let shared = "1.mlp.experts._shared_experts._layer";
        assert_eq!(
            shape(&format!("{shared}.gate_up_proj.weight")),
            [16, 128],
            "{ctx}"
        );
        assert_eq!(
            shape(&format!("{shared}.down_proj.weight")),
            [128, 8],
            "{ctx}"
        );
        assert_eq!(
            t["language_model.lm_head.weight"].shape,
            [128, 128],
            "{ctx}"
        );
        let e = r as usize;
        for what in ["weight_packed", "weight_scale"] {
            let held = &t[&format!("{MOE}.routed_experts.w13_{what}")];
            assert_eq!(held.shape[0], 1, "{ctx} {what}");
            assert!(held.data == w13(&ckpt, e, what), "{ctx} {what}: expert {e}");
        }
    }
}

/// `--pp 2` without the tower (spec §12.5, `kimi_k25_w4a16__lmonly__pp2/tp1`): layer 0 and the
/// embedding on stage 0; layer 1, the final norm and lm_head on stage 1; values as at TP 1.
#[test]
fn two_pipeline_stages_split_the_layers_embedding_first_head_last() {
    let tmp = TempDir::new().unwrap();
    let pp = sharded(tmp.path(), "pp", 1, &["--language-model-only", "--pp", "2"]);
    let whole = rank_tensors(
        &sharded(tmp.path(), "tp1", 1, &["--language-model-only"]),
        0,
    );
    let layers = "language_model.model.layers.";
    for p in 0..2u64 {
        let want: Tensors = whole
            .iter()
            .filter(|(n, _)| match n.strip_prefix(layers) {
                Some(rest) => rest.starts_with(&format!("{p}.")),
                None if n.contains("embed_tokens") => p == 0,
                None => p == 1,
            })
            .map(|(n, t)| (n.clone(), t.clone()))
            .collect();
        assert_same_tensors(&stage_tensors(&pp, p, 0), &want, &format!("stage {p}"));
    }
}

/// vLLM builds the tower and projector without the quant config under compressed-tensors
/// (kimi_k25.py:387–390): with an ignore list that does not name them, they are still BF16 and
/// every rank file is the golden one.
#[test]
fn the_tower_stays_unquantized_whatever_the_ignore_list_says() {
    let src = fixture_with(CASE, |m| {
        let ignore = m["quantization_config"]["ignore"].as_array_mut().unwrap();
        ignore.retain(|v| !v.as_str().unwrap().starts_with("re:vision_tower"));
        ignore.retain(|v| !v.as_str().unwrap().starts_with("re:mm_projector"));
        assert_eq!(ignore.len(), 4);
    });
    let tmp = TempDir::new().unwrap();
    let got = sharded_from(src.path(), tmp.path(), "trimmed", 2, &[]);
    let want = sharded(tmp.path(), "golden", 2, &[]);
    for r in 0..2u64 {
        let ctx = format!("rank {r}");
        assert_same_tensors(&rank_tensors(&got, r), &rank_tensors(&want, r), &ctx);
    }
}

/// With the tower, `--pp 2` is refused: vLLM's Model Runner V2 (the CUDA default) builds the
/// tower on the first stage only, V1 on every stage, so the folder would load under one only.
#[test]
fn pipeline_stages_with_the_tower_are_refused_with_the_fix() {
    let src = fixture(CASE);
    let refused = run(&["plan", s(&src), "--tp", "1", "--pp", "2"]);
    assert_refusal_text(
        &refused,
        3,
        &[
            "the vision tower with --pp 2",
            "Model Runner V2",
            "--language-model-only",
        ],
    );
}

/// `--language-model-only` skips every tower and projector tensor, saying why.
#[test]
fn language_model_only_skips_the_tower_and_the_projector() {
    let plan = clean_plan_json(&fixture(CASE), &["--tp", "2", "--language-model-only"]);
    let skipped = skipped_tensors(&plan, "--language-model-only");
    assert_eq!(skipped.len(), 35, "{skipped:?}");
    assert!(skipped.iter().all(|s| is_tower(s)), "{skipped:?}");
}

/// When the heads divide TP, vLLM splits the tower's MLP too, and a width TP does not divide is
/// refused with the fix; a MoonViT variant the mapping does not describe is refused by name.
#[test]
fn a_split_tower_needs_its_mlp_divisible_and_other_variants_are_refused() {
    let src = fixture(CASE);
    let odd = r#"{"vision_config": {"intermediate_size": 191}}"#;
    let refused = run(&["plan", s(&src), "--tp", "2", "--hf-overrides", odd]);
    assert_refusal_text(
        &refused,
        3,
        &[
            "vision_config.intermediate_size 191",
            "--mm-encoder-tp-mode data",
        ],
    );
    let rms = r#"{"vision_config": {"norm_type": "rmsnorm"}}"#;
    let refused = run(&["plan", s(&src), "--tp", "2", "--hf-overrides", rms]);
    assert_refusal_text(&refused, 3, &["MoonViT variant", "--language-model-only"]);
}
