"""The streaming call on its own (no mitmproxy): the gateway in front of the scripted vLLM double, its
stream read here the way the relay reads it. The ways a stream ends that the SDK tests cannot reach:
nobody ever reads it, or its row cannot be committed at the end."""

from __future__ import annotations

import asyncio
import gc
import json
import os
import uuid

import httpx
from aiohttp import web

from polar.canonical import ChatRequest, ReasoningDelta, TextDelta, ToolCallDelta, coalesced
from polar.capture.reader import CaptureReader
from polar.capture.writer import CaptureWriter
from polar.gateway.pipeline import Gateway, GatewayRequest
from polar.gateway.streaming import StreamReply
from polar.upstream.vllm_chat import VLLMChat
from tests.support.aiohttp_server import serving

LONG = " ".join(f"word{i}" for i in range(120))


def request(session: str) -> GatewayRequest:
    body = {"model": "claude", "max_tokens": 1024, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
    return GatewayRequest("POST", "/v1/messages", {}, {"content-type": "application/json", "x-polar-session": session},
                          json.dumps(body).encode())


def script(url: str, content: str, token_delay_s: float = 0.0) -> None:
    httpx.post(f"{url}/_double/script", json={"steps": [{"content": content}]}).raise_for_status()
    httpx.post(f"{url}/_double/pace", json={"token_delay_s": token_delay_s, "first_token_delay_s": 0}).raise_for_status()


def run(coro):
    return asyncio.run(coro)


def test_a_stream_nobody_reads_is_abandoned_and_frees_its_slot(double_server, tmp_path):
    _, url = double_server
    script(url, LONG, token_delay_s=0.01)
    db = tmp_path / "captures.db"
    session = f"unread-{uuid.uuid4().hex[:6]}"

    async def main():
        writer = CaptureWriter(db)
        gateway = Gateway(writer, VLLMChat(url))
        before = httpx.get(f"{url}/_double/stats").json()
        out = await gateway.handle(request(session))
        assert isinstance(out.reply, StreamReply) and gateway.gate.in_flight == 1
        out.reply.call.abandon()  # the relay's claim timeout, or the flow killed before it was fetched
        await out.reply.call.wait_settled()
        assert gateway.gate.in_flight == 0
        for _ in range(50):
            if httpx.get(f"{url}/_double/stats").json()["streams_aborted"] > before["streams_aborted"]:
                break
            await asyncio.sleep(0.1)
        else:
            raise AssertionError("the upstream request was not aborted")
        await gateway.backend.aclose()
        writer.close()

    run(main())
    (row,) = CaptureReader(db).calls(session=session)
    assert row["status"] == "client_disconnected" and row["completion_len"] < 240


def test_a_row_that_cannot_be_committed_ends_the_stream_with_an_error_not_its_end(double_server, tmp_path):
    _, url = double_server
    script(url, LONG, token_delay_s=0.002)
    db = tmp_path / "captures.db"
    session = f"nocommit-{uuid.uuid4().hex[:6]}"

    async def main() -> bytes:
        writer = CaptureWriter(db)
        gateway = Gateway(writer, VLLMChat(url))
        out = await gateway.handle(request(session))
        body = b""
        async for chunk in out.reply.call.chunks():
            if not body:  # the database (and its WAL) moved away under polar mid-stream
                for suffix in ("", "-wal"):
                    os.replace(f"{db}{suffix}", tmp_path / f"moved-away.db{suffix}")
            body += chunk
        await gateway.backend.aclose()
        writer.close()
        return body

    body = run(main())
    assert b"event: content_block_delta" in body  # the answer was streaming …
    assert b"event: message_stop" not in body and b'"type":"message_delta"' not in body  # … but never ended
    assert body.rstrip().endswith(b"}") and b"event: error" in body and b"could not record this call" in body
    # what was captured before is still there, in the file polar had open: the call in flight, with its request
    (row,) = CaptureReader(tmp_path / "moved-away.db").calls(session=session)
    assert row["status"] == "pending" and row["canonical"]["messages"] and row["model"] is None


def test_a_settled_stream_lets_go_of_its_request_while_its_reply_lives_on(double_server, tmp_path):
    """mitmproxy's flow holds the reply in reference cycles, until a full garbage collection. Once the call
    is settled, the parsed request (an agent's whole history) must not ride along: it goes by reference
    counting, with the collector off, while the reply is still held here as the flow would hold it."""
    _, url = double_server
    script(url, "done")
    session = f"release-{uuid.uuid4().hex[:6]}"

    def requests_alive() -> int:
        return sum(1 for o in gc.get_objects() if type(o) is ChatRequest)

    async def main():
        writer = CaptureWriter(tmp_path / "captures.db")
        gateway = Gateway(writer, VLLMChat(url))
        before = requests_alive()
        out = await gateway.handle(request(session))
        assert requests_alive() > before  # the call holds it while it runs
        body = b"".join([chunk async for chunk in out.reply.call.chunks()])
        await out.reply.call.wait_settled()
        assert b"message_stop" in body
        alive = requests_alive()
        await gateway.backend.aclose()
        writer.close()
        return out, alive, before

    gc.disable()
    try:
        out, alive, before = run(main())
    finally:
        gc.enable()
    assert alive == before and out.reply.call.settled


def _text_events(body: bytes) -> list[str]:
    return [json.loads(line[5:])["delta"]["text"] for line in body.split(b"\n")
            if line.startswith(b"data:") and b'"text_delta"' in line]


WORDS = [f"w{i} " for i in range(60)]


def _vllm_events(fail: bool) -> list[bytes]:
    """vLLM's chat stream for WORDS, one chunk per token, as its server writes them (the token ids and
    logprobs asked for; `fail`: its in-stream error chunk after the 40th token instead of the end)."""
    def event(obj) -> bytes:
        return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"

    head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "m"}
    out = [event({**head, "prompt_token_ids": [1, 2, 3],
                  "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})]
    for i, word in enumerate(WORDS):
        if fail and i == 40:
            return out + [event({"error": {"message": "the engine died", "type": "InternalServerError", "code": 500}}),
                          b"data: [DONE]\n\n"]
        out.append(event({**head, "choices": [{"index": 0, "delta": {"content": word}, "token_ids": [100 + i],
                                               "logprobs": {"content": [{"token": word, "logprob": -0.5}]},
                                               "finish_reason": "stop" if i == len(WORDS) - 1 else None}]}))
    usage = {"prompt_tokens": 3, "completion_tokens": len(WORDS), "total_tokens": 3 + len(WORDS)}
    return out + [event({**head, "choices": [], "usage": usage}), b"data: [DONE]\n\n"]


def _stream_from(events: list[bytes], together: bool, tmp_path, session: str) -> bytes:
    """A TEST DOUBLE of vLLM's stream, for what the scripted double cannot do on cue: its chunks either in
    one write (what a busy loop reads at once) or 5 ms apart. The gateway streams it as the relay reads it."""
    async def upstream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await resp.prepare(request)
        for chunk in [b"".join(events)] if together else events:
            await resp.write(chunk)
            await asyncio.sleep(0 if together else 0.005)
        return resp

    async def main() -> bytes:
        async with serving("/v1/chat/completions", upstream) as url:
            writer = CaptureWriter(tmp_path / "captures.db")
            gateway = Gateway(writer, VLLMChat(url, model="m"))
            out = await gateway.handle(request(session))
            body = b"".join([chunk async for chunk in out.reply.call.chunks()])
            await out.reply.call.wait_settled()
            await gateway.backend.aclose()
            writer.close()
            return body

    return run(main())


def test_tokens_that_arrive_together_go_out_as_one_event_and_paced_ones_one_by_one(tmp_path):
    """The chunks one read brings (a busy loop, a fast model) are taken and rendered as one text event;
    chunks that come apart still go out as they come. The text and the capture are the same either way."""
    together = _text_events(_stream_from(_vllm_events(False), True, tmp_path, "together"))
    paced = _text_events(_stream_from(_vllm_events(False), False, tmp_path, "paced"))
    assert "".join(together) == "".join(paced) == "".join(WORDS)
    assert len(together) <= 3 and len(paced) >= 30
    reader = CaptureReader(tmp_path / "captures.db")
    (together_row,), (paced_row,) = reader.calls(session="together"), reader.calls(session="paced")
    assert together_row["completion_len"] == paced_row["completion_len"] == len(WORDS)


def test_text_that_came_with_a_failing_chunk_reaches_the_client_before_the_error(tmp_path):
    body = _stream_from(_vllm_events(True), True, tmp_path, "failing")
    assert "".join(_text_events(body)) == "".join(WORDS[:40]).rstrip()
    assert body.rstrip().endswith(b"}") and b"event: error" in body and b"the engine died" in body
    (row,) = CaptureReader(tmp_path / "captures.db").calls(session="failing")
    assert row["status"] == "error" and row["completion_len"] == 40


def test_coalesced_joins_adjacent_text_and_reasoning_never_calls():
    pieces = [ReasoningDelta("a"), ReasoningDelta("b"), TextDelta("c"), TextDelta("d"),
              ToolCallDelta(0, "{", id="x", name="f"), ToolCallDelta(0, "}"), TextDelta("e"), ReasoningDelta("f")]
    assert coalesced(pieces) == [ReasoningDelta("ab"), TextDelta("cd"), ToolCallDelta(0, "{", id="x", name="f"),
                                 ToolCallDelta(0, "}"), TextDelta("e"), ReasoningDelta("f")]
    assert pieces[0] == ReasoningDelta("a")  # the pieces themselves are left as they were
