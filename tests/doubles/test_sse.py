"""The double streams like a busy model: paced tokens, an abort when the client leaves, faults mid-stream."""

from __future__ import annotations

import json
import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.doubles.conftest import read_stream

BODY = {"model": "polar-tiny", "messages": [{"role": "user", "content": "hi"}], "return_token_ids": True,
        "chat_template_kwargs": {"enable_thinking": False}}
WORDS = " ".join(f"w{i}" for i in range(40))  # ~80 tokens


def script(client, content: str) -> None:
    client.post("/_double/script", json={"steps": [{"content": content}]}).raise_for_status()


def stats(client) -> dict:
    return client.get("/_double/stats").json()


def wait_for(client, predicate, timeout: float = 10) -> dict:
    deadline = time.monotonic() + timeout
    while not predicate(current := stats(client)):
        assert time.monotonic() < deadline, current
        time.sleep(0.02)
    return current


def test_pace_is_set_at_run_time_and_read_back(double):
    _, client = double
    assert client.get("/_double/pace").json() == {"token_delay_s": 0.0, "first_token_delay_s": 0.0}
    assert client.post("/_double/pace", json={"first_token_delay_s": 2}).json() == {
        "token_delay_s": 0.0, "first_token_delay_s": 2.0}
    assert client.post("/_double/pace", json={"token_delay_s": -1}).status_code == 400
    assert client.get("/_double/pace").json()["first_token_delay_s"] == 2.0


def test_pace_set_at_construction(tokenizer_dir):
    from polar.doubles.scripted_vllm import ScriptedVLLM

    vllm = ScriptedVLLM(tokenizer_dir, token_delay_s=0.01, first_token_delay_s=0.5)
    assert (vllm.pace.token_delay_s, vllm.pace.first_token_delay_s) == (0.01, 0.5)


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions", "/inference/v1/generate"])
def test_streamed_tokens_are_paced(double, path):
    _, client = double
    script(client, "one two three four five six")
    first, every = 0.4, 0.08
    client.post("/_double/pace", json={"token_delay_s": every, "first_token_delay_s": first}).raise_for_status()
    if path == "/v1/chat/completions":
        body = BODY
    elif path == "/v1/completions":
        body = {"model": "polar-tiny", "prompt": [9707, 11], "max_tokens": 8, "return_token_ids": True}
    else:
        body = {"model": "polar-tiny", "token_ids": [9707, 11], "sampling_params": {"max_tokens": 8}}
    streamed = read_stream(client, path, body)
    arrivals = [t for t, e in zip(streamed.times, streamed.events, strict=True)
                if e is not None and e["choices"] and e["choices"][0].get("token_ids")]
    assert len(arrivals) >= 5
    assert first <= arrivals[0] - streamed.started < first + 0.3
    # spaced by the token delay (judged on the median and the whole span: a busy test client may read two at once)
    gaps = sorted(b - a for a, b in zip(arrivals, arrivals[1:]))
    assert every * 0.8 <= gaps[len(gaps) // 2] < every + 0.1, gaps
    assert every * (len(gaps) - 0.5) <= arrivals[-1] - arrivals[0] < every * len(gaps) + 0.5, gaps
    # a plain answer takes as long as the whole stream
    started = time.monotonic()
    plain = client.post(path, json=body)
    assert plain.status_code == 200
    assert time.monotonic() - started >= first + every * (len(arrivals) - 1)


def raw_stream_then_hang_up(url: str, body: dict, chunks: int) -> bytes:
    """An HTTP client that reads a few SSE events, then closes its socket mid-stream."""
    host, port = urlsplit(url).hostname, urlsplit(url).port
    payload = json.dumps({**body, "stream": True}).encode()
    with socket.create_connection((host, port)) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        received = b""
        while received.count(b"data: ") < chunks:
            data = sock.recv(65536)
            assert data, "the double closed first"
            received += data
    return received


def test_a_client_hanging_up_mid_stream_aborts_the_generation(double):
    _, client = double
    script(client, WORDS)
    client.delete("/_double/stats")
    client.post("/_double/pace", json={"token_delay_s": 0.05}).raise_for_status()
    received = raw_stream_then_hang_up(str(client.base_url), BODY, chunks=4)
    assert b"HTTP/1.1 200" in received and b"[DONE]" not in received
    after = wait_for(client, lambda s: s["active_streams"] == 0)
    assert (after["streams_started"], after["streams_aborted"], after["streams_finished"]) == (1, 1, 0)
    generated = after["tokens_streamed"]
    time.sleep(0.3)  # generation stopped: no more tokens produced for it
    assert stats(client)["tokens_streamed"] == generated < 40


def test_a_plain_call_abandoned_while_the_model_is_busy_is_counted(double):
    _, client = double
    script(client, "hello")
    client.delete("/_double/stats")
    client.post("/_double/pace", json={"first_token_delay_s": 5}).raise_for_status()
    with pytest.raises(httpx.ReadTimeout):
        client.post("/v1/chat/completions", json=BODY, timeout=0.3)
    assert wait_for(client, lambda s: s["calls_aborted"] == 1)["streams_started"] == 0


def test_die_mid_stream_breaks_the_connection_after_n_tokens(double):
    _, client = double
    script(client, WORDS)
    client.delete("/_double/stats")
    client.post("/_double/fault", json={"mode": "die_mid_stream", "after_tokens": 5, "count": 1}).raise_for_status()
    plain = client.post("/v1/chat/completions", json=BODY)  # a plain call leaves the fault to the next stream
    assert plain.status_code == 200
    seen: list[dict] = []
    with pytest.raises(httpx.RemoteProtocolError):
        with client.stream("POST", "/v1/chat/completions", json={**BODY, "stream": True}) as response:
            for line in response.iter_lines():
                if line:
                    seen.append(json.loads(line[6:]))
    assert len(seen) == 1 + 5  # the role chunk, then five token chunks; no finish, no [DONE]
    assert [len(c["choices"][0]["token_ids"]) for c in seen[1:]] == [1] * 5
    assert all(c["choices"][0]["finish_reason"] is None for c in seen)
    assert wait_for(client, lambda s: s["active_streams"] == 0)["streams_failed"] == 1
    again = read_stream(client, "/v1/chat/completions", BODY)  # count 1: the next stream is whole
    assert again.done


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/inference/v1/generate"])
def test_error_mid_stream_sends_vllms_error_chunk_then_done(double, path):
    _, client = double
    script(client, WORDS)
    client.post("/_double/fault", json={"mode": "error_mid_stream", "after_tokens": 3}).raise_for_status()
    body = BODY if path == "/v1/chat/completions" else {
        "model": "polar-tiny", "token_ids": [9707, 11], "sampling_params": {"max_tokens": 20}}
    streamed = read_stream(client, path, body)
    assert streamed.done
    *tokens, error = streamed.chunks
    assert len([c for c in tokens if c["choices"][0].get("token_ids")]) == 3
    assert error == {"error": {"message": "Internal server error", "type": "InternalServerError", "param": None,
                               "code": 500}}
