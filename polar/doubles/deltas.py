"""How vLLM 0.32's streaming parsers cut a sampled answer into chat deltas, for the scripted TEST DOUBLE.

A streaming client of vLLM never sees the parsed message: it sees deltas, one per sampled token,
cut by the server's reasoning parser (`qwen3`) and tool parser (`hermes` for Qwen3's JSON calls,
`qwen3_coder` / `qwen3_xml` for the XML format). Their cuts are what a client has to reassemble
(held-back markup, whitespace, an argument string that grows piece by piece), so the double
reproduces them rather than streaming the final message in neat pieces. The rules below were
read off vLLM's own parsers run over the same token ids (tests/doubles/test_deltas_vs_vllm.py
keeps them honest):

- reasoning: every token's text as `reasoning` until `</think>` (`<think>`, `</think>` themselves
  give nothing); a suffix that may be the start of `</think>` is held back.
- hermes (JSON calls): content up to the first `<tool_call>`, then per call a header (id, type,
  index, function.name) once the name is complete, then the arguments text *as the model wrote it*,
  stripped, growing; its deltas carry `"content": null` beside `tool_calls`.
- qwen3 XML engine: content up to `<tool_call>`, and again between calls; until some non-blank
  content is out, whitespace is held for it (and dropped if a call comes first); a call's header comes
  one token after `<function=NAME>`; arguments are the JSON object built from the parameters, a
  string value streamed as it grows (a trailing newline held), any other value only once the
  function closes, each string's closing quote with the next key or the closing brace.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field
from typing import Any

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
TOOL_OPEN, TOOL_CLOSE = "<tool_call>", "</tool_call>"
FUNC_OPEN, FUNC_CLOSE, PARAM_OPEN, PARAM_CLOSE = "<function=", "</function>", "<parameter=", "</parameter>"
_XML_TERMINALS = (THINK_OPEN, THINK_CLOSE, TOOL_OPEN, TOOL_CLOSE, FUNC_OPEN)
_HERMES_NAME = re.compile(r'"name"\s*:\s*"([^"]+)"')
_HERMES_ARGS = re.compile(r'"arguments"\s*:\s*')


def held(text: str, *tags: str) -> int:
    """How many trailing characters might be the start of one of `tags` (vLLM holds them back)."""
    longest = 0
    for tag in tags:
        for n in range(min(len(tag) - 1, len(text)), longest, -1):
            if text.endswith(tag[:n]):
                longest = n
                break
    return longest


def tool_call_id() -> str:
    return f"chatcmpl-tool-{secrets.token_hex(8)}"


@dataclass
class _Call:
    name: str | None = None
    args: str = ""  # the arguments text sent so far


@dataclass
class DeltaParser:
    """Feed the sampled text token by token; each `feed` answers the delta vLLM would send (or None).

    `reasoning` is how the prompt leaves the reasoning block: "open" (the prompt opened it),
    "own" (the model writes `<think>` itself) or "none" (no reasoning this turn)."""

    family: str  # "qwen3" (hermes, JSON calls) or "qwen3_xml"
    reasoning: str
    tools: list[dict[str, Any]] = field(default_factory=list)
    text: str = ""
    tools_streamed: bool = False
    _reasoning_sent: int = 0
    _content_sent: int = 0
    _calls: list[_Call] = field(default_factory=list)

    def feed(self, piece: str, finished: bool = False) -> dict[str, Any] | None:
        self.text += piece
        reasoning, rest = self._split_reasoning(finished)
        delta: dict[str, Any] = {}
        if len(reasoning) > self._reasoning_sent:
            delta["reasoning"] = reasoning[self._reasoning_sent:]
            self._reasoning_sent = len(reasoning)
        if rest is not None:
            after = self._hermes(rest) if self.family == "qwen3" else self._xml(rest, finished)
            if after is not None:
                delta = after | delta  # key order as vLLM's DeltaMessage: content, reasoning, tool_calls
        if delta.get("tool_calls"):
            self.tools_streamed = True
        return delta or None

    # -- reasoning (vLLM's qwen3 reasoning parser) ----------------------------------------------

    def _split_reasoning(self, finished: bool) -> tuple[str, str | None]:
        """(reasoning text to show so far, the text after `</think>` or None while reasoning goes on)."""
        if self.reasoning == "none":
            return "", self.text
        body = self.text
        if self.reasoning == "own":
            if not body.startswith(THINK_OPEN):
                return ("", None) if THINK_OPEN.startswith(body) else (body, None)
            body = body[len(THINK_OPEN):]
        end = body.find(THINK_CLOSE)
        if end < 0:
            return (body if finished else body[: len(body) - held(body, THINK_CLOSE)]), None
        return body[:end], body[end + len(THINK_CLOSE):]

    # -- hermes -------------------------------------------------------------------------------

    def _hermes(self, text: str) -> dict[str, Any] | None:
        """vLLM's Hermes2ProToolParser.extract_tool_calls_streaming, on the text after the reasoning."""
        if not self.tools:  # tool_choice "none": the text is content, markup and all
            new = text[self._content_sent:]
            self._content_sent = len(text)
            return {"content": new} if new else None
        start = text.find(TOOL_OPEN)
        sendable = start if start >= 0 else len(text) - held(text, TOOL_OPEN)
        content = None
        if sendable > self._content_sent:
            content, self._content_sent = text[self._content_sent:sendable], sendable
        deltas = []
        for i, (body, complete) in enumerate(_hermes_regions(text)):
            if i == len(self._calls):
                self._calls.append(_Call())
            call = self._calls[i]
            if call.name is None:
                match = _HERMES_NAME.search(body)
                if not match:
                    break
                call.name = match.group(1)
                deltas.append({"id": tool_call_id(), "type": "function", "index": i, "function": {"name": call.name}})
            args = _hermes_args(body, complete)
            if args is not None and len(args) > len(call.args):
                deltas.append({"index": i, "function": {"arguments": args[len(call.args):]}})
                call.args = args
        if content or deltas:
            return {"content": content} | ({"tool_calls": deltas} if deltas else {})
        return None

    # -- the qwen3 XML engine -------------------------------------------------------------------

    def _xml(self, text: str, finished: bool) -> dict[str, Any] | None:
        content, calls = self._xml_view(text, finished)
        delta: dict[str, Any] = {}
        if len(content) > self._content_sent:
            delta["content"] = content[self._content_sent:]
            self._content_sent = len(content)
        deltas = []
        for i, (name, args) in enumerate(calls):
            if i == len(self._calls):
                self._calls.append(_Call())
            call = self._calls[i]
            if name is not None and call.name is None:
                call.name = name
                deltas.append({"id": tool_call_id(), "type": "function", "index": i, "function": {"name": name}})
            if call.name is not None and len(args) > len(call.args) and args.startswith(call.args):
                if deltas and deltas[-1]["index"] == i:  # named and given arguments at once: one entry
                    deltas[-1]["function"]["arguments"] = args[len(call.args):]
                else:
                    deltas.append({"index": i, "function": {"arguments": args[len(call.args):]}})
                call.args = args
        if deltas and self.tools:  # without tools (tool_choice "none") vLLM drops the calls
            delta["tool_calls"] = deltas
        return delta or None

    def _xml_view(self, text: str, finished: bool) -> tuple[str, list[tuple[str | None, str]]]:
        """What the engine has released so far: the content text, and per call (name or None, arguments)."""
        content, calls, pos = "", [], 0
        while True:
            start = text.find(TOOL_OPEN, pos)
            segment = text[pos:] if start < 0 else text[pos:start]
            if start < 0 and not finished:
                segment = segment[: len(segment) - held(segment, *_XML_TERMINALS)]
            # Until some real content is out, whitespace waits for it: dropped if a call comes first.
            if content.strip() or segment.strip() or (start < 0 and finished):
                content += segment
            if start < 0:
                return content, calls
            end = text.find(TOOL_CLOSE, start)
            body = text[start + len(TOOL_OPEN): end if end >= 0 else len(text)]
            calls.append(self._xml_call(body, finished and end < 0))
            if end < 0:
                return content, calls
            pos = end + len(TOOL_CLOSE)

    def _xml_call(self, body: str, finished: bool) -> tuple[str | None, str]:
        at = body.find(FUNC_OPEN)
        close = body.find(">", at) if at >= 0 else -1
        if close < 0:
            return None, ""
        name = body[at + len(FUNC_OPEN): close].strip()
        inner = body[close + 1:]
        if not inner and not finished:
            return None, ""  # the engine names the call one token after the tag closes
        done = inner.find(FUNC_CLOSE)
        params = _xml_params(inner if done < 0 else inner[:done])
        schema = self._schema(name)
        if done >= 0 or finished:
            return name, json.dumps({k: _typed(v, schema.get(k, {})) for k, v, _ in params}, ensure_ascii=False)
        if not params:
            return name, ""
        *before, (key, value, _) = params
        out = "{" + "".join(f"{json.dumps(k, ensure_ascii=False)}: "
                            f"{json.dumps(_typed(v, schema.get(k, {})), ensure_ascii=False)}, " for k, v, _ in before)
        out += json.dumps(key, ensure_ascii=False) + ": "
        if schema.get(key, {}).get("type") == "string":
            out += '"' + json.dumps(value, ensure_ascii=False)[1:-1]
        return name, out

    def _schema(self, name: str) -> dict[str, Any]:
        for tool in self.tools:
            function = tool.get("function", {})
            if function.get("name") == name:
                props = (function.get("parameters") or {}).get("properties")
                return props if isinstance(props, dict) else {}
        return {}


