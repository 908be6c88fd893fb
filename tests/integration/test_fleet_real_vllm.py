"""A fleet of two real vLLM CPU servers (the tiny model, prefix caching on: vLLM's default; dev mode with
polar's worker extension, for weight updates) behind polar, started together (one cold start's wait).

Session-affine routing against round-robin on the same multi-turn sessions, both hit rates from vLLM's own
/metrics counters; a policy update through the sampling gate reaching both servers, every row after the
resume carrying the new version from either; one server frozen (SIGSTOP) under --upstream-stall, its calls
moved and it taken back in once it runs again; then one server SIGKILLed while sessions run through the real
proxy: every session finishes on the other, its prompts still extend token for token, no capture is lost,
and only the calls in flight at the kill see an error."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from polar.capture.reader import CaptureReader
from polar.capture.writer import CaptureWriter
from polar.gateway.pipeline import Gateway, GatewayRequest
from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port
from polar.upstream.fleet.build import upstream_backend
from polar.upstream.fleet.metrics import parse_metrics
from polar.upstream.fleet.routing import RoundRobin
from polar.upstream.fleet.weights import FleetWeights
from polar.upstream.vllm_extension import EXTENSION
from tests.support.real_vllm import REPO, SERVED_MODEL, launch_real_vllm, stop_real_vllm

pytestmark = pytest.mark.vllm

SESSIONS, TURNS = 5, 4  # an odd number: round-robin over two replicas moves every session every turn
STALL = 3  # --upstream-stall: seconds of silence before the health probe (5 s of its own)


@pytest.fixture(scope="module")
def pair():
    """Two servers: (URL, URL, the second's process group, to kill it)."""
    env = {"VLLM_SERVER_DEV_MODE": "1", "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get(
        "PYTHONPATH")])), "POLAR_VLLM_ARGS": f"{os.environ.get('POLAR_VLLM_ARGS', '')} --worker-extension-cls "
           f"{EXTENSION}".strip()}
    with ThreadPoolExecutor(2) as pool:
        started = list(pool.map(lambda _: launch_real_vllm(env=env), range(2)))
    yield started[0][0], started[1][0], started[1][1]
    for _, pid in started:
        stop_real_vllm(pid)


