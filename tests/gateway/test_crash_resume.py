"""A gateway killed (SIGKILL) in the middle of a session and started again on the same capture database:
the session goes on token-faithful, its next prompts extending the earlier prompt + sampled ids exactly,
for all four provider APIs. The state is rebuilt from the database on the session's next call."""

from __future__ import annotations

import signal
import threading
import time
import uuid

import httpx
import pytest

from polar.capture.reader import CaptureReader
from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port
from polar.trajectories.drift import drift_report
from tests.e2e.sessions import DRIVERS, TURNS, script_steps

pytestmark = pytest.mark.slow  # outside scripts/test_fast: processes killed and restarted, or many started

KILL_AFTER = (1, 4, 8)  # turns after which the gateway is killed and restarted


def _restart(proxy: SubprocessProxy) -> None:
    proxy.proc.send_signal(signal.SIGKILL)
    proxy.proc.wait(10)
    proxy.start()


@pytest.mark.parametrize("provider", list(DRIVERS))
def test_a_session_survives_sigkill_between_turns_token_for_token(double_server, tokenizer_dir, tmp_path, provider):
    _, upstream = double_server
    httpx.post(f"{upstream}/_double/script",
               json={"rules": [{"match": "[session:tf]", "steps": script_steps(True)}]}).raise_for_status()
    db = tmp_path / "captures.db"
    proxy = SubprocessProxy(ProxyConfig(upstream=upstream, db=str(db), port=free_port(), tokenizer=str(tokenizer_dir)))
    proxy.start()
    session = f"crash-{provider}-{uuid.uuid4().hex[:6]}"
    try:
        DRIVERS[provider](proxy.url, session, True, between=lambda turn: turn in KILL_AFTER and _restart(proxy))
    finally:
        proxy.stop()
    rows = list(CaptureReader(db).calls(session=session))
    assert len(rows) == TURNS and all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    for prev, row in zip(rows, rows[1:]):
        assert row["prompt_mode"].startswith("token-faithful"), (row["id"], row["prompt_mode"])
        full = prev["prompt_ids"] + prev["completion_ids"]
        assert row["prompt_ids"][: len(full)] == full  # no sampled id re-encoded, across the kills too
        assert row["prompt_parent"] == prev["id"]  # and stored linearly against it
        # the message list, stored against the previous row's (a whole list after each restart), reads back
        # as the history the harness re-sent
        assert row["canonical"]["messages"][: len(prev["canonical"]["messages"])] == prev["canonical"]["messages"]
    (drift,) = drift_report(rows)
    assert drift.trajectories == 1 and drift.breaks == []
    assert drift.carried_tokens > 0 and drift.reappeared_fraction == 1.0  # 100 % of sampled tokens carried


def test_a_call_in_flight_when_the_gateway_dies_is_marked_interrupted(double_server, tokenizer_dir, tmp_path):
    """The harness's call fails (connection dropped); the restarted gateway marks its row interrupted and the
    session's retry goes on token-faithful from the last committed turn."""
    _, upstream = double_server
    steps = script_steps(False)
    httpx.post(f"{upstream}/_double/script", json={"rules": [{"match": "[session:tf]", "steps": steps}]}).raise_for_status()
    db = tmp_path / "captures.db"
    proxy = SubprocessProxy(ProxyConfig(upstream=upstream, db=str(db), port=free_port(), tokenizer=str(tokenizer_dir)))
    proxy.start()
    session = f"inflight-{uuid.uuid4().hex[:6]}"
    killed = threading.Event()

    def kill_mid_call(turn: int) -> None:
        if turn != 1:
            return
        httpx.post(f"{upstream}/_double/fault", json={"mode": "timeout", "seconds": 3, "count": 1}).raise_for_status()

        def kill():
            time.sleep(1.0)  # the next call is waiting on the slow upstream
            proxy.proc.send_signal(signal.SIGKILL)
            killed.set()

        threading.Thread(target=kill, daemon=True).start()

    from tests.e2e.sessions import drive_chat

    with pytest.raises(Exception):  # the SDK's retries meet a dead gateway
        drive_chat(proxy.url, session, False, turns=3, between=kill_mid_call)
    assert killed.wait(5)
    proxy.proc.wait(10)
    proxy.start()
    try:
        drive_chat(proxy.url, session, False, turns=4)  # the harness starts the session over
    finally:
        proxy.stop()
    rows = list(CaptureReader(db).calls(session=session))
    assert [r["status"] for r in rows[:3]] == ["ok", "ok", "interrupted"]
    assert all(r["status"] == "ok" for r in rows[3:])
