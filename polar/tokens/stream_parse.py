"""A sampled assistant turn parsed as it streams, into deltas that add up to what `parse_turn` says.

`TurnStream` takes the decoded sample in pieces split anywhere. With T the text fed, T' = T cut at
its first stop string (`stop_cut`) and P = parse_turn(T', ...): the ReasoningDelta texts join to
P.reasoning or "" and all come first, the TextDelta texts join to P.content, and each call of P is
one complete ToolCallDelta, in order, sent when its `</tool_call>` closes a block that reads well.
Nothing is sent that a later piece could prove wrong; the rest is sent at once. Five stages each
hold back only what is still ambiguous for them:
  1. stop strings: a suffix that may begin one; after one, nothing more counts;
  2. the end-of-turn text (`<|im_end|>`…): a suffix that may be one (dropped only at the very end);
  3. reasoning: leading whitespace and a partial `<think>` (think_open=False); newlines at either end
     of the reasoning and a partial `</think>` (parse_turn strips "\\n" there);
  4. call blocks: a partial `<tool_call>`, and all of an open block until its `</tool_call>` (a call
     if it reads well, else raw text), a new `<tool_call>` or the end (raw text) decides it;
  5. content: trailing whitespace, which a following call would drop; after a call, leading
     whitespace is dropped and the parts are joined with "\\n\\n" (`_join_runs`).
Each stage sees only its new text and its small hold (an open block is kept in pieces, scanned at
the seams): the cost is linear in the sample. Known divergence: P puts all content before the
calls; a stream sends text written after a call after it (the text deltas still join to P.content).

`finish(finish_reason, full_text)`: the whole decoded sample, when given, is the truth. If the fed
text is a prefix of it, the rest is fed first; if not (the incremental decode disagreed), the stream
is completed on what was fed, `diverged` is set and `result` (the final ParsedTurn, with the
streamed call ids) is parse_turn of full_text: record `result`, not the stream.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from polar.canonical import Delta, ReasoningDelta, TextDelta, ToolCallDelta
from polar.tokens import parsers
from polar.tokens.formats.reader import call_id
from polar.tokens.parsers import PARSERS, THINK_END, THINK_START, Malformed, ParsedTurn, parse_turn


def _partial(text: str, needles: Sequence[str], whole: bool = False) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a needle (or all of it, `whole`)."""
    best = 0
    for needle in needles:
        i = text.find(needle[0], max(0, len(text) - len(needle) + (0 if whole else 1)))
        while 0 <= i < len(text) - best:
            if needle.startswith(text[i:]):
                best = len(text) - i
                break
            i = text.find(needle[0], i + 1)
    return best


def stop_cut(text: str, stop_strings: Sequence[str]) -> int:
    """Where the turn ends in `text`: at the stop string that is complete first (the longest of those
    ending at the same place), as a stream sees it and vLLM stops; len(text) when there is none."""
    best = (len(text) + 1, len(text))
    for stop in stop_strings:
        if stop and (i := text.find(stop)) >= 0:
            best = min(best, (i + len(stop), i))
    return best[1]


