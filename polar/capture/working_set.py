"""How many sessions take turns at once — the one number the per-session caches are sized by — and a warning
when the sessions really taking turns are more than that.

Three caches hold what a session's next call needs: its history's last reads (providers/history.py), its
last request bodies, the bases its next body is spliced against (capture/bodies.py), and its turns' token
ids (sessions/state.py). Each drops the least recently used session past its budget. Sized below the
sessions taking turns, round-robin turns evict exactly the session about to call, and every call pays in
full: its whole history read again (CPU), its whole body stored (disk), its turns rebuilt from the database.
Slower, never different — so it would go unnoticed; `Evictions` says so in the log instead.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("polar.capture.working_set")

AGENT_BODY_BYTES = 600 * 1024  # a 128k-token coding agent's request body: ~450-550 KB of JSON
AGENT_CONTEXT_TOKENS = 160 * 1024
HOT_SESSIONS = 448  # the default: 256 MB of bodies kept for histories and as many for bases
RECENT_S = 60.0  # a session that took a turn this recently is still taking turns


@dataclass(frozen=True)
class Budgets:
    history_bytes: int  # request bytes whose reads the histories keep
    base_bytes: int  # request bodies the capture writer keeps as bases (and as much for large answers)
    state_tokens: int  # token ids the session states keep
    state_sessions: int

    @classmethod
    def for_sessions(cls, hot: int) -> Budgets:
        """Room for `hot` sessions at 128k tokens each; the token states never below their former fixed
        budget (256M ids, 4,096 sessions): a session's ids are needed exactly, its bytes only to save work."""
        if hot < 1:
            raise ValueError(f"polar_hot_sessions must be at least 1, not {hot}")
        return cls(
            history_bytes=hot * AGENT_BODY_BYTES,
            base_bytes=hot * AGENT_BODY_BYTES,
            state_tokens=max(256 * 1024 * 1024, 2 * hot * AGENT_CONTEXT_TOKENS),
            state_sessions=max(4096, 2 * hot),
        )


DEFAULT = Budgets.for_sessions(HOT_SESSIONS)


class Evictions:
    """Counts sessions a cache dropped although they took a turn within RECENT_S, and logs a warning about
    them at most once a RECENT_S."""

    def __init__(self, cache: str, clock: Callable[[], float] = time.monotonic):
        self.cache = cache  # what the cache holds, as the warning says it
        self.clock = clock
        self.recent = 0  # recently used sessions dropped, in all
        self._unreported = 0
        self._warned_at: float | None = None

    def now(self) -> float:
        return self.clock()

    def dropped(self, last_used: float) -> None:
        now = self.clock()
        if now - last_used >= RECENT_S:
            return
        self.recent += 1
        self._unreported += 1
        if self._warned_at is None or now - self._warned_at >= RECENT_S:
            log.warning(
                "%s: %d session(s) that took a turn in the last %d s were dropped to stay within budget; their next "
                "calls redo that work in full. More sessions take turns at once than polar_hot_sessions sizes the "
                "caches for: raise it (about 8 MB of memory per 128k-token session).",
                self.cache, self._unreported, RECENT_S,
            )
            self._warned_at, self._unreported = now, 0
