"""The rollout server's HTTP API for trainers (starlette).

  POST /tasks                    {"tasks": [task, ...]} → the sessions each task expanded into
  GET  /results?after=&follow=   NDJSON: {"seq", "result"} per finished session, as they finish;
                                 {"heartbeat": true} lines keep an idle stream alive
  POST /results/ack              {"seqs": [...]}: the trainer has them; they are not served again
  GET  /status                   sessions per stage, outcomes, rewards so far, nodes, policy version
  POST /tasks/{id}/cancel
  POST /pause                    {"policy_version"?, "drain_timeout"?}: stop starting sessions, drain calls
  POST /resume                   {"policy_version"?}
  GET  /health

On loopback no credentials are needed. Bound to any other address the server requires a token
(`Authorization: Bearer <token>`) on every route but /health, and refuses to start without one.
"""

from __future__ import annotations

import hmac
import ipaddress
import json
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from pydantic import TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from polar.rollout.service import RolloutService
from polar.rollout.tasks import TaskSpec

_TASKS = TypeAdapter(list[TaskSpec])


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_binding(host: str, token: str | None) -> None:
    if not is_loopback(host) and not token:
        raise ValueError(f"binding the rollout server to {host} (beyond loopback) requires a token")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


async def _body(request: Request) -> dict[str, Any]:
    raw = await request.body()
    if not raw:
        return {}
    data = json.loads(raw)
    if not isinstance(data, dict):
        raise ValueError("the request body must be a JSON object")
    return data


def _optional_int(body: dict[str, Any], name: str) -> int | None:
    value = body.get(name)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)):
        raise ValueError(f"{name} must be an integer")
    return value


def create_app(service: RolloutService, token: str | None = None) -> Starlette:
    async def submit(request: Request) -> Response:
        body = await _body(request)
        accepted = await service.submit(_TASKS.validate_python(body.get("tasks")))
        return JSONResponse({"accepted": accepted})

    async def results(request: Request) -> Response:
        q = request.query_params
        after = int(q.get("after", "0"))
        follow = q.get("follow", "1") not in ("0", "false")
        include_drained = q.get("all", "0") not in ("0", "false")

        async def lines() -> AsyncIterator[bytes]:
            async for item in service.results(after, follow, include_drained):
                if item is None:
                    yield b'{"heartbeat": true}\n'
                else:
                    seq, result = item
                    yield f'{{"seq": {seq}, "result": {result.model_dump_json()}}}\n'.encode()

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def ack(request: Request) -> Response:
        seqs = (await _body(request)).get("seqs")
        if not isinstance(seqs, list) or not all(isinstance(s, int) for s in seqs):
            raise ValueError("seqs must be a list of integers")
        return JSONResponse({"acked": service.ack(seqs)})

    async def status(request: Request) -> Response:
        return JSONResponse(await service.status())

    async def cancel(request: Request) -> Response:
        try:
            n = await service.cancel(request.path_params["task_id"])
        except KeyError:
            return _error(404, f"no task {request.path_params['task_id']!r}")
        return JSONResponse({"cancelled_sessions": n})

    async def pause(request: Request) -> Response:
        body = await _body(request)
        timeout = body.get("drain_timeout", 60.0)
        if not isinstance(timeout, int | float):
            raise ValueError("drain_timeout must be a number")
        return JSONResponse(await service.pause(_optional_int(body, "policy_version"), float(timeout)))

    async def resume(request: Request) -> Response:
        return JSONResponse(await service.resume(_optional_int(await _body(request), "policy_version")))

    async def health(request: Request) -> Response:
        return JSONResponse({"ok": True})

    def guarded(handler: Callable) -> Callable:
        async def endpoint(request: Request) -> Response:
            if token and not _authorized(request, token):
                return _error(401, "missing or wrong bearer token")
            try:
                return await handler(request)
            except ValidationError as exc:
                return _error(400, f"invalid task: {exc.errors(include_url=False)}")
            except ValueError as exc:  # bad JSON, bad fields, duplicate task ids
                return _error(400, str(exc))

        return endpoint

    @asynccontextmanager
    async def lifespan(app: Starlette):
        await service.start()
        try:
            yield
        finally:
            await service.close()

    routes = [
        Route("/tasks", guarded(submit), methods=["POST"]),
        Route("/tasks/{task_id}/cancel", guarded(cancel), methods=["POST"]),
        Route("/results", guarded(results), methods=["GET"]),
        Route("/results/ack", guarded(ack), methods=["POST"]),
        Route("/status", guarded(status), methods=["GET"]),
        Route("/pause", guarded(pause), methods=["POST"]),
        Route("/resume", guarded(resume), methods=["POST"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes, lifespan=lifespan)


def _authorized(request: Request, token: str) -> bool:
    given = request.headers.get("authorization", "")
    return given.lower().startswith("bearer ") and hmac.compare_digest(given[7:].strip().encode(), token.encode())


async def serve(service: RolloutService, host: str = "127.0.0.1", port: int = 8090, token: str | None = None) -> None:
    """Run the API (and the service) until interrupted."""
    import uvicorn

    check_binding(host, token)
    # Result streams follow forever: on shutdown, give them a moment, then close them.
    config = uvicorn.Config(create_app(service, token), host=host, port=port, log_level="warning", lifespan="on",
                            timeout_graceful_shutdown=3)
    await uvicorn.Server(config).serve()
