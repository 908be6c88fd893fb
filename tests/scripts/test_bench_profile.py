"""scripts/benchkit/profile.py against the real py-spy: a process whose time is known to sit in one function."""

from __future__ import annotations

import importlib
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO
from tests.support.scripts import load_script


def _profile(monkeypatch):
    """The harness's profiler, scripts/ on the path as the benchmarks have it."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    return importlib.import_module("benchkit.profile")


# A "request decode" that takes ~3/4 of the loop and a lighter neighbour, in a file whose path ends as polar's.
BUSY = '''
import time
def decode():
    end = time.perf_counter() + 0.003
    while time.perf_counter() < end:
        pass
def other():
    end = time.perf_counter() + 0.001
    while time.perf_counter() < end:
        pass
while True:
    decode()
    other()
'''


def test_the_profiler_finds_where_a_real_process_spends_its_time(tmp_path, monkeypatch):
    prof = _profile(monkeypatch)
    source = tmp_path / "polar" / "gateway" / "body.py"
    source.parent.mkdir(parents=True)
    source.write_text(BUSY)
    busy = subprocess.Popen([sys.executable, str(source)])
    try:
        time.sleep(0.5)
        profiler = prof.Profiler(busy.pid, tmp_path / "out" / "busy.txt", rate=250)
        time.sleep(2.0)
        profile = profiler.stop()
    finally:
        busy.kill()
        busy.wait()
    total = profile.total_ms()
    assert 1200 < total < 2600  # one busy thread holding the GIL for the ~2 s recorded
    decode = profile.part_ms("polar/gateway/body.py", "decode")
    assert 0.6 < decode / total < 0.9
    assert profile.part_ms("polar/gateway/body.py", "nothing") == 0
    own = profile.self_ms()
    assert own["decode (polar/gateway/body.py)"] == pytest.approx(decode, rel=0.05)
    assert own["other (polar/gateway/body.py)"] < decode


def test_growth_lists_what_costs_more_per_call(tmp_path, monkeypatch):
    prof = _profile(monkeypatch)
    first, last = tmp_path / "first.txt", tmp_path / "last.txt"
    stack = "<module> (/x/polar/mitm/addon.py:1);{fn} (/x/{file}:9)"
    first.write_text(f"{stack.format(fn='decode', file='polar/gateway/body.py')} 10\n"
                     f"{stack.format(fn='render', file='polar/providers/x.py')} 40\n")
    last.write_text(f"{stack.format(fn='decode', file='polar/gateway/body.py')} 60\n"
                    f"{stack.format(fn='render', file='polar/providers/x.py')} 40\n"
                    "a line py-spy did not write\n")
    a, b = prof.Profile.read(first, 100), prof.Profile.read(last, 100)
    assert a.part_ms("polar/gateway/body.py", "decode") == 100 and b.total_ms() == 1000
    rows = prof.growth(a, 10, b, 10)
    assert rows[0] == ("decode (polar/gateway/body.py)", 10.0, 60.0)
    assert rows[1] == ("render (polar/providers/x.py)", 40.0, 40.0)


@pytest.mark.slow
def test_bench_agent_profiles_each_bucket(tokenizer_dir, tmp_path, capsys, monkeypatch):
    bench = load_script(monkeypatch, "bench_agent")
    monkeypatch.setenv("COLUMNS", "300")
    runs = bench.main(["--cli", "claude_code", "--sessions", "2", "--turns", "3", "--buckets", "1", "--stream", "yes",
                       "--targets", "polar-chat", "--no-litellm", "--tokenizer", str(tokenizer_dir),
                       "--dir", str(tmp_path), "--profile", str(tmp_path / "profiles")])
    out = capsys.readouterr().out
    (run,) = runs
    assert all(b.profile is not None and b.profile.total_ms() > 0 for b in run.buckets)
    assert sorted(p.name for p in Path(tmp_path / "profiles").iterdir()) == [
        "claude_code-polar-chat-stream-t1-1.txt", "claude_code-polar-chat-stream-t2-3.txt"]
    assert "profile claude_code streamed polar-chat: CPU ms/call" in out
    assert "request JSON decode ms/call" in out and "last ÷ first" in out and "grew most" in out
