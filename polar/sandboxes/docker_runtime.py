"""Sandboxes as Docker containers whose provider HTTPS lands on polar, unchanged.

Network design: one `--internal` bridge network per runtime (that is, per polar run), one
container per session, the session known by the container's IP on that network.
  - `--internal`: the network has no route out; the host side of the bridge (the gateway IP) is
    the only address a container can reach, and polar listens there (`polar.mitm.transparent`).
  - one network, not one per session: polar listens on a single address, parallel sessions cost
    nothing extra, and a container's IP is as good a session key as a network would be — it is
    assigned by Docker, and the container cannot change it (no NET_ADMIN; NET_RAW is dropped too).
  - inter-container traffic is disabled on the bridge (`enable_icc=false`): sessions cannot see
    each other.
  - with `restrict_host=True` (root, iptables), host ports other than 80/443 are refused to the
    bridge, so a container cannot reach other services listening on the host's wildcard address.
    The lock fails closed: if it cannot be installed, the network is removed and `EgressLockFailed`
    says why, unless the user opted out (`allow_open_egress=True`, POLAR_ALLOW_OPEN_EGRESS=1).
Name resolution: each provider host is an `extra_hosts` entry pointing at the gateway IP; the
container's resolv.conf names no working server, so every other name fails at once.
Trust: polar's CA *certificate* is added to the image's system store in a small cached layer
(`images.trusting`, update-ca-certificates at build time); the CA variables (`ca_env`) point each
TLS stack at it. The key never leaves polar's confdir.

    runtime = DockerRuntime(addresses=proxy.addon.gateway.registry)     # proxy: a running BackgroundProxy
    add_listeners(transparent_modes(runtime.gateway_ip))                # polar.mitm.transparent
    spec = SandboxSpec(image=node_image(runtime.client), session="run-17", ca_cert=ca_cert_path())
    with runtime.start(spec) as box:
        box.exec("claude -p 'fix the failing test'", timeout=1800)
"""

from __future__ import annotations

import logging
import os
import secrets
import shlex
import shutil
import socket
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path, PurePosixPath

import docker
import docker.errors
import docker.utils
from docker.types import IPAMConfig, IPAMPool

from polar.sandboxes import images
from polar.sandboxes.base import (
    AddressBook,
    Command,
    ExecResult,
    Runtime,
    RuntimeUnavailable,
    Sandbox,
    SandboxSpec,
    ca_env,
    shell_argv,
    slug,
)

log = logging.getLogger("polar.sandboxes.docker")

CA_IN_CONTAINER = "/usr/local/share/ca-certificates/polar-ca.crt"  # where runtimes/docker/ca puts it
SYSTEM_BUNDLE = "/etc/ssl/certs/ca-certificates.crt"
LABEL = "dev.polar.session"
OWNER = "dev.polar.owner"  # "<host>:<pid>" of the process whose runtime made the container / network
_OWNER = f"{socket.gethostname()}:{os.getpid()}"
BRIDGE_OPTION = "com.docker.network.bridge.name"  # a session network's host interface, named by polar
_TIMEOUT_EXIT_CODES = (124, 137)  # coreutils `timeout`: TERM'd, then KILL'd
_KILL_GRACE_S = 5
# A resolv.conf that names a server on the container's own loopback, where nothing listens: every
# lookup not answered by /etc/hosts is refused at once, rather than timing out.
_RESOLV_CONF = "nameserver 127.0.0.1\noptions timeout:1 attempts:1\n"
ALLOW_OPEN_EGRESS_ENV = "POLAR_ALLOW_OPEN_EGRESS"
_OPT_OUT = f"pass --allow-open-egress / {ALLOW_OPEN_EGRESS_ENV}=1 to run with host ports open"


class EgressLockFailed(RuntimeUnavailable):
    """The host-port lock of a session network could not be installed: the sandbox does not start."""


