"""Sandboxes as Apptainer instances (HPC clusters, where Docker is not allowed), via spython.

Same promise as the Docker runtime, built from Apptainer's parts:
  - network: each instance joins polar's CNI bridge network (`--net --network polar`, defined by
    runtimes/apptainer/polar.conflist: no masquerade, no default route), so it gets its own IP —
    the session key — and can reach nothing but the bridge's gateway IP, where polar listens.
    runtimes/apptainer/setup_network.sh installs the network (root, once per node) and allows it
    for unprivileged users; it also creates the bridge up front so polar can bind its IP before
    the first instance starts.
  - names: a generated /etc/hosts maps every intercepted provider host to the gateway IP and a
    resolv.conf naming a dead server on loopback makes every other name fail at once.
  - trust: polar's CA certificate is bound read-only over the image's system bundle path and at
    /usr/local/share/ca-certificates; everything reachable is polar, so it is the only CA needed.
    The CA variables (`ca_env`) point at it too. The key is never bound.
  - rootless: no setuid; `--fakeroot` when asked. Each instance writes into its own overlay
    directory (`--overlay`), and every `exec` runs with `--cleanenv` plus the sandbox's env file,
    so nothing from the caller's environment (a base URL, a proxy) leaks in.
spython starts, lists and stops instances. Commands run through `singularity exec` directly:
spython's `execute` merges stdout with stderr and has no timeout.

NOT RUN HERE: the machine that built this has no Apptainer binary and no network for a CNI
bridge, so only the command construction and the calls into spython are tested
(tests/sandboxes/test_apptainer.py, with a recording stand-in for the binary). Untested against a
real Apptainer: the `ip` field of `instance list --json`, the CNI network itself, binding a file
over /etc/hosts and the bundle inside a SIF image, and `--overlay` on a directory when rootless
(it needs unprivileged overlayfs, kernel >= 5.11, or fuse-overlayfs).
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path

from polar.sandboxes.base import (
    AddressBook,
    Command,
    ExecResult,
    Runtime,
    RuntimeUnavailable,
    Sandbox,
    SandboxSpec,
    ca_env,
    copy_path,
    shell_argv,
    slug,
)

BINARY = "singularity"  # what spython runs; Apptainer installs it as an alias of `apptainer`
NETWORK = "polar"
GATEWAY_IP = "10.87.0.1"  # must match runtimes/apptainer/polar.conflist
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
CA_IN_SANDBOX = "/usr/local/share/ca-certificates/polar-ca.crt"
XFER = "/.polar-xfer"  # per-sandbox host directory bound in, for copy_in / copy_out
_RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
_KILL_GRACE_S = 5
_TIMEOUT_EXIT_CODES = (124, 137)


def require_binary() -> str:
    found = shutil.which(BINARY)
    if found is None:
        raise RuntimeUnavailable(
            f"Apptainer is not installed: no `{BINARY}` on PATH (spython runs it; Apptainer packages install it "
            "beside `apptainer`). Install Apptainer, then run runtimes/apptainer/setup_network.sh as root."
        )
    return found


@dataclass(frozen=True)
class SandboxFiles:
    """Host files generated for one sandbox and bound into it."""

    dir: Path
    hosts: Path
    resolv: Path
    env: Path
    overlay: Path
    xfer: Path


def write_sandbox_files(spec: SandboxSpec, gateway_ip: str, into: Path) -> SandboxFiles:
    into.mkdir(parents=True, exist_ok=True)
    files = SandboxFiles(into, into / "hosts", into / "resolv.conf", into / "env", into / "overlay", into / "xfer")
    lines = ["127.0.0.1 localhost", "::1 localhost ip6-localhost"]
    lines += [f"{gateway_ip} {host}" for host in spec.intercept_hosts]
    files.hosts.write_text("\n".join(lines) + "\n")
    files.resolv.write_text(_RESOLV_CONF)
    env = dict(spec.env)
    if spec.ca_cert is not None:
        env = {**ca_env(CA_IN_SANDBOX, SYSTEM_BUNDLE), **env}
    files.env.write_text("".join(f"{k}={shlex.quote(v)}\n" for k, v in env.items()))
    files.overlay.mkdir(exist_ok=True)
    files.xfer.mkdir(exist_ok=True)
    return files


def instance_options(spec: SandboxSpec, files: SandboxFiles, network: str = NETWORK, fakeroot: bool = False) -> list[str]:
    """`instance start` options for one sandbox (everything but the image and the name)."""
    opts = ["--containall", "--cleanenv", "--net", "--network", network, "--overlay", str(files.overlay)]
    if fakeroot:
        opts.append("--fakeroot")
    binds = [
        f"{files.hosts}:/etc/hosts:ro",
        f"{files.resolv}:/etc/resolv.conf:ro",
        f"{files.xfer}:{XFER}",
    ]
    if spec.ca_cert is not None:
        cert = Path(spec.ca_cert).resolve()
        binds += [f"{cert}:{SYSTEM_BUNDLE}:ro", f"{cert}:{CA_IN_SANDBOX}:ro"]
    binds += [f"{m.source}:{m.target}:{'ro' if m.read_only else 'rw'}" for m in spec.mounts]
    for bind in binds:
        opts += ["--bind", bind]
    limits = spec.resources
    if limits.cpus:
        opts += ["--cpus", f"{limits.cpus:g}"]
    if limits.memory:
        opts += ["--memory", limits.memory]
    if limits.pids:
        opts += ["--pids-limit", str(limits.pids)]
    return opts


def exec_argv(
    instance: str,
    cmd: Command,
    env_file: Path,
    workdir: str,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> list[str]:
    """`singularity exec` into a running instance, with only the sandbox's environment."""
    argv = [BINARY, "exec", "--cleanenv", "--env-file", str(env_file), "--pwd", workdir]
    for key, value in (env or {}).items():
        argv += ["--env", f"{key}={value}"]
    inner = shell_argv(cmd)
    if timeout is not None:
        # Killing the `singularity exec` client would leave the process running in the instance.
        inner = ["timeout", "-k", str(_KILL_GRACE_S), f"{timeout:g}", *inner]
    return [*argv, f"instance://{instance}", *inner]


