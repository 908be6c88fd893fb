"""The vLLM upstream, spoken to through its OpenAI-compatible chat endpoint.

vLLM applies the model's chat template and its tool/reasoning parsers; polar asks it for the
token-level truth alongside (`return_token_ids`, `logprobs`) so the capture holds exactly the
ids the engine saw and sampled. Every failure becomes a `GatewayError` whose kind says whose
fault it was, so each provider can answer in its own error shape.
"""

from __future__ import annotations

import json
import secrets
import time
from typing import Any

import httpx

from polar.canonical import ChatRequest, ChatResult, ImagePart, Message, Reasoning, TextPart, ToolCall, Usage
from polar.errors import GatewayError

_CONTEXT_MARKERS = ("maximum context length", "context length", "too long", "max_model_len", "maximum model length")


class VLLMChat:
    def __init__(
        self,
        base_url: str,
        model: str | None = None,
        api_key: str | None = None,
        timeout: float = 600.0,
        max_connections: int = 1024,
    ):
        self.base_url = base_url.rstrip("/")
        self._model = model
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.AsyncClient(
            base_url=self.base_url,
            headers=headers,
            timeout=httpx.Timeout(timeout, connect=10.0),
            limits=httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections),
        )

    async def aclose(self) -> None:
        await self.client.aclose()

    # -- model -----------------------------------------------------------------------------

    async def model(self) -> str:
        """The served model name: configured, or the first one the upstream lists."""
        if self._model is None:
            listing = await self._call("GET", "/v1/models")
            try:
                self._model = listing["data"][0]["id"]
            except (KeyError, IndexError, TypeError):
                raise GatewayError("upstream_error", "the upstream's /v1/models lists no model") from None
        return self._model

    # -- calls -----------------------------------------------------------------------------

    async def complete(self, request: ChatRequest, call_id: str, session: str = "", row_id: int = 0) -> ChatResult:
        body = await self.chat_body(request)
        started = time.time()
        data = await self._call("POST", "/v1/chat/completions", body)
        return parse_chat_completion(data, call_id, request, started)

    async def count_tokens(self, request: ChatRequest) -> int:
        body = await self.chat_body(request)
        keep = ("model", "messages", "tools", "chat_template_kwargs")
        data = await self._call("POST", "/tokenize", {k: body[k] for k in keep if k in body})
        if not isinstance(data, dict) or not isinstance(data.get("count"), int):
            raise GatewayError("upstream_error", "the upstream's /tokenize answer has no token count")
        return data["count"]

    async def chat_body(self, request: ChatRequest) -> dict[str, Any]:
        s = request.sampling
        body: dict[str, Any] = {
            "model": await self.model(),
            "messages": [m for msg in request.messages for m in to_openai_messages(msg)],
            "return_token_ids": True,
            "logprobs": True,
            "stream": False,
        }
        if request.tools:
            body["tools"] = [
                {"type": "function", "function": {"name": t.name, "description": t.description or "", "parameters": t.parameters}}
                for t in request.tools
            ]
            choice = request.tool_choice
            body["tool_choice"] = (
                {"type": "function", "function": {"name": choice.name}} if choice.mode == "tool" else choice.mode
            )
            if request.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = request.parallel_tool_calls
        for key in ("max_tokens", "temperature", "top_p", "top_k", "seed", "presence_penalty", "frequency_penalty"):
            value = getattr(s, key)
            if value is not None:
                body[key] = value
        if s.stop:
            body["stop"] = s.stop
        if request.thinking.enabled is not None:
            body["chat_template_kwargs"] = {"enable_thinking": request.thinking.enabled}
        if request.response_schema is not None:
            body["response_format"] = {"type": "json_schema", "json_schema": {"name": "response", "schema": request.response_schema}}
        return body

    async def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        url = f"{self.base_url}{path}"
        try:
            resp = await self.client.request(method, path, json=body)
        except httpx.TimeoutException:
            raise GatewayError("upstream_timeout", f"the upstream {url} did not answer in time") from None
        except httpx.ConnectError as exc:
            raise GatewayError("upstream_unavailable", f"cannot connect to the upstream {url}: {exc}") from None
        except httpx.HTTPError as exc:  # reset mid-body, protocol errors
            raise GatewayError("upstream_error", f"the upstream {url} broke off: {type(exc).__name__}: {exc}") from None
        try:
            data = resp.json()
        except (json.JSONDecodeError, UnicodeDecodeError):
            snippet = resp.text[:200] if resp.content else "<empty body>"
            raise GatewayError(
                "upstream_error", f"the upstream {url} answered {resp.status_code} with a body that is not JSON: {snippet!r}"
            ) from None
        if resp.status_code >= 400:
            raise upstream_status_error(resp.status_code, data, url)
        return data


