"""The one `Harness` interface: what polar knows about running an agent, unchanged, in a session sandbox.

The rollout service and the CLI tests both run harnesses through it: `launch` gives the argv and
environment for one task, `files` the config files to write first, `host_files` host files to copy
in, `shell_tool` the tool call a scripted model makes to have the harness run a command.

A CLI harness is installed on the host from npm into a versioned prefix under
${POLAR_CACHE:-~/.cache/polar}/npm, copied into a cached image layer (`runtimes/docker/cli`),
and run headless with the task as its prompt. In transparent mode it gets only what a user would
give it — an API key and its usual config files — never a base URL or a proxy variable: the
sandbox resolves the provider's own host to polar. Harnesses that take a base URL instead (the
generic `shell` command, the small `python-agent`) get polar's URL and a registered per-session key
from `SessionContext`.
"""

from __future__ import annotations

import base64
import dataclasses
import fcntl
import os
import shlex
import shutil
import subprocess
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

HOME = "/root"  # sandboxes run as root unless their spec names a user
SUPPORT_DIR = "/polar"  # sandbox directory for polar's own files: outside the workdir, so out of the diff


def npm_cache() -> Path:
    root = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "polar"))
    return root / "npm"


@dataclass(frozen=True)
class SessionContext:
    """What a harness may need to know about its session, beyond the task."""

    session_id: str
    api_key: str  # registered for this session in the gateway's registry (reverse mode)
    base_url: str  # polar's root URL as seen from the sandbox (reverse mode)
    workdir: str  # sandbox path of the repository
    model: str  # the task's model name, for harnesses that ask for whatever they are told
    python: str  # the Python interpreter inside the sandbox

    def sandbox_relative(self, sandbox_path: str) -> str:
        """A sandbox path as commands should name it: relative to the workdir, which every runtime honours."""
        return os.path.relpath(sandbox_path, self.workdir)

    def provider_env(self) -> dict[str, str]:
        """Base URLs and keys for every provider SDK, all pointing at polar with this session's key."""
        base = self.base_url.rstrip("/")
        return {
            "OPENAI_BASE_URL": f"{base}/v1",
            "OPENAI_API_KEY": self.api_key,
            "ANTHROPIC_BASE_URL": base,
            "ANTHROPIC_API_KEY": self.api_key,
            "GOOGLE_GEMINI_BASE_URL": base,
            "GEMINI_API_KEY": self.api_key,
            "POLAR_MODEL": self.model,
            "POLAR_SESSION": self.session_id,
        }

    def expand(self, text: str) -> str:
        """`{python}` and `{workdir}` placeholders in task-supplied commands."""
        return text.replace("{python}", shlex.quote(self.python)).replace("{workdir}", self.workdir)


