#!/usr/bin/env python3
"""The benchmarks' upstream: the scripted vLLM double behind an answer cache, with (paced) streaming.

The proxy benchmarks measure what a proxy adds, so the upstream must be cheap, stable and the same
for every column. This server answers `/v1/chat/completions` and `/inference/v1/generate` (vLLM's
token-in, token-out endpoint) with exactly the bytes the scripted vLLM double
(polar/doubles/scripted_vllm.py, real tokenizer) gives for that request body: the double computes
each distinct body once, in-process, and every repeat of that body is served from memory.
It also streams, which the double does not: `"stream": true` gets the same answer as the events a
streaming vLLM sends, one per sampled token — chat: `chat.completion.chunk`s (a role chunk with the
prompt ids when `return_token_ids`, then the text split evenly over the tokens, each with its id and
logprob when asked for), generate: chunks of token ids and their logprobs (the prompt ids on the
first, the finish reason on the last) — a usage chunk when `stream_options.include_usage`, then `[DONE]`.

Streams can be paced like a real engine: `--first-token-delay-ms` before the first token (queue and
prefill; as uvicorn does, the HTTP headers go out only with it) and `--token-delay-ms` between
tokens, on a fixed schedule from the request's arrival (so every stream of an answer takes the same
time). Both default to 0 (unpaced). `--answer-tokens N` makes the double answer every conversation
with one text of about N tokens (default: its short scripted answer); `--script FILE` gives it a
whole script instead (reasoning, text, tool calls), `--max-model-len` its context window,
`--cache-entries N` keeps only the N latest answers (sessions that grow turn by turn never repeat a body). `GET /v1/models` is the
double's (with `max_model_len`), so polar's token-faithful mode runs against it too.
`--segment-cache` makes the double tokenize a rendered prompt one message at a time, keeping each message's ids
(`SegmentTokenizer`, with polar's own `SegmentIds`): the same ids, at the cost of what is new, where vLLM tokenizes the whole prompt on every chat
call. For runs where that work, ~3 µs a token here, would be the wall time (256 sessions at 100k tokens); it makes
chat-mode targets look faster than against a real vLLM.
`GET /_bench/stats` tells how many calls missed the cache (one per distinct body) and lists the
bodies, and the last body received on each path; `GET /_bench/streams` when each paced stream's
request arrived and when its first token was written (wall clock).

    python scripts/bench_upstream.py --port 8000 [--tokenizer DIR] [--token-delay-ms 10]
                                     [--first-token-delay-ms 20] [--answer-tokens 200]
                                     [--script FILE] [--max-model-len 32768] [--cache-entries N] [--segment-cache]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import httpx
from aiohttp import web

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from polar.json_values import compact  # noqa: E402 — after the repo is on the path

DEFAULT_TOKENIZER = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "polar")) / "models" / "qwen35-tiny"
STREAM_KEYS = ("stream", "stream_options")  # do not change the answer, only its framing
CHAT, GENERATE = "/v1/chat/completions", "/inference/v1/generate"


def long_answer(tokenizer: Any, tokens: int) -> str:
    """A plain text answer of about `tokens` tokens (whole sentences, so it tokenizes the same every time)."""
    sentences, i = [], 0
    while len(tokenizer.encode(" ".join(sentences), add_special_tokens=False)) < tokens - 1:  # - 1: the stop id
        i += 1
        sentences.append(f"Sentence {i} of the answer keeps the stream going at a steady pace.")
    return " ".join(sentences)


class SegmentTokenizer:
    """A tokenizer whose `encode(text, add_special_tokens=False)` reuses the ids of every piece of the text
    before a `<|im_start|>` (polar's own `SegmentIds`, polar/tokens/segments.py: exact for a template's prompt).
    Its first `check` calls are compared with the whole text's encoding, and a difference stops the double.
    Everything else is the tokenizer's own."""

    def __init__(self, tokenizer: Any, marker: str = "<|im_start|>", max_ids: int = 64_000_000, check: int = 3):
        from polar.tokens.segments import SegmentIds

        def differ() -> None:
            raise RuntimeError("the segment cache's ids differ from the tokenizer's: run without --segment-cache")

        self._tokenizer = tokenizer
        self._ids = SegmentIds(lambda text: tokenizer.encode(text, add_special_tokens=False), marker,
                               max_ids=max_ids, check=check, on_mismatch=differ)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._tokenizer, name)

    def __len__(self) -> int:
        return len(self._tokenizer)

    def encode(self, text: str, add_special_tokens: bool = True, **kwargs: Any) -> list[int]:
        if add_special_tokens or kwargs:
            return self._tokenizer.encode(text, add_special_tokens=add_special_tokens, **kwargs)
        return self._ids(text)


