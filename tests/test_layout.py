"""The layout shows the architecture: small modules with one job, packages per concern, a thin root."""

from __future__ import annotations

from pathlib import Path

POLAR = Path(__file__).resolve().parents[1] / "polar"
ROOT_MODULES = {"__init__.py", "canonical.py", "errors.py", "json_values.py", "object_memo.py", "sqlite_files.py"}  # the shared model and helpers
MAX_LINES = 500


def test_the_root_holds_only_the_shared_model():
    assert {p.name for p in POLAR.glob("*.py")} <= ROOT_MODULES


def test_no_module_outgrows_one_job():
    big = {str(p.relative_to(POLAR)): n for p in POLAR.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert big == {}, f"split these modules (over {MAX_LINES} lines): {big}"


def test_every_package_says_what_it_holds():
    silent = [str(d.relative_to(POLAR)) for d in POLAR.rglob("*") if d.is_dir() and (d / "__init__.py").exists()
              and not (d / "__init__.py").read_text().lstrip().startswith(('"""', "'''", "#", "from", "import"))]
    assert silent == []
