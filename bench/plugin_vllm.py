#!/usr/bin/env python3
"""The vLLM plugin (`--load-format wload`) against vLLM's own loaders, inside real vLLM 0.33 on the
CPU, one process per rank with gloo groups (as tools/vllm_reload.py runs vLLM), all ranks loading
at once, as ratios in one run, at each TP size:

- local folder: wload against vLLM's default loader for a folder (`auto`: safetensors), each run
  after the checkpoint was dropped from the page cache (`echo 3 > /proc/sys/vm/drop_caches` as
  root, else posix_fadvise DONTNEED on its files);
- object storage (the S3-protocol test server, examples/s3_server.rs, on 127.0.0.1, its folder
  dropped from the page cache too): wload from `s3://bench/ckpt` against vLLM's default for an
  object-store model, `runai_streamer` (needs `runai-model-streamer[s3]` importable: `--runai-path
  DIR` puts a `pip install --target DIR` of it first on each rank's sys.path; without it that
  column is left out, said so).

Per rank it measures the loader's `load_weights` (vLLM's BaseModelLoader.load_model calls it
between building the model and post-processing it; model construction is the same for every
loader and left out, and `process_weights_after_loading` is a no-op, as in tools/vllm_reload.py):
its wall time; the bytes the process read from storage in that window (/proc/self/io
`read_bytes`; a byte another rank already brought into the page cache counts nothing); and the
bytes the loader itself took from the checkpoint ("loader": for wload its LoadReport's
`bytes_read`, for vLLM's loaders the bytes of every tensor their weights iterator yielded, before
the weight loaders narrow it to the rank's slice). For the object store also the bytes the
server read from its files while the ranks loaded (its /proc/PID/io `rchar`: what it served).

Usage (VLLM_TARGET_DEVICE=cpu is set here):
  bench/plugin_vllm.py [--tp 2 4] [--dir DIR] [--runai-path DIR] [--server BIN] [--json]
The checkpoint (bench/gen_checkpoint.py: random bf16, Llama-shaped, 3 layers of hidden 2048,
about 380 MiB) is generated into DIR (default /var/tmp/wload-plugin-vllm, kept), which must be on
a block device. `wload` must import (the package installed, or PYTHONPATH=python with a built
extension).
"""

import argparse
import json
import multiprocessing as mp
import os
import shutil
import socket
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from plugin_reads import checkpoint_files, evict, generate  # noqa: E402


def io_field(pid, field):
    with open(f"/proc/{pid}/io") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"/proc/{pid}/io has no {field}")


def drop_caches(paths):
    """The page cache dropped: all of it where we may (root), else `paths`' pages."""
    os.sync()
    try:
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return "drop_caches"
    except OSError:
        evict(paths)
        return "fadvise"


def rank_main(rank, tp, model, load_format, port, runai_path, ready, go, results):
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    if runai_path:
        sys.path.insert(0, runai_path)
    import torch
    import vllm.model_executor.model_loader.base_loader as base_loader
    from vllm.config import set_current_vllm_config
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader import get_model_loader
    from vllm.v1.worker.gpu_worker import init_worker_distributed_environment
    from vllm.v1.worker.workspace import init_workspace_manager

    base_loader.process_weights_after_loading = lambda *a, **k: None
    fetched = []
    if load_format == "wload":
        import wload.vllm_plugin as vp

        fill = vp._fill

        def counted(*a, **k):
            stats, t = fill(*a, **k)
            fetched.append(stats.bytes_read)
            return stats, t

        vp._fill = counted
    engine = EngineArgs(model=model, load_format=load_format, tensor_parallel_size=tp,
                        enforce_eager=True, distributed_executor_backend="mp",
                        skip_tokenizer_init=True)
    config = engine.create_engine_config()
    with set_current_vllm_config(config):
        init_worker_distributed_environment(config, rank, f"tcp://127.0.0.1:{port}", rank,
                                            backend="gloo")
        init_workspace_manager(torch.device("cpu"))
        loader = get_model_loader(config.load_config)
        if hasattr(loader, "_get_weights_iterator"):
            # vLLM's own loaders (default_loader.py:265, runai_streamer_loader.py:225): the bytes
            # of every tensor they take from the checkpoint, before the weight loaders narrow it.
            weights = loader._get_weights_iterator

            def counted_weights(*a, **k):
                n = 0
                for name, t in weights(*a, **k):
                    n += t.numel() * t.element_size()
                    yield name, t
                fetched.append(n)

            loader._get_weights_iterator = counted_weights
        window = {}
        load_weights = loader.load_weights

        def timed(model_, model_config):
            ready.wait()  # every rank built its model; the parent drops the caches
            go.wait()
            window["r0"], window["t0"] = io_field("self", "read_bytes"), time.perf_counter()
            load_weights(model_, model_config)
            window["t1"], window["r1"] = time.perf_counter(), io_field("self", "read_bytes")

        loader.load_weights = timed
        loader.load_model(vllm_config=config, model_config=config.model_config)
    results.put({"rank": rank, "seconds": window["t1"] - window["t0"],
                 "read_bytes": window["r1"] - window["r0"],
                 "loader_bytes": sum(fetched) if fetched else None})
    torch.distributed.destroy_process_group()


