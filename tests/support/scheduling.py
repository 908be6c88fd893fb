"""How the suite shares the machine's cores (pytest-xdist, `--dist loadgroup`) and which cases of a large
matrix CI runs.

Groups: every test that needs one machine-wide resource runs on one worker, in collection order, so that
resource is made once and never by two processes at a time — the real vLLM servers (one at a time,
ordered by template in tests/integration/conftest.py), Docker (the session network, image builds, the
transparent listeners), a Ray cluster. Every other test runs with the rest of its module: its
module-scoped fixtures are paid once.

Matrices: `@matrix_subset(keep)` marks a parametrized test whose whole matrix is a script's job
(scripts/test_matrix); CI collects only the cases `keep(params)` accepts — the rest are deselected,
never skipped. POLAR_FULL_MATRIX=1 collects every case.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]

# fixture → the resource it holds; a test using one runs in that resource's group
RESOURCE_FIXTURES = {
    "vllm": {"vllm_servers", "vllm_url", "template_vllm", "model_dir", "real_vllm"},
    "docker": {"docker_client", "docker_ready", "node_image", "transparent", "main_job", "images"},
}
RESOURCE_MARKERS = ("vllm", "docker")
RAY_MODULES = ("rollout/test_ray.py", "rollout/test_ray_failover.py")  # one cluster at a time, default ports


def group_of(item: pytest.Item) -> str:
    """The xdist group of one collected test."""
    for name in RESOURCE_MARKERS:
        if item.get_closest_marker(name) is not None or RESOURCE_FIXTURES[name] & set(item.fixturenames):
            return name
    path = Path(str(item.path))
    rel = path.relative_to(TESTS).as_posix() if TESTS in path.parents else path.name
    if rel.startswith("integration/"):
        return "vllm"
    if rel in RAY_MODULES:
        return "ray"
    return rel


def matrix_subset(keep: Callable[[dict[str, Any]], bool]):
    """Mark a parametrized test: CI runs the cases `keep(params)` accepts; POLAR_FULL_MATRIX=1 runs them all."""

    def mark(test):
        test.matrix_subset = keep
        return test

    return mark


def off_the_matrix(item: pytest.Item) -> bool:
    keep = getattr(getattr(item, "function", None), "matrix_subset", None)
    if keep is None or os.environ.get("POLAR_FULL_MATRIX") == "1":
        return False
    return not keep(item.callspec.params if hasattr(item, "callspec") else {})


def schedule(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Deselect the cases off their matrix's subset; put every test in its xdist group."""
    dropped = [item for item in items if off_the_matrix(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]
    for item in items:
        item.add_marker(pytest.mark.xdist_group(group_of(item)))
