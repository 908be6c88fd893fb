"""A stand-in for vLLM's weight-update endpoints (dev mode): records what it was asked, in order.

    with WeightServer() as fake: VLLMWeights(fake.url).load(dir, 3); fake.calls → [("POST /pause", ...), ...]

Its routes answer as vLLM 0.32's do (vllm/entrypoints/rl/online/api_router.py, serve/dev/*), as if
started with polar's worker extension (`extension=""`: without); `fail` makes one route answer 500,
`busy_resets` makes /reset_prefix_cache refuse that many times first.
"""

from __future__ import annotations

import json

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from polar.doubles.running import BackgroundServer
from polar.upstream.vllm_extension import EXTENSION


class WeightServer:
    def __init__(self, fail: str | None = None, busy_resets: int = 0, extension: str = EXTENSION):
        self.calls: list[tuple[str, object]] = []
        self.fail = fail
        self.busy_resets = busy_resets
        self.version = "default"
        self.paused = False
        self.extension = extension  # --worker-extension-cls ("" without)
        routes = [Route(path, self._handle, methods=[method]) for method, path in [
            ("POST", "/pause"), ("POST", "/resume"), ("GET", "/is_paused"), ("POST", "/collective_rpc"),
            ("POST", "/reset_prefix_cache"), ("POST", "/update_weight_version"), ("GET", "/weight_info"),
            ("GET", "/server_info"), ("GET", "/health")]]
        self._server = BackgroundServer(Starlette(routes=routes))
        self.url = ""

    def __enter__(self) -> WeightServer:
        self.url = self._server.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.stop()

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.calls]

    async def _handle(self, request: Request) -> Response:
        name = f"{request.method} {request.url.path}"
        raw = await request.body()
        self.calls.append((name, json.loads(raw) if raw else dict(request.query_params)))
        if self.fail == request.url.path:
            return JSONResponse({"error": "worker raised"}, status_code=500)
        path = request.url.path
        if path == "/pause":
            self.paused = True
            return JSONResponse({"status": "paused"})
        if path == "/resume":
            self.paused = False
            return JSONResponse({"status": "resumed"})
        if path == "/health":  # (what a fleet's probe asks first)
            return Response(status_code=200)
        if path == "/is_paused":
            return JSONResponse({"is_paused": self.paused})
        if path == "/collective_rpc":
            return JSONResponse({"results": [["model.embed_tokens", "lm_head"]]})
        if path == "/server_info":
            return JSONResponse({"vllm_config": {"device_config": {"device": "cpu"},
                                                 "parallel_config": {"worker_extension_cls": self.extension}}})
        if path == "/reset_prefix_cache":
            if self.busy_resets:
                self.busy_resets -= 1
                return JSONResponse({"success": False})
            return JSONResponse({"success": True})
        if path == "/update_weight_version":
            self.version = json.loads(raw)["new_version"]
            return JSONResponse({"success": True, "new_version": self.version})
        return JSONResponse({"weight_version": self.version})
