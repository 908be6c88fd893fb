"""ScriptedVLLM — a TEST DOUBLE for a vLLM OpenAI-compatible server.

It exists because a real model cannot be made to call a given tool on cue, and because real vLLM
on CPU is slow to start. It speaks the vLLM endpoints polar uses, with the same real tokenizer
and chat template, so prompt token ids are what vLLM would compute; but the *answer* comes from
a script, rendered in the model's own output format (Qwen3.5: `<think>` + XML tool calls) and
tokenised, so sampled ids, text, reasoning and tool calls agree with each other.
`tests/integration/test_double_vs_vllm.py` keeps its wire format honest against real vLLM.

Script: a list of rules `{"match": "substring" | null, "steps": [step, ...]}`. The first rule
whose `match` occurs in the rendered prompt applies; the step is chosen by how many assistant
turns the prompt already holds (turn 0 → steps[0]; past the end → the last step). A step is
`{"reasoning": str?, "content": str?, "tool_calls": [{"name": str, "arguments": obj|str}]?}`.
Without a matching rule the double answers with a short text that quotes the last user line.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import re
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

ASSISTANT_OPEN = "<|im_start|>assistant\n"


@dataclass
class Step:
    reasoning: str | None = None
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, raw: dict[str, Any]) -> "Step":
        return cls(raw.get("reasoning"), raw.get("content") or "", list(raw.get("tool_calls") or []))


class Script:
    def __init__(self, rules: list[dict[str, Any]] | None = None):
        self.rules = rules or []

    @classmethod
    def from_json(cls, data: Any) -> "Script":
        if isinstance(data, dict) and "steps" in data and "rules" not in data:
            data = {"rules": [{"match": data.get("match"), "steps": data["steps"]}]}
        rules = data.get("rules", []) if isinstance(data, dict) else data
        for rule in rules:
            if not isinstance(rule, dict) or not isinstance(rule.get("steps"), list) or not rule["steps"]:
                raise ValueError("each script rule needs a non-empty 'steps' list")
        return cls(rules)

    def step_for(self, prompt_text: str) -> Step:
        turn = max(prompt_text.count(ASSISTANT_OPEN) - 1, 0)
        for rule in self.rules:
            if not rule.get("match") or rule["match"] in prompt_text:
                steps = rule["steps"]
                return Step.of(steps[min(turn, len(steps) - 1)])
        return Step(content=f"Scripted answer to: {_last_user_line(prompt_text)}")


def _last_user_line(prompt_text: str) -> str:
    users = prompt_text.split("<|im_start|>user\n")
    last = users[-1].split("<|im_end|>")[0].strip() if len(users) > 1 else ""
    return (last.splitlines() or [""])[-1][:200]


# -- the model's output format (Qwen3.5 / Qwen3-Coder XML tool calls) ---------------------------


def render_completion(step: Step, thinking: bool) -> str:
    """The text the model would sample after the generation prompt, without the stop token."""
    out = ""
    if thinking:
        out += (step.reasoning or "").strip("\n") + "\n</think>\n\n"
    out += step.content
    for i, call in enumerate(step.tool_calls):
        sep = ("\n\n" if step.content.strip() else "") if i == 0 else "\n"
        out += sep + "<tool_call>\n<function=" + call["name"] + ">\n"
        args = call.get("arguments") or {}
        if isinstance(args, str):
            args = json.loads(args) if args.strip() else {}
        for key, value in args.items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            out += f"<parameter={key}>\n{text}\n</parameter>\n"
        out += "</function>\n</tool_call>"
    return out


_TOOL_CALL = re.compile(r"<tool_call>\s*<function=([^>\n]+)>\n?(.*?)</function>\s*</tool_call>", re.S)
_PARAM = re.compile(r"<parameter=([^>\n]+)>\n?(.*?)\n?</parameter>", re.S)


def parse_completion(text: str, thinking: bool, tools: list[dict[str, Any]]) -> tuple[str | None, str, list[dict]]:
    """Split sampled text as vLLM's qwen3 reasoning parser and XML tool parser would."""
    reasoning = None
    if thinking:
        if "</think>" in text:
            reasoning, text = text.split("</think>", 1)
        else:  # truncated inside the reasoning
            reasoning, text = text, ""
        reasoning = reasoning.removeprefix("<think>").strip("\n")
        text = text.lstrip("\n")
    calls = []
    for m in _TOOL_CALL.finditer(text):
        name = m.group(1).strip()
        schema = next((t["function"].get("parameters", {}) for t in tools if t.get("function", {}).get("name") == name), {})
        props = schema.get("properties", {}) if isinstance(schema, dict) else {}
        args = {k.strip(): _typed(v, props.get(k.strip(), {})) for k, v in _PARAM.findall(m.group(2))}
        calls.append({"name": name, "arguments": json.dumps(args, ensure_ascii=False)})
    content = text[: text.index("<tool_call>")].rstrip("\n") if calls else text
    return reasoning, content, calls


