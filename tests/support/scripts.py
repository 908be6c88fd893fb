"""scripts/ is not a package: the tests load a script as a module by its file name."""

from __future__ import annotations

import importlib.util
import os
import sys
from types import ModuleType

import pytest

from tests.conftest import CACHE, REPO

LITELLM = CACHE / "litellm-venv" / "bin" / "litellm"


def load_script(monkeypatch: pytest.MonkeyPatch, name: str) -> ModuleType:
    """scripts/NAME.py as a module, registered in sys.modules (dataclasses look their module up there)
    and with scripts/ on the path (scripts import their neighbours), both undone after the test."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def with_litellm() -> bool:
    """Whether a bench test adds LiteLLM: POLAR_BENCH_LITELLM=1 requires it, =0 leaves it out, unset uses it
    when its venv (scripts/setup_litellm.sh) is already in the cache."""
    wanted = os.environ.get("POLAR_BENCH_LITELLM")
    if wanted == "1" and not os.access(LITELLM, os.X_OK):
        pytest.fail(f"POLAR_BENCH_LITELLM=1 but no LiteLLM proxy at {LITELLM}: run scripts/setup_litellm.sh")
    return wanted != "0" and os.access(LITELLM, os.X_OK)
