"""New weights into a running vLLM: the trainer's side of a policy update.

vLLM 0.32's RL weight-transfer backends (nccl, ipc, sparse_nccl, sharded_rdt, nccl_m2n, modelexpress)
all move tensors through NCCL or CUDA IPC: none works on a CPU build. What works on every device
is the worker's in-place reload from a checkpoint directory, `reload_weights(weights_path=DIR)`,
reached through the dev endpoint `POST /collective_rpc`: the trainer writes the new weights as a
Hugging Face checkpoint (safetensors) and every worker reads them into the model it serves, without
a restart. That endpoint, `/reset_prefix_cache` and the RL control endpoints (`/pause`, `/resume`,
`/update_weight_version`, `/weight_info`) exist only when the server runs with VLLM_SERVER_DEV_MODE=1.
Plain `reload_weights` leaves an output head tied to the embedding stale on the CPU build, so the
reload goes through polar's worker extension by default (polar/upstream/vllm_extension.py: why,
and the flag that loads it); `reload_method="reload_weights"` uses vLLM's own method as it is.

One update (`VLLMWeights.load`):

  1. POST /pause?mode=wait        no new request is scheduled; those running finish first
  2. POST /collective_rpc         polar_reload_weights(weights_path=DIR) on every worker
  3. POST /reset_prefix_cache     KV blocks computed under the old weights must not serve new prompts
  4. POST /update_weight_version  /inference/v1/generate answers report it (`weight_versions`), so the
                                  capture rows of token-faithful calls carry it (`weight_version`)
  5. POST /resume

A failure on the way raises `WeightSyncError` and leaves vLLM paused: its weights may be half
replaced, and serving them silently would be worse than a stalled rollout.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from polar.upstream.vllm_extension import EXTENSION, RELOAD_METHOD

DEV_MODE_HINT = "start vLLM with VLLM_SERVER_DEV_MODE=1 (it registers the dev and RL endpoints)"
# What `check` probes: each must answer something other than 404.
REQUIRED = (("POST", "/collective_rpc"), ("GET", "/weight_info"), ("POST", "/reset_prefix_cache"),
            ("GET", "/is_paused"), ("GET", "/server_info"))


class WeightSyncError(RuntimeError):
    """vLLM could not take new weights (its answer or its absence is in the message)."""


class WeightSyncUnavailable(WeightSyncError):
    """The server lacks the endpoints a weight update needs."""


@dataclass
class LoadTimings:
    """Seconds per stage of one update, and what vLLM reported."""

    version: str
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.seconds.values())


def checkpoint_dir(weights_dir: str | Path) -> Path:
    """The directory as vLLM's workers must see it (absolute), once it is known to hold weights."""
    path = Path(weights_dir).resolve()
    if not any(path.glob("*.safetensors")):
        raise WeightSyncError(f"{path} holds no *.safetensors: nothing for vLLM to load")
    return path


