#!/usr/bin/env python3
"""Benchmark: `polar proxy --workers N` against one polar process, same upstream, one run.

Columns, side by side at each concurrency, from one load generator (this process), against one upstream
(scripts/bench_upstream.py: the scripted double behind an answer cache):
  direct       — the OpenAI chat call straight to the upstream (what polar sends it);
  polar        — the Anthropic Messages call through `polar proxy`, one process;
  polar ×N     — the same through `polar proxy --workers N`: haproxy in front, N gateway processes.
Every client is a session of its own (`/s/bench-<i>/` base URL) for both polar columns, so the front
spreads the clients over the workers by session, as it would agents.
CPU per call is read from /proc for every process: polar's (all its processes), the front's (haproxy)
alone, the upstream's and the load generator's. On a 2-core machine those four share the cores, so
the ratio is bounded by the CPU left over, not by polar: the table says where the CPU went.
--cpu-per-worker C (root) gives the one polar process and each of the N workers the same budget of C
cores (a cgroup CPU quota, scripts/cpu_budget.py), the rest of the machine left to the load generator,
the upstream and the front: the shape of a node whose gateway workers each have a core of their own.

    python scripts/bench_workers.py [--workers 2] [--requests 2000] [--concurrency 64] [--stream no]
                                    [--cpu-per-worker 0.5] [--markdown]
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import args as cli  # noqa: E402
from benchkit.load import Cell, run_matrix, streams_of  # noqa: E402
from benchkit.report import Run, call_columns, cells_table, cpu_column  # noqa: E402
from benchkit.targets import (  # noqa: E402
    Service,
    anthropic_target,
    check_targets,
    descendants,
    direct_target,
    polar_target,
    start_upstream,
    start_workers,
    upstream_stats,
    worker_pids,
    workers_target,
)
from cpu_budget import CpuBudgets  # noqa: E402

from polar.capture.shards import shard_path  # noqa: E402


def budget(budgets: CpuBudgets, one: Service, workers: Service, cores: float) -> str:
    """One polar process and each worker (with whatever it started) capped at `cores`."""
    budgets.limit("single", [one.proc.pid, *descendants(one.proc.pid)], cores)
    pids = worker_pids(workers)
    for i, pid in enumerate(pids):
        budgets.limit(f"w{i}", [pid, *descendants(pid)], cores)
    return f"CPU budget: {cores:g} cores (cgroup quota) for the one polar process and for each of {len(pids)} workers"


def results_table(cells: list[Cell], title: str, single: str) -> Table:
    by = {(c.target, c.stream, c.clients): c for c in cells}
    cores = os.cpu_count() or 1

    def versus_one(c: Cell, _: Cell | None) -> str:
        one = by.get((single, c.stream, c.clients))
        return "–" if c.proxy_cpu is None or c is one else f"{c.rps / one.rps:.2f}"

    def busy(c: Cell, _: Cell | None) -> str:
        used = sum(x or 0.0 for x in (c.proxy_cpu, c.upstream_cpu, c.load_cpu))
        return f"{used / c.wall / cores if c.wall else 0.0:.0%}"

    return cells_table(cells, title, [
        *call_columns("calls", "calls/s", "vs direct"), ("vs 1 process", versus_one),
        cpu_column("polar CPU ms/call", lambda c: c.proxy_cpu), cpu_column("of which front", lambda c: c.front_cpu),
        cpu_column("upstream CPU ms/call", lambda c: c.upstream_cpu),
        cpu_column("load gen CPU ms/call", lambda c: c.load_cpu), ("CPU busy", busy)])


def target_lines(cells: list[Cell], single: str, multi: str, count: int) -> list[str]:
    """The issue's target (≥ 0.8·N× one process) and what one front feeds, read off the cells."""
    by = {(c.target, c.stream, c.clients): c for c in cells}
    lines = []
    for c in cells:
        one = by.get((single, c.stream, c.clients))
        if c.target != multi or one is None or not one.rps:
            continue
        ratio = c.rps / one.rps
        lines.append(f"target: {multi} ≥ {0.8 * count:.1f}× one process ({'streamed' if c.stream else 'non-streamed'}, "
                     f"{c.clients} clients): {ratio:.2f}× — {'met' if ratio >= 0.8 * count else 'NOT met'}")
        worker_ms = c.cpu_ms((c.proxy_cpu or 0.0) - (c.front_cpu or 0.0)) or 0.0
        front_ms = c.cpu_ms(c.front_cpu)
        if front_ms:
            lines.append(f"  per call: workers {worker_ms:.2f} ms CPU, front {front_ms:.3f} ms: one core of front "
                         f"feeds {1000 / front_ms:.0f} calls/s ≈ {worker_ms / front_ms:.0f} worker cores at this call shape")
    return lines


def shard_split(db: Path, count: int) -> str:
    from polar.capture.reader import CaptureReader

    sessions = []
    for i in range(count):
        rows = list(CaptureReader(shard_path(db, i)).calls(with_tokens=False))
        sessions.append(f"w{i}: {len({r['session_id'] for r in rows})} sessions / {len(rows)} calls")
    return "sessions per worker shard — " + ", ".join(sessions)


def main(argv: Sequence[str] | None = None) -> list[Cell]:
    ap = cli.parser(__doc__)
    cli.common_args(ap)
    ap.add_argument("--workers", type=int, default=2, help="gateway processes behind the front")
    ap.add_argument("--cpu-per-worker", type=float, default=None, metavar="CORES",
                    help="cap the one polar process and each worker at this many cores (cgroup quota; root)")
    ap.set_defaults(concurrency=[64], stream="no", requests=2000)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    cli.check_args(ap, args)
    if args.workers < 2:
        ap.error("--workers must be at least 2")
    if args.cpu_per_worker is not None and not 0 < args.cpu_per_worker <= (os.cpu_count() or 1):
        ap.error(f"--cpu-per-worker must be in (0, {os.cpu_count()}]")
    single, multi = "polar", f"polar ×{args.workers}"
    budgets, budget_line = CpuBudgets() if args.cpu_per_worker else None, None
    with Run("bench_workers.py", argv, width=260) as run:
        try:
            upstream = run.start(start_upstream(run.work, args.tokenizer))
            one = run.add(polar_target(run.work, upstream, args.sync[0], single))
            front = run.start(start_workers(run.work, upstream, args.sync[0], args.workers))
            if budgets:
                budget_line = budget(budgets, one.proxy, front, args.cpu_per_worker)
            targets = [direct_target(upstream), anthropic_target(single, one.proxy, session_per_client=True),
                       workers_target(multi, front)]
            check_targets(targets)
            cells = run_matrix(targets, upstream, args.concurrency, streams_of(args.stream), args.requests, run.progress)
            split = shard_split(run.work / "captures-workers.db", args.workers)
            stats = upstream_stats(upstream)
        finally:
            run.stop()  # before their budgets go
            if budgets:
                budgets.close()
    shared = (f"each gateway process capped at {args.cpu_per_worker:g} cores" if budgets else
              "shared by load generator, proxies and upstream")
    title = (f"polar ×{args.workers} (haproxy front) vs one polar process vs direct (captures synchronous="
             f"{args.sync[0]}; {os.cpu_count()} cores, {shared})")
    notes = [*target_lines(cells, single, multi, args.workers), split, stats, *([budget_line] if budget_line else [])]
    run.report(results_table(cells, title, single), notes, args.markdown)
    return cells


if __name__ == "__main__":
    main()
