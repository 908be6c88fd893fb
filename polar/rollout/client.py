"""A trainer's client for the rollout server (synchronous, httpx)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx

from polar.rollout.tasks import SessionResult, TaskSpec
from polar.upstream.fleet.weights import FleetWeights
from polar.upstream.vllm_weights import VLLMWeights

DEFAULT_URL = "http://127.0.0.1:8090"
STREAM_TIMEOUT = httpx.Timeout(None, connect=10)  # the result stream stays open between results


# -- the wire format, shared with asynchronous clients (polar/adapters/rollout_link.py) -------------


def auth_headers(token: str | None) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"} if token else {}


def tasks_body(tasks: list[TaskSpec | dict[str, Any]]) -> dict[str, Any]:
    return {"tasks": [t.model_dump(mode="json") if isinstance(t, TaskSpec) else t for t in tasks]}


def result_line(line: str) -> tuple[int, SessionResult] | None:
    """One line of the /results stream: (seq, result), or None for a heartbeat."""
    item = json.loads(line) if line.strip() else {}
    return (item["seq"], SessionResult.model_validate(item["result"])) if "seq" in item else None


class RolloutClient:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 60.0):
        self.url = (url or os.environ.get("POLAR_ROLLOUT_URL") or DEFAULT_URL).rstrip("/")
        token = token or os.environ.get("POLAR_ROLLOUT_TOKEN")
        self.http = httpx.Client(base_url=self.url, headers=auth_headers(token), timeout=timeout)

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        reply = self.http.request(method, path, **kw)
        if reply.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {reply.status_code} {reply.text}")
        return reply.json()

    def submit(self, tasks: list[TaskSpec | dict[str, Any]]) -> list[dict[str, Any]]:
        return self._call("POST", "/tasks", json=tasks_body(tasks))["accepted"]

    def results(self, after: int = 0, follow: bool = True, ack: bool = True,
                include_drained: bool = False) -> Iterator[tuple[int, SessionResult]]:
        """Finished sessions as they finish. With `ack`, each result is acknowledged once the loop
        body has had it, so a result a crashed trainer never processed is served again."""
        params = {"after": after, "follow": int(follow), "all": int(include_drained)}
        with self.http.stream("GET", "/results", params=params, timeout=STREAM_TIMEOUT) as reply:
            if reply.status_code >= 400:
                raise RuntimeError(f"GET /results: {reply.status_code} {reply.read().decode()}")
            for line in reply.iter_lines():
                if (item := result_line(line)) is None:
                    continue
                yield item
                if ack:
                    self.ack([item[0]])

    def ack(self, seqs: list[int]) -> int:
        return self._call("POST", "/results/ack", json={"seqs": seqs})["acked"]

    def status(self) -> dict[str, Any]:
        return self._call("GET", "/status")

    def cancel(self, task_id: str) -> int:
        return self._call("POST", f"/tasks/{task_id}/cancel")["cancelled_sessions"]

    def pause(self, policy_version: int | None = None, drain_timeout: float = 60.0) -> dict[str, Any]:
        return self._call("POST", "/pause", json={"policy_version": policy_version, "drain_timeout": drain_timeout},
                          timeout=drain_timeout + 10)

    def resume(self, policy_version: int | None = None) -> dict[str, Any]:
        return self._call("POST", "/resume", json={"policy_version": policy_version})

    def update_policy(self, vllm: VLLMWeights | FleetWeights, weights_dir: str | Path, version: int,
                      drain_timeout: float = 60.0) -> dict[str, Any]:
        """One policy update behind polar's gate: pause (no session starts; model calls drain), vLLM loads
        `weights_dir` and names it `version`, resume under `version`. From then on every call polar
        captures carries the new version, and sessions are admitted against the staleness bound with it.

        Raises polar.upstream.vllm_weights.WeightSyncError when vLLM could not load the weights; the
        rollout then stays paused (with vLLM), so nothing samples from weights that may be half replaced.
        A fleet (FleetWeights) updates every replica; the rollout resumes when at least one took the new
        weights, and polar's fleet keeps the ones that failed (`replicas_failed`) out until they serve it.
        """
        t0 = time.monotonic()
        paused = self.pause(drain_timeout=drain_timeout)
        drained = time.monotonic()
        loaded = vllm.load(weights_dir, version)  # vLLM's own pause waits for any call still in flight
        t1 = time.monotonic()
        resumed = self.resume(policy_version=version)
        return {"policy_version": resumed["policy_version"], "undrained_calls": paused["in_flight_calls"],
                "drain_s": drained - t0, "load_s": loaded.seconds, "resume_s": time.monotonic() - t1,
                "total_s": time.monotonic() - t0, "replicas_failed": getattr(loaded, "failed", {})}

    def health(self) -> bool:
        try:
            return self.http.get("/health", timeout=5).json().get("ok") is True
        except (httpx.HTTPError, ValueError):
            return False

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RolloutClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