def connect(timeout: float = 120) -> docker.DockerClient:
    """A client for the local engine, or RuntimeUnavailable saying how to get one."""
    try:
        client = docker.from_env(timeout=timeout)
        client.ping()
        return client
    except docker.errors.DockerException as err:
        raise RuntimeUnavailable(f"no Docker engine answers ({err}); scripts/setup_docker.sh installs and starts one") from err


class DockerRuntime(Runtime):
    def __init__(
        self,
        addresses: AddressBook | None = None,
        client: docker.DockerClient | None = None,
        network: str | None = None,
        subnet: str | None = None,
        restrict_host: bool = True,
        allow_open_egress: bool | None = None,  # None: POLAR_ALLOW_OPEN_EGRESS=1 opts out of failing closed
    ):
        self.client = client or connect()
        # exec'd commands may be silent for long, so their client has no read timeout (their duration
        # is bounded in the container instead); it talks to the engine the environment names.
        self._exec_api = docker.APIClient(timeout=None, version="auto", **docker.utils.kwargs_from_env())
        self.addresses = addresses
        suffix = secrets.token_hex(4)
        self.network_name = network or f"polar-{suffix}"
        self.bridge = f"polar{suffix}"[:15]  # Linux interface names are at most 15 bytes
        self.subnet = subnet
        self.restrict_host = restrict_host
        if allow_open_egress is None:
            allow_open_egress = os.environ.get(ALLOW_OPEN_EGRESS_ENV) == "1"
        self.allow_open_egress = allow_open_egress
        self._network = None
        self._gateway: str | None = None
        self._host_rules: list[list[str]] = []
        self._sandboxes: list[DockerSandbox] = []
        reap_orphans(self.client)
        self._resolv = tempfile.NamedTemporaryFile("w", prefix="polar-resolv-", suffix=".conf", delete=False)
        self._resolv.write(_RESOLV_CONF)
        self._resolv.close()

    @property
    def gateway_ip(self) -> str:
        """The host's address on the session network: where polar must listen (creates the network)."""
        if self._gateway is None:
            self._create_network()
        assert self._gateway is not None
        return self._gateway

    def _create_network(self) -> None:
        ipam = IPAMConfig(pool_configs=[IPAMPool(subnet=self.subnet)]) if self.subnet else None
        self._network = self.client.networks.create(
            self.network_name,
            driver="bridge",
            internal=True,
            ipam=ipam,
            options={"com.docker.network.bridge.enable_icc": "false", BRIDGE_OPTION: self.bridge},
            labels={"dev.polar": "1", OWNER: _OWNER},
        )
        self._network.reload()
        self._gateway = self._network.attrs["IPAM"]["Config"][0]["Gateway"].split("/")[0]
        if not self.restrict_host:
            return
        try:
            self._close_host_ports()
        except EgressLockFailed as err:
            if not self.allow_open_egress:
                self._remove_network()
                raise
            log.warning("%s; running with host ports open as asked (allow_open_egress)", err)
        except BaseException:  # e.g. iptables not executable: nothing half-made stays behind
            self._open_host_ports()
            self._remove_network()
            raise

    def _close_host_ports(self) -> None:
        """Let the bridge reach the host on 80/443 only (polar); refuse everything else it sends in.
        All or nothing: a partial set could refuse polar's own ports or leave others open."""
        if shutil.which("iptables") is None:
            raise EgressLockFailed(f"iptables not found: cannot close host ports to the sandbox network "
                                   f"{self.network_name}; install iptables or {_OPT_OUT}")
        rules = [  # each `-I` lands on top, so this list reads bottom-up
            ["-i", self.bridge, "-j", "REJECT"],  # refused at once, not left to time out
            ["-i", self.bridge, "-p", "tcp", "-m", "multiport", "--dports", "80,443", "-j", "ACCEPT"],
            ["-i", self.bridge, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"],
        ]
        for rule in rules:
            done = subprocess.run(["iptables", "-I", "INPUT", *rule], capture_output=True, text=True, check=False)
            if done.returncode != 0:
                self._open_host_ports()
                raise EgressLockFailed(f"`iptables -I INPUT {shlex.join(rule)}` failed ({done.stderr.strip()}): "
                                       f"cannot close host ports to the sandbox network {self.network_name}; "
                                       f"run as root with iptables working or {_OPT_OUT}")
            self._host_rules.append(rule)

    def _open_host_ports(self) -> None:
        for rule in self._host_rules:
            subprocess.run(["iptables", "-D", "INPUT", *rule], capture_output=True, check=False)
        self._host_rules.clear()

    def _remove_network(self) -> None:
        if self._network is not None:
            try:
                self._network.remove()
            except docker.errors.NotFound:
                pass
        self._network = None
        self._gateway = None

    def start(self, spec: SandboxSpec) -> DockerSandbox:
        gateway = self.gateway_ip
        env = dict(spec.env)
        image = spec.image
        if spec.ca_cert is not None:
            image = images.trusting(self.client, spec.image, Path(spec.ca_cert))
            env = {**ca_env(CA_IN_CONTAINER, SYSTEM_BUNDLE), **env}
        name = spec.name or f"polar-{slug(spec.session)}-{secrets.token_hex(3)}"
        volumes = {m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in spec.mounts}
        volumes[self._resolv.name] = {"bind": "/etc/resolv.conf", "mode": "ro"}
        limits = spec.resources
        container = self.client.containers.create(
            image,
            command=["sleep", "infinity"],
            name=name,
            hostname=slug(spec.session),
            working_dir=spec.workdir,
            environment=env,
            extra_hosts={host: gateway for host in spec.intercept_hosts},
            network=self.network_name,
            volumes=volumes,
            labels={LABEL: spec.session, OWNER: _OWNER},
            init=True,
            cap_drop=["NET_RAW"],
            security_opt=["no-new-privileges"],
            mem_limit=limits.memory,
            nano_cpus=int(limits.cpus * 1e9) if limits.cpus else None,
            pids_limit=limits.pids,
        )
        sandbox = DockerSandbox(self, container, spec)
        try:
            container.start()
            container.reload()
            sandbox.address = container.attrs["NetworkSettings"]["Networks"][self.network_name]["IPAddress"]
        except BaseException:
            sandbox.stop()
            raise
        if self.addresses is not None:
            self.addresses.register_address(sandbox.address, spec.session)
        self._sandboxes.append(sandbox)
        return sandbox

    def close(self) -> None:
        for sandbox in list(self._sandboxes):
            sandbox.stop()
        self._open_host_ports()
        self._remove_network()
        Path(self._resolv.name).unlink(missing_ok=True)
        self._exec_api.close()


def _drop_input_rules(bridge: str | None = None) -> int:
    """Delete the INPUT rules on `bridge`, or (None) on any polar bridge that no longer exists: a
    process killed before `close()` leaves them behind. Returns how many were deleted."""
    if shutil.which("iptables") is None:
        return 0
    listed = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True)
    dropped = 0
    for line in listed.stdout.splitlines():
        args = shlex.split(line)
        if args[:2] != ["-A", "INPUT"] or args[2:3] != ["-i"] or len(args) < 4:
            continue
        iface = args[3]
        gone = iface.startswith("polar") and not Path("/sys/class/net", iface).exists()
        if iface == bridge or (bridge is None and gone):
            dropped += subprocess.run(["iptables", "-D", *args[1:]], capture_output=True).returncode == 0
    return dropped


