"""The sandbox network's host-port lock fails closed: without it no sandbox starts, unless the user
opts out; whatever was half-made is removed. A real Docker engine and the host's real iptables."""

from __future__ import annotations

import logging
import shutil
import subprocess

import pytest

from polar.sandboxes import SandboxSpec
from polar.sandboxes import docker_runtime as dr

pytestmark = pytest.mark.docker


@pytest.fixture
def no_iptables(monkeypatch):
    """iptables is not installed, as far as the runtime can tell."""
    which = shutil.which
    monkeypatch.setattr(dr.shutil, "which", lambda name, *a, **kw: None if name == "iptables" else which(name, *a, **kw))
    monkeypatch.delenv(dr.ALLOW_OPEN_EGRESS_ENV, raising=False)


def _networks(client, runtime) -> list:
    return client.networks.list(names=[runtime.network_name])


def _input_rules_on(bridge: str) -> list[str]:
    listed = subprocess.run(["iptables", "-S", "INPUT"], capture_output=True, text=True, check=True).stdout
    return [line for line in listed.splitlines() if f"-i {bridge} " in line]


def test_without_iptables_no_sandbox_starts_and_no_network_stays(docker_client, no_iptables):
    runtime = dr.DockerRuntime(client=docker_client)
    try:
        with pytest.raises(dr.EgressLockFailed, match=r"iptables not found.*POLAR_ALLOW_OPEN_EGRESS=1") as err:
            runtime.start(SandboxSpec(image="never-used", session="closed"))
        assert runtime.network_name in str(err.value) and "--allow-open-egress" in str(err.value)
        assert not _networks(docker_client, runtime)
        assert not docker_client.containers.list(all=True, filters={"label": f"{dr.LABEL}=closed"})
    finally:
        runtime.close()


def test_a_rule_that_fails_is_named_and_the_rules_before_it_removed(docker_client, tmp_path, monkeypatch):
    """A fake iptables first on PATH refuses the 80/443 rule (the second one) and passes the rest on."""
    real = shutil.which("iptables")
    if real is None:
        pytest.skip("needs the host's iptables")
    fake = tmp_path / "iptables"
    fake.write_text(f'#!/bin/sh\ncase "$*" in *80,443*) echo "iptables: fake refusal" >&2; exit 4;; esac\n'
                    f'exec {real} "$@"\n')
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{dr.os.environ['PATH']}")
    monkeypatch.delenv(dr.ALLOW_OPEN_EGRESS_ENV, raising=False)
    runtime = dr.DockerRuntime(client=docker_client)
    try:
        with pytest.raises(dr.EgressLockFailed, match=r"80,443.*fake refusal") as err:
            runtime.gateway_ip  # noqa: B018 — creating the network installs the lock
        assert runtime.network_name in str(err.value)
        assert not _networks(docker_client, runtime)
        assert _input_rules_on(runtime.bridge) == []  # the REJECT rule installed first is gone too
    finally:
        runtime.close()


@pytest.mark.parametrize("opt_out", ["flag", "env"])
def test_opting_out_starts_with_a_warning(docker_client, no_iptables, monkeypatch, caplog, opt_out):
    if opt_out == "env":
        monkeypatch.setenv(dr.ALLOW_OPEN_EGRESS_ENV, "1")
    runtime = dr.DockerRuntime(client=docker_client, allow_open_egress=True if opt_out == "flag" else None)
    try:
        with caplog.at_level(logging.WARNING, logger="polar.sandboxes.docker"):
            assert runtime.gateway_ip
        assert _networks(docker_client, runtime)
        (warning,) = [r for r in caplog.records if "iptables not found" in r.getMessage()]
        assert "host ports open" in warning.getMessage()
    finally:
        runtime.close()
    assert not _networks(docker_client, runtime)


def test_with_iptables_the_lock_is_installed_and_removed_with_the_network(docker_client, monkeypatch):
    if shutil.which("iptables") is None:
        pytest.skip("needs the host's iptables")
    monkeypatch.delenv(dr.ALLOW_OPEN_EGRESS_ENV, raising=False)
    runtime = dr.DockerRuntime(client=docker_client)
    try:
        assert runtime.gateway_ip and _networks(docker_client, runtime)
        assert len(_input_rules_on(runtime.bridge)) == 3
    finally:
        runtime.close()
    assert not _networks(docker_client, runtime) and _input_rules_on(runtime.bridge) == []
