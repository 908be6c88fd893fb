"""What the pools do with one real rollout session: sandbox, harness, capture, trajectories, reward. (The
gateway's sessions — which session a call belongs to and its token state — are `polar/sessions/`.)

INIT starts the sandbox (for Docker without a task image: an image with the harness's CLI, git,
python3 and pytest, built once and cached), copies the repository in and records its state as a
git commit (the diff evaluators see is taken against it), writes the harness's config and files, registers the session's
API key with the gateway and lets the evaluator prewarm. RUNNING runs the harness under its
deadline. POSTRUN rebuilds the session's trajectories from the capture store, takes the diff,
evaluates, attaches rewards and tears everything down, whatever failed on the way.
"""

from __future__ import annotations

import asyncio
import logging
import secrets
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from polar.capture.reader import CaptureReader
from polar.harnesses import SUPPORT_DIR, Harness, SessionContext, make_harness, write_files
from polar.rollout.evaluators import EvalContext, Evaluation, Evaluator, make_evaluator
from polar.rollout.node import HarnessRun, NodeConfig
from polar.rollout.tasks import SessionResult, SessionSpec, WatchdogOptions
from polar.rollout.watchdog import Cut, Watcher
from polar.sandboxes.base import Runtime, Sandbox, SandboxSpec
from polar.sandboxes.local import LocalRuntime
from polar.trajectories.builders import prefix_merge
from polar.trajectories.model import Trajectory

WORKDIR = "/work"  # the default TaskSpec.workdir
HARNESS_PID = f"{SUPPORT_DIR}/harness.pid"  # a watched harness's pid (its process group): the watchdog ends it
log = logging.getLogger("polar.rollout.lifecycle")
_GIT = ["git", "-c", "user.email=rollout@polar.invalid", "-c", "user.name=polar", "-c", "commit.gpgsign=false"]


class SessionKeys(Protocol):
    """Per-session API keys the gateway binds to their session (polar.sessions.identity.SessionRegistry)."""

    def register_key(self, key: str, session: str) -> None: ...

    def forget_key(self, key: str) -> None: ...

    def set_dropped_messages(self, session: str, policy: str) -> None: ...


@dataclass
class NodeEnv:
    """Where a node's sessions run and how they reach polar."""

    polar_url: str  # polar's reverse-mode URL as seen from the sandboxes
    capture_db: str
    runtimes: dict[str, Runtime]
    keys: SessionKeys  # the gateway's SessionRegistry: binds each session's API key to it
    pythons: dict[str, str] = field(default_factory=lambda: {"local": sys.executable})  # default: python3
    polar_urls: dict[str, str] = field(default_factory=dict)  # per runtime, where it differs from polar_url
    ca_cert: str | None = None  # polar's CA certificate, trusted inside sandboxes
    gateway: Any = None  # the in-process proxy (BackgroundProxy): pause/resume/drain sampling


def embedded_gateway(upstream: str, db: str, port: int, upstream_model: str = "", tokenizer: str = "",
                     docker: bool = False, allow_open_egress: bool | None = None, upstream_stall: int = 0):
    """polar in this process, and the runtimes whose sessions reach it. `local`: reverse mode for
    harnesses that take a base URL, an explicit-proxy listener for those that only honour
    HTTPS_PROXY. `docker` (optional): transparent listeners on the session network's gateway, so
    calls to the providers' own hosts land in polar and are attributed by container address; its
    network fails closed unless `allow_open_egress` (polar.sandboxes.docker_runtime.EgressLockFailed).
    Returns the proxy (stop it when done) and the node's environment."""
    from polar.mitm.proxy import BackgroundProxy, ProxyConfig, free_port
    from polar.mitm.transparent import add_listeners, ca_cert_path, transparent_modes

    proxy = BackgroundProxy(ProxyConfig(upstream=upstream, db=db, port=port or free_port(),
                                        upstream_model=upstream_model, tokenizer=tokenizer,
                                        upstream_stall=upstream_stall))
    proxy.start()
    registry = proxy.addon.gateway.registry
    regular = f"127.0.0.1:{free_port()}"
    add_listeners([f"regular@{regular}"])
    ca_cert = str(ca_cert_path(proxy.config.confdir))
    env = NodeEnv(polar_url=proxy.url, capture_db=db, runtimes={"local": LocalRuntime(f"http://{regular}", ca_cert)},
                  keys=registry, ca_cert=ca_cert, gateway=proxy)
    if docker:
        from polar.sandboxes.docker_runtime import DockerRuntime

        runtime = DockerRuntime(addresses=registry, allow_open_egress=allow_open_egress)
        try:
            add_listeners(transparent_modes(runtime.gateway_ip))
        except BaseException:  # no sandbox network (e.g. its egress lock failed): nothing left running
            runtime.close()
            proxy.stop()
            raise
        env.runtimes["docker"] = runtime
        env.polar_urls["docker"] = f"http://{runtime.gateway_ip}"
    return proxy, env


