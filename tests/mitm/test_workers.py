"""`polar proxy --workers 2`: real processes (haproxy front, two gateway workers) on loopback sockets.

Many sessions — named by `/s/<id>/` prefix, by the session header, by API key, by client address
(127.0.0.x sources) — call concurrently through the one front address: each session's calls land in
exactly one worker's shard, both shards are used, a session's later turn reuses its earlier turns'
exact ids (the worker holds its state), a stream passes through the front as it is sampled, every
reader command sees the shard set, and a killed worker is reported and stops the whole set.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from itertools import pairwise
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from polar.capture.reader import CaptureReader
from polar.capture.shards import SHARD_ID_SPAN, open_captures, shard_path
from polar.cli import main
from polar.mitm.proxy import free_port
from polar.supervise.front import CLIENT_ADDR_HEADER, haproxy_binary

REPO = Path(__file__).resolve().parents[2]
TURNS = 3
MAX_BODY = 1_000_000
LONG_TEXT = " ".join(f"word{i}" for i in range(100))  # ≈ 200 tokens: ~2 s at 10 ms a token


@pytest.fixture(scope="module")
def haproxy_ready() -> None:
    """haproxy is required (scripts/setup_haproxy.sh); only POLAR_SKIP_HAPROXY=1 skips these tests."""
    if haproxy_binary() is None:
        if os.environ.get("POLAR_SKIP_HAPROXY") == "1":
            pytest.skip("POLAR_SKIP_HAPROXY=1 and no haproxy on PATH")
        pytest.fail("no haproxy on PATH: run scripts/setup_haproxy.sh (or set POLAR_SKIP_HAPROXY=1)", pytrace=False)


class WorkerProxy:
    """`polar proxy --workers 2` as a child process; its banner names the workers' pids."""

    def __init__(self, upstream: str, db: Path, *args: str):
        self.db, self.port = db, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "polar.cli", "proxy", "--workers", "2", "--upstream", upstream, "--db", str(db),
               "--port", str(self.port), "--set", "polar_upstream_timeout=60", "--set", "polar_stream_keepalive=1",
               *args]
        self.log = db.with_name("stderr.log")  # a file, not a pipe: a pipe nobody reads would block the workers
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO,
                                         env={**os.environ, "PYTHONPATH": str(REPO)})
        self.pids: dict[str, int] = {}
        for line in self.proc.stdout:  # the banner: one line per worker, then the front's
            if ": pid " in line:
                name, rest = line.strip().split(": pid ", 1)
                self.pids[name] = int(rest.split(",", 1)[0])
            if line.strip().startswith("front"):
                break
        assert set(self.pids) == {"worker 0", "worker 1", "front (haproxy)"}, self.stderr()

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)  # a Ctrl-C: the supervisor stops the set, exit 0
            self.proc.wait(timeout=60)

    def gone(self) -> bool:
        """Every child of the set has exited (a zombie is exited too)."""
        return all(not Path(f"/proc/{pid}").exists() or _zombie(pid) for pid in self.pids.values())


@pytest.fixture(scope="module")
def workers(haproxy_ready, double_server, tokenizer_dir, tmp_path_factory):
    _, upstream = double_server
    proxy = WorkerProxy(upstream, tmp_path_factory.mktemp("workers") / "captures.db", "--tokenizer", str(tokenizer_dir),
                        "--set", f"polar_max_body={MAX_BODY}")
    yield proxy
    proxy.stop()
    assert proxy.proc.returncode == 0, proxy.stderr()
    assert proxy.gone() and "polar:" not in proxy.stderr()  # nothing reported as dead


# -- a session: turns that grow the conversation, named one of four ways -------------------------------


def session_client(url: str, how: str, name: str, index: int) -> tuple[httpx.Client, str]:
    """A client and the base URL whose calls belong to one session named `how`."""
    if how == "path":
        return httpx.Client(timeout=60), f"{url}/s/{name}"
    if how == "header":
        return httpx.Client(timeout=60, headers={"x-polar-session": name}), url
    if how == "key":
        return httpx.Client(timeout=60, headers={"authorization": f"Bearer sk-{name}"}), url
    # The client address: a source of its own on the loopback net (the front forwards it to the worker,
    # overwriting whatever address the client claims).
    transport = httpx.HTTPTransport(local_address=f"127.0.0.{10 + index}")
    return httpx.Client(timeout=60, transport=transport, headers={CLIENT_ADDR_HEADER: "203.0.113.9"}), url


def run_session(url: str, how: str, name: str, index: int) -> list[tuple[str, str, bool]]:
    """TURNS turns, each with a side call in parallel (a harness's title or summary call): every call's
    (session polar named, call id, main line or side)."""
    client, base = session_client(url, how, name, index)
    messages = [{"role": "user", "content": f"Hello from {name}."}]
    seen = []
    with client, ThreadPoolExecutor(2) as pool:
        for turn in range(TURNS):
            side = pool.submit(client.post, f"{base}/v1/chat/completions", json={
                "model": "m", "max_tokens": 16, "messages": [{"role": "user", "content": f"Title {name} {turn}"}]})
            resp = client.post(f"{base}/v1/chat/completions", json={"model": "m", "max_tokens": 32, "messages": messages})
            for r, main_line in ((resp, True), (side.result(), False)):
                assert r.status_code == 200, r.text
                seen.append((r.headers["x-polar-session"], r.headers["x-polar-call-id"], main_line))
            messages += [resp.json()["choices"][0]["message"], {"role": "user", "content": f"And turn {turn + 1}?"}]
    return seen


SESSIONS = [(how, f"{how}-{i}", i) for how in ("path", "header", "key", "address") for i in range(6)]


