#!/usr/bin/env bash
# vLLM 0.33 on the CPU loads golden fixtures twice, with `--load-format wload` (the plugin of the
# wheel `pip wheel ./python` builds) and with its own loader (`safetensors`), one process per rank with gloo
# groups (tools/vllm_reload.py), and the two states must be byte-identical, tensor by tensor
# (tests/data/golden/tools/compare_shards.py). Both states are taken after the weight loaders and
# before vLLM's post-processing, which the PyPI wheel cannot run on a CPU for MoE and quantized
# layers (tools/vllm_reload.py's patches, as the golden oracle's). Then a model wload cannot plan,
# and online quantization (`--quantization fp8_per_tensor`), must be refused before loading, saying
# to use `--load-format auto`.
#
#   tests/vllm/compare.sh [CASE/tpN ...]       (default: the cases below)
#   S3=1 tests/vllm/compare.sh [CASE/tpN ...]  (default: the S3 cases below)
#
# With S3=1 the plugin loads each fixture from object storage: the S3-protocol test server
# (examples/s3_server.rs, key bench/bench) on a free port, the fixture uploaded to
# s3://golden/NAME through it, and `--load-format wload` given MODEL s3://golden/NAME, as
# `vllm serve s3://golden/NAME --load-format wload` would (the plugin fetches the config with
# wload, the ranks read their bytes by ranged GETs); vLLM's own loader still reads the local
# fixture. Each wload rank must log that it read from the s3:// URL. The refusals below are not
# repeated in this mode.
#
# VENV  a virtualenv with vllm==0.33.0 (default .venv-vllm, created when missing: about 3 minutes
#       and 9.4 GB); this repository's Python package is installed into it on every run, unless
#       INSTALL=0 (then `wload` must import already, e.g. PYTHONPATH=python with a built
#       python/wload/_wload.abi3.so, and the venv is left as it is).
# WORK  where dumps and logs go (default: a new temporary folder).
# S3_SERVER  the example server's binary (default target/release/examples/s3_server, built when
#       missing).
# Exit status: the number of cases that differ or fail.
set -u
here=$(cd "$(dirname "$0")/../.." && pwd)
venv=${VENV:-$here/.venv-vllm}
work=${WORK:-$(mktemp -d)}
golden=$here/tests/data/golden
cases=("$@")
s3=${S3:-0}
[ ${#cases[@]} -gt 0 ] || [ "$s3" = 1 ] || cases=(
  llama_gqa/tp1 llama_gqa/tp2 llama_gqa__pp2/tp1 llama_gqa__dtype_float16/tp2 mixtral/tp2
  mixtral__ep/tp2 qwen2_moe/tp2 deepseek_v3/tp2 llama_gqa__fp8_block/tp2 llama_gqa_w4a16/tp2
  llama_gqa_gptq/tp2 gpt_oss_mxfp4/tp2)
[ ${#cases[@]} -gt 0 ] || cases=(
  llama_gqa/tp2 llama_gqa/tp4 mixtral/tp2 mixtral__ep/tp2 qwen2_moe/tp2 deepseek_v3/tp2)
declare -A CASE_FLAGS=([gpt_oss_mxfp4]="--moe-backend triton")

if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv" && "$venv/bin/pip" install -q vllm==0.33.0 || exit 100
fi
if [ "${INSTALL:-1}" != 0 ]; then
  # The wheel a GPU node installs, built once, not `pip install ./python`.
  { rm -rf "$work/dist" && "$venv/bin/pip" wheel -q --no-deps -w "$work/dist" "$here/python" && "$venv/bin/pip" install -q --force-reinstall --no-deps "$work"/dist/wload-*.whl; } || exit 101
fi
py=$venv/bin/python
export VLLM_TARGET_DEVICE=cpu

if [ "$s3" = 1 ]; then
  server=${S3_SERVER:-$here/target/release/examples/s3_server}
  [ -x "$server" ] || (cd "$here" && cargo build --release --locked -q --example s3_server) || exit 103
  port=$("$py" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  mkdir -p "$work/s3root/golden"
  "$server" serve "$work/s3root" "$port" > "$work/s3_server.log" 2>&1 &
  server_pid=$!
  trap 'kill $server_pid 2>/dev/null' EXIT
  export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench \
    AWS_REGION=us-east-1
  # wload's object cache (config, index, headers) inside WORK, not under HOME.
  export XDG_CACHE_HOME=$work/cache
  sleep 1
fi

# suffix_flags, fixture_of
source "$here/tools/golden_cases.sh"

failed=0
for c in "${cases[@]}"; do
  name=${c%/tp*}; tp=${c##*/tp}
  dir=$work/$name-tp$tp; rm -rf "$dir"; mkdir -p "$dir"
  fixture=$(fixture_of "$name") || { echo "$c: no fixture"; failed=$((failed + 1)); continue; }
  flags=$(suffix_flags "$name" engine) || { failed=$((failed + 1)); continue; }
  flags="$flags ${CASE_FLAGS[$name]:-}"
  [ -f "$fixture/params.json" ] && [ ! -f "$fixture/config.json" ] && flags="$flags --config-format mistral"
  ok=1
  model_wload=$fixture
  if [ "$s3" = 1 ]; then
    model_wload=s3://golden/$(basename "$fixture")
    [ -d "$work/s3root/golden/$(basename "$fixture")" ] \
      || "$server" upload "$fixture" "$model_wload" > /dev/null \
      || { echo "$c: upload to $model_wload failed"; failed=$((failed + 1)); continue; }
  fi
  for fmt in safetensors wload; do
    model=$fixture; [ $fmt = wload ] && model=$model_wload
    # shellcheck disable=SC2086
    if ! "$py" "$here/tools/vllm_reload.py" "$model" --load-format $fmt --tp "$tp" $flags \
        --dump "$dir/$fmt" > "$dir/$fmt.log" 2>&1; then
      echo "$c: --load-format $fmt failed: $(grep -E 'Error|error' "$dir/$fmt.log" | tail -1) ($dir/$fmt.log)"
      ok=0
    fi
  done
  if [ $ok = 1 ] && [ "$s3" = 1 ]; then
    read_from=$(grep -c "wload: rank [0-9]* read [0-9.]* MiB from $model_wload (ranged GETs)" "$dir/wload.log")
    if [ "$read_from" != "$tp" ]; then
      echo "$c: $read_from of $tp ranks logged reading from $model_wload ($dir/wload.log)"; ok=0
    fi
  fi
  if [ $ok = 1 ] && "$py" "$golden/tools/compare_shards.py" "$dir/safetensors" "$dir/wload" > "$dir/compare.log" 2>&1; then
    echo "$c: $(grep IDENTICAL "$dir/compare.log")"
  else
    [ $ok = 1 ] && { echo "$c: DIFFERENT"; cat "$dir/compare.log"; }
    failed=$((failed + 1))
  fi
done

if [ "$s3" = 1 ]; then
  echo "$failed case(s) failed; logs in $work"
  exit $failed
fi

# A pre-sharded folder as MODEL (wload's own output of llama_gqa at TP 2), with WLOAD (default
# target/release/wload) to write it: the same state as vLLM's loader on the original checkpoint.
wload_bin=${WLOAD:-$here/target/release/wload}
[ -x "$wload_bin" ] || (cd "$here" && cargo build --release --locked -q) || exit 102
pre=$work/pre-sharded; rm -rf "$pre" "$pre-dump"
if "$wload_bin" shard "$golden/fixtures/llama_gqa" --tp 2 -o "$pre" -q > /dev/null \
    && "$py" "$here/tools/vllm_reload.py" "$pre" --load-format wload --tp 2 --dump "$pre-dump" \
      > "$work/pre-sharded.log" 2>&1 \
    && "$py" "$here/tools/vllm_reload.py" "$golden/fixtures/llama_gqa" --load-format safetensors \
      --tp 2 --dump "$pre-auto" > "$work/pre-sharded-auto.log" 2>&1 \
    && "$py" "$golden/tools/compare_shards.py" "$pre-auto" "$pre-dump" > "$work/pre-sharded.cmp" 2>&1; then
  echo "pre-sharded llama_gqa/tp2: $(grep IDENTICAL "$work/pre-sharded.cmp")"
else
  echo "pre-sharded llama_gqa/tp2: failed or DIFFERENT (logs in $work)"; failed=$((failed + 1))
fi

# A model wload cannot plan: the old spelling `LLaMAForCausalLM`, which vLLM builds as Llama and
# wload has no mapping for. Refused once, where vLLM builds its config (the plugin's wrap of
# EngineArgs.create_engine_config), before any worker builds the model, naming the way out.
unknown=$work/unknown-arch; rm -rf "$unknown"; cp -r "$golden/fixtures/llama_gqa" "$unknown"
sed -i 's/"LlamaForCausalLM"/"LLaMAForCausalLM"/' "$unknown/config.json"
if "$py" "$here/tools/vllm_reload.py" "$unknown" --load-format wload --tp 1 --dump "$work/unknown-dump" \
    > "$work/unknown.log" 2>&1; then
  echo "refusal: a model wload cannot plan was loaded"; failed=$((failed + 1))
elif grep -q "use --load-format auto" "$work/unknown.log" \
    && grep -q "in create_engine_config" "$work/unknown.log" \
    && ! grep -q "load_weights\|During handling" "$work/unknown.log"; then
  echo "refusal: refused where vLLM builds its config, before the model, saying to use --load-format auto"
else
  echo "refusal: failed without wload's message ($work/unknown.log)"; failed=$((failed + 1))
fi
# Online quantization: `--quantization fp8_per_tensor` on a BF16 checkpoint. vLLM creates the
# quantized layers' weights on the meta device for its own weight loaders to quantize; the plugin
# must refuse before planning, saying that online quantization is why (not "no such parameter")
# and what to do instead.
if "$py" "$here/tools/vllm_reload.py" "$golden/fixtures/llama_gqa" --load-format wload --tp 2 \
    --quantization fp8_per_tensor --dump "$work/online-dump" > "$work/online.log" 2>&1; then
  echo "online quantization: loaded, not refused"; failed=$((failed + 1))
elif grep -q "with online quantization (--quantization fp8_per_tensor)" "$work/online.log" \
    && grep -q "use --load-format auto" "$work/online.log" \
    && ! grep -q "no such parameter" "$work/online.log"; then
  echo "online quantization: refused before planning, naming it and --load-format auto"
else
  echo "online quantization: failed without wload's message ($work/online.log)"; failed=$((failed + 1))
fi
echo "$failed case(s) failed; logs in $work"
exit $failed
