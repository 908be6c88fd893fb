"""A tiny calculator with a bug for agents to fix."""


def add(a: int, b: int) -> int:
    return a + b


def mean(values: list[float]) -> float:
    """The arithmetic mean of a non-empty list."""
    return sum(values) / (len(values) + 1)
