# Sourced by the bench scripts: paths, the wload binary, a work folder, the 8B-shaped checkpoint.
# Sets: here, root, bin, work; and defines ensure_llama8b_4layers DIR, ensure_llama8b_4layers_fp8 DIR,
# ensure_llama8b_8layers_int4 DIR, ensure_deepseek_small DIR and ensure_gpt_oss_small DIR.
here=$(cd "$(dirname "${BASH_SOURCE[1]}")" && pwd)
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
# WLOAD_BIN=PATH times that binary; otherwise the release build of this checkout.
if [[ -n ${WLOAD_BIN:-} ]]; then
    bin=$(realpath "$WLOAD_BIN")
else
    cargo build --release --locked --quiet
    bin=${CARGO_TARGET_DIR:-$root/target}/release/wload
fi
# $1 of the calling script: a folder to keep the data in; otherwise a temp dir removed at exit.
if [[ -n ${BENCH_DIR:-} ]]; then
    work=$BENCH_DIR
    mkdir -p "$work"
else
    work=$(mktemp -d /var/tmp/wload-bench.XXXXXX)
    trap 'rm -rf "$work"' EXIT
fi

# The 4-layer Llama-3-8B-shaped checkpoint (about 3.6 GiB of random bf16, two files + index).
ensure_llama8b_4layers() {
    gen_llama8b_4layers "$1" "random bf16"
}

# The same checkpoint quantized as DeepSeek-V3 / Qwen3-FP8 are: the linear weights of every layer
# in FP8 (E4M3) with F32 scales per 128 x 128 block; embeddings, norms and lm_head stay bf16
# (about 2.8 GiB).
ensure_llama8b_4layers_fp8() {
    gen_llama8b_4layers "$1" "random FP8, block 128" --fp8-block 128
}

# The same model with 8 layers in compressed-tensors pack-quantized W4A16, groups of 32, as
# llm-compressor writes it (I32 `weight_packed`, BF16 `weight_scale`, `weight_shape`; embeddings,
# norms and lm_head bf16; about 3.1 GB). Twice the layers of the bf16 checkpoint, so that the
# packed weights are a third of the bytes rather than a sixth. At TP 8 its row-parallel layers
# are short strided rows: down_proj's `weight_packed` 896 bytes, `weight_scale` 112; o_proj's
# 256 and 32.
ensure_llama8b_8layers_int4() {
    if [[ ! -f $1/config.json ]]; then
        echo "generating the 8-layer Llama-3-8B-shaped checkpoint (random INT4 W4A16, group 32) in $1 ..." >&2
        python3 "$root/bench/gen_checkpoint.py" --files 2 --layers 8 --real-shapes --random --quiet \
            --w4a16 32 --out "$1"
    fi
}

# A reduced DeepSeek-V3-shaped checkpoint in block FP8 (bench/gen_deepseek.py: 3 layers, the first
# dense, 8 routed experts and the shared one, vocab 32000; about 2.7 GB of random data), for
# `shard --tp 8 --enable-expert-parallel`.
ensure_deepseek_small() {
    if [[ ! -f $1/config.json ]]; then
        echo "generating the reduced DeepSeek-V3-shaped checkpoint (random FP8) in $1 ..." >&2
        python3 "$root/bench/gen_deepseek.py" --out "$1" --layers 3 --first-dense 1 --experts 8 \
            --vocab-size 32000 --fp8-block 128 --files 4 --random 2>/dev/null
    fi
}

# A reduced gpt-oss-120b-shaped MXFP4 checkpoint (bench/gen_gpt_oss.py: 2 layers of 128 experts,
# vocab 32000; about 3.8 GB of random data), for `shard --tp 8` with and without padding.
ensure_gpt_oss_small() {
    if [[ ! -f $1/config.json ]]; then
        echo "generating the reduced gpt-oss-120b-shaped checkpoint (random MXFP4) in $1 ..." >&2
        python3 "$root/bench/gen_gpt_oss.py" --out "$1" --layers 2 --vocab-size 32000 --files 3 \
            --random 2>/dev/null
    fi
}

# DIR WHAT [gen_checkpoint.py options...]: generates the checkpoint unless DIR already has one.
gen_llama8b_4layers() {
    local dir=$1 what=$2
    shift 2
    if [[ ! -f $dir/config.json ]]; then
        echo "generating the 4-layer Llama-3-8B-shaped checkpoint ($what) in $dir ..." >&2
        python3 "$root/bench/gen_checkpoint.py" --files 2 --layers 4 --real-shapes --random --quiet \
            --out "$dir" "$@"
    fi
}
