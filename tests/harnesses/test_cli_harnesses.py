"""The real coding CLIs, unchanged, fix a bug in a tiny repo inside their own containers.

Each container reaches the providers' real host names; polar answers them transparently (no base
URL, no proxy variable). The scripted model makes the CLI call its own shell tool with a `sed` that
fixes the bug, then says "done". Checked: the CLI's exit code, the container's file, the captures,
and that the session stays token-faithful after its first call.

Every CLI runs on each real chat template: the Qwen ones (tests/conftest.py REAL_TEMPLATES) and the other
families' the double writes (Llama-3.3's JSON calls, DeepSeek-V3.1, Kimi-K2, MiniMax-M2 with its reasoning kept in
history; stand-in vocabularies, tests/support/stand_in.py). The gateway renders with the template and the double
samples in its model family's format with the same vocabulary (tests/conftest.py `template_stack`). CI runs a subset
of that matrix: all six on Qwen3.5 (the keep-alive test, which fixes the same bug), each on one of the other two Qwen
templates and each on one other family, spread across the four; `scripts/test_matrix` runs all of it.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from polar.harnesses import CLIS, Harness, bugfix
from polar.harnesses.bugfix import Run, steps
from tests.conftest import REAL_TEMPLATES
from tests.support.scheduling import matrix_subset

pytestmark = pytest.mark.docker

LEAKY = ("BASE_URL", "PROXY", "API_BASE", "ENDPOINT")  # names that would point a CLI somewhere


@pytest.fixture(scope="module")
def images(docker_client, node_image):
    """polar/cli images, one per harness, built on demand (cached by package version)."""
    built: dict[str, str] = {}

    def image(harness: Harness) -> str:
        if harness.name not in built:
            built[harness.name] = harness.install_layer(docker_client, node_image)
        return built[harness.name]

    return image


def script(transparent, runs: list[tuple[Harness, str]]) -> None:
    """One rule per session: the harness's shell tool runs the fix (after a read if it insists), then "done"."""
    transparent.stack.script(rules=[{"match": marker, "steps": steps(harness)} for harness, marker in runs])


def run_task(transparent, image: str, harness: Harness, session: str, tmp_path: Path) -> Run:
    return bugfix.run_task(transparent.runtime, transparent.ca_cert, image, harness, session, tmp_path)


def check(run: Run, rows: list[dict], reasoned: bool = True) -> None:
    """`reasoned`: the model wrote reasoning before its tool calls (not on Qwen3-Coder, which never reasons, nor on
    DeepSeek-V3.1 unless the CLI asks to think)."""
    last = rows[-1]["request_body"][-1500:] if rows else b""
    detail = f"{run.harness.name} exit {run.exit_code} after {run.seconds:.0f}s:\n{run.output[-3000:]}\nlast request: {last!r}"
    assert run.harness.success(run.exit_code), detail
    assert "a + b" in run.calc, detail
    leaks = [line for line in run.env.splitlines() if any(word in line.split("=", 1)[0].upper() for word in LEAKY)]
    assert not leaks, leaks
    assert len(rows) >= 2, (len(rows), detail)  # the tool-call turn and the final answer at least
    routed = [r for r in rows if r["endpoint"] != "unknown"]
    assert {(r["provider"], r["status"]) for r in routed} == {(run.harness.provider, "ok")}, summary(rows)
    assert any(run.marker.encode() in r["request_body"] for r in routed)
    # The follow-up turn's history holds the tool turn's reasoning: the CLI echoed it (text, signed
    # block or sealed blob) and polar recovered it.
    if reasoned:
        assert bugfix.REASONING in str(routed[-1]["canonical"]), summary(rows)
    # After its first call the main conversation's prompts extend the earlier prompt + sampled ids; a
    # re-render is only the start of another conversation (a CLI's side call, e.g. opencode's title).
    # (A call that started before the session's first one ended, as opencode's title call does when first
    # tokens are slow, is a first call too.)
    modes = [r["prompt_mode"] for r in routed]
    assert modes[-1].startswith("token-faithful"), modes

    def fits(row: dict) -> bool:
        mode = row["prompt_mode"]
        return (mode.startswith("token-faithful") or "new conversation" in mode
                or (mode.startswith("re-render: first call") and row["t_start"] < routed[0]["t_end"]))

    assert all(fits(r) for r in routed[1:]), modes
    # Side channels a CLI GETs (Claude Code's settings and policy limits) are answered 404 and
    # not captured: every captured row is a model call.
    assert all(r["endpoint"] != "unknown" for r in rows), summary(rows)
    # All six CLIs stream their model calls, and got them streamed for real: each answer's first piece
    # went out before the call ended (its row committed before the stream's terminal event).
    generated = [r for r in routed if r["endpoint"] == "generate"]
    assert all(r["stream"] == 1 and r["t_start"] < r["t_first"] <= r["t_end"] for r in generated), summary(rows)


