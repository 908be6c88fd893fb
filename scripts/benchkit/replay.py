"""Replaying a recorded CLI request (data/harness_requests/<cli>.json) as a session that grows turn by turn.

A `Session` starts from the CLI's real first request and, after each call, appends the answer its client
received — parsed from that provider's response, streamed or not — and one tool result per tool call
holding ~2 KB of tool output, shaped as the CLI shaped its own tool result in the recorded later turn.
One `Api` per provider format knows the three things that differ: where streaming is switched, how an
answer is read, and how it goes back into the history. The tool output (`tool_output`, in `prose`) and the
Anthropic stream reader (`blocks_of`) serve scripts/bench_storage.py's Claude Code-shaped sessions as well;
benchkit/lockstep.py drives these sessions against the targets.
"""

from __future__ import annotations

import copy
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit.targets import REPO

FIXTURES = REPO / "data" / "harness_requests"
# A dummy key in the header each provider's clients send it in (the recorded headers have none).
AUTH = {"anthropic": {"x-api-key": "bench"}, "openai_chat": {"authorization": "Bearer bench"},
        "openai_responses": {"authorization": "Bearer bench"}, "gemini": {"x-goog-api-key": "bench"}}


@dataclass(frozen=True)
class Fixture:
    """One CLI's recorded requests: the first of its session and a later one (the tool-result shape)."""

    cli: str
    provider: str
    api: str
    stream: bool
    marker: str
    path: str
    headers: dict[str, str]
    first: dict[str, Any]
    later: dict[str, Any]

    @classmethod
    def load(cls, cli: str, root: Path = FIXTURES) -> Fixture:
        data = json.loads((root / f"{cli}.json").read_text())
        return cls(data["cli"], data["provider"], data["api"], data["stream"], data["marker"], data["first"]["path"],
                   data["first"]["headers"], data["first"]["body"], data["later"]["body"])


def sse_data(raw: bytes) -> list[dict[str, Any]]:
    """The JSON events of a server-sent-event stream (`[DONE]` and comments left out)."""
    events = []
    for line in raw.decode().splitlines():
        if line.startswith("data:") and line[5:].strip() not in ("", "[DONE]"):
            events.append(json.loads(line[5:]))
    return events


def blocks_of(sse: bytes) -> list[dict[str, Any]]:
    """The assistant content a client rebuilds from an Anthropic Messages stream, as it sends it back."""
    blocks: list[dict[str, Any]] = []
    partial: dict[int, str] = {}
    for event in sse_data(sse):
        if event["type"] == "content_block_start":
            blocks.append(dict(event["content_block"]))
        elif event["type"] == "content_block_delta":
            block, delta = blocks[event["index"]], event["delta"]
            if delta["type"] == "input_json_delta":
                partial[event["index"]] = partial.get(event["index"], "") + delta["partial_json"]
            else:
                key = {"text_delta": "text", "thinking_delta": "thinking", "signature_delta": "signature"}[delta["type"]]
                block[key] = block.get(key, "") + delta[key]
    for index, raw in partial.items():
        blocks[index]["input"] = json.loads(raw)
    return blocks


# -- what the replayed sessions' tools output ---------------------------------------------------

WORDS = ("the of to and a in is it you that for on with as are this be at or have from by not but what all when "
         "can use tool file code user task run test read write edit command output must should never always only "
         "each before after change project repository function error result make sure check path line return "
         "value new old search pattern commit branch message prefer avoid explain concise answer step plan").split()


def prose(rng: random.Random, chars: int) -> str:
    """English-like instructions: a small vocabulary in sentences, about as compressible as real prose."""
    out: list[str] = []
    size = 0
    while size < chars:
        sentence = " ".join(rng.choice(WORDS) for _ in range(rng.randint(6, 18))).capitalize() + "."
        out.append(sentence)
        size += len(sentence) + 1
    return " ".join(out)


def tool_output(session: int, turn: int, size: int = 2000) -> str:
    """~`size` bytes of a tool's output: file listings, code, test logs — different per session and turn."""
    rng = random.Random(f"out {session} {turn}")
    lines: list[str] = []
    while sum(len(line) + 1 for line in lines) < size:
        kind = rng.randrange(3)
        if kind == 0:
            lines.append(f"src/pkg_{rng.randrange(40)}/module_{rng.randrange(200)}.py:{rng.randrange(900)}: "
                         f"def handler_{rng.randrange(10_000)}(request, *, timeout={rng.randrange(60)}):")
        elif kind == 1:
            lines.append(f"tests/test_{rng.randrange(300)}.py::test_case_{rng.randrange(5000)} "
                         f"{rng.choice(['PASSED', 'FAILED', 'SKIPPED'])} [{rng.randrange(100)}%]")
        else:
            lines.append("    " + prose(rng, 60))
    return "\n".join(lines)