def reap_orphans(client: docker.DockerClient) -> int:
    """Remove the containers and networks left by polar processes of this host that died (a killed
    rollout server must not leave its sessions running). Returns how many were removed."""
    host = socket.gethostname()

    def dead(labels: dict) -> bool:
        owner = (labels or {}).get(OWNER, "")
        name, _, pid = owner.rpartition(":")
        if name != host or not pid.isdigit():
            return False
        try:
            os.kill(int(pid), 0)
            return False
        except ProcessLookupError:
            return True
        except PermissionError:
            return False

    removed = 0
    for container in client.containers.list(all=True, filters={"label": OWNER}):
        if dead(container.labels):
            container.remove(force=True)
            removed += 1
    for network in client.networks.list(filters={"label": OWNER}):
        if dead(network.attrs.get("Labels")):
            try:
                network.remove()
                removed += 1
            except docker.errors.APIError:  # still in use by a container of a live owner
                continue
            bridge = (network.attrs.get("Options") or {}).get(BRIDGE_OPTION)
            if bridge:  # the dead owner's host-port rules on that bridge (`restrict_host`)
                _drop_input_rules(bridge)
    _drop_input_rules()  # and rules on polar bridges already gone (their networks were removed)
    if removed:
        log.warning("removed %d containers/networks left by polar processes that died", removed)
    return removed


