"""scripts/bench.py: one entry point that runs any scripts/bench_*.py with its own flags."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import REPO

BENCH = [sys.executable, str(REPO / "scripts" / "bench.py")]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([*BENCH, *args], capture_output=True, text=True, cwd=REPO, timeout=120)


def test_lists_every_benchmark_script():
    listed = _run("--list").stdout.split()
    assert listed == sorted(p.stem.removeprefix("bench_") for p in (REPO / "scripts").glob("bench_*.py"))
    assert {"proxy", "peers", "ab", "workers", "stream", "agent", "storage", "store", "tokens", "rollout"} <= set(listed)
    helped = _run("--help").stdout.split("benchmarks:\n", 1)[1].splitlines()
    assert [line.split()[0] for line in helped] == listed  # each with its docstring's first line
    assert any(line.split()[0] == "stream" and "time to first token" in line for line in helped)


def test_runs_a_benchmark_with_its_flags():
    """The rollout pools' benchmark at a tiny scale, through the entry point: its own flags, its own output."""
    out = _run("rollout", "--sessions", "8", "--slots", "2", "--scale", "0.0002", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["sessions"] == 8 and result["running_slots"] == 2 and result["throughput_ratio"] > 0
    usage = _run("peers", "--help")
    assert usage.returncode == 0 and "--litellm-plain" in usage.stdout and "--floor" in usage.stdout


def test_an_unknown_benchmark_is_named_with_the_known_ones():
    out = _run("nope")
    assert out.returncode == 2 and "no benchmark 'nope'" in out.stderr and "peers" in out.stderr
