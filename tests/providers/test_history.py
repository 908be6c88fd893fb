"""A session's history read once (providers/history.py): parsing through the memo gives what parsing afresh gives.

Every provider's parse runs twice on each request of a random session — through the session's `History`
and without one — and the two canonical requests, rewrite notes and errors must be equal. A session starts
from a CLI's real recorded request (data/harness_requests) and each next request edits the last one's
history items at random: appended items (from the CLIs' real requests and items that exercise each
reader's cross-item state: tool-name pairing, Gemini's calls waiting for responses and their positional
ids, Responses' open assistant turn and local_shell ids, Anthropic's sealed thinking and left-out blocks),
items changed, dropped, swapped, a cut history, another conversation of the session (a sub-agent), an
item a client must fix. Messages handed out earlier must not change as later requests are read.
"""

from __future__ import annotations

import copy
import json
from urllib.parse import parse_qsl, urlsplit

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from polar.errors import GatewayError
from polar.harnesses import CLIS
from polar.json_values import exact
from polar.providers.history import Histories, History, common_prefix
from tests.conftest import REPO
from tests.providers.support import PROVIDERS, SEALER

FIXTURES = REPO / "data" / "harness_requests"
SEALED = SEALER.seal("the model's own reasoning, sealed by polar")

# Items beyond the recorded ones, per provider format: each reader's state across items gets exercised.
EXTRA: dict[str, list] = {
    "anthropic": [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "", "signature": SEALED},
                                          {"type": "text", "text": "Looking."},
                                          {"type": "tool_use", "id": "toolu_a", "name": "Bash", "input": {"n": 1}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_a", "content": "out a"},
                                     {"type": "text", "text": "and then?"}]},
        {"role": "assistant", "content": [{"type": "redacted_thinking", "data": "opaque"},
                                          {"type": "server_tool_use", "id": "srv", "name": "web_search", "input": {}},
                                          {"type": "tool_use", "id": "toolu_b", "name": "Read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_b", "is_error": True,
                                      "content": [{"type": "text", "text": "no such file"}]},
                                     {"type": "web_search_tool_result", "tool_use_id": "srv", "content": []}]},
        {"role": "user", "content": [{"type": "document", "source": {"type": "base64", "media_type": "application/pdf",
                                                                    "data": "JVBERi0="}}]},
        {"role": "user", "content": "plain text turn"},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_n", "name": "Read",
                                           "input": {"offset": 1, "limit": 2000, "all": True, "x": 0.0}}]},
    ],
    "openai_chat": [
        {"role": "assistant", "content": None, "reasoning_content": "thinking",
         "tool_calls": [{"id": "call_a", "type": "function", "function": {"name": "run", "arguments": "{\"n\":1}"}}]},
        {"role": "tool", "tool_call_id": "call_a", "content": "out a"},
        {"role": "tool", "tool_call_id": "call_unknown", "content": [{"type": "text", "text": "orphan"}]},
        {"role": "assistant", "content": "done", "tool_calls": [
            {"id": "call_b", "type": "function", "function": {"name": "other", "arguments": {"x": 2}}}]},
        {"role": "tool", "tool_call_id": "call_b", "content": "out b"},
        {"role": "user", "content": "next"},
        {"role": "developer", "content": "be brief"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_n", "type": "function", "function": {"name": "run", "arguments": {"n": 1, "ok": True}}}]},
    ],
    "openai_responses": [
        {"type": "reasoning", "summary": [{"type": "summary_text", "text": "plan"}]},
        {"type": "function_call", "call_id": "call_a", "name": "shell", "arguments": "{\"cmd\":\"ls\"}"},
        {"type": "function_call_output", "call_id": "call_a", "output": "a.txt"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Listed."}]},
        {"type": "local_shell_call", "id": "ls_1", "call_id": "call_ls", "action": {"command": ["ls"]}},
        {"type": "local_shell_call_output", "id": "ls_1", "output": "b.txt"},
        {"type": "web_search_call", "id": "ws_1"},
        {"type": "custom_tool_call", "call_id": "call_c", "name": "apply_patch", "input": "*** Begin Patch"},
        {"type": "custom_tool_call_output", "call_id": "call_c", "output": "ok"},
        {"role": "user", "content": "go on"},
    ],
    "gemini": [
        {"role": "model", "parts": [{"text": "thinking", "thought": True}, {"text": "I will look."},
                                    {"functionCall": {"name": "run_shell_command", "args": {"command": "ls"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"name": "run_shell_command", "response": {"output": "a"}}}]},
        {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"path": "a"}}},
                                    {"functionCall": {"name": "read_file", "args": {"path": "b"}}}]},
        {"role": "user", "parts": [{"functionResponse": {"id": "own-id", "name": "read_file", "response": {"x": 1}}}]},
        {"role": "user", "parts": [{"text": "more"}, {"functionResponse": {"name": "read_file",
                                                                            "response": {"error": "gone"}}}]},
        {"role": "model", "parts": [{"text": "Done."}]},
        {"role": "model", "parts": [{"functionCall": {"name": "read_file", "args": {"offset": 1, "all": True}}}]},
    ],
}
# What a client must fix, per format: the error must be the same through the memo, and the memo still whole after.
BROKEN = {"anthropic": {"role": "robot", "content": "x"}, "openai_chat": {"role": "function", "content": "x"},
          "openai_responses": {"type": "item_reference", "id": "x"}, "gemini": {"role": "narrator", "parts": []}}


