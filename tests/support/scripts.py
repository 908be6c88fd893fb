"""scripts/ is not a package: the tests load a script as a module by its file name."""

from __future__ import annotations

import importlib.util
import sys
from types import ModuleType

import pytest

from tests.conftest import REPO


def load_script(monkeypatch: pytest.MonkeyPatch, name: str) -> ModuleType:
    """scripts/NAME.py as a module, registered in sys.modules (dataclasses look their module up there)
    and with scripts/ on the path (scripts import their neighbours), both undone after the test."""
    monkeypatch.syspath_prepend(str(REPO / "scripts"))
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module
