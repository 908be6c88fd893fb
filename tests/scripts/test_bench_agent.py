"""scripts/bench_agent.py end to end at a tiny size: one CLI per provider API, replayed through every target."""

from __future__ import annotations

import re

import pytest

from polar.capture.reader import CaptureReader
from tests.support.scripts import load_script, with_litellm

pytestmark = pytest.mark.slow
SESSIONS, TURNS = 2, 3
ONE_PER_API = ["claude_code", "codex", "gemini_cli", "qwen_code"]


def tiny(bench, tokenizer_dir, tmp_path, *args: str) -> list:
    return bench.main(["--sessions", str(SESSIONS), "--turns", str(TURNS), "--buckets", "1", "--tokenizer",
                       str(tokenizer_dir), "--dir", str(tmp_path), "--markdown", *args])


def check_run(run, first_request_tokens: int = 1000) -> None:
    """Every replayed call accepted and answered with a tool call; the figures there and sane."""
    assert run.errors == [] and run.calls == SESSIONS * TURNS, (run.cli, run.target.name, run.errors)
    assert all(s.turns == TURNS for s in run.sessions) and len(run.sessions) == SESSIONS
    assert [(b.first, b.last) for b in run.buckets] == [(1, 1), (2, TURNS)]
    assert 0 < run.pct(50) <= run.pct(99) < 120_000 and run.rate > 0
    if run.target.proxy is None:  # direct
        assert run.cpu_ms is None and run.peak_rss is None
        return
    assert run.cpu_ms and 0 < run.cpu_ms < 5_000
    assert 50 * 2**20 < run.peak_rss < 8 * 2**30
    if run.target.db:  # polar: every call captured, in its session; bytes per unique token of a real DB
        rows = list(CaptureReader(run.target.db).calls(with_tokens=False))
        mine = [r for r in rows if r["stream"] == run.stream]  # both modes' sessions share the database
        assert [r["status"] for r in mine] == ["ok"] * (SESSIONS * TURNS + 1)  # + the warm-up call
        assert len({r["session_id"] for r in mine}) == SESSIONS + 1
        assert run.context > first_request_tokens
        assert 1 < run.db_bytes / run.tokens < 200


def test_every_api_through_polar_and_direct(tokenizer_dir, tmp_path, capsys, monkeypatch):
    bench = load_script(monkeypatch, "bench_agent")
    monkeypatch.setenv("COLUMNS", "300")
    runs = tiny(bench, tokenizer_dir, tmp_path, "--cli", *ONE_PER_API, "--targets", "direct", "polar", "polar-chat")
    out = capsys.readouterr().out
    got = [(r.cli, r.stream, r.target.name) for r in runs]
    # direct only where the upstream speaks the format: OpenAI Chat.
    assert got == [(cli, stream, target) for cli in ONE_PER_API for stream in (False, True)
                   for target in (["direct"] if cli == "qwen_code" else []) + ["polar", "polar-chat"]]
    for run in runs:
        check_run(run)
    assert re.search(r"\| claude_code +\| Anthropic Messages +\| no +\| polar ", out)
    assert "python scripts/bench_agent.py --sessions 2" in out
    assert "direct: only the OpenAI Chat format" in out


def test_litellm_takes_every_format(tokenizer_dir, tmp_path, capsys, monkeypatch):
    """LiteLLM on its own route for each API (Responses bridged to chat completions), streamed: ratios against it."""
    if not with_litellm():
        pytest.skip("no LiteLLM venv (scripts/setup_litellm.sh)")
    bench = load_script(monkeypatch, "bench_agent")
    runs = tiny(bench, tokenizer_dir, tmp_path, "--cli", *ONE_PER_API, "--stream", "yes", "--targets", "polar", "litellm")
    assert [(r.cli, r.target.name) for r in runs] == [(cli, t) for cli in ONE_PER_API for t in ("polar", "litellm")]
    for run in runs:
        check_run(run)
    assert "CPU ÷ LiteLLM" in capsys.readouterr().out


def test_larger_tool_results_through_a_segment_cached_upstream(tokenizer_dir, tmp_path, monkeypatch):
    """--tool-bytes grows each turn by that much tool output; --segment-cache has the upstream tokenize what is
    new only, giving the ids of the whole prompt: each session's first prompt, ids from the upstream in chat mode
    and from polar's own rendering token-faithful, is the same."""
    bench = load_script(monkeypatch, "bench_agent")
    runs = tiny(bench, tokenizer_dir, tmp_path, "--cli", "claude_code", "--stream", "no", "--targets", "polar",
                "polar-chat", "--tool-bytes", "6000", "--segment-cache")
    small = tiny(bench, tokenizer_dir, tmp_path / "small", "--cli", "claude_code", "--stream", "no",
                 "--targets", "polar")
    for run in runs:
        check_run(run)
    # Each of the first TURNS - 1 turns adds ~4,000 more bytes of tool output than at the default 2 KB.
    assert runs[0].context - small[0].context > (TURNS - 1) * 1_000
    first = {}
    for run in runs:
        rows = [r for r in CaptureReader(run.target.db).calls() if r["status"] == "ok"]
        firsts = {r["session_id"]: r["prompt_ids"] for r in reversed(rows)}  # each session's first call
        first[run.target.name] = sorted(tuple(ids) for ids in firsts.values())
    assert first["polar"] == first["polar-chat"] and len(first["polar"]) == SESSIONS + 1


def test_the_agents_recorded_requests_replay(tokenizer_dir, tmp_path, monkeypatch):
    """OpenClaw's, Hermes Agent's, mini-swe-agent's and OpenHands' real first requests (all OpenAI Chat), replayed
    through polar and straight to the upstream, in both stream modes."""
    bench = load_script(monkeypatch, "bench_agent")
    agents = ["openclaw", "hermes", "mini_swe_agent", "openhands"]
    runs = tiny(bench, tokenizer_dir, tmp_path, "--cli", *agents, "--targets", "direct", "polar")
    assert [(r.cli, r.stream, r.target.name) for r in runs] == [
        (cli, stream, target) for cli in agents for stream in (False, True) for target in ("direct", "polar")]
    for run in runs:
        check_run(run)
