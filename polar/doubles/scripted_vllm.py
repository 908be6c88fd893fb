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

        self.tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
        self.model_name = served_model_name
        self.max_model_len = max_model_len
        self.script = script or Script()
        self.latency_s = latency_s
        self.eos_id = self.tokenizer.convert_tokens_to_ids("<|im_end|>")
        self.requests: list[dict[str, Any]] = []  # what polar sent (path, headers, body), for tests
        self.fault: dict[str, Any] = {}
        self.app = Starlette(
            routes=[
                Route("/health", self.health, methods=["GET"]),
                Route("/v1/models", self.models, methods=["GET"]),
                Route("/v1/chat/completions", self.chat, methods=["POST"]),
                Route("/v1/completions", self.completions, methods=["POST"]),
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
        """Make the next `count` calls fail: status (e.g. 500), garbage, timeout, reset."""
        self.fault = await request.json()
        return JSONResponse(self.fault)

    async def get_requests(self, request: Request) -> Response:
        if request.method == "DELETE":
            self.requests.clear()
        return JSONResponse(self.requests)

    async def _record(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        self.requests.append({"path": request.url.path, "headers": dict(request.headers), "body": body})
        del self.requests[:-1000]  # bounded: long benchmarks must not grow it forever
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
        card = {"id": self.model_name, "object": "model", "created": int(time.time()), "owned_by": "vllm",
                "root": self.model_name, "parent": None, "max_model_len": self.max_model_len, "permission": []}
        return JSONResponse({"object": "list", "data": [card]})

    async def chat(self, request: Request) -> Response:
        body = await self._record(request)
        if (fault := await self._maybe_fault()) is not None:
            return fault
        if body.get("model") != self.model_name:
            return _error(404, f"The model `{body.get('model')}` does not exist.", "NotFoundError")
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
        too_long = self._check_length(len(prompt_ids), body.get("max_tokens"))
        if too_long:
            return too_long
        text, ids, finish, stop_reason = self._sample(prompt_text, thinking, body)
        reasoning, content, calls = parse_completion(text, thinking, body.get("tools") or [])
        if calls and finish == "stop" and body.get("tools"):
            finish = "tool_calls"
        if self.latency_s:
            await asyncio.sleep(self.latency_s)
        message = {
            "role": "assistant", "content": content if (content or not calls) else None, "refusal": None,
            "annotations": None, "audio": None, "function_call": None,
            "tool_calls": [
                {"id": f"chatcmpl-tool-{secrets.token_hex(16)}", "type": "function", "function": c} for c in calls
            ],
            "reasoning": reasoning or None,
        }
        choice = {"index": 0, "message": message, "logprobs": {"content": self._logprobs(ids)},
                  "finish_reason": finish, "stop_reason": stop_reason, "token_ids": ids}
        return JSONResponse(self._envelope("chat.completion", choice, prompt_ids, ids))

    async def completions(self, request: Request) -> Response:
        """Token-in completion: `prompt` is a list of ids; no template, no parsers."""
        body = await self._record(request)
        if (fault := await self._maybe_fault()) is not None:
            return fault
        prompt = body.get("prompt")
        if isinstance(prompt, str):
            prompt_ids = self.tokenizer.encode(prompt, add_special_tokens=False)
        elif isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
            prompt_ids = prompt
        else:
            return _error(400, "prompt must be a string or a list of token ids")
        too_long = self._check_length(len(prompt_ids), body.get("max_tokens"))
        if too_long:
            return too_long
        prompt_text = self.tokenizer.decode(prompt_ids, skip_special_tokens=False)
        thinking = prompt_text.endswith("<think>\n")
        text, ids, finish, stop_reason = self._sample(prompt_text, thinking, body)
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "stop_reason": stop_reason,
                  "token_ids": ids, "prompt_logprobs": None, "prompt_token_ids": None}
        if body.get("logprobs") is not None:
            choice["logprobs"] = {"tokens": [self._piece(t) for t in ids],
                                  "token_logprobs": [x["logprob"] for x in self._logprobs(ids)],
                                  "top_logprobs": None, "text_offset": None}
        return JSONResponse(self._envelope("text_completion", choice, prompt_ids, ids))

    async def tokenize(self, request: Request) -> Response:
        body = await request.json()
        if "messages" in body:
            ids = self.tokenizer.apply_chat_template(
                _template_messages(body["messages"]), tools=body.get("tools"),
                add_generation_prompt=body.get("add_generation_prompt", True), tokenize=False,
                **(body.get("chat_template_kwargs") or {}),
            )
            ids = self.tokenizer.encode(ids, add_special_tokens=False)
        else:
            ids = self.tokenizer.encode(body.get("prompt", ""), add_special_tokens=body.get("add_special_tokens", True))
        return JSONResponse({"count": len(ids), "max_model_len": self.max_model_len, "tokens": ids, "token_strs": None})

    async def detokenize(self, request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"prompt": self.tokenizer.decode(body.get("tokens", []))})

    # -- helpers -----------------------------------------------------------------------------

    def _check_length(self, prompt_len: int, max_tokens: int | None) -> Response | None:
        want = prompt_len + (max_tokens or 0)
        if prompt_len >= self.max_model_len or want > self.max_model_len:
            return _error(
                400,
                f"This model's maximum context length is {self.max_model_len} tokens. However, you requested "
                f"{want} tokens ({prompt_len} in the messages, {max_tokens or 0} in the completion). "
                "Please reduce the length of the messages or completion.",
            )
        return None

    def _sample(self, prompt_text: str, thinking: bool, body: dict) -> tuple[str, list[int], str, str | None]:
        """The scripted answer as sampled text + ids, cut by stop strings and max_tokens like vLLM."""
        text = render_completion(self.script.step_for(prompt_text), thinking)
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else stops
        hits = [(text.find(s), s) for s in stops if s and s in text]
        if hits:
            cut, stop = min(hits)
            text = text[:cut]
            ids, finish, stop_reason = self.tokenizer.encode(text, add_special_tokens=False), "stop", stop
        else:
            ids, finish, stop_reason = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos_id], "stop", None
        limit = body.get("max_tokens") or body.get("max_completion_tokens")
        if limit is not None and len(ids) > limit:
            ids, finish, stop_reason = ids[:limit], "length", None
            text = self.tokenizer.decode(ids, skip_special_tokens=False)
        return text, ids, finish, stop_reason

    def _piece(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id], skip_special_tokens=False)

    def _logprobs(self, ids: list[int]) -> list[dict[str, Any]]:
        out = []
        for pos, tid in enumerate(ids):  # deterministic, token- and position-dependent values
            h = int.from_bytes(hashlib.blake2b(f"{tid}:{pos}".encode(), digest_size=4).digest(), "little")
            piece = self._piece(tid)
            out.append({"token": piece, "logprob": -(h % 4000) / 1000.0, "bytes": list(piece.encode()), "top_logprobs": []})
        return out

    def _envelope(self, obj: str, choice: dict, prompt_ids: list[int], ids: list[int]) -> dict[str, Any]:
        prefix = "chatcmpl" if obj == "chat.completion" else "cmpl"
        return {
            "id": f"{prefix}-{secrets.token_hex(16)}", "object": obj, "created": int(time.time()),
            "model": self.model_name, "choices": [choice], "service_tier": None, "system_fingerprint": None,
            "usage": {"prompt_tokens": len(prompt_ids), "total_tokens": len(prompt_ids) + len(ids),
                      "completion_tokens": len(ids), "prompt_tokens_details": None},
            "prompt_logprobs": None, "prompt_token_ids": prompt_ids, "kv_transfer_params": None,
        }


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


def _error(status: int, message: str, typ: str = "BadRequestError") -> Response:
    return JSONResponse({"error": {"message": message, "type": typ, "param": None, "code": status}}, status_code=status)


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