@dataclass
class Prepared:
    spec: SessionSpec
    sandbox: Sandbox
    runtime: Runtime
    harness: Harness
    evaluator: Evaluator
    ctx: SessionContext
    eval_prepared: Any = None
    has_git: bool = False
    watch: WatchdogOptions | None = None  # the session's long-tail cut options, when watched
    cut: Cut | None = None  # the watchdog ended the harness


class SessionPhases:
    def __init__(self, env: NodeEnv, config: NodeConfig):
        self.env = env
        # Blocking runtime calls run on per-pool threads, sized like the pools, so a slow teardown
        # can never take a thread a harness needs.
        self._init_pool = ThreadPoolExecutor(max(1, config.init_workers), thread_name_prefix="rollout-init")
        self._run_pool = ThreadPoolExecutor(max(1, config.running_slots), thread_name_prefix="rollout-run")
        self._post_pool = ThreadPoolExecutor(max(1, config.postrun_workers), thread_name_prefix="rollout-post")
        self._images: dict[tuple[int, str], str] = {}  # (runtime, harness) → built image
        self.watchdog = config.watchdog
        self._images_lock = threading.Lock()

    async def _in(self, pool: ThreadPoolExecutor, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def init(self, spec: SessionSpec) -> Prepared:
        return await self._in(self._init_pool, self._init, spec)

    async def run(self, prepared: Prepared, timeout: float) -> HarnessRun:
        task = prepared.spec.task
        options = task.watchdog.over(self.watchdog) if task.watchdog else self.watchdog
        if options is None or not options.active:
            return await self._in(self._run_pool, self._run, prepared, timeout)
        prepared.watch = options
        harness = asyncio.ensure_future(self._in(self._run_pool, self._run, prepared, timeout))
        watch = asyncio.create_task(self._watch(prepared, options, harness))
        try:
            return await harness
        finally:
            watch.cancel()

    async def _watch(self, prepared: Prepared, options: WatchdogOptions, harness: asyncio.Future) -> None:
        """Poll the session's captured calls while its harness runs; on a cut, end the harness."""
        watcher: Watcher | None = None
        while not harness.done():
            await asyncio.sleep(options.poll_seconds)
            try:
                watcher = watcher or Watcher(options, self.env.capture_db, prepared.spec.capture_id)
                cut = await asyncio.to_thread(watcher.check)
            except Exception as exc:  # a watch that cannot read the captures must not end the session
                log.warning("session %s: watchdog: %s: %s", prepared.spec.session_id, type(exc).__name__, exc)
                continue
            if cut is not None and not harness.done():
                prepared.cut = cut
                log.info("session %s cut (%s): %s", prepared.spec.session_id, cut.reason, cut.detail)
                await asyncio.to_thread(self._end_harness, prepared)
                return

    async def postrun(self, prepared: Prepared, run: HarnessRun, policy_version: int | None) -> SessionResult:
        return await self._in(self._post_pool, self._postrun, prepared, run, policy_version)

    async def interrupt(self, prepared: Prepared) -> None:
        """End a running harness now (its session was cancelled); POSTRUN still follows."""
        await self._in(self._post_pool, prepared.sandbox.interrupt)

    async def discard(self, prepared: Prepared) -> None:
        await self._in(self._post_pool, self._teardown, prepared)

    def close(self) -> None:
        for pool in (self._init_pool, self._run_pool, self._post_pool):
            pool.shutdown(wait=False, cancel_futures=True)

    # -- blocking work ---------------------------------------------------------------------

    def _init(self, spec: SessionSpec) -> Prepared:
        task = spec.task
        if task.runtime not in self.env.runtimes:
            raise ValueError(f"runtime {task.runtime!r} is not available on this node ({', '.join(self.env.runtimes)})")
        harness, evaluator = make_harness(task.harness.name, task.harness.options), make_evaluator(task.evaluator)
        runtime = self.env.runtimes[task.runtime]
        if harness.needs_container and isinstance(runtime, LocalRuntime):
            raise ValueError(f"harness {harness.name!r} is installed into an image: use a container runtime")
        image = task.image or self._image(runtime, harness)
        if image != task.image:  # the evaluator's clean copy runs in the same image
            spec = spec.model_copy(update={"task": task.model_copy(update={"image": image})})
        ctx = SessionContext(session_id=spec.capture_id, api_key="sk-polar-" + secrets.token_hex(16),
                             base_url=self.env.polar_urls.get(task.runtime, self.env.polar_url), workdir=task.workdir,
                             model=task.model, python=self.env.pythons.get(task.runtime, "python3"))
        sandbox = runtime.start(SandboxSpec(image=image or "", session=spec.capture_id, workdir=task.workdir,
                                            ca_cert=Path(self.env.ca_cert) if self.env.ca_cert else None))
        prepared = Prepared(spec, sandbox, runtime, harness, evaluator, ctx)
        try:
            if task.repo:
                sandbox.copy_in(task.repo, task.workdir)
            prepared.has_git = self._baseline(sandbox)
            write_files(sandbox, harness.files())
            for target, source in harness.host_files(ctx).items():
                sandbox.copy_in(source, target)
            self.env.keys.register_key(ctx.api_key, spec.capture_id)
            if harness.dropped_messages:
                self.env.keys.set_dropped_messages(spec.capture_id, harness.dropped_messages)
            prepared.eval_prepared = evaluator.prepare(spec.task, runtime, ctx)
        except Exception:
            self._teardown(prepared)
            raise
        return prepared

    def _image(self, runtime: Runtime, harness: Harness) -> str | None:
        """The image for a task that names none: on Docker, the harness's CLI (if any) over git,
        python3 and pytest, built once per CLI version; elsewhere none."""
        from polar.sandboxes.docker_runtime import DockerRuntime

        if not isinstance(runtime, DockerRuntime):
            return None
        key = (id(runtime), harness.package, harness.version)
        with self._images_lock:  # concurrent INITs build once
            if key not in self._images:
                from polar.rollout.swe_image import swe_image
                from polar.sandboxes.images import node_image

                tools = swe_image(runtime.client, node_image(runtime.client))
                self._images[key] = harness.install_layer(runtime.client, tools)
            return self._images[key]

    @staticmethod
    def _baseline(sandbox: Sandbox) -> bool:
        """Commit the repository as given, so the session's diff is exactly what the harness changed.
        False when the image has no git (then there is no diff: evaluators that need one say so)."""
        if sandbox.exec(["sh", "-c", "command -v git"], timeout=60).exit_code != 0:
            return False
        done = sandbox.exec(["sh", "-c", "git init -q . && git add -A && \"$@\" commit -q --allow-empty -m base",
                             "sh", *_GIT], timeout=120)
        if not done.ok:
            raise RuntimeError(f"could not snapshot the repository: {done.stderr.strip()[-500:]}")
        return True

    def _run(self, prepared: Prepared, timeout: float) -> HarnessRun:
        argv, env = prepared.harness.launch(prepared.spec.task.instruction, prepared.ctx)
        if prepared.watch is not None:  # under a shell that records the pid: its process group can be ended alone
            pidfile = prepared.ctx.sandbox_relative(HARNESS_PID)
            record = 'mkdir -p "$(dirname "$0")" && echo $$ > "$0" && exec "$@"'
            argv = ["sh", "-c", record, pidfile, *(argv if isinstance(argv, list) else ["sh", "-c", argv])]
        done = prepared.sandbox.exec(argv, env=env, timeout=timeout)
        return HarnessRun(exit_code=done.exit_code, timed_out=done.timed_out,
                          output_tail=(done.stdout[-2000:] + done.stderr[-2000:]))

    @staticmethod
    def _end_harness(prepared: Prepared) -> None:
        """Kill the watched harness's process group; the sandbox stays for the diff and the evaluation."""
        pidfile = prepared.ctx.sandbox_relative(HARNESS_PID)
        # The group of the recorded pid: its own (local runtime), or that of the `timeout` a container's exec
        # runs it under (Docker). /proc/<pid>/stat after the command name: state, ppid, pgrp. dash's kill takes no `--`.
        kill = ('p="$(cat "$0")" && g="$(sed "s/.*) //" /proc/$p/stat | cut -d" " -f3)" && [ "$g" -gt 1 ] '
                '&& kill -KILL -"$g"')
        done = prepared.sandbox.exec(["sh", "-c", kill, pidfile], timeout=30)
        if not done.ok:
            log.warning("session %s: ending the harness failed: %s", prepared.spec.session_id, done.stderr[-300:])

    def _postrun(self, prepared: Prepared, run: HarnessRun, policy_version: int | None) -> SessionResult:
        spec = prepared.spec
        cut = prepared.cut
        outcome = cut.reason if cut else "timeout" if run.timed_out else "error" if run.error else "ok"
        result = SessionResult(session_id=spec.session_id, task_id=spec.task.id, sample=spec.sample,
                               outcome=outcome, error=f"harness: {run.error}" if run.error and not cut else None,
                               partial=run.timed_out or cut is not None, cut=cut.as_dict() if cut else None,
                               policy_version=policy_version, metadata=spec.task.metadata,
                               harness_exit=run.exit_code, harness_output=run.output_tail)
        try:
            result.trajectories = self._trajectories(spec, run, policy_version)
            for t in result.trajectories if cut else ():
                t.metadata["cut"] = cut.reason
            try:
                diff = self._diff(prepared.sandbox) if prepared.has_git else None
                ctx = EvalContext(spec.task, prepared.ctx, prepared.sandbox, prepared.runtime, run, diff,
                                  result.trajectories, prepared.eval_prepared)
                self._attach(result, prepared.evaluator.evaluate(ctx))
            except Exception as exc:  # reported with its cause; the trajectories are still worth keeping
                result.outcome = "error"
                result.error = f"evaluator {spec.task.evaluator.name}: {type(exc).__name__}: {exc}"
        finally:
            self._teardown(prepared)
        return result

    def _trajectories(self, spec: SessionSpec, run: HarnessRun, policy_version: int | None) -> list[Trajectory]:
        rows = list(CaptureReader(self.env.capture_db).calls(session=spec.capture_id))
        trajectories = prefix_merge(rows)
        for t in trajectories:
            t.task = spec.task.id
            # The trainer's version when the session started; each turn keeps what served it.
            t.metadata.update(sample=spec.sample, harness_exit=run.exit_code, timed_out=run.timed_out,
                              trainer_policy_version=policy_version)
        return trajectories

    @staticmethod
    def _diff(sandbox: Sandbox) -> str:
        done = sandbox.exec(["sh", "-c", "git add -A && \"$@\" diff --cached --binary HEAD", "sh", *_GIT], timeout=120)
        if not done.ok:
            raise RuntimeError(f"could not take the session's diff: {done.stderr.strip()[-500:]}")
        return done.stdout

    @staticmethod
    def _attach(result: SessionResult, evaluation: Evaluation) -> None:
        result.reward = evaluation.reward
        result.evaluation = evaluation.details
        for t in result.trajectories:
            t.reward = evaluation.reward
        # Per-step rewards describe the main line of the session: its longest trajectory.
        if evaluation.step_rewards is not None and result.trajectories:
            main = max(result.trajectories, key=lambda t: len(t.turns))
            if len(evaluation.step_rewards) != len(main.turns):
                raise ValueError(f"{len(evaluation.step_rewards)} step rewards for {len(main.turns)} turns")
            main.step_rewards = evaluation.step_rewards

    def _teardown(self, prepared: Prepared) -> None:
        self.env.keys.forget_key(prepared.ctx.api_key)  # the key dies with its session
        try:
            prepared.evaluator.cleanup(prepared.eval_prepared)
        finally:
            prepared.sandbox.stop()
