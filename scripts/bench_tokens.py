#!/usr/bin/env python3
"""Benchmark: token-faithful prompts, linear token storage and trajectory building, by session size.

Each size gets one synthetic coding-agent session (system prompt + tools, a user task, then
assistant turns of reasoning + tool calls answered by tool results, a user message now and then,
a final text answer), grown until it reaches the target size, over the real tokenizer and chat
template. Every call of the session then goes through what the gateway does with it:

  prompt  — the next prompt built both ways, per turn: token-faithful (buffer lookup, template
            continuation of only the new messages appended to the kept ids, buffer update) against
            full re-render (the whole conversation through the chat template and the tokenizer);
            each turn is timed --repeat times and its best time kept (the machine is shared);
  storage — the calls written into a real capture database (CaptureWriter) (sampled ids = the encoded assistant turn +
            its end-of-turn token), token columns and DB file against storing every prompt in full;
  build   — trajectories from the stored rows with `per_request` and `prefix_merge`.

    python scripts/bench_tokens.py [--sizes 1k 4k 16k 64k 128k] [--turns N] [--repeat 3]
                                   [--tokenizer DIR] [--chat-template FILE] [--no-thinking] [--markdown]
"""

from __future__ import annotations

import gc
import json
import math
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import args as cli  # noqa: E402
from benchkit.args import size_label  # noqa: E402
from benchkit.report import Run, table  # noqa: E402
from benchkit.store import GatewayCall, Stored, store_session  # noqa: E402  (puts the repository on sys.path too)

from polar.canonical import ChatRequest, ChatResult, Message, Reasoning, TextPart, ToolCall, Usage  # noqa: E402
from polar.providers.openai_chat import ChatContext, OpenAIChat  # noqa: E402
from polar.providers.reasoning_seal import Sealer  # noqa: E402
from polar.sessions.fingerprints import message_fingerprint, request_context_key  # noqa: E402
from polar.sessions.state import SessionState, Turn  # noqa: E402
from polar.tokens import ChatTemplate  # noqa: E402
from polar.tokens.messages import to_openai_messages  # noqa: E402
from polar.trajectories import per_request, prefix_merge  # noqa: E402

os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")  # read when transformers loads: no max-length warnings
MODEL = "polar-tiny"


# -- synthetic agent sessions --------------------------------------------------------------------

TOOLS = [
    ("read_file", "Read a text file from the workspace, with line numbers.",
     {"path": {"type": "string"}, "offset": {"type": "integer"}, "limit": {"type": "integer"}}, ["path"]),
    ("bash", "Run a shell command in the workspace and return its output.",
     {"command": {"type": "string"}, "timeout": {"type": "integer", "description": "seconds"}}, ["command"]),
    ("grep", "Search files for a regular expression; prints path:line:text.",
     {"pattern": {"type": "string"}, "path": {"type": "string"}, "glob": {"type": "string"}}, ["pattern"]),
    ("list_dir", "List the entries of a directory.", {"path": {"type": "string"}}, ["path"]),
    ("edit_file", "Replace an exact snippet of a file with new text.",
     {"path": {"type": "string"}, "old": {"type": "string"}, "new": {"type": "string"}}, ["path", "old", "new"]),
    ("write_file", "Create or overwrite a file.", {"path": {"type": "string"}, "content": {"type": "string"}},
     ["path", "content"]),
]
VERBS = ["load", "parse", "build", "render", "merge", "split", "flush", "resolve", "encode", "decode", "fetch",
         "store", "check", "apply", "index"]
NOUNS = ["config", "session", "token", "prompt", "buffer", "trajectory", "capture", "request", "result", "schema",
         "template", "turn", "cache", "row"]
