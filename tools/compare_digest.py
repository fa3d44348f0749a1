#!/usr/bin/env python3
"""Compare a folder of per-rank safetensors files (a vLLM reload dump, or a wload output) with a
golden case kept in digest form: `tensors.json`, written by tests/data/golden/tools/digest.py from
the rank files real vLLM wrote (Python standard library only).

    python tools/compare_digest.py EXPECTED_DIR CANDIDATE_DIR

EXPECTED_DIR holds `tensors.json` (tests/data/golden/expected/<case>/tp<N>). The candidate's rank
files are described with digest.py's own `describe` (same SHA-256 over the same data bytes), then
compared rank by rank with the tensors of every part pooled, as `compare_shards.py --ignore-parts`
does: a reload dump is written as one part per rank whatever vLLM's part boundaries were. Per tensor:
name (missing / extra), dtype, shape and the SHA-256 of its data bytes; each differing tensor is
named. A SHA-256 match is a byte-for-byte match of the data.

Exit code: 0 identical, 1 differences found, 2 usage / unreadable input. The last line starts with
IDENTICAL or DIFFERENT, like compare_shards.py's.
"""
import json
import os
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "data", "golden", "tools"))
from digest import describe  # noqa: E402  (one definition of the digest, shared with digest.py)

RANK_FILE = re.compile(r"^model-(rank-(\d+)|pp-(\d+)-tp-(\d+))-part-\d+\.safetensors$")


def rank_label(name):
    """The rank a part file belongs to (`rank0`, `pp1-tp0`), or None for a side file."""
    m = RANK_FILE.match(name)
    if not m:
        return None
    return f"rank{int(m.group(2))}" if m.group(2) is not None else f"pp{int(m.group(3))}-tp{int(m.group(4))}"


def pool(files):
    """{file name: described file} -> {rank label: {tensor name: tensor}}, parts pooled."""
    ranks = {}
    for name, d in files.items():
        label = rank_label(name)
        if label is None:
            continue
        for t in d["tensors"]:
            if t["name"] in ranks.setdefault(label, {}):
                raise ValueError(f"{name}: {t['name']} also in another part of {label}")
            ranks[label][t["name"]] = t
    return ranks


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    expected_dir, candidate_dir = sys.argv[1], sys.argv[2]
    try:
        with open(os.path.join(expected_dir, "tensors.json")) as f:
            expected = pool(json.load(f)["files"])
        candidate = pool({
            n: describe(os.path.join(candidate_dir, n))
            for n in sorted(os.listdir(candidate_dir)) if rank_label(n)
        })
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not expected:
        print(f"error: {expected_dir}/tensors.json lists no rank file", file=sys.stderr)
        return 2
    problems = []
    n_tensors = n_bytes = 0
    for r in sorted(set(candidate) - set(expected)):
        problems.append(f"[{r}] EXTRA rank in candidate")
    for r in sorted(expected, key=lambda s: [int(x) for x in re.findall(r"\d+", s)]):
        if r not in candidate:
            problems.append(f"[{r}] MISSING rank in candidate")
            continue
        exp, cand = expected[r], candidate[r]
        for k in sorted(set(exp) - set(cand)):
            problems.append(f"[{r}] MISSING in candidate: {k} {exp[k]['dtype']} {exp[k]['shape']}")
        for k in sorted(set(cand) - set(exp)):
            problems.append(f"[{r}] EXTRA in candidate: {k} {cand[k]['dtype']} {cand[k]['shape']}")
        for k in sorted(set(exp) & set(cand)):
            e, c = exp[k], cand[k]
            n_tensors += 1
            if e["dtype"] != c["dtype"]:
                problems.append(f"[{r}] DTYPE {k}: expected {e['dtype']}, candidate {c['dtype']}")
            elif e["shape"] != c["shape"]:
                problems.append(f"[{r}] SHAPE {k}: expected {e['shape']}, candidate {c['shape']}")
            elif e["sha256"] != c["sha256"]:
                problems.append(f"[{r}] BYTES {k} ({e['dtype']} {e['shape']}): SHA-256 differs")
            else:
                n_bytes += e["data_offsets"][1] - e["data_offsets"][0]
    print(f"expected:  {expected_dir}/tensors.json  ({len(expected)} ranks)")
    print(f"candidate: {candidate_dir}  ({len(candidate)} ranks)")
    if problems:
        for p in problems:
            print("  " + p)
        print(f"DIFFERENT: {len(problems)} problem(s)")
        return 1
    print(f"IDENTICAL: {len(expected)} ranks, {n_tensors} tensors, {n_bytes} data bytes "
          "(SHA-256 per tensor)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