class CachedDouble:
    """The double's answer to each distinct request body (per path), computed once."""

    def __init__(self, tokenizer_dir: str | Path, answer_tokens: int | None = None, script: Path | None = None,
                 max_model_len: int = 32768, cache_entries: int | None = None, segment_cache: bool = False):
        from polar.doubles.script import Script
        from polar.doubles.scripted_vllm import ScriptedVLLM

        self.double = ScriptedVLLM(tokenizer_dir, max_model_len=max_model_len)
        if segment_cache:
            self.double.tokenizer = SegmentTokenizer(self.double.tokenizer)
        if script:
            self.double.script = Script.from_json(json.loads(script.read_text()))
        elif answer_tokens:
            text = long_answer(self.double.tokenizer, answer_tokens)
            self.double.script = Script([{"match": None, "steps": [{"content": text}]}])
        self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=self.double.app), base_url="http://double")
        self.answers: dict[str, tuple[int, bytes]] = {}  # oldest first: evicted first past `cache_entries`
        self.cache_entries = cache_entries
        self.last: dict[str, Any] = {}  # path → the last body received there, as received
        self.streams: list[tuple[str, float, float]] = []  # (path, arrival, first token written): wall clock
        self.streamed: dict[tuple[str, bool], tuple[list[bytes], list[bytes], list[bytes]]] = {}
        self.calls = 0
        self.misses = 0

    async def answer(self, path: str, body: dict[str, Any]) -> tuple[int, bytes, str]:
        """(status, body, cache key) of the double's whole answer."""
        self.calls += 1
        self.last[path] = body
        plain = {k: v for k, v in body.items() if k not in STREAM_KEYS}
        key = f"{path} {json.dumps(plain, sort_keys=True)}"
        if key not in self.answers:
            self.misses += 1
            resp = await self.client.post(path, json=plain)
            self.answers[key] = (resp.status_code, resp.content)
            self._evict()
        return (*self.answers[key], key)

    def _evict(self) -> None:
        """Past `cache_entries`, the oldest answers go (and their streams): growing sessions never repeat a body."""
        while self.cache_entries and len(self.answers) > self.cache_entries:
            oldest = next(iter(self.answers))
            del self.answers[oldest]
            for usage in (False, True):
                self.streamed.pop((oldest, usage), None)

    def stream_parts(self, key: str, usage: bool, build: Any) -> tuple[list[bytes], list[bytes], list[bytes]]:
        """An answer's stream events, built once per answer (and usage choice): a repeat costs nothing."""
        if (key, usage) not in self.streamed:
            self.streamed[(key, usage)] = build(json.loads(self.answers[key][1]), usage)
        return self.streamed[(key, usage)]


