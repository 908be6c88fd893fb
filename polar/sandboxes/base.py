"""The common shape of every runtime: start a sandbox for one session, run commands in it, move
files in and out, stop it.

A sandbox belongs to exactly one session. Runtimes that give each sandbox its own network address
report it to an `AddressBook` (polar's `SessionRegistry` is one), so the gateway attributes every
call from that address to the session without the harness being told anything.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from polar.mitm.transparent import PROVIDER_HOSTS


class RuntimeUnavailable(RuntimeError):
    """The runtime's engine or binary is missing or not answering; the message says what to do."""


class AddressBook(Protocol):
    def register_address(self, address: str, session: str) -> None: ...

    def forget_address(self, address: str) -> None: ...


@dataclass(frozen=True)
class Mount:
    source: str  # host path
    target: str  # path inside the sandbox
    read_only: bool = True


@dataclass(frozen=True)
class Resources:
    cpus: float | None = None  # e.g. 1.5 cores
    memory: str | None = None  # e.g. "2g"
    pids: int | None = None  # process limit: a fork bomb in one session must not starve the rest


@dataclass
class SandboxSpec:
    image: str
    session: str
    workdir: str = "/work"
    env: dict[str, str] = field(default_factory=dict)
    mounts: list[Mount] = field(default_factory=list)
    resources: Resources = field(default_factory=Resources)
    ca_cert: Path | None = None  # polar's CA *certificate* (never the key): trusted inside the sandbox
    intercept_hosts: tuple[str, ...] = PROVIDER_HOSTS  # resolved to polar; every other name fails
    user: str | None = None  # who commands run as (None: the image's default)
    name: str | None = None  # the sandbox's name in its engine (None: derived from the session)


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


Command = list[str] | str  # a string runs through `sh -c`


class Sandbox(ABC):
    spec: SandboxSpec
    address: str | None  # the sandbox's address on the session network, if it has its own

    @property
    def session(self) -> str:
        return self.spec.session

    @abstractmethod
    def exec(
        self, cmd: Command, env: dict[str, str] | None = None, timeout: float | None = None, workdir: str | None = None
    ) -> ExecResult: ...

    @abstractmethod
    def copy_in(self, host_path: str | Path, container_path: str) -> None:
        """Copy a host file or directory to `container_path` (the copy is named after it)."""

    @abstractmethod
    def copy_out(self, container_path: str, host_path: str | Path) -> None:
        """Copy a sandbox file or directory to `host_path` (the copy is named after it)."""

    @abstractmethod
    def stop(self) -> None:
        """Stop and remove the sandbox; idempotent."""

    def interrupt(self) -> None:
        """End the commands running in the sandbox now (a cancelled session). Default: stop it."""
        self.stop()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class Runtime(ABC):
    @abstractmethod
    def start(self, spec: SandboxSpec) -> Sandbox: ...

    def close(self) -> None:
        """Release what the runtime set up for all its sandboxes (networks, rules)."""

    def __enter__(self) -> Runtime:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def slug(session: str) -> str:
    """A session id made safe for container, instance and directory names."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in session).strip("-.")[:40] or "session"


def copy_path(src: Path, dest: Path) -> None:
    """Copy a file or a tree to `dest` (named `dest`), creating its parent."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if src.is_dir():
        shutil.copytree(src, dest, symlinks=True, dirs_exist_ok=True)
    else:
        shutil.copy2(src, dest)


def shell_argv(cmd: Command) -> list[str]:
    return ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)


def ca_env(extra_cert: str, bundle: str) -> dict[str, str]:
    """Variables that make each harness's TLS stack trust polar's CA.

    `extra_cert` is polar's certificate alone (Node adds it to its bundled roots); `bundle` is a
    full trust bundle that contains it (OpenSSL, curl, Python, Codex's rustls replace their roots
    with the file they are given).
    """
    return {
        "NODE_EXTRA_CA_CERTS": extra_cert,
        "SSL_CERT_FILE": bundle,
        "REQUESTS_CA_BUNDLE": bundle,
        "CURL_CA_BUNDLE": bundle,
        "CODEX_CA_CERTIFICATE": bundle,
        "GIT_SSL_CAINFO": bundle,
    }
