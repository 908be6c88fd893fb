"""A replica that stalls (`--upstream-stall`): a real process frozen with SIGSTOP — it still accepts
connections (the kernel's backlog) and then sends nothing, to a call or to a health probe — beside a
healthy one, behind a real polar proxy, driven by the official OpenAI and Anthropic SDKs. The replicas are
the scripted vLLM double (TEST DOUBLES: polar/doubles/), the stalled one a process of its own. A call its
client saw nothing of moves to the other replica, whole or streamed; the replica is taken out, probed, and
taken back in once it runs again; a stream that had sent text ends with the provider's error and its row
names the stall and the replica; a replica that is only slow to its first token (it answers its probe) is
waited for. The same freeze on a real vLLM server: tests/integration/test_fleet_real_vllm.py."""

from __future__ import annotations

import os
import signal
import threading
import time

import anthropic
import openai
import pytest

from polar.capture.reader import CaptureReader
from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port
from tests.support.replicas import DoubleProcess

pytestmark = pytest.mark.slow  # a replica frozen for seconds at a time

STALL = 2  # seconds of silence before the probe; the probe's own timeout (5 s) comes on top


class Fleet:
    def __init__(self, victim: DoubleProcess, healthy: str, proxy: SubprocessProxy, db, log):
        self.victim, self.healthy, self.proxy, self.db, self.log = victim, healthy, proxy, db, log
        self.openai = openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="sk-test", max_retries=0, timeout=120)
        self.anthropic = anthropic.Anthropic(base_url=proxy.url, api_key="sk-test", max_retries=0, timeout=120)
        self._n = 0

    def rows(self, session: str) -> list[dict]:
        return list(CaptureReader(self.db).calls(session=session))

    def ask(self, session: str, text: str, stream: bool = False) -> str:
        """One OpenAI chat turn (a new conversation each time: the session key is what routing follows)."""
        kwargs = dict(model="polar-tiny", messages=[{"role": "user", "content": text}], max_tokens=64,
                      extra_headers={"x-polar-session": session})
        if stream:
            return "".join(c.choices[0].delta.content or "" for c in self.openai.chat.completions.create(
                stream=True, **kwargs) if c.choices)
        return self.openai.chat.completions.create(**kwargs).choices[0].message.content or ""

    def on_victim(self, prefix: str) -> str:
        """A new session whose first call the victim answered (a new session goes to the replica holding fewer;
        the victim may be waiting for its probe to take it back in)."""
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            self._n += 1
            session = f"{prefix}-{self._n}"
            self.ask(session, f"{prefix} {self._n}: hello")
            if self.rows(session)[0]["replica"] == self.victim.url:
                return session
            time.sleep(0.3)
        raise AssertionError("no new session was placed on the victim")

    def freeze(self) -> None:
        os.kill(self.victim.proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        os.kill(self.victim.proc.pid, signal.SIGCONT)

    def logged(self, text: str, timeout: float = 0.0) -> bool:
        deadline = time.monotonic() + timeout
        while True:
            if text in self.log.read_text():
                return True
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.2)


@pytest.fixture(scope="module")
def fleet(tokenizer_dir, double_server, tmp_path_factory):
    victim = DoubleProcess(tokenizer_dir)
    victim.launch()
    victim.wait_ready()
    tmp = tmp_path_factory.mktemp("stall")
    db, log = tmp / "captures.db", tmp / "proxy.log"
    # The victim first: two idle replicas holding no session, a new session goes to the first.
    proxy = SubprocessProxy(ProxyConfig(upstream=f"{victim.url},{double_server[1]}", db=str(db), port=free_port(),
                                        tokenizer=str(tokenizer_dir), upstream_stall=STALL,
                                        extra={"polar_upstream_timeout": 60}))
    with log.open("w") as out:  # its log (termlog): replicas taken out and back in
        proxy.launch(stdout=out, stderr=out)
    proxy.wait_ready()
    yield Fleet(victim, double_server[1], proxy, db, log)
    proxy.stop()
    victim.kill()  # (SIGKILL ends a stopped process too)


def _moved_off_the_stall(row: dict, victim: str) -> None:
    assert row["status"] == "ok" and row["replica"] != victim, row
    (failover,) = row["result"]["failovers"]
    assert failover.startswith(f"{victim}: upstream_timeout: the upstream {victim} stalled: no byte of its answer "
                               f"for {STALL} s"), failover


