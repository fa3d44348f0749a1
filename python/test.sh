#!/usr/bin/env bash
# The Python package's tests, run against the wheel as it ships: built once (release, as people
# install it), installed into a fresh venv on a PATH without a Rust toolchain (a GPU node or
# vLLM's image has none), checked to be the whole tool there (the `wload` command, the library),
# then python/tests from that venv. `.ci/run` calls this; README "Tests", docs/development.md.
#
#   python/test.sh        (from anywhere; leaves dist/wload-*.whl and .venv-py/ at the root)
set -euo pipefail
cd "$(dirname "$0")/.."
start=$SECONDS
rm -rf dist
python3 -m pip wheel -q ./python -w dist --no-deps
echo "wheel build: $((SECONDS - start)) s wall time ($(cd dist && echo wload-*.whl))"
python3 -m venv --clear .venv-py
bare="$PWD/.venv-py/bin:/usr/bin:/bin"
if env PATH="$bare" sh -c 'command -v cargo || command -v rustc'; then
  echo "python/test.sh: a Rust toolchain is on $bare, so the checks could not tell" \
    "whether the wheel needs one" >&2
  exit 1
fi
env PATH="$bare" pip install -q dist/wload-*.whl numpy pytest mypy==2.4.1
env PATH="$bare" wload --version
env PATH="$bare" wload inspect tests/data/golden/fixtures/llama_gqa > /dev/null
env PATH="$bare" python -c "import wload"
env PATH="$bare" python -m pytest -q python/tests
