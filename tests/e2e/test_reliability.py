"""Capture integrity under load and across a SIGKILL of the proxy.

The second SIGKILL test is the storage path's: sessions whose request bodies grow turn by turn and whose
answers are over bodies.ANSWER_APART (both stored as splices of the session's earlier bodies, in memory
only once committed), streamed and not, killed mid-load twice: every call a client saw answered reads
back byte for byte as sent and as received.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sqlite3
import threading
import time
import uuid

import httpx
import pytest

from polar.capture.bodies import ANSWER_APART
from polar.capture.reader import CaptureReader
from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port

pytestmark = pytest.mark.slow  # outside scripts/test_fast: processes killed and restarted, or many started

BODY = {"model": "claude-x", "max_tokens": 64, "messages": [{"role": "user", "content": "hi"}]}


async def _session(client: httpx.AsyncClient, url: str, session: str, calls: int) -> list[str]:
    ids = []
    messages = list(BODY["messages"])
    for _ in range(calls):
        resp = await client.post(f"{url}/v1/messages", json={**BODY, "messages": messages},
                                 headers={"x-polar-session": session, "x-api-key": "k"})
        assert resp.status_code == 200, resp.text[:300]
        ids.append(resp.headers["x-polar-call-id"])
        messages = messages + [{"role": "assistant", "content": resp.json()["content"]},
                               {"role": "user", "content": "more"}]
    return ids


def test_256_concurrent_sessions_capture_every_call_once(stack):
    stack.script(steps=[{"content": "ok"}])
    prefix = f"load-{uuid.uuid4().hex[:6]}"

    async def run() -> list[str]:
        limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
        async with httpx.AsyncClient(limits=limits, timeout=120) as client:
            results = await asyncio.gather(*(_session(client, stack.url, f"{prefix}-{i}", 2) for i in range(256)))
        return [cid for ids in results for cid in ids]

    call_ids = asyncio.run(run())
    assert len(call_ids) == 512 == len(set(call_ids))
    conn = sqlite3.connect(stack.db)
    rows = conn.execute("SELECT call_id, status FROM calls WHERE session_id LIKE ?", (f"{prefix}-%",)).fetchall()
    assert sorted(r[0] for r in rows) == sorted(call_ids)
    assert {r[1] for r in rows} == {"ok"}
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    # second calls of each session extend their first (linear storage held under concurrency)
    linked = conn.execute("SELECT count(*) FROM calls WHERE session_id LIKE ? AND prompt_parent IS NOT NULL",
                          (f"{prefix}-%",)).fetchone()[0]
    assert linked == 256


def _kill_mid_load(proxy: SubprocessProxy, stop: threading.Event, clients: list[threading.Thread], seconds: float) -> None:
    """Run the clients against the proxy for `seconds`, SIGKILL it, and wait for every client to see it gone."""
    for t in clients:
        t.start()
    time.sleep(seconds)
    os.kill(proxy.proc.pid, signal.SIGKILL)
    stop.set()
    for t in clients:
        t.join(timeout=60)
    proxy.proc.wait(timeout=10)


def test_sigkill_mid_load_keeps_committed_rows_and_marks_the_rest(double_server, tmp_path):
    _, upstream = double_server
    httpx.post(f"{upstream}/_double/script", json={"steps": [{"content": "ok"}]}).raise_for_status()
    db = tmp_path / "captures.db"
    config = ProxyConfig(upstream=upstream, db=str(db), port=free_port())
    proxy = SubprocessProxy(config)
    proxy.start()
    answered: list[str] = []
    stop = threading.Event()

    def client_loop(n: int) -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                try:
                    resp = client.post(f"{proxy.url}/v1/messages", json=BODY, headers={"x-polar-session": f"k{n}"})
                except httpx.HTTPError:
                    return  # the proxy is gone
                if resp.status_code == 200:
                    answered.append(resp.headers["x-polar-call-id"])

    _kill_mid_load(proxy, stop, [threading.Thread(target=client_loop, args=(n,)) for n in range(16)], seconds=3)
    assert len(answered) > 10

    restarted = SubprocessProxy(ProxyConfig(upstream=upstream, db=str(db), port=free_port()))
    restarted.start()  # start-up marks calls left pending by the killed process
    try:
        conn = sqlite3.connect(db)
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        statuses = dict(conn.execute("SELECT status, count(*) FROM calls GROUP BY status").fetchall())
        assert "pending" not in statuses
        rows = {r["call_id"]: r for r in CaptureReader(db).calls()}
        for call_id in answered:  # every answer a client saw was committed first, tokens intact
            row = rows[call_id]
            assert row["status"] == "ok" and row["completion_ids"] and len(row["completion_logprobs"]) == len(
                row["completion_ids"])
        interrupted = [r for r in rows.values() if r["status"] == "interrupted"]
        assert all(r["error_kind"] == "interrupted" for r in interrupted)
    finally:
        restarted.stop()


LONG_ANSWER = " ".join(f"line {i}: the same long answer every turn, as an echo of tools and settings is." for i in range(160))


def _growing_session(url: str, name: str, stream: bool, stop: threading.Event, seen: dict) -> None:
    """Turns of one growing conversation until the proxy dies; `seen[call_id] = (request sent, answer got)`."""
    messages = [{"role": "user", "content": f"start {name}"}]
    with httpx.Client(timeout=60) as client:
        while not stop.is_set():
            body = json.dumps({**BODY, "max_tokens": 4096, "stream": stream, "messages": messages}).encode()
            try:
                resp = client.post(f"{url}/v1/messages", content=body,
                                   headers={"x-polar-session": name, "content-type": "application/json"})
            except httpx.HTTPError:
                return  # the proxy is gone (a stream cut short is no answer)
            if resp.status_code != 200:
                return
            seen[resp.headers["x-polar-call-id"]] = (body, resp.content)
            messages = messages + [{"role": "assistant", "content": LONG_ANSWER},
                                   {"role": "user", "content": f"tool output {len(messages)} " * 40}]
            if len(messages) > 15:  # a fresh session now and then: keyframes as well as splices
                name, messages = f"{name}+", messages[:1]


def test_sigkill_keeps_every_spliced_body_byte_for_byte(double_server, tokenizer_dir, tmp_path):
    _, upstream = double_server
    httpx.post(f"{upstream}/_double/script", json={"steps": [{"content": LONG_ANSWER}]}).raise_for_status()
    db = tmp_path / "captures.db"
    seen: dict[str, tuple[bytes, bytes]] = {}
    for run in range(2):  # the second run continues the same database after the first kill
        proxy = SubprocessProxy(ProxyConfig(upstream=upstream, db=str(db), port=free_port(), tokenizer=str(tokenizer_dir)))
        proxy.start()
        stop = threading.Event()
        _kill_mid_load(proxy, stop, [threading.Thread(target=_growing_session, args=(
            proxy.url, f"r{run}-s{n}", n % 2 == 1, stop, seen)) for n in range(8)], seconds=6)

    conn = sqlite3.connect(db)
    assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    splices = conn.execute("SELECT count(*) FROM bodies WHERE head IS NOT NULL").fetchone()[0]
    answers_apart = conn.execute("SELECT count(*) FROM calls WHERE response_body_id IS NOT NULL").fetchone()[0]
    rows = {r["call_id"]: r for r in CaptureReader(db).calls()}
    streamed = sum(json.loads(sent)["stream"] for sent, _ in seen.values())
    assert len(seen) > 40 and 0 < streamed < len(seen), (len(seen), streamed)
    assert splices > 20 and answers_apart > 20, (splices, answers_apart)
    for call_id, (sent, got) in seen.items():  # every answer a client saw was committed first, bodies intact
        row = rows[call_id]
        assert row["status"] == "ok"
        assert row["request_body"] == sent, call_id
        assert len(got) > ANSWER_APART and row["response_body"] == got, call_id