# -- one format each --------------------------------------------------------------------------------


def _text_like(template: Any, text: str) -> Any:
    """`text` in the shape the CLI used for its tool output: a string or a list of text parts."""
    if isinstance(template, list):
        return [{k: v for k, v in {**template[0], "text": text}.items() if k != "cache_control"}]
    return text


class Api:
    """A provider format: subclasses say how streaming is chosen, answers read and turns appended."""

    def __init__(self, fixture: Fixture):
        self.fixture = fixture

    def path(self, stream: bool) -> str:
        return self.fixture.path

    def body(self, body: dict[str, Any], stream: bool) -> dict[str, Any]:
        return {**body, "stream": stream}

    def answer(self, raw: bytes, stream: bool) -> Any:
        raise NotImplementedError

    def tool_calls(self, answer: Any) -> list[tuple[str, str]]:
        """(call id, tool name) of each tool call in the answer."""
        raise NotImplementedError

    def append(self, body: dict[str, Any], answer: Any, outputs: list[str]) -> None:
        raise NotImplementedError


class Anthropic(Api):
    def answer(self, raw: bytes, stream: bool) -> list[dict[str, Any]]:
        return blocks_of(raw) if stream else json.loads(raw)["content"]

    def tool_calls(self, answer: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(b["id"], b["name"]) for b in answer if b["type"] == "tool_use"]

    def append(self, body: dict[str, Any], answer: list[dict[str, Any]], outputs: list[str]) -> None:
        shape = next(b for b in self.fixture.later["messages"][-1]["content"] if b.get("type") == "tool_result")
        results = [{**{k: v for k, v in shape.items() if k != "cache_control"}, "tool_use_id": call_id,
                    "content": _text_like(shape["content"], out)}
                   for (call_id, _), out in zip(self.tool_calls(answer), outputs, strict=True)]
        body["messages"] += [{"role": "assistant", "content": answer}, {"role": "user", "content": results}]


class OpenAIChat(Api):
    def body(self, body: dict[str, Any], stream: bool) -> dict[str, Any]:
        out = {**body, "stream": stream}
        if not stream:
            out.pop("stream_options", None)  # only valid with a stream
        return out

    def answer(self, raw: bytes, stream: bool) -> dict[str, Any]:
        if not stream:
            message = json.loads(raw)["choices"][0]["message"]
            return {k: v for k, v in message.items() if v is not None and k in ("role", "content", "tool_calls",
                                                                                 "reasoning_content")}
        message: dict[str, Any] = {"role": "assistant", "content": ""}
        calls: dict[int, dict[str, Any]] = {}
        for event in sse_data(raw):
            for choice in event.get("choices") or []:
                delta = choice.get("delta") or {}
                for key in ("content", "reasoning_content"):
                    if delta.get(key):
                        message[key] = message.get(key, "") + delta[key]
                for part in delta.get("tool_calls") or []:
                    call = calls.setdefault(part.get("index", 0), {"id": "", "type": "function",
                                                                   "function": {"name": "", "arguments": ""}})
                    call["id"] = part.get("id") or call["id"]
                    fn = part.get("function") or {}
                    call["function"]["name"] += fn.get("name") or ""
                    call["function"]["arguments"] += fn.get("arguments") or ""
        if calls:
            message["tool_calls"] = [calls[i] for i in sorted(calls)]
        return message

    def tool_calls(self, answer: dict[str, Any]) -> list[tuple[str, str]]:
        return [(c["id"], c["function"]["name"]) for c in answer.get("tool_calls") or []]

    def append(self, body: dict[str, Any], answer: dict[str, Any], outputs: list[str]) -> None:
        shape = self.fixture.later["messages"][-1]
        body["messages"] += [answer] + [{**shape, "tool_call_id": call_id, "content": _text_like(shape["content"], out)}
                                        for (call_id, _), out in zip(self.tool_calls(answer), outputs, strict=True)]


