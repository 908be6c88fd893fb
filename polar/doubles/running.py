"""Run an ASGI app (the double) with uvicorn on a thread."""

from __future__ import annotations

import threading
import time


class BackgroundServer:
    """Run an ASGI app with uvicorn on a thread (for tests and the in-process main job)."""

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0):
        import uvicorn

        self.config = uvicorn.Config(app, host=host, port=port, log_level="warning", lifespan="off")
        self.server = uvicorn.Server(self.config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self, timeout: float = 120) -> str:
        self.thread.start()
        deadline = time.time() + timeout
        while not self.server.started:
            if time.time() > deadline or not self.thread.is_alive():
                raise RuntimeError("scripted vLLM double did not start")
            time.sleep(0.02)
        sock = self.server.servers[0].sockets[0]
        host, port = sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)
