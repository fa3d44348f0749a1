"""Ctrl-C during `wload.plan("org/name")` while the checkpoint downloads from the hub: the call
raises KeyboardInterrupt at once, not when the download ends (hours for a real model). A local
hub (the endpoints wload calls: the repo's file list, and `resolve` with ETag, X-Repo-Commit and
Range) sends the safetensors files slowly, or stops sending half-way; a child process plans from
it and is sent SIGINT. What arrived stays in the cache's partial files, and the next run resumes
from there and plans.
"""

import hashlib
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
FIXTURE = os.path.join(REPO, "tests", "data", "golden", "fixtures", "llama_gqa")
REPO_ID = "org/llama"
SHA = "0123456789abcdef0123456789abcdef01234567"


class Hub(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, mode):
        super().__init__(("127.0.0.1", 0), Handler)
        # "slow": 1 KiB every 50 ms; "stall": half of each file, then silence; "fast".
        self.mode = mode
        self.files = {n: open(os.path.join(FIXTURE, n), "rb").read() for n in os.listdir(FIXTURE)}
        self.sending = threading.Event()
        self.ranges = []

    @property
    def url(self):
        return f"http://127.0.0.1:{self.server_address[1]}"


class Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def do_HEAD(self):
        self.answer(head=True)

    def do_GET(self):
        self.answer(head=False)

    def answer(self, head):
        hub = self.server
        listing = f"/api/models/{REPO_ID}/revision/"
        if self.path.startswith(listing):
            body = json.dumps({"id": REPO_ID, "sha": SHA,
                               "siblings": [{"rfilename": f} for f in sorted(hub.files)]}).encode()
            return self.send(200, {"Content-Type": "application/json"}, body, head)
        prefix = f"/{REPO_ID}/resolve/"
        if not self.path.startswith(prefix):
            return self.send(404, {"X-Error-Code": "RepoNotFound"}, b"{}", head)
        name = self.path[len(prefix):].split("/", 1)[1].split("?")[0]
        data = hub.files.get(name)
        if data is None:
            return self.send(404, {"X-Error-Code": "EntryNotFound"}, b"{}", head)
        headers = {"ETag": '"%s"' % hashlib.sha256(data).hexdigest(), "X-Repo-Commit": SHA,
                   "Accept-Ranges": "bytes", "Content-Type": "application/octet-stream"}
        start, status = 0, 200
        rng = self.headers.get("Range")
        if rng and not head:
            hub.ranges.append((name, rng))
            start = int(rng.split("=")[1].split("-")[0])
            status = 206
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        body = data[start:]
        if head or not name.endswith(".safetensors") or hub.mode == "fast":
            return self.send(status, headers, body, head)
        self.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()
        try:
            if hub.mode == "stall":
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                hub.sending.set()
                time.sleep(120)
                return
            for i in range(0, len(body), 1024):
                self.wfile.write(body[i:i + 1024])
                self.wfile.flush()
                hub.sending.set()
                time.sleep(0.05)
        except OSError:
            pass  # the client went away

    def send(self, status, headers, body, head):
        self.send_response(status)
        for k, v in {**headers, "Content-Length": str(len(body))}.items():
            self.send_header(k, v)
        self.end_headers()
        if not head:
            self.wfile.write(body)


CHILD = """
import json, sys, time
import wload
t = time.monotonic()
try:
    plan = wload.plan(sys.argv[1], tp=2)
except KeyboardInterrupt:
    print(json.dumps({"interrupted": True}), flush=True)
    sys.exit(0)
print(json.dumps({"interrupted": False, "tensors": len(plan.tensors(0))}), flush=True)
"""


def env_for(hub, home):
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update(HF_HOME=str(home), HF_ENDPOINT=hub.url, HF_HUB_DOWNLOAD_TIMEOUT="60",
               HF_HUB_ETAG_TIMEOUT="60")
    return env


def plan_in_child(hub, home):
    return subprocess.Popen([sys.executable, "-c", CHILD, REPO_ID], env=env_for(hub, home),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.fixture
def hub_of():
    started = []

    def start(mode):
        hub = Hub(mode)
        threading.Thread(target=hub.serve_forever, daemon=True).start()
        started.append(hub)
        return hub

    yield start
    for hub in started:
        hub.shutdown()
        hub.server_close()


def partial_files(home):
    blobs = os.path.join(home, "hub", "models--org--llama", "blobs")
    return {f: os.path.getsize(os.path.join(blobs, f)) for f in os.listdir(blobs) if f.endswith(".part")}


@pytest.mark.parametrize("mode", ["slow", "stall"])
def test_ctrl_c_during_a_download_raises_at_once_and_the_next_run_resumes(hub_of, tmp_path, mode):
    hub = hub_of(mode)
    child = plan_in_child(hub, tmp_path)
    assert hub.sending.wait(30), "the download never started"
    time.sleep(0.3)
    child.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = child.communicate(timeout=30)
    took = time.monotonic() - sent
    assert child.returncode == 0, err
    assert json.loads(out) == {"interrupted": True}
    # A slow download stops at its next read; one the network holds up is left behind after 1 s.
    assert took < 3, f"KeyboardInterrupt came {took:.1f} s after Ctrl-C"

    kept = partial_files(tmp_path)
    assert kept and all(n > 0 for n in kept.values()), kept

    hub.mode = "fast"
    again = plan_in_child(hub, tmp_path)
    out, err = again.communicate(timeout=60)
    assert again.returncode == 0, err
    assert json.loads(out)["interrupted"] is False
    assert json.loads(out)["tensors"] > 0
    resumed = [r for _, r in hub.ranges if r != "bytes=0-"]
    assert resumed, f"no download resumed from its partial file: {hub.ranges}"
