#!/usr/bin/env bash
# Object storage, whole-process, as ratios in one run against the same S3-protocol server on
# 127.0.0.1 (s3s-fs over a folder in the work dir: examples/s3_server.rs):
#   - upload:  the 3.6 GiB 8B-shaped checkpoint uploaded through object_store (8 MiB parts,
#              8 in flight): the server's write rate, the copy limit for everything below.
#   - shard S3 -> S3 at TP 2, against an upload of its output's bytes (the same size).
#   - shard S3 -> local and local -> S3, to see which side costs what.
# Usage: bench/store.sh   (BENCH_DIR=DIR keeps the data between runs)
set -euo pipefail
source "$(dirname "$0")/common.sh"
cargo build --release --locked --quiet --example s3_server
server=${CARGO_TARGET_DIR:-$root/target}/release/examples/s3_server
ck=$work/llama8b-4l
ensure_llama8b_4layers "$ck"
srv=$work/s3root
rm -rf "$srv" "$work"/out-*
mkdir -p "$srv/bench"
port=$((20000 + RANDOM % 20000))
"$server" serve "$srv" "$port" &
pid=$!
trap 'kill $pid 2>/dev/null; [[ -z ${BENCH_DIR:-} ]] && rm -rf "$work"' EXIT
sleep 1
export AWS_ENDPOINT_URL=http://127.0.0.1:$port AWS_ACCESS_KEY_ID=bench AWS_SECRET_ACCESS_KEY=bench AWS_REGION=us-east-1
bytes=$(du -cb "$ck"/*.safetensors | tail -1 | cut -f1)
t() { local s=$(date +%s.%N); "$@" >/dev/null; echo "$(date +%s.%N) - $s" | bc; }
sync
up=$(t "$server" upload "$ck" s3://bench/src)
s3s3=$(t "$bin" shard s3://bench/src --tp 2 -o s3://bench/out-tp2 -q --download-dir "$work/cache")
s3local=$(t "$bin" shard s3://bench/src --tp 2 -o "$work/out-local" -q --download-dir "$work/cache")
localS3=$(t "$bin" shard "$ck" --tp 2 -o s3://bench/out-from-local -q)
out_bytes=$(du -cb "$work/out-local"/*.safetensors | tail -1 | cut -f1)
up_out=$(t "$server" upload "$work/out-local" s3://bench/out-upload)
gib() { echo "scale=2; $1 / 1073741824" | bc; }
rate() { echo "scale=2; $1 / $2 / 1073741824" | bc; }
echo "checkpoint: $(gib "$bytes") GiB; output at TP 2: $(gib "$out_bytes") GiB"
echo "upload of the checkpoint:     ${up} s  ($(rate "$bytes" "$up") GiB/s)"
echo "upload of the TP 2 output:    ${up_out} s  ($(rate "$out_bytes" "$up_out") GiB/s)"
echo "shard S3 -> S3, TP 2:         ${s3s3} s  = $(echo "scale=2; $s3s3 / $up_out" | bc) x the upload of its output"
echo "shard S3 -> local, TP 2:      ${s3local} s"
echo "shard local -> S3, TP 2:      ${localS3} s"