def model_calls(rows: list[dict]) -> int:
    return sum(r["endpoint"] not in ("unknown", "count_tokens", "models") for r in rows)


def summary(rows: list[dict]) -> list[tuple]:
    return [(r["provider"], r["endpoint"], r["path"], r["status"], r["error_kind"], r["error"], r["request_body"][:200]) for r in rows]


def upstream_calls(transparent) -> int:
    """Generation requests the double received (polar's one-off endpoint probe has an empty body)."""
    return transparent.stack.double.generations


# The families besides Qwen that the CLIs run on (labels of tests/conftest.py FAMILY_TEMPLATES), in the order CI
# hands them to the CLIs: DeepSeek-V3.1 to Claude Code, which asks to think (its template reasons only then). The
# six CLIs never reach the last three in CI (DeepSeek-V3.2, V4, Kimi-K2-Thinking: the whole matrix only; append new
# ones at the end, so that CI's subset stays).
OTHER_FAMILIES = ("deepseek-v3.1", "llama-3.3", "minimax-m2", "kimi-k2", "glm-4.6", "gpt-oss", "deepseek-v3.2",
                  "deepseek-v4", "kimi-k2-thinking")
CLI_TEMPLATES = (*REAL_TEMPLATES, *OTHER_FAMILIES)


def _in_ci(params) -> bool:
    """Qwen3.5 is the keep-alive test's; the CLIs alternate between Qwen3-hybrid and Qwen3-Coder, and take the
    other families in turn (each CLI one family, each family at least one CLI)."""
    other = ("qwen3-hybrid", "qwen3-coder")
    template, index = params["template_stack"], CLIS.index(params["harness"])
    return template == other[index % 2] or template == OTHER_FAMILIES[index % len(OTHER_FAMILIES)]


@matrix_subset(_in_ci)
@pytest.mark.parametrize("template_stack", CLI_TEMPLATES, indirect=True)
@pytest.mark.parametrize("harness", CLIS, ids=lambda h: h.name)
def test_cli_fixes_the_bug(template_stack, transparent, images, harness, tmp_path, request):
    template = template_stack.template
    image = images(harness)
    session = f"cli-{template.replace('.', '')}-{harness.name.replace('_', '-')}"
    script(transparent, [(harness, f"polar-task-{session}")])
    before = upstream_calls(transparent)
    run = run_task(transparent, image, harness, session, tmp_path)
    rows = transparent.rows(session)
    generated = [r for r in template_stack.rows(session) if r["endpoint"] == "generate"]
    decode = template_stack.double.tokenizer.decode
    called = [decode(r["completion_ids"]) for r in generated if r["finish_reason"] == "tool_calls"]
    reasoned = any(bugfix.REASONING in text for text in called)
    check(run, rows, reasoned)
    # A model that reasons unasked did so (Qwen3.5, Qwen3-hybrid, MiniMax-M2); DeepSeek-V3.1 reasons when asked to.
    assert reasoned or not reasons_unasked(template_stack.double), summary(rows)
    # Every upstream call of the run came through polar and was captured under this session.
    assert upstream_calls(transparent) - before == model_calls(rows), summary(rows)
    # Rendered with the template, sampled in its family's format (the turns that called the shell tool).
    template_stack.assert_served_with_template([r for r in generated if r["finish_reason"] == "tool_calls"])
    assert_token_faithful(generated, decode, reasoned)
    print(f"{harness.name} {harness.version}: {len(rows)} calls in {run.seconds:.1f}s", [r["path"] for r in rows])