def _sse(obj: Any) -> bytes:
    # As vLLM writes its events (pydantic's model_dump_json): compact, UTF-8 as it is.
    return b"data: " + compact(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


def _split(text: str, start: int, end: int, reasoning_end: int) -> dict[str, str]:
    """A token's delta: its part of text[start:end] before `reasoning_end` as reasoning, the rest as content."""
    delta: dict[str, str] = {}
    if start < reasoning_end:
        delta["reasoning"] = text[start:min(end, reasoning_end)]
    if end > reasoning_end or reasoning_end == 0:
        delta["content"] = text[max(start, reasoning_end):end]
    return delta


def sse_chunks(answer: dict[str, Any], with_usage: bool) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """A non-streamed chat completion as the `data:` events a streaming vLLM would send: (the role
    chunk, one chunk per token, the closing chunks)."""
    choice = answer["choices"][0]
    message = choice["message"]
    ids = choice.get("token_ids") or []
    lp = (choice.get("logprobs") or {}).get("content") or []
    n = max(len(ids), len(lp), 1)
    # The reasoning first, then the content, as vLLM's reasoning parser streams them (`reasoning` deltas, then
    # `content`), spread evenly over the sampled tokens; a token over the boundary carries the end of one and
    # the start of the other.
    reasoning = message.get("reasoning") or message.get("reasoning_content") or ""
    text = reasoning + (message.get("content") or "")
    cuts = [round(i * len(text) / n) for i in range(n + 1)]
    head = {"id": answer["id"], "object": "chat.completion.chunk", "created": answer["created"],
            "model": answer["model"]}

    def event(delta: dict[str, Any], finish: str | None = None, logprobs: Any = None, top: Any = None,
              **extra: Any) -> bytes:
        chunk = {**head, "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish,
                                      **extra}], **(top or {})}
        return _sse(chunk)

    prompt = answer.get("prompt_token_ids")  # vLLM sends them with the role, when asked for token ids
    role = [event({"role": "assistant", "content": ""}, top={"prompt_token_ids": prompt} if prompt else None)]
    tokens = []
    for i in range(n):
        extra = {"token_ids": [ids[i]]} if i < len(ids) else {}
        logprobs = {"content": [lp[i]]} if i < len(lp) else None
        tokens.append(event(_split(text, cuts[i], cuts[i + 1], len(reasoning)), logprobs=logprobs, **extra))
    tail = []
    if message.get("tool_calls"):
        tail.append(event({"tool_calls": [{**c, "index": k} for k, c in enumerate(message["tool_calls"])]}))
    tail.append(event({}, choice["finish_reason"]))
    if with_usage:
        tail.append(_sse({**head, "choices": [], "usage": answer["usage"]}))
    return role, tokens, [*tail, DONE]


def generate_chunks(answer: dict[str, Any], with_usage: bool) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """A whole /inference/v1/generate answer as vLLM's token stream (serve_tokens_stream_generator):
    one chunk per token id with its logprob, the prompt ids on the first, the finish reason and weight
    versions on the last, then the usage chunk (`choices: []`) when asked for, then `[DONE]`."""
    choice = answer["choices"][0]
    ids = choice.get("token_ids") or []
    lp = (choice.get("logprobs") or {}).get("content")
    prompt = answer.get("prompt_token_ids")
    tokens = []
    for i, token_id in enumerate(ids):
        last = i == len(ids) - 1
        out = {"index": 0, "finish_reason": choice.get("finish_reason") if last else None,
               "stop_reason": choice.get("stop_reason") if last else None, "token_ids": [token_id],
               "routed_experts": None, "sampling_mask": None,
               "weight_versions": choice.get("weight_versions") if last else None,
               "logprobs": {"content": [lp[i]]} if lp is not None else None}
        first = {"prompt_token_ids": prompt} if i == 0 and prompt is not None else {}
        tokens.append(_sse({"request_id": answer["request_id"], "usage": None, **first, "output_mode": "tokens",
                            "choices": [out]}))
    tail = [_sse({"request_id": answer["request_id"], "usage": answer["usage"], "output_mode": "tokens",
                  "choices": []})] if with_usage else []
    return [], tokens, [*tail, DONE]


async def send_stream(request: web.Request, parts: tuple[list[bytes], list[bytes], list[bytes]],
                      first_s: float, token_s: float, log: list | None = None,
                      arrived: tuple[float, float] | None = None) -> web.StreamResponse:
    """The events, paced: token k leaves at arrival + first_s + k * token_s (the headers with the first,
    and the role chunk, as vLLM sends them); the closing chunks follow the last token at once.
    `arrived`: (loop time, wall clock) the request arrived (default: now); `log` gets (path, arrival,
    first token written), wall clock."""
    head, tokens, tail = parts
    loop = asyncio.get_running_loop()
    start, arrival = arrived or (loop.time(), time.time())
    if first_s > 0 and (wait := start + first_s - loop.time()) > 0:
        await asyncio.sleep(wait)  # queue + prefill: like uvicorn, no headers before the first token
    resp = web.StreamResponse(headers={"content-type": "text/event-stream", "cache-control": "no-cache"})
    await resp.prepare(request)
    if first_s <= 0 and token_s <= 0:  # unpaced: every event as fast as it can be written
        for piece in (*head, *tokens, *tail):
            await resp.write(piece)
    else:
        writes = [b"".join([*head, *tokens[:1]]), *tokens[1:]]
        for k, chunk in enumerate(writes):
            if k and (wait := start + first_s + k * token_s - loop.time()) > 0:
                await asyncio.sleep(wait)
            if k == 0 and log is not None:
                del log[:-100_000]  # bounded
                log.append((request.path, arrival, time.time()))
            await resp.write(chunk)
        await resp.write(b"".join(tail))
    await resp.write_eof()
    return resp


