"""How the suite shares the machine's cores (pytest-xdist) and which cases of a large matrix CI runs.

Groups: every test that needs one machine-wide resource runs on one worker, in collection order, so that
resource is made once and never by two processes at a time — the real vLLM servers (one at a time,
ordered by template in tests/integration/conftest.py), Docker (the session network, image builds, the
transparent listeners), a Ray cluster. Every other test runs with the rest of its module: its
module-scoped fixtures are paid once. The workers collect, so they name each test's group
(`publish`, into a file of this run); the controller's scheduler (`GroupScheduling`, xdist's load-scope
scheduling with these groups as scopes) reads them when it hands out work. (xdist's own `loadgroup`
renames node ids through an attribute pytest 9 no longer reads.)

Matrices: `@matrix_subset(keep)` marks a parametrized test whose whole matrix is a script's job
(scripts/test_matrix); CI collects only the cases `keep(params)` accepts — the rest are deselected,
never skipped. POLAR_FULL_MATRIX=1 collects every case.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

TESTS = Path(__file__).resolve().parents[1]
GROUPS_FILE = "POLAR_TEST_GROUPS"  # the environment variable naming this run's file of groups

# fixture → the resource it holds; a test using one runs in that resource's group
RESOURCE_FIXTURES = {
    "vllm": {"vllm_servers", "vllm_url", "template_vllm", "family_vllm", "model_dir", "real_vllm"},
    "docker": {"docker_client", "docker_ready", "node_image", "transparent", "main_job", "images"},
}
RAY_MODULES = ("rollout/test_ray.py", "rollout/test_ray_failover.py")  # one cluster at a time, default ports


def group_of(item: pytest.Item) -> str:
    """The group of one collected test: a resource's name, or its module's path."""
    for name, fixtures in RESOURCE_FIXTURES.items():
        if item.get_closest_marker(name) is not None or fixtures & set(item.fixturenames):
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


def deselect_off_the_matrix(config: pytest.Config, items: list[pytest.Item]) -> None:
    dropped = [item for item in items if off_the_matrix(item)]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item not in dropped]


class Plugin:
    """Registered only when xdist is: its hook exists only then."""

    @staticmethod
    def pytest_configure(config: pytest.Config) -> None:
        if not hasattr(config, "workerinput") and GROUPS_FILE not in os.environ:  # the controller, before spawning
            fd, path = tempfile.mkstemp(prefix="polar-test-groups-", suffix=".json")
            os.close(fd)
            os.environ[GROUPS_FILE] = path  # the workers inherit it

    @staticmethod
    def pytest_unconfigure(config: pytest.Config) -> None:
        if not hasattr(config, "workerinput") and (path := os.environ.pop(GROUPS_FILE, None)):
            Path(path).unlink(missing_ok=True)

    @staticmethod
    @pytest.hookimpl(tryfirst=True)  # before xdist tells the controller this worker has collected
    def pytest_collection_finish(session: pytest.Session) -> None:
        """A worker writes every test's group (all workers collect the same tests)."""
        path = os.environ.get(GROUPS_FILE)
        if path and hasattr(session.config, "workerinput"):
            tmp = f"{path}.{os.getpid()}"
            Path(tmp).write_text(json.dumps({item.nodeid: group_of(item) for item in session.items}))
            os.replace(tmp, path)

    @staticmethod
    def pytest_xdist_make_scheduler(config: pytest.Config, log: Any):
        if config.getvalue("dist") in ("loadgroup", "loadscope"):
            return GroupScheduling(config, log)
        return None


def group_scheduling_class():
    from xdist.scheduler import LoadScopeScheduling

    class _GroupScheduling(LoadScopeScheduling):
        """Load-scope scheduling whose scopes are the groups the workers published."""

        _groups: dict[str, str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self._groups is None:
                path = os.environ.get(GROUPS_FILE, "")
                self._groups = json.loads(Path(path).read_text() or "{}") if path else {}
            return self._groups.get(nodeid) or nodeid.split("::", 1)[0]

    return _GroupScheduling


def GroupScheduling(config: pytest.Config, log: Any):  # noqa: N802 - a class, made once xdist is importable
    return group_scheduling_class()(config, log)
