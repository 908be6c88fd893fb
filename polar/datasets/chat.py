"""Chat-format rows: a trajectory as OpenAI-style `messages` + `tools`, the shape SFT trainers load.

The conversation is rebuilt from the captured canonical requests and results of the trajectory's
turns, the way the gateway built each prompt: the first turn's request messages, then for every
turn the assistant message polar answered with (the sampled reasoning, text and tool calls, as
parsed), then the messages the next request added after it. Messages are mapped to OpenAI chat
dicts by the same function the gateway renders prompts with (`to_openai_messages`), so rendering
a row with the model's chat template gives back the trajectory's tokens when the template is
prefix-stable (see `rerender_mismatch`).

Free-form JSON objects stay JSON text: tool-call `arguments` (as in the OpenAI wire format) and the
`tools` list. Arrow, and so `datasets`, infers one struct type per column across all rows, so
objects with different keys per row would become one union struct padded with nulls (and a
template would then render those nulls). `parse_chat_row` turns them back into objects.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa

from polar.canonical import ChatRequest, ChatResult, ImagePart, Message, TextPart
from polar.datasets.select import IDENTITY_COLUMNS, Candidate
from polar.datasets.source import SourceError
from polar.sessions.fingerprints import message_fingerprint
from polar.sessions.splice import KEPT
from polar.tokens.messages import to_openai_messages, to_openai_tools

_TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()),
                        ("function", pa.struct([("name", pa.string()), ("arguments", pa.string())]))])
_MESSAGE = pa.struct([
    ("role", pa.string()),
    ("content", pa.string()),
    ("reasoning_content", pa.string()),
    ("tool_calls", pa.list_(_TOOL_CALL)),
    ("tool_call_id", pa.string()),
    ("name", pa.string()),
    ("train", pa.bool_()),
])
SCHEMA = pa.schema([
    *IDENTITY_COLUMNS,
    ("messages", pa.list_(_MESSAGE)),
    ("tools", pa.string()),  # JSON text: a list of OpenAI function tools
    ("chat_template_kwargs", pa.struct([("enable_thinking", pa.bool_())])),
])


class ChatRowError(ValueError):
    """This trajectory has no chat row: `reason` (counted in the export statistics) and details."""

    def __init__(self, reason: str, detail: str = ""):
        super().__init__(f"{reason} ({detail})" if detail else reason)
        self.reason = reason


def answer_message(result: ChatResult) -> Message:
    """The assistant message polar returned for a call: what the model sampled, parsed."""
    return Message(role="assistant", content=[TextPart(text=result.content)] if result.content else [],
                   reasoning=[result.reasoning] if result.reasoning else [], tool_calls=result.tool_calls)


def conversation(c: Candidate, rows: dict[int, dict[str, Any]]) -> tuple[list[tuple[Message, bool]], ChatRequest]:
    """The trajectory's messages, each with whether it is a turn this trajectory sampled, and its
    first request (tools and thinking mode hold for the whole trajectory)."""
    t = c.trajectory
    messages: list[tuple[Message, bool]] = []
    first: ChatRequest | None = None
    previous: ChatRequest | None = None
    for i, turn in enumerate(t.turns):
        row = rows.get(turn.row_id)
        if row is None or row.get("call_id") != turn.call_id:
            raise SourceError(f"capture row {turn.row_id} of session {t.session_id} is not call {turn.call_id}: "
                              "the capture database does not belong to this rollout state")
        if not isinstance(row.get("canonical"), dict) or not isinstance(row.get("result"), dict):
            raise ChatRowError("a call has no canonical request or result", f"capture row {turn.row_id}")
        request = ChatRequest.model_validate(row["canonical"])
        result = ChatResult.model_validate(row["result"])
        if previous is None:
            first, new = request, request.messages
        else:
            new = _added_messages(previous, messages, request, i, KEPT in (turn.prompt_mode or ""))
            if request.tools != first.tools or request.thinking.enabled != first.thinking.enabled:
                raise ChatRowError("the tools or thinking mode changed mid-trajectory", f"turn {i} of {t.id}")
        messages += [(m, False) for m in new]
        messages.append((answer_message(result), True))
        previous = request
    if first is None:
        raise ChatRowError("no turns", t.id)
    return messages, first


def _added_messages(previous: ChatRequest, so_far: list[tuple[Message, bool]], request: ChatRequest,
                    index: int, kept_dropped: bool) -> list[Message]:
    """What `request` adds after the previous request and its answer (as the gateway's buffers
    match a continuation: by what the model conditions on, not the client's serialisation). A turn whose
    prompt kept the messages the harness dropped before the answer (sessions/splice.py KEPT) adds what follows
    the answer: the dropped ones are already in the conversation, where the model saw them."""
    n = len(previous.messages)
    keys = [message_fingerprint(m) for m in request.messages]
    earlier = [message_fingerprint(m) for m in previous.messages]
    answer = message_fingerprint(so_far[-1][0])
    if len(keys) > n and keys[: n + 1] == [*earlier, answer]:
        return request.messages[n + 1 :]
    kept = next((i for i, (a, b) in enumerate(zip(keys, earlier)) if a != b), min(len(keys), n))
    if kept_dropped and kept < min(len(keys), n) and keys[kept] == answer:
        return request.messages[kept + 1 :]
    raise ChatRowError("a turn's request does not continue the previous turn's conversation", f"turn {index}")


def openai_message(message: Message, train: bool) -> dict[str, Any]:
    """One canonical message as an OpenAI chat dict with every key of the schema's message struct, so
    all rows share one Arrow type."""
    if any(isinstance(p, ImagePart) for p in message.content):
        raise ChatRowError("images (chat rows carry text only)")
    (out,) = to_openai_messages(message)
    return {
        "role": out["role"],
        "content": out.get("content") or "",
        "reasoning_content": out.get("reasoning_content"),
        "tool_calls": out.get("tool_calls"),  # arguments stay JSON text, as on the OpenAI wire
        "tool_call_id": out.get("tool_call_id"),
        "name": out.get("name"),
        "train": train,  # an assistant turn this trajectory sampled (its tokens carry the loss)
    }


def chat_row(c: Candidate, rows: dict[int, dict[str, Any]]) -> dict[str, Any]:
    messages, first = conversation(c, rows)
    return {
        **c.identity(),
        "messages": [openai_message(m, train) for m, train in messages],
        "tools": json.dumps(to_openai_tools(first.tools), ensure_ascii=False),
        "chat_template_kwargs": {"enable_thinking": first.thinking.enabled},
    }


# -- reading rows back -----------------------------------------------------------------------------


def parse_chat_row(row: dict[str, Any]) -> dict[str, Any]:
    """A chat row as `apply_chat_template` wants it: tools and tool-call arguments as objects, keys
    whose value is null dropped (so a template's `is defined` tests see what the model saw).

        parsed = parse_chat_row(row)
        tokenizer.apply_chat_template(parsed["messages"], tools=parsed["tools"], **parsed["chat_template_kwargs"])
    """
    messages = []
    for m in row["messages"]:
        m = {k: v for k, v in m.items() if v is not None}
        if m.get("tool_calls"):
            m["tool_calls"] = [{**call, "function": {**call["function"],
                                                     "arguments": _json_value(call["function"].get("arguments"))}}
                               for call in m["tool_calls"]]
        else:
            m.pop("tool_calls", None)
        messages.append(m)
    tools = row.get("tools")
    kwargs = {k: v for k, v in (row.get("chat_template_kwargs") or {}).items() if v is not None}
    return {**row, "messages": messages, "tools": json.loads(tools) if isinstance(tools, str) else tools or [],
            "chat_template_kwargs": kwargs}


def _json_value(text: Any) -> Any:
    if not isinstance(text, str):
        return text if text is not None else {}
    if not text.strip():
        return {}
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text  # not JSON: kept as the model wrote it


def parse_chat_batch(batch: dict[str, list]) -> dict[str, list]:
    """`parse_chat_row` over a `datasets` batch, for `Dataset.with_transform` (objects never go back to Arrow)."""
    keys = list(batch)
    rows = [dict(zip(keys, values)) for values in zip(*batch.values())]
    parsed = [parse_chat_row(r) for r in rows]
    return {k: [p[k] for p in parsed] for k in keys}


def features():
    """The chat rows' `datasets.Features`: pass them to `load_dataset("json", ...)` so a column that
    happens to be null in every row of a file (e.g. `name`) still loads with its real type."""
    from datasets import Features

    return Features.from_arrow_schema(SCHEMA)


def load_chat(path: str, split: str = "train", **kwargs: Any):
    """Chat rows (a .jsonl or .parquet file, or an export directory) as a `datasets.Dataset` whose
    rows come back parsed (`parse_chat_row`)."""
    from pathlib import Path

    from datasets import load_dataset

    p = Path(path)
    if p.is_dir():
        candidates = [p / "chat" / f"{split}.{ext}" for ext in ("parquet", "jsonl")]
        p = next((c for c in candidates if c.exists()), candidates[-1])
    if p.suffix == ".parquet":
        ds = load_dataset("parquet", data_files={split: str(p)}, split=split, **kwargs)
    else:
        ds = load_dataset("json", data_files={split: str(p)}, split=split, features=features(), **kwargs)
    return ds.with_transform(parse_chat_batch)


# -- checking a row against its tokens ---------------------------------------------------------------


def rerender_mismatch(template, row: dict[str, Any], token_ids: list[int]) -> str | None:
    """None when the row, rendered by `template` (a polar.tokens.ChatTemplate), gives exactly
    `token_ids` followed only by the template's closing of the last turn; else where it differs."""
    parsed = parse_chat_row(row)
    text = template.render(parsed["messages"], parsed["tools"], add_generation_prompt=False,
                           enable_thinking=parsed["chat_template_kwargs"].get("enable_thinking"))
    ids = template.whole_encoder()(text)  # rows of one export share their system prompt and tools
    n = next((i for i, (a, b) in enumerate(zip(ids, token_ids)) if a != b), min(len(ids), len(token_ids)))
    if n < len(token_ids):
        got, want = template.decode(ids[n : n + 8]), template.decode(token_ids[n : n + 8])
        return f"differs at token {n} of {len(token_ids)}: rendered {got!r}, captured {want!r}"
    tail = template.decode(ids[n:])
    if tail.strip() not in ("", template.end_of_turn or ""):
        return f"the rendering goes on after the captured tokens with {tail[:60]!r}"
    return None