def reasons_unasked(double) -> bool:
    """Whether the double's template has the model reason when a request says nothing about thinking."""
    prompt = double.tokenizer.apply_chat_template([{"role": "user", "content": "Fix it."}], tokenize=False,
                                                  chat_template=double.template_text, add_generation_prompt=True)
    return double.format.reasoning_mode(prompt) != "none"


def assert_token_faithful(generated: list[dict], decode, reasoned: bool) -> None:
    """On the ids: every token-faithful call's prompt starts with an earlier call's prompt + sampled ids (no sampled
    id re-encoded), and reasoning the model sampled before a tool call is still in the last such prompt (DeepSeek-V3.1's
    template re-renders an earlier turn without it, MiniMax-M2's once a user message follows; token-faithful history
    keeps it)."""
    faithful = []
    for i, row in enumerate(generated):
        if row["prompt_mode"].startswith("token-faithful"):
            earlier = [r["prompt_ids"] + r["completion_ids"] for r in generated[:i]]
            assert any(row["prompt_ids"][: len(full)] == full for full in earlier), (i, row["prompt_mode"])
            faithful.append(row)
    if reasoned:
        assert bugfix.REASONING in decode(faithful[-1]["prompt_ids"])


@pytest.mark.parametrize("template_stack", ["qwen3-hybrid"], indirect=True)
def test_eight_parallel_sessions(template_stack, transparent, images, tmp_path):
    """Eight containers at once, the CLIs mixed: each session's captures hold only its own task
    (on one real template: the JSON tool-call family, which also takes Codex's several system messages)."""
    harnesses = [CLIS[i % len(CLIS)] for i in range(8)]
    sessions = [f"par-{i}-{h.name.replace('_', '-')}" for i, h in enumerate(harnesses)]
    image_of = {h.name: images(h) for h in harnesses}  # built before the clock starts
    script(transparent, [(h, f"polar-task-{s}") for h, s in zip(harnesses, sessions)])

    def one(pair: tuple[Harness, str]) -> Run:
        harness, session = pair
        return run_task(transparent, image_of[harness.name], harness, session, tmp_path)

    with ThreadPoolExecutor(len(sessions)) as pool:
        runs = list(pool.map(one, zip(harnesses, sessions)))
    for run in runs:
        rows = transparent.rows(run.session)
        check(run, rows)
        others = [f"polar-task-{s}]".encode() for s in sessions if s != run.session]
        assert not [r for r in rows if any(other in r["request_body"] for other in others)], run.session


@pytest.mark.parametrize("template_stack", ["qwen3.5-4b"], indirect=True)
@pytest.mark.parametrize("harness", CLIS, ids=lambda h: h.name)
def test_cli_waits_through_keepalives(template_stack, transparent, images, harness, tmp_path):
    """vLLM queueing or prefilling sends nothing for seconds: each real CLI must take polar's keep-alives
    (Anthropic ping, SSE comments, Codex's in-progress events, Gemini's blank lines) and still finish the task.
    The stack sends one after 1 s of silence; the double waits 2.5 s before every first token."""
    session = f"keepalive-{harness.name.replace('_', '-')}"
    script(transparent, [(harness, f"polar-task-{session}")])
    httpx.post(f"{transparent.stack.upstream_url}/_double/pace", json={"first_token_delay_s": 2.5}).raise_for_status()
    before = upstream_calls(transparent)
    try:
        run = run_task(transparent, images(harness), harness, session, tmp_path)
    finally:
        httpx.post(f"{transparent.stack.upstream_url}/_double/pace", json={"first_token_delay_s": 0}).raise_for_status()
    rows = transparent.rows(session)
    check(run, rows)  # Qwen3.5 reasons unasked
    assert upstream_calls(transparent) - before == model_calls(rows), summary(rows)
    generated = [r for r in rows if r["endpoint"] == "generate"]
    assert all(r["t_first"] - r["t_start"] >= 2.5 for r in generated), summary(rows)  # they really waited
