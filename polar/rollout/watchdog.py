"""The long tail cut: a session whose model calls loop, stall or outgrow their budget is ended early.

While a harness runs, the session's watcher reads its newly captured calls (the capture store is the
truth of what the model was asked and answered) every `poll_seconds` and checks, in call order:

- looping: the same tool call(s) — names and arguments — in `repeated_tool_calls` answers in a row; or
  the same text `repeated_text` times: an answer (or its reasoning) whose tail is one span (at least
  `min_span_chars`) repeated, or that many answers in a row with the same non-empty text (degenerate repetition);
- budget: the tokens the session's calls sampled reach `token_budget`;
- stalled: no model call started or ended for `stall_seconds` (a call in flight counts as activity).

A cut ends the harness's process group (the harness is launched under a shell that records its pid),
not the sandbox, so the session's diff and its evaluation still follow; the result carries the cut's
outcome, `partial` and `cut`.
"""

from __future__ import annotations

import json
import sqlite3
import time
from contextlib import closing
from dataclasses import dataclass
from typing import Any

from polar.capture.bodies import unpack_json
from polar.capture.reader import CaptureReader, RowCache
from polar.rollout.tasks import WatchdogOptions


@dataclass(frozen=True)
class Cut:
    reason: str  # looping | stalled | budget (the session's outcome)
    detail: str
    at: float  # seconds after the watch began

    def as_dict(self) -> dict[str, Any]:
        return {"reason": self.reason, "detail": self.detail, "at": round(self.at, 3)}


def periodic_tail(text: str, repeats: int, min_span: int) -> str | None:
    """The span the end of `text` repeats `repeats` times in a row (the shortest such span of at least
    `min_span` characters), or None.

    The end of `text` repeats a span of length p `repeats` times exactly when the reversed text's
    prefix of length p * repeats has period p, i.e. its Z-value at p reaches (repeats - 1) * p: one
    linear pass instead of comparing every candidate span (answers of minutes of reasoning are long)."""
    n = len(text)
    if repeats < 1 or min_span * repeats > n:
        return None
    z = _z_values(text[::-1])
    for span in range(max(min_span, 1), n // repeats + 1):
        if z[span] >= (repeats - 1) * span:
            return text[-span:]
    return None


def _z_values(s: str) -> list[int]:
    """z[i]: the length of the longest common prefix of `s` and `s[i:]` (z[0] = len(s))."""
    n = len(s)
    z = [0] * (n + 1)
    z[0] = n
    left = right = 0
    for i in range(1, n):
        k = min(right - i, z[i - left]) if i < right else 0
        while i + k < n and s[k] == s[i + k]:
            k += 1
        z[i] = k
        if i + k > right:
            left, right = i, i + k
    return z


class Watcher:
    """One session's watch over its capture rows (not thread-safe: one caller polls it)."""

    def __init__(self, options: WatchdogOptions, capture_db: str, session: str, clock=time.time):
        self.options = options
        self.reader = CaptureReader(capture_db)
        self.session = session
        self.clock = clock
        self.started = clock()
        self.last_activity = self.started
        self._done_upto = 0  # capture rows up to this id are final and counted
        self._tool_sig: str | None = None
        self._tool_run = 0
        self._text: str | None = None
        self._text_run = 0
        self.sampled = 0

    def check(self) -> Cut | None:
        """Read the session's new calls; the cut they call for, if any."""
        with closing(self.reader.connect()) as conn:
            rows = conn.execute("SELECT id, status, result, completion_len, t_start, t_end FROM calls "
                                "WHERE session_id=? AND id>? ORDER BY id", (self.session, self._done_upto)).fetchall()
            cache = RowCache()
            for row in rows:
                if row["status"] == "pending":  # in flight: the model is working; read it again when it ends
                    self.last_activity = self.clock()
                    break
                self._done_upto = row["id"]
                self.last_activity = max(self.last_activity, row["t_end"] or row["t_start"] or 0.0)
                cut = self._row(conn, row, cache)
                if cut:
                    return cut
        o = self.options
        idle = self.clock() - self.last_activity
        if o.stall_seconds is not None and idle >= o.stall_seconds:
            return self._cut("stalled", f"no model call for {idle:.1f} s (limit {o.stall_seconds:g} s)")
        return None

    def _row(self, conn: sqlite3.Connection, row: sqlite3.Row, cache: RowCache) -> Cut | None:
        o = self.options
        self.sampled += row["completion_len"] or 0
        if o.token_budget is not None and self.sampled >= o.token_budget:
            return self._cut("budget", f"{self.sampled} tokens sampled (budget {o.token_budget})")
        result = json.loads(unpack_json(row["result"], cache.dictionaries(conn))) if row["result"] else {}
        calls = [(c.get("name"), _canonical_args(c.get("arguments", ""))) for c in result.get("tool_calls") or []]
        sig = json.dumps(calls) if calls else None
        self._tool_run = self._tool_run + 1 if sig is not None and sig == self._tool_sig else (1 if sig else 0)
        self._tool_sig = sig
        if o.repeated_tool_calls is not None and self._tool_run >= o.repeated_tool_calls:
            shown = ", ".join(f"{name}({args[:120]})" for name, args in calls)
            return self._cut("looping", f"the same tool call {self._tool_run} times in a row: {shown}")
        if o.repeated_text is None:
            return None
        text = (result.get("content") or "").strip()
        self._text_run = self._text_run + 1 if text and text == self._text else (1 if text else 0)
        self._text = text
        if len(text) >= o.min_span_chars and self._text_run >= o.repeated_text:
            return self._cut("looping", f"the same answer {self._text_run} times in a row: {text[:120]!r}")
        reasoning = result.get("reasoning") or {}
        thinking = "" if reasoning.get("redacted") else (reasoning.get("text") or "")
        for where, body in (("answer", text), ("reasoning", thinking.strip())):
            unit = periodic_tail(body, o.repeated_text, o.min_span_chars)
            if unit is not None:
                return self._cut("looping", f"the {where} repeats one span {o.repeated_text}+ times: {unit[:120]!r}")
        return None

    def _cut(self, reason: str, detail: str) -> Cut:
        return Cut(reason, detail, self.clock() - self.started)


def _canonical_args(arguments: str) -> str:
    """Arguments compared as JSON values (spacing and key order aside), else as written."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return arguments