class DockerSandbox(Sandbox):
    def __init__(self, runtime: DockerRuntime, container, spec: SandboxSpec):
        self.runtime = runtime
        self.container = container
        self.spec = spec
        self.address: str | None = None
        self._stopped = False

    def exec(
        self,
        cmd: Command,
        env: dict[str, str] | None = None,
        timeout: float | None = None,
        workdir: str | None = None,
        user: str | None = None,
    ) -> ExecResult:
        argv = shell_argv(cmd)
        if timeout is not None:
            # The engine cannot kill an exec'd process; coreutils `timeout` inside the container can.
            argv = ["timeout", "-k", str(_KILL_GRACE_S), f"{timeout:g}", *argv]
        api = self.runtime._exec_api
        exec_id = api.exec_create(
            self.container.id,
            argv,
            environment=env,
            workdir=workdir or self.spec.workdir,
            user=user or self.spec.user or "",
        )["Id"]
        started = time.monotonic()
        out, err = api.exec_start(exec_id, demux=True)
        code = api.exec_inspect(exec_id)["ExitCode"]
        timed_out = timeout is not None and code in _TIMEOUT_EXIT_CODES and time.monotonic() - started >= timeout
        return ExecResult(code if code is not None else -1, _text(out), _text(err), timed_out)

    def copy_in(self, host_path: str | Path, container_path: str) -> None:
        target = PurePosixPath(container_path)
        self.exec(["mkdir", "-p", str(target.parent)], user="root", workdir="/")
        with tempfile.TemporaryFile() as spool:  # a repository can be large: not in memory
            with tarfile.open(fileobj=spool, mode="w") as tar:
                tar.add(Path(host_path), arcname=target.name)
            spool.seek(0)
            if not self.container.put_archive(str(target.parent), spool):
                raise RuntimeError(f"copying {host_path} into {self.container.name}:{container_path} failed")

    def copy_out(self, container_path: str, host_path: str | Path) -> None:
        host_path = Path(host_path)
        stream, _ = self.container.get_archive(container_path)
        with tempfile.TemporaryFile() as spool:
            for chunk in stream:
                spool.write(chunk)
            spool.seek(0)
            with tarfile.open(fileobj=spool) as tar:
                members = tar.getmembers()
                top = members[0].name.split("/", 1)[0] if members else ""
                for member in members:
                    member.name = host_path.name + member.name[len(top):]
                host_path.parent.mkdir(parents=True, exist_ok=True)
                tar.extractall(host_path.parent, members=members, filter="data")

    def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        if self.address and self.runtime.addresses is not None:
            self.runtime.addresses.forget_address(self.address)
        try:
            self.container.remove(force=True)
        except docker.errors.NotFound:
            pass
        if self in self.runtime._sandboxes:
            self.runtime._sandboxes.remove(self)


def _text(data: bytes | None) -> str:
    return data.decode("utf-8", errors="replace") if data else ""

