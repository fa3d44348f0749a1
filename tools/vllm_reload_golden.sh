#!/usr/bin/env bash
# For each golden case given (default: the quantized formats of issue 26 and the families of issue
# 27): shard the fixture with wload, reload the output with real vLLM 0.33 (tools/vllm_reload.py,
# CPU, gloo TP groups) and compare what vLLM then holds with what it holds from the original
# checkpoint (the golden expected folder), tensor by tensor, byte for byte.
#
#   VENV=/path/to/venv-with-vllm-0.33 WLOAD=target/release/wload tools/vllm_reload_golden.sh [CASE/tpN ...]
#
# GOLDEN   the golden set (default tests/data/golden): fixtures/<fixture>, expected/<case>/tp<N>.
#          The repository keeps issue 27's cases as digests (tensors.json) and lacks some of their
#          fixtures; GOLDEN=/work/shared/golden has every fixture and vLLM's rank files.
# SOURCE   wload (default): reload wload's output for the case. vllm: reload the expected folder
#          itself (vLLM's own sharded_state output, needs rank files: GOLDEN=/work/shared/golden),
#          which proves the harness: it must say IDENTICAL for every case.
# WORK     where outputs, dumps and logs go (default: a new temporary folder).
#
# A case's shard flags come from its name's suffixes (`__lmonly`, `__ep`, ...) and CASE_FLAGS below. The reload takes its engine flags from the
# folder (tools/vllm_reload.py --flags-from-folder): the `vllm serve` line wload recorded in
# wload.json (so `--language-model-only`, `--config-format mistral`, `--moe-backend` are those a user
# is told to pass, not a second copy kept here), or the golden oracle's options for vLLM's own folder.
# The comparison of a reload of wload's output is compare_digest.py (SHA-256 per tensor, from vLLM's
# rank files or tensors.json; Mamba2's `A` = -exp(A_log), which vLLM computes with the device's exp,
# within 1 ulp of vLLM's own and exactly wload's file, which vLLM reloads verbatim); of vLLM's own
# folder compare_shards.py (rank files) or compare_digest.py (tensors.json). Exit status: the number of cases that differ or fail.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:?set VENV to a virtualenv with vllm==0.33.0}
wload=${WLOAD:-$here/target/release/wload}
golden=${GOLDEN:-$here/tests/data/golden}
source=${SOURCE:-wload}
work=${WORK:-$(mktemp -d)}
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(
  # issue 26: quantized formats
  gpt_oss_mxfp4/tp2 llama_gqa_w4a16/tp2 llama_gqa_gptq/tp2 llama_gqa_modelopt_nvfp4/tp2
  llama_kv2_ct_fp8_kv_head/tp2 llama_gqa_ct_w8a8_int8/tp2
  # issue 27: families of late 2026
  minimax_m2/tp2 qwen3_vl/tp2 llama4__lmonly/tp2 qwen3_5_moe__lmonly/tp2 glm4_moe_lite/tp2
  deepseek_v32/tp2 mistral_large_3/tp2)
# Shard flags a case needs beyond those its name's suffixes stand for (suffix_flags).
# NVFP4 experts under EP: the H100/H200 backend the golden oracle pinned (vllm-spec §10.1.4).
declare -A CASE_FLAGS=([gpt_oss_mxfp4]="--moe-backend triton"
  [nvfp4_moe_modelopt__ep]="--moe-backend marlin" [qwen3_moe_modelopt_nvfp4__ep]="--moe-backend marlin")

# suffix_flags, fixture_of
source "$here/tools/golden_cases.sh"

failed=0
for c in "${cases[@]}"; do
  name=${c%/tp*}; tp=${c##*/tp}
  expected=$golden/expected/$name/tp$tp
  out=$work/$name/out; dump=$work/$name/dump
  rm -rf "$work/$name"; mkdir -p "$work/$name"
  if [ "$source" = vllm ]; then
    if ! ls "$expected"/model-*.safetensors > /dev/null 2>&1; then
      echo "$c: no vLLM rank files in $expected (SOURCE=vllm needs GOLDEN=/work/shared/golden)"
      failed=$((failed + 1)); continue
    fi
    cp -r "$expected" "$out"
  else
    if ! fixture=$(fixture_of "$name"); then
      echo "$c: no fixture in $golden/fixtures (set GOLDEN=/work/shared/golden)"
      failed=$((failed + 1)); continue
    fi
    if ! flags=$(suffix_flags "$name"); then
      echo "$c: unknown suffix in the case name"; failed=$((failed + 1)); continue
    fi
    # shellcheck disable=SC2086
    if ! "$wload" -q shard "$fixture" --tp "$tp" -o "$out" $flags ${CASE_FLAGS[$name]:-} \
        > "$work/$name/shard.log" 2>&1; then
      echo "$c: shard failed: $(grep -m1 -i error "$work/$name/shard.log" | cut -c1-120) ($work/$name/shard.log)"
      failed=$((failed + 1)); continue
    fi
  fi
  if ! VLLM_TARGET_DEVICE=cpu "$venv/bin/python" "$here/tools/vllm_reload.py" "$out" --flags-from-folder \
      --dump "$dump" > "$work/$name/reload.log" 2>&1; then
    echo "$c: vLLM reload failed: $(grep -E 'Error|error' "$work/$name/reload.log" | tail -1 | cut -c1-200)" \
      "($work/$name/reload.log)"
    failed=$((failed + 1)); continue
  fi
  if [ "$source" = wload ]; then
    # compare_digest.py takes rank files or a digest; it holds Mamba2's computed `A` to 1 ulp of
    # vLLM's own and to exactly the file wload wrote (vLLM reloads it verbatim), every other
    # tensor to its bytes.
    compare=("$here/tools/compare_digest.py" "$expected" "$dump" --written "$out")
  elif ls "$expected"/model-*.safetensors > /dev/null 2>&1; then
    compare=("$here/tests/data/golden/tools/compare_shards.py" "$expected" "$dump" --ignore-parts)
  else
    compare=("$here/tools/compare_digest.py" "$expected" "$dump")
  fi
  if python3 "${compare[@]}" > "$work/$name/compare.log" 2>&1; then
    echo "$c: $(tail -1 "$work/$name/compare.log")"
  else
    echo "$c: DIFFERS ($work/$name/compare.log)"; failed=$((failed + 1))
  fi
done
exit $failed
