"""On each real chat template: polar's own rendering of a first prompt equals vLLM's, id for id.

vLLM is started with `--chat-template`, polar told the same file. The same SDK request goes through
polar in chat-template mode (vLLM renders) and in token-faithful mode (polar renders).
"""

from __future__ import annotations

import uuid

import pytest

from tests.support.real_vllm import template_subset

pytestmark = pytest.mark.vllm

PROVIDERS = ["anthropic", "openai_chat", "openai_responses", "gemini"]
QUESTION = "What does this repository do? Réponds en français — 简短 ✓"


@pytest.fixture(scope="module")
def polars(template_vllm, template_tap, start_polar):
    return {mode: start_polar(template_tap.url, mode, template=template_vllm.template)
            for mode in ("chat-template", "token-faithful")}


@template_subset(lambda p: p["provider"] in ("anthropic", "openai_responses"))
@pytest.mark.parametrize("thinking", [False, True], ids=["no-thinking", "thinking"])
@pytest.mark.parametrize("provider", PROVIDERS)
def test_polar_renders_the_first_prompt_as_vllm_does(template_vllm, polars, converse, provider, thinking):
    prompts = {}
    for mode, polar in polars.items():
        session = f"render-{template_vllm.name}-{mode}-{uuid.uuid4().hex[:6]}"
        converse(provider, polar.url, session, [(QUESTION, 1)], stream=False, thinking=thinking)
        (row,) = polar.rows(session)
        assert row["status"] == "ok", (row["error_kind"], row["error"])
        prompts[mode] = row["prompt_ids"]
    assert prompts["token-faithful"] == prompts["chat-template"]
