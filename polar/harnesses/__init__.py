"""Harness shortcuts: the coding CLIs polar runs unchanged in session sandboxes, by name."""

from __future__ import annotations

from polar.harnesses.base import Harness, write_files
from polar.harnesses.claude_code import CLAUDE_CODE
from polar.harnesses.codex import CODEX
from polar.harnesses.gemini_cli import GEMINI_CLI
from polar.harnesses.opencode import OPENCODE
from polar.harnesses.pi import PI
from polar.harnesses.qwen_code import QWEN_CODE
from polar.harnesses.shell import SHELL, Shell

CLIS: tuple[Harness, ...] = (CLAUDE_CODE, CODEX, GEMINI_CLI, OPENCODE, PI, QWEN_CODE)  # installed from npm
HARNESSES: dict[str, Harness] = {h.name: h for h in (*CLIS, SHELL)}


def get(name: str) -> Harness:
    try:
        return HARNESSES[name]
    except KeyError:
        raise KeyError(f"unknown harness {name!r}; known: {', '.join(sorted(HARNESSES))}") from None


__all__ = ["CLIS", "HARNESSES", "Harness", "Shell", "get", "write_files"]
