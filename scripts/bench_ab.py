#!/usr/bin/env python3
"""Benchmark: `polar proxy` from several revisions side by side, the same small call, interleaved rounds.

Each REV (a commit, a branch, or `.` for the working tree) is checked out into a temporary git worktree and
run as its own `polar proxy` (chat-template mode, captures synchronous=FULL) against one upstream
(scripts/bench_upstream.py), beside direct; every round measures each target once (--requests calls from
--clients clients, bench_proxy.measure), so a burst of the host's other tenants falls on all alike.
Reported per revision: the medians over rounds of added p50 (target p50 - direct p50 in the same round),
CPU per call and req/s; and against the first revision, the median and range of the per-round
differences (the figure to read on a shared host, where p50s move by 1-2 ms within minutes).

    python scripts/bench_ab.py cce3796 HEAD [--rounds 10] [--requests 300] [--clients 1] [--stream]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_proxy as core  # noqa: E402


def checkout(rev: str, into: Path) -> Path:
    """A worktree of `rev` (the working tree itself for '.')."""
    if rev == ".":
        return core.REPO
    subprocess.run(["git", "-C", str(core.REPO), "worktree", "add", "--detach", "-q", str(into), rev], check=True)
    return into


def polar_at(tree: Path, name: str, workdir: Path, upstream: core.Service) -> core.Target:
    port = core.free_port()
    cmd = [sys.executable, "-m", "polar.cli", "proxy", "--upstream", core.upstream_url(upstream), "--port", str(port),
           "--db", str(workdir / f"captures-{name}.db"), "--set", "polar_db_sync=FULL"]
    # cwd = the tree: `-m polar.cli` imports that tree's polar, whatever the venv has installed
    proxy = core.Service(name, cmd, f"http://127.0.0.1:{port}/", workdir / f"polar-{name}.log", cwd=tree,
                         env={"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}).start()
    return core.Target(name, f"{proxy.health_url}v1/messages", core.ANTHROPIC_BODY, core.ANTHROPIC_HEADERS, proxy)


def main(argv: list[str] | None = None) -> dict[str, list[core.Cell]]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("revs", nargs="+", help="revisions to compare, the first the baseline ('.' = the working tree)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--requests", type=int, default=300, help="calls per target per round")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--stream", action="store_true")
    ap.add_argument("--tokenizer", default=str(core.DEFAULT_TOKENIZER))
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args(argv)
    console = Console(width=200)
    trees: list[Path] = []
    services: list[core.Service] = []
    rounds: dict[str, list[core.Cell]] = {}
    with tempfile.TemporaryDirectory(prefix="polar-bench-ab-") as tmp:
        work = Path(tmp)
        try:
            upstream = core.start_upstream(work, args.tokenizer)
            services.append(upstream)
            targets = [core.direct_target(upstream)]
            for i, rev in enumerate(args.revs):
                tree = checkout(rev, work / f"tree{i}")
                trees.append(tree)
                targets.append(polar_at(tree, f"{i}:{rev}", work, upstream))
                services.append(targets[-1].proxy)
            core.check_targets(targets)
            rounds = {t.name: [] for t in targets}
            for r in range(args.rounds):
                for target in targets:
                    rounds[target.name].append(core.measure(target, upstream, args.stream, args.clients, args.requests))
                added = "  ".join(f"{t.name} {rounds[t.name][-1].pct(50) - rounds['direct'][-1].pct(50):.2f}"
                                  for t in targets[1:])
                console.print(f"[dim]round {r + 1}: added p50 ms {added}[/dim]")
        finally:
            for service in reversed(services):
                service.stop()
            for tree in trees:
                if tree != core.REPO:
                    subprocess.run(["git", "-C", str(core.REPO), "worktree", "remove", "--force", str(tree)], check=False)
    direct = rounds["direct"]
    names = [n for n in rounds if n != "direct"]

    def added(name: str) -> list[float]:
        return [c.pct(50) - d.pct(50) for c, d in zip(rounds[name], direct)]

    def cpu(name: str) -> list[float]:
        return [c.cpu_ms(c.proxy_cpu) or 0.0 for c in rounds[name]]

    table = Table(title=f"polar by revision, {'streamed' if args.stream else 'non-streamed'}, {args.clients} "
                        f"client(s), {args.rounds} rounds x {args.requests} calls, targets taking turns",
                  box=box.MARKDOWN if args.markdown else box.SIMPLE)
    for col in ("revision", "added p50 ms", "CPU ms/call", "req/s", f"Δ added vs {names[0]}", "Δ range", "Δ CPU"):
        table.add_column(col, justify="left" if col == "revision" else "right")
    for name in names:
        row = [name, f"{statistics.median(added(name)):.2f}", f"{statistics.median(cpu(name)):.2f}",
               f"{statistics.median(c.rps for c in rounds[name]):.0f}"]
        if name == names[0]:
            row += ["–", "–", "–"]
        else:
            delta = sorted(a - b for a, b in zip(added(name), added(names[0])))
            dcpu = [a - b for a, b in zip(cpu(name), cpu(names[0]))]
            row += [f"{statistics.median(delta):+.2f}", f"{delta[0]:+.2f}..{delta[-1]:+.2f}",
                    f"{statistics.median(dcpu):+.2f}"]
        table.add_row(*row)
    console.print(table)
    console.print(f"direct: p50 {statistics.median(c.pct(50) for c in direct):.2f} ms (median of rounds)")
    console.print(f"command: python scripts/bench_ab.py {' '.join(argv if argv is not None else sys.argv[1:])}")
    return rounds


if __name__ == "__main__":
    main()
