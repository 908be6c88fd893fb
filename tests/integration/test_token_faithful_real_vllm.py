"""Token-faithful multi-turn sessions against the real vLLM, through all four provider APIs.

The tiny model's text is noise, so a session is a conversation of user messages (the harness still
offers its tools): six turns, thinking on and off. Most turns are cut by a small max tokens, one by
a very small one; two get room to end on their own with the EOS token. Every call after the first
must extend the previous prompt + sampled ids (nothing sampled is re-encoded, a truncated turn is
closed without touching its ids), vLLM must have been sent and have sampled exactly what was
captured, and prefix-merge must make exactly one trajectory holding every sampled token unchanged.
Each real chat template runs: vLLM started with `--chat-template`, polar told the same template.
"""

from __future__ import annotations

import itertools
import uuid

import pytest

from tests.support.real_vllm import template_subset

pytestmark = pytest.mark.vllm

PROVIDERS = ["anthropic", "openai_chat", "openai_responses", "gemini"]
EOS = 248046  # <|im_end|>
SMALL, TINY, ROOMY = 24, 3, 700  # ROOMY: greedy turns of the tiny model end after ~120 to ~550 tokens
TURNS = [
    ("Hello! What can you do in this repository?", SMALL),
    ("Read the README and tell me what it is about — ünïcödé, 中文, 🚀.", ROOMY),
    ("Shorter, please.", TINY),
    ('Now say {"ok": true} and nothing else.', SMALL),
    ("Continue.", ROOMY),
    ("Summarise our conversation in one line.", SMALL),
]


@pytest.fixture(scope="module")
def polar(template_vllm, template_tap, start_polar):
    return start_polar(template_tap.url, "token-faithful", template=template_vllm.template)


# Off qwen3.5-4b: each provider once, thinking on and off alternating.
@template_subset(lambda p: PROVIDERS.index(p["provider"]) % 2 == int(not p["thinking"]))
@pytest.mark.parametrize("thinking", [True, False], ids=["thinking", "no-thinking"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_session_is_one_faithful_trajectory(template_vllm, template_tap, polar, converse, provider, thinking):
    from polar.trajectories.builders import prefix_merge

    tap = template_tap
    session = f"tf-real-{template_vllm.name}-{provider}-{int(thinking)}-{uuid.uuid4().hex[:6]}"
    tap.clear()
    stream = provider != "openai_chat"  # as the CLIs call; Chat Completions plain, as many simple harnesses do
    answers = converse(provider, polar.url, session, TURNS, stream=stream, thinking=thinking)

    rows = polar.rows(session)
    assert len(rows) == len(TURNS) and all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    assert rows[0]["prompt_mode"].startswith("re-render")
    for prev, row in itertools.pairwise(rows):
        assert row["prompt_mode"].startswith("token-faithful"), row["prompt_mode"]
        kept = prev["prompt_ids"] + prev["completion_ids"]
        assert row["prompt_ids"][: len(kept)] == kept  # no sampled id re-encoded, none dropped
        closed = "closed a truncated turn" in row["prompt_mode"]
        assert closed == (prev["completion_ids"][-1] != EOS), (prev["finish_reason"], row["prompt_mode"])

    # vLLM was sent exactly the captured prompts, on its token endpoint, and sampled exactly the captured ids.
    calls = tap.model_calls()
    assert [c.path for c in calls] == ["/inference/v1/generate"] * len(rows)
    for row, call in zip(rows, calls, strict=True):
        choice = call.response["choices"][0]
        # polar does not ask vLLM to echo the prompt (test_real_vllm: vLLM samples from the sent ids unchanged).
        assert call.request["token_ids"] == row["prompt_ids"] and call.response.get("prompt_token_ids") is None
        assert choice["token_ids"] == row["completion_ids"]
        assert [e["logprob"] for e in choice["logprobs"]["content"]] == pytest.approx(row["completion_logprobs"], abs=1e-6)

    # The client saw each turn end as captured: cut at its max tokens, or ended by EOS. Which turn ends how
    # depends on the template's prompt (the model is noise), but a session must take both paths.
    finishes = [r["finish_reason"] for r in rows]
    assert [a.finish for a in answers] == finishes
    assert [a.output_tokens for a in answers] == [r["completion_len"] for r in rows]
    for (_, max_tokens), row in zip(TURNS, rows, strict=True):
        ended = row["completion_ids"][-1] == EOS
        assert row["finish_reason"] == ("stop" if ended else "length") and row["completion_len"] <= max_tokens
        assert ended or row["completion_len"] == max_tokens
    assert "stop" in finishes, "no turn ended on its own: the EOS path went untested (raise ROOMY?)"
    assert "length" in finishes, "no turn was cut: closing a truncated turn went untested"

    (traj,) = prefix_merge(rows)
    assert traj.token_ids[: rows[-1]["prompt_len"]] == rows[-1]["prompt_ids"]
    assert len(traj.turns) == len(rows)
    for turn, row in zip(traj.turns, rows, strict=True):
        start, end = turn.completion_start, turn.completion_end
        assert traj.token_ids[start:end] == row["completion_ids"]
        assert all(traj.loss_mask[start:end])
        assert traj.logprobs[start:end] == pytest.approx(row["completion_logprobs"])
    assert sum(traj.loss_mask) == sum(r["completion_len"] for r in rows)
