"""Stopping `polar proxy` or `mitmdump -s addons/polar_gateway.py` (mitm/shutdown.py): SIGTERM and SIGINT
drain, nothing in flight is lost.

A real `polar proxy` process, token-faithful, in front of the scripted vLLM double paced like a model
(a token every 20 ms); the official Anthropic SDK as the client. Told to stop mid-answer, polar refuses
new calls with a retryable error in the caller's shape, lets the answer finish and exits 0 with its row
committed. Past `polar_drain`, a stream ends with the provider's error event and a plain call with an
error answer, each row holding what was sampled; a second signal stops at once. Before this, SIGTERM
killed the process mid-event and left the row `pending`.
"""

from __future__ import annotations

import shutil
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import anthropic
import httpx
import pytest

from polar.capture.reader import CaptureReader
from polar.capture.shards import open_captures
from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port
from tests.mitm.test_workers import WorkerProxy, haproxy_ready  # noqa: F401  (a fixture)

REPO = Path(__file__).resolve().parents[2]

WORDS = " ".join(f"w{i}" for i in range(200))  # ~200 tokens: ~4-10 s at 20 ms a token
PROMPT = [{"role": "user", "content": "hi"}]


@pytest.fixture
def paced(double_server) -> Iterator[str]:
    """The shared double, answering WORDS a token every 20 ms (its script and pace restored after)."""
    _, upstream = double_server
    httpx.post(f"{upstream}/_double/script", json={"steps": [{"content": WORDS}]}).raise_for_status()
    httpx.post(f"{upstream}/_double/pace", json={"token_delay_s": 0.02, "first_token_delay_s": 0}).raise_for_status()
    yield upstream
    httpx.post(f"{upstream}/_double/pace", json={"token_delay_s": 0, "first_token_delay_s": 0}).raise_for_status()


def start(upstream: str, tmp_path, drain: int, tokenizer_dir) -> SubprocessProxy:
    proxy = SubprocessProxy(ProxyConfig(upstream=upstream, db=str(tmp_path / "captures.db"), port=free_port(),
                                        tokenizer=str(tokenizer_dir), extra={"polar_drain": drain}))
    proxy.start()
    return proxy


@dataclass
class Mitmdump:
    """polar as the mitmproxy addon script a user runs with mitmproxy's own `mitmdump`, reverse mode."""

    proc: subprocess.Popen
    url: str


def start_mitmdump(upstream: str, db: Path, drain: int, tokenizer_dir) -> Mitmdump:
    exe = Path(sys.executable).with_name("mitmdump")
    exe = exe if exe.exists() else Path(shutil.which("mitmdump") or "mitmdump")
    port = free_port()
    proc = subprocess.Popen([str(exe), "-q", "-s", str(REPO / "addons" / "polar_gateway.py"), "--mode",
                             f"reverse:{upstream}@{port}", "--listen-host", "127.0.0.1",
                             "--set", "connection_strategy=lazy", "--set", f"polar_upstream={upstream}",
                             "--set", f"polar_db={db}", "--set", f"polar_tokenizer={tokenizer_dir}",
                             "--set", f"polar_drain={drain}"])
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 180  # a start-up bound, not a timing check: a loaded CI host is slow
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "mitmdump did not start"
        try:
            httpx.get(url + "/", timeout=1)
            return Mitmdump(proc, url)
        except httpx.TransportError:
            time.sleep(0.1)


def sdk(proxy: SubprocessProxy | WorkerProxy | Mitmdump, session: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=proxy.url, api_key="sk-test", max_retries=0, timeout=120,
                               default_headers={"x-polar-session": session})


def stream_in_background(proxy: SubprocessProxy | WorkerProxy | Mitmdump, session: str) -> tuple[threading.Thread, dict, threading.Event]:
    """A streamed answer read by the SDK on a thread; `begun` is set at its first text."""
    out: dict = {}
    begun = threading.Event()

    def read() -> None:
        try:
            with sdk(proxy, session).messages.stream(model="m", max_tokens=1000, messages=PROMPT) as stream:
                for _ in stream.text_stream:
                    begun.set()
                out["message"] = stream.get_final_message()
        except anthropic.APIError as exc:
            out["error"] = exc
        finally:
            begun.set()

    thread = threading.Thread(target=read)
    thread.start()
    assert begun.wait(60)
    return thread, out, begun


def rows(db) -> list[dict]:
    return list(CaptureReader(db).calls())