def make_app(cache: CachedDouble, first_token_delay_s: float = 0.0, token_delay_s: float = 0.0) -> web.Application:
    def endpoint(path: str, chunks):
        async def handle(request: web.Request) -> web.StreamResponse:
            arrived = asyncio.get_running_loop().time(), time.time()
            try:
                body = await request.json()
            except json.JSONDecodeError:
                return web.json_response({"error": {"message": "body is not JSON", "code": 400}}, status=400)
            if not isinstance(body, dict):
                return web.json_response({"error": {"message": "body is not an object", "code": 400}}, status=400)
            status, raw, key = await cache.answer(path, body)
            if not body.get("stream") or status != 200:
                return web.Response(body=raw, status=status, content_type="application/json")
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return await send_stream(request, cache.stream_parts(key, usage, chunks), first_token_delay_s,
                                     token_delay_s, cache.streams, arrived)

        return handle

    async def models(request: web.Request) -> web.Response:
        resp = await cache.client.get("/v1/models")
        return web.Response(body=resp.content, content_type="application/json")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def stats(request: web.Request) -> web.Response:
        return web.json_response({"calls": cache.calls, "misses": cache.misses, "bodies": list(cache.answers),
                                  "last": cache.last})

    async def streams(request: web.Request) -> web.Response:
        return web.json_response(cache.streams)

    app = web.Application()
    app.router.add_post(CHAT, endpoint(CHAT, sse_chunks))
    app.router.add_post(GENERATE, endpoint(GENERATE, generate_chunks))
    app.router.add_get("/v1/models", models)
    app.router.add_get("/health", health)
    app.router.add_get("/_bench/stats", stats)
    app.router.add_get("/_bench/streams", streams)
    return app


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help="tokenizer dir for the scripted double")
    ap.add_argument("--token-delay-ms", type=float, default=0.0, help="a stream's pace: ms between token chunks")
    ap.add_argument("--first-token-delay-ms", type=float, default=0.0,
                    help="ms before a stream's first token (queue + prefill; its headers wait as well)")
    ap.add_argument("--answer-tokens", type=int, default=None,
                    help="answer every conversation with a text of about this many tokens")
    ap.add_argument("--script", type=Path, help="the double's script (JSON: polar/doubles/script.py) instead")
    ap.add_argument("--max-model-len", type=int, default=32768, help="the context window the double serves")
    ap.add_argument("--cache-entries", type=int, default=None, help="keep only this many answers (default: all)")
    ap.add_argument("--segment-cache", action="store_true",
                    help="tokenize prompts one message at a time, keeping each message's ids (same ids, O(new) work)")
    args = ap.parse_args()
    if not (Path(args.tokenizer) / "tokenizer.json").exists():
        ap.error(f"no tokenizer at {args.tokenizer} (build one: scripts/build_tiny_model.py --tokenizer-only)")
    app = make_app(CachedDouble(args.tokenizer, args.answer_tokens, args.script, args.max_model_len, args.cache_entries,
                                args.segment_cache),
                   args.first_token_delay_ms / 1000,
                   args.token_delay_ms / 1000)
    # backlog: 256 sessions connect at once (aiohttp listens with 128; uvicorn, under vLLM, with 2048).
    web.run_app(app, host=args.host, port=args.port, print=None, access_log=None, backlog=4096)


if __name__ == "__main__":
    main()
