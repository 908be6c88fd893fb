"""A trainer's client for the rollout server (synchronous, httpx)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from typing import Any

import httpx

from polar.rollout.tasks import SessionResult, TaskSpec

DEFAULT_URL = "http://127.0.0.1:8090"


class RolloutClient:
    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 60.0):
        self.url = (url or os.environ.get("POLAR_ROLLOUT_URL") or DEFAULT_URL).rstrip("/")
        token = token or os.environ.get("POLAR_ROLLOUT_TOKEN")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        reply = self.http.request(method, path, **kw)
        if reply.status_code >= 400:
            raise RuntimeError(f"{method} {path}: {reply.status_code} {reply.text}")
        return reply.json()

    def submit(self, tasks: list[TaskSpec | dict[str, Any]]) -> list[dict[str, Any]]:
        body = [t.model_dump(mode="json") if isinstance(t, TaskSpec) else t for t in tasks]
        return self._call("POST", "/tasks", json={"tasks": body})["accepted"]

    def results(self, after: int = 0, follow: bool = True, ack: bool = True,
                include_drained: bool = False) -> Iterator[tuple[int, SessionResult]]:
        """Finished sessions as they finish. With `ack`, each result is acknowledged once the loop
        body has had it, so a result a crashed trainer never processed is served again."""
        params = {"after": after, "follow": int(follow), "all": int(include_drained)}
        with self.http.stream("GET", "/results", params=params, timeout=httpx.Timeout(None, connect=10)) as reply:
            if reply.status_code >= 400:
                raise RuntimeError(f"GET /results: {reply.status_code} {reply.read().decode()}")
            for line in reply.iter_lines():
                item = json.loads(line) if line.strip() else {}
                if "seq" not in item:
                    continue  # heartbeat
                yield item["seq"], SessionResult.model_validate(item["result"])
                if ack:
                    self.ack([item["seq"]])

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