def test_every_session_stays_on_one_worker_and_keeps_its_ids(workers):
    with ThreadPoolExecutor(len(SESSIONS)) as pool:
        done = list(pool.map(lambda s: run_session(workers.url, *s), SESSIONS))
    shards = [CaptureReader(shard_path(workers.db, i)) for i in range(2)]
    rows = [{r["call_id"]: r for r in shard.calls()} for shard in shards]
    used = set()
    for (how, name, index), calls in zip(SESSIONS, done):
        named = {session for session, _, _ in calls}
        assert len(named) == 1, (name, named)  # one client, one session
        (session,) = named
        if how in ("path", "header"):
            assert session == name
        elif how == "address":
            assert session == f"addr-127.0.0.{10 + index}"  # the client's own address, not the front's
        holders = {i for i, shard in enumerate(rows) for _, call_id, _ in calls if call_id in shard}
        assert len(holders) == 1, (name, holders)  # every call of the session in one shard
        (shard,) = holders
        used.add(shard)
        mine = [rows[shard][call_id] for _, call_id, main_line in calls if main_line]
        assert all(r["session_id"] == session and r["status"] == "ok" for r in mine)
        assert SHARD_ID_SPAN * (shard + 1) < min(r["id"] for r in mine) < SHARD_ID_SPAN * (shard + 2)
        for prev, row in pairwise(mine):  # the worker kept the session's exact ids across turns
            assert row["prompt_mode"].startswith("token-faithful"), row["prompt_mode"]
            full = prev["prompt_ids"] + prev["completion_ids"]
            assert row["prompt_ids"][: len(full)] == full
    assert used == {0, 1}, "the front sent every session to one worker"


def test_readers_see_every_shard(workers):
    def per_shard() -> list[list[dict]]:
        return [list(CaptureReader(shard_path(workers.db, i)).calls(with_tokens=False)) for i in range(2)]

    # Sessions until both workers hold one: the front hashes each session's name onto a worker, and which
    # names land where is haproxy's to say (any two may share one).
    for i in range(32):
        httpx.post(f"{workers.url}/s/reader-{i}/v1/chat/completions", timeout=60,
                   json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": f"r{i}"}]})
        if i and all(per_shard()):
            break
    per_shard = per_shard()
    merged = list(open_captures(workers.db).calls(with_tokens=False))
    assert len(merged) == sum(map(len, per_shard)) and all(per_shard)
    assert len({r["id"] for r in merged}) == len(merged)  # row ids name one call across the set

    listed = CliRunner().invoke(main, ["captures", "--db", str(workers.db), "--json"])
    assert listed.exit_code == 0, listed.output
    assert {json.loads(line)["call_id"] for line in listed.output.splitlines()} == {r["call_id"] for r in merged}
    built = CliRunner().invoke(main, ["trajectories", "--db", str(workers.db)])
    assert built.exit_code == 0, built.output
    assert f"{len({r['session_id'] for r in merged})} sessions, {len(merged)} calls" in built.output


def test_a_stream_passes_through_the_front_as_it_is_sampled(workers, double_server):
    _, upstream = double_server
    httpx.post(f"{upstream}/_double/script", json={"steps": [{"content": LONG_TEXT}]}).raise_for_status()
    httpx.post(f"{upstream}/_double/pace", json={"token_delay_s": 0.01}).raise_for_status()
    body = {"model": "m", "max_tokens": 4096, "stream": True, "messages": [{"role": "user", "content": "Talk."}]}
    started, arrivals, text = time.monotonic(), [], ""
    with httpx.stream("POST", f"{workers.url}/s/streamer/v1/chat/completions", json=body, timeout=60) as resp:
        assert resp.status_code == 200 and resp.headers["content-type"].startswith("text/event-stream")
        for line in resp.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"].get("content") or ""
                if delta:
                    arrivals.append(time.monotonic() - started)
                    text += delta
    assert text.strip() == LONG_TEXT
    assert arrivals[0] <= 0.3 * arrivals[-1], f"first text at {arrivals[0]:.2f} s of {arrivals[-1]:.2f} s"
    spread = sum(b - a > 0.005 for a, b in pairwise(arrivals))
    assert spread >= len(arrivals) // 3, "the events came in a few bursts, not as sampled"


def test_oversized_requests_are_answered_and_the_front_keeps_serving(workers):
    url = f"{workers.url}/s/big/v1/chat/completions"
    huge = {"model": "m", "messages": [{"role": "user", "content": "x" * (2 * MAX_BODY)}]}
    too_big = httpx.post(url, json=huge, timeout=60)  # the body streams through the front: polar's own limit
    assert too_big.status_code == 413 and "error" in too_big.json(), too_big.text[:300]
    header = httpx.post(url, json={"model": "m"}, headers={"x-junk": "y" * 80_000}, timeout=60)
    assert header.status_code == 400  # headers past the front's buffer: refused by haproxy, nothing reaches polar
    fine = httpx.post(url, json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]},
                      timeout=60)
    assert fine.status_code == 200, fine.text


def test_a_killed_worker_is_reported_and_stops_the_set(haproxy_ready, double_server, tmp_path):
    _, upstream = double_server
    proxy = WorkerProxy(upstream, tmp_path / "captures.db")
    try:
        os.kill(proxy.pids["worker 1"], signal.SIGKILL)
        code = proxy.proc.wait(timeout=30)
        err = proxy.stderr()
    finally:
        proxy.stop()
    assert code == 1
    assert f"worker 1 (pid {proxy.pids['worker 1']}" in err and "killed by SIGKILL" in err, err
    assert proxy.gone()  # the rest of the set went with it
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", proxy.port), timeout=2).close()


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1].startswith("Z")
    except OSError:
        return True