class OpenAIResponses(Api):
    def answer(self, raw: bytes, stream: bool) -> list[dict[str, Any]]:
        if not stream:
            return json.loads(raw)["output"]
        done = [e for e in sse_data(raw) if e.get("type") == "response.completed"]
        if not done:
            raise ValueError(f"a Responses stream without response.completed: {raw[-300:]!r}")
        return done[-1]["response"]["output"]

    def tool_calls(self, answer: list[dict[str, Any]]) -> list[tuple[str, str]]:
        return [(item["call_id"], item["name"]) for item in answer if item.get("type") == "function_call"]

    def append(self, body: dict[str, Any], answer: list[dict[str, Any]], outputs: list[str]) -> None:
        shape = next(i for i in reversed(self.fixture.later["input"]) if i.get("type") == "function_call_output")
        shape = {k: v for k, v in shape.items() if k != "id"}  # the client's own item id: one per item
        body["input"] = body["input"] + answer + [{**shape, "call_id": call_id, "output": out} for (call_id, _), out
                                                  in zip(self.tool_calls(answer), outputs, strict=True)]


class Gemini(Api):
    def path(self, stream: bool) -> str:
        head = self.fixture.path.split(":", 1)[0]
        return f"{head}:streamGenerateContent?alt=sse" if stream else f"{head}:generateContent"

    def body(self, body: dict[str, Any], stream: bool) -> dict[str, Any]:
        return body  # the path says it

    def answer(self, raw: bytes, stream: bool) -> dict[str, Any]:
        """As Gemini CLI keeps a streamed answer in its history: thoughts dropped, each run of plain text
        parts (one per chunk) joined into one part."""
        chunks = sse_data(raw) if stream else [json.loads(raw)]
        parts: list[dict[str, Any]] = []
        for chunk in chunks:
            for cand in chunk.get("candidates") or []:
                for part in (cand.get("content") or {}).get("parts") or []:
                    if part.get("thought"):
                        continue
                    if parts and _plain_text(parts[-1]) and _plain_text(part):
                        parts[-1] = {**parts[-1], "text": parts[-1]["text"] + part["text"]}
                    else:
                        parts.append(part)
        return {"role": "model", "parts": parts}

    def tool_calls(self, answer: dict[str, Any]) -> list[tuple[str, str]]:
        return [(p["functionCall"].get("id", ""), p["functionCall"]["name"]) for p in answer["parts"] if "functionCall" in p]

    def append(self, body: dict[str, Any], answer: dict[str, Any], outputs: list[str]) -> None:
        shape = self.fixture.later["contents"][-1]["parts"][0]["functionResponse"]
        parts = [{"functionResponse": {**shape, "id": call_id, "name": name, "response": {"output": out}}}
                 for (call_id, name), out in zip(self.tool_calls(answer), outputs, strict=True)]
        body["contents"] = body["contents"] + [answer, {"role": "user", "parts": parts}]


def _plain_text(part: dict[str, Any]) -> bool:
    return isinstance(part.get("text"), str) and not part.get("thought") and not (
        {"functionCall", "functionResponse", "inlineData", "fileData"} & part.keys())


APIS: dict[str, type[Api]] = {"anthropic": Anthropic, "openai_chat": OpenAIChat, "openai_responses": OpenAIResponses,
                              "gemini": Gemini}


def api_of(fixture: Fixture) -> Api:
    return APIS[fixture.provider](fixture)


@dataclass
class Session:
    """One replayed session: its growing request body, and the turns it has taken."""

    api: Api
    number: int
    stream: bool
    body: dict[str, Any] = field(default_factory=dict)
    turns: int = 0
    tool_bytes: int = 2000  # each tool result's size

    def __post_init__(self) -> None:
        self.body = copy.deepcopy(self.api.fixture.first)

    def request(self) -> tuple[str, bytes]:
        """(path, body) of the next call: JSON as a JS client writes it (compact, non-ASCII as is)."""
        body = self.api.body(self.body, self.stream)
        return self.api.path(self.stream), json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode()

    def received(self, raw: bytes) -> None:
        """Append the answer and one tool output per tool call (an answer without one ends nothing: the
        scripted model always calls a tool, so its absence is the target's error)."""
        answer = self.api.answer(raw, self.stream)
        calls = self.api.tool_calls(answer)
        if not calls:
            raise ValueError(f"turn {self.turns + 1}: the answer has no tool call: {json.dumps(answer)[:300]}")
        self.api.append(self.body, answer, [tool_output(self.number, self.turns * 10 + k, self.tool_bytes)
                                                for k in range(len(calls))])
        self.turns += 1
