//! One module per golden case (`tests/data/golden/expected/<case>/tp<N>`), one test per check:
//! `cargo test --test it -- golden::llama_gqa_tp2` reruns one case, `golden::llama_gqa_tp2::shard`
//! one check. The cases are listed by hand below; `every_golden_folder_has_an_entry` fails when a
//! folder has no entry or an entry no folder, so no case is silently skipped.

use crate::commands::load::golden as load;
use crate::commands::shard;
use crate::support::{GoldenCase, golden_cases};

/// The listed case `name` (`llama_gqa/tp2`) and its place in the list (the tiny-chunk and stub
/// GPU checks pick their chunk sizes and I/O modes by it, so the cases cover them all).
fn case(name: &str) -> (usize, GoldenCase) {
    let i = LISTED
        .iter()
        .position(|c| *c == name)
        .expect("a listed case");
    let case = golden_cases()
        .into_iter()
        .find(|c| c.name == name)
        .unwrap_or_else(|| panic!("no folder tests/data/golden/expected/{name}"));
    (i, case)
}

/// `golden! { test_name => "case/tpN", … }`: a module `test_name` per case with its checks, and
/// `LISTED`, every case in the order given.
macro_rules! golden {
    ($($test:ident => $name:literal,)*) => {
        /// Every listed case, in the order of the list.
        const LISTED: &[&str] = &[$($name),*];
        $(
            #[allow(non_snake_case)] // `llama_gqa__pp2_tp2`: the folder's own name.
            mod $test {
                use super::*;

                #[test]
                fn shard() {
                    shard::golden_case_is_byte_identical(&case($name).1);
                }

                #[test]
                fn shard_tiny_chunks() {
                    let (i, c) = case($name);
                    shard::golden_case_is_byte_identical_with_tiny_chunks(i, &c);
                }

                #[test]
                fn load() {
                    load::fixture_loads_exactly_what_vllm_held(&case($name).1);
                }

                #[test]
                fn load_tiny_chunks() {
                    let (i, c) = case($name);
                    load::fixture_loads_exactly_what_vllm_held_with_tiny_chunks(i, &c);
                }

                #[test]
                fn load_stub_gpu() {
                    let (i, c) = case($name);
                    load::fixture_loads_exactly_what_vllm_held_through_the_stub_gpu(i, &c);
                }

                #[test]
                fn load_pre_sharded() {
                    load::vllm_folder_loads_as_pre_sharded(&case($name).1);
                }

                #[test]
                fn dry_run() {
                    load::dry_runs_pass(&case($name).1);
                }
            }
        )*
    };
}

golden! {
    deepseek_v3_tp2 => "deepseek_v3/tp2",
    deepseek_v32_tp2 => "deepseek_v32/tp2",
    gemma2_tp2 => "gemma2/tp2",
    gemma3_mm_tp2 => "gemma3_mm/tp2",
    glm4_moe_lite_tp2 => "glm4_moe_lite/tp2",
    glm5_fp8_tp2 => "glm5_fp8/tp2",
    glm5_2_fp8_indexshare_tp2 => "glm5_2_fp8_indexshare/tp2",
    gpt_oss_tp2 => "gpt_oss/tp2",
    gpt_oss_mxfp4_tp2 => "gpt_oss_mxfp4/tp2",
    granite4_tp2 => "granite4/tp2",
    kimi_k25_w4a16_tp2 => "kimi_k25_w4a16/tp2",
    kimi_k25_w4a16__lmonly_tp2 => "kimi_k25_w4a16__lmonly/tp2",
    llama4__lmonly_tp2 => "llama4__lmonly/tp2",
    llama_gqa_tp2 => "llama_gqa/tp2",
    llama_gqa_tp8 => "llama_gqa/tp8",
    llama_gqa__dtype_float16_tp2 => "llama_gqa__dtype_float16/tp2",
    llama_gqa__fp8_block_tp2 => "llama_gqa__fp8_block/tp2",
    llama_gqa__fp8_tensor_tp2 => "llama_gqa__fp8_tensor/tp2",
    llama_gqa__maxsize_40000_tp2 => "llama_gqa__maxsize_40000/tp2",
    llama_gqa__pp2_tp2 => "llama_gqa__pp2/tp2",
    llama_gqa_ct_fp8_dynamic_tp2 => "llama_gqa_ct_fp8_dynamic/tp2",
    llama_gqa_modelopt_nvfp4_tp2 => "llama_gqa_modelopt_nvfp4/tp2",
    llama_gqa_gptq_tp2 => "llama_gqa_gptq/tp2",
    llama_gqa_ct_w8a8_int8_tp2 => "llama_gqa_ct_w8a8_int8/tp2",
    llama_gqa_w4a16_tp2 => "llama_gqa_w4a16/tp2",
    llama_kv2_ct_fp8_kv_head_tp2 => "llama_kv2_ct_fp8_kv_head/tp2",
    llama_tied_fp16_tp2 => "llama_tied_fp16/tp2",
    llama_tied_fp16__maxsize_100000_tp2 => "llama_tied_fp16__maxsize_100000/tp2",
    minimax_m2_tp2 => "minimax_m2/tp2",
    mistral_large_3_tp2 => "mistral_large_3/tp2",
    mixtral_tp2 => "mixtral/tp2",
    mixtral__ep_tp2 => "mixtral__ep/tp2",
    nvfp4_moe_ct__ep_tp2 => "nvfp4_moe_ct__ep/tp2",
    nvfp4_moe_modelopt__ep_tp2 => "nvfp4_moe_modelopt__ep/tp2",
    nvfp4_moe_modelopt__ep__moe_flashinfer_trtllm_tp2 => "nvfp4_moe_modelopt__ep__moe_flashinfer_trtllm/tp2",
    olmo3_synth_tp2 => "olmo3_synth/tp2",
    phi3_fp32_tp2 => "phi3_fp32/tp2",
    qwen2_tp2 => "qwen2/tp2",
    qwen2_tp4 => "qwen2/tp4",
    qwen2_moe_tp2 => "qwen2_moe/tp2",
    qwen3_5_awq_tp2 => "qwen3_5_awq/tp2",
    qwen3_5_moe__lmonly_tp2 => "qwen3_5_moe__lmonly/tp2",
    qwen3_moe_fp8_block_tp2 => "qwen3_moe_fp8_block/tp2",
    qwen3_next_w4a16_tp2 => "qwen3_next_w4a16/tp2",
    qwen3_vl_tp2 => "qwen3_vl/tp2",
}

/// The list above is exactly the folders of tests/data/golden/expected (`<case>/tp<N>`): a new
/// folder without an entry, or an entry whose folder was removed, fails here by name.
#[test]
fn every_golden_folder_has_an_entry() {
    let folders: std::collections::BTreeSet<String> =
        golden_cases().into_iter().map(|c| c.name).collect();
    let listed: std::collections::BTreeSet<String> = LISTED.iter().map(|c| c.to_string()).collect();
    assert_eq!(LISTED.len(), listed.len(), "a case is listed twice");
    let unlisted: Vec<_> = folders.difference(&listed).collect();
    let missing: Vec<_> = listed.difference(&folders).collect();
    assert!(
        unlisted.is_empty() && missing.is_empty(),
        "golden folders with no entry in tests/it/golden.rs: {unlisted:?}; \
         entries with no folder: {missing:?}"
    );
}
