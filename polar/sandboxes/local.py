"""Sandboxes as plain host directories and processes, for development. No isolation at all.

Explicit-proxy mode: commands get HTTPS_PROXY / HTTP_PROXY pointing at polar's regular-mode
listener and the CA variables pointing at polar's CA certificate, so clients that honour proxy
variables (curl, Python's httpx/requests, the Node CLIs that install an env-proxy agent) reach
polar. Every call arrives from 127.0.0.1, so sessions cannot be told apart by address here: give
each session its own API key and register it (`SessionRegistry.register_key`).

Sandbox paths (workdir, copies, mount targets) map under a per-sandbox root directory: `/work/x`
is `<root>/work/x` on the host; commands themselves run on the host, so they should use paths
relative to their working directory. The spec's image, resource limits and intercepted hosts do
not apply (the host's own programs run, unconfined); mounts become symlinks, not read-only.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import threading
from pathlib import Path

from polar.sandboxes.base import Command, ExecResult, Runtime, Sandbox, SandboxSpec, ca_env, copy_path, shell_argv, slug

_NO_PROXY = "localhost,127.0.0.1,::1"  # harness-local servers (opencode's TUI backend) stay direct
# Variables from the developer's shell that would send a harness somewhere else than polar.
_REDIRECTING = ("PROXY", "BASE_URL", "CA_CERT", "CA_BUNDLE", "CA_CERTIFICATE")


class LocalRuntime(Runtime):
    def __init__(self, proxy_url: str, ca_cert: str | Path, root: str | Path | None = None):
        self.proxy_url = proxy_url
        self.ca_cert = str(ca_cert)
        self.root = Path(root) if root else None

    def start(self, spec: SandboxSpec) -> LocalSandbox:
        root = Path(tempfile.mkdtemp(prefix=f"polar-{slug(spec.session)}-", dir=self.root))
        env = {k: v for k, v in os.environ.items() if not any(part in k.upper() for part in _REDIRECTING)}
        cert = str(spec.ca_cert or self.ca_cert)
        env.update(ca_env(cert, cert))  # every HTTPS call goes through polar: its CA is the only one needed
        for name in ("HTTPS_PROXY", "HTTP_PROXY", "https_proxy", "http_proxy"):
            env[name] = self.proxy_url
        env["NO_PROXY"] = env["no_proxy"] = _NO_PROXY
        env.update(spec.env)
        sandbox = LocalSandbox(spec, root, env)
        sandbox.host_path(spec.workdir).mkdir(parents=True, exist_ok=True)
        for mount in spec.mounts:
            link = sandbox.host_path(mount.target)
            link.parent.mkdir(parents=True, exist_ok=True)
            link.symlink_to(Path(mount.source).resolve())
        return sandbox


class LocalSandbox(Sandbox):
    def __init__(self, spec: SandboxSpec, root: Path, env: dict[str, str]):
        self.spec = spec
        self.root = root
        self.env = env
        self.address = None
        self._running: set[subprocess.Popen] = set()  # commands in flight, for interrupt()
        self._interrupted = False
        self._lock = threading.Lock()

    def host_path(self, sandbox_path: str) -> Path:
        """Where a sandbox path lives on the host (always inside the sandbox's root)."""
        path = (self.root / sandbox_path.lstrip("/")).resolve()
        if path != self.root.resolve() and self.root.resolve() not in path.parents:
            raise ValueError(f"{sandbox_path} leaves the sandbox")
        return path

    def exec(
        self, cmd: Command, env: dict[str, str] | None = None, timeout: float | None = None, workdir: str | None = None
    ) -> ExecResult:
        with self._lock:  # an interrupt either sees this process or stops it from starting
            if self._interrupted:
                return ExecResult(-9, "", "interrupted", timed_out=False)
            proc = subprocess.Popen(
                shell_argv(cmd),
                cwd=self.host_path(workdir or self.spec.workdir),
                env={**self.env, **(env or {})},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a timeout kills the whole tree
            )
            self._running.add(proc)
        try:
            out, err = proc.communicate(timeout=timeout)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = proc.communicate()
            timed_out = True
        finally:
            self._running.discard(proc)
        return ExecResult(proc.returncode, out.decode(errors="replace"), err.decode(errors="replace"), timed_out)

    def copy_in(self, host_path: str | Path, container_path: str) -> None:
        copy_path(Path(host_path), self.host_path(container_path))

    def copy_out(self, container_path: str, host_path: str | Path) -> None:
        copy_path(self.host_path(container_path), Path(host_path))

    def interrupt(self) -> None:
        with self._lock:
            self._interrupted = True
            for proc in list(self._running):
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def stop(self) -> None:
        self.interrupt()
        shutil.rmtree(self.root, ignore_errors=True)

