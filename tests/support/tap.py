"""A recording relay ("tap") between polar and its upstream, for tests.

polar is started with `upstream=<tap.url>`; the tap forwards every request unchanged to the real
upstream and records what went out and what came back, so a test can hold each capture row
against the very answer vLLM gave for that call.

    with running_tap("http://127.0.0.1:8000") as tap:
        ...                                  # point polar at tap.url, make calls
        tap.model_calls()                    # the token-level exchanges, oldest first

A tap can also play a different upstream: `refuse` paths get a 404 as from a server without them
(a vLLM started without --enable-scale-out has no /inference/v1/generate), and `edit` rewrites a
JSON answer before polar sees it (what the tap records is what polar saw).

Streamed answers pass through as they come (chunk by chunk, so streaming stays real), and are
recorded as the one answer their chunks add up to, in the shape of the same call made without
streaming: token ids and logprobs concatenated, the prompt ids of the first chunk, the finish of
the last (`stream_answer`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

# Hop-by-hop and framing headers: httpx sets its own for the forwarded request and the reply.
_NOT_FORWARDED = {"host", "content-length", "connection", "transfer-encoding", "keep-alive", "content-encoding"}
MODEL_PATHS = ("/v1/chat/completions", "/v1/completions", "/inference/v1/generate")


@dataclass
class Exchange:
    method: str
    path: str
    request: Any  # the JSON body polar sent (None when it sent none)
    status: int
    response: Any  # the JSON body the upstream answered (None when it was not JSON)


class Tap:
    def __init__(self, upstream: str, timeout: float = 600, refuse: tuple[str, ...] = (),
                 edit: Callable[[str, Any], Any] | None = None):
        self.upstream = upstream.rstrip("/")
        self.timeout = timeout
        self.refuse = refuse
        self.edit = edit  # (path, answer JSON) → the answer JSON polar gets
        self.url = ""  # set once it listens
        self._exchanges: list[Exchange] = []
        self._lock = threading.Condition()
        self._streaming = 0  # streams relayed and not yet recorded
        self.app = Starlette(routes=[Route("/{path:path}", self.relay, methods=["GET", "POST", "HEAD", "DELETE"])])

    async def relay(self, request: Request) -> Response:
        body = await request.body()
        if request.url.path in self.refuse:
            with self._lock:
                self._exchanges.append(Exchange(request.method, request.url.path, _json(body), 404, None))
            return Response('{"detail":"Not Found"}', status_code=404, media_type="application/json")
        headers = {k: v for k, v in request.headers.items() if k.lower() not in _NOT_FORWARDED}
        url = self.upstream + request.url.path + (f"?{request.url.query}" if request.url.query else "")
        sent = _json(body)
        if isinstance(sent, dict) and sent.get("stream") and self.edit is None:
            return await self._stream(request, url, body, headers)
        async with httpx.AsyncClient(timeout=self.timeout) as client:
            answer = await client.request(request.method, url, content=body, headers=headers)
        content, answered = answer.content, _json(answer.content)
        if self.edit is not None and answered is not None:
            answered = self.edit(request.url.path, answered)
            content = json.dumps(answered).encode()
        exchange = Exchange(request.method, request.url.path, _json(body), answer.status_code, answered)
        with self._lock:
            self._exchanges.append(exchange)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in _NOT_FORWARDED}
        return Response(content, status_code=answer.status_code, headers=kept)

    async def _stream(self, request: Request, url: str, body: bytes, headers: dict) -> Response:
        client = httpx.AsyncClient(timeout=self.timeout)
        answer = await client.send(client.build_request(request.method, url, content=body, headers=headers), stream=True)
        kept = {k: v for k, v in answer.headers.items() if k.lower() not in _NOT_FORWARDED}
        received: list[bytes] = []

        async def relay():
            with self._lock:  # counted once it runs: a body never started is never recorded either
                self._streaming += 1
            try:
                async for data in answer.aiter_raw():
                    received.append(data)
                    yield data
            finally:
                try:
                    await answer.aclose()
                    await client.aclose()
                    raw = b"".join(received)
                    answered = stream_answer(raw) if answer.status_code == 200 else _json(raw)
                    with self._lock:
                        self._exchanges.append(Exchange(request.method, request.url.path, _json(body),
                                                        answer.status_code, answered))
                finally:
                    with self._lock:
                        self._streaming -= 1
                        self._lock.notify_all()

        return StreamingResponse(relay(), status_code=answer.status_code, headers=kept)

    def exchanges(self, wait: float = 10.0) -> list[Exchange]:
        """What was recorded, once every stream relayed so far has ended (up to `wait` s): polar may answer
        its client on the stream's last event, before the upstream's connection has closed behind it."""
        with self._lock:
            self._lock.wait_for(lambda: self._streaming == 0, timeout=wait)
            return list(self._exchanges)

    def model_calls(self) -> list[Exchange]:
        """Answered sampling calls (chat, completions, generate); not polar's probes of the endpoint."""
        return [
            e for e in self.exchanges()
            if e.method == "POST" and e.path in MODEL_PATHS and e.status == 200 and isinstance(e.response, dict)
        ]

    def clear(self) -> None:
        with self._lock:
            self._exchanges.clear()


def stream_answer(raw: bytes) -> dict[str, Any] | None:
    """A vLLM SSE stream (chat, completions or generate) as the answer the same call gives unstreamed."""
    chunks = [json.loads(line[5:]) for line in raw.decode().splitlines()
              if line.startswith("data:") and line[5:].strip() != "[DONE]"]
    if not chunks:
        return None
    answer: dict[str, Any] = {k: v for k, v in chunks[0].items() if k != "choices"}
    choice: dict[str, Any] = {"token_ids": [], "logprobs": None}
    message: dict[str, Any] = {"role": "assistant", "content": "", "reasoning": ""}
    for chunk in chunks:
        if chunk.get("usage"):
            answer["usage"] = chunk["usage"]
        for part in chunk.get("choices") or []:
            choice["token_ids"] += part.get("token_ids") or []
            lp = part.get("logprobs")
            if lp:
                merged = choice["logprobs"] or {}
                for key, value in lp.items():
                    merged[key] = (merged.get(key) or []) + (value or []) if isinstance(value, list) else value
                choice["logprobs"] = merged
            delta = part.get("delta") or {}
            message["content"] += delta.get("content") or ""
            message["reasoning"] += delta.get("reasoning") or ""
            if "text" in part:
                choice["text"] = choice.get("text", "") + (part["text"] or "")
            for key in ("finish_reason", "stop_reason", "weight_versions"):
                if part.get(key) is not None:
                    choice[key] = part[key]
    if "delta" in (chunks[0].get("choices") or [{}])[0]:
        choice["message"] = message
    answer["choices"] = [choice]
    return answer


def _json(raw: bytes) -> Any:
    if not raw:
        return None
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None


@contextmanager
def running_tap(upstream: str, **options) -> Iterator[Tap]:
    """A tap in front of `upstream` (options as for Tap), served on a free local port for the duration of the block."""
    from polar.doubles.scripted_vllm import BackgroundServer  # a plain uvicorn-on-a-thread runner

    tap = Tap(upstream, **options)
    server = BackgroundServer(tap.app)
    tap.url = server.start()
    try:
        yield tap
    finally:
        server.stop()
