"""Compact, linear storage of token sequences.

Token ids are stored as little-endian uint32 blobs and logprobs as float32 blobs: 4 bytes a
token, read back with one numpy call (new ids and sampled ids over 256 B are zstd-compressed on top,
records.TokenRecord / reader). A prompt that extends an earlier capture of the same
session is stored as (parent call, shared prefix length, new suffix) — see records.Lineage and
sessions/state.py — so a session of T turns over N tokens costs O(N) ids on disk, not O(T·N).
"""

from __future__ import annotations

from array import array

import numpy as np

_IDS = np.dtype("<u4")
_LOGPROBS = np.dtype("<f4")


def as_ids(ids) -> np.ndarray:
    """Token ids as a uint32 array. A Python list goes through array('I'): several times faster than
    np.asarray, which checks each element's type, a cost that grows with the prompt."""
    if isinstance(ids, np.ndarray):
        return ids.astype(_IDS, copy=False)
    return np.frombuffer(array("I", ids), dtype=np.uintc).astype(_IDS, copy=False)


def pack_ids(ids) -> bytes:
    return as_ids(ids).tobytes()


def unpack_ids(blob: bytes | None) -> list[int]:
    return np.frombuffer(blob, dtype=_IDS).tolist() if blob else []


def pack_logprobs(values) -> bytes:
    return np.asarray(values, dtype=_LOGPROBS).tobytes()


def unpack_logprobs(blob: bytes | None) -> list[float] | None:
    """None when none were captured (the upstream gave none): never invented."""
    return None if blob is None else np.frombuffer(blob, dtype=_LOGPROBS).tolist()


def common_prefix_len(a: np.ndarray, b: np.ndarray) -> int:
    """Length of the common prefix: one comparison when the shorter is the longer's prefix (a turn and the
    turn extending it: the common case), else scanning in growing blocks so that an
    early mismatch is cheap."""
    n, start, step = min(len(a), len(b)), 0, 64
    if n and np.array_equal(a[:n], b[:n]):
        return n
    while start < n:
        stop = min(n, start + step)
        diff = np.flatnonzero(a[start:stop] != b[start:stop])
        if len(diff):
            return start + int(diff[0])
        start, step = stop, step * 2
    return n

