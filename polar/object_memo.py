"""Values computed from objects that are never modified once made, kept per object (by identity).

A session's later calls hand back the very message objects its earlier calls read
(providers/history.py), so what is derived from a message — its fingerprint, its stored JSON form — is
computed once per message rather than once per message per call: the history an agent re-sends then
costs nothing beyond its parse. Objects without a hash of their own (pydantic models) are kept by `id`,
each entry holding its object so the id cannot be reused while the entry lives.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ObjectMemo[V]:
    """`compute(obj)`, once per object while it is kept; at most `size` objects (then all are let go)."""

    def __init__(self, compute: Callable[[Any], V], size: int = 1 << 17):
        self._compute, self._size = compute, size
        self._kept: dict[int, tuple[Any, V]] = {}

    def __call__(self, obj: Any) -> V:
        kept = self._kept.get(id(obj))
        if kept is not None and kept[0] is obj:
            return kept[1]
        value = self._compute(obj)
        if len(self._kept) >= self._size:
            self._kept = {}  # rebinding, not clear(): a thread reading the old dict is not disturbed
        self._kept[id(obj)] = (obj, value)
        return value

    def __len__(self) -> int:
        return len(self._kept)