class VLLMWeights:
    """A synchronous client for a running vLLM's weight-update endpoints."""

    def __init__(self, url: str, timeout: float = 600.0, api_key: str | None = None,
                 reload_method: str = RELOAD_METHOD):
        self.url = url.rstrip("/")
        self.reload_method = reload_method
        headers = {"authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.Client(base_url=self.url, timeout=timeout, headers=headers)

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> VLLMWeights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the endpoints ----------------------------------------------------------------------------

    def check(self) -> None:
        """Raise WeightSyncUnavailable, naming what is missing and how to get it, unless every endpoint
        an update needs is there. (A GET on a POST route answers 405: the route exists.)"""
        missing = []
        for method, path in REQUIRED:
            try:
                status = self.http.request("GET", path, timeout=10).status_code
            except httpx.HTTPError as exc:
                raise WeightSyncUnavailable(f"vLLM at {self.url} does not answer ({type(exc).__name__}: {exc})") from exc
            if status == 404:
                missing.append(f"{method} {path}")
        if missing:
            raise WeightSyncUnavailable(f"vLLM at {self.url} has no {', '.join(missing)}: {DEV_MODE_HINT}")
        if self.reload_method == RELOAD_METHOD and EXTENSION not in self.server_info().get("worker_extension_cls", ""):
            raise WeightSyncUnavailable(
                f"vLLM at {self.url} runs without polar's worker extension: start it with --worker-extension-cls "
                f"{EXTENSION} (polar importable by its Python), or pass reload_method='reload_weights' if no output "
                "head of the model is tied to its embedding (polar/upstream/vllm_extension.py says why)")

    def server_info(self) -> dict[str, Any]:
        """What the server runs on and with (its device, its worker extension), from its dev endpoint."""
        config = self._call("GET", "/server_info", params={"config_format": "json"}).get("vllm_config") or {}
        parallel, device = config.get("parallel_config") or {}, config.get("device_config") or {}
        return {"device": device.get("device"), "worker_extension_cls": parallel.get("worker_extension_cls") or ""}

    def version(self) -> str:
        return str(self._call("GET", "/weight_info")["weight_version"])

    def is_paused(self) -> bool:
        return bool(self._call("GET", "/is_paused")["is_paused"])

    def pause(self, mode: str = "wait") -> None:
        self._call("POST", "/pause", params={"mode": mode})

    def resume(self) -> None:
        self._call("POST", "/resume")

    def reload(self, weights_dir: str | Path) -> None:
        """Every worker reloads its weights in place from `weights_dir` (safetensors in HF layout)."""
        path = checkpoint_dir(weights_dir)
        self._call("POST", "/collective_rpc",
                   json={"method": self.reload_method, "kwargs": {"weights_path": str(path)}})

    def reset_prefix_cache(self, attempts: int = 20) -> None:
        """Drop cached KV blocks (vLLM refuses while blocks are held: retried for a while)."""
        for _ in range(attempts):
            if self._call("POST", "/reset_prefix_cache").get("success"):
                return
            time.sleep(0.25)
        raise WeightSyncError(f"vLLM at {self.url} kept refusing to reset its prefix cache (blocks still held)")

    def set_version(self, version: str) -> None:
        self._call("POST", "/update_weight_version", json={"new_version": str(version)})

    # -- one update -------------------------------------------------------------------------------

    def load(self, weights_dir: str | Path, version: str | int) -> LoadTimings:
        """Pause, reload from `weights_dir`, drop the prefix cache, name the version, resume."""
        checkpoint_dir(weights_dir)  # before vLLM is paused: a wrong path must not stall it
        timings = LoadTimings(str(version))
        stages = (("pause", self.pause), ("reload", lambda: self.reload(weights_dir)),
                  ("reset_prefix_cache", self.reset_prefix_cache), ("version", lambda: self.set_version(str(version))),
                  ("resume", self.resume))
        for name, run in stages:
            t0 = time.monotonic()
            try:
                run()
            except WeightSyncError as exc:
                left = "" if name == "pause" else " vLLM is left paused (its weights may be half replaced)."
                raise type(exc)(f"weight update to version {version}, at {name}: {exc}.{left}") from exc
            timings.seconds[name] = time.monotonic() - t0
        return timings

    def _call(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        try:
            reply = self.http.request(method, path, **kw)
        except httpx.HTTPError as exc:
            raise WeightSyncError(f"{method} {self.url}{path}: {type(exc).__name__}: {exc}") from exc
        if reply.status_code == 404:
            raise WeightSyncUnavailable(f"vLLM at {self.url} has no {method} {path}: {DEV_MODE_HINT}")
        if reply.status_code >= 400:
            raise WeightSyncError(f"{method} {self.url}{path}: {reply.status_code} {reply.text[:1000]}")
        if not reply.content:
            return {}
        try:
            data = reply.json()
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {"result": data}
