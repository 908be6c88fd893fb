"""The proxy, streaming and store benchmark scripts at a tiny scale: real processes, real store, the tables they print.

No timing is asserted (that is what the scripts are for); these check that every target is wired to
the same upstream, answers without errors, and lands in the table as a row.
LiteLLM needs its own venv (scripts/setup_litellm.sh): POLAR_BENCH_LITELLM=1 requires it, =0 leaves it
out, unset uses it when that venv is already in the cache.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.support.scripts import load_script
from tests.support.scripts import with_litellm as _with_litellm

pytestmark = pytest.mark.slow

CLK_TCK = os.sysconf("SC_CLK_TCK")


def _check_cells(cells, targets: list[str], rounds: int = 1) -> None:
    got = [(c.stream, c.clients, c.target) for c in cells]
    assert got == [(s, 1, t) for s in (False, True) for t in targets]
    for c in cells:
        assert c.errors == [] and c.ok == 5, (c.target, c.errors)
        assert (c.proxy_cpu is None) == (c.target == "direct")
        assert (c.main_thread_cpu is None) == (c.target == "direct")
        if c.main_thread_cpu is not None:
            # one thread's share of the process, in whole clock ticks: the kernel truncates each total to a tick
            # (so a difference of two reads is a tick off either way, for each of the two) and the thread is read a
            # moment after the process: three ticks' slack a round (CI saw two in one round)
            thread, process = (round(cpu * CLK_TCK) for cpu in (c.main_thread_cpu, c.proxy_cpu))
            assert 0 <= thread <= process + 3 * rounds, (c.target, c.main_thread_cpu, c.proxy_cpu)


def test_bench_proxy_tiny(tokenizer_dir, capsys, monkeypatch):
    bench = load_script(monkeypatch, "bench_proxy")
    cells = bench.main(["--requests", "5", "--concurrency", "1", "--rounds", "2", "--mitmdump", "--floor",
                        "--tokenizer", str(tokenizer_dir)])
    out = capsys.readouterr().out

    # mitmdump: plain mitmproxy; the two floors: polar's own mitmproxy answering itself and relaying upstream
    _check_cells(cells, ["direct", "mitmdump", "mitm answers", "mitm relay", "polar"], rounds=2)
    assert "polar vs direct upstream" in out
    for column in ("added p50 ms", "req/s vs direct", "proxy CPU ms/req", "· main thread", "upstream CPU ms/req"):
        assert column in out, column
    assert "target: polar adds <= 3 ms p50 at 1 client (non-streamed)" in out
    assert "mitmdump (reverse proxy, its default addons, no script) adds" in out
    assert "floor: polar's mitmproxy answering from memory adds" in out and "polar's own work (detect, translate" in out
    assert "command: python scripts/bench_proxy.py --requests 5 --concurrency 1 --rounds 2" in out and "load average" in out
    assert "% of CPU time during the run" in out  # the hypervisor's steal over the run, beside the ms it may move
    # direct, polar (streamed or not) and the warm-ups all asked the upstream the same thing: one distinct body
    assert "(1 distinct request body)" in out


def test_rounds_interleave_the_targets_and_merge_into_one_cell(monkeypatch):
    """--rounds: each cell's requests in parts the targets take turns at (a host's burst falls on all alike),
    merged back into one cell per target: every latency, the time and the CPU summed."""
    load_script(monkeypatch, "bench_proxy")  # scripts/ on the path: the harness the benchmarks share
    from benchkit import load
    from benchkit import targets as kit

    order = []

    def measure(target, upstream, stream, clients, n):
        order.append((target.name, n))
        latency = 0.001 * (len(order))
        cpu = None if target.name == "direct" else 0.5
        return load.Cell(target.name, stream, clients, [latency] * n, [], 1.0, cpu, 0.25, cpu)

    monkeypatch.setattr(load, "measure", measure)
    targets = [kit.Target("direct", "", {}, {}), kit.Target("polar", "", {}, {})]
    cells = load.run_matrix(targets, None, [1, 64], [False], 300, rounds=3)
    assert order[:6] == [("direct", 100), ("polar", 100)] * 3
    assert order[6:] == [("direct", 150), ("polar", 150)] * 2  # 64 clients: parts of at least two calls a client
    polar = cells[1]
    assert polar.ok == 300 and polar.wall == 3.0 and polar.proxy_cpu == 1.5 and polar.upstream_cpu == 0.75
    assert sorted(set(polar.latencies)) == [0.002, 0.004, 0.006] and cells[0].proxy_cpu is None


def test_bench_upstream_client_tiny(tokenizer_dir, capsys, monkeypatch):
    bench = load_script(monkeypatch, "bench_upstream_client")
    got = bench.main(["--requests", "20", "--rounds", "2", "--tokenizer", str(tokenizer_dir)])
    out = capsys.readouterr().out
    assert set(got) == {"polar h1", "aiohttp"} and all(len(rounds) == 2 for rounds in got.values())
    assert all(cpu > 0 and wall > 0 for rounds in got.values() for cpu, wall in rounds)
    assert "÷ aiohttp" in out and "command: python scripts/bench_upstream_client.py --requests 20" in out


def test_bench_ab_tiny(tokenizer_dir, capsys, monkeypatch):
    """Two revisions (HEAD from a worktree, and the working tree) side by side, and the worktree removed after."""
    bench = load_script(monkeypatch, "bench_ab")
    rounds = bench.main(["HEAD", ".", "--rounds", "2", "--requests", "5", "--tokenizer", str(tokenizer_dir)])
    out = capsys.readouterr().out
    assert list(rounds) == ["direct", "0:HEAD", "1:."]
    assert all(len(cells) == 2 and all(c.ok == 5 and not c.errors for c in cells) for cells in rounds.values())
    assert "Δ added vs 0:HEAD" in out and "command: python scripts/bench_ab.py HEAD ." in out
    listed = subprocess.run(["git", "-C", str(bench.REPO), "worktree", "list"], capture_output=True, text=True)
    assert "polar-bench-ab-" not in listed.stdout


def test_bench_workers_tiny(tokenizer_dir, capsys, monkeypatch):
    bench = load_script(monkeypatch, "bench_workers")
    cells = bench.main(["--requests", "8", "--concurrency", "4", "--stream", "both", "--tokenizer", str(tokenizer_dir)])
    out = capsys.readouterr().out

    assert [(c.stream, c.target) for c in cells] == [(s, t) for s in (False, True) for t in ("direct", "polar", "polar ×2")]
    for c in cells:
        assert c.errors == [] and c.ok == 16, (c.target, c.errors)
    front = [c.front_cpu for c in cells if c.target == "polar ×2"]
    assert all(cpu is not None for cpu in front)  # haproxy's own CPU was found and read
    for column in ("vs 1 process", "of which front", "load gen CPU ms/call"):
        assert column in out, column
    assert "target: polar ×2 ≥ 1.6× one process (non-streamed, 4 clients)" in out
    assert "sessions per worker shard — w0: " in out and "command: python scripts/bench_workers.py" in out


def test_cpu_budget_caps_a_process(monkeypatch):
    """A process given 0.1 cores by scripts/cpu_budget.py is throttled by the kernel, and closing the
    budget moves it back and removes the group. (Root, as CI runs; the kernel's counters, not a timing.)"""
    import time

    budget = load_script(monkeypatch, "cpu_budget")
    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        with budget.CpuBudgets(prefix="polar-test") as budgets:
            group = budgets.limit("spin", [spinner.pid], 0.1)
            assert (group / "cgroup.procs").read_text().split() == [str(spinner.pid)]
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                stat = dict(line.split() for line in (group / "cpu.stat").read_text().splitlines())
                if int(stat["nr_throttled"]) > 0:
                    break
                time.sleep(0.1)
            assert int(stat["nr_throttled"]) > 0, stat
        assert not group.exists()
    finally:
        spinner.kill()
        spinner.wait()


def test_cpu_budget_removes_groups_a_killed_run_left(monkeypatch):
    """kill -9 skips close: the next run removes the dead run's empty groups, not a live run's."""

    budget = load_script(monkeypatch, "cpu_budget")
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    with budget.CpuBudgets(prefix="polar-test") as live:
        mine = live.limit("w0", [], 0.5)
        orphan = live.root / f"polar-test-{dead.pid}-w0"
        orphan.mkdir()
        with budget.CpuBudgets(prefix="polar-test"):
            assert not orphan.exists() and mine.exists()


def test_bench_workers_with_cpu_budget(tokenizer_dir, capsys, monkeypatch):
    bench = load_script(monkeypatch, "bench_workers")
    cells = bench.main(["--requests", "8", "--concurrency", "4", "--cpu-per-worker", "1",
                        "--tokenizer", str(tokenizer_dir)])
    out = capsys.readouterr().out

    assert [c.target for c in cells] == ["direct", "polar", "polar ×2"]
    assert all(c.errors == [] and c.ok == 16 for c in cells)  # cell_requests: at least 4 a client
    assert "CPU budget: 1 cores (cgroup quota) for the one polar process and for each of 2 workers" in out
    assert "each gateway process capped at 1 cores" in out


def test_bench_peers_tiny(tokenizer_dir, capsys, monkeypatch):
    bench = load_script(monkeypatch, "bench_peers")
    litellm = _with_litellm()
    args = ["--requests", "5", "--concurrency", "1", "--rounds", "1", "--tokenizer", str(tokenizer_dir)]
    cells = bench.main(args + ([] if litellm else ["--no-litellm"]))
    out = capsys.readouterr().out

    _check_cells(cells, ["direct", "polar", *(["litellm"] if litellm else [])])
    assert "vs direct upstream (1 process each" in out
    assert "target: polar adds <= 3 ms p50 at 1 client (non-streamed)" in out
    if litellm:  # the latency polar adds as a share of LiteLLM's: what a slower or faster host moves less
        assert "x what litellm adds)" in out
    assert "(1 distinct request body)" in out  # LiteLLM too sends polar's exact upstream request


def test_bench_stream_tiny(tokenizer_dir, capsys, monkeypatch):
    bench = load_script(monkeypatch, "bench_stream")
    litellm = _with_litellm()
    args = ["--requests", "3", "--concurrency", "1", "--rounds", "2", "--answer-tokens", "12", "--token-delay-ms", "2",
            "--first-token-delay-ms", "5", "--tokenizer", str(tokenizer_dir)]
    rows = bench.main(args + ([] if litellm else ["--no-litellm"]))
    out = capsys.readouterr().out

    names = ["direct chat", "direct generate", "polar chat", "polar token-faithful", *(["litellm"] if litellm else [])]
    assert [(r.cell.clients, r.cell.target.name) for r in rows] == [(1, name) for name in names]
    for r in rows:
        direct = r.cell.target.name.startswith("direct")
        assert r.cell.errors == [] and len(r.cell.calls) == 4, (r.cell.target.name, r.cell.errors)  # 4 per client
        assert (r.cell.proxy_cpu is None) == direct
        assert (r.ttft_added is None) == direct and (r.chunk_added is None) == direct
        assert all(c.marks and c.ttft <= c.total for c in r.cell.calls)
    # every target streamed the same answer: the same number of sampled tokens in every call
    assert len({t for r in rows for t in r.tokens}) == 1 and "every call of every target sampled the same" in out
    assert "Streaming: polar" in out
    for column in bench.COLUMNS + bench.SPLIT_COLUMNS:
        assert column in out, column
    assert "Where the time to first token goes at 1 client" in out
    assert "target: polar adds ≤ 5 ms p50 TTFT at one client: " in out
    assert "command: python scripts/bench_stream.py --requests 3" in out and "load average" in out


def test_bench_store_tiny(tokenizer_dir, capsys, monkeypatch):
    bench = load_script(monkeypatch, "bench_store")
    rates, prints = bench.main(["--sessions", "1", "3", "--rows", "5", "--session-size", "1k", "--turns", "3",
                                "--sizes", "1k", "2k", "--tokenizer", str(tokenizer_dir)])
    out = capsys.readouterr().out

    assert [(r.sync, r.sessions) for r in rates] == [("FULL", 1), ("NORMAL", 1), ("FULL", 3), ("NORMAL", 3)]
    # whole sessions of 3 calls, as many as reach --rows: 2 rounds for one writer, 1 each for three
    assert [r.rows for r in rates] == [6, 6, 9, 9]
    assert all(r.db_bytes > 0 for r in rates)
    assert [(f.size, f.calls) for f in prints] == [(1024, 3), (2048, 3)]
    for f in prints:
        assert f.tokens > 0 and f.used_bytes <= f.file_bytes
        assert f.parts["token cols"] > 0 and f.parts["messages"] > 0
    # Used bytes are whole pages: with bodies and responses compressed, both tiny sessions may fill as many.
    assert prints[1].used_bytes >= prints[0].used_bytes
    assert sum(prints[1].parts.values()) > sum(prints[0].parts.values())
    for title in ("Capture store write rate", "Capture store bytes per session"):
        assert title in out
    for column in ("rows/s", "commit p50 ms", "CPU ms/row", "used B/token", "request bodies", "canonical refs"):
        assert column in out, column
