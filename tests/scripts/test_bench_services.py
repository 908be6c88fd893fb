"""A benchmark's servers (scripts/benchkit/targets.py Service: upstream, polar, LiteLLM) die with the benchmark,
even one killed outright: left behind, they hold ports and CPU and skew the next run's figures."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# A stand-in benchmark: starts one Service (a plain HTTP server), prints its pid, waits to be killed.
BENCH = """
import sys, time
from pathlib import Path
sys.path.insert(0, {scripts!r})
from benchkit import targets
port = targets.free_port()
server = targets.Service("server", [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                      f"http://127.0.0.1:{{port}}/", Path({log!r})).start()
print(server.proc.pid, flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead but listed until reaped: it holds no port and uses no CPU.
    return Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0] != "Z"


def test_a_killed_benchmark_takes_its_servers_with_it(tmp_path):
    code = BENCH.format(scripts=str(REPO / "scripts"), log=str(tmp_path / "server.log"))
    bench = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        server = int(bench.stdout.readline())
        assert _alive(server)
        bench.send_signal(signal.SIGKILL)
        bench.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _alive(server) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(server), "the server outlived its benchmark"
    finally:
        bench.kill()