def run(tp, model, load_format, drop_paths, runai_path=None, server_pid=None):
    """All `tp` ranks loading `model` at once, cold; per-rank results and the server's bytes."""
    if model.startswith("s3://") and os.environ.get("XDG_CACHE_HOME"):
        # wload's object cache holds the headers and the node cache of the bytes ranks share
        # (resolve/store/node_cache.rs): emptied, so that every run fetches from the store.
        shutil.rmtree(os.path.join(os.environ["XDG_CACHE_HOME"], "wload"), ignore_errors=True)
    ctx = mp.get_context("spawn")
    ready, go, results = ctx.Barrier(tp + 1), ctx.Barrier(tp + 1), ctx.Queue()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [ctx.Process(target=rank_main, args=(r, tp, model, load_format, port, runai_path,
                                                 ready, go, results)) for r in range(tp)]
    for p in procs:
        p.start()
    ready.wait(timeout=900)
    how = drop_caches(drop_paths)
    served0 = io_field(server_pid, "rchar") if server_pid else None
    go.wait(timeout=60)
    ranks = sorted((results.get(timeout=900) for _ in procs), key=lambda r: r["rank"])
    served = io_field(server_pid, "rchar") - served0 if server_pid else None
    for p in procs:
        p.join()
    if any(p.exitcode for p in procs):
        raise RuntimeError(f"{load_format} of {model} at tp {tp}: a rank failed")
    return {"tp": tp, "model": model, "load_format": load_format, "cache": how,
            "seconds": max(r["seconds"] for r in ranks),
            "read_bytes": sum(r["read_bytes"] for r in ranks), "served_bytes": served,
            "ranks": ranks}