class TurnStream:
    """One sampled turn parsed incrementally; `feed` decoded pieces, then `finish` once."""

    def __init__(self, family: str, *, think_open: bool, tools: list[Any], stop_strings: Sequence[str] = ()):
        try:
            self._parser = PARSERS[family]
        except KeyError:
            raise ValueError(f"unknown model family {family!r}; known: {', '.join(PARSERS)}") from None
        self.family, self.think_open, self.tools = family, think_open, tools
        self.stop_strings = tuple(s for s in stop_strings if s)  # vLLM refuses empty ones; ignored here
        self._schemas = parsers.tool_schemas(tools)
        start, end = self._parser.call_start, self._parser.call_end
        # (with len(start) <= len(end) + 1, no start tag can hide before a found end tag)
        self._tags = (start, end) if start and end else None
        # A family whose calls are the whole answer (Llama's JSON): the answer is held while it may be calls.
        self._answer: list[str] | None = [] if getattr(self._parser, "whole_answer", False) else None
        # A family whose turn is a run of messages (gpt-oss's harmony) reads it with its own reader, after stage 2.
        self._reader = self._parser.reader(tools, self._read) if hasattr(self._parser, "reader") else None
        self._fed: list[str] = []
        self._out: list[Delta] = []
        self._sent: list[ToolCallDelta] = []  # the calls streamed so far
        self._stopped = False  # a stop string was seen: the rest of the sample is not the turn
        self._cut_hold = self._end_hold = ""  # stages 1 and 2
        self._mode = "think" if think_open else "lead"  # stage 3: lead | think | after | content
        self._lead: list[str] = []
        self._tag, self._nl, self._reasoning_started = "", 0, False  # held: "\n" * _nl + _tag
        self._hold = ""  # stage 4: a partial start tag outside blocks
        self._block: list[str] | None = None  # the inside of the open call block, in pieces
        self._blen, self._btail = 0, ""
        self._ws: list[str] = []  # stage 5: trailing whitespace of the current run
        self._run_started = self._any_text = False
        self.finished = self.diverged = False
        self.result: ParsedTurn | None = None  # set by finish

    def feed(self, text: str) -> list[Delta]:
        """Add a decoded piece of the sample; returns the deltas it settles (often none)."""
        if self.finished:
            raise RuntimeError("feed after finish")
        self._fed.append(text)
        self._cut(text)
        return self._take()

    def finish(self, finish_reason: str, full_text: str | None = None) -> list[Delta]:
        """The sample ended: flush every hold and compute `result` (`full_text`: see the module doc)."""
        if self.finished:
            raise RuntimeError("finish called twice")
        self.finished = True
        fed = "".join(self._fed)
        if full_text is not None and full_text.startswith(fed):
            self._cut(full_text[len(fed) :])
            fed = full_text
        self.diverged = full_text is not None and fed != full_text
        if not self._stopped:  # a partial stop string at the end is text
            self._end_text(self._cut_hold)
        self._split(self._parser._without_stop_text(self._end_hold))
        if self._reader is not None:
            self._reader.finish(finish_reason == "length")
        elif self._mode == "lead":  # whitespace and a partial <think>: the turn has no reasoning
            self._mode = "content"
            self._calls("".join(self._lead))
        elif self._mode == "think" and self._tag:  # never closed: reasoning to the end, newlines stripped
            self._emit(ReasoningDelta, "\n" * self._nl + self._tag)
        # an unclosed block stays raw text; the last run keeps its trailing whitespace
        self._content(self._hold if self._block is None else self._tags[0] + "".join(self._block))
        self._emit(TextDelta, "".join(self._ws))
        truth = full_text if self.diverged else fed
        self.result = parse_turn(truth[: stop_cut(truth, self.stop_strings)], self.family,
                                 think_open=self.think_open, finish_reason=finish_reason, tools=self.tools)
        if self._answer is not None:  # held to the end: the whole answer is calls, or it is the content
            held, self._answer = "".join(self._answer), None
            for call in self.result.tool_calls:
                self._sent.append(ToolCallDelta(len(self._sent), call.arguments, call.id, call.name))
                self._out.append(self._sent[-1])
            if not self.result.tool_calls:
                self._emit(TextDelta, held)
        for call, sent in zip(self.result.tool_calls, self._sent):
            if (call.name, call.arguments) == (sent.name, sent.arguments):  # always, unless diverged
                call.id = sent.id  # the ids the client saw
        return self._take()

    def _cut(self, text: str) -> None:
        """Stage 1: stop strings."""
        if self._stopped or not self.stop_strings:
            return None if self._stopped else self._end_text(text)
        w = self._cut_hold + text
        cut = stop_cut(w, self.stop_strings)
        if cut < len(w):
            self._stopped, self._cut_hold = True, ""
            return self._end_text(w[:cut])
        keep = len(w) - _partial(w, self.stop_strings)
        self._cut_hold = w[keep:]
        self._end_text(w[:keep])

    def _end_text(self, text: str) -> None:
        """Stage 2: an end-of-turn text, dropped by parse_turn only at the very end."""
        w = self._end_hold + text
        keep = len(w) - _partial(w, self._parser.stop_texts, whole=True)
        self._end_hold = w[keep:]
        self._split(w[:keep])

    def _split(self, text: str) -> None:
        """Stage 3: reasoning, as `_split_reasoning`."""
        if not text:
            return
        if self._reader is not None:
            return self._reader.feed(text)
        if self._mode == "lead":
            self._lead.append(text)
            if text.isspace() and self._lead[0].isspace():  # only whitespace yet: wait, cheaply
                return
            lead = "".join(self._lead)
            body = lead.lstrip()
            if len(body) < len(THINK_START) and THINK_START.startswith(body):
                self._lead = [lead]
                return
            self._lead, think = [], body.startswith(THINK_START)
            self._mode = "think" if think else "content"
            return self._think(body[len(THINK_START) :]) if think else self._calls(lead)
        if self._mode == "think":
            return self._think(text)
        if self._mode == "after" and (text := text.lstrip("\n")):  # newlines right after </think> go
            self._mode = "content"
        if self._mode == "content":
            self._calls(text)

    def _think(self, text: str) -> None:
        w = self._tag + text
        end = w.find(THINK_END)
        body = w if end < 0 else w[:end]
        keep = len(body) - (0 if end >= 0 else _partial(body, (THINK_END,)))
        body, self._tag = body[:keep], body[keep:]
        body = body if self._reasoning_started else body.lstrip("\n")
        core = body.rstrip("\n")  # trailing newlines wait: "</think>" or the end would strip them
        if core:
            self._emit(ReasoningDelta, "\n" * self._nl + core)
            self._nl, self._reasoning_started = len(body) - len(core), True
        else:
            self._nl += len(body)
        if end >= 0:
            self._mode, self._tag, self._nl = "after", "", 0
            self._split(w[end + len(THINK_END) :])

    def _calls(self, text: str) -> None:
        """Stage 4: tool-call blocks, as `_split_calls`."""
        if not self._tags:
            if self._answer is not None:
                self._answer.append(text)
                if self._parser.may_be_calls("".join(self._answer)):
                    return None
                text, self._answer = "".join(self._answer), None
            return self._emit(TextDelta, text)  # no call syntax: the rest is the content, verbatim
        start = self._tags[0]
        while text:
            if self._block is not None:
                text = self._in_block(text)
                continue
            w, self._hold = self._hold + text, ""
            at = w.find(start)
            if at < 0:
                keep = len(w) - _partial(w, (start,))
                self._hold = w[keep:]
                return self._content(w[:keep])
            self._content(w[:at])
            self._block, self._blen, self._btail = [], 0, ""
            text = w[at + len(start) :]

    def _in_block(self, text: str) -> str:
        """Add to the open block; returns the text after it once it is decided, "" while it stays open."""
        start, end = self._tags
        w = self._btail + text
        base = self._blen - len(self._btail)  # where w starts in the block
        self._block.append(text)
        self._blen += len(text)
        e, f = w.find(end), w.find(start)
        if e < 0 and f < 0:
            self._btail = w[-(max(len(start), len(end)) - 1) :]
            return ""
        body = "".join(self._block)
        if f >= 0 and (e < 0 or f < e):  # a new block opens first: this one was never closed, raw text
            cut = base + f
            self._content(start + body[:cut])
            self._block, self._blen, self._btail = [], 0, ""
            return body[cut + len(start) :]
        cut = base + e
        self._block = None
        try:
            calls = self._parser.read_calls(body[:cut], self._schemas)
        except Malformed:
            self._content(start + body[: cut + len(end)])
        else:
            self._ws, self._run_started = [], False  # whitespace touching a call is template glue
            for name, arguments in calls:
                self._sent.append(ToolCallDelta(len(self._sent), arguments, parsers.new_call_id(), name))
                self._out.append(self._sent[-1])
        return body[cut + len(end) :]

    def _read(self, kind: str, payload: Any) -> None:
        """What a family's own reader settles (stage 3 to 5 in one)."""
        if kind == "call":
            self._sent.append(ToolCallDelta(len(self._sent), payload[1], call_id(payload), payload[0]))
            self._out.append(self._sent[-1])
        else:
            self._emit(ReasoningDelta if kind == "reasoning" else TextDelta, payload)

    def _content(self, text: str) -> None:
        """Stage 5: content runs between calls, joined as `_join_runs`."""
        if not text:
            return
        if self._sent and not self._run_started:  # a run after a call: its leading whitespace goes
            text = text.lstrip()
            if not text:
                return
            self._run_started = True
            if self._any_text:
                text = "\n\n" + text
        core = text.rstrip()
        if core:
            self._emit(TextDelta, "".join(self._ws) + core)
            self._ws, self._any_text = [], True
        self._ws.append(text[len(core) :])

    def _emit(self, kind: type[ReasoningDelta] | type[TextDelta], text: str) -> None:
        if text and self._out and type(self._out[-1]) is kind:
            self._out[-1].text += text
        elif text:
            self._out.append(kind(text))

    def _take(self) -> list[Delta]:
        out, self._out = self._out, []
        return out