def _cache_counters(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in urls:
        metrics = parse_metrics(httpx.get(f"{url}/metrics", timeout=30).text)
        hits, queries = hits + metrics["prefix_cache_hits"], queries + metrics["prefix_cache_queries"]
    return hits, queries


def _tool_output(session: int, turn: int) -> str:
    return f"Output of step {turn} in session {session}:\n" + "".join(
        f"test_{session}_{turn}_{n} ... FAILED (expected {n * 7}, got {n * 7 + session})\n" for n in range(60))


async def _run_sessions(urls: list[str], model_dir, db, run: str, round_robin: bool = False,
                        between: int | None = None, update=None) -> list[dict]:
    """SESSIONS sessions of TURNS calls through polar's own gateway pipeline (token-faithful), the sessions
    taking turns as concurrent agents do, on a fleet routed by polar or round-robin. `update(gate)` runs
    before turn `between`."""
    fleet = upstream_backend(urls, tokenizer=str(model_dir))
    if round_robin:
        fleet.router = RoundRobin(fleet.replicas)
    writer = CaptureWriter(db)
    gateway = Gateway(writer, fleet)
    system = f"Run {run}. You are a careful coding agent working in a repository; fix what the tests report.\n" * 8
    histories = [[{"role": "system", "content": system},
                  {"role": "user", "content": f"Task {n}: make the failing tests of module {n} pass."}]
                 for n in range(SESSIONS)]
    try:
        for turn in range(TURNS):
            if turn == between:
                await update(gateway.gate)
            for n, messages in enumerate(histories):
                body = {"model": SERVED_MODEL, "messages": messages, "max_tokens": 8, "temperature": 0}
                out = await gateway.handle(GatewayRequest(
                    "POST", "/v1/chat/completions", {}, {"content-type": "application/json",
                                                         "x-polar-session": f"{run}-{n}"}, json.dumps(body).encode()))
                assert out.reply.status == 200, out.reply.body[:300]
                answer = json.loads(out.reply.body)["choices"][0]["message"]["content"] or ""
                messages += [{"role": "assistant", "content": answer}, {"role": "user", "content": _tool_output(n, turn)}]
    finally:
        await fleet.aclose()
        writer.close()
    return list(CaptureReader(db).calls())


def test_session_affine_routing_hits_the_prefix_cache_far_more_than_round_robin(pair, model_dir, tmp_path):
    urls = [pair[0], pair[1]]
    rates = {}
    for run, round_robin in (("affine", False), ("round-robin", True)):
        hits0, queries0 = _cache_counters(urls)
        rows = asyncio.run(_run_sessions(urls, model_dir, tmp_path / f"{run}.db", run, round_robin))
        hits1, queries1 = _cache_counters(urls)
        rates[run] = (hits1 - hits0) / (queries1 - queries0)
        assert [r["status"] for r in rows] == ["ok"] * SESSIONS * TURNS
        faithful = [r for r in rows if r["prompt_mode"].startswith("token-faithful")]
        assert len(faithful) == SESSIONS * (TURNS - 1)  # every call after a session's first
        per_session = {}
        for row in rows:
            per_session.setdefault(row["session_id"], set()).add(row["replica"])
        if round_robin:
            assert all(len(replicas) == 2 for replicas in per_session.values())
        else:
            assert all(len(replicas) == 1 for replicas in per_session.values())
            assert {next(iter(r)) for r in per_session.values()} == set(urls)  # both replicas used
    print(f"\nprefix-cache hit rate from vLLM's /metrics over {SESSIONS} sessions x {TURNS} turns on 2 replicas: "
          f"session-affine {rates['affine']:.1%}, round-robin {rates['round-robin']:.1%}")
    assert rates["affine"] > rates["round-robin"] + 0.15, rates


def test_a_policy_update_reaches_both_servers_and_every_row_after_resume_carries_it(pair, model_dir, tmp_path):
    urls = [pair[0], pair[1]]
    resumed_at: list[float] = []

    async def update(gate) -> None:
        gate.pause()
        await gate.drain()
        with FleetWeights(urls) as weights:  # the same checkpoint again, under a new name: the mechanics
            loaded = await asyncio.to_thread(weights.load, model_dir, 7)
            assert not loaded.failed and await asyncio.to_thread(weights.versions) == {u: "7" for u in urls}
        gate.resume(7)
        async with gate.sampling():  # opens once the fleet has asked every replica
            resumed_at.append(time.time())

    rows = asyncio.run(_run_sessions(urls, model_dir, tmp_path / "update.db", "update", between=2, update=update))
    before = [r for r in rows if r["t_start"] < resumed_at[0]]
    after = [r for r in rows if r["t_start"] > resumed_at[0]]
    assert len(before) == len(after) == SESSIONS * 2 and all(r["status"] == "ok" for r in rows)
    assert {r["policy_version"] for r in before} == {None}  # the gate had no version before
    assert {r["policy_version"] for r in after} == {7} and {r["replica"] for r in after} == set(urls)
    # vLLM's own label for its weights, kept apart: its placeholder before the update, the name given after
    assert {r["weight_version"] for r in before if r["prompt_mode"].startswith("token-faithful")} == {"default"}
    assert {r["weight_version"] for r in after} == {"7"}


def test_a_frozen_server_stalls_its_calls_move_and_it_is_taken_back_in(pair, model_dir, tmp_path, request):
    """SIGSTOP on the second server's process group (API server and engine: a frozen machine, whose kernel
    still accepts connections): with --upstream-stall, a whole and a streamed call sent to it move to the
    other server, token for token; it is out while frozen and taken back in once it runs again."""
    shared, own, own_pid = pair
    db, log = tmp_path / "captures.db", tmp_path / "proxy.log"
    proxy = SubprocessProxy(ProxyConfig(upstream=f"{own},{shared}", db=str(db), port=free_port(),
                                        tokenizer=str(model_dir), upstream_stall=STALL,
                                        extra={"polar_upstream_timeout": 120}))
    with log.open("w") as out:  # its log: replicas taken out and back in
        proxy.launch(stdout=out, stderr=out)
    request.addfinalizer(proxy.stop)
    proxy.wait_ready(120)
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0, timeout=120)

    def turn(session: str, messages: list[dict], stream: bool) -> str:
        reply = client.chat.completions.create(model=SERVED_MODEL, messages=messages, max_tokens=16, temperature=0,
                                               stream=stream, extra_headers={"x-polar-session": session})
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in reply if c.choices)
        return reply.choices[0].message.content or ""

    def rows(session: str) -> list[dict]:
        return list(CaptureReader(db).calls(session=session))

    # Idle, a new session goes to the server holding fewer sessions (the first on a tie): own, shared, own.
    histories = {name: [{"role": "user", "content": f"Session {name}: list the repository's modules."}]
                 for name in ("frozen-whole", "frozen-other", "frozen-stream")}
    for name, messages in histories.items():
        messages += [{"role": "assistant", "content": turn(name, messages, False)},
                     {"role": "user", "content": _tool_output(1, 0)}]
    assert [rows(name)[0]["replica"] for name in histories] == [own, shared, own]
    os.killpg(own_pid, signal.SIGSTOP)
    try:
        with ThreadPoolExecutor(2) as pool:
            list(pool.map(lambda args: turn(*args), [("frozen-whole", histories["frozen-whole"], False),
                                                     ("frozen-stream", histories["frozen-stream"], True)]))
        for name in ("frozen-whole", "frozen-stream"):
            first, second = rows(name)
            assert second["status"] == "ok" and second["replica"] == shared
            (failover,) = second["result"]["failovers"]
            assert failover.startswith(f"{own}: upstream_timeout: the upstream {own} stalled: no byte of its answer")
            held = first["prompt_ids"] + first["completion_ids"]  # token for token across the move
            assert second["prompt_ids"][:len(held)] == held and second["prompt_mode"].startswith("token-faithful")
        assert f"replica {own} taken out of the fleet: the upstream {own} stalled" in log.read_text()
        turn("frozen-new", [{"role": "user", "content": "A new session while one server is frozen."}], False)
        assert rows("frozen-new")[0]["replica"] == shared
    finally:
        os.killpg(own_pid, signal.SIGCONT)
    deadline = time.monotonic() + 60
    while f"replica {own} answers again: taken back in" not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.5)
    turn("after-thaw", [{"role": "user", "content": "A new session once both servers run."}], False)
    assert rows("after-thaw")[0]["replica"] == own  # it holds fewer sessions now