def _typed(value: str, schema: dict) -> Any:
    """Parameter text → JSON value, guided by the tool schema (strings stay strings)."""
    if schema.get("type") == "string":
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


# -- the server ---------------------------------------------------------------------------------

FINGERPRINT = "scripted-vllm-double"
# vLLM's max_tokens when a request names none: the rest of the window for chat, 16 for the token endpoints.
_DEFAULT_MAX_TOKENS = {"chat": None, "completions": 16, "generate": 16}


class _Invalid(Exception):
    """A request vLLM would refuse; carries the error response it would send."""

    def __init__(self, response: Response):
        self.response = response


class ScriptedVLLM:
    def __init__(
        self,
        tokenizer_dir: str | Path,
        served_model_name: str = "polar-tiny",
        max_model_len: int = 32768,
        script: Script | None = None,
        latency_s: float = 0.0,
    ):
        from transformers import AutoTokenizer  # heavy import, only when a double is built
        from transformers.convert_slow_tokenizer import bytes_to_unicode

        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.model_dir = str(tokenizer_dir)
        self.model_name = served_model_name
        self.max_model_len = max_model_len
        self.script = script or Script()
        self.latency_s = latency_s
        self.eos_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.think_end_id = self.tokenizer.convert_tokens_to_ids("</think>")
        self.vocab_size = len(self.tokenizer)
        self._byte_of = {char: byte for byte, char in bytes_to_unicode().items()}
        self.requests: list[dict[str, Any]] = []  # what polar sent (path, headers, body), for tests
        self.generations = 0  # requests with a body received, ever (`requests` keeps only the last 1000)
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
                Route("/_double/requests", self.get_requests, methods=["GET", "DELETE"]),
            ]
        )

    # -- admin -------------------------------------------------------------------------------

    async def set_script(self, request: Request) -> Response:
        try:
            self.script = Script.from_json(await request.json())
        except (ValueError, json.JSONDecodeError) as exc:
            return _error(400, f"bad script: {exc}")
        return JSONResponse({"rules": len(self.script.rules)})

    async def set_fault(self, request: Request) -> Response:
        """Make the next `count` model calls fail: status (e.g. 500), garbage, timeout, reset."""
        self.fault = await request.json()
        return JSONResponse(self.fault)

    async def get_requests(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.requests.clear()
        return JSONResponse(self.requests)

    async def _body(self, request: Request, record: bool = True) -> dict[str, Any]:
        """The JSON object body, refused as vLLM's request validation would refuse it."""
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise _Invalid(_validation(f"body.{getattr(exc, 'pos', 0)}", "json_invalid", "JSON decode error")) from None
        if record:
            self.generations += bool(body)
            self.requests.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
            del self.requests[:-1000]  # bounded: long benchmarks must not grow it forever
        if not isinstance(body, dict):
            raise _Invalid(_validation("body", "model_attributes_type",
                                       "Input should be a valid dictionary or object to extract fields from"))
        model = body.get("model")
        if model is not None and model != self.model_name:
            raise _Invalid(_error(404, f"The model `{model}` does not exist. Valid aliases: {self.model_name}.",
                                  "NotFoundError", "model"))
        return body

    async def _maybe_fault(self) -> Response | None:
        if not self.fault or self.fault.get("count", 1) <= 0:
            return None
        self.fault["count"] = self.fault.get("count", 1) - 1
        mode = self.fault.get("mode")
        if mode == "timeout":
            await asyncio.sleep(float(self.fault.get("seconds", 3600)))
        if mode == "garbage":
            return Response(b"\x00not json at all", status_code=200, media_type="application/json")
        if mode == "reset":
            return _ResetMidBody()
        if mode == "status":
            return _error(int(self.fault.get("status", 500)), "scripted upstream failure")
        return None

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
            _field(body, "messages", list, "list_type", "Input should be a valid list")
            requested = _max_tokens(body)
            # Validation comes first: a malformed request is refused by vLLM before it reaches the engine.
            if (fault := await self._maybe_fault()) is not None:
                return fault
            if body.get("stream"):
                return _error(400, "the scripted vLLM double does not stream (polar never asks it to)")
            kwargs = body.get("chat_template_kwargs") or {}
            thinking = kwargs.get("enable_thinking", True) is not False
            try:
                prompt_text = self.tokenizer.apply_chat_template(
                    _template_messages(body["messages"]), tools=body.get("tools"), add_generation_prompt=True,
                    tokenize=False, **kwargs,
                )
            except Exception as exc:  # template errors are client errors in vLLM too
                return _error(400, f"chat template failed: {exc}")
            prompt_ids = self.tokenizer.encode(prompt_text, add_special_tokens=False)
            limit = self._room(len(prompt_ids), requested, "chat", text=True)
        except _Invalid as invalid:
            return invalid.response
        text, ids, finish, stop_reason = self._sample(prompt_text, thinking, limit, body.get("stop"))
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        message, finish = _chat_message(text, thinking, body.get("tools") or [], finish)
        top = body.get("top_logprobs") or 0
        logprobs = {"content": [self._chat_logprob(t, i, top) for i, t in enumerate(ids)]} if body.get("logprobs") else None
        with_ids = bool(body.get("return_token_ids"))
        choice = {"index": 0, "message": message, "logprobs": logprobs, "finish_reason": finish,
                  "stop_reason": stop_reason, "token_ids": ids if with_ids else None, "routed_experts": None}
        usage = _usage(len(prompt_ids), len(ids))
        usage["completion_tokens_details"] = {"reasoning_tokens": self._reasoning_tokens(ids) if thinking else 0}
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
            text_prompt = isinstance(body.get("prompt"), str)
            if text_prompt:
                prompt_ids = self.tokenizer.encode(body["prompt"], add_special_tokens=False)
            else:
                prompt_ids = self._token_ids(body, "prompt")
            requested = _max_tokens(body)
            if (fault := await self._maybe_fault()) is not None:
                return fault
            limit = self._room(len(prompt_ids), requested, "completions", text=text_prompt)
        except _Invalid as invalid:
            return invalid.response
        text, ids, finish, stop_reason = self._sample_ids(prompt_ids, limit, body.get("stop"))
        with_ids = bool(body.get("return_token_ids"))
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": stop_reason,
                  "token_ids": ids if with_ids else None, "prompt_logprobs": None,
                  "prompt_token_ids": prompt_ids if with_ids else None, "routed_experts": None}
        if body.get("logprobs") is not None:
            choice["logprobs"] = self._legacy_logprobs(ids, int(body["logprobs"]))
        return JSONResponse({
            "id": f"cmpl-{secrets.token_hex(8)}", "object": "text_completion", "created": int(time.time()),
            "model": self.model_name, "choices": [choice], "service_tier": None, "system_fingerprint": FINGERPRINT,
            "usage": _usage(len(prompt_ids), len(ids)) | {"completion_tokens_details": None},
            "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
        })

    async def generate(self, request: Request) -> Response:
        """vLLM's token-in, token-out endpoint (served with --enable-scale-out): ids in, ids and logprobs out."""
        try:
            body = await self._body(request)
            prompt_ids = self._token_ids(body, "token_ids")
            params = _field(body, "sampling_params", dict, "model_type",
                            "Input should be a valid dictionary or instance of SamplingParams")
            requested = _max_tokens(params, "body.sampling_params")
            if (fault := await self._maybe_fault()) is not None:
                return fault
            limit = self._room(len(prompt_ids), requested, "generate")
        except _Invalid as invalid:
            return invalid.response
        _, ids, finish, stop_reason = self._sample_ids(prompt_ids, limit, params.get("stop"))
        choice = {
            "index": 0, "finish_reason": finish, "stop_reason": stop_reason, "token_ids": ids, "routed_experts": None,
            "sampling_mask": None, "weight_versions": [{"version": "default", "start": 0, "end": len(ids)}],
            "logprobs": None,
        }
        if params.get("logprobs") is not None:
            choice["logprobs"] = {"content": [self._id_logprob(t, i, int(params["logprobs"])) for i, t in enumerate(ids)]}
        return JSONResponse({
            "request_id": f"generate-tokens-{secrets.token_hex(8)}", "model": self.model_name,
            "created": int(time.time()), "usage": _usage(len(prompt_ids), len(ids)) | {"completion_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_id_logprobs": None,
            "prompt_token_ids": prompt_ids if body.get("return_token_ids") else None, "mm_placeholders": None,
            "metrics": None, "kv_transfer_params": None, "ec_transfer_params": None,
            "output_mode": body.get("output_mode") or "tokens", "choices": [choice],
        })

    async def tokenize(self, request: Request) -> Response:
        try:
            body = await self._body(request, record=False)
            if "messages" in body:
                _field(body, "messages", list, "list_type", "Input should be a valid list")
            else:
                _field(body, "prompt", str, "string_type", "Input should be a valid string")
        except _Invalid as invalid:
            return invalid.response
        if "messages" in body:
            # vLLM 0.32's /tokenize drops `reasoning_content` from messages (it keeps `reasoning`), unlike its chat
            # endpoint: a count of a conversation with reasoning comes out short, and the double must say so too.
            messages = [{k: v for k, v in m.items() if k != "reasoning_content"} if isinstance(m, dict) else m
                        for m in body["messages"]]
            text = self.tokenizer.apply_chat_template(
                _template_messages(messages), tools=body.get("tools"),
                add_generation_prompt=body.get("add_generation_prompt", True), tokenize=False,
                **(body.get("chat_template_kwargs") or {}),
            )
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
        ids = _field(body, name, list, "list_type", "Input should be a valid list")
        for token_id in ids:
            if not isinstance(token_id, int) or isinstance(token_id, bool):
                raise _Invalid(_validation(f"body.{name}", "int_type", "Input should be a valid integer"))
            if not 0 <= token_id < self.vocab_size:
                raise _Invalid(_error(400, f"Token id {token_id} is out of vocabulary"))
        return ids

    def _room(self, prompt_len: int, requested: int | None, endpoint: str, text: bool = False) -> int:
        """How many tokens may be sampled: vLLM refuses only prompts that leave no room, and clamps the rest.

        A text prompt is tokenized only up to one token past the window, hence "at least" in that message.
        """
        window = self.max_model_len
        if requested is not None and requested < 1:
            raise _Invalid(_too_few(requested))
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
            raise _Invalid(_error(400, f"The decoder prompt (length {prompt_len}) {problem}"))
        if prompt_len == window:
            raise _Invalid(_too_few(0))
        count = min(prompt_len, window + 1) if text else prompt_len
        at_least = "at least " if count == window + 1 else ""
        raise _Invalid(_error(
            400,
            f"This model's maximum context length is {window} tokens. However, your prompt contains {at_least}"
            f"{count} input tokens, which exceeds this limit even without any output tokens. Please reduce the "
            f"length of the input prompt. (parameter=input_tokens, value={count})",
            param="input_tokens",
        ))

    def _sample(self, prompt_text: str, thinking: bool, limit: int, stop: Any) -> tuple[str, list[int], str, str | None]:
        """The scripted answer as sampled text + ids, cut by stop strings and max_tokens like vLLM."""
        text = render_completion(self.script.step_for(prompt_text), thinking)
        stops = [stop] if isinstance(stop, str) else list(stop or [])
        hits = [(text.find(s), s) for s in stops if s and s in text]
        if hits:
            cut, stop_string = min(hits)
            text = text[:cut]
            ids, finish, stop_reason = self.tokenizer.encode(text, add_special_tokens=False), "stop", stop_string
        else:
            ids, finish, stop_reason = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos_id], "stop", None
        if len(ids) > limit:
            ids, finish, stop_reason = ids[:limit], "length", None
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return text, ids, finish, stop_reason

    def _sample_ids(self, prompt_ids: list[int], limit: int, stop: Any) -> tuple[str, list[int], str, str | None]:
        """Token-in sampling: the script reads the decoded prompt, which also says whether a think block is open."""
        prompt_text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        return self._sample(prompt_text, prompt_text.endswith("<think>\n"), limit, stop)

    def _reasoning_tokens(self, ids: list[int]) -> int:
        body = ids[:-1] if ids and ids[-1] == self.eos_id else ids
        return body.index(self.think_end_id) if self.think_end_id in body else len(body)

    def _piece(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _token_bytes(self, token_id: int) -> bytes:
        """The raw bytes a byte-level BPE token stands for (added tokens are plain text)."""
        token = self.tokenizer.convert_ids_to_tokens(token_id)
        if all(char in self._byte_of for char in token):
            return bytes(self._byte_of[char] for char in token)
        return token.encode()

    def _logprob(self, token_id: int, pos: int) -> float:
        """Deterministic, token- and position-dependent values (the double has no model)."""
        h = int.from_bytes(hashlib.blake2b(f"{token_id}:{pos}".encode(), digest_size=4).digest(), "little")
        return -(h % 4000) / 1000.0

    def _ranked(self, token_id: int, pos: int, top: int) -> list[tuple[int, float]]:
        """The sampled token first (rank 1), then made-up, less likely alternatives: `max(top, 1)` in all."""
        best = self._logprob(token_id, pos)
        others = [((token_id + 7919 * k) % self.vocab_size, best - k) for k in range(1, max(top, 1))]
        return [(token_id, best), *others]

    def _chat_entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        raw = self._token_bytes(token_id)
        try:
            text = raw.decode()
        except UnicodeDecodeError:  # part of a character: vLLM reports it empty
            text, raw = "", b""
        return {"token": text, "logprob": logprob, "bytes": list(raw)}

    def _chat_logprob(self, token_id: int, pos: int, top: int) -> dict[str, Any]:
        ranked = self._ranked(token_id, pos, top)
        tops = [self._chat_entry(t, lp) for t, lp in ranked] if top else []
        return {**self._chat_entry(token_id, ranked[0][1]), "top_logprobs": tops}

    def _id_logprob(self, token_id: int, pos: int, top: int) -> dict[str, Any]:
        ranked = self._ranked(token_id, pos, top)
        tops = [{"token_id": t, "logprob": lp, "rank": rank} for rank, (t, lp) in enumerate(ranked, 1)]
        return {"token_id": token_id, "logprob": ranked[0][1], "rank": 1, "top_logprobs": tops}

    def _legacy_logprobs(self, ids: list[int], top: int) -> dict[str, Any]:
        """/v1/completions' layout: parallel lists, and one {text: logprob} dict per position."""
        pieces = [self._piece(t) for t in ids]
        ranked = [self._ranked(t, i, top) for i, t in enumerate(ids)]
        offsets = [0, *itertools.accumulate(len(p) for p in pieces)][: len(pieces)]
        return {"text_offset": offsets, "token_logprobs": [r[0][1] for r in ranked], "tokens": pieces,
                "top_logprobs": [{self._piece(t): lp for t, lp in r} for r in ranked]}


def _chat_message(text: str, thinking: bool, tools: list[dict[str, Any]], finish: str) -> tuple[dict[str, Any], str]:
    """The assistant message vLLM's reasoning and tool parsers make of the sampled text, and the finish reason."""
    reasoning, content, calls = parse_completion(text, thinking, tools)
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
    return message, "tool_calls" if calls and finish == "stop" and tools else finish


def _field(body: dict[str, Any], name: str, typ: type, kind: str, msg: str) -> Any:
    value = body.get(name)
    if value is None:
        raise _Invalid(_validation(f"body.{name}", "missing", "Field required"))
    if not isinstance(value, typ):
        raise _Invalid(_validation(f"body.{name}", kind, msg))
    return value


def _max_tokens(body: dict[str, Any], where: str = "body") -> int | None:
    value = body.get("max_tokens", body.get("max_completion_tokens"))
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise _Invalid(_validation(f"{where}.max_tokens", "int_parsing", "Input should be a valid integer"))
    return value


def _usage(prompt_len: int, completion_len: int) -> dict[str, Any]:
    return {"prompt_tokens": prompt_len, "total_tokens": prompt_len + completion_len,
            "completion_tokens": completion_len, "prompt_tokens_details": None}


def _template_messages(messages: list[dict]) -> list[dict]:
    """As vLLM does before templating: tool-call arguments JSON text → objects."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("tool_calls"):
            calls = []
            for tc in m["tool_calls"]:
                fn = dict(tc.get("function", {}))
                if isinstance(fn.get("arguments"), str):
                    try:
                        fn["arguments"] = json.loads(fn["arguments"]) if fn["arguments"].strip() else {}
                    except json.JSONDecodeError:
                        pass
                calls.append({**tc, "function": fn})
            m["tool_calls"] = calls
        out.append(m)
    return out


class _ResetMidBody(Response):
    """Announces a body, sends part of it, then breaks the connection (a reset mid-body)."""

    async def __call__(self, scope, receive, send) -> None:
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", b"4096")]})
        await send({"type": "http.response.body", "body": b'{"id": "chatcmpl-', "more_body": True})
        raise ConnectionResetError("scripted reset mid-body")


def _error(status: int, message: str, typ: str = "BadRequestError", param: str | None = None) -> Response:
    return JSONResponse({"error": {"message": message, "type": typ, "param": param, "code": status}}, status_code=status)


def _validation(loc: str, kind: str, msg: str) -> Response:
    """vLLM's answer to a body its request model rejects: pydantic's error, `param` naming the field."""
    return _error(400, f"1 validation error:\n  {{'type': '{kind}', 'loc': '{loc}', 'msg': '{msg}'}}", "Bad Request", loc)


def _too_few(max_tokens: int) -> Response:
    return _error(400, f"max_tokens must be at least 1, got {max_tokens}. (parameter=max_tokens, value={max_tokens})",
                  param="max_tokens")


# -- running it -----------------------------------------------------------------------------------


class BackgroundServer:
    """Run an ASGI app with uvicorn on a thread (for tests and the in-process main job)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout: float = 30) -> str:
        self.thread.start()
        deadline = time.time() + timeout
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("scripted vLLM double did not start")
            time.sleep(0.02)
        sock = self.server.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
