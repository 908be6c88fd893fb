"""New weights into every replica of a fleet: the trainer's side of one policy version across the fleet.

`FleetWeights.load` runs VLLMWeights.load (pause, reload, reset the prefix cache, name the version, resume)
on every replica at once. A replica that fails is left as VLLMWeights leaves it (paused, its weights maybe
half replaced) and named in the result's `failed`; the gateway's fleet then keeps it out, since it does not
serve the new version (fleet/backend.py `adopt_version`), until it does. Only when every replica failed is
there nothing to resume on: WeightSyncError.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from polar.upstream.vllm_extension import RELOAD_METHOD
from polar.upstream.vllm_weights import LoadTimings, VLLMWeights, WeightSyncError, checkpoint_dir


@dataclass
class FleetTimings(LoadTimings):
    """Per stage, the slowest replica's seconds; each replica's own, and the ones that failed (URL → why)."""

    replicas: dict[str, LoadTimings] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)


class FleetWeights:
    """VLLMWeights for many replicas, with its interface (what RolloutClient.update_policy calls)."""

    def __init__(self, urls: list[str], timeout: float = 600.0, api_key: str | None = None,
                 reload_method: str = RELOAD_METHOD):
        if not urls:
            raise ValueError("a fleet needs at least one replica")
        self.replicas = [VLLMWeights(url, timeout, api_key, reload_method) for url in urls]

    def close(self) -> None:
        for replica in self.replicas:
            replica.close()

    def __enter__(self) -> FleetWeights:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def check(self) -> None:
        for replica in self.replicas:
            replica.check()

    def versions(self) -> dict[str, str]:
        return {r.url: r.version() for r in self.replicas}

    def load(self, weights_dir: str | Path, version: str | int) -> FleetTimings:
        checkpoint_dir(weights_dir)  # before any replica is paused: a wrong path must not stall the fleet
        timings = FleetTimings(str(version))
        with ThreadPoolExecutor(len(self.replicas)) as pool:
            futures = {r.url: pool.submit(r.load, weights_dir, version) for r in self.replicas}
        for url, future in futures.items():
            try:
                done = future.result()
            except WeightSyncError as exc:
                timings.failed[url] = str(exc)
                continue
            timings.replicas[url] = done
            for stage, seconds in done.seconds.items():
                timings.seconds[stage] = max(timings.seconds.get(stage, 0.0), seconds)
        if not timings.replicas:
            raise WeightSyncError(f"no replica of the fleet took policy version {version}: "
                                  + "; ".join(f"{u}: {why}" for u, why in timings.failed.items()))
        return timings
