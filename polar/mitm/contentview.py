"""The "polar" contentview: a model call as polar captured it, readable in mitmweb.

For a flow the gateway answered it shows the session, the trajectory the call belongs to
(prefix-merge over the session's captures, as `polar trajectories` builds it), the answer, the
sampled tokens with their logprobs (low-probability ones marked, and the lowest listed first;
"no logprobs" when the upstream returned none, never invented numbers) and the canonical request.

The data comes from the capture store, found by the row id the addon puts on the flow
(`flow.metadata["polar"]`), not from the flow itself: the store is what trainers read, so the view
shows exactly the token ids and logprobs they get, and flows stay small. Token ids are decoded
with the served model's tokenizer when polar has one (token-faithful mode); otherwise the view
shows the ids alone.
"""

from __future__ import annotations

import json
import math
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from mitmproxy import contentviews
from pydantic import ValidationError

from polar.canonical import ChatRequest
from polar.capture.reader import CaptureReader
from polar.trajectories.builders import prefix_merge
from polar.trajectories.model import Trajectory

LOW_PROB = 0.1  # sampled tokens below this probability are marked
LOW_MARK = "▶ low"
LOWEST_SHOWN = 10
TOKEN_WIDTH = 20  # characters of token text in the tables


@dataclass
class CapturedCall:
    """One capture row with the trajectory it ended up in (None when it sampled nothing)."""

    row: dict[str, Any]
    trajectory: Trajectory | None
    session_calls: int
    session_trajectories: int


class SessionCache:
    """The last few sessions' rows and trajectories, so viewing call after call of a long session
    does not re-read and re-merge it each time (seconds at 100k+ tokens, on mitmweb's event loop).
    An entry is valid while the session has the same last row and the same number of unfinished calls."""

    def __init__(self, size: int = 8):
        self.size = size
        self._entries: OrderedDict[str, tuple[tuple, list[dict[str, Any]], list[Trajectory]]] = OrderedDict()

    def get(self, store: CaptureReader, session: str, version: tuple) -> tuple[list[dict[str, Any]], list[Trajectory]]:
        entry = self._entries.get(session)
        if entry is None or entry[0] != version:
            rows = list(store.calls(session=session))
            entry = (version, rows, prefix_merge(rows))
            self._entries[session] = entry
        self._entries.move_to_end(session)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)
        return entry[1], entry[2]


def load_call(store: CaptureReader, row_id: int, call_id: str | None = None,
              cache: SessionCache | None = None) -> CapturedCall:
    """Read a call and rebuild its session's trajectories. `call_id` guards against a flow from another database."""
    conn = store.connect()
    try:
        found = conn.execute("SELECT session_id, call_id FROM calls WHERE id=?", (row_id,)).fetchone()
        version = found and tuple(conn.execute(
            "SELECT max(id), sum(status = 'pending') FROM calls WHERE session_id=?", (found["session_id"],)).fetchone())
    finally:
        conn.close()
    if found is None:
        raise ValueError(f"capture row {row_id} is not in {store.path}")
    if call_id is not None and found["call_id"] != call_id:
        raise ValueError(f"capture row {row_id} in {store.path} holds call {found['call_id']}, not this flow's {call_id}")
    rows, trajectories = (cache or SessionCache()).get(store, found["session_id"], version)
    owner = next((t for t in trajectories if any(turn.row_id == row_id for turn in t.turns)), None)
    row = next(r for r in rows if r["id"] == row_id)
    return CapturedCall(row, owner, len(rows), len(trajectories))


# -- rendering ------------------------------------------------------------------------------------
# Lines stay under ~72 characters: mitmweb's detail pane does not wrap. Blank lines hold a space,
# because mitmweb collapses empty ones.


def render(call: CapturedCall, tokenizer: Any = None, low_prob: float = LOW_PROB) -> str:
    """The view's text: header, answer, sampled tokens, canonical request."""
    parts = [_header(call), _answer(call.row), _tokens(call.row, tokenizer, low_prob), _request(call.row)]
    return "\n \n".join("\n".join(lines) for lines in parts) + "\n"


def _section(title: str) -> str:
    return f"── {title} " + "─" * max(4, 60 - len(title))


def _field(key: str, value: Any) -> str:
    return f"{key:<12}{value}"


def _dash(value: Any) -> Any:
    return "-" if value is None else value  # policy version 0 is a version


