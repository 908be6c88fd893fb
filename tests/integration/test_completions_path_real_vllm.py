"""The other token-in path, against the real vLLM: /v1/completions when /inference/v1/generate is absent.

vLLM offers /inference/v1/generate only when started with --enable-scale-out; without it polar sends
its token prompts to /v1/completions. The same greedy session runs through three polars on each real
template: endpoint=generate, endpoint=completions, and endpoint=auto behind a tap that answers 404 for
generate, as a vLLM without scale-out does. Prompt ids, sampled ids and logprobs must be equal. An
answer without logprobs must be captured as missing (NULL), never as 0.0 (probability one).
"""

from __future__ import annotations

import itertools
import uuid

import pytest

from tests.support.real_vllm import template_subset
from tests.support.tap import running_tap

pytestmark = pytest.mark.vllm

PROVIDERS = ["anthropic", "openai_chat", "openai_responses", "gemini"]
GENERATE, COMPLETIONS = "/inference/v1/generate", "/v1/completions"
TURNS = [("Hello! What can you do here?", 16), ("Read the README — ünïcödé, 中文.", 40), ("Shorter.", 8)]


@pytest.fixture(scope="module")
def no_scale_out(template_vllm):
    """The template's vLLM as one started without --enable-scale-out would answer."""
    with running_tap(template_vllm.url, refuse=(GENERATE,)) as tap:
        yield tap


@pytest.fixture(scope="module")
def polars(template_vllm, template_tap, no_scale_out, start_polar):
    def start(tap, endpoint):
        return tap, start_polar(tap.url, "token-faithful", template=template_vllm.template, endpoint=endpoint)

    return {"generate": start(template_tap, "generate"), "completions": start(template_tap, "completions"),
            "auto": start(no_scale_out, "auto")}


@template_subset(lambda p: p["provider"] in ("anthropic", "openai_responses"))
@pytest.mark.parametrize("provider", PROVIDERS)
def test_completions_path_equals_generate(template_vllm, polars, converse, provider):
    session = f"ep-{template_vllm.name}-{provider}-{uuid.uuid4().hex[:6]}"
    rows, paths = {}, {}
    for name, (tap, polar) in polars.items():
        before = len(tap.exchanges())
        converse(provider, polar.url, session, TURNS, stream=provider != "openai_chat", thinking=True)
        rows[name] = polar.rows(session)
        paths[name] = [(c.path, c.status) for c in tap.exchanges()[before:] if c.method == "POST"]
        assert [r["status"] for r in rows[name]] == ["ok"] * len(TURNS), [r["error"] for r in rows[name]]
        assert all(r["prompt_mode"].startswith("token-faithful") for r in rows[name][1:])

    assert paths["generate"] == [(GENERATE, 200)] * len(TURNS)
    assert paths["completions"] == [(COMPLETIONS, 200)] * len(TURNS)
    # auto probed generate once, on its first call (maybe an earlier test's), got a 404: completions since.
    assert [p for p in paths["auto"] if p != (GENERATE, 404)] == [(COMPLETIONS, 200)] * len(TURNS)
    auto_tap, _ = polars["auto"]
    assert [(c.path, c.status) for c in auto_tap.exchanges() if c.path == GENERATE] == [(GENERATE, 404)]
    for a, b in itertools.combinations(rows.values(), 2):
        for x, y in zip(a, b, strict=True):
            assert x["prompt_ids"] == y["prompt_ids"]
            assert x["completion_ids"] == y["completion_ids"]
            assert x["finish_reason"] == y["finish_reason"]
            assert x["completion_logprobs"] == pytest.approx(y["completion_logprobs"], abs=1e-4)
    assert all(r["completion_logprobs"] is not None for r in rows["completions"])


def _drop_logprobs(path, answer):
    if path == COMPLETIONS:
        for choice in answer.get("choices", []):
            choice["logprobs"] = None
    return answer


def test_missing_logprobs_are_flagged_not_zero(template_vllm, polars, converse):
    """A completions answer without logprobs: the capture and the trajectory say "none", not 0.0."""
    from polar.trajectories.builders import prefix_merge

    tap, polar = polars["auto"]
    session = f"nolp-{template_vllm.name}-{uuid.uuid4().hex[:6]}"
    tap.edit = _drop_logprobs
    try:
        answers = converse("openai_chat", polar.url, session, TURNS[:2], stream=False, thinking=False)
    finally:
        tap.edit = None
    rows = polar.rows(session)
    assert [r["status"] for r in rows] == ["ok", "ok"]
    assert [a.output_tokens for a in answers] == [r["completion_len"] for r in rows]
    assert all(r["completion_len"] > 0 and r["completion_logprobs"] is None for r in rows)
    (traj,) = prefix_merge(rows)
    assert [t.has_logprobs for t in traj.turns] == [False, False]
