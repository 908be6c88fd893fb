"""Per fleet replica, from the capture rows (their `replica` column): the calls each answered or failed,
the calls it failed that another answered, the sessions and tokens it served, the policy versions it
sampled under. A run behind one upstream has no replica column filled: no such figures."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ReplicaStats:
    replica: str
    calls: int = 0
    ok: int = 0
    failed: int = 0  # calls that ended with an error on it
    failed_over: int = 0  # calls it failed that another replica then answered
    prompt_tokens: int = 0
    sampled_tokens: int = 0
    sessions: set[str] = field(default_factory=set)
    policy_versions: set[int] = field(default_factory=set)
    metrics: dict[str, float] | None = None  # its vLLM's /metrics when the report was written, if asked for

    @property
    def prefix_cache_hit_rate(self) -> float | None:
        """vLLM's own: cached prompt tokens over queried ones, since the server started."""
        queries = (self.metrics or {}).get("prefix_cache_queries")
        return self.metrics["prefix_cache_hits"] / queries if queries else None


def replica_stats(rows: Iterable[dict[str, Any]]) -> list[ReplicaStats]:
    """Per replica named by any row, in order of first appearance."""
    out: dict[str, ReplicaStats] = {}
    for row in rows:
        result = row.get("result") if isinstance(row.get("result"), dict) else {}
        for failover in result.get("failovers") or []:
            url = failover.split(": ", 1)[0]
            out.setdefault(url, ReplicaStats(url)).failed_over += 1
        if not row.get("replica"):
            continue
        stats = out.setdefault(row["replica"], ReplicaStats(row["replica"]))
        stats.calls += 1
        stats.sessions.add(row["session_id"])
        if row.get("status") == "ok":
            stats.ok += 1
            stats.prompt_tokens += row.get("prompt_len") or 0
            stats.sampled_tokens += row.get("completion_len") or 0
        else:
            stats.failed += 1
        if row.get("policy_version") is not None:
            stats.policy_versions.add(row["policy_version"])
    return list(out.values())
