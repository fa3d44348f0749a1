#!/usr/bin/env python3
"""Compare a folder of per-rank safetensors files (a vLLM reload dump, or a wload output) with a
golden case kept in digest form: `tensors.json`, written by tests/data/golden/tools/digest.py from
the rank files real vLLM wrote (Python standard library only).

    python tools/compare_digest.py EXPECTED_DIR CANDIDATE_DIR [--written WLOAD_OUT]

EXPECTED_DIR holds `tensors.json` (tests/data/golden/expected/<case>/tp<N>), or vLLM's rank files
themselves (described here the same way). The candidate's rank
files are described with digest.py's own `describe` (same SHA-256 over the same data bytes), then
compared rank by rank with the tensors of every part pooled, as `compare_shards.py --ignore-parts`
does: a reload dump is written as one part per rank whatever vLLM's part boundaries were. Per tensor:
name (missing / extra), dtype, shape and the SHA-256 of its data bytes; each differing tensor is
named. A SHA-256 match is a byte-for-byte match of the data.

The one exception is Mamba2's `A` (F32 tensors named `….A`, whose values the digest keeps as
`f32_bits`): vLLM computes it as `-exp(A_log)` with the loading device's exp, wload writes the
correctly rounded value, and vLLM's sharded_state loader copies the file's value verbatim (vllm-spec
§13.4). So each element must be within 1 ulp of vLLM's own, and with `--written WLOAD_OUT` (the
folder wload wrote, which the candidate is vLLM's reload of) the candidate's `A` must be exactly
the written file's: vLLM serves wload's `A`, which differs from its own by at most 1 ulp. The
summary says how many elements are 1 ulp apart.

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


def described(folder):
    """The rank files of `folder`, described as digest.py describes them, pooled by rank."""
    return pool({
        n: describe(os.path.join(folder, n))
        for n in sorted(os.listdir(folder)) if rank_label(n)
    })


def ulps(a, b):
    """How many F32 ulps apart two bit patterns (hex) are, counting across zero."""
    def ordered(h):
        x = int(h, 16)
        return -(x & 0x7FFFFFFF) if x >> 31 else x
    return abs(ordered(a) - ordered(b))


def main():
    args = sys.argv[1:]
    written_dir = None
    if len(args) == 4 and args[2] == "--written":
        written_dir = args[3]
        args = args[:2]
    if len(args) != 2:
        sys.exit(__doc__)
    expected_dir, candidate_dir = args
    try:
        digest = os.path.join(expected_dir, "tensors.json")
        if os.path.exists(digest):
            with open(digest) as f:
                expected = pool(json.load(f)["files"])
        else:
            expected = described(expected_dir)
        candidate = described(candidate_dir)
        written = described(written_dir) if written_dir else None
    except (OSError, ValueError, KeyError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not expected:
        print(f"error: {expected_dir}/tensors.json lists no rank file", file=sys.stderr)
        return 2
    problems = []
    n_tensors = n_bytes = 0
    computed = [0, 0]  # elements of computed tensors, of which 1 ulp from vLLM's
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
            elif "f32_bits" in e:
                problems.extend(compare_computed(r, k, e, c, written))
                computed[0] += len(e["f32_bits"])
                computed[1] += sum(ulps(x, y) == 1 for x, y in zip(e["f32_bits"], c["f32_bits"]))
            elif e["sha256"] != c["sha256"]:
                problems.append(f"[{r}] BYTES {k} ({e['dtype']} {e['shape']}): SHA-256 differs")
            else:
                n_bytes += e["data_offsets"][1] - e["data_offsets"][0]
    source = "tensors.json" if os.path.exists(os.path.join(expected_dir, "tensors.json")) else "rank files"
    print(f"expected:  {expected_dir} ({source}, {len(expected)} ranks)")
    print(f"candidate: {candidate_dir}  ({len(candidate)} ranks)")
    if problems:
        for p in problems:
            print("  " + p)
        print(f"DIFFERENT: {len(problems)} problem(s)")
        return 1
    note = ""
    if computed[0]:
        note = (f"; computed A: {computed[1]} of {computed[0]} elements 1 ulp from vLLM's own "
                "-exp(A_log), the rest equal"
                + (", and every A exactly the written file's" if written is not None else ""))
    print(f"IDENTICAL: {len(expected)} ranks, {n_tensors} tensors, {n_bytes} data bytes "
          f"(SHA-256 per tensor){note}")
    return 0


def compare_computed(r, k, e, c, written):
    """Problems with computed tensor `k` of rank `r`: an element more than 1 ulp from vLLM's
    (`e`), or, given the written output, a candidate value other than the file's."""
    out = []
    bad = [i for i, (x, y) in enumerate(zip(e["f32_bits"], c["f32_bits"])) if ulps(x, y) > 1]
    if len(e["f32_bits"]) != len(c["f32_bits"]) or bad:
        out.append(f"[{r}] VALUES {k}: elements {bad} more than 1 ulp from vLLM's")
    if written is not None:
        w = written.get(r, {}).get(k)
        if w is None or w.get("f32_bits") != c["f32_bits"]:
            out.append(f"[{r}] VALUES {k}: the reloaded values are not the written file's")
    return out


if __name__ == "__main__":
    sys.exit(main())
