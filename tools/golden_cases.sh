# Golden case names, read the one way for every script (sourced): a case name's suffixes as flags,
# and the fixture a case comes from. `golden` must be set to the golden set's folder.

# The flags of a case name's suffixes, as the golden README defines them: `__lmonly`
# --language-model-only, `__mmdata` --mm-encoder-tp-mode data, `__ep` --enable-expert-parallel,
# `__ppN` --pp N, `__dtype_D` --dtype D, `__moe_B` --moe-backend B, `__maxsize_B` --max-part-size B (with a second argument
# `engine`: vLLM's engine flags only, which have no part size; the others are spelled the same).
suffix_flags() {
  local s parts flags=() engine=${2:-}
  IFS=' ' read -r -a parts <<< "${1//__/ }"
  for s in "${parts[@]:1}"; do
    case $s in
      lmonly) flags+=(--language-model-only) ;;
      mmdata) flags+=(--mm-encoder-tp-mode data) ;;
      ep) flags+=(--enable-expert-parallel) ;;
      pp[0-9]*) flags+=(--pp "${s#pp}") ;;
      dtype_*) flags+=(--dtype "${s#dtype_}") ;;
      moe_*) flags+=(--moe-backend "${s#moe_}") ;;
      maxsize_*) [ "$engine" = engine ] || flags+=(--max-part-size "${s#maxsize_}") ;;
      fp8_*) ;;  # llama_gqa__fp8_block: the fixture's name (fixture_of), no flag
      *) echo "unknown case suffix __$s" >&2; return 1 ;;
    esac
  done
  echo "${flags[*]}"
}

# The fixture of a case: its own name, or the name with `__` as `_` (llama_gqa__fp8_block comes from
# llama_gqa_fp8_block), or the name before the suffix (llama4__lmonly comes from llama4).
fixture_of() {
  local n
  for n in "$1" "${1/__/_}" "${1%%__*}"; do
    [ -d "$golden/fixtures/$n" ] && { echo "$golden/fixtures/$n"; return; }
  done
  return 1
}