TYPES = ["int", "str", "bytes", "list[int]", "dict[str, Any]", "Path", "None"]
RULES = [
    "Read the relevant code before you change it, and keep each edit as small as the fix allows.",
    "Run the narrowest test that covers your change first, then the surrounding suite.",
    "Never invent file contents: if you have not read a file, read it.",
    "Prefer the project's existing helpers to new ones, and match the surrounding style.",
    "When a command fails, read the whole error before trying something else.",
    "Report what you changed and how you checked it, in a few sentences, when you are done.",
    "Do not touch files outside the task's scope; ask when the scope is unclear.",
    "Keep secrets out of logs, commits and tool output.",
]
THOUGHTS = [
    "The failing assertion points at {path}; I should read it before guessing.",
    "The {n} is built twice, once in {v}_{n2} and again in the caller, which explains the mismatch.",
    "A grep for {v}_{n} will show every caller, so the change stays consistent.",
    "The test expects {n2} to survive a round trip, but {v}_{n} drops it when the list is empty.",
    "Running the unit tests for {n} now should confirm the edit before the slower suite.",
    "That output settles it: the bug is in the {n2} branch, not in the {n} parser.",
    "Les tests échouent encore pour «{n}», je relis la fonction {v}_{n2}.",
    "{n} の扱いが原因なので、{path} を確認します。",
]
USER_NOTES = [
    "Thanks. While you are at it, keep the public API of {path} unchanged.",
    "Also make sure the {n} tests still pass on Python 3.12 — naïve timestamps broke them last week.",
    "Quick note: the CI log mentions {v}_{n}; please check it too before you finish.",
]


def fill(rng: random.Random, text: str) -> str:
    n, n2, v = rng.choice(NOUNS), rng.choice(NOUNS), rng.choice(VERBS)
    return text.format(n=n, n2=n2, v=v, path=f"src/{n}/{v}_{n2}.py")


def code_line(rng: random.Random) -> str:
    n, n2, v, t = rng.choice(NOUNS), rng.choice(NOUNS), rng.choice(VERBS), rng.choice(TYPES)
    return rng.choice([
        f"def {v}_{n}(self, {n2}: {t}) -> {rng.choice(TYPES)}:",
        f"    {n} = self.{v}_{n2}({n}, strict=True)",
        f"    if {n} is None or not {n2}:",
        f"        raise ValueError(f\"{n} {{{n2}!r}} is not valid\")",
        f"    return {n}",
        f"    # {fill(rng, rng.choice(THOUGHTS))}",
        f"class {n.title()}{v.title()}:",
        f"from polar.{n} import {n2.title()}, {v}_{n}",
        f"        self._{n}[{n2}] = {v}_{n2}(self._{n}.get({n2}, []))",
        "",
    ])


def tool_output(rng: random.Random, name: str, chars: int) -> str:
    """A tool result of about `chars` characters, shaped like that tool's real output."""
    lines: list[str] = []
    size = 0
    while size < chars:
        if name == "read_file":
            line = f"{len(lines) + 1:>6}\t{code_line(rng)}"
        elif name == "grep":
            line = f"src/{rng.choice(NOUNS)}/{rng.choice(VERBS)}.py:{rng.randint(1, 900)}:{code_line(rng).strip()}"
        elif name == "list_dir":
            line = f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}.py  {rng.randint(100, 90000)} bytes"
        else:  # bash, edits: test-runner style output
            status = rng.choice(["PASSED", "PASSED", "PASSED", "FAILED", "SKIPPED"])
            line = f"tests/test_{rng.choice(NOUNS)}.py::test_{rng.choice(VERBS)}_{rng.choice(NOUNS)} {status}"
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines)[:chars]


def tool_arguments(rng: random.Random, name: str) -> dict[str, Any]:
    path = fill(rng, "{path}")
    return {
        "read_file": {"path": path, "offset": rng.randint(1, 400)},
        "bash": {"command": f"python -m pytest tests/test_{rng.choice(NOUNS)}.py -q", "timeout": 120},
        "grep": {"pattern": f"{rng.choice(VERBS)}_{rng.choice(NOUNS)}\\(", "path": "src"},
        "list_dir": {"path": path.rsplit("/", 1)[0]},
        "edit_file": {"path": path, "old": code_line(rng).strip(), "new": code_line(rng).strip()},
        "write_file": {"path": path, "content": "\n".join(code_line(rng) for _ in range(4))},
    }[name]


def sentences(rng: random.Random, pool: list[str], chars: int) -> str:
    out: list[str] = []
    while sum(map(len, out)) < chars:
        out.append(fill(rng, rng.choice(pool)))
    return " ".join(out)