def fixture(cli: str) -> tuple:
    data = json.loads((FIXTURES / f"{cli}.json").read_text())
    url = urlsplit(data["first"]["path"])
    route = PROVIDERS.detect("POST", url.path, dict(parse_qsl(url.query)), data["first"]["headers"])
    return route, data["first"]["body"], data["later"]["body"]


def items_of(body: dict) -> list:
    """The history items of a body (Gemini CLI's inside its Code Assist envelope), the list itself."""
    for holder in (body, body.get("request") or {}):
        for key in ("messages", "input", "contents"):
            if isinstance(holder.get(key), list):
                return holder[key]
    raise AssertionError(f"no history items in {sorted(body)}")


def with_items(body: dict, items: list) -> dict:
    out = copy.deepcopy(body)
    held = items_of(out)
    held[:] = copy.deepcopy(items)
    return out


def outcome(route, body, history):
    try:
        parsed = route.provider.parse(route, body, history)
    except GatewayError as err:
        return ("error", err.kind, err.message, err.param), None
    return ("ok", parsed.request.model_dump(), parsed.rewrites), parsed


def edit(items: list, op: tuple, pool: list, other: list, broken: dict) -> list:
    kind, a, b = op
    items = list(items)
    if kind == "append":
        items += [copy.deepcopy(pool[(a + i) % len(pool)]) for i in range(1 + b % 4)]
    elif kind == "change" and items:
        at = a % len(items)
        changed = copy.deepcopy(items[at])
        items[at] = _changed(changed, b)
    elif kind == "drop" and items:
        del items[a % len(items)]
    elif kind == "swap" and len(items) > 1:
        i, j = a % len(items), b % len(items)
        items[i], items[j] = items[j], items[i]
    elif kind == "cut":
        items = items[: a % (len(items) + 1)] or items[:1]
    elif kind == "other":
        items = copy.deepcopy(other)
    elif kind == "broken":
        items.insert(a % (len(items) + 1), copy.deepcopy(broken))
    return items


