#!/usr/bin/env python3
"""Writes the `vllm serve` options and load formats of the installed vLLM as the docs tests' vllm
stand-in reads them (tests/data/docs/vllm-*-serve-flags.txt, vllm-*-load-formats.txt):

    VLLM_TARGET_DEVICE=cpu VENV/bin/python tools/vllm_serve_flags.py tests/data/docs

Run it with each new vLLM the project follows, and rename the files for its version."""
import os
import re
import subprocess
import sys

import vllm
from vllm.model_executor.model_loader import _LOAD_FORMAT_TO_MODEL_LOADER

out_dir = sys.argv[1]
version = ".".join(vllm.__version__.split(".")[:2])
vllm_bin = os.path.join(os.path.dirname(sys.executable), "vllm")
help_text = subprocess.run([vllm_bin, "serve", "--help=all"], capture_output=True, text=True,
                           check=True).stdout
lines = []
for line in help_text.splitlines():
    if not re.match(r"^  -", line):
        continue
    spec = re.split(r"\s{2,}", line.strip())[0]
    names, value = [], None
    for part in re.split(r", (?=-)", spec):
        m = re.match(r"^(-[-\w.]+)(?: (.+))?$", part)
        if not m:
            raise SystemExit(f"cannot parse {line!r}")
        names.append(m.group(1))
        value = value or m.group(2)
    if "-h" in names:
        continue
    if value:
        choices = ""
        if re.fullmatch(r"\{[^}]*\}", value):
            choices = value[1:-1]
        elif re.fullmatch(r"\['.*'\]", value):
            choices = ",".join(re.findall(r"'([^']*)'", value))
        lines.append(" ".join(names) + "\t=" + choices + ("\t..." if value.endswith("...]") else ""))
    else:
        lines.append(" ".join(names))
with open(os.path.join(out_dir, f"vllm-{version}-serve-flags.txt"), "w") as f:
    f.write(f"# `vllm serve --help=all` of vLLM {vllm.__version__} (VLLM_TARGET_DEVICE=cpu), one option a line: its names,\n"
            "# then a tab and `=` when it takes a value, followed by its choices when argparse has a fixed list\n"
            "# (and a tab and `...` when it takes one or more values). Written by tools/vllm_serve_flags.py.\n")
    f.write("\n".join(lines) + "\n")
with open(os.path.join(out_dir, f"vllm-{version}-load-formats.txt"), "w") as f:
    f.write(f"# The load formats vLLM {vllm.__version__} registers (vllm/model_executor/model_loader/__init__.py,\n"
            "# _LOAD_FORMAT_TO_MODEL_LOADER); a plugin adds its own (wload's: `wload`). Written by\n"
            "# tools/vllm_serve_flags.py.\n")
    f.write("\n".join(_LOAD_FORMAT_TO_MODEL_LOADER) + "\n")