def _hermes_regions(text: str) -> list[tuple[str, bool]]:
    """(JSON text, complete) per `<tool_call>` region, as hermes cuts them."""
    out, pos = [], 0
    while (start := text.find(TOOL_OPEN, pos)) >= 0:
        begin = start + len(TOOL_OPEN)
        end = text.find(TOOL_CLOSE, begin)
        if end >= 0:
            out.append((text[begin:end].strip(), True))
            pos = end + len(TOOL_CLOSE)
            continue
        raw = text[begin:]
        raw = raw[: len(raw) - held(raw, TOOL_CLOSE)].strip()
        out.append((raw, bool(raw) and _complete_json(raw)))
        break
    return out


def _complete_json(text: str) -> bool:
    try:
        json.loads(text)
    except json.JSONDecodeError:
        return False
    return True


def _hermes_args(body: str, complete: bool) -> str | None:
    match = _HERMES_ARGS.search(body)
    if not match:
        return None
    raw = body[match.end():]
    if complete:
        raw = raw.rstrip()
        if raw.endswith("}"):
            raw = raw[:-1].rstrip()
    return raw


def _xml_params(inner: str) -> list[tuple[str, str, bool]]:
    """(name, value so far, complete) per `<parameter=…>`; an open value holds back what may be markup."""
    out = []
    pos = 0
    while (at := inner.find(PARAM_OPEN, pos)) >= 0:
        close = inner.find(">", at)
        if close < 0:
            break
        name = inner[at + len(PARAM_OPEN): close].strip()
        end = inner.find(PARAM_CLOSE, close)
        nxt = inner.find(PARAM_OPEN, close)
        if end >= 0 and (nxt < 0 or end < nxt):
            out.append((name, _trim(inner[close + 1: end]), True))
            pos = end + len(PARAM_CLOSE)
            continue
        value = inner[close + 1:] if nxt < 0 else inner[close + 1: nxt]
        if nxt < 0:
            value = value[: len(value) - held(value, PARAM_CLOSE, PARAM_OPEN, FUNC_CLOSE)]
        out.append((name, _trim(value), nxt >= 0))
        if nxt < 0:
            break
        pos = nxt
    return out


def _trim(value: str) -> str:
    """One wrapping newline off each end, as the template writes them around a value."""
    value = value.removeprefix("\n")
    return value.removesuffix("\n")


def _typed(value: str, schema: dict[str, Any]) -> Any:
    if schema.get("type") == "string":
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value
