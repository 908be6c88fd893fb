"""Python agents from PyPI (Hermes Agent, mini-swe-agent, OpenHands): installed once on the host, run in a venv.

As the CLIs come from npm, these come from PyPI through pip on the host — never from inside a sandbox,
which has no egress. pip installs the pinned package with its dependencies as wheels for the sandbox
image's Python (Debian bookworm's 3.11, x86-64 glibc) into a versioned directory under
${POLAR_CACHE:-~/.cache/polar}/pip; an image layer (`runtimes/docker/pip`) lays it into a venv of its own
at /opt/polar-agent, so the agent's hundreds of MB of dependencies never reach the tasks' own Python.

An agent that needs a newer Python than the image's (OpenHands: >= 3.12) names it in `python`: the host's own
interpreter of that version (pyenv's on these machines; Debian bookworm too, so the same glibc as the images)
installs the packages natively and is laid into the image under /opt/polar-python (`runtimes/docker/pip-python`),
with the Debian packages the agent runs (`debs`, downloaded on the host like the `swe` layer's).

These agents take a base URL: in a rollout session they get polar's URL and the session's key.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.harnesses.base import Harness

VENV = "/opt/polar-agent"
# The sandbox images' Python (bookworm: CPython 3.11, glibc 2.36): wheels are chosen for it, not for the host's.
# pip takes each platform tag a wheel may carry literally, so every glibc up to the image's is named.
_PLATFORMS = [*(f"manylinux_2_{minor}_x86_64" for minor in range(36, 4, -1)), "manylinux2014_x86_64",
              "manylinux2010_x86_64", "manylinux1_x86_64", "linux_x86_64"]
TARGET = ["--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", "--only-binary=:all:",
          *(arg for tag in _PLATFORMS for arg in ("--platform", tag))]


def pip_cache() -> Path:
    return Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "polar")) / "pip"


@dataclass(frozen=True)
class PipHarness(Harness):
    """A harness whose `package` names PyPI distributions (space-separated), each pinned at `version`."""

    python: str = ""  # "3.12": the host's CPython of that version, laid into the image; "": the image's 3.11
    debs: tuple[str, ...] = ()  # Debian packages it runs (with `python` set)

    def prefix(self) -> Path:
        return pip_cache() / (f"{self.name}-{self.version}" + (f"-py{self.python}" if self.python else ""))

    def requirements(self) -> list[str]:
        return [f"{p}=={self.version}" for p in self.package.split()]

    def pip_install(self) -> Path:
        """Install the pinned packages for the sandbox's Python on the host (once)."""
        prefix = self.prefix()
        prefix.parent.mkdir(parents=True, exist_ok=True)
        with open(prefix.parent / ".lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # parallel test processes install once
            done = prefix.with_name(prefix.name + ".done")
            if not done.exists():
                # With the host's interpreter of the image's version, wheels and sdists alike are built for it.
                python, target = (str(host_python(self.python)), []) if self.python else (sys.executable, TARGET)
                cmd = [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile",
                       "--target", str(prefix), *target, *self.requirements()]
                run = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if run.returncode != 0:
                    raise RuntimeError(f"pip install {' '.join(self.requirements())} failed:\n"
                                       f"{(run.stdout + run.stderr)[-3000:]}")
                done.touch()
        return prefix

    def install_layer(self, client: Any, parent: str) -> str:
        """`parent` (an image with python3.11) plus this agent in /opt/polar-agent: polar/pip:<hash>, built once."""
        from polar.sandboxes.images import build_layer

        key = (self.name, self.package, self.version)
        if not self.python:
            return build_layer(client, "pip", parent, files={"site": self.pip_install()}, key=key)
        from polar.sandboxes.debs import download, missing

        debs = download(missing(client, parent, list(self.debs)))
        interpreter = host_python(self.python)
        return build_layer(client, "pip-python", parent, key=(*key, str(interpreter.resolve()), *self.debs),
                           files={"site": self.pip_install(), "python": python_home(interpreter), "debs": debs},
                           args={"PYTHON": self.python})

    def bin(self, script: str) -> str:
        """A console script of the agent, in its venv."""
        return f"{VENV}/bin/{script}"


def host_python(version: str) -> Path:
    """The host's CPython `version` (e.g. "3.12") installed in a tree of its own, which the layer copies whole:
    pyenv's (as scripts/find_python.sh finds it), else one on PATH outside /usr and /usr/local."""
    pyenv = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    found = [*sorted(map(str, pyenv.glob(f"{version}.*/bin/python{version}"))), shutil.which(f"python{version}")]
    for candidate in filter(None, found):
        if python_home(Path(candidate)) in (Path("/usr"), Path("/usr/local")):
            continue
        if subprocess.run([candidate, "-m", "pip", "--version"], capture_output=True, check=False).returncode == 0:
            return Path(candidate)
    raise RuntimeError(f"no Python {version} with pip in a tree of its own on this host (looked in {pyenv} and on PATH)")


def python_home(interpreter: Path) -> Path:
    """The installation tree of a host interpreter (its sys.base_prefix)."""
    out = subprocess.run([str(interpreter), "-c", "import sys; print(sys.base_prefix)"], capture_output=True, text=True,
                         check=True)
    return Path(out.stdout.strip())
