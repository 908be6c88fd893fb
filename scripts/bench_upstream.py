#!/usr/bin/env python3
"""The benchmarks' upstream: the scripted vLLM double behind an answer cache, with streaming.

The proxy benchmarks measure what a proxy adds, so the upstream must be cheap, stable and the same
for every column. This server answers `/v1/chat/completions` with exactly the bytes the scripted vLLM
double (polar/doubles/scripted_vllm.py, real tokenizer) gives for that request body: the double
computes each distinct body once, in-process, and every repeat of that body is served from memory.
It also streams, which the double does not: `"stream": true` gets the same answer as OpenAI
`chat.completion.chunk` events, one per sampled token (text split evenly over them, with that token's
id and logprob when the request asked for them), a usage chunk when `stream_options.include_usage`,
then `[DONE]`. `GET /_bench/stats` tells how many calls missed the cache (one per distinct body) and lists the bodies.

    python scripts/bench_upstream.py --port 8000 [--tokenizer DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
DEFAULT_TOKENIZER = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "polar")) / "models" / "qwen35-tiny"
STREAM_KEYS = ("stream", "stream_options")  # do not change the answer, only its framing


class CachedDouble:
    """The double's answer to each distinct request body, computed once."""

    def __init__(self, tokenizer_dir: str | Path):
        from polar.doubles.scripted_vllm import ScriptedVLLM

        self.double = ScriptedVLLM(tokenizer_dir)
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.double.app), base_url="http://double")
        self.answers: dict[str, tuple[int, bytes]] = {}
        self.calls = 0
        self.misses = 0

    async def answer(self, body: dict[str, Any]) -> tuple[int, bytes]:
        self.calls += 1
        plain = {k: v for k, v in body.items() if k not in STREAM_KEYS}
        key = json.dumps(plain, sort_keys=True)
        if key not in self.answers:
            self.misses += 1
            resp = await self.client.post("/v1/chat/completions", json=plain)
            self.answers[key] = (resp.status_code, resp.content)
        return self.answers[key]


def sse_chunks(answer: dict[str, Any], with_usage: bool) -> list[bytes]:
    """A non-streamed chat completion as the `data:` events a streaming vLLM would send."""
    choice = answer["choices"][0]
    message = choice["message"]
    ids = choice.get("token_ids") or []
    lp = (choice.get("logprobs") or {}).get("content") or []
    n = max(len(ids), len(lp), 1)
    text = message.get("content") or ""
    cuts = [round(i * len(text) / n) for i in range(n + 1)]
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
            "model": answer["model"]}

    def event(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None, **extra: Any) -> bytes:
        chunk = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
                                      **extra}]}
        return b"data: " + json.dumps(chunk).encode() + b"\n\n"

    out = [event({"role": "assistant", "content": ""})]
    for i in range(n):
        extra = {"token_ids": [ids[i]]} if i < len(ids) else {}
        logprobs = {"content": [lp[i]]} if i < len(lp) else None
        out.append(event({"content": text[cuts[i]:cuts[i + 1]]}, logprobs=logprobs, **extra))
    if message.get("tool_calls"):
        out.append(event({"tool_calls": [{**c, "index": k} for k, c in enumerate(message["tool_calls"])]}))
    out.append(event({}, choice["finish_reason"]))
    if with_usage:
        out.append(b"data: " + json.dumps({**head, "choices": [], "usage": answer["usage"]}).encode() + b"\n\n")
    out.append(b"data: [DONE]\n\n")
    return out


def make_app(cache: CachedDouble) -> web.Application:
    async def chat(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.json()
        except json.JSONDecodeError:
            return web.json_response({"error": {"message": "body is not JSON", "code": 400}}, status=400)
        status, raw = await cache.answer(body)
        if not body.get("stream") or status != 200:
            return web.Response(body=raw, status=status, content_type="application/json")
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
        await resp.prepare(request)
        for chunk in sse_chunks(json.loads(raw), usage):
            await resp.write(chunk)
        await resp.write_eof()
        return resp

    async def models(request: web.Request) -> web.Response:
        resp = await cache.client.get("/v1/models")
        return web.Response(body=resp.content, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"calls": cache.calls, "misses": cache.misses, "bodies": list(cache.answers)})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/_bench/stats", stats)
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="tokenizer dir for the scripted double")
    args = ap.parse_args()
    if not (Path(args.tokenizer) / "tokenizer.json").exists():
        ap.error(f"no tokenizer at {args.tokenizer} (build one: scripts/build_tiny_model.py --tokenizer-only)")
    web.run_app(make_app(CachedDouble(args.tokenizer)), host=args.host, port=args.port, print=None,
                access_log=None)


if __name__ == "__main__":
    main()
