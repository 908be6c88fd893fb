"""Small real repositories in SWE-bench layout, built with git: an instance row (base_commit, test_patch,
FAIL_TO_PASS, PASS_TO_PASS as `datasets` writes them), its gold patch and a patch that fixes only part.

Two test frameworks, each producing the output swebench's parser for the row's repo reads:
- `django/django` 3.0: a `tests/runtests.py` on the standard library's unittest at verbosity 2 (swebench
  runs `./tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 <modules>`, parse_log_django);
- `pytest-dev/pytest` 5.4: a pytest suite (`pytest -rA <files>`, parse_log_pytest);
- `acme/textkit` (unknown to swebench): the same with the row's own test_cmd and log_parser.
The repository names pick swebench's test command and parser; the code under test is these toys.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

OPS = "def add(a, b):\n    return a {add} b\n\n\ndef sub(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a {mul} b\n"
OPS_BUGGY, OPS_HALF, OPS_FIXED = (OPS.format(add=a, mul=m) for a, m in (("-", "+"), ("+", "+"), ("+", "*")))

RUNTESTS = '''#!/usr/bin/env python3
"""Django-style test runner: unittest labels, verbosity 2 (the options Django's runtests.py takes)."""
import argparse
import os
import sys
import unittest

parser = argparse.ArgumentParser()
parser.add_argument("labels", nargs="*")
parser.add_argument("--verbosity", type=int, default=1)
parser.add_argument("--settings")
parser.add_argument("--parallel")
args = parser.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.dirname(here)]
loader = unittest.defaultTestLoader
suite = loader.loadTestsFromNames(args.labels) if args.labels else loader.discover(here)
sys.exit(not unittest.TextTestRunner(verbosity=args.verbosity).run(suite).wasSuccessful())
'''

UNITTEST_BASE = ("import unittest\n\nfrom calc.ops import add, mul, sub\n\n\nclass OpsTests(unittest.TestCase):\n"
                 "    def test_sub(self):\n        self.assertEqual(sub(5, 3), 2)\n")
UNITTEST_NEW = UNITTEST_BASE + ("\n    def test_add(self):\n        self.assertEqual(add(2, 3), 5)\n"
                                "\n    def test_mul(self):\n        self.assertEqual(mul(2, 3), 6)\n")
PYTEST_BASE = "from calc.ops import add, mul, sub\n\n\ndef test_sub():\n    assert sub(5, 3) == 2\n"
PYTEST_NEW = PYTEST_BASE + ("\n\ndef test_add():\n    assert add(2, 3) == 5\n"
                            "\n\ndef test_mul():\n    assert mul(2, 3) == 6\n")


@dataclass
class Instance:
    row: dict  # the SWE-bench row, as a dataset holds it
    repo_dir: Path  # the clone, at base_commit
    gold: str
    partial: str  # fixes add, not mul


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "-c", "commit.gpgsign=false", *args],
                          cwd=repo, check=True, capture_output=True, text=True).stdout


def _diff(repo: Path, files: dict[str, str]) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    _git(repo, "add", "-A")
    diff = _git(repo, "diff", "--cached")
    _git(repo, "reset", "-q", "--hard", "HEAD")
    _git(repo, "clean", "-qfd")
    return diff


METAS = {
    "django": {"repo": "django/django", "version": "3.0", "instance_id": "django__django-90001"},
    "pytest": {"repo": "pytest-dev/pytest", "version": "5.4", "instance_id": "pytest-dev__pytest-90002"},
    "custom": {"repo": "acme/textkit", "version": "0.1", "instance_id": "acme__textkit-7", "test_cmd": "pytest -rA",
               "log_parser": "parse_log_pytest"},
}


def build(root: Path, kind: str) -> Instance:
    """kind: `django` (unittest, Django-style runner), `pytest`, or `custom` (a repo swebench does not know).
    The clone is `root/<owner>/<name>`, the layout of a `--repos` mirror."""
    meta = METAS[kind]
    repo = root / meta["repo"]
    repo.mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "calc").mkdir()
    (repo / "calc" / "__init__.py").write_text("")
    (repo / "calc" / "ops.py").write_text(OPS_BUGGY)
    if kind == "django":
        (repo / "tests" / "calc_tests").mkdir(parents=True)
        (repo / "tests" / "calc_tests" / "__init__.py").write_text("")
        (repo / "tests" / "runtests.py").write_text(RUNTESTS)
        (repo / "tests" / "runtests.py").chmod(0o755)
        test_file, base_tests, new_tests = "tests/calc_tests/test_ops.py", UNITTEST_BASE, UNITTEST_NEW
        name = "calc_tests.test_ops.OpsTests.{0}"
        ids = {t: f"{t} ({name.format(t)})" for t in ("test_sub", "test_add", "test_mul")}
    else:
        (repo / "testing").mkdir()
        test_file, base_tests, new_tests = "testing/test_ops.py", PYTEST_BASE, PYTEST_NEW
        (repo / "conftest.py").write_text("")  # the repository root on sys.path, as an installed package would be
        ids = {t: f"{test_file}::{t}" for t in ("test_sub", "test_add", "test_mul")}
    (repo / test_file).write_text(base_tests)
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    gold = _diff(repo, {"calc/ops.py": OPS_FIXED})
    partial = _diff(repo, {"calc/ops.py": OPS_HALF})
    test_patch = _diff(repo, {test_file: new_tests})
    row = {**meta, "base_commit": base, "patch": gold, "test_patch": test_patch,
           "problem_statement": "add() subtracts and mul() adds: make them add and multiply.", "hints_text": "",
           "created_at": "2024-01-01T00:00:00Z", "environment_setup_commit": base,
           "FAIL_TO_PASS": json.dumps([ids["test_add"], ids["test_mul"]]), "PASS_TO_PASS": json.dumps([ids["test_sub"]])}
    return Instance(row, repo, gold, partial)
