"""One replica of the fleet: its backend, whether it is in, and what it carries now (for routing and status)."""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar.errors import GatewayError
from polar.upstream.base import Backend

# What takes a replica out: it refused the connection, answered 5xx, broke off, stalled or sent garbage. A
# refusal of the request itself (invalid, too long, rate limited) is the request's fault, not the replica's.
REPLICA_FAILURES = frozenset({"upstream_unavailable", "upstream_timeout", "upstream_error"})


def replica_failed(err: GatewayError) -> bool:
    return err.kind in REPLICA_FAILURES


@dataclass(eq=False)
class Replica:
    url: str
    backend: Backend
    up: bool = True
    in_flight: int = 0  # calls sampling on it now
    load: int = 0  # tokens of those calls (prompt estimates): what routing balances
    calls: int = 0  # calls sent to it, ever
    failures: int = 0  # times it was taken out
    last_error: str | None = None  # kept after it came back, for diagnosis
    out_since: float | None = None
    readmitted: int = 0  # times a probe took it back in
    weight_version: str | None = None  # its label for the weights it serves (/weight_info), once the fleet asked
    metrics: dict[str, float] = field(default_factory=dict)  # scraped from its /metrics (metrics.py)

    def take_out(self, err: GatewayError | str) -> bool:
        """Out of the fleet until a probe finds it answering again. True when it was in."""
        self.last_error = err.message if isinstance(err, GatewayError) else err
        if not self.up:
            return False
        self.up, self.out_since = False, time.time()
        self.failures += 1
        return True

    def take_in(self) -> None:
        if not self.up:
            self.up, self.out_since = True, None
            self.readmitted += 1

    def hold(self, tokens: int) -> Held:
        self.in_flight += 1
        self.load += tokens
        self.calls += 1
        return Held(self, tokens)

    def status(self) -> dict[str, Any]:
        return {"url": self.url, "up": self.up, "in_flight": self.in_flight, "load_tokens": self.load,
                "calls": self.calls, "failures": self.failures, "readmitted": self.readmitted,
                "last_error": self.last_error, "out_since": self.out_since, "weight_version": self.weight_version,
                **({"metrics": dict(self.metrics)} if self.metrics else {})}


class Held:
    """One call's share of a replica's load, given back once (`release`)."""

    __slots__ = ("replica", "tokens", "_held")

    def __init__(self, replica: Replica, tokens: int):
        self.replica, self.tokens, self._held = replica, tokens, True

    def release(self) -> None:
        if self._held:
            self._held = False
            self.replica.in_flight -= 1
            self.replica.load -= self.tokens


def upstream_urls(values: Iterable[str] = (), file: str | Path | None = None) -> list[str]:
    """The fleet's base URLs: each value may hold several, split at commas or whitespace (mitmproxy's
    `--set polar_upstream=URL,URL`); a file holds them one a line (`#` starts a comment). Order kept, repeats
    dropped. Raises ValueError on an entry that is not an http(s) URL."""
    items = [part for value in values for part in value.replace(",", " ").split()]
    if file:
        for line in Path(file).read_text().splitlines():
            items += line.split("#", 1)[0].replace(",", " ").split()
    urls = list(dict.fromkeys(u.rstrip("/") for u in items))
    bad = [u for u in urls if not u.startswith(("http://", "https://"))]
    if bad:
        raise ValueError(f"an upstream must be an http(s) base URL, not {bad[0]!r}")
    return urls
