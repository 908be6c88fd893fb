"""Chat-template mode, multi-turn, against the real vLLM with each real chat template.

In chat mode vLLM renders the prompt and answers with its ids as JSON text. polar reads that array past
the session's previous turn (polar/upstream/prompt_ids.py: the bytes both share are compared, not
parsed), so from the second turn on every capture row's prompt ids come from that path. vLLM re-renders
the whole history with the real template (a Qwen3 template drops earlier turns' reasoning, closes turns
its own way), so the prompt shares a prefix with the previous one that ends anywhere, often inside the
last turn. The tap records vLLM's own bytes: every row must hold exactly the ids vLLM returned, streamed
(the ids come on the first chunk) and not.
"""

from __future__ import annotations

import itertools
import uuid

import numpy as np
import pytest

from polar.capture.tokens import common_prefix_len
from tests.support.real_vllm import template_subset

pytestmark = pytest.mark.vllm

PROVIDERS = ["anthropic", "openai_chat", "openai_responses", "gemini"]
TURNS = [
    ("Hello! What can you do in this repository?", 24),
    ("Read the README and tell me what it is about — ünïcödé, 中文, 🚀.", 160),
    ("Shorter, please.", 3),
    ('Now say {"ok": true} and nothing else.', 24),
    ("Summarise our conversation in one line.", 48),
]


@pytest.fixture(scope="module")
def polar(template_vllm, template_tap, start_polar):
    return start_polar(template_tap.url, "chat-template", template=template_vllm.template)


# Off qwen3.5-4b: each provider once, streamed and not alternating.
@template_subset(lambda p: PROVIDERS.index(p["provider"]) % 2 == int(not p["stream"]))
@pytest.mark.parametrize("stream", [True, False], ids=["stream", "plain"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_every_turn_holds_the_prompt_ids_vllm_returned(template_vllm, template_tap, polar, converse, provider, stream):
    tap = template_tap
    thinking = stream  # both kinds of history: with reasoning to drop, and without
    session = f"chat-real-{template_vllm.name}-{provider}-{int(stream)}-{uuid.uuid4().hex[:6]}"
    tap.clear()
    answers = converse(provider, polar.url, session, TURNS, stream=stream, thinking=thinking)

    rows = polar.rows(session)
    assert len(rows) == len(TURNS) and all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    calls = tap.model_calls()
    assert [c.path for c in calls] == ["/v1/chat/completions"] * len(rows)
    for row, call in zip(rows, calls, strict=True):
        choice = call.response["choices"][0]
        assert row["prompt_ids"] == call.response["prompt_token_ids"]
        assert row["prompt_len"] == len(row["prompt_ids"])
        assert row["completion_ids"] == choice["token_ids"]
        logprobs = [e["logprob"] for e in choice["logprobs"]["content"]]
        assert row["completion_logprobs"] == pytest.approx(logprobs, abs=1e-6)
    assert [a.input_tokens for a in answers] == [r["prompt_len"] for r in rows]
    assert [a.output_tokens for a in answers] == [r["completion_len"] for r in rows]

    # Each prompt extends nearly all of the last one: the read-past path had a long prefix to compare and
    # skip. Where the template closes the last turn its own way (the empty think block of a turn without
    # reasoning is dropped: 4 ids on the Qwen3 templates), the two diverge a few ids before the end.
    for prev, row in itertools.pairwise(rows):
        assert len(row["prompt_ids"]) > len(prev["prompt_ids"])
        shared = common_prefix_len(np.asarray(prev["prompt_ids"]), np.asarray(row["prompt_ids"]))
        assert shared >= len(prev["prompt_ids"]) - 8

