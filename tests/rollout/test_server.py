"""The trainer's HTTP API and client, on simulated sessions; kill -9 and restart lose nothing."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import httpx
import pytest
from click.testing import CliRunner

from polar.cli.rollout import status as status_command
from polar.mitm.proxy import free_port
from polar.rollout.client import RolloutClient
from polar.rollout.server import check_binding
from polar.rollout.state import RolloutState
from polar.rollout.tasks import TaskSpec
from tests.rollout.conftest import ApiServer


def sim_task(task_id: str, samples: int, **sim) -> TaskSpec:
    return TaskSpec(id=task_id, instruction="x", samples=samples, timeout=100, metadata={"sim": sim})


def test_submit_stream_ack_status_cancel_pause_resume(tmp_path):
    with ApiServer(tmp_path / "r.db", running_slots=2) as server, RolloutClient(server.url) as client:
        assert client.health()
        accepted = client.submit([sim_task("fast", 3, run=1, reward=0.5), sim_task("slow", 2, run=5000)])
        assert [len(a["sessions"]) for a in accepted] == [3, 2]
        stream = client.results(follow=True)
        got = [next(stream) for _ in range(3)]
        assert sorted(r.session_id for _, r in got) == sorted(accepted[0]["sessions"])
        assert {r.reward for _, r in got} == {0.5}
        assert client.cancel("slow") == 2
        _, late = next(stream)
        stream.close()
        assert late.task_id == "slow" and late.outcome == "cancelled"
        with pytest.raises(RuntimeError, match="404"):
            client.cancel("nope")

        paused = client.pause(policy_version=3, drain_timeout=1)
        assert paused == {"paused": True, "in_flight_calls": 0, "policy_version": 3}
        client.submit([sim_task("after-pause", 1, run=1)])
        time.sleep(0.3)
        status = client.status()
        assert status["paused"] and status["nodes"][0]["running"] == 0
        assert client.resume(policy_version=4) == {"paused": False, "policy_version": 4}
        _, result = next(r for r in client.results(follow=True) if r[1].task_id == "after-pause")
        assert result.policy_version == 4  # results carry the version they ran under

        status = client.status()
        assert status["stages"].get("done", 0) >= 5 and status["outcomes"]["ok"] == 4
        everything = list(client.results(follow=False, ack=False, include_drained=True))  # ends by itself
        assert len(everything) == 6 and [s for s, _ in everything] == sorted(s for s, _ in everything)
        printed = CliRunner().invoke(status_command, ["--server", server.url])
        assert printed.exit_code == 0 and json.loads(printed.output)["policy_version"] == 4


def test_bad_requests_are_clean_400s(tmp_path):
    with ApiServer(tmp_path / "r.db") as server:
        for body in (b"not json", b"[1]", b'{"tasks": [{"samples": 2}]}', b'{"tasks": "x"}'):
            reply = httpx.post(f"{server.url}/tasks", content=body)
            assert reply.status_code == 400 and reply.json()["error"], body
        assert httpx.post(f"{server.url}/results/ack", json={"seqs": ["a"]}).status_code == 400
        assert httpx.post(f"{server.url}/pause", json={"policy_version": "v2"}).status_code == 400
        httpx.post(f"{server.url}/tasks", json={"tasks": [{"id": "dup", "instruction": "x"}]}).raise_for_status()
        batch = {"tasks": [{"id": "fresh", "instruction": "x"}, {"id": "dup", "instruction": "x"}]}
        again = httpx.post(f"{server.url}/tasks", json=batch)
        assert again.status_code == 400 and "already submitted or repeated: dup" in again.json()["error"]
        assert httpx.get(f"{server.url}/status").json()["tasks"] == 1  # all or nothing


def test_beyond_loopback_needs_a_token(tmp_path):
    with pytest.raises(ValueError, match="requires a token"):
        check_binding("0.0.0.0", None)
    check_binding("::1", None)
    with ApiServer(tmp_path / "r.db", token="s3cret") as server:
        assert httpx.get(f"{server.url}/status").status_code == 401
        assert httpx.get(f"{server.url}/status", headers={"authorization": "Bearer wrong"}).status_code == 401
        assert httpx.get(f"{server.url}/health").status_code == 200
        with RolloutClient(server.url, token="s3cret") as client:
            assert client.status()["tasks"] == 0


def start_cli_server(state: str, port: int) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "polar.cli.rollout", "rollout", "serve", "--simulate", "0.01",
                             "--state", state, "--port", str(port), "--running", "2"], stdout=subprocess.DEVNULL)
    client = RolloutClient(f"http://127.0.0.1:{port}")
    for _ in range(300):
        if client.health():
            return proc
        time.sleep(0.05)
    proc.kill()
    raise RuntimeError("rollout serve did not start")


def test_kill_and_restart_loses_no_finished_result(tmp_path):
    state, port = str(tmp_path / "r.db"), free_port()
    proc = start_cli_server(state, port)
    try:
        client = RolloutClient(f"http://127.0.0.1:{port}")
        (accepted,) = client.submit([sim_task("group", 8, run=40)])  # 0.4 s each, 2 at a time
        stream = client.results(follow=True)
        _, first = next(stream)  # consumed and (on the next step) acknowledged
        next(stream)
        stream.close()
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        before = RolloutState(state).results(undrained_only=False)
        undrained = {r.session_id for _, r in RolloutState(state).results(undrained_only=True)}
        assert len(before) >= 2 and first.session_id in {r.session_id for _, r in before}
        assert first.session_id not in undrained  # acknowledged before the kill: not served again

        proc = start_cli_server(state, port)
        seen = {r.session_id: r for _, r in before}
        restreamed = set()
        for _, result in client.results(follow=True, ack=False):
            restreamed.add(result.session_id)
            seen.setdefault(result.session_id, result)
            if len(seen) == 8 and undrained <= restreamed:
                break
        assert sorted(seen) == sorted(accepted["sessions"])
        assert all(r.outcome == "ok" for r in seen.values())
        assert first.session_id not in restreamed
    finally:
        proc.kill()
        proc.wait()
