"""Shared pieces of the property-based tests: arbitrary JSON, and one-field mutations of a valid body."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st


def json_values(text: int = 8, leaves: int = 12, ints: st.SearchStrategy = st.integers(),
                nan: bool = False) -> st.SearchStrategy:
    """Any JSON document (NaN only when `nan`: some providers' SDKs send it, JSON proper has none)."""
    return st.recursive(
        st.none() | st.booleans() | ints | st.floats(allow_nan=nan) | st.text(max_size=text),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=text), inner, max_size=3),
        max_leaves=leaves,
    )


def paths(value: Any, prefix: tuple = ()) -> list[tuple]:
    """Every position in a JSON value, the root `()` first, as key/index tuples."""
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else []
    return [prefix] + [p for key, child in children for p in paths(child, (*prefix, key))]


def replace(value: Any, path: tuple, new: Any) -> Any:
    """A copy of `value` with the item at `path` replaced by `new`."""
    if not path:
        return new
    copy = dict(value) if isinstance(value, dict) else list(value)
    copy[path[0]] = replace(value[path[0]], path[1:], new)
    return copy


def drop(value: Any, path: tuple) -> Any:
    """A copy of `value` without the item at `path` (not the root)."""
    copy = dict(value) if isinstance(value, dict) else list(value)
    if len(path) == 1:
        del copy[path[0]]
    else:
        copy[path[0]] = drop(value[path[0]], path[1:])
    return copy
