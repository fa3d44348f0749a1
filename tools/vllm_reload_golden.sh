#!/usr/bin/env bash
# For each golden case given (default: the quantized formats of issue 26): shard the fixture with
# wload, reload the output with real vLLM 0.33 (tools/vllm_reload.py, CPU, gloo TP groups) and
# compare what vLLM then holds with what it holds from the original checkpoint (the golden
# expected folder), tensor by tensor, byte for byte.
#
#   VENV=/path/to/venv-with-vllm-0.33 WLOAD=target/release/wload tools/vllm_reload_golden.sh [CASE/tpN ...]
#
# A case's extra shard flags come from CASE_FLAGS below. Exit status: the number of cases that
# differ or fail.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
venv=${VENV:?set VENV to a virtualenv with vllm==0.33.0}
wload=${WLOAD:-$here/target/release/wload}
work=${WORK:-$(mktemp -d)}
cases=("$@")
[ ${#cases[@]} -gt 0 ] || cases=(gpt_oss_mxfp4/tp2 llama_gqa_w4a16/tp2 llama_gqa_gptq/tp2
  llama_gqa_modelopt_nvfp4/tp2 llama_kv2_ct_fp8_kv_head/tp2 llama_gqa_ct_w8a8_int8/tp2)
declare -A CASE_FLAGS=([gpt_oss_mxfp4]="--moe-backend triton")
failed=0
for c in "${cases[@]}"; do
  name=${c%/tp*}; tp=${c##*/tp}
  out=$work/$name/out; dump=$work/$name/dump
  rm -rf "$work/$name"; mkdir -p "$work/$name"
  # shellcheck disable=SC2086
  if ! "$wload" -q shard "$here/tests/data/golden/fixtures/$name" --tp "$tp" -o "$out" ${CASE_FLAGS[$name]:-} \
      > "$work/$name/shard.log" 2>&1; then
    echo "$c: shard failed ($work/$name/shard.log)"; failed=$((failed + 1)); continue
  fi
  moe=()
  [[ "${CASE_FLAGS[$name]:-}" == *triton* ]] && moe=(--moe-backend triton)
  if ! VLLM_TARGET_DEVICE=cpu "$venv/bin/python" "$here/tools/vllm_reload.py" "$out" --tp "$tp" \
      --dump "$dump" "${moe[@]}" > "$work/$name/reload.log" 2>&1; then
    echo "$c: vLLM reload failed: $(grep -E 'Error|error' "$work/$name/reload.log" | tail -1)"
    failed=$((failed + 1)); continue
  fi
  if python3 "$here/tests/data/golden/tools/compare_shards.py" \
      "$here/tests/data/golden/expected/$name/tp$tp" "$dump" --ignore-parts > "$work/$name/compare.log" 2>&1; then
    echo "$c: $(tail -1 "$work/$name/compare.log")"
  else
    echo "$c: DIFFERS ($work/$name/compare.log)"; failed=$((failed + 1))
  fi
done
exit $failed
