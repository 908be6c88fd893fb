"""Benchmark the rollout pools: RUNNING-slot occupancy and sessions/hour, READY buffer vs sequential.

Both runs schedule the same sessions with the same node code (`GatewayNode`) on simulated stages:
INIT (start a sandbox, prepare the repo, prewarm the evaluator) and POSTRUN (evaluate, tear down)
take tens of seconds; harness runs are heavy-tailed (log-normal, capped at the deadline). The
baseline gives each RUNNING slot the whole INIT→RUN→POSTRUN chain; the pipelined node keeps warm
sessions in the READY buffer so slots only ever run harnesses.

Occupancy is busy slot-time over available slot-time. `steady` counts until the last session
starts running (a trainer that keeps submitting never reaches the drain-out); `overall` includes
the final drain-out, where slots idle waiting for the longest tails.

    python scripts/bench_rollout.py --sessions 400 --slots 8
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchkit import args as cli  # noqa: E402
from benchkit.report import Run, table  # noqa: E402

from polar.rollout.node import GatewayNode, HarnessRun, NodeConfig  # noqa: E402
from polar.rollout.simulate import SimulatedPhases, heavy_tailed_run  # noqa: E402
from polar.rollout.tasks import SessionSpec, TaskSpec  # noqa: E402


class Timed(SimulatedPhases):
    """Simulated phases that record when each harness run starts and ends."""

    def __init__(self, scale: float):
        super().__init__(scale)
        self.runs: list[tuple[float, float]] = []

    async def run(self, spec: SessionSpec, timeout: float) -> HarnessRun:
        start = time.monotonic()
        try:
            return await super().run(spec, timeout)
        finally:
            self.runs.append((start, time.monotonic()))


def make_sessions(n: int, seed: int, run_median: float, timeout: float) -> list[SessionSpec]:
    rng = random.Random(seed)
    specs = []
    for i in range(n):
        sim = {"init": rng.uniform(20, 40), "postrun": rng.uniform(15, 30),
               "run": heavy_tailed_run(rng, run_median, sigma=1.0, cap=timeout * 1.2)}
        task = TaskSpec(id=f"bench-{i}", instruction="simulated", timeout=timeout, metadata={"sim": sim})
        specs += SessionSpec.expand(task)
    return specs


def occupancy(runs: list[tuple[float, float]], slots: int, start: float, end: float) -> float:
    busy = sum(max(0.0, min(e, end) - max(s, start)) for s, e in runs)
    return busy / (slots * (end - start)) if end > start else 0.0


async def run_node(specs: list[SessionSpec], config: NodeConfig, scale: float) -> dict[str, Any]:
    phases = Timed(scale)
    node = GatewayNode(phases, config)
    start = time.monotonic()
    node.start()
    for spec in specs:
        node.submit(spec)
    done = 0
    while done < len(specs):
        done += sum(kind == "result" for kind, _ in await node.next_events(1.0))
    end = time.monotonic()
    await node.stop()
    last_start = max(s for s, _ in phases.runs)
    simulated_hours = (end - start) / scale / 3600
    return {"occupancy_steady": occupancy(phases.runs, config.running_slots, start, last_start),
            "occupancy_overall": occupancy(phases.runs, config.running_slots, start, end),
            "sessions_per_hour": len(specs) / simulated_hours, "wall_seconds": end - start}


def bench(sessions: int = 400, slots: int = 8, init_workers: int = 4, ready: int = 8, postrun_workers: int = 4,
          run_median: float = 60.0, timeout: float = 600.0, scale: float = 0.002, seed: int = 0) -> dict[str, Any]:
    specs = make_sessions(sessions, seed, run_median, timeout)
    pipelined = NodeConfig(init_workers=init_workers, ready_size=ready, running_slots=slots,
                           postrun_workers=postrun_workers, kill_grace=1.0)
    sequential = NodeConfig(running_slots=slots, pipelined=False, kill_grace=1.0)
    with_buffer = asyncio.run(run_node(specs, pipelined, scale))
    baseline = asyncio.run(run_node(specs, sequential, scale))
    return {
        "sessions": sessions, "running_slots": slots,
        "ready_buffer": with_buffer, "sequential": baseline,
        "throughput_ratio": with_buffer["sessions_per_hour"] / baseline["sessions_per_hour"],
        "occupancy_target_met": with_buffer["occupancy_steady"] >= 0.9,
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = cli.parser(__doc__)
    parser.add_argument("--sessions", type=int, default=400)
    parser.add_argument("--slots", type=int, default=8)
    parser.add_argument("--init-workers", type=int, default=4)
    parser.add_argument("--ready", type=int, default=8)
    parser.add_argument("--postrun-workers", type=int, default=4)
    parser.add_argument("--run-median", type=float, default=60.0, help="median simulated harness seconds")
    parser.add_argument("--scale", type=float, default=0.002, help="wall seconds per simulated second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true")
    cli.markdown_arg(parser)
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parser.parse_args(argv)
    run = Run("bench_rollout.py", argv)
    out = bench(a.sessions, a.slots, a.init_workers, a.ready, a.postrun_workers, a.run_median,
                scale=a.scale, seed=a.seed)
    if a.json:
        print(json.dumps(out, indent=2))
        return out
    rows = table(f"Rollout pools: {a.sessions} simulated sessions, {a.slots} RUNNING slots",
                 ("node", "occupancy steady", "occupancy overall", "sessions/h", "wall s"), left=("node",))
    for name in ("ready_buffer", "sequential"):
        r = out[name]
        rows.add_row(name, f"{r['occupancy_steady']:.1%}", f"{r['occupancy_overall']:.1%}",
                     f"{r['sessions_per_hour']:.0f}", f"{r['wall_seconds']:.1f}")
    run.report(rows, [f"throughput ratio (READY buffer / sequential): {out['throughput_ratio']:.2f}x; occupancy "
                      f"target 90% {'met' if out['occupancy_target_met'] else 'NOT met'}"], a.markdown)
    return out


if __name__ == "__main__":
    main()