def test_a_server_killed_mid_run_loses_no_session_and_no_capture(pair, model_dir, tmp_path):
    shared, own, own_pid = pair
    db = tmp_path / "captures.db"
    proxy = SubprocessProxy(ProxyConfig(upstream=f"{shared},{own}", db=str(db), port=free_port(),
                                        tokenizer=str(model_dir), extra={"polar_upstream_timeout": 120}))
    proxy.start(120)
    client = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0, timeout=120)
    errors: dict[str, list[str]] = {}
    done: dict[str, int] = {}

    def run(name: str) -> None:
        messages = [{"role": "user", "content": f"Session {name}: describe the repository layout."}]
        errors[name], done[name] = [], 0
        for turn in range(TURNS):
            while True:  # a harness makes a failed call again
                try:
                    stream = client.chat.completions.create(model=SERVED_MODEL, messages=messages, max_tokens=48,
                                                            temperature=0, stream=turn % 2 == 1,
                                                            extra_headers={"x-polar-session": name})
                    text = ("".join(c.choices[0].delta.content or "" for c in stream if c.choices)
                            if turn % 2 == 1 else stream.choices[0].message.content or "")
                    break
                except openai.APIError as exc:
                    errors[name].append(str(exc))
                    assert len(errors[name]) < 3, errors[name]
            messages += [{"role": "assistant", "content": text}, {"role": "user", "content": _tool_output(0, turn)}]
            done[name] += 1

    names = [f"kill-{n}" for n in range(SESSIONS)]
    threads = [threading.Thread(target=run, args=(name,)) for name in names]
    try:
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:  # until the doomed server is sampling some session's second turn
            rows = list(CaptureReader(db).calls(with_tokens=False)) if db.exists() else []
            if any(r["replica"] == own and r["status"] == "ok" for r in rows) and len(rows) > SESSIONS:
                break
            time.sleep(0.2)
        killed_at = time.time()
        os.killpg(own_pid, signal.SIGKILL)
        for thread in threads:
            thread.join(600)
        assert done == {name: TURNS for name in names}, (done, errors)
        for name in names:
            rows = list(CaptureReader(db).calls(session=name))
            ok = [r for r in rows if r["status"] == "ok"]
            assert len(ok) == TURNS
            for before, after in zip(ok, ok[1:]):  # token for token, across the move too
                held = before["prompt_ids"] + before["completion_ids"]
                assert after["prompt_ids"][:len(held)] == held and after["prompt_mode"].startswith("token-faithful")
            assert all(r["replica"] == shared for r in ok if r["t_start"] > killed_at + 1)
            for row in rows:
                if row["status"] != "ok":
                    assert row["t_start"] < killed_at < row["t_end"] and row["replica"] == own, row
        assert not [r for r in CaptureReader(db).calls(with_tokens=False) if r["status"] == "pending"]
        moved = {r["session_id"] for r in CaptureReader(db).calls(with_tokens=False)
                 if r["replica"] == own and r["t_start"] < killed_at}
        assert moved, "the killed server served no session before the kill"
    finally:
        proxy.stop()