def auto_turns(size: int) -> int:
    """Calls per session: a handful for small tasks, up to 60 for a long one."""
    return max(6, min(60, round(6 * math.sqrt(size / 1024))))


@dataclass
class Call:
    """One model call of a session: what the client sent, and what the model answered."""

    body: dict[str, Any]  # the OpenAI Chat request body
    answer: Message
    sampled: list[int]  # the encoded assistant turn, end-of-turn token included


class SessionSynth:
    """Grows one session to a target size, turn by turn, with a seeded random generator."""

    def __init__(self, template: ChatTemplate, thinking: bool, seed: int):
        self.template = template
        self.thinking = thinking
        self.seed = seed
        sample = "\n".join(code_line(random.Random(seed)) for _ in range(400))
        self.chars_per_token = len(sample) / len(template.encode(sample))

    def session(self, size: int, turns: int) -> list[Call]:
        rng = random.Random(f"{self.seed}-{size}")
        tools = TOOLS if size >= 4096 else TOOLS[:2]  # a short task runs with a small tool set
        system = sentences(rng, RULES, self.chars(max(60, min(2500, size // 25))))
        history: list[dict[str, Any]] = [
            {"role": "system", "content": f"You are a coding agent working in a Python repository. {system}"},
            {"role": "user",
             "content": fill(rng, "The {n} tests fail after the {v} refactor; find out why and fix it.")},
        ]
        catalogue = [{"type": "function", "function": {"name": n, "description": d, "parameters": {
            "type": "object", "properties": p, "required": r}}} for n, d, p, r in tools]
        used = len(self.template.prompt_ids(history, catalogue, self.thinking))
        calls: list[Call] = []
        for turn in range(turns):
            budget = max(60, (size - used) // (turns - turn))
            last = turn == turns - 1
            answer = self.answer(rng, turn, budget, [n for n, *_ in tools], last)
            sampled = self.template.encode(self.sampled_text(answer))
            body = {"model": MODEL, "messages": list(history), "tools": catalogue,
                    "chat_template_kwargs": {"enable_thinking": self.thinking}}
            calls.append(Call(body, answer, sampled))
            history += to_openai_messages(answer)  # the client echoes the answer back
            used += len(sampled)
            if last:
                break
            new = self.results(rng, answer, budget - len(sampled))
            if turn % 8 == 7:
                new.append({"role": "user", "content": fill(rng, rng.choice(USER_NOTES))})
            history += new
            used += sum(len(self.template.encode(m["content"])) + 8 for m in new)  # + template glue
        return calls

    def chars(self, tokens: int) -> int:
        return max(1, int(tokens * self.chars_per_token))

    def answer(self, rng: random.Random, turn: int, budget: int, tools: list[str], last: bool) -> Message:
        thought = sentences(rng, THOUGHTS, self.chars(min(300, max(15, budget // 10))))
        reasoning = [Reasoning(text=thought)] if self.thinking else []
        if last:
            summary = sentences(rng, THOUGHTS, self.chars(min(200, max(20, budget // 8))))
            return Message(role="assistant", content=[TextPart(text=f"Done. {summary}")], reasoning=reasoning)
        parallel = turn % 5 == 3 and budget > 200
        calls = []
        for _ in range(2 if parallel else 1):
            name = rng.choice(tools)
            args = tool_arguments(rng, name)
            compact = rng.random() < 0.5  # models write both compact and spaced JSON
            text = json.dumps(args, ensure_ascii=False, separators=(",", ":") if compact else None)
            calls.append(ToolCall(id=f"call_{rng.getrandbits(64):016x}", name=name, arguments=text))
        content = [TextPart(text="Checking both at once.")] if parallel else []
        return Message(role="assistant", content=content, reasoning=reasoning, tool_calls=calls)

    def results(self, rng: random.Random, answer: Message, budget: int) -> list[dict[str, Any]]:
        share = max(10, budget // len(answer.tool_calls) - 10)
        return [{"role": "tool", "tool_call_id": c.id, "content": tool_output(rng, c.name, self.chars(share))}
                for c in answer.tool_calls]

    def sampled_text(self, answer: Message) -> str:
        """The assistant turn as the model writes it after the generation prompt, end-of-turn marker included.

        Rendered after a lone user line, which is how the template shows the latest assistant turn.
        """
        user = [{"role": "user", "content": "go"}]
        prompt = self.template.render(user, None, True, self.thinking)
        full = self.template.render(user + to_openai_messages(answer), None, False, self.thinking)
        end = self.template.end_of_turn
        if end is None or not full.startswith(prompt):
            raise SystemExit("this chat template does not render an assistant turn after its generation prompt")
        turn = full[len(prompt):]
        return turn[: turn.rindex(end) + len(end)]


# -- prompt building: token-faithful vs full re-render ----------------------------------------------


@dataclass
class Built:
    """One call after the gateway built its prompt, with the best time of each step (seconds)."""

    request: ChatRequest
    prompt: list[int]
    mode: str  # "token-faithful" or "re-render: <why>"
    rerender_s: float
    lookup_s: float = 0.0  # token-faithful steps: find the turn this request extends,
    template_s: float = 0.0  # render + encode only the new messages,
    copy_s: float = 0.0  # append them to the kept ids,
    record_s: float = 0.0  # keep prompt + sample for the next turn
    identical: bool | None = None  # token-faithful and re-render gave the same ids (None: first call)
    new_tokens: int = 0  # ids the continuation appended

    @property
    def buffers_s(self) -> float:
        return self.lookup_s + self.record_s

    @property
    def faithful_s(self) -> float:
        """What the token-faithful gateway spends on this prompt (a fallback re-renders as well)."""
        steps = self.lookup_s + self.template_s + self.copy_s + self.record_s
        return steps if self.mode == "token-faithful" else steps + self.rerender_s


def best_of(repeat: int, fn: Callable[[], Any]) -> tuple[float, Any]:
    """The fastest of `repeat` runs (gc paused, as timeit does), and the last run's value."""
    best, value = math.inf, None
    gc.disable()
    try:
        for _ in range(repeat):
            t = time.perf_counter()
            value = fn()
            best = min(best, time.perf_counter() - t)
    finally:
        gc.enable()
    return best, value


def tools_of(request: ChatRequest) -> list[dict[str, Any]] | None:
    return [{"type": "function", "function": {"name": t.name, "description": t.description or "",
                                              "parameters": t.parameters}} for t in request.tools] or None


def build_prompts(template: ChatTemplate, calls: list[Call], repeat: int) -> list[Built]:
    """Every call's prompt, built as the token-faithful gateway builds it, each step timed, against a re-render."""
    provider = OpenAIChat(Sealer(os.urandom(32)))  # Chat mints no seals; any key will do
    route = provider.match("POST", "/v1/chat/completions", {}, {})
    buffers = SessionState()
    return [build_one(template, buffers, provider.parse(route, json.loads(json.dumps(call.body))).request, call, row, repeat)
            for row, call in enumerate(calls, 1)]


def build_one(template: ChatTemplate, buffers: SessionState, request: ChatRequest, call: Call, row: int,
              repeat: int, session: str = "bench") -> Built:
    """One call: the re-render, then each token-faithful step (as in the gateway), then keep the turn."""
    tools, thinking = tools_of(request), request.thinking.enabled
    rr_s, rr_ids = best_of(repeat, lambda: template.prompt_ids(
        [m for msg in request.messages for m in to_openai_messages(msg)], tools, thinking))
    item = Built(request, rr_ids, "re-render: first call of the session", rr_s)
    item.lookup_s, (ext, why) = best_of(
        repeat, lambda: buffers.extension(request, [message_fingerprint(m) for m in request.messages]))
    if ext is None and row > 1:
        item.mode = f"re-render: {why}"
    elif ext is not None:
        item.template_s, cont = best_of(repeat, lambda: template.continuation(
            [m for msg in ext.new_messages for m in to_openai_messages(msg)], tools, thinking,
            previous_ended_with_eos=ext.turn.ids.last() == template.end_of_turn_id))
        if cont.failure:
            item.mode = f"re-render: {cont.failure}"
        else:
            item.copy_s, ids = best_of(repeat, lambda: ext.turn.ids.array().tolist() + cont.ids)
            item.prompt, item.mode, item.identical = ids, "token-faithful", ids == rr_ids
            item.new_tokens = len(cont.ids)
    turn_s, turn = best_of(repeat, lambda: Turn(
        row=row,
        ids=buffers.branch_point(item.prompt).hold(item.prompt, call.sampled),
        prompt_len=len(item.prompt),
        context_key=request_context_key(request),
        message_keys=[message_fingerprint(m) for m in request.messages],
        answer_key=message_fingerprint(call.answer),
    ))
    keep_s, _ = best_of(1, lambda: buffers.add(turn, keep=16))
    item.record_s = turn_s + keep_s  # the list update is not repeatable: it runs once
    return item


def gateway_calls(calls: list[Call], built: list[Built], seed: int) -> list[GatewayCall]:
    """The session's calls as the gateway records them: raw body, canonical request, result, response body."""
    provider = OpenAIChat(Sealer(os.urandom(32)))  # Chat mints no seals; any key will do
    route = provider.match("POST", "/v1/chat/completions", {}, {})
    rng = random.Random(seed)
    out = []
    for call, item in zip(calls, built, strict=True):
        result = ChatResult(
            id=f"{rng.getrandbits(96):024x}", model=MODEL, created=int(time.time()), content=call.answer.text(),
            reasoning=(call.answer.reasoning or [None])[0], tool_calls=call.answer.tool_calls,
            finish_reason="tool_calls" if call.answer.tool_calls else "stop",
            usage=Usage(prompt_tokens=len(item.prompt), completion_tokens=len(call.sampled)),
        )
        out.append(GatewayCall(
            begin={"provider": provider.name, "endpoint": "generate", "path": "/v1/chat/completions",
                   "request_headers": {"content-type": "application/json"},
                   "request_body": json.dumps(call.body, ensure_ascii=False).encode()},
            finish={"status": "ok", "http_status": 200, "model": MODEL, "upstream_model": MODEL, "stream": False,
                    "canonical": item.request.model_dump(mode="json", exclude_none=True),  # as the gateway stores it
                    "result": result.model_dump_json(exclude={"prompt_token_ids", "completion_token_ids",
                                                              "completion_logprobs"}),
                    "response_body": provider.render(route, ChatContext(), item.request, result).body,
                    "finish_reason": result.finish_reason, "prompt_mode": item.mode},
            prompt=item.prompt, sampled=call.sampled, logprobs=[-rng.random() for _ in call.sampled],
        ))
    return out


# -- one size, end to end: prompts, storage (benchkit/store.py), trajectories --------------------


@dataclass
class Measured:
    size: int
    calls: int
    tokens: int  # the session's final prompt + sample
    built: list[Built]
    stored: Stored
    builds: dict[str, dict[str, float]] = field(default_factory=dict)  # builder → numbers


def measure(synth: SessionSynth, size: int, turns: int, repeat: int, workdir: Path) -> Measured:
    calls = synth.session(size, turns)
    built = build_prompts(synth.template, calls, repeat)
    stored = store_session(workdir / f"captures-{size}.db", gateway_calls(calls, built, synth.seed), synth.seed)
    out = Measured(size, len(calls), len(built[-1].prompt) + len(calls[-1].sampled), built, stored)
    for name, builder in (("per-request", per_request), ("prefix-merge", prefix_merge)):
        seconds, trajectories = best_of(1, partial(builder, stored.rows))
        out.builds[name] = {
            "trajectories": len(trajectories),
            "tokens": sum(len(t.token_ids) for t in trajectories),
            "trainable": sum(t.trainable_tokens for t in trajectories),
            "broken": sum(t.broken_prefix for t in trajectories),
            "seconds": seconds,
        }
    return out


# -- report -----------------------------------------------------------------------------------------


def ms(values: Sequence[float]) -> tuple[str, str]:
    return f"{statistics.fmean(values) * 1000:.2f}", f"{statistics.median(values) * 1000:.2f}"


def prompt_table(results: list[Measured], repeat: int) -> Table:
    out = table("Prompt building per turn after the first: token-faithful vs full re-render "
                f"(ms, best of {repeat} per step)",
                ("size", "calls", "tokens", "new tok/turn", "re-render mean", "re-render p50", "faithful mean",
                 "faithful p50", "· template", "· buffers", "· id copy", "speedup", "faithful slower",
                 "prefix kept", "same ids"), left=())
    for r in results:
        timed = r.built[1:]
        if not timed:
            continue
        rr, tf = [b.rerender_s for b in timed], [b.faithful_s for b in timed]
        n = len(timed)
        out.add_row(
            size_label(r.size), str(r.calls), str(r.tokens), f"{statistics.fmean(b.new_tokens for b in timed):.0f}",
            *ms(rr), *ms(tf),
            *(ms([getattr(b, step) for b in timed])[0] for step in ("template_s", "buffers_s", "copy_s")),
            f"{statistics.fmean(rr) / statistics.fmean(tf):.1f}x",
            f"{sum(f > g for f, g in zip(tf, rr, strict=True))}/{n}",
            f"{sum(b.mode == 'token-faithful' for b in timed)}/{n}",
            f"{sum(bool(b.identical) for b in timed)}/{n}",
        )
    return out


def storage_table(results: list[Measured]) -> Table:
    out = table("Capture storage per session (bytes; B/tok = per token of the final conversation)",
                ("size", "tokens", "token cols", "B/tok", "full prompts", "B/tok", "full / linear", "DB file",
                 "DB B/tok", "bodies+canonical", "of DB"), left=())
    for r in results:
        s, n = r.stored, r.tokens
        out.add_row(size_label(r.size), str(n), f"{s.token_bytes:,}", f"{s.token_bytes / n:.1f}",
                      f"{s.full_bytes:,}", f"{s.full_bytes / n:.1f}", f"{s.full_bytes / s.token_bytes:.1f}x",
                      f"{s.file_bytes:,}", f"{s.file_bytes / n:.1f}", f"{s.text_bytes:,}",
                      f"{s.text_bytes / s.file_bytes:.0%}")
    return out


def trajectory_table(results: list[Measured]) -> Table:
    out = table("Trajectories per session: per-request (baseline) vs prefix-merge",
                ("size", "calls", "builder", "trajectories", "rows / call", "trainer tokens", "vs per-request",
                 "trainable tokens", "broken", "build ms"), left=())
    for r in results:
        base = r.builds["per-request"]["tokens"]
        for name, b in r.builds.items():
            out.add_row(size_label(r.size), str(r.calls), name, str(b["trajectories"]),
                          f"{b['trajectories'] / r.calls:.3f}", f"{b['tokens']:,}", f"{b['tokens'] / base:.3f}",
                          f"{b['trainable']:,}", str(b["broken"]), f"{b['seconds'] * 1000:.0f}")
    return out


def main(argv: Sequence[str] | None = None) -> list[Measured]:
    ap = cli.parser(__doc__)
    cli.session_args(ap, "target session sizes in tokens (1k = 1024)")
    ap.add_argument("--repeat", type=int, default=3,
                    help="timings of each step per turn; the best is kept")
    cli.tokenizer_arg(ap, help="a Hugging Face tokenizer dir")
    ap.add_argument("--chat-template", help="a Jinja chat template file (default: the tokenizer's own)")
    ap.add_argument("--no-thinking", action="store_true", help="sessions without reasoning blocks")
    cli.markdown_arg(ap, "tables")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    cli.check_sessions(ap, args)

    run = Run("bench_tokens.py", argv, width=None)
    started = run.started
    template = ChatTemplate.from_dir(args.tokenizer, args.chat_template)
    synth = SessionSynth(template, thinking=not args.no_thinking, seed=args.seed)
    template.continuation([{"role": "user", "content": "warm"}], None, synth.thinking, previous_ended_with_eos=True)
    results = []
    with run:
        for size in args.sizes:
            turns = args.turns or auto_turns(size)
            results.append(measure(synth, size, turns, args.repeat, run.work))
            run.progress(f"{size_label(size)}: {turns} calls done at {time.perf_counter() - started:.0f} s")
    run.report([prompt_table(results, args.repeat), storage_table(results), trajectory_table(results)],
               [f"tokenizer {args.tokenizer}, template {args.chat_template or 'the tokenizer’s own'}, "
                f"thinking {'on' if synth.thinking else 'off'}"], args.markdown)
    return results


if __name__ == "__main__":
    main()
