"""The Apptainer runtime without Apptainer (it is not installed here): the clear error when it is
missing, the command lines it builds, and its calls through spython against a recording stand-in
for the `singularity` binary. What a real Apptainer would do with them is not tested here."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from polar.mitm.transparent import PROVIDER_HOSTS, ensure_ca
from polar.sandboxes import Mount, Resources, RuntimeUnavailable, SandboxSpec
from polar.sandboxes.apptainer_runtime import (
    CA_IN_SANDBOX,
    GATEWAY_IP,
    SYSTEM_BUNDLE,
    ApptainerRuntime,
    exec_argv,
    instance_options,
    write_sandbox_files,
)
from polar.sessions.identity import SessionRegistry

# A STAND-IN for the Apptainer CLI, used only because the real one cannot be installed here: it
# records every call (arguments separated by \x1f) and answers the way `apptainer` does.
STAND_IN = r"""#!/usr/bin/env bash
[ "$1" = --quiet ] && shift  # spython's global flag for a quiet client
{ printf '%s\x1f' "$@"; printf '\n'; } >> "$POLAR_STAND_IN_LOG"
case "$1 $2" in
  "--version "*) echo "apptainer version 1.3.4"; exit 0 ;;
  "instance start") exit 0 ;;
  "instance stop") exit 0 ;;
  "instance list")
    printf '{"instances": [{"instance": "%s", "pid": 4242, "ip": "10.87.0.7/24", "img": "x.sif"}]}\n' "${@: -1}"
    exit 0 ;;
esac
if [ "$1" = exec ]; then  # run the command itself on the host
  while [ $# -gt 0 ] && [[ "$1" != instance://* ]]; do shift; done
  shift
  exec "$@"
fi
exit 2
"""


@pytest.fixture
def ca_cert(tmp_path) -> Path:
    return ensure_ca(tmp_path / "mitmproxy")


@pytest.fixture
def spec(ca_cert, tmp_path) -> SandboxSpec:
    return SandboxSpec(
        image="/images/node.sif",
        session="hpc-1",
        workdir=str(tmp_path / "work"),  # the stand-in runs commands on the host
        env={"ANTHROPIC_API_KEY": "sk test's key"},
        mounts=[Mount("/data/task", "/work/task", read_only=False), Mount("/data/ref", "/ref")],
        resources=Resources(cpus=1.5, memory="2g", pids=256),
        ca_cert=ca_cert,
    )


@pytest.fixture
def stand_in(tmp_path, monkeypatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    binary = bindir / "singularity"
    binary.write_text(STAND_IN)
    binary.chmod(binary.stat().st_mode | stat.S_IXUSR)
    log = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("POLAR_STAND_IN_LOG", str(log))
    return log


def _calls(log: Path) -> list[list[str]]:
    return [line.split("\x1f")[:-1] for line in log.read_text().splitlines()]


def test_missing_binary_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(RuntimeUnavailable, match="Apptainer is not installed.*setup_network.sh"):
        ApptainerRuntime()


def test_sandbox_files_resolve_providers_to_polar_only(spec, tmp_path):
    files = write_sandbox_files(spec, GATEWAY_IP, tmp_path / "box")
    hosts = {line.split()[1]: line.split()[0] for line in files.hosts.read_text().splitlines()[1:]}
    assert {h: hosts[h] for h in PROVIDER_HOSTS} == {h: GATEWAY_IP for h in PROVIDER_HOSTS}
    assert "example.com" not in hosts and files.hosts.read_text().startswith("127.0.0.1 localhost\n")
    assert files.resolv.read_text().startswith("nameserver 127.0.0.1\n")
    env = files.env.read_text().splitlines()
    assert f"NODE_EXTRA_CA_CERTS={CA_IN_SANDBOX}" in env and f"SSL_CERT_FILE={SYSTEM_BUNDLE}" in env
    assert """ANTHROPIC_API_KEY='sk test'"'"'s key'""" in env  # shell-quoted for --env-file
    assert not [line for line in env if "PROXY" in line or "BASE_URL" in line]


def test_instance_options(spec, tmp_path, ca_cert):
    files = write_sandbox_files(spec, GATEWAY_IP, tmp_path / "box")
    opts = instance_options(spec, files, fakeroot=True)
    pairs = list(zip(opts, opts[1:], strict=False))
    binds = [value for flag, value in pairs if flag == "--bind"]
    assert ("--network", "polar") in pairs and "--net" in opts
    assert ("--overlay", str(files.overlay)) in pairs
    assert {"--containall", "--cleanenv", "--fakeroot"} <= set(opts)
    assert binds == [
        f"{files.hosts}:/etc/hosts:ro",
        f"{files.resolv}:/etc/resolv.conf:ro",
        f"{files.xfer}:/.polar-xfer",
        f"{ca_cert.resolve()}:{SYSTEM_BUNDLE}:ro",
        f"{ca_cert.resolve()}:{CA_IN_SANDBOX}:ro",
        "/data/task:/work/task:rw",
        "/data/ref:/ref:ro",
    ]
    assert not [b for b in binds if "mitmproxy-ca.pem" in b]  # the file holding the key is never bound
    assert [("--cpus", "1.5"), ("--memory", "2g"), ("--pids-limit", "256")] == [
        p for p in pairs if p[0] in ("--cpus", "--memory", "--pids-limit")
    ]


def test_exec_argv_cleans_the_environment_and_bounds_time(tmp_path):
    argv = exec_argv("polar-x", "make test", tmp_path / "env", "/work", env={"CI": "1"}, timeout=30)
    assert argv[:6] == ["singularity", "exec", "--cleanenv", "--env-file", str(tmp_path / "env"), "--pwd"]
    assert argv[6:] == ["/work", "--env", "CI=1", "instance://polar-x", "timeout", "-k", "5", "30", "sh", "-c", "make test"]


def test_lifecycle_through_spython(stand_in, spec, tmp_path):
    registry = SessionRegistry(salt=b"t")
    runtime = ApptainerRuntime(addresses=registry, state_dir=tmp_path / "state")
    box = runtime.start(spec)
    start = next(c for c in _calls(stand_in) if c[:2] == ["instance", "start"])
    assert start[-2:] == ["/images/node.sif", box.name] and box.name.startswith("polar-hpc-1-")
    assert start[2:-2] == instance_options(spec, box.files)
    assert box.address == "10.87.0.7"
    assert registry.resolve("/v1/messages", {}, "10.87.0.7").session == "hpc-1"

    hello = box.exec(["echo", "hi"])
    slow = box.exec("sleep 5", timeout=0.2)
    assert hello.ok and hello.stdout == "hi\n"
    assert slow.timed_out and not slow.ok

    runtime.close()
    assert ["instance", "stop", box.name] in _calls(stand_in)
    assert registry.resolve("/v1/messages", {}, "10.87.0.7").session == "addr-10.87.0.7"  # forgotten
    assert not box.files.dir.exists()
