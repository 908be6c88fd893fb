"""scripts/bench_upstream.py's segment cache gives the ids the whole prompt's encoding gives, on the models' real
templates rendering agent-shaped conversations (thinking, tool calls, non-ASCII tool output)."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from tests.conftest import SHARED_TEMPLATES, real_template
from tests.support.scripts import load_script


def conversation(bench_storage, turns: int) -> tuple[list[dict], list[dict]]:
    tools = [{"type": "function", "function": {"name": "Bash", "description": "Run a shell command.",
                                               "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}]
    messages = [{"role": "system", "content": "You are a coding agent. Répondez brièvement."},
                {"role": "user", "content": "Fix the failing test — 修复测试 🙂"}]
    for t in range(turns):
        messages.append({"role": "assistant", "content": f"Running the tests, step {t}.",
                         "reasoning_content": f"I should look at test {t} first.\n\n",
                         "tool_calls": [{"id": f"call_{t}", "type": "function",
                                         "function": {"name": "Bash", "arguments": {"command": f"pytest -x tests/test_{t}.py"}}}]})
        messages.append({"role": "tool", "tool_call_id": f"call_{t}",
                         "content": bench_storage.tool_output(1, t, 3000) + "\n  ✓ ünïcödé\r\n\t<|im_start|> as text"})
    return messages, tools


@pytest.mark.parametrize("template", sorted(SHARED_TEMPLATES))
def test_segment_ids_are_the_whole_prompts(template, tokenizer_dir, monkeypatch):
    upstream = load_script(monkeypatch, "bench_upstream")
    bench_storage = load_script(monkeypatch, "bench_storage")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    text = real_template(template).read_text()
    segmented = upstream.SegmentTokenizer(tokenizer, check=0)  # compared here, not by its own check
    for turns in (1, 4, 5):  # a growing session: later prompts reuse the earlier messages' ids
        messages, tools = conversation(bench_storage, turns)
        prompt = tokenizer.apply_chat_template(messages, tools=tools, chat_template=text, add_generation_prompt=True,
                                               tokenize=False)
        assert segmented.encode(prompt, add_special_tokens=False) == tokenizer.encode(prompt, add_special_tokens=False)
    assert segmented.encode("plain text", add_special_tokens=True) == tokenizer.encode("plain text")
    assert segmented.eos_token_id == tokenizer.eos_token_id and len(segmented) == len(tokenizer)


def test_a_cut_that_changes_the_ids_stops_the_double(tokenizer_dir, monkeypatch):
    """Cut where the tokenizer does not (inside words), the pieces' ids differ: its first calls are checked."""
    upstream = load_script(monkeypatch, "bench_upstream")
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    segmented = upstream.SegmentTokenizer(tokenizer, marker="ing")
    with pytest.raises(RuntimeError, match="segment cache"):
        segmented.encode("the testing of something interesting", add_special_tokens=False)


@pytest.mark.parametrize("reasoning, content", [("Think first. 思考", "Then answer ✓"), ("", "Only an answer"),
                                                ("Only thinking", None), ("r", "c")])
def test_the_streamed_chunks_carry_the_answers_reasoning_and_content(monkeypatch, reasoning, content):
    """As vLLM's reasoning parser streams them: `reasoning` deltas, then `content`; joined, the non-streamed
    message's. A stream without the reasoning made every streamed chat-mode turn a re-render of the history
    without it (docs/benchmarks.md, 256 sessions streamed)."""
    import json

    upstream = load_script(monkeypatch, "bench_upstream")
    answer = {"id": "x", "created": 1, "model": "m", "usage": {},
              "choices": [{"index": 0, "finish_reason": "stop", "token_ids": list(range(7)),
                           "logprobs": {"content": [{"logprob": -0.5}] * 7},
                           "message": {"role": "assistant", "content": content, "reasoning": reasoning or None}}]}
    role, tokens, tail = upstream.sse_chunks(answer, with_usage=False)
    deltas = [json.loads(chunk.removeprefix(b"data: ").strip())["choices"][0]["delta"] for chunk in tokens]
    assert len(deltas) == 7
    assert "".join(d.get("reasoning", "") for d in deltas) == reasoning
    assert "".join(d.get("content", "") for d in deltas) == (content or "")
    kinds = [k for d in deltas for k in d if d[k]]
    assert kinds == sorted(kinds, key=lambda k: k == "content")  # all reasoning before any content
