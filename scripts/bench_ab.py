#!/usr/bin/env python3
"""Benchmark: `polar proxy` from several revisions side by side, the same small call, interleaved rounds.

Each REV (a commit, a branch, or `.` for the working tree) is checked out into a temporary git worktree and
run as its own `polar proxy` (chat-template mode, captures synchronous=FULL) against one upstream
(scripts/bench_upstream.py), beside direct; every round measures each target once (--requests calls from
--clients clients, benchkit.load.measure), so a burst of the host's other tenants falls on all alike.
Reported per revision: the medians over rounds of added p50 (target p50 - direct p50 in the same round),
CPU per call and req/s; and against the first revision, the median and range of the per-round
differences (the figure to read on a shared host, where p50s move by 1-2 ms within minutes).

    python scripts/bench_ab.py cce3796 HEAD [--rounds 10] [--requests 300] [--clients 1] [--stream]
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import args as cli  # noqa: E402
from benchkit.load import Cell, measure  # noqa: E402
from benchkit.report import Run, table  # noqa: E402
from benchkit.targets import REPO, anthropic_target, check_targets, direct_target, start_polar, start_upstream  # noqa: E402


def checkout(rev: str, into: Path) -> Path:
    """A worktree of `rev` (the working tree itself for '.')."""
    if rev == ".":
        return REPO
    subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", str(into), rev], check=True)
    return into


def remove(trees: list[Path]) -> None:
    for tree in trees:
        if tree != REPO:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)], check=False)


def main(argv: list[str] | None = None) -> dict[str, list[Cell]]:
    ap = cli.parser(__doc__)
    ap.add_argument("revs", nargs="+", help="revisions to compare, the first the baseline ('.' = the working tree)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--requests", type=int, default=300, help="calls per target per round")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--stream", action="store_true")
    cli.tokenizer_arg(ap)
    cli.markdown_arg(ap)
    argv = list(sys.argv[1:] if argv is None else argv)
    args = ap.parse_args(argv)
    trees: list[Path] = []
    rounds: dict[str, list[Cell]] = {}
    with Run("bench_ab.py", argv, width=200) as run:
        try:
            upstream = run.start(start_upstream(run.work, args.tokenizer))
            targets = [direct_target(upstream)]
            for i, rev in enumerate(args.revs):
                trees.append(checkout(rev, run.work / f"tree{i}"))
                name = f"{i}:{rev}"
                proxy = run.start(start_polar(run.work, upstream, "FULL", name=name, tag=name, tree=trees[-1]))
                targets.append(anthropic_target(name, proxy))
            check_targets(targets)
            rounds = {t.name: [] for t in targets}
            for r in range(args.rounds):
                for target in targets:
                    rounds[target.name].append(measure(target, upstream, args.stream, args.clients, args.requests))
                added = "  ".join(f"{t.name} {rounds[t.name][-1].pct(50) - rounds['direct'][-1].pct(50):.2f}"
                                  for t in targets[1:])
                run.progress(f"round {r + 1}: added p50 ms {added}")
        finally:
            run.stop()  # before their trees go
            remove(trees)
    direct = rounds["direct"]
    names = [n for n in rounds if n != "direct"]

    def added(name: str) -> list[float]:
        return [c.pct(50) - d.pct(50) for c, d in zip(rounds[name], direct)]

    def cpu(name: str) -> list[float]:
        return [c.cpu_ms(c.proxy_cpu) or 0.0 for c in rounds[name]]

    out = table(f"polar by revision, {'streamed' if args.stream else 'non-streamed'}, {args.clients} client(s), "
                f"{args.rounds} rounds x {args.requests} calls, targets taking turns",
                ("revision", "added p50 ms", "CPU ms/call", "req/s", f"Δ added vs {names[0]}", "Δ range", "Δ CPU"),
                left=("revision",))
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
        out.add_row(*row)
    run.report(out, [f"direct: p50 {statistics.median(c.pct(50) for c in direct):.2f} ms (median of rounds)"],
               args.markdown)
    return rounds


if __name__ == "__main__":
    main()