def start_server(binary, root, ckpt):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.makedirs(os.path.join(root, "bench"), exist_ok=True)
    proc = subprocess.Popen([binary, "serve", root, str(port)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    time.sleep(1)
    os.environ.update(AWS_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="bench",
                      AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    if not os.path.isdir(os.path.join(root, "bench", "ckpt")):
        subprocess.run([binary, "upload", ckpt, "s3://bench/ckpt"], check=True,
                       stdout=subprocess.DEVNULL)
    return proc


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tp", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--dir", default="/var/tmp/wload-plugin-vllm")
    ap.add_argument("--runai-path", help="a `pip install --target` of runai-model-streamer[s3]")
    ap.add_argument("--server", default=os.path.join(ROOT, "target/release/examples/s3_server"))
    ap.add_argument("--no-s3", action="store_true")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    os.environ["VLLM_TARGET_DEVICE"] = "cpu"
    ckpt = os.path.join(a.dir, "ckpt")
    if not (os.path.isdir(ckpt) and checkpoint_files(ckpt)):
        generate(ckpt)
    files = checkpoint_files(ckpt)
    size = sum(os.path.getsize(p) for p in files)
    server = None
    if not a.no_s3:
        server = start_server(a.server, os.path.join(a.dir, "s3root"), ckpt)
        # wload's object cache (config, index, headers) and vLLM's Run:ai pull inside DIR.
        os.environ["XDG_CACHE_HOME"] = os.path.join(a.dir, "cache")
        os.environ["VLLM_CACHE_ROOT"] = os.path.join(a.dir, "cache", "vllm")
    if a.runai_path:
        # The Run:ai streamer's S3 client: path-style requests to the test server, no instance
        # metadata lookups.
        os.environ.setdefault("RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING", "0")
        os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")
    served_files = [os.path.join(a.dir, "s3root", "bench", "ckpt", os.path.basename(p))
                    for p in files]
    try:
        rows = []
        for tp in a.tp:
            runs = [("local", "auto", ckpt, files, None, None),
                    ("local", "wload", ckpt, files, None, None)]
            if server:
                if a.runai_path:
                    runs.append(("s3", "runai_streamer", "s3://bench/ckpt", served_files,
                                 a.runai_path, server.pid))
                runs.append(("s3", "wload", "s3://bench/ckpt", served_files, None, server.pid))
            for where, fmt, model, paths, runai, pid in runs:
                r = run(tp, model, fmt, paths, runai, pid)
                r["where"] = where
                r["checkpoint_bytes"] = size
                rows.append(r)
                print(json.dumps(r) if a.json else line(r), flush=True)
        if not a.json:
            print(summary(rows, size, bool(server), bool(a.runai_path)))
    finally:
        if server:
            server.kill()


def mib(n):
    return f"{n / 2**20:.1f} MiB"


def line(r):
    ranks = ", ".join(
        f"r{x['rank']} {x['seconds']:.2f}s {mib(x['read_bytes'])}"
        + (f" loader {mib(x['loader_bytes'])}" if x["loader_bytes"] is not None else "")
        for x in r["ranks"])
    served = f", server read {mib(r['served_bytes'])}" if r["served_bytes"] is not None else ""
    return (f"tp {r['tp']} {r['where']:5} {r['load_format']:14} {r['seconds']:6.2f}s "
            f"(slowest rank), storage reads {mib(r['read_bytes'])}{served} [{ranks}] "
            f"({r['cache']})")


def per_rank(r):
    """The mean over ranks of the bytes the loader took from the checkpoint."""
    return sum(x["loader_bytes"] or 0 for x in r["ranks"]) / len(r["ranks"])


def summary(rows, size, s3, runai):
    out = [f"checkpoint {mib(size)}; ratios wload / vLLM's loader (below 1: wload better)"]
    by = {(r["tp"], r["where"], r["load_format"]): r for r in rows}
    for tp in sorted({r["tp"] for r in rows}):
        w, d = by[(tp, "local", "wload")], by[(tp, "local", "auto")]
        out.append(f"tp {tp} local: per-rank loader bytes {per_rank(w) / per_rank(d):.2f}x "
                   f"({mib(per_rank(w))} vs {mib(per_rank(d))})")
        out.append(f"tp {tp} local: time {w['seconds'] / d['seconds']:.2f}x, "
                   f"node storage reads {w['read_bytes'] / max(d['read_bytes'], 1):.2f}x "
                   f"({w['read_bytes'] / size:.2f} vs {d['read_bytes'] / size:.2f} of the "
                   "checkpoint)")
        if s3 and runai:
            w, d = by[(tp, "s3", "wload")], by[(tp, "s3", "runai_streamer")]
            out.append(f"tp {tp} s3:    per-rank loader bytes {per_rank(w) / per_rank(d):.2f}x "
                       f"({mib(per_rank(w))} vs {mib(per_rank(d))})")
            out.append(f"tp {tp} s3:    time {w['seconds'] / d['seconds']:.2f}x, bytes served "
                       f"{w['served_bytes'] / max(d['served_bytes'], 1):.2f}x "
                       f"({w['served_bytes'] / size:.2f} vs {d['served_bytes'] / size:.2f} of "
                       "the checkpoint)")
        elif s3:
            w, d = by[(tp, "s3", "wload")], by[(tp, "local", "auto")]
            out.append(f"tp {tp} s3 (no runai_streamer here: against vLLM's loader from the "
                       f"local folder): time {w['seconds'] / d['seconds']:.2f}x, bytes served "
                       f"{w['served_bytes'] / size:.2f} of the checkpoint")
    return "\n".join(out)


if __name__ == "__main__":
    main()
