"""gpt-oss (harmony; vLLM's `openai` tool parser and `openai_gptoss` reasoning parser): a turn is a run of
messages, each a header, `<|message|>`, a body and an end token:

    <|channel|>analysis<|message|>REASONING<|end|>
    <|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{json}<|call|>
    <|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>{json}<|call|>   (the recipient first)
    <|start|>assistant<|channel|>final<|message|>ANSWER<|return|>

The generation prompt already wrote the first `<|start|>assistant`. As vLLM's harmony parser: analysis is the
reasoning, `final` (and `commentary` to no one, a preamble) the content, a message to `functions.NAME` a tool call;
parts are joined with "\\n". Where vLLM drops a message (another recipient, no channel) polar keeps its raw text in
the content and says so in `malformed`. `HarmonyReader` reads the turn in pieces, so the whole parse and the stream
(stream_parse) are one code path.
"""

from __future__ import annotations

import re

from polar.tokens.formats.markup import json_arguments
from polar.tokens.formats.reader import Emit, ReaderParser
from polar.tokens.turn_parser import Malformed, check_known, tool_schemas

START, MESSAGE = "<|start|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_HEADER = re.compile(r"\s*(?:<\|start\|>)?(?:assistant)?(?: to=(?P<r1>[^\s<]+))?<\|channel\|>(?P<channel>\w+)"
                     r"(?: to=(?P<r2>[^\s<]+))?(?: ?(?:<\|constrain\|>)?(?P<type>[\w.-]+))?\s*")  # fmt: skip
_SNIPPET = 120


class HarmonyReader:
    """One sampled harmony turn, fed in pieces split anywhere; `emit` gets what each piece settles."""

    def __init__(self, schemas: dict[str, dict], emit: Emit):
        self.schemas, self._emit = schemas, emit
        self.malformed: list[str] = []
        self._buf = ""  # the open header, or the held end of the open body
        self._header: re.Match | None = None  # None: reading a header
        self._raw = ""  # the open message's header, as written
        self._seen = 0  # how much of a held body is known to hold no end token
        self._started = {"reasoning": False, "content": False}  # a part was sent: the next starts with "\n"
        self._part_open = False

    def feed(self, text: str) -> None:
        self._buf += text
        while self._buf:
            if self._header is None:
                at = self._buf.find(MESSAGE)
                bad = [i for e in ENDS if (i := self._buf.find(e)) >= 0 and (at < 0 or i < at)]
                if bad:  # an end token before any <|message|>: not a message
                    cut = min(bad) + next(len(e) for e in ENDS if self._buf.startswith(e, min(bad)))
                    self._reject("a message with no <|message|>", self._buf[:cut])
                    self._buf = self._buf[cut:]
                    continue
                if at < 0:
                    return
                header, self._buf = self._buf[:at], self._buf[at + len(MESSAGE) :]
                self._raw, self._part_open = header + MESSAGE, False
                self._header = _HEADER.fullmatch(header)
                if self._header is None:
                    self._header = re.match("", "")  # read the body whole, then keep it raw
                    self._kind = "bad"
                else:
                    self._kind = self._classify()
                continue
            if not self._body():
                return

    def finish(self, truncated: bool) -> None:
        """The turn ended; an open message ends with it (its end token was the stop id, or the length limit)."""
        if self._header is None:
            if self._buf.strip():
                self._reject("an unfinished message header", self._buf)
            return
        if self._kind in ("reasoning", "content"):
            self._send(self._kind, self._buf)
        elif truncated and self._kind == "call":
            self._reject("unfinished tool call (the generation hit its length limit)", self._raw + self._buf)
        else:
            self._close(self._buf, self._raw + self._buf)

    def _classify(self) -> str:
        h = self._header
        recipient = h["r1"] or h["r2"]
        if recipient:
            return "call" if recipient.startswith("functions.") else "other"
        return {"analysis": "reasoning", "final": "content", "commentary": "content"}.get(h["channel"], "other")

    def _body(self) -> bool:
        """Read the open body; True when the message ended (the buffer holds what follows it)."""
        w = self._buf
        ends = [(i, e) for e in ENDS if (i := w.find(e, self._seen)) >= 0]
        if ends:
            i, end = min(ends)
            body, self._buf = w[:i], w[i + len(end) :]
            if self._kind in ("reasoning", "content"):
                self._send(self._kind, body)
            else:
                self._close(body, self._raw + w[: i + len(end)])
            self._header, self._seen = None, 0
            return True
        hold = w.rfind("<|")
        keep = hold if hold >= 0 and any(e.startswith(w[hold:]) for e in ENDS) else len(w)
        if self._kind in ("reasoning", "content"):  # send all but what may begin an end token
            self._send(self._kind, w[:keep])
            self._buf = w[keep:]
        else:  # held whole; the next piece is searched from the possible start of an end token
            self._seen = keep
        return False

    def _close(self, body: str, raw: str) -> None:
        """A whole call (or a message vLLM drops) is settled."""
        if self._kind == "call":
            h = self._header
            name = (h["r1"] or h["r2"]).removeprefix("functions.")
            try:
                if h["type"] and "json" not in h["type"]:
                    raise Malformed(f"the arguments are {h['type']}, not JSON")
                check_known(name, self.schemas)
                self._emit("call", (name, json_arguments(body)))
            except Malformed as exc:
                self._reject(str(exc), raw)
            return
        why = "a message with a header harmony does not have" if self._kind == "bad" else (
            "a message to no function (channel or recipient polar does not read)")
        self._reject(why, raw)

    def _send(self, kind: str, text: str) -> None:
        if not text:
            return
        if not self._part_open:
            self._part_open = True
            if self._started[kind]:
                text = "\n" + text
            self._started[kind] = True
        self._emit(kind, text)

    def _reject(self, reason: str, raw: str) -> None:
        snippet = raw if len(raw) <= _SNIPPET else raw[:_SNIPPET] + "…"
        self.malformed.append(f"{reason}: {snippet!r}")
        self._part_open = False
        self._send("content", raw)
        self._part_open = False
        self._header = None


class HarmonyParser(ReaderParser):
    name = "harmony"
    stop_texts = ("<|return|>", "<|call|>", "<|endoftext|>")

    def reader(self, tools: list, emit: Emit) -> HarmonyReader:
        return HarmonyReader(tool_schemas(tools), emit)