def test_a_stalled_replica_s_calls_move_and_it_is_taken_out_then_back_in(fleet):
    whole, streamed = fleet.on_victim("whole"), fleet.on_victim("streamed")
    fleet.freeze()
    try:
        answers: dict[str, str] = {}
        took: dict[str, float] = {}

        def whole_call():
            t0 = time.monotonic()
            answers["whole"] = fleet.ask(whole, "whole again: still there?")
            took["whole"] = time.monotonic() - t0

        def streamed_call():  # the Anthropic SDK, streamed
            t0 = time.monotonic()
            with fleet.anthropic.messages.stream(model="polar-tiny", max_tokens=64,
                                                 messages=[{"role": "user", "content": "streamed again: there?"}],
                                                 extra_headers={"x-polar-session": streamed}) as stream:
                answers["streamed"] = "".join(stream.text_stream)
            took["streamed"] = time.monotonic() - t0

        threads = [threading.Thread(target=whole_call), threading.Thread(target=streamed_call)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        # Both sent to the frozen replica, both answered by the other: the clients only waited.
        assert answers == {"whole": "Scripted answer to: whole again: still there?",
                           "streamed": "Scripted answer to: streamed again: there?"}, answers
        assert all(STALL <= seconds < 30 for seconds in took.values()), took
        for session in (whole, streamed):
            first, second = fleet.rows(session)
            assert first["replica"] == fleet.victim.url
            _moved_off_the_stall(second, fleet.victim.url)
        assert fleet.logged(f"replica {fleet.victim.url} taken out of the fleet: the upstream {fleet.victim.url} "
                            "stalled")
        # Out: a new session goes to the other replica at once, with no stall to wait out.
        t0 = time.monotonic()
        fleet.ask("while-out", "while out: hello")
        assert time.monotonic() - t0 < STALL and fleet.rows("while-out")[0]["replica"] == fleet.healthy
        time.sleep(8)  # a probe cycle (every 2 s, 5 s to answer) while frozen: unanswered, it stays out
        assert not fleet.logged("answers again: taken back in")
        fleet.ask("still-out", "still out: hello")
        assert fleet.rows("still-out")[0]["replica"] == fleet.healthy
    finally:
        fleet.thaw()
    # Running again: its probe answers, it is taken back in, and new sessions reach it.
    assert fleet.logged(f"replica {fleet.victim.url} answers again: taken back in", timeout=30)
    fleet.on_victim("back")


def test_a_stall_mid_stream_after_text_reached_the_client(fleet):
    session = fleet.on_victim("mid")
    fleet.victim.post("pace", {"token_delay_s": 0.05})
    line = "mid stream: " + " ".join(f"word{n}" for n in range(60))
    seen: list[str] = []
    try:
        with pytest.raises(openai.APIError) as err:
            for chunk in fleet.openai.chat.completions.create(
                    model="polar-tiny", messages=[{"role": "user", "content": line}], max_tokens=400, stream=True,
                    extra_headers={"x-polar-session": session}):
                if chunk.choices and chunk.choices[0].delta.content:
                    seen.append(chunk.choices[0].delta.content)
                    if len(seen) == 3:  # text reached the client: now the replica freezes
                        fleet.freeze()
    finally:
        fleet.thaw()
    assert len(seen) >= 3 and "stalled" in str(err.value), err.value
    row = fleet.rows(session)[-1]
    assert row["status"] == "error" and row["replica"] == fleet.victim.url and row["error_kind"] == "upstream_timeout"
    assert row["error"].startswith(f"the upstream {fleet.victim.url} stalled: no byte mid-stream for {STALL} s")
    assert row["finish_reason"] == "abort" and row["completion_ids"]  # what was sampled before the stall is kept
    assert row["result"]["failovers"] == []  # the client had text: not retried
    assert fleet.logged(f"replica {fleet.victim.url} taken out of the fleet: the upstream {fleet.victim.url} "
                        "stalled: no byte mid-stream")
    fleet.victim.post("pace", {"token_delay_s": 0.0})


def test_a_replica_slow_to_its_first_token_is_waited_for_not_taken_out(fleet):
    """Queue and prefill send nothing, yet the replica answers its health probe: busy, not stalled."""
    session = fleet.on_victim("slow")
    fleet.victim.post("pace", {"first_token_delay_s": 3 * STALL})
    try:
        for stream in (False, True):
            t0 = time.monotonic()
            text = fleet.ask(session, f"slow {stream}: take your time", stream=stream)
            assert text == f"Scripted answer to: slow {stream}: take your time"
            assert time.monotonic() - t0 >= 3 * STALL
    finally:
        fleet.victim.post("pace", {"first_token_delay_s": 0.0})
    rows = fleet.rows(session)
    assert [(r["status"], r["replica"], r["result"]["failovers"]) for r in rows[1:]] == [
        ("ok", fleet.victim.url, [])] * 2
