"""Sessions that only take time: the benchmark's and the scheduling tests' stand-in for real work.

Each stage sleeps for what the task's `metadata["sim"]` says ({"init": s, "run": s, "postrun": s,
"reward": x, "fail": "init" | "run" | "postrun"}); a run longer than the task's timeout is cut
there and reported timed out, as a runtime would. Plain data in, plain data out, so it also runs
inside Ray actors.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

from polar.rollout.node import HarnessRun
from polar.rollout.tasks import SessionResult, SessionSpec


class SimulatedPhases:
    def __init__(self, scale: float = 1.0):
        self.scale = scale  # wall seconds per simulated second

    @staticmethod
    def _sim(spec: SessionSpec) -> dict[str, Any]:
        return spec.task.metadata.get("sim", {})

    async def _stage(self, spec: SessionSpec, stage: str) -> None:
        sim = self._sim(spec)
        await asyncio.sleep(float(sim.get(stage, 0.0)) * self.scale)
        if sim.get("fail") == stage:
            raise RuntimeError(f"simulated {stage} crash")

    async def init(self, spec: SessionSpec) -> SessionSpec:
        await self._stage(spec, "init")
        return spec

    async def run(self, spec: SessionSpec, timeout: float) -> HarnessRun:
        wanted = float(self._sim(spec).get("run", 0.0))
        if wanted > timeout:
            await asyncio.sleep(timeout * self.scale)
            return HarnessRun(exit_code=-9, timed_out=True)
        await self._stage(spec, "run")
        return HarnessRun(exit_code=0)

    async def postrun(self, spec: SessionSpec, run: HarnessRun, policy_version: int | None) -> SessionResult:
        await self._stage(spec, "postrun")
        sim = self._sim(spec)
        return SessionResult(session_id=spec.session_id, task_id=spec.task.id, sample=spec.sample,
                             outcome="timeout" if run.timed_out else "ok", partial=run.timed_out,
                             reward=float(sim.get("reward", 1.0)), policy_version=policy_version)

    async def discard(self, spec: SessionSpec) -> None:
        return None


def heavy_tailed_run(rng: random.Random, median: float, sigma: float = 1.0, cap: float | None = None) -> float:
    """A log-normal duration: most harness runs are short, a few are very long (looping agents, slow tests)."""
    value = rng.lognormvariate(0.0, sigma) * median
    return min(value, cap) if cap else value