class IncrementalDecoder:
    """Sampled ids → text pieces that concatenate to `tokenizer.decode(ids, skip_special_tokens=False)`.

    tokenizers' `DecodeStream` decodes a window of the last few ids per step and holds back text that
    ends in U+FFFD (a split or invalid UTF-8 sequence, or U+FFFD itself) until a later id settles it.
    At the end of a sample nothing does: `finish` returns that remainder, from one full decode.
    """

    def __init__(self, tokenizer: Any):
        from tokenizers.decoders import DecodeStream

        self._tok = getattr(tokenizer, "_tokenizer", tokenizer)  # a transformers fast tokenizer, or tokenizers'
        self._stream: Any = DecodeStream(skip_special_tokens=False)  # None once it failed
        self._ids: list[int] = []
        self._chars, self._held = 0, False  # characters given so far; whether the last id gave none

    def step(self, ids: int | Iterable[int]) -> str:
        """Decode one id (or several); returns the text they settle, maybe ""."""
        out = []
        for i in [ids] if isinstance(ids, int) else ids:
            self._ids.append(i)
            try:
                piece = self._stream.step(self._tok, i) if self._stream else None
            except Exception:  # DecodeStream's "invalid prefix", never seen with byte-level vocabularies:
                self._stream = piece = None  # the rest of the sample comes whole from finish()
            self._held = piece is None
            if piece:
                out.append(piece)
                self._chars += len(piece)
        return "".join(out)

    def finish(self) -> str:
        """What the stream still holds at the end of the sample ("" mostly)."""
        rest = self._tok.decode(self._ids, skip_special_tokens=False)[self._chars :] if self._held else ""
        self._held, self._chars = False, self._chars + len(rest)
        return rest
