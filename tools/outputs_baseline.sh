#!/usr/bin/env bash
# Records every output wload gives on the golden fixtures, so that a change meant to move code
# without changing behaviour (a restructuring) can be checked: record at the commit before, record
# at the commit after, compare.
#
#   tools/outputs_baseline.sh record DIR   [WLOAD=target/release/wload] [GOLDEN=tests/data/golden]
#   tools/outputs_baseline.sh compare DIR1 DIR2
#
# For every golden case (expected/<case>/tp<N>, flags from the case name's suffixes, as
# tools/golden_cases.sh reads them) and, for the case's fixture, every TP size in 1 2 4 8 with and
# without --pp 2: `plan --json` without timings, `plan` and `load --dry-run` as people read them,
# their exit status and stderr (the refusals, with their words), `inspect --json` and `inspect -v`
# of the fixture and of the shard output, `sizes --json`, and the SHA-256 of every file `shard`
# writes (wload.json with its timings and paths taken out). Paths of the temporary folders are
# written as <OUT> and <FIXTURE>, so that two recordings compare.
#
# `compare` lists every file that differs or exists on one side only and exits with their number;
# it prints how many outputs it compared.
set -u
here=$(cd "$(dirname "$0")/.." && pwd)
golden=${GOLDEN:-$here/tests/data/golden}
# shellcheck source=tools/golden_cases.sh
. "$here/tools/golden_cases.sh"

# Timings, byte rates and wload's own version are not behaviour.
strip_json() {
  jq -S 'walk(if type == "object" then with_entries(select(
           (.key | test("(_s|_ms|_secs|seconds|gbps|GBps|_per_s|timings?|elapsed|wall)$") | not)
           and .key != "wload_version")) else . end)' 2>/dev/null || cat
}

# One command's outputs: stdout (as given, or through `filter`), stderr and the exit status.
# Temporary paths are written as placeholders.
one() {
  local name=$1 filter=$2
  shift 2
  local out err rc
  out=$("$wload" "$@" 2>"$dir/.err")
  rc=$?
  err=$(cat "$dir/.err")
  {
    printf '%s\n' "$out" | $filter
    printf -- '--- stderr\n%s\n--- exit %s\n' "$err" "$rc"
  } | sed -e "s#$tmp#<OUT>#g" -e "s#$fixtures#<FIXTURE>#g" >"$dir/$name"
}

# The SHA-256 of each file a shard output holds, wload.json as its stripped JSON.
digest_output() {
  local o=$1 f
  [ -d "$o" ] || { echo "(no output folder)"; return; }
  (cd "$o" && find . -type f | LC_ALL=C sort | while read -r f; do
    if [ "$f" = ./wload.json ]; then
      printf '%s  %s\n' "$(strip_json <"$f" | sed -e "s#$tmp#<OUT>#g" -e "s#$fixtures#<FIXTURE>#g" | sha256sum | cut -d' ' -f1)" "$f"
    else
      sha256sum "$f"
    fi
  done)
}

record_layout() {
  local fx=$1 key=$2
  shift 2
  local flags=("$@")
  local o="$tmp/$key"
  one "$key.plan.json" strip_json plan "$fx" "${flags[@]}" --json
  one "$key.plan.txt" cat plan "$fx" "${flags[@]}"
  one "$key.dry-run.txt" cat load "$fx" "${flags[@]}" --dry-run
  one "$key.shard.txt" cat shard "$fx" "${flags[@]}" -o "$o" -q
  digest_output "$o" >"$dir/$key.files"
  if [ -d "$o" ]; then
    one "$key.out.inspect.json" strip_json inspect "$o" --json
    one "$key.out.inspect.txt" cat inspect "$o" -v
    rm -rf "$o"
  fi
}

record() {
  wload=${WLOAD:-$here/target/release/wload}
  [ -x "$wload" ] || { echo "no wload at $wload (cargo build --release, or set WLOAD)" >&2; exit 2; }
  dir=$1
  mkdir -p "$dir"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  fixtures=$golden/fixtures
  local case_dir case tpdir fx tp flags seen=" "
  for case_dir in "$golden"/expected/*/; do
    case=$(basename "$case_dir")
    fx=$(fixture_of "$case") || { echo "$case: no fixture" >&2; continue; }
    read -r -a flags <<<"$(suffix_flags "$case")"
    for tpdir in "$case_dir"tp*; do
      tp=${tpdir##*/tp}
      record_layout "$fx" "$case.tp$tp" --tp "$tp" "${flags[@]}"
    done
    # Every TP size, with and without stages, once per fixture.
    case $seen in *" $fx "*) continue ;; esac
    seen+="$fx "
    local f
    f=$(basename "$fx")
    one "$f.inspect.json" strip_json inspect "$fx" --json
    one "$f.inspect.txt" cat inspect "$fx" -v
    one "$f.sizes.json" strip_json sizes "$fx" --json
    for tp in 1 2 4 8; do
      record_layout "$fx" "$f.any.tp$tp" --tp "$tp"
      record_layout "$fx" "$f.any.tp$tp.pp2" --tp "$tp" --pp 2
    done
  done
  rm -f "$dir/.err"
  echo "recorded $(find "$dir" -type f | wc -l) outputs in $dir"
}

compare() {
  local a=$1 b=$2 n differ
  n=$(find "$a" -type f | wc -l)
  differ=$(diff -rq "$a" "$b" | tee /dev/stderr | wc -l)
  echo "compared $n outputs: $differ differ or exist on one side only"
  exit "$((differ > 125 ? 125 : differ))"
}

case ${1:-} in
  record) [ $# -eq 2 ] || { echo "usage: $0 record DIR" >&2; exit 2; }; record "$2" ;;
  compare) [ $# -eq 3 ] || { echo "usage: $0 compare DIR1 DIR2" >&2; exit 2; }; compare "$2" "$3" ;;
  *) sed -n '2,18p' "$0" >&2; exit 2 ;;
esac
