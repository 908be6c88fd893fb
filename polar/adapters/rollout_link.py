"""The asynchronous link an adapter keeps to a rollout service: submit tasks, await each session's result.

Frameworks like NeMo Gym ask for one rollout per request, while the rollout service takes tasks and
streams finished sessions in completion order. `RolloutLink` bridges the two over the service's HTTP
API (polar/rollout/server.py):

- `claim_session(key, task)` gives a request one session of its own. Requests that share `key`
  (the same prompt, sampled again for a GRPO group) share one submitted task of `task.samples`
  sessions, so the service runs the group as one task; a key whose sessions are all claimed starts
  a new task on its next request.
- `result(session_id)` waits for that session's result. One follower per link reads the service's
  result stream and routes each result to its waiter, keeping results that arrive before anyone
  asks. Results of tasks this link did not submit belong to another consumer and are left alone.
  A result is acknowledged once handed over, so one a crashed adapter never delivered is served
  again.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque

import httpx

from polar.rollout.client import STREAM_TIMEOUT, auth_headers, result_line, tasks_body
from polar.rollout.tasks import SessionResult, TaskSpec


class RolloutServiceError(RuntimeError):
    """The rollout service refused a request or cannot be reached."""


class RolloutLink:
    def __init__(self, url: str, token: str | None = None, timeout: float = 60.0, ack: bool = True):
        self.url = url.rstrip("/")
        self.http = httpx.AsyncClient(base_url=self.url, headers=auth_headers(token), timeout=timeout)
        self.ack = ack
        self.last_stream_error: Exception | None = None  # why the follower last had to reconnect
        self.last_ack_error: Exception | None = None
        self._after = 0  # the last result seq the follower has read
        self._unfinished: dict[str, int] = {}  # task id → its sessions not yet handed over
        self._groups: dict[str, deque[str]] = {}  # group key → sessions of its open task, unclaimed
        self._waiting: dict[str, asyncio.Future[tuple[int, SessionResult]]] = {}
        self._arrived: dict[str, tuple[int, SessionResult]] = {}  # results nobody asked for yet
        self._abandoned: set[str] = set()  # sessions whose waiter gave up: drop their results
        self._submitting = asyncio.Lock()
        self._follower: asyncio.Task | None = None

    async def submit(self, task: TaskSpec) -> list[str]:
        """Submit one task; its session ids."""
        self._unfinished[task.id] = task.samples  # before the POST: its first result may come at once
        self._start_following()
        try:
            reply = await self.http.post("/tasks", json=tasks_body([task]))
        except httpx.HTTPError as exc:
            self._unfinished.pop(task.id, None)
            raise RolloutServiceError(f"the rollout service at {self.url} cannot be reached: {exc}") from exc
        if reply.status_code >= 400:
            self._unfinished.pop(task.id, None)
            raise RolloutServiceError(f"the rollout service refused task {task.id}: {reply.status_code} {reply.text}")
        return reply.json()["accepted"][0]["sessions"]

    async def claim_session(self, key: str, task: TaskSpec) -> str:
        """A session for one request: the next unclaimed one of the open group `key`, else the first
        of `task`, submitted now."""
        async with self._submitting:
            group = self._groups.get(key)
            if not group:
                group = self._groups[key] = deque(await self.submit(task))
            session_id = group.popleft()
            if not group:
                del self._groups[key]
            return session_id

    async def result(self, session_id: str) -> SessionResult:
        """The session's result, once the service has scored it."""
        if session_id in self._arrived:
            seq, result = self._arrived.pop(session_id)
        else:
            future = self._waiting[session_id] = asyncio.get_running_loop().create_future()
            try:
                seq, result = await future
            except asyncio.CancelledError:  # the request timed out or its client went away
                self._abandoned.add(session_id)
                raise
            finally:
                self._waiting.pop(session_id, None)
        if self.ack:
            try:
                await self.http.post("/results/ack", json={"seqs": [seq]})
            except httpx.HTTPError as exc:  # unacknowledged, it is only served again: not worth failing for
                self.last_ack_error = exc
        return result

    async def close(self) -> None:
        if self._follower is not None:
            self._follower.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._follower
        await self.http.aclose()

    # -- the result stream -------------------------------------------------------------------

    def _start_following(self) -> None:
        if self._follower is None or self._follower.done():
            self._follower = asyncio.get_running_loop().create_task(self._follow(), name="polar-results")

    async def _follow(self) -> None:
        """Read the result stream for as long as the link lives; reconnect where it stopped."""
        while True:
            try:
                await self._read_stream()
            except asyncio.CancelledError:
                raise
            except (httpx.HTTPError, RolloutServiceError, ValueError) as exc:  # a restart, a dropped line
                self.last_stream_error = exc
                await asyncio.sleep(1.0)

    async def _read_stream(self) -> None:
        params = {"after": self._after, "follow": 1}
        async with self.http.stream("GET", "/results", params=params, timeout=STREAM_TIMEOUT) as reply:
            if reply.status_code >= 400:
                raise RolloutServiceError(f"GET /results: {reply.status_code} {(await reply.aread()).decode()}")
            async for line in reply.aiter_lines():
                if (item := result_line(line)) is not None:  # else a heartbeat
                    self._after = max(self._after, item[0])
                    self._route(*item)

    def _route(self, seq: int, result: SessionResult) -> None:
        left = self._unfinished.get(result.task_id)
        if left is None:
            return  # another consumer's task
        if left <= 1:
            del self._unfinished[result.task_id]
        else:
            self._unfinished[result.task_id] = left - 1
        if result.session_id in self._abandoned:
            self._abandoned.discard(result.session_id)
            return
        future = self._waiting.get(result.session_id)
        if future is not None and not future.done():
            future.set_result((seq, result))
        else:
            self._arrived[result.session_id] = (seq, result)