def _retyped(value: bool | int | float) -> bool | int | float:
    """An equal value in Python that JSON writes (and a template renders) differently."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return float(value)
    return -value if value == 0 else int(value) if value.is_integer() else value


def _changed(value, seed: int):
    """`value` with one string in it changed (the first one met, walking by `seed`), or a key added, or a
    number or boolean retyped: equal in Python, not in JSON."""
    if isinstance(value, str):
        return value + f" (edited {seed})"
    if isinstance(value, (bool, int, float)):
        return _retyped(value)
    if isinstance(value, dict) and value:
        keys = sorted(value)
        key = keys[seed % len(keys)]
        if key in ("role", "type"):
            return {**value, "cache_control": {"type": "ephemeral"}} if "role" in value else value
        return {**value, key: _changed(value[key], seed // 3)}
    if isinstance(value, list) and value:
        at = seed % len(value)
        return [*value[:at], _changed(value[at], seed // 3), *value[at + 1 :]]
    return value


ops = st.lists(st.tuples(st.sampled_from(["append", "append", "append", "change", "drop", "swap", "cut", "other", "broken"]),
                         st.integers(0, 1000), st.integers(0, 1000)), min_size=1, max_size=8)


@pytest.mark.parametrize("harness", CLIS, ids=lambda h: h.name)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops)
def test_reading_through_the_memo_is_reading_afresh(harness, ops):
    route, first, later = fixture(harness.name)
    provider = route.provider.name
    pool = items_of(later) + EXTRA[provider]
    history = Histories().get("s", provider, 1)
    items = items_of(first)
    seen = []
    for op in [("append", 0, 0), *ops]:
        items = edit(items, op, pool, items_of(later)[:3], BROKEN[provider])
        body = with_items(first, items)
        pristine = copy.deepcopy(body)
        through, parsed = outcome(route, body, history)
        assert through == outcome(route, copy.deepcopy(body), None)[0], op
        assert body == pristine  # the memo keeps the decoded items: parsing must not change them
        if parsed is not None:
            seen.append((parsed, through))
    for parsed, dumped in seen:  # later reads did not change what earlier calls were handed
        assert ("ok", parsed.request.model_dump(), parsed.rewrites) == dumped


def test_a_growing_session_reads_only_what_is_new(monkeypatch):
    """Turn after turn of Claude Code's real request: a call reads only the items after the prefix it shares
    with the last call (here the two new ones), not the whole history."""
    import polar.providers.anthropic.parse as anthropic

    reads: list[int] = []

    class Conversation(anthropic._Conversation):
        def read(self, index, item):
            reads.append(index)
            super().read(index, item)

    monkeypatch.setattr(anthropic, "_Conversation", Conversation)
    route, first, _ = fixture("claude_code")
    history = Histories().get("s", "anthropic", 1)
    items, counted = items_of(first), []
    for _turn in range(6):
        reads.clear()
        items = items + copy.deepcopy(EXTRA["anthropic"][:2])
        route.provider.parse(route, with_items(first, items), history)
        counted.append(len(reads))
    assert counted == [len(items_of(first)) + 2] + [2] * 5


def test_sub_agents_interleaved_each_resume_their_own_read():
    route, first, later = fixture("claude_code")
    history = History(keep=3)
    main, sub = items_of(later), [{"role": "user", "content": "sub-agent task"}]
    for turn in range(4):
        main = main + [{"role": "assistant", "content": f"main {turn}"}, {"role": "user", "content": "go"}]
        sub = sub + [{"role": "assistant", "content": f"sub {turn}"}, {"role": "user", "content": "go"}]
        for items in (main, sub):
            assert outcome(route, with_items(first, items), history)[0] == outcome(route, with_items(first, items), None)[0]
    kept = sorted(len(r.texts) for r in history.reads)
    assert kept == [len(sub), len(main)]


def test_histories_drop_the_least_recently_used_past_their_bytes():
    route, first, later = fixture("pi")
    histories = Histories(max_bytes=3000)
    for session in ("a", "b", "c"):
        route.provider.parse(route, copy.deepcopy(later), histories.get(session, "anthropic", 1000))
    assert histories.bytes == 3000 and len(histories) == 3
    route.provider.parse(route, copy.deepcopy(later), histories.get("a", "anthropic", 1000))  # a: most recent
    route.provider.parse(route, copy.deepcopy(later), histories.get("d", "anthropic", 1000))
    assert histories.bytes == 3000 and len(histories) == 3
    assert [k for k in histories._all] == [("c", "anthropic"), ("a", "anthropic"), ("d", "anthropic")]


def test_common_prefix_stops_at_the_first_difference_as_json():
    a = [{"x": [1, {"y": "z"}]}, {"x": 2}, {"x": 3}]

    def prefix(items, earlier):
        return common_prefix(items, [exact(i) for i in earlier], [])

    assert prefix(a, copy.deepcopy(a)) == 3
    assert prefix(a, [*copy.deepcopy(a[:2]), {"x": 4}]) == 2
    assert prefix(a, a[:1]) == 1 and prefix([], a) == 0
    for earlier, retyped in (({"x": 1}, {"x": 1.0}), ({"x": 1}, {"x": True}), ({"x": 0}, {"x": False}),
                             ({"x": 0.0}, {"x": -0.0})):
        assert retyped == earlier and prefix([a[0], retyped], [a[0], earlier]) == 1  # == in Python, not in JSON
    assert prefix([{"x": 2**70}], [{"x": 2**70}]) == 0  # past 64 bits orjson writes nothing: never reused


def test_a_retyped_number_is_read_afresh():
    """{"n": 1} then {"n": 1.0} then {"n": true}: Python's == takes them as equal; the tool call's arguments
    (as the template renders them) differ, so the memo must not reuse the first read."""
    route, first, _ = fixture("claude_code")
    history = Histories().get("s", "anthropic", 1)
    for n in (1, 1.0, True, 1):
        call = {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "Read", "input": {"n": n}}]}
        body = with_items(first, [*items_of(first), call])
        tools = copy.deepcopy(body["tools"])
        tools[0]["input_schema"]["minimum"] = n
        body["tools"] = tools
        assert outcome(route, body, history)[0] == outcome(route, copy.deepcopy(body), None)[0]


SYSTEM_FIELDS = {"claude_code": "system", "codex": "instructions", "gemini_cli": "systemInstruction"}


def _system_variants(cli: str, body: dict) -> list:
    """The fixture's system prompt, a sub-agent's other one, and (Claude Code) its billing block changed."""
    own = body.get("request", body).get(SYSTEM_FIELDS[cli])
    if cli == "claude_code":
        billed = [{"type": "text", "text": "x-anthropic-billing-header: cc_version=9; cch=1a2b3;"}, *own[1:]]
        embedded = [{"type": "text", "text": "x-anthropic-billing-header: cch=9\nkeep this"}, *own[1:]]
        return [own, billed, own[1:], embedded, "You are a sub-agent."]
    if cli == "codex":  # Codex sends its own as developer items; SDK clients send `instructions`
        return ["You are Codex.", "You are Codex.\nMore.", "You are a sub-agent."]
    return [own, {"parts": [{"text": "You are a sub-agent."}]}, "plain"]


@pytest.mark.parametrize("cli", SYSTEM_FIELDS)
def test_the_system_prompt_is_read_once_while_it_stays_the_same(cli):
    """Its message is the same object on every call that sends the same system prompt (Claude Code: whatever its
    per-call billing line says), for a main conversation and a sub-agent taking turns; and reading it through the
    memo is reading it afresh, rewrites included."""
    route, first, later = fixture(cli)
    history = Histories().get("s", route.provider.name, 1)
    holder = lambda body: body.get("request", body)  # noqa: E731 — Gemini CLI's Code Assist envelope
    key = SYSTEM_FIELDS[cli]
    variants = _system_variants(cli, first)
    seen: dict[str, object] = {}
    for n in [0, 1, 0, 2, 1, 2, 0, 3, 3, 4, 0, 4] if cli == "claude_code" else [0, 1, 0, 2, 1, 0, 2]:
        body = copy.deepcopy(later)
        holder(body)[key] = copy.deepcopy(variants[n])
        through, parsed = outcome(route, body, history)
        assert through == outcome(route, copy.deepcopy(body), None)[0], n
        system = parsed.request.messages[0]
        assert system.role == "system"
        text = system.text()
        if text in seen:
            assert seen[text] is system, n  # read once, handed back
        seen[text] = system
    if cli == "claude_code":
        assert len(seen) == 3  # billing-only blocks left out: variants 0, 1 and 2 are one prompt
