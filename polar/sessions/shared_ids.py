"""A turn's token ids held as pieces shared with the turn it branches from.

A session keeps its recent turns' whole ids (prompt + sampled). When a turn extends the one before it
(token-faithful prompts) the older turn is dropped and one buffer remains; when it does not — chat mode
with a client that drops earlier reasoning, a template that re-renders earlier turns — each turn was a
whole-context copy, up to 16 of them per session at 100k+ tokens. Here a turn holds views of its parent's
pieces for the ids the two share and owns only the rest, so a session's memory is its context plus what
each kept turn adds, however the turns relate.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from polar.capture.tokens import as_ids, common_prefix_len

# Past this many pieces a branch is copied into one: comparing and joining cost one numpy call per piece,
# and a lineage gains a piece per turn. The copy shares nothing, so it is rare by design.
MAX_PIECES = 32


def _owned(ids) -> np.ndarray:
    """`ids` as an array that owns its memory (never a view into a caller's larger buffer)."""
    arr = as_ids(ids)
    return arr.copy() if arr.base is not None or not arr.flags.owndata else arr


class SharedIds:
    __slots__ = ("pieces", "_len")

    def __init__(self, pieces: tuple[np.ndarray, ...]):
        self.pieces = tuple(p for p in pieces if len(p))
        self._len = sum(len(p) for p in self.pieces)

    @classmethod
    def of(cls, *parts) -> SharedIds:
        """Ids owned by this turn alone (the parts joined into one buffer)."""
        arrays = [as_ids(p) for p in parts]
        return cls((np.concatenate(arrays) if len(arrays) != 1 else _owned(arrays[0]),))

    def branch(self, shared: int, rest) -> SharedIds:
        """The first `shared` of these ids (held as views, no copy) followed by `rest` (owned).

        A branch that repeats all of these ids is joined into one buffer instead: the session drops a turn
        that a newer one extends, so nothing would be shared, and one buffer is what the upstream call and
        the next comparison read without joining."""
        if not 0 <= shared <= self._len:
            raise ValueError(f"cannot share {shared} of {self._len} ids")
        head = self.head(shared)
        if shared == self._len or len(head) >= MAX_PIECES:
            return SharedIds.of(*head, rest)
        return SharedIds((*head, _owned(rest)))

    def head(self, n: int) -> tuple[np.ndarray, ...]:
        """Views of the first n ids, piece by piece."""
        out, left = [], n
        for piece in self.pieces:
            if left <= 0:
                break
            out.append(piece if len(piece) <= left else piece[:left])
            left -= len(piece)
        return tuple(out)

    def __len__(self) -> int:
        return self._len

    def last(self) -> int:
        return int(self.pieces[-1][-1])

    def array(self) -> np.ndarray:
        """The ids in one array (the piece itself when there is one: do not write to it)."""
        if len(self.pieces) == 1:
            return self.pieces[0]
        return np.concatenate(self.pieces) if self.pieces else as_ids([])

    def extended(self, more) -> np.ndarray:
        """These ids then `more`, as one new array."""
        return np.concatenate([*self.pieces, as_ids(more)])

    def common_prefix_len(self, ids: np.ndarray) -> int:
        """How many leading ids `ids` shares with these."""
        start = 0
        for piece in self.pieces:
            segment = ids[start:start + len(piece)]
            shared = common_prefix_len(segment, piece)
            start += shared
            if shared < len(piece):
                break
        return start

    def starts_with(self, other: SharedIds) -> bool:
        """Whether `other`'s ids are a prefix of these; shared pieces compare by identity."""
        if len(other) > self._len:
            return False
        if not len(other):
            return True
        if other.last() != int(self._at(len(other) - 1)):  # the last id tells most non-prefixes apart at once
            return False
        mine = self.head(len(other))
        if len(mine) == len(other.pieces) and all(_same(a, b) for a, b in zip(mine, other.pieces)):
            return True
        return self.common_prefix_len(other.array()) == len(other)

    def owners(self) -> Iterator[np.ndarray]:
        """The buffers these ids keep alive (a view's owner once per view)."""
        for piece in self.pieces:
            yield piece if piece.base is None else piece.base

    def _at(self, index: int) -> int:
        for piece in self.pieces:
            if index < len(piece):
                return piece[index]
            index -= len(piece)
        raise IndexError(index)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """The same memory: a view of the same ids (two turns sharing a parent's piece)."""
    return len(a) == len(b) and a.__array_interface__["data"][0] == b.__array_interface__["data"][0]


def held_tokens(ids: Iterable[SharedIds]) -> int:
    """Ids in memory for these turns together: each buffer once, however many turns share it."""
    seen: dict[int, int] = {}
    for one in ids:
        for owner in one.owners():
            seen[id(owner)] = owner.size
    return sum(seen.values())