def upstream_status_error(status: int, data: Any, url: str) -> GatewayError:
    message = _error_message(data)
    if status in (400, 413, 422) and any(m in message.lower() for m in _CONTEXT_MARKERS):
        return GatewayError("context_length", f"the prompt is too long for the model: {message}")
    if status in (400, 422):
        return GatewayError("invalid_request", f"the upstream rejected the request: {message}")
    if status == 429:
        return GatewayError("rate_limit", f"the upstream is rate limiting: {message}")
    if status == 503:
        return GatewayError("upstream_unavailable", f"the upstream is unavailable: {message}")
    return GatewayError("upstream_error", f"the upstream {url} answered {status}: {message}")


def _error_message(data: Any) -> str:
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        if isinstance(err, str):
            return err
        if isinstance(data.get("message"), str):
            return data["message"]
    return json.dumps(data)[:300]


def to_openai_messages(msg: Message) -> list[dict[str, Any]]:
    """One canonical message as OpenAI chat messages (the shape vLLM's chat template consumes)."""
    if msg.role == "tool":
        text = msg.text()
        if msg.is_error and not text.lower().startswith("error"):
            text = f"Error: {text}"
        return [{"role": "tool", "tool_call_id": msg.tool_call_id or "", "content": text}]
    if msg.role == "assistant":
        out: dict[str, Any] = {"role": "assistant", "content": msg.text()}
        reasoning = msg.reasoning_text()
        if reasoning:
            # Templates read `reasoning_content`; newer vLLM also accepts `reasoning`.
            out["reasoning_content"] = reasoning
        if msg.tool_calls:
            out["tool_calls"] = [
                {"id": tc.id, "type": "function", "function": {"name": tc.name, "arguments": tc.arguments or "{}"}}
                for tc in msg.tool_calls
            ]
        return [out]
    if all(isinstance(p, TextPart) for p in msg.content):
        return [{"role": msg.role, "content": msg.text()}]
    parts: list[dict[str, Any]] = []
    for p in msg.content:
        if isinstance(p, TextPart):
            parts.append({"type": "text", "text": p.text})
        elif isinstance(p, ImagePart):
            url = p.url or f"data:{p.media_type or 'image/png'};base64,{p.data or ''}"
            parts.append({"type": "image_url", "image_url": {"url": url}})
    return [{"role": msg.role, "content": parts}]


def parse_chat_completion(data: Any, call_id: str, request: ChatRequest, started: float) -> ChatResult:
    """A vLLM chat completion (with token ids) → ChatResult. Malformed answers are upstream errors."""
    try:
        choice = data["choices"][0]
        message = choice["message"]
        completion_ids = list(choice.get("token_ids") or [])
        prompt_ids = list(data.get("prompt_token_ids") or [])
        logprob_items = (choice.get("logprobs") or {}).get("content") or []
        logprobs = [float(item["logprob"]) for item in logprob_items]
        usage = data.get("usage") or {}
        tool_calls = [
            ToolCall(
                id=tc.get("id") or f"call_{secrets.token_hex(12)}",
                name=tc["function"]["name"],
                arguments=tc["function"].get("arguments") or "{}",
            )
            for tc in (message.get("tool_calls") or [])
        ]
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise GatewayError(
            "upstream_error", f"the upstream's answer is not a chat completion with token ids ({type(exc).__name__}: {exc})"
        ) from None
    reasoning_text = message.get("reasoning") or message.get("reasoning_content")
    finish = choice.get("finish_reason") or "stop"
    stop_reason = choice.get("stop_reason")
    stop_sequence = stop_reason if isinstance(stop_reason, str) and stop_reason in request.sampling.stop else None
    if tool_calls and finish != "length":
        finish = "tool_calls"
    elif stop_sequence is not None:
        finish = "stop_sequence"
    elif finish not in ("stop", "length", "tool_calls", "content_filter"):
        finish = "stop"
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens") or 0
    return ChatResult(
        id=call_id,
        model=data.get("model") or "",
        created=int(data.get("created") or started),
        content=message.get("content") or "",
        reasoning=Reasoning(text=reasoning_text) if reasoning_text else None,
        tool_calls=tool_calls,
        finish_reason=finish,
        stop_sequence=stop_sequence,
        usage=Usage(
            prompt_tokens=usage.get("prompt_tokens", len(prompt_ids)),
            completion_tokens=usage.get("completion_tokens", len(completion_ids)),
            cached_tokens=cached,
        ),
        prompt_token_ids=prompt_ids,
        completion_token_ids=completion_ids,
        completion_logprobs=logprobs,
    )
