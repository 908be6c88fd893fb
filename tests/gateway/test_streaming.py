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

from polar.canonical import ChatRequest
from polar.capture.reader import CaptureReader
from polar.capture.writer import CaptureWriter
from polar.gateway.pipeline import Gateway, GatewayRequest
from polar.gateway.streaming import StreamReply
from polar.upstream.vllm_chat import VLLMChat

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
    # what was captured before is still there, in the file polar had open
    (row,) = CaptureReader(tmp_path / "moved-away.db").calls(session=session)
    assert row["status"] == "pending"


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