class ApptainerRuntime(Runtime):
    def __init__(
        self,
        addresses: AddressBook | None = None,
        gateway_ip: str = GATEWAY_IP,
        network: str = NETWORK,
        fakeroot: bool = False,
        state_dir: str | Path | None = None,
    ):
        require_binary()
        from spython.main import get_client

        self.client = get_client(quiet=True)
        self.addresses = addresses
        self.gateway_ip = gateway_ip  # polar listens here: `polar.mitm.transparent.with_transparent(cfg, rt.gateway_ip)`
        self.network = network
        self.fakeroot = fakeroot
        self.state_dir = Path(state_dir) if state_dir else Path(tempfile.mkdtemp(prefix="polar-apptainer-"))
        self._sandboxes: list[ApptainerSandbox] = []

    def start(self, spec: SandboxSpec) -> ApptainerSandbox:
        name = spec.name or f"polar-{slug(spec.session)}-{uuid.uuid4().hex[:6]}"
        files = write_sandbox_files(spec, self.gateway_ip, self.state_dir / name)
        options = instance_options(spec, files, self.network, self.fakeroot)
        instance = self.client.instance(spec.image, name=name, options=options, quiet=True)
        sandbox = ApptainerSandbox(self, instance, spec, files)
        try:
            sandbox.address = self._address_of(name)
            mkdir = sandbox.exec(["mkdir", "-p", spec.workdir], workdir="/")
            if not mkdir.ok:
                raise RuntimeError(f"could not create {spec.workdir} in instance {name}: {mkdir.stderr}")
        except BaseException:
            sandbox.stop()
            raise
        if self.addresses is not None:
            self.addresses.register_address(sandbox.address, spec.session)
        self._sandboxes.append(sandbox)
        return sandbox

    def _address_of(self, name: str) -> str:
        listed = self.client.instances(name=name, return_json=True, quiet=True)
        listed = [listed] if isinstance(listed, dict) else listed  # spython unwraps a single match
        found = [i for i in listed if i.get("instance") == name]
        if not found:
            raise RuntimeError(f"instance {name} did not start; see `{BINARY} instance list` and its log files")
        address = (found[0].get("ip") or "").split("/")[0]
        if not address:
            raise RuntimeError(f"instance {name} has no IP: is the CNI network '{self.network}' installed and allowed?")
        return address

    def close(self) -> None:
        for sandbox in list(self._sandboxes):
            sandbox.stop()


class ApptainerSandbox(Sandbox):
    def __init__(self, runtime: ApptainerRuntime, instance, spec: SandboxSpec, files: SandboxFiles):
        self.runtime = runtime
        self.instance = instance  # spython's Instance
        self.name: str = instance.name
        self.spec = spec
        self.files = files
        self.address: str | None = None
        self._stopped = False

    def exec(
        self, cmd: Command, env: dict[str, str] | None = None, timeout: float | None = None, workdir: str | None = None
    ) -> ExecResult:
        argv = exec_argv(self.name, cmd, self.files.env, workdir or self.spec.workdir, env, timeout)
        done = subprocess.run(argv, capture_output=True)
        timed_out = timeout is not None and done.returncode in _TIMEOUT_EXIT_CODES
        return ExecResult(done.returncode, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace"), timed_out)

    def copy_in(self, host_path: str | Path, container_path: str) -> None:
        staged = self.files.xfer / uuid.uuid4().hex
        copy_path(Path(host_path), staged)
        try:
            place = 'mkdir -p "$(dirname "$2")" && cp -a "$1" "$2"'
            self._check(self.exec(["sh", "-c", place, "-", f"{XFER}/{staged.name}", container_path], workdir="/"))
        finally:
            _remove(staged)

    def copy_out(self, container_path: str, host_path: str | Path) -> None:
        staged = self.files.xfer / uuid.uuid4().hex
        try:
            self._check(self.exec(["cp", "-a", container_path, f"{XFER}/{staged.name}"], workdir="/"))
            copy_path(staged, Path(host_path))
        finally:
            _remove(staged)

    def _check(self, result: ExecResult) -> None:
        if not result.ok:
            raise RuntimeError(f"copy in instance {self.name} failed: {result.stderr.strip()}")

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.address and self.runtime.addresses is not None:
            self.runtime.addresses.forget_address(self.address)
        self.instance.stop(quiet=True)
        shutil.rmtree(self.files.dir, ignore_errors=True)
        if self in self.runtime._sandboxes:
            self.runtime._sandboxes.remove(self)


def _remove(path: Path) -> None:
    if path.is_dir():
        shutil.rmtree(path, ignore_errors=True)
    else:
        path.unlink(missing_ok=True)