def test_sigterm_lets_the_answer_in_flight_finish_and_refuses_new_calls(paced, tmp_path, tokenizer_dir):
    proxy = start(paced, tmp_path, 60, tokenizer_dir)
    thread, out, _ = stream_in_background(proxy, "drained")
    proxy.proc.send_signal(signal.SIGTERM)
    time.sleep(0.3)
    with pytest.raises(anthropic.APIStatusError) as refused:  # a new call while draining: retryable, in its shape
        sdk(proxy, "late").messages.create(model="m", max_tokens=5, messages=PROMPT)
    assert refused.value.status_code == 529 and "shutting down" in refused.value.message
    assert refused.value.body["error"]["type"] == "overloaded_error"
    thread.join(60)
    assert proxy.proc.wait(60) == 0
    message = out["message"]  # the whole answer, as if nothing happened
    assert message.stop_reason == "end_turn" and message.content[0].text.strip() == WORDS
    (row,) = rows(proxy.config.db)  # the refused call reached no model: no row
    assert row["status"] == "ok" and row["session_id"] == "drained"
    assert len(row["completion_ids"]) == message.usage.output_tokens


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_mitmdump_with_the_addon_script_drains_too(paced, tmp_path, tokenizer_dir, signum):
    """mitmproxy's own main shuts down at once on these signals, cutting a stream mid-event and leaving its
    row pending; the addon puts polar's drain in its place."""
    db = tmp_path / "captures.db"
    proxy = start_mitmdump(paced, db, 60, tokenizer_dir)
    try:
        thread, out, _ = stream_in_background(proxy, "script")
        proxy.proc.send_signal(signum)
        time.sleep(0.3)
        with pytest.raises(anthropic.APIStatusError) as refused:
            sdk(proxy, "late").messages.create(model="m", max_tokens=5, messages=PROMPT)
        assert refused.value.status_code == 529 and refused.value.body["error"]["type"] == "overloaded_error"
        thread.join(60)
        assert proxy.proc.wait(60) == 0
    finally:
        if proxy.proc.poll() is None:
            proxy.proc.kill()
    message = out["message"]
    assert message.stop_reason == "end_turn" and message.content[0].text.strip() == WORDS
    (row,) = rows(db)
    assert row["status"] == "ok" and len(row["completion_ids"]) == message.usage.output_tokens


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_past_the_drain_a_stream_ends_with_its_error_event_and_keeps_its_tokens(paced, tmp_path, tokenizer_dir, signum):
    proxy = start(paced, tmp_path, 1, tokenizer_dir)
    thread, out, _ = stream_in_background(proxy, "cut")
    t0 = time.monotonic()
    proxy.proc.send_signal(signum)
    assert proxy.proc.wait(30) == 0
    stopped_s = time.monotonic() - t0
    thread.join(30)
    error = out["error"]  # the SDK read the provider's own error event, not a broken connection
    assert isinstance(error, anthropic.APIStatusError) and error.body["error"]["type"] == "overloaded_error", error
    assert "stopped during this answer" in error.message
    (row,) = rows(proxy.config.db)
    assert (row["status"], row["error_kind"]) == ("error", "stopping")
    assert 0 < len(row["completion_ids"]) < 200 and len(row["completion_logprobs"]) == len(row["completion_ids"])
    assert stopped_s < 10, stopped_s


def test_past_the_drain_a_plain_call_gets_an_error_answer_and_a_row(paced, tmp_path, tokenizer_dir):
    proxy = start(paced, tmp_path, 1, tokenizer_dir)
    httpx.delete(f"{paced}/_double/requests").raise_for_status()
    out: dict = {}

    def call() -> None:
        try:
            out["message"] = sdk(proxy, "plain").messages.create(model="m", max_tokens=1000, messages=PROMPT)
        except anthropic.APIError as exc:
            out["error"] = exc

    thread = threading.Thread(target=call)
    thread.start()
    deadline = time.monotonic() + 30
    while not sqlite3.connect(proxy.config.db).execute("SELECT count(*) FROM calls").fetchone()[0]:
        assert time.monotonic() < deadline
        time.sleep(0.05)  # the call has arrived (its row is pending) and waits upstream
    proxy.proc.send_signal(signal.SIGTERM)
    assert proxy.proc.wait(30) == 0
    thread.join(30)
    error = out.get("error")  # an answer in the caller's shape, retryable, saying why
    assert isinstance(error, anthropic.APIStatusError) and error.body["error"]["type"] == "overloaded_error", out
    assert "stopped while this call waited upstream" in error.message
    (row,) = rows(proxy.config.db)
    assert (row["status"], row["error_kind"]) == ("error", "stopping"), row  # recorded, not left pending
    generated = [r for r in httpx.get(f"{paced}/_double/requests").json() if r["body"].get("token_ids")]
    assert len(generated) == 1  # not sent again when polar closed its client (a retry would start a second answer)


def test_a_second_signal_stops_at_once(paced, tmp_path, tokenizer_dir):
    proxy = start(paced, tmp_path, 600, tokenizer_dir)
    thread, out, _ = stream_in_background(proxy, "twice")
    t0 = time.monotonic()
    proxy.proc.send_signal(signal.SIGTERM)
    time.sleep(0.5)
    proxy.proc.send_signal(signal.SIGINT)
    assert proxy.proc.wait(30) == 0 and time.monotonic() - t0 < 10
    thread.join(30)
    assert isinstance(out.get("error"), anthropic.APIStatusError)
    (row,) = rows(proxy.config.db)
    assert (row["status"], row["error_kind"]) == ("error", "stopping")


def test_stopping_a_worker_set_lets_the_answer_through_the_front_finish(paced, tmp_path, tokenizer_dir,
                                                                      haproxy_ready):  # noqa: F811
    """`polar proxy --workers 2`, Ctrl-C: haproxy's soft stop keeps the open connection, the worker drains."""
    proxy = WorkerProxy(paced, tmp_path / "captures.db", "--tokenizer", str(tokenizer_dir))
    thread, out, _ = stream_in_background(proxy, "through-front")
    proxy.proc.send_signal(signal.SIGINT)
    assert proxy.proc.wait(60) == 0, proxy.stderr()
    thread.join(30)
    message = out.get("message")
    assert message is not None and message.content[0].text.strip() == WORDS, out
    assert proxy.gone()
    (row,) = list(open_captures(proxy.db).calls())
    assert row["status"] == "ok" and row["session_id"] == "through-front"
