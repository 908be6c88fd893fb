"""Rollout fixtures: real sessions on the local runtime, through the in-process polar and the double."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from polar.mitm.transparent import ca_cert_path
from polar.rollout.lifecycle import NodeEnv, SessionPhases
from polar.rollout.node import GatewayNode, NodeConfig
from polar.rollout.tasks import SessionResult, SessionSpec, TaskSpec
from polar.sandboxes.local import LocalRuntime

TASKS = Path(__file__).resolve().parents[2] / "data" / "tasks"
# A shell harness's one real model call, through the session's polar.
ONE_CALL = ("{python} -c \"import openai; openai.OpenAI(max_retries=0).chat.completions.create("
            "model='m', messages=[{'role': 'user', 'content': 'hello from a ray node'}])\"")


@pytest.fixture
def node_env(stack, tmp_path) -> NodeEnv:
    runtime = LocalRuntime(stack.url, ca_cert_path(stack.proxy.config.confdir), root=tmp_path)
    return NodeEnv(polar_url=stack.url, capture_db=str(stack.db), runtimes={"local": runtime},
                   keys=stack.proxy.addon.gateway.registry)


def run_sessions(env: NodeEnv, tasks: list[TaskSpec], timeout: float = 90, **config) -> list[SessionResult]:
    """Every session of `tasks` through one real node; results in submission order."""

    async def main() -> list[SessionResult]:
        cfg = NodeConfig(**config)
        node = GatewayNode(SessionPhases(env, cfg), cfg)
        node.start()
        specs = [s for t in tasks for s in SessionSpec.expand(t)]
        for spec in specs:
            node.submit(spec)
        results: dict[str, SessionResult] = {}
        try:
            async with asyncio.timeout(timeout):
                while len(results) < len(specs):
                    results.update((r.session_id, r) for kind, r in await node.next_events(0.5) if kind == "result")
        finally:
            await node.stop()
            node.phases.close()
        return [results[s.session_id] for s in specs]

    return asyncio.run(main())


async def first_results(service, n: int, timeout: float) -> list[SessionResult]:
    """The first `n` results a RolloutService streams, in order (TimeoutError after `timeout` s)."""
    results: list[SessionResult] = []
    async with asyncio.timeout(timeout):
        async for item in service.results(follow=True, heartbeat=0.5):
            results += [item[1]] if item else []
            if len(results) == n:
                return results
    return results


class ApiServer:
    """The rollout API and a service on a simulated node, in a background thread."""

    def __init__(self, state_path: Path, token: str | None = None, host: str = "127.0.0.1", make=None, **config):
        """`make`: builds the service on the server's loop (default: one simulated node)."""
        import threading

        import uvicorn

        from polar.mitm.proxy import free_port
        from polar.rollout.server import create_app
        from polar.rollout.service import LocalNode, RolloutService
        from polar.rollout.simulate import SimulatedPhases
        from polar.rollout.state import RolloutState

        self.port = free_port()
        self.url = f"http://{host}:{self.port}"
        cfg = NodeConfig(**config)
        self._make = make or (lambda: RolloutService(RolloutState(state_path),
                                                     [LocalNode(GatewayNode(SimulatedPhases(0.01), cfg))]))
        self._server: uvicorn.Server | None = None
        self._thread = threading.Thread(target=self._run, args=(create_app, token, host), daemon=True)

    def _run(self, create_app, token, host) -> None:
        import uvicorn

        async def main() -> None:
            self.service = self._make()  # the service's loop objects belong to this thread's loop
            # Followers' result streams never end by themselves: close them a moment into shutdown.
            config = uvicorn.Config(create_app(self.service, token), host=host, port=self.port, log_level="critical",
                                    timeout_graceful_shutdown=0.5)
            self._server = uvicorn.Server(config)
            await self._server.serve()

        asyncio.run(main())

    def __enter__(self) -> ApiServer:
        import time

        import httpx

        self._thread.start()
        for _ in range(200):
            try:
                httpx.get(f"{self.url}/health", timeout=1)
                return self
            except httpx.HTTPError:
                time.sleep(0.05)
        raise RuntimeError("rollout API did not start")

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
