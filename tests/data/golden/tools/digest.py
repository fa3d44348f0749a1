#!/usr/bin/env python3
"""Write the digest form of a golden expected folder (Python standard library only).

    digest.py VLLM_DIR DEST_DIR

VLLM_DIR is a folder real vLLM wrote (`expected/<case>/tp<N>` of the shared golden set). DEST_DIR
gets its side files and oracle_meta_rank*.json unchanged, and instead of the rank files a
`tensors.json`: for each rank file its size and SHA-256, and each tensor's name, dtype, shape, byte
range and SHA-256, in file order. Random weights do not compress, and the repository stays small
enough to travel to a GPU machine (< 64 MiB); a SHA-256 match is a byte-for-byte match.

Mamba2's `A` (F32 tensors named `….A`) is `-exp(A_log)` computed by vLLM's loader with the
device's exp, which no writer off that device can match bit for bit (torch CPU's differs from a
correctly rounded one in ~1 % of inputs; vllm-spec §13.4). For those tensors the digest also keeps
the values, as F32 bit patterns in hex (`f32_bits`), and for their files the SHA-256 of the header
(`header_sha256`): the tests then compare `A` within 1 ulp of vLLM's values and every other byte
exactly.
"""
import hashlib
import json
import os
import re
import shutil
import sys

RANK_FILE = re.compile(r"^model-(rank-\d+|pp-\d+-tp-\d+)-part-\d+\.safetensors$")
# Values computed with the device's exp (Mamba2's A = -exp(A_log)): compared within 1 ulp.
COMPUTED = re.compile(r"\.A$")


def describe(path):
    with open(path, "rb") as f:
        data = f.read()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    base = 8 + n
    tensors = []
    for name, t in header.items():
        if name == "__metadata__":
            continue
        start, end = t["data_offsets"]
        tensor = {
            "name": name,
            "dtype": t["dtype"],
            "shape": t["shape"],
            "data_offsets": [start, end],
            "sha256": hashlib.sha256(data[base + start:base + end]).hexdigest(),
        }
        if COMPUTED.search(name) and t["dtype"] == "F32":
            raw = data[base + start:base + end]
            tensor["f32_bits"] = [raw[i:i + 4][::-1].hex() for i in range(0, len(raw), 4)]
        tensors.append(tensor)
    tensors.sort(key=lambda t: t["data_offsets"][0])
    out = {
        "size": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
        "tensors": tensors,
    }
    if any("f32_bits" in t for t in tensors):
        out["header_sha256"] = hashlib.sha256(data[:base]).hexdigest()
    return out


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    src, dest = sys.argv[1], sys.argv[2]
    os.makedirs(dest, exist_ok=True)
    files = {}
    for name in sorted(os.listdir(src)):
        path = os.path.join(src, name)
        if not os.path.isfile(path):
            continue
        if RANK_FILE.match(name):
            files[name] = describe(path)
        else:
            shutil.copyfile(path, os.path.join(dest, name))
    if not files:
        sys.exit(f"{src}: no rank files")
    out = {
        "source": "the rank files real vLLM 0.33.0 wrote (tests/data/golden/tools/digest.py)",
        "files": files,
    }
    with open(os.path.join(dest, "tensors.json"), "w") as f:
        f.write(render(out))


def render(out):
    """JSON with one tensor per line: small, and a diff names the tensor that changed."""
    lines = ["{", f' "source": {json.dumps(out["source"])},', ' "files": {']
    names = list(out["files"])
    for i, name in enumerate(names):
        d = out["files"][name]
        header = f', "header_sha256": {json.dumps(d["header_sha256"])}' if "header_sha256" in d else ""
        lines.append(f'  {json.dumps(name)}: {{"size": {d["size"]}, "sha256": {json.dumps(d["sha256"])}{header}, "tensors": [')
        rows = [f'   {json.dumps(t)}' for t in d["tensors"]]
        lines.append(",\n".join(rows))
        lines.append("  ]}" + ("," if i + 1 < len(names) else ""))
    lines.append(" }")
    lines.append("}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
