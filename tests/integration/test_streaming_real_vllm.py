"""Real streaming against the real vLLM: token truth from the stream, and a client that leaves frees the engine.

- Greedy sampling, the same request made once whole and once streamed through polar, in both prompt
  modes: the captured prompt ids, sampled ids and logprobs are the same, and they are what vLLM's own
  stream carried (recorded by the tap between polar and vLLM).
- A client that closes a long stream early: vLLM stops generating for it (its running requests go to
  zero and its generated-token counter stops short of max_tokens), and the capture keeps the partial
  turn as client_disconnected.
"""

from __future__ import annotations

import re
import time
import uuid

import httpx
import pytest

from tests.support.real_vllm import template_subset

pytestmark = pytest.mark.vllm

MODES = ["chat-template", "token-faithful"]
PROMPT = "Read the README and tell me what it is about — ünïcödé, 中文, 🚀."


@pytest.fixture(scope="module")
def polars(template_vllm, template_tap, start_polar):
    return {mode: start_polar(template_tap.url, mode, template=template_vllm.template) for mode in MODES}


def anthropic_body(stream: bool, max_tokens: int, temperature: float = 0) -> dict:
    return {"model": "claude", "max_tokens": max_tokens, "temperature": temperature, "stream": stream,
            "messages": [{"role": "user", "content": PROMPT}]}


@template_subset(lambda p: p["mode"] == "token-faithful")
@pytest.mark.parametrize("mode", MODES)
def test_streamed_ids_and_logprobs_equal_the_whole_answers(template_vllm, template_tap, polars, mode):
    polar = polars[mode]
    sessions = {stream: f"rs-{mode}-{int(stream)}-{uuid.uuid4().hex[:6]}" for stream in (False, True)}
    template_tap.clear()
    for stream, session in sessions.items():
        with httpx.stream("POST", f"{polar.url}/v1/messages", json=anthropic_body(stream, 96),
                          headers={"x-polar-session": session}, timeout=300) as r:
            assert r.status_code == 200
            body = r.read()
        assert (b"event: message_stop" in body) == stream
    whole, streamed = (polar.rows(sessions[s])[0] for s in (False, True))
    assert whole["status"] == streamed["status"] == "ok" and (whole["stream"], streamed["stream"]) == (0, 1)
    assert streamed["prompt_ids"] == whole["prompt_ids"]
    assert streamed["completion_ids"] == whole["completion_ids"] and len(whole["completion_ids"]) > 10
    deltas = [abs(a - b) for a, b in zip(streamed["completion_logprobs"], whole["completion_logprobs"], strict=True)]
    assert max(deltas) <= 1e-4, max(deltas)
    # what vLLM's stream carried is what polar captured (the tap records a stream once it has relayed its end)
    deadline = time.monotonic() + 10
    while not (streams := [c for c in template_tap.model_calls() if c.request.get("stream")]):
        assert time.monotonic() < deadline, "the tap recorded no streamed call"
        time.sleep(0.05)
    answer = streams[-1].response["choices"][0]
    assert answer["token_ids"] == streamed["completion_ids"]
    carried = [item["logprob"] for item in answer["logprobs"]["content"]]
    assert carried == pytest.approx(streamed["completion_logprobs"], abs=1e-6)
    assert streamed["finish_reason"] == whole["finish_reason"]


def vllm_metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=10).text

    def value(name: str) -> float:
        return sum(float(v) for v in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} ([0-9.e+]+)$", text, re.M))

    return {"running": value("vllm:num_requests_running"), "generated": value("vllm:generation_tokens_total")}


@template_subset(lambda p: False)  # one template suffices: the abort is vLLM's, whatever it renders
@pytest.mark.parametrize("mode", MODES)
def test_a_client_that_leaves_frees_the_engine(template_vllm, start_polar, mode):
    polar = start_polar(template_vllm.url, mode, template=template_vllm.template)  # no tap: polar → vLLM
    # Sampled, not greedy: the tiny model's greedy answer ends after ~110 tokens (< 1 s). Sampled it mostly runs
    # on towards max_tokens, but it can still sample its end early; on a loaded machine the whole short answer
    # then goes out in one write before the client's leaving is seen (CI saw the row end "ok" so). Such a
    # call (the whole answer captured, ended by the model) never tested a leaving client: it is made again, a
    # few times at most.
    for _attempt in range(4):
        row, generated = _leave_after_two_deltas(template_vllm, polar, f"rs-leave-{mode}-{uuid.uuid4().hex[:6]}")
        ended_itself = row["status"] == "ok" and row["finish_reason"] == "stop" and row["completion_len"] == generated
        if not ended_itself:
            break
    assert row["status"] == "client_disconnected" and row["finish_reason"] == "abort", (
        row["status"], row["finish_reason"], row["completion_len"], generated)
    assert 2 <= row["completion_len"] <= generated and len(row["completion_logprobs"]) == row["completion_len"]


def _leave_after_two_deltas(template_vllm, polar, session: str) -> tuple[dict, float]:
    """Stream a long answer, leave after its second delta; vLLM must stop for it. The row, and the tokens vLLM
    generated meanwhile."""
    max_tokens = 3000
    before = vllm_metrics(template_vllm.url)
    with httpx.stream("POST", f"{polar.url}/v1/messages", json=anthropic_body(True, max_tokens, temperature=1.0),
                      headers={"x-polar-session": session}, timeout=300) as r:
        seen = 0
        for line in r.iter_lines():
            seen += line.startswith("event: content_block_delta")
            if seen >= 2:
                break
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and vllm_metrics(template_vllm.url)["running"] > 0:
        time.sleep(0.2)
    settled = vllm_metrics(template_vllm.url)
    assert settled["running"] == 0
    time.sleep(2)  # had the request gone on, the tiny model would sample hundreds of tokens in this time
    after = vllm_metrics(template_vllm.url)
    generated = after["generated"] - before["generated"]
    assert after["generated"] == settled["generated"] and generated < max_tokens / 4, (before, settled, after)
    (row,) = polar.rows(session)
    return row, generated
