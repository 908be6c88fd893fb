"""A gateway node: sessions flow INIT → READY buffer → RUNNING → POSTRUN through separate pools.

Only RUNNING slots hold the scarce resource (harnesses talking to the inference server). INIT
workers fill a bounded READY buffer with warm sessions ahead of need, and finished harnesses hand
their session to POSTRUN through an unbounded queue, so a RUNNING slot never waits for a sandbox
to start, a repository to be prepared, an evaluator to run or a container to be torn down.

What each stage does is a `Phases` object (the real one is `polar.rollout.lifecycle.SessionPhases`;
the benchmark uses simulated durations), so the scheduling measured is the scheduling used.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

from polar.rollout.tasks import Outcome, SessionResult, SessionSpec, WatchdogOptions

log = logging.getLogger("polar.rollout.node")


@dataclass
class NodeConfig:
    name: str = "node-0"
    init_workers: int = 2
    ready_size: int = 4  # warm sessions kept ahead of the RUNNING slots
    running_slots: int = 4
    postrun_workers: int = 2
    pipelined: bool = True  # False: each slot does INIT→RUN→POSTRUN in turn (the benchmark's baseline)
    max_staleness: int | None = None  # refuse to start sessions more than K policy versions behind
    kill_grace: float = 30.0  # past a deadline, how long the runtime gets to kill the harness before the node moves on
    watchdog: WatchdogOptions | None = None  # the run's long-tail cut; a task's own options override it

    def __post_init__(self) -> None:
        sizes = {"init_workers": self.init_workers, "ready_size": self.ready_size, "running_slots": self.running_slots,
                 "postrun_workers": self.postrun_workers}
        if small := [name for name, size in sizes.items() if size < 1]:
            raise ValueError(f"{', '.join(small)} must be at least 1")


@dataclass
class HarnessRun:
    """How the harness ended."""

    exit_code: int | None = None
    timed_out: bool = False
    error: str | None = None  # the harness could not be run at all (runtime crash …)
    output_tail: str = ""
    seconds: float = 0.0


class Phases(Protocol):
    async def init(self, spec: SessionSpec) -> Any:
        """Start the sandbox and prepare everything; return the prepared session."""

    async def run(self, prepared: Any, timeout: float) -> HarnessRun:
        """Run the harness, killing it at `timeout` seconds."""

    async def postrun(self, prepared: Any, run: HarnessRun, policy_version: int | None) -> SessionResult:
        """Rebuild trajectories, evaluate, tear down (always, even when evaluation fails)."""

    async def discard(self, prepared: Any) -> None:
        """Tear down a prepared session that will not run."""


@dataclass
class _Slot:
    spec: SessionSpec
    prepared: Any = None
    timings: dict[str, float] = field(default_factory=dict)
    policy_version: int | None = None


class GatewayNode:
    def __init__(self, phases: Phases, config: NodeConfig | None = None):
        self.phases = phases
        self.config = config or NodeConfig()
        self.policy_version: int | None = None
        self._queue: asyncio.Queue[_Slot] = asyncio.Queue()
        self._ready: asyncio.Queue[_Slot] = asyncio.Queue(maxsize=max(1, self.config.ready_size))
        self._postrun: asyncio.Queue[tuple[_Slot, HarnessRun]] = asyncio.Queue()
        self._go = asyncio.Event()  # cleared while paused: no new session enters RUNNING
        self._go.set()
        self._cancelled: set[str] = set()
        self._running_slots: dict[str, _Slot] = {}  # session id → its slot, while its harness runs
        self._interrupts: set[asyncio.Task] = set()
        self._stages: dict[str, str] = {}
        self._events: list[tuple[str, Any]] = []  # ("stage", (session, stage)) | ("result", SessionResult)
        self._new_event = asyncio.Event()
        self._workers: list[asyncio.Task] = []
        self.running = 0
        self.busy_seconds = 0.0  # summed RUNNING-slot time spent in harnesses
        self.started_at: float | None = None

    # -- control ---------------------------------------------------------------------------

    def start(self) -> None:
        c = self.config
        self.started_at = time.monotonic()
        if c.pipelined:
            workers = [self._init_worker] * c.init_workers + [self._run_worker] * c.running_slots
            workers += [self._postrun_worker] * c.postrun_workers
        else:
            workers = [self._sequential_worker] * c.running_slots
        self._workers = [asyncio.create_task(w(), name=f"{c.name}-{w.__name__}") for w in workers]

    async def stop(self) -> None:
        """Stop the pools; warm sessions waiting in READY are torn down (they restart elsewhere or later)."""
        for task in self._workers:
            task.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._workers = []
        while not self._ready.empty():
            await self._quietly(self.phases.discard(self._ready.get_nowait().prepared))

    def submit(self, spec: SessionSpec) -> None:
        self._stage(spec.session_id, "queued")
        self._queue.put_nowait(_Slot(spec))

    def cancel(self, session_ids: list[str]) -> None:
        """Queued sessions never start; running ones have their harness ended now."""
        self._cancelled.update(session_ids)
        interrupt = getattr(self.phases, "interrupt", None)
        for session_id in session_ids:
            slot = self._running_slots.get(session_id)
            if slot is not None and interrupt is not None:
                task = asyncio.get_running_loop().create_task(self._quietly(interrupt(slot.prepared)))
                self._interrupts.add(task)
                task.add_done_callback(self._interrupts.discard)

    def pause(self) -> None:
        self._go.clear()

    def resume(self, policy_version: int | None = None) -> None:
        if policy_version is not None:
            self.policy_version = policy_version
        self._go.set()

    def set_policy_version(self, version: int | None) -> None:
        self.policy_version = version

    def poll(self) -> list[tuple[str, Any]]:
        """Stage changes and results since the last poll, in order (the service persists them)."""
        events, self._events = self._events, []
        self._new_event.clear()
        return events

    async def next_events(self, timeout: float = 1.0) -> list[tuple[str, Any]]:
        if not self._events:
            try:
                await asyncio.wait_for(self._new_event.wait(), timeout)
            except TimeoutError:
                pass
        return self.poll()

    def stats(self) -> dict[str, Any]:
        elapsed = time.monotonic() - self.started_at if self.started_at else 0.0
        slots = self.config.running_slots
        return {
            "node": self.config.name,
            "stages": dict(Counter(self._stages.values())),
            "running": self.running,
            "ready": self._ready.qsize(),
            "queued": self._queue.qsize(),
            "paused": not self._go.is_set(),
            "policy_version": self.policy_version,
            "occupancy": self.busy_seconds / (slots * elapsed) if elapsed and slots else 0.0,
        }

    # -- stages ----------------------------------------------------------------------------

    def _stage(self, session_id: str, stage: str) -> None:
        self._stages[session_id] = stage
        self._emit("stage", (session_id, stage))

    def _emit(self, kind: str, payload: Any) -> None:
        self._events.append((kind, payload))
        self._new_event.set()

    def _finish(self, result: SessionResult, slot: _Slot) -> None:
        self._stages.pop(slot.spec.session_id, None)
        self._cancelled.discard(slot.spec.session_id)
        result.node = self.config.name
        result.timings = {**slot.timings, **result.timings}
        self._emit("result", result)

    def _bare_result(self, slot: _Slot, outcome: Outcome, error: str | None = None) -> SessionResult:
        s = slot.spec
        return SessionResult(session_id=s.session_id, task_id=s.task.id, sample=s.sample, outcome=outcome, error=error,
                             policy_version=self.policy_version, metadata=s.task.metadata)

    async def _init(self, slot: _Slot) -> bool:
        if slot.spec.session_id in self._cancelled:
            self._finish(self._bare_result(slot, "cancelled"), slot)
            return False
        self._stage(slot.spec.session_id, "init")
        t0 = time.monotonic()
        try:
            slot.prepared = await self.phases.init(slot.spec)
        except Exception as exc:  # a crashed runtime fails this session only
            self._finish(self._bare_result(slot, "error", f"init: {type(exc).__name__}: {exc}"), slot)
            return False
        slot.timings["init"] = time.monotonic() - t0
        return True

    async def _admit(self, slot: _Slot) -> bool:
        """May this prepared session start running now? (cancelled / too stale sessions may not)."""
        spec = slot.spec
        outcome: Outcome | None = None
        error = None
        if spec.session_id in self._cancelled:
            outcome = "cancelled"
        elif self._too_stale(spec):
            outcome = "stale"
            error = f"submitted at policy version {spec.task.policy_version}, now {self.policy_version}"
        if outcome is None:
            return True
        await self._quietly(self.phases.discard(slot.prepared))
        self._finish(self._bare_result(slot, outcome, error), slot)
        return False

    def _too_stale(self, spec: SessionSpec) -> bool:
        k, now, then = self.config.max_staleness, self.policy_version, spec.task.policy_version
        return k is not None and now is not None and then is not None and now - then > k

    async def _run(self, slot: _Slot) -> HarnessRun:
        self._stage(slot.spec.session_id, "running")
        slot.policy_version = self.policy_version
        timeout = slot.spec.task.timeout
        self.running += 1
        self._running_slots[slot.spec.session_id] = slot
        t0 = time.monotonic()
        try:
            run = await asyncio.wait_for(self.phases.run(slot.prepared, timeout), timeout + self.config.kill_grace)
        except TimeoutError:
            run = HarnessRun(timed_out=True, error="the runtime did not stop the harness at its deadline")
        except Exception as exc:
            run = HarnessRun(error=f"{type(exc).__name__}: {exc}")
        finally:
            self.running -= 1
            self._running_slots.pop(slot.spec.session_id, None)
            took = time.monotonic() - t0
            self.busy_seconds += took
        run.seconds = took
        slot.timings["run"] = took
        return run

    async def _post(self, slot: _Slot, run: HarnessRun) -> None:
        self._stage(slot.spec.session_id, "postrun")
        t0 = time.monotonic()
        try:
            result = await self.phases.postrun(slot.prepared, run, slot.policy_version)
        except Exception as exc:  # an evaluator crash is reported; the group goes on
            result = self._bare_result(slot, "error", f"postrun: {type(exc).__name__}: {exc}")
            result.policy_version = slot.policy_version
        if slot.spec.session_id in self._cancelled:
            result.outcome = "cancelled"
        slot.timings["postrun"] = time.monotonic() - t0
        self._finish(result, slot)

    @staticmethod
    async def _quietly(aw) -> None:
        try:
            await aw
        except Exception as exc:  # teardown of a session that is being dropped anyway: note it, go on
            log.warning("tearing down a dropped session failed: %s: %s", type(exc).__name__, exc)

    # -- pools -----------------------------------------------------------------------------

    async def _init_worker(self) -> None:
        while True:
            slot = await self._queue.get()
            if await self._init(slot):
                self._stage(slot.spec.session_id, "ready")
                await self._ready.put(slot)  # blocks while the buffer is full: INIT runs ahead, boundedly

    async def _run_worker(self) -> None:
        while True:
            await self._go.wait()
            slot = await self._ready.get()
            if not self._go.is_set():  # paused while waiting: put it back at the front of the line
                await self._go.wait()
            if await self._admit(slot):
                self._postrun.put_nowait((slot, await self._run(slot)))

    async def _postrun_worker(self) -> None:
        while True:
            slot, run = await self._postrun.get()
            await self._post(slot, run)

    async def _sequential_worker(self) -> None:
        while True:
            await self._go.wait()
            slot = await self._queue.get()
            if await self._init(slot) and await self._admit(slot):
                await self._post(slot, await self._run(slot))
