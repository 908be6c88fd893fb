"""Harnesses by name: the coding CLIs polar runs unchanged in session sandboxes, the Python agents from
PyPI, a generic shell command, and the small python-agent — all behind the one `Harness` interface (base.py)."""

from __future__ import annotations

from typing import Any

from polar.harnesses.base import SUPPORT_DIR, Harness, SessionContext, write_files
from polar.harnesses.claude_code import CLAUDE_CODE
from polar.harnesses.codex import CODEX
from polar.harnesses.gemini_cli import GEMINI_CLI
from polar.harnesses.hermes import HERMES
from polar.harnesses.mini_swe_agent import MINI_SWE_AGENT, MiniSweAgent
from polar.harnesses.openclaw import OPENCLAW
from polar.harnesses.opencode import OPENCODE
from polar.harnesses.openhands import OPENHANDS
from polar.harnesses.pi import PI
from polar.harnesses.python_agent import PYTHON_AGENT, PythonAgent
from polar.harnesses.qwen_code import QWEN_CODE
from polar.harnesses.shell import SHELL, Shell

CLIS: tuple[Harness, ...] = (CLAUDE_CODE, CODEX, GEMINI_CLI, OPENCODE, PI, QWEN_CODE)  # installed from npm
PYTHON_AGENTS: tuple[Harness, ...] = (HERMES, MINI_SWE_AGENT, OPENHANDS)  # installed from PyPI
# The agents given polar's base URL (OpenClaw from npm: its provider config names no default host).
AGENTS: tuple[Harness, ...] = (OPENCLAW, *PYTHON_AGENTS)
HARNESSES: dict[str, Harness] = {h.name: h for h in (*CLIS, OPENCLAW, *PYTHON_AGENTS, SHELL, PYTHON_AGENT)}


def get(name: str) -> Harness:
    try:
        return HARNESSES[name]
    except KeyError:
        raise KeyError(f"unknown harness {name!r}; known: {', '.join(sorted(HARNESSES))}") from None


def make_harness(name: str, options: dict[str, Any] | None = None) -> Harness:
    """A task's harness: the registered one, with its options applied (ValueError when unknown)."""
    if name not in HARNESSES:
        raise ValueError(f"unknown harness {name!r} (known: {', '.join(sorted(HARNESSES))})")
    return HARNESSES[name].with_options(**(options or {})) if options else HARNESSES[name]


__all__ = ["AGENTS", "CLIS", "HARNESSES", "PYTHON_AGENTS", "SUPPORT_DIR", "Harness", "MiniSweAgent", "PythonAgent",
           "SessionContext", "Shell", "get", "make_harness", "write_files"]