@dataclass(frozen=True)
class Harness(ABC):
    name: str
    package: str  # npm package ("" for none)
    version: str  # exact pin: the image tag and the captures depend on it
    provider: str  # the polar provider its model calls speak (capture rows' `provider`)
    model: str  # the model name it asks for; polar serves whatever the upstream serves under it
    # What polar does when the harness drops messages just before an answer it repeats (config/options.py
    # polar_dropped_messages): "keep" where its messages are snapshots it re-sends; None = the gateway's option.
    dropped_messages: str | None = None

    # -- installation ---------------------------------------------------------------------------

    def prefix(self) -> Path:
        """Where `npm install -g --prefix` put this version on the host."""
        safe = self.package.replace("@", "").replace("/", "-")
        return npm_cache() / f"{safe}-{self.version}"

    def npm_install(self) -> Path:
        """Install the pinned package on the host (once); containers never reach a registry."""
        prefix = self.prefix()
        prefix.mkdir(parents=True, exist_ok=True)
        with open(prefix.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test processes install once
            done = prefix.with_name(prefix.name + ".done")  # beside the prefix: it is copied whole
            if not done.exists():
                self.install_into(prefix)
                done.touch()
        return prefix

    def install_into(self, prefix: Path) -> None:
        """`npm install -g` the pinned package into `prefix` (the host's Node runs its install scripts)."""
        npm_install_spec(prefix, f"{self.package}@{self.version}")

    def install_layer(self, client: Any, parent: str) -> str:
        """`parent` (an image with Node) plus this CLI: polar/cli:<hash>, built once per version."""
        from polar.sandboxes.images import build_layer

        if not self.package:
            return parent
        prefix = self.npm_install()
        return build_layer(client, "cli", parent, files={"prefix": prefix}, key=(self.name, self.package, self.version))

    # -- running --------------------------------------------------------------------------------

    @abstractmethod
    def command(self, task_prompt: str) -> list[str]:
        """argv that runs the task headless, without permission prompts, and exits."""

    def env(self, session: str) -> dict[str, str]:
        """Variables to run with: a dummy per-session key, telemetry and updates off."""
        return {}

    def files(self, home: str = HOME) -> dict[str, str]:
        """Config files to write before it runs, for a user whose home is `home`: path → content."""
        return {}

    @abstractmethod
    def shell_tool(self, cmd: str) -> dict[str, Any]:
        """The tool call (name, arguments) a model makes to have this harness run `cmd`."""

    def end_tool(self) -> dict[str, Any] | None:
        """The tool call that ends a run, for a harness that ends only by one (mini-swe-agent's submit);
        None: it ends when the model answers without a tool call."""
        return None

    def read_tool(self, path: str) -> dict[str, Any] | None:
        """The tool call that reads `path` first, for harnesses that refuse to change unread files."""
        return None

    def success(self, exit_code: int) -> bool:
        return exit_code == 0

    # -- in a rollout session ----------------------------------------------------------------------

    @property
    def needs_container(self) -> bool:
        """Installed into an image and configured in its home: it cannot run on the host."""
        return bool(self.package)

    def launch(self, instruction: str, ctx: SessionContext) -> tuple[list[str], dict[str, str]]:
        """The argv (run in the workdir) and environment for one session. A CLI gets only what a
        user would give it; harnesses that take a base URL override this to get polar's."""
        return self.command(instruction), self.env(ctx.session_id)

    def host_files(self, ctx: SessionContext) -> dict[str, Path]:
        """Host files to copy into the sandbox before it runs: {sandbox path: host path}."""
        return {}

    def with_options(self, **options: Any) -> Harness:
        """This harness with some fields replaced (a task's `harness.options`, e.g. a model or version)."""
        fields = {f.name for f in dataclasses.fields(self)} - {"name"}
        unknown = sorted(set(options) - fields)
        if unknown:
            raise ValueError(f"harness {self.name!r} has no option {', '.join(unknown)} (it has: {', '.join(sorted(fields))})")
        return dataclasses.replace(self, **options)


def npm_install_spec(prefix: Path, spec: str, node: Path | None = None) -> None:
    """`node`: another Node to run npm and the package's install scripts with (one the package requires)."""
    npm = ["npm"] if node is None else [str(node), str(Path(shutil.which("npm") or "npm").resolve())]
    env = None if node is None else {**os.environ, "PATH": f"{node.parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    # Run inside the prefix: npm takes a spec such as `opencode-ai@1.2` for a path when a
    # directory of that name exists in its working directory.
    done = subprocess.run(
        [*npm, "install", "-g", "--no-fund", "--no-audit", "--prefix", str(prefix), spec],
        check=False,
        capture_output=True,
        text=True,
        cwd=prefix,
        env=env,
    )
    if done.returncode != 0:
        raise RuntimeError(f"npm install {spec} failed:\n{(done.stdout + done.stderr)[-3000:]}")


def session_key(prefix: str, session: str) -> str:
    """A dummy API key naming the session; the key is never checked (the sandbox's address is)."""
    return f"{prefix}polar-{session}"


def write_files(sandbox: Any, files: dict[str, str]) -> None:
    """Write small text files into a sandbox through `exec` (no host staging needed)."""
    for path, content in files.items():
        target = PurePosixPath(path)
        payload = base64.b64encode(content.encode()).decode()
        script = f"mkdir -p {shlex.quote(str(target.parent))} && echo {payload} | base64 -d > {shlex.quote(str(target))}"
        done = sandbox.exec(["sh", "-c", script], workdir="/")
        if not done.ok:
            raise RuntimeError(f"writing {path} into the sandbox failed: {done.stderr.strip()}")
