"""What the gateway hands the capture writer: typed records, not raw row dicts.

A call is written twice: `CallStart` when it goes upstream (status pending, so a crash leaves it
visible; with the request as polar sends it, known by then) and `CallEnd` when it ends. The token
columns come as a `TokenRecord` whose prompt is already split against the session's earlier sequences
(`Lineage`), computed by the session state before the write and remembered by it only after the write
has committed.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, fields
from typing import Any

from polar.capture.bodies import compress, pack, pack_json
from polar.capture.dictionaries import Plain
from polar.capture.tokens import as_ids, pack_logprobs
from polar.json_values import exact, same

# Bodies above this are stored truncated (the call is still recorded, with its error).
STORED_BODY_LIMIT = 8 * 1024 * 1024
_PLAIN = Plain()  # small values without dictionaries, where no writer's `Packer` is given


@dataclass
class CallStart:
    call_id: str
    session_id: str
    provider: str
    endpoint: str
    path: str
    client: str | None
    key_hash: str | None
    request_headers: dict[str, str]  # already redacted
    request_body: bytes
    t_start: float
    # The canonical request as stored, and its messages as references (written with the arrival when it is
    # known by then; else the completion writes it).
    canonical: dict[str, Any] | None = None
    messages: MessageRefs | None = None

    def encode(self, packer: Plain = _PLAIN) -> tuple[dict[str, Any], list[StoredMessage]]:
        """The row without its body (the writer stores that against the session's earlier ones, bodies.py), and
        the content-addressed values it references."""
        row = {name: getattr(self, name) for name in _START_COLUMNS}  # not asdict: it deep-copies the headers
        # A harness sends ~0.7 KB of headers a call, the same every call: its dictionary's kind of value.
        row["request_headers"] = pack_json(json.dumps(self.request_headers), packer.of("headers"))
        if self.canonical is None:
            return row, []
        row["canonical"], values = encode_canonical(self.canonical, self.messages, packer)
        return row, values

    def stored_body(self) -> bytes:
        return self.request_body[:STORED_BODY_LIMIT]


_START_COLUMNS = [f.name for f in fields(CallStart) if f.name not in ("request_body", "canonical", "messages")]


@dataclass(frozen=True)
class Lineage:
    """How a prompt is stored: the first `prefix_len` ids are row `parent`'s prompt + completion."""

    parent: int | None
    prefix_len: int


@dataclass
class TokenRecord:
    prompt_ids: Any  # list[int] | np.ndarray
    completion_ids: Any
    logprobs: list[float] | None  # None: the upstream returned none
    lineage: Lineage = Lineage(None, 0)

    def columns(self) -> dict[str, Any]:
        prompt = as_ids(self.prompt_ids)
        suffix, encoding = pack(prompt[self.lineage.prefix_len :].tobytes())
        completion, completion_encoding = pack(as_ids(self.completion_ids).tobytes())
        logprobs = None if self.logprobs is None else pack_logprobs(self.logprobs)
        if logprobs is not None and completion_encoding:  # one encoding for both columns
            logprobs = compress(logprobs)
        return {
            "prompt_parent": self.lineage.parent,
            "prompt_prefix_len": self.lineage.prefix_len,
            "prompt_suffix": suffix,
            "prompt_encoding": encoding,
            "prompt_len": len(prompt),
            "completion_ids": completion,
            "completion_logprobs": logprobs,
            "completion_encoding": completion_encoding,
            "completion_len": len(self.completion_ids),
        }


@dataclass(frozen=True)
class StoredMessage:
    """A JSON value under its content address: a canonical message, or a large part of the request."""

    digest: str
    body: str  # canonical JSON

    def stored(self, packer: Plain = _PLAIN) -> str | bytes:
        """As the `messages` table holds it: the text, or a large one zstd-compressed (a BLOB)."""
        return pack_json(self.body, packer.of("message"))


# Top-level parts of the canonical request at least this large (as JSON) are stored once in the
# `messages` table and referenced: the tools (tens of KB for a coding agent) repeat on every call.
PART_MIN_CHARS = 256


@dataclass
class CallEnd:
    status: str  # ok | error
    http_status: int
    response_body: bytes
    t_end: float
    model: str | None = None
    stream: bool | None = None
    error_kind: str | None = None
    error: str | None = None
    upstream_model: str | None = None
    result: str | None = None  # canonical result JSON, without token arrays
    finish_reason: str | None = None
    policy_version: int | None = None  # the trainer's step the gate resumed under (gateway/gate.py)
    weight_version: str | None = None  # the upstream's own label for the weights that sampled it
    prompt_mode: str | None = None
    replica: str | None = None  # the fleet replica that answered (or failed) the call
    t_upstream: float | None = None
    t_first: float | None = None  # when the first streamed piece of the answer went to the client
    rewrites: list[str] = field(default_factory=list)
    # The canonical request, and its messages as references (with the new ones to store alongside).
    canonical: dict[str, Any] | None = None
    messages: MessageRefs | None = None
    tokens: TokenRecord | None = None

    def encode(self, packer: Plain = _PLAIN, response: dict[str, Any] | None = None
               ) -> tuple[dict[str, Any], list[StoredMessage]]:
        """The row's columns, and the content-addressed values (messages, large parts) it references.
        `response`: the response body's columns when the writer stored it apart (a large one: bodies.py)."""
        row: dict[str, Any] = {
            "status": self.status, "http_status": self.http_status, "response_body": self.response_body,
            "t_end": self.t_end, "model": self.model, "stream": None if self.stream is None else int(self.stream),
            "error_kind": self.error_kind, "error": self.error, "upstream_model": self.upstream_model,
            "result": self.result, "finish_reason": self.finish_reason, "policy_version": self.policy_version,
            "weight_version": self.weight_version,
            "prompt_mode": self.prompt_mode, "replica": self.replica, "t_upstream": self.t_upstream, "t_first": self.t_first,
            "rewrites": pack_json(json.dumps(self.rewrites)) if self.rewrites else None,
        }  # fmt: skip
        if response is None:
            row["response_body"], row["response_encoding"] = pack(self.response_body, packer.of("response"))
        else:
            row.update(response)
        values: list[StoredMessage] = []
        if self.canonical is not None:
            row["canonical"], values = encode_canonical(self.canonical, self.messages, packer)
        if self.result is not None:
            row["result"] = pack_json(self.result, packer.of("result"))
        if self.tokens is not None:
            row.update(self.tokens.columns())
        return row, values


def encode_canonical(canonical: dict[str, Any], refs: MessageRefs | None,
                     packer: Plain = _PLAIN) -> tuple[str | bytes, list[StoredMessage]]:
    """The `canonical` column (messages and large parts as references), and the values to store under them."""
    refs = refs or encode_messages(canonical["messages"], MessageLog())
    rest, parts = encode_parts({k: v for k, v in canonical.items() if k != "messages"})
    column = pack_json(json.dumps({**rest, **refs.stored()}, ensure_ascii=False), packer.of("canonical"))
    return column, refs.new + parts


def encode_parts(canonical: dict[str, Any]) -> tuple[dict[str, Any], list[StoredMessage]]:
    """The canonical request with each large part replaced, in place, by its content address (listed under
    `part_refs`), and the parts to store. A part keeps its own key order, so it reads back exactly."""
    out, keys, parts = dict(canonical), [], []
    for key, value in canonical.items():
        if isinstance(value, (dict, list)) and value:
            stored = _part(key, value)
            if stored is not None:
                parts.append(stored)
                out[key] = stored.digest
                keys.append(key)
    if keys:
        out["part_refs"] = keys
    return out, parts


# The last value of each part name and what it was stored as: a harness sends the same tools on every call
# (tens of KB to serialise and hash); the same JSON again (json_values.same) is not redone.
_last_parts: dict[str, tuple[Any, bytes | None, StoredMessage | None]] = {}


def _part(key: str, value: Any) -> StoredMessage | None:
    last = _last_parts.get(key)
    if last is not None and same(value, last[0], last[1]):
        return last[2]
    body = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
    stored = _addressed(body) if len(body) >= PART_MIN_CHARS else None
    _last_parts[key] = (value, exact(value), stored)
    return stored


def stored_message(message: dict[str, Any]) -> StoredMessage:
    """A canonical message under its content address (its key in the `messages` table)."""
    return _addressed(json.dumps(message, ensure_ascii=False, sort_keys=True, separators=(",", ":")))


def _addressed(body: str) -> StoredMessage:
    # surrogatepass: a lone surrogate ("\\ud800" is valid JSON) must reach the writer, which marks the
    # row capture_failed and fails the call, not raise here, outside the gateway's guard.
    return StoredMessage(hashlib.blake2b(body.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest(), body)


# A row's message references are stored as "its parent row's first n, then these" (a turn re-sends the
# whole history: listing every reference on every call grows as turns x history). A row lists them
# whole again once its lineage has listed as many since the last whole row as that row did (so the whole
# lists add at most as much again: linear), or after REFS_CHAIN parents (reading one row follows at most
# REFS_CHAIN - 1).
REFS_CHAIN = 256


@dataclass(frozen=True)
class MessageLog:
    """A session's last committed call: its canonical messages with their content addresses, the row that
    holds them, and how that row's references are stored (parents leaned on, references listed since
    the last whole list, that list's length). What the next call is encoded against."""

    row: int | None = None
    depth: int = 0
    since: int = 0
    whole: int = 0
    items: list[tuple[dict[str, Any], str]] = field(default_factory=list)

    @classmethod
    def rebuilt(cls, row: int, messages: list[dict[str, Any]]) -> MessageLog:
        """From a row read back (how it leans unknown: the next call lists its references whole)."""
        return cls(row, REFS_CHAIN, 0, 0, [(m, stored_message(m).digest) for m in messages])


@dataclass
class MessageRefs:
    """A request's messages as content addresses: all of them, the new ones to store, and how the row
    stores the list (`base` row's first `shared` references, then the rest)."""

    refs: list[str]
    new: list[StoredMessage]
    base: int | None = None
    shared: int = 0
    depth: int = 0  # parents between this row and one listing its references whole
    since: int = 0  # references listed by this row and its parents since that one
    whole: int = 0  # how many that one listed

    def stored(self) -> dict[str, Any]:
        if self.base is None:
            return {"message_refs": self.refs}
        return {"message_base": [self.base, self.shared], "message_refs": self.refs[self.shared :]}

    def log(self, row: int, messages: list[dict[str, Any]]) -> MessageLog:
        """What the session remembers once this row has committed."""
        return MessageLog(row, self.depth, self.since, self.whole, list(zip(messages, self.refs)))


def encode_messages(messages: list[dict[str, Any]], last: MessageLog) -> MessageRefs:
    """References for a request's messages, and the ones to store. A turn re-sends the whole history:
    messages equal to the session's last ones are neither re-serialised nor hashed (the very same dicts,
    when the history was read through the session's memo; else a C-level comparison)."""
    refs: list[str] = []
    new: list[StoredMessage] = []
    shared = 0
    for i, message in enumerate(messages):
        if i < len(last.items) and (last.items[i][0] is message or last.items[i][0] == message):
            refs.append(last.items[i][1])
            shared += shared == i
            continue
        stored = stored_message(message)
        refs.append(stored.digest)
        new.append(stored)
    since = last.since + len(refs) - shared
    if last.row is None or shared == 0 or last.depth + 1 >= REFS_CHAIN or since > last.whole:
        return MessageRefs(refs, new, whole=len(refs))
    return MessageRefs(refs, new, last.row, shared, last.depth + 1, since, last.whole)