def _header(call: CapturedCall) -> list[str]:
    row = call.row
    calls = f"{call.session_calls} call{'' if call.session_calls == 1 else 's'}"
    trajectories = f"{call.session_trajectories} trajector{'y' if call.session_trajectories == 1 else 'ies'}"
    lines = [
        _field("session", f"{row['session_id']}  ({calls}, {trajectories})"),
        _field("call", f"{row['call_id']} · row {row['id']} · {row['provider']} {row['endpoint']}"),
        _field("status", row["status"] if row["status"] == "ok" else
               f"{row['status']}: {row.get('error_kind') or ''}: {row.get('error') or ''}"),
    ]
    traj = call.trajectory
    if traj is None:
        return [*lines, _field("trajectory", "none: this call sampled no tokens")]
    index, turn = next((i, t) for i, t in enumerate(traj.turns) if t.row_id == row["id"])
    lines += [
        _field("trajectory", f"{traj.id} · prefix-merge · turn {index + 1} of {len(traj.turns)}"),
        _field("", f"{len(traj.token_ids)} tokens, {traj.trainable_tokens} trainable"),
        _field("", f"this call: [{turn.prompt_start}, {turn.completion_start}) new prompt, "
                   f"[{turn.completion_start}, {turn.completion_end}) sampled"),
    ]
    if not traj.has_logprobs:  # null in the trajectory and its exports, never 0.0
        which = "none for this call" if not turn.has_logprobs else "this call has them"
        lines.append(_field("logprobs", f"{which}; {traj.turns_without_logprobs} of {len(traj.turns)} "
                                        "turns without"))
    if traj.lineage is not None:
        lines.append(_field("fork of", f"{traj.lineage.parent_id} at token {traj.lineage.fork_position}"))
    if traj.prefix_break is not None:
        b = traj.prefix_break
        lines.append(_field("broken", f"prefix at token {b.position} against row {b.earlier_row_id} "
                                      f"(expected {b.expected_id}, got {b.actual_id}; {b.evidence})"))
    if traj.partial:
        lines.append(_field("partial", f"went on in failed calls {traj.failed_row_ids}"))
    return lines


def _answer(row: dict[str, Any]) -> list[str]:
    result = row.get("result")
    if not isinstance(result, dict):
        return [_section("answer"), "none: the call produced no result"]
    usage = result.get("usage") or {}
    lines = [
        _section("answer"),
        _field("finish", result.get("finish_reason")),
        _field("prompt", f"{usage.get('prompt_tokens', 0)} tokens, {result.get('prompt_mode')}"),
        _field("sampled", f"{usage.get('completion_tokens', 0)} tokens by {result.get('model')}"),
        _field("versions", f"policy {_dash(row.get('policy_version'))}, weights {_dash(row.get('weight_version'))}"),
    ]
    reasoning = (result.get("reasoning") or {}).get("text")
    if reasoning:
        lines += ["reasoning", *_indent(reasoning)]
    if result.get("content"):
        lines += ["content", *_indent(result["content"])]
    for call in result.get("tool_calls") or []:
        lines += [f"tool call   {call['name']}  ({call['id']})", *_indent(call.get("arguments", ""))]
    for text in result.get("malformed") or []:
        lines += ["malformed tool call (left in the content)", *_indent(text)]
    return lines


def _indent(text: str) -> list[str]:
    return [" " * 12 + line for line in text.splitlines()] or [" " * 12]


def _tokens(row: dict[str, Any], tokenizer: Any, low_prob: float) -> list[str]:
    ids: list[int] = row.get("completion_ids") or []
    if not ids:
        return [_section("sampled tokens"), "none"]
    logprobs = row.get("completion_logprobs")
    if logprobs is None or len(logprobs) != len(ids):
        logprobs = None  # the upstream gave none (or not one a token): the ids alone, never invented values
    pieces = _pieces(tokenizer, ids)
    cut = math.log(low_prob)
    lines = [_section("sampled tokens")]
    if logprobs is not None:
        low = sum(lp < cut for lp in logprobs)
        lines += [_field("count", f"{len(ids)}, mean logprob {sum(logprobs) / len(logprobs):.3f}"),
                  _field("low", f"{low} below p {low_prob:g} (logprob < {cut:.2f}), marked {LOW_MARK}")]
    else:
        lines.append(_field("count", f"{len(ids)}, no logprobs (the upstream returned none)"))
    lines.append(_field("text", "decoded with the served model's tokenizer" if tokenizer is not None
                        else "ids only (no tokenizer: chat-template mode)"))
    head = _table_head(pieces, logprobs is not None)
    if logprobs is not None:
        lowest = sorted(range(len(ids)), key=lambda i: logprobs[i])[:LOWEST_SHOWN]
        lines += [" ", f"lowest probability first ({len(lowest)} of {len(ids)})",
                  head, *(_table_row(i, ids, pieces, logprobs, cut) for i in lowest)]
    lines += [" ", "in order", head, *(_table_row(i, ids, pieces, logprobs, cut) for i in range(len(ids)))]
    return lines


