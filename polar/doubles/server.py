"""ScriptedVLLM — a TEST DOUBLE for a vLLM OpenAI-compatible server: the endpoints.

It exists because a real model cannot be made to call a given tool on cue, and because real vLLM
on CPU is slow to start. It speaks the vLLM endpoints polar uses, with the real tokenizer and the
same chat template as the gateway (`chat_template=`, or switched at run time through
POST /_double/template), so prompt token ids are what vLLM would compute; the *answer* comes from
a script (script.py), written the way that template's model family writes a turn (model_format.py)
and tokenised, so sampled ids, text, reasoning and tool calls agree with each other.
Streams (`stream: true`) tell the same sample token by token in vLLM's SSE shapes (stream.py), paced
like a real model and aborted when the client leaves (sse.py). `tests/integration/test_double_vs_vllm.py`
keeps its wire format honest against real vLLM.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import time
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from polar.doubles import stream, wire
from polar.doubles.logprobs import FakeLogprobs
from polar.doubles.model_format import ModelFormat
from polar.doubles.script import Script
from polar.doubles.sse import MID_STREAM, EventStream, Pace, Stats, wait_unless_gone
from polar.doubles.stream import Sample

FINGERPRINT = "scripted-vllm-double"
# vLLM's max_tokens when a request names none: 16 for /v1/completions, else the rest of the window
# (/inference/v1/generate too: vLLM 0.32 applies the server-side default there, not SamplingParams' 16).
_DEFAULT_MAX_TOKENS = {"chat": None, "completions": 16, "generate": None}


class ScriptedVLLM:
    def __init__(
        self,
        tokenizer_dir: str | Path,
        served_model_name: str = "polar-tiny",
        max_model_len: int = 32768,
        script: Script | None = None,
        latency_s: float = 0.0,
        chat_template: str | Path | None = None,
        token_delay_s: float = 0.0,
        first_token_delay_s: float = 0.0,
    ):
        self.home_vocabulary = str(tokenizer_dir)  # what `use_vocabulary(None)` returns to
        self._tokenizers: dict[str, Any] = {}
        self.use_vocabulary(tokenizer_dir)
        self.use_template(chat_template)
        self.model_name = served_model_name
        self.max_model_len = max_model_len
        self.script = script or Script()
        self.latency_s = latency_s
        self.fingerprint = FINGERPRINT
        self.requests: list[dict[str, Any]] = []  # what polar sent (path, headers, body), for tests
        self.stats = Stats()  # GET /_double/stats
        self.pace = Pace()  # POST /_double/pace
        self.pace.update({"token_delay_s": token_delay_s, "first_token_delay_s": first_token_delay_s})
        self.fault: dict[str, Any] = {}
        self.app = Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
                Route("/inference/v1/generate", self.generate, methods=["POST"]),
                Route("/tokenize", self.tokenize, methods=["POST"]),
                Route("/detokenize", self.detokenize, methods=["POST"]),
                Route("/_double/script", self.set_script, methods=["POST"]),
                Route("/_double/fault", self.set_fault, methods=["POST"]),
                Route("/_double/template", self.set_template, methods=["GET", "POST"]),
                Route("/_double/requests", self.get_requests, methods=["GET", "DELETE"]),
                Route("/_double/pace", self.set_pace, methods=["GET", "POST"]),
                Route("/_double/stats", self.get_stats, methods=["GET", "DELETE"]),
            ]
        )

    def use_vocabulary(self, tokenizer_dir: str | Path | None) -> None:
        """Sample and count with this tokenizer (None: the one the double was built with): a family's stand-in
        vocabulary for its real template. Set the template after it (the end-of-turn id is this vocabulary's)."""
        # a heavy import, only when a double is built
        from transformers import AutoTokenizer

        self.model_dir = str(tokenizer_dir or self.home_vocabulary)
        if self.model_dir not in self._tokenizers:  # loaded once per directory
            self._tokenizers[self.model_dir] = AutoTokenizer.from_pretrained(self.model_dir)
        self.tokenizer = self._tokenizers[self.model_dir]
        self.think_start_id = self.tokenizer.convert_tokens_to_ids("<think>")
        self.think_end_id = self.tokenizer.convert_tokens_to_ids("</think>")
        self.vocab_size = len(self.tokenizer)
        self.logprobs = FakeLogprobs(self.tokenizer)

    def use_template(self, chat_template: str | Path | None) -> None:
        """Render prompts with this template (a file path or the text; None: the tokenizer's own) and
        answer in the output format of its model family."""
        if chat_template is None or (isinstance(chat_template, str) and not chat_template.strip()):
            text = self.tokenizer.chat_template
        elif isinstance(chat_template, Path) or "{" not in chat_template:
            text = Path(chat_template).read_text()
        else:
            text = chat_template
        if not isinstance(text, str) or not text.strip():
            raise ValueError("no chat template: the tokenizer has none and none was given")
        fmt = ModelFormat.for_template(text)
        for stop in fmt.stop_tokens:
            eos_id = self.tokenizer.convert_tokens_to_ids(stop)
            if not isinstance(eos_id, int) or self.tokenizer.convert_ids_to_tokens(eos_id) != stop:
                raise ValueError(f"the tokenizer has no {stop!r} token, which ends a {fmt.family} turn (a stand-in "
                                 f"vocabulary carrying the family's special tokens: tests/support/stand_in.py)")
        self.template_text, self.format = text, fmt
        self.eos_id = self.tokenizer.convert_tokens_to_ids(fmt.end_of_turn)

    # -- admin -------------------------------------------------------------------------------

    async def set_template(self, request: Request) -> Response:
        """Test-only: switch the template at run time (`{"chat_template": path or text}`; null: the tokenizer's), and
        the vocabulary with it when the body names one (`"tokenizer": dir`; null: the double's own)."""
        if request.method == "POST":
            before = self.model_dir
            try:
                body = await request.json()
                if "tokenizer" in body:
                    self.use_vocabulary(body["tokenizer"])
                self.use_template(body.get("chat_template"))
            except (ValueError, OSError, AttributeError, json.JSONDecodeError) as exc:
                self.use_vocabulary(before)  # the template it had still ends its turns in this vocabulary
                return wire.error(400, f"bad template: {exc}")
        return JSONResponse({"family": self.format.family, "knows_think": self.format.knows_think,
                             "tokenizer": self.model_dir,
                             "sha256": hashlib.sha256(self.template_text.encode()).hexdigest()})

    async def set_script(self, request: Request) -> Response:
        try:
            self.script = Script.from_json(await request.json())
        except (ValueError, json.JSONDecodeError) as exc:
            return wire.error(400, f"bad script: {exc}")
        return JSONResponse({"rules": len(self.script.rules)})

    async def set_fault(self, request: Request) -> Response:
        """Make the next `count` model calls fail: status (e.g. 500), garbage, timeout, reset; or the next
        `count` streams: die_mid_stream (the connection breaks after `after_tokens` tokens, no [DONE]) or
        error_mid_stream (vLLM's streaming error chunk, then [DONE]). Plain calls leave those to streams."""
        self.fault = await request.json()
        return JSONResponse(self.fault)

    async def set_pace(self, request: Request) -> Response:
        """Test-only: `{"token_delay_s": s, "first_token_delay_s": s}` (either); GET: the current values."""
        if request.method == "POST":
            try:
                self.pace.update(await request.json())
            except (ValueError, TypeError, AttributeError, json.JSONDecodeError) as exc:
                return wire.error(400, f"bad pace: {exc}")
        return JSONResponse({"token_delay_s": self.pace.token_delay_s,
                             "first_token_delay_s": self.pace.first_token_delay_s})

    async def get_stats(self, request: Request) -> Response:
        """Counters of generations and streams (DELETE zeroes them, but for the streams still running)."""
        if request.method == "DELETE":
            self.stats = Stats(active_streams=self.stats.active_streams)
        return JSONResponse(self.stats.as_dict())

    @property
    def generations(self) -> int:
        """Requests with a body received, ever (`requests` keeps only the last 1000)."""
        return self.stats.generations

    async def get_requests(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.requests.clear()
        return JSONResponse(self.requests)

    async def _body(self, request: Request, record: bool = True) -> dict[str, Any]:
        """The JSON object body, refused as vLLM's request validation would refuse it."""
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise wire.Invalid(wire.validation(f"body.{getattr(exc, 'pos', 0)}", "json_invalid", "JSON decode error")) from None
        if record:
            self.stats.generations += bool(body)
            self.requests.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
            del self.requests[:-1000]  # bounded: long benchmarks must not grow it forever
        if not isinstance(body, dict):
            raise wire.Invalid(wire.validation("body", "model_attributes_type",
                                       "Input should be a valid dictionary or object to extract fields from"))
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise wire.Invalid(wire.error(404, f"The model `{model}` does not exist. Valid aliases: {self.model_name}.",
                                  "NotFoundError", "model"))
        return body

    async def _maybe_fault(self, body: dict[str, Any]) -> Response | dict[str, Any] | None:
        """The scripted failure this call suffers: a response to send instead, or the mid-stream fault its
        stream is to suffer (a plain call leaves those to the next stream)."""
        if not self.fault or self.fault.get("count", 1) <= 0:
            return None
        mode = self.fault.get("mode")
        if mode in MID_STREAM and not body.get("stream"):
            return None
        self.fault["count"] = self.fault.get("count", 1) - 1
        if mode in MID_STREAM:
            return dict(self.fault)
        if mode == "timeout":
            await asyncio.sleep(float(self.fault.get("seconds", 3600)))
        if mode == "garbage":
            return Response(b"\x00not json at all", status_code=200, media_type="application/json")
        if mode == "reset":
            return wire.ResetMidBody()
        if mode == "status":
            return wire.error(int(self.fault.get("status", 500)), "scripted upstream failure")
        return None

    def _stream(self, steps, fault: Response | dict[str, Any] | None) -> Response:
        return EventStream(steps, self.pace, self.stats, fault if isinstance(fault, dict) else None)

    async def _busy(self, request: Request, tokens: int) -> bool:
        """A plain answer takes as long as its stream would; False when the client left meanwhile."""
        if await wait_unless_gone(self.pace.total(tokens), request.receive):
            self.stats.calls_aborted += 1
            return False
        return True

    # -- vLLM endpoints ----------------------------------------------------------------------

    async def health(self, request: Request) -> Response:
        return Response(status_code=200)

    async def models(self, request: Request) -> Response:
        created = int(time.time())
        permission = {"id": f"modelperm-{secrets.token_hex(8)}", "object": "model_permission", "created": created,
                      "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                      "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                      "organization": "*", "group": None, "is_blocking": False}
        card = {"id": self.model_name, "object": "model", "created": created, "owned_by": "vllm",
                "root": self.model_dir, "parent": None, "max_model_len": self.max_model_len, "permission": [permission]}
        return JSONResponse({"object": "list", "data": [card]})

    async def chat(self, request: Request) -> Response:
        try:
            body = await self._body(request)
            wire.field(body, "messages", list, "list_type", "Input should be a valid list")
            wire.stream_options(body)
            requested = wire.max_tokens(body)
            if body.get("stream") and not self.format.streams_chat:
                return wire.error(400, f"the scripted double streams chat deltas as vLLM's Qwen parsers cut them only; "
                                       f"{self.format.family} answers stream through the token-in endpoints")
            # Validation comes first: a malformed request is refused by vLLM before it reaches the engine.
            if isinstance(fault := await self._maybe_fault(body), Response):
                return fault
            kwargs = body.get("chat_template_kwargs") or {}
            try:
                prompt_text = self._render(body["messages"], body.get("tools"), True, kwargs)
            except Exception as exc:  # noqa: BLE001 - template errors are client errors in vLLM too
                return wire.error(400, f"chat template failed: {exc}")
            prompt_ids = self.tokenizer.encode(prompt_text, add_special_tokens=False)
            limit = self._room(len(prompt_ids), requested, "chat", text=True)
        except wire.Invalid as invalid:
            return invalid.response
        text, ids, finish, stop_reason = self._sample(prompt_text, limit, body.get("stop"))
        if body.get("stream"):
            return self._stream(stream.chat(self, body, Sample(prompt_ids, ids, finish, stop_reason), prompt_text), fault)
        thinking = self.format.reasoning_mode(prompt_text) != "none"
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        if not await self._busy(request, len(ids)):
            return Response(status_code=499)
        message, finish = _chat_message(self.format.parse(text, prompt_text, body.get("tools") or []), thinking,
                                        bool(body.get("tools")), finish)
        top = body.get("top_logprobs") or 0
        logprobs = {"content": [self.logprobs.chat(t, i, top) for i, t in enumerate(ids)]} if body.get("logprobs") else None
        with_ids = bool(body.get("return_token_ids"))
        choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish,
                  "stop_reason": stop_reason, "token_ids": ids if with_ids else None, "routed_experts": None}
        usage = wire.usage(len(prompt_ids), len(ids))
        reasoning = stream.reasoning_counts(self, prompt_ids, ids, thinking, streamed=False)
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning[-1] if reasoning else 0}
        return JSONResponse({
            "id": f"chatcmpl-{secrets.token_hex(8)}", "object": "chat.completion", "created": int(time.time()),
            "model": self.model_name, "choices": [choice], "service_tier": None, "system_fingerprint": FINGERPRINT,
            "usage": usage, "prompt_logprobs": None, "prompt_token_ids": prompt_ids if with_ids else None,
            "prompt_text": None, "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
        })

    async def completions(self, request: Request) -> Response:
        """Token-in completion: `prompt` is a list of ids (or a string); no template, no parsers."""
        try:
            body = await self._body(request)
            wire.stream_options(body)
            text_prompt = isinstance(body.get("prompt"), str)
            if text_prompt:
                prompt_ids = self.tokenizer.encode(body["prompt"], add_special_tokens=False)
            else:
                prompt_ids = self._token_ids(body, "prompt")
            requested = wire.max_tokens(body)
            if isinstance(fault := await self._maybe_fault(body), Response):
                return fault
            limit = self._room(len(prompt_ids), requested, "completions", text=text_prompt)
        except wire.Invalid as invalid:
            return invalid.response
        text, ids, finish, stop_reason = self._sample_ids(prompt_ids, limit, body.get("stop"))
        if body.get("stream"):
            return self._stream(stream.completions(self, body, Sample(prompt_ids, ids, finish, stop_reason)), fault)
        if not await self._busy(request, len(ids)):
            return Response(status_code=499)
        with_ids = bool(body.get("return_token_ids"))
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": stop_reason,
                  "token_ids": ids if with_ids else None, "prompt_logprobs": None,
                  "prompt_token_ids": prompt_ids if with_ids else None, "routed_experts": None}
        if body.get("logprobs") is not None:
            choice["logprobs"] = self.logprobs.legacy(ids, int(body["logprobs"]))
        return JSONResponse({
            "id": f"cmpl-{secrets.token_hex(8)}", "object": "text_completion", "created": int(time.time()),
            "model": self.model_name, "choices": [choice], "service_tier": None, "system_fingerprint": FINGERPRINT,
            "usage": wire.usage(len(prompt_ids), len(ids)) | {"completion_tokens_details": None},
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
        })

    async def generate(self, request: Request) -> Response:
        """vLLM's token-in, token-out endpoint (served with --enable-scale-out): ids in, ids and logprobs out."""
        try:
            body = await self._body(request)
            prompt_ids = self._token_ids(body, "token_ids")
            params = wire.field(body, "sampling_params", dict, "model_type",
                            "Input should be a valid dictionary or instance of SamplingParams")
            requested = wire.max_tokens(params, "body.sampling_params")
            if isinstance(fault := await self._maybe_fault(body), Response):
                return fault
            limit = self._room(len(prompt_ids), requested, "generate")
        except wire.Invalid as invalid:
            return invalid.response
        _, ids, finish, stop_reason = self._sample_ids(prompt_ids, limit, params.get("stop"))
        if body.get("stream"):
            return self._stream(stream.generate(self, body, Sample(prompt_ids, ids, finish, stop_reason)), fault)
        if not await self._busy(request, len(ids)):
            return Response(status_code=499)
        choice = {
            "index": 0, "finish_reason": finish, "stop_reason": stop_reason, "token_ids": ids, "routed_experts": None,
            "sampling_mask": None, "weight_versions": [{"version": "default", "start": 0, "end": len(ids)}],
            "logprobs": None,
        }
        if params.get("logprobs") is not None:
            choice["logprobs"] = {"content": [self.logprobs.by_id(t, i, int(params["logprobs"])) for i, t in enumerate(ids)]}
        return JSONResponse({
            "request_id": f"generate-tokens-{secrets.token_hex(8)}", "model": self.model_name,
            "created": int(time.time()), "usage": wire.usage(len(prompt_ids), len(ids)) | {"completion_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_id_logprobs": None,
            "prompt_token_ids": prompt_ids if body.get("return_token_ids") else None, "mm_placeholders": None,
            "metrics": None, "kv_transfer_params": None, "ec_transfer_params": None,
            "output_mode": body.get("output_mode") or "tokens", "choices": [choice],
        })

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await self._body(request, record=False)
            if "messages" in body:
                wire.field(body, "messages", list, "list_type", "Input should be a valid list")
            else:
                wire.field(body, "prompt", str, "string_type", "Input should be a valid string")
        except wire.Invalid as invalid:
            return invalid.response
        if "messages" in body:
            # vLLM 0.32's /tokenize drops `reasoning_content` from messages (it keeps `reasoning`), unlike its chat
            # endpoint: a count of a conversation with reasoning comes out short, and the double must say so too.
            messages = [{k: v for k, v in m.items() if k != "reasoning_content"} if isinstance(m, dict) else m
                        for m in body["messages"]]
            text = self._render(messages, body.get("tools"), body.get("add_generation_prompt", True),
                                body.get("chat_template_kwargs") or {})
            ids = self.tokenizer.encode(text, add_special_tokens=False)
        else:
            ids = self.tokenizer.encode(body["prompt"], add_special_tokens=body.get("add_special_tokens", True))
        strs = self.tokenizer.convert_ids_to_tokens(ids) if body.get("return_token_strs") else None
        return JSONResponse({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": strs})

    async def detokenize(self, request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"prompt": self.tokenizer.decode(body.get("tokens", []))})

    # -- helpers -----------------------------------------------------------------------------

    def _token_ids(self, body: dict[str, Any], name: str) -> list[int]:
        ids = wire.field(body, name, list, "list_type", "Input should be a valid list")
        for token_id in ids:
            if not isinstance(token_id, int) or isinstance(token_id, bool):
                raise wire.Invalid(wire.validation(f"body.{name}", "int_type", "Input should be a valid integer"))
            if not 0 <= token_id < self.vocab_size:
                raise wire.Invalid(wire.error(400, f"Token id {token_id} is out of vocabulary"))
        return ids

    def _room(self, prompt_len: int, requested: int | None, endpoint: str, text: bool = False) -> int:
        """How many tokens may be sampled: vLLM refuses only prompts that leave no room, and clamps the rest.

        A text prompt is tokenized only up to one token past the window, hence "at least" in that message.
        """
        window = self.max_model_len
        if requested is not None and requested < 1:
            raise wire.Invalid(wire.too_few(requested))
        if prompt_len < window:
            wanted = requested if requested is not None else _DEFAULT_MAX_TOKENS[endpoint]
            return min(wanted or window, window - prompt_len)
        if endpoint == "generate":
            if prompt_len == window:
                problem = ("plus the number of requested output tokens (at least 1) is longer than the maximum model "
                           f"length of {window}. Make sure that `max_model_len` is no smaller than the number of "
                           "text tokens (prompt + requested output tokens).")
            else:
                problem = (f"is longer than the maximum model length of {window}. Make sure that `max_model_len` is "
                           "no smaller than the number of text tokens.")
            raise wire.Invalid(wire.error(400, f"The decoder prompt (length {prompt_len}) {problem}"))
        if prompt_len == window:
            raise wire.Invalid(wire.too_few(0))
        count = min(prompt_len, window + 1) if text else prompt_len
        at_least = "at least " if count == window + 1 else ""
        raise wire.Invalid(wire.error(
            400,
            f"This model's maximum context length is {window} tokens. However, your prompt contains {at_least}"
            f"{count} input tokens, which exceeds this limit even without any output tokens. Please reduce the "
            f"length of the input prompt. (parameter=input_tokens, value={count})",
            param="input_tokens",
        ))

    def _render(self, messages: list[dict], tools: Any, add_generation_prompt: bool, kwargs: dict) -> str:
        return self.tokenizer.apply_chat_template(
            wire.template_messages(messages), tools=tools, chat_template=self.template_text,
            add_generation_prompt=add_generation_prompt, tokenize=False, **kwargs,
        )

    def _sample(self, prompt_text: str, limit: int, stop: Any) -> tuple[str, list[int], str, str | None]:
        """The scripted answer as sampled text + ids, cut by stop strings and max_tokens like vLLM."""
        step = self.script.step_for(prompt_text, self.format.turn(prompt_text))
        text = self.format.completion(step, prompt_text)
        stop_id = self.tokenizer.convert_tokens_to_ids(self.format.stop_token(step))
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        hits = [(text.find(s), s) for s in stops if s and s in text]
        if hits:
            cut, stop_string = min(hits)
            text = text[:cut]
            ids, finish, stop_reason = self.tokenizer.encode(text, add_special_tokens=False), "stop", stop_string
        else:
            ids, finish, stop_reason = self.tokenizer.encode(text, add_special_tokens=False) + [stop_id], "stop", None
        if len(ids) > limit:
            ids, finish, stop_reason = ids[:limit], "length", None
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return text, ids, finish, stop_reason

    def _sample_ids(self, prompt_ids: list[int], limit: int, stop: Any) -> tuple[str, list[int], str, str | None]:
        """Token-in sampling: the script reads the decoded prompt, which also says how reasoning starts."""
        return self._sample(self.tokenizer.decode(prompt_ids, skip_special_tokens=False), limit, stop)


def _chat_message(
    parsed: tuple[str | None, str, list[dict]], thinking: bool, has_tools: bool, finish: str
) -> tuple[dict[str, Any], str]:
    """The assistant message vLLM's reasoning and tool parsers made of the sampled text, and the finish reason."""
    reasoning, content, calls = parsed
    message: dict[str, Any] = {
        # No content is null once a parser took something out (reasoning, calls), else the empty text.
        "role": "assistant", "content": content or (None if thinking or calls else ""), "refusal": None,
        "annotations": None, "audio": None, "function_call": None,
    }
    if calls:  # vLLM leaves the key out when there are none
        message["tool_calls"] = [
            {"id": f"chatcmpl-tool-{secrets.token_hex(8)}", "type": "function", "function": c} for c in calls
        ]
    message["reasoning"] = reasoning or None
    return message, "tool_calls" if calls and finish == "stop" and has_tools else finish
