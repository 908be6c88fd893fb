"""Hermes Agent, mini-swe-agent, OpenClaw and OpenHands, each unchanged in Docker through `polar rollout serve`
(as a user starts it) in front of the REAL vLLM: the suite's CPU server on the tiny random-weight model, with the
real Qwen3.5 template. Random weights cannot fix the bug, so what is checked is what polar owes a trainer whatever
the model says: the harness's calls reach vLLM through polar and every one leaves a row (nothing lost: as many
rows as vLLM finished requests), a call with no answer in its history is exactly vLLM's own rendering of its
messages, a call with one carries that answer's sampled ids (token-faithful), the sampled ids and logprobs are
vLLM's (`polar verify` recomputes them from the weights), and the harness survives the junk answers or ends by its
own limit.

The server is the suite's shared one on that template (tests/integration/conftest.py, in its qwen3.5-4b group),
used by this test alone while it runs: vLLM's own count of finished requests is the harness's. Hermes Agent gets
a wider one of its own for its test. CI runs one harness (CI_HARNESS); scripts/test_matrix runs all four.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from polar.harnesses.bugfix import CALC, TEST
from tests.integration.test_verify_real_vllm import polar_verify
from tests.support.real_vllm import REPO, SERVED_MODEL, launch_real_vllm, stop_real_vllm
from tests.support.scheduling import matrix_subset

pytestmark = [pytest.mark.vllm, pytest.mark.docker, pytest.mark.slow]

CI_HARNESS = "openhands"
# Each harness's own limit where it has one; the others end when an answer carries no tool call.
LIMITS = {"openhands": {"max_steps": 3}, "mini_swe_agent": {"step_limit": 3}, "openclaw": {}, "hermes": {}}
WINDOWS = {"hermes": 65536}  # Hermes Agent refuses a context window under 64K tokens (the model's is 64K)


@pytest.fixture(scope="module")
def tokenizer_of(template_vllm, model_dir, tmp_path_factory) -> Path:
    """The model's tokenizer directory with the template vLLM serves: polar renders what vLLM renders."""
    tokenizer = tmp_path_factory.mktemp("tokenizer-real-template")
    shutil.copytree(model_dir, tokenizer, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.safetensors"))
    shutil.copy(template_vllm.template, tokenizer / "chat_template.jinja")
    return tokenizer


@pytest.fixture(scope="module")
def shared_rollout(template_vllm, tokenizer_of, tmp_path_factory):
    """`polar rollout serve --docker` on the suite's shared server (its qwen3.5-4b group)."""
    with rollout_server(template_vllm.url, tokenizer_of, tmp_path_factory.mktemp("agents-real-vllm")) as (client, db):
        yield client, db, template_vllm.url


@pytest.fixture
def rollout(request, name, template_vllm, tokenizer_of, tmp_path):
    """The shared one, or, for a harness that wants a wider window, a server of its own for this test alone."""
    if name not in WINDOWS:
        yield request.getfixturevalue("shared_rollout")
        return
    with own_rollout(request.getfixturevalue("vllm_servers"), template_vllm, tokenizer_of, tmp_path / "rollout",
                     WINDOWS[name]) as own:
        yield own


@contextmanager
def own_rollout(vllm_servers, template_vllm, tokenizer_of, work: Path, window: int) -> Iterator[tuple]:
    """A server of this test's own with a wider window (the shared one stopped first: one vLLM at a time) and
    `polar rollout serve` on it, both stopped when the test ends."""
    vllm_servers.close()
    url, pid = launch_real_vllm(max_model_len=window, chat_template=template_vllm.template)
    try:
        with rollout_server(url, tokenizer_of, work) as (client, db):
            yield client, db, url
    finally:
        stop_real_vllm(pid)


@contextmanager
def rollout_server(url: str, tokenizer: Path, work: Path) -> Iterator[tuple]:
    from polar.mitm.proxy import free_port
    from polar.rollout.client import RolloutClient

    work.mkdir(exist_ok=True)
    port, db = free_port(), work / "captures.db"
    argv = [sys.executable, "-m", "polar.cli", "rollout", "serve", "--port", str(port), "--proxy-port", str(free_port()),
            "--upstream", url, "--tokenizer", str(tokenizer), "--db", str(db), "--state", str(work / "rollout.db"),
            "--docker"]
    log = (work / "serve.log").open("w")
    server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    client = RolloutClient(f"http://127.0.0.1:{port}", timeout=30)
    try:
        for _ in range(120):
            if server.poll() is not None or _healthy(client):
                break
            time.sleep(1)
        assert server.poll() is None and _healthy(client), (work / "serve.log").read_text()[-3000:]
        yield client, db
    finally:
        client.close()
        server.terminate()
        server.wait(60)
        log.close()


def _healthy(client) -> bool:
    try:
        return client.health()
    except httpx.HTTPError:
        return False


def finished_requests(vllm_url: str) -> float:
    """vLLM's own count of the generation requests it finished (its Prometheus metrics)."""
    text = httpx.get(f"{vllm_url}/metrics", timeout=30).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vllm:request_success_total{"))


def bug_repo(work: Path, name: str) -> Path:
    repo = work / f"repo-{name}"
    repo.mkdir()
    (repo / "calc.py").write_text(CALC)
    (repo / "test_calc.py").write_text(TEST)
    return repo


def vllm_render(vllm_url: str, row: dict) -> list[int]:
    """vLLM's own rendering of a first request's messages and tools (no assistant turn yet), from the row's
    canonical request written back in the OpenAI Chat wire format vLLM reads."""
    canonical = row["canonical"]
    messages = [{"role": m["role"], "content": [{"type": "text", "text": part["text"]} for part in m["content"]]}
                for m in canonical["messages"]]
    tools = [{"type": "function", "function": {k: t[k] for k in ("name", "description", "parameters") if k in t}}
             for t in canonical.get("tools") or []]
    body = {"model": SERVED_MODEL, "messages": messages, "add_generation_prompt": True} | ({"tools": tools} if tools else {})
    reply = httpx.post(f"{vllm_url}/tokenize", json=body, timeout=60)
    assert reply.status_code == 200, reply.text[:2000]
    return reply.json()["tokens"]


def occurs(part: list[int], whole: list[int]) -> bool:
    return any(whole[i:i + len(part)] == part for i in range(len(whole) - len(part) + 1))


@matrix_subset(lambda params: params["name"] == CI_HARNESS)
@pytest.mark.parametrize("template_vllm", ["qwen3.5-4b"], indirect=True)  # the real Qwen3.5 template's server only
@pytest.mark.parametrize("name", list(LIMITS))
def test_agent_first_calls_on_the_real_vllm(rollout, model_dir, tmp_path, name):
    from polar.capture.reader import CaptureReader
    from polar.rollout.tasks import Named, TaskSpec
    from polar.sessions.state import REPEATED

    client, db, vllm_url = rollout
    marker = f"real-vllm-{name}-{uuid.uuid4().hex[:6]}"
    task = TaskSpec(id=marker, instruction=f"[{marker}] The test in test_calc.py fails. Fix the bug in calc.py.",
                    runtime="docker", repo=str(bug_repo(tmp_path, name)), timeout=300,
                    harness=Named(name=name, options=LIMITS[name]),
                    evaluator=Named(name="test_output", options={"command": "python3 -m pytest -q test_calc.py"}))
    before = finished_requests(vllm_url)
    (accepted,) = client.submit([task])
    (session,) = accepted["sessions"]
    result = next(r for _, r in client.results(follow=True) if r.session_id == session)
    rows = [r for r in CaptureReader(db).calls() if marker in json.dumps(r.get("canonical") or {})]
    calls = [r for r in rows if r["endpoint"] == "generate"]
    figures = {"harness": name, "outcome": result.outcome, "reward": result.reward, "calls": len(calls),
               "vllm_finished": finished_requests(vllm_url) - before,
               "prompt_tokens": [r["prompt_len"] for r in calls], "finish": [r["finish_reason"] for r in calls],
               "modes": [r["prompt_mode"].split(":")[0] for r in calls]}
    print(json.dumps(figures))
    # It ran to its end (an answer without a tool call, or its step limit): no error, no cut, no timeout.
    assert result.outcome == "ok" and result.reward == 0.0, (result.outcome, result.error, result.harness_output)
    assert calls and all(r["status"] == "ok" for r in rows), [(r["status"], r["error"]) for r in rows]
    assert figures["vllm_finished"] == len(calls)  # every call vLLM answered left its row
    for i, row in enumerate(calls):
        assert row["completion_ids"] and len(row["completion_logprobs"]) == len(row["completion_ids"])
        assert all(lp <= 0 for lp in row["completion_logprobs"])
        if not any(m["role"] == "assistant" for m in row["canonical"]["messages"]):
            # The first call, or one the harness sent again as it was (a retry after a junk answer): re-rendered,
            # exactly as vLLM renders it with the real template.
            assert row["prompt_ids"] == vllm_render(vllm_url, row), row["prompt_mode"]
        elif REPEATED in row["prompt_mode"]:  # the same request sent again: the earlier call's prompt, as it was
            (same,) = [r for r in calls[:i] if f"row {r['id']})" in row["prompt_mode"]]
            assert row["prompt_ids"] == same["prompt_ids"]
        elif row["prompt_mode"].startswith("token-faithful"):  # that answer's sampled ids, as they were
            assert any(occurs(earlier["completion_ids"], row["prompt_ids"]) for earlier in calls[:i])
        else:
            # The harness rewrote or left out the answer it sends back (Hermes Agent strips a junk answer's stray
            # `</think>` text; mini-swe-agent drops a malformed one): the prompt is vLLM's own render of it.
            assert row["prompt_mode"].startswith("re-render") and row["prompt_ids"] == vllm_render(vllm_url, row)
    # The sampled ids and their logprobs are the served weights': recomputed from them, within tolerance.
    code, lines, summary = polar_verify(db, model_dir, "--session", calls[0]["session_id"])
    assert code == 0 and lines and all(line["ok"] and line["missing"] == 0 for line in lines), (summary, lines)
    assert sum(line["tokens"] for line in lines) == sum(r["completion_len"] for r in calls)

