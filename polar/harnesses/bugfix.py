"""The one-bug repository task that a real CLI solves in its own sandbox against a scripted model.

Used by the CLI tests (tests/harnesses) and by scripts/record_harness_requests.py: the scripted model
has the CLI call its own shell tool with a `sed` that fixes `add` (after a read, for a CLI that will not
edit an unread file), then says "done" — a session of two or three model calls, each real.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.harnesses.base import Harness, SessionContext, session_key, write_files
from polar.sandboxes import SandboxSpec

RUN_TIMEOUT_S = 180
REPO = "/work/repo"
CALC = "def add(a, b):\n    return a - b\n"
TEST = "from calc import add\n\n\ndef test_add():\n    assert add(2, 3) == 5\n"
FIX = "sed -i 's/a - b/a + b/' calc.py"
REASONING = "The operator in add is a minus; it should be a plus."


@dataclass
class Run:
    harness: Harness
    session: str
    marker: str
    exit_code: int
    output: str
    calc: str
    env: str
    seconds: float


def task_prompt(marker: str) -> str:
    return f"[{marker}] The test in test_calc.py fails. Fix the bug in calc.py."


def steps(harness: Harness) -> list[dict]:
    """The scripted model's turns: the harness's shell tool runs the fix (after a read if it insists), then "done"."""
    read = harness.read_tool(f"{REPO}/calc.py")
    calls = ([read] if read else []) + [harness.shell_tool(FIX)]
    # Reasoning on each tool turn: the CLI must carry it (and its signature) back in its history.
    done = {"content": "done", "tool_calls": [end] if (end := harness.end_tool()) else []}
    return [{"reasoning": REASONING, "content": "", "tool_calls": [call]} for call in calls] + [done]


def run_task(runtime: Any, ca_cert: Path, image: str, harness: Harness, session: str, tmp_path: Path,
             marker: str | None = None, base_url: str | None = None) -> Run:
    """The CLI in `image`, unchanged, on the task in a fresh sandbox of `runtime` (which resolves the
    providers' hosts to polar); `tmp_path` holds the repository and the fixed file copied back.
    `marker` tags the task prompt (default: from the session) for the scripted model's rule to match.
    `base_url`: polar's URL as the sandbox sees it, for a harness that takes one (launched as a rollout session
    launches it; its calls are the session's by the sandbox's address)."""
    marker = marker or f"polar-task-{session}"
    repo = tmp_path / session / "repo"
    repo.mkdir(parents=True)
    (repo / "calc.py").write_text(CALC)
    (repo / "test_calc.py").write_text(TEST)
    argv, variables = harness.command(task_prompt(marker)), harness.env(session)
    ctx = SessionContext(session, session_key("sk-", session), base_url or "", REPO, harness.model, "python3")
    if base_url:
        argv, variables = harness.launch(task_prompt(marker), ctx)
    spec = SandboxSpec(image=image, session=session, ca_cert=ca_cert, env=variables)
    with runtime.start(spec) as box:
        write_files(box, harness.files())
        for target, source in (harness.host_files(ctx) if base_url else {}).items():
            box.copy_in(source, target)
        box.copy_in(repo, REPO)
        env = box.exec("env").stdout
        started = time.monotonic()
        done = box.exec(argv, timeout=RUN_TIMEOUT_S, workdir=REPO)
        seconds = time.monotonic() - started
        box.copy_out(f"{REPO}/calc.py", tmp_path / session / "calc.py")
    calc = (tmp_path / session / "calc.py").read_text()
    return Run(harness, session, marker, done.exit_code, done.stdout + done.stderr, calc, env, seconds)
