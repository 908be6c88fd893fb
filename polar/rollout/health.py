"""Whether the rollout service can hear a node: failures of its event stream, since when, and how
long to wait before trying it again (exponential backoff, capped); or that it is lost for good (its
machine died), which no retry undoes."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any


@dataclass
class NodeHealth:
    backoff: float = 0.5  # first retry delay, doubled per failure in a row
    backoff_cap: float = 30.0
    failures: int = 0  # in a row; 0 is healthy
    last_error: str | None = None  # kept after a recovery, for diagnosis
    since: float | None = None  # wall time of the first failure in the current row
    lost: bool = False  # gone for good: never tried, dispatched to or recovered again

    @property
    def healthy(self) -> bool:
        return self.failures == 0 and not self.lost

    def failed(self, exc: BaseException) -> float:
        """Record a failure; returns the seconds to wait before the next try."""
        if self.failures == 0:
            self.since = time.time()
        self.failures += 1
        self.last_error = f"{type(exc).__name__}: {exc}"
        return min(self.backoff_cap, self.backoff * 2 ** min(self.failures - 1, 32))

    def gone(self, exc: BaseException) -> None:
        """Record that the node will not come back."""
        if self.since is None:
            self.since = time.time()
        self.lost = True
        self.last_error = f"{type(exc).__name__}: {exc}"

    def unhealthy_for(self) -> float:
        return 0.0 if self.since is None else time.time() - self.since

    def recovered(self) -> int:
        """Back to healthy; returns how many failures in a row it had."""
        failures, self.failures, self.since = self.failures, 0, None
        return failures

    def describe_since(self) -> str:
        return datetime.fromtimestamp(self.since or 0, UTC).isoformat(timespec="seconds")

    def cause(self, name: str) -> str:
        """Why the node's sessions move: said in logs and in the errors of sessions that cannot."""
        state = "lost" if self.lost else "unhealthy"
        return f"node {name} {state} since {self.describe_since()}: {self.last_error}"

    def as_dict(self) -> dict[str, Any]:
        return {"healthy": self.healthy, "lost": self.lost, "failures": self.failures, "last_error": self.last_error,
                "unhealthy_since": None if self.since is None else self.describe_since()}