def _pieces(tokenizer: Any, ids: Sequence[int]) -> list[str] | None:
    if tokenizer is None:
        return None
    texts = tokenizer.batch_decode([[i] for i in ids], skip_special_tokens=False)
    return [_clip(json.dumps(t, ensure_ascii=False)) for t in texts]


def _clip(text: str) -> str:
    return text if len(text) <= TOKEN_WIDTH else text[: TOKEN_WIDTH - 1] + "…"


def _table_head(pieces: list[str] | None, logprobs: bool) -> str:
    token = f"  {'token':<{TOKEN_WIDTH}}" if pieces is not None else ""
    values = f"  {'logprob':>7}  {'p':>5}" if logprobs else ""
    return f"{'':<{len(LOW_MARK)}} {'pos':>5}  {'id':>7}{token}{values}".rstrip()


def _table_row(i: int, ids: Sequence[int], pieces: list[str] | None, logprobs: Sequence[float] | None,
               cut: float) -> str:
    lp = logprobs[i] if logprobs is not None else None
    # The mark goes in the left margin, where the eye scans down a long table.
    mark = LOW_MARK if lp is not None and lp < cut else ""
    token = f"  {pieces[i]:<{TOKEN_WIDTH}}" if pieces is not None else ""
    values = "" if lp is None else f"  {lp:>7.3f}  {math.exp(lp):>5.3f}"
    return f"{mark:<{len(LOW_MARK)}} {i:>5}  {ids[i]:>7}{token}{values}".rstrip()


def _request(row: dict[str, Any]) -> list[str]:
    canonical = row.get("canonical")
    if not isinstance(canonical, dict):
        return [_section("canonical request"), "none: the request could not be parsed"]
    try:  # through the model, to leave out fields at their defaults (empty lists, false flags)
        shown = ChatRequest.model_validate(canonical).model_dump(mode="json", exclude_defaults=True)
    except ValidationError:  # a row written by another polar version: show it as stored
        shown = canonical
    return [_section("canonical request"), json.dumps(shown, indent=2, ensure_ascii=False)]


# -- the mitmproxy contentview --------------------------------------------------------------------


def _call_ref(metadata: contentviews.Metadata) -> dict[str, Any] | None:
    """The capture reference the addon put on the flow, for a model call (not a side call)."""
    flow = metadata.flow
    meta = flow.metadata.get("polar") if flow is not None else None
    return meta if isinstance(meta, dict) and "row" in meta else None


def tokenizer_of(backend: Any) -> Any:
    """The served model's tokenizer: token-faithful backends carry one in their chat template."""
    template = getattr(backend, "template", None)
    return getattr(template, "tokenizer", None)


class PolarContentview(contentviews.Contentview):
    """Registered by `ContentviewAddon`; `gateway` returns its current gateway (it changes on reconfiguration)."""

    name = "polar"
    syntax_highlight = "none"

    def __init__(self, gateway: Callable[[], Any], low_prob: float = LOW_PROB):
        if not 0 < low_prob < 1:
            raise ValueError(f"low_prob is a probability threshold between 0 and 1 (exclusive), not {low_prob}")
        self._gateway = gateway
        self.low_prob = low_prob
        self._sessions = SessionCache()

    def render_priority(self, data: bytes, metadata: contentviews.Metadata) -> float:
        # Picked by hand, never by "auto": the body as it went over the wire stays the default view.
        return 0 if _call_ref(metadata) else -1

    def prettify(self, data: bytes, metadata: contentviews.Metadata) -> str:
        ref = _call_ref(metadata)
        if ref is None:
            raise ValueError("not a model call answered by polar: the flow carries no capture row")
        gateway = self._gateway()
        if gateway is None:
            raise ValueError("the polar gateway is not configured in this mitmproxy")
        call = load_call(gateway.reader, ref["row"], ref.get("call_id"), self._sessions)
        return render(call, tokenizer_of(gateway.backend), self.low_prob)


class ContentviewAddon:
    """Registers the "polar" view of each call in mitmweb, reading the gateway addon's current gateway."""

    def __init__(self, gateway: Any) -> None:
        self.gateway = gateway

    def load(self, loader: Any) -> None:
        contentviews.add(PolarContentview(lambda: self.gateway.gateway))
