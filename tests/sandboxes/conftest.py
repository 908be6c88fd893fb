"""Fixtures for the runtime tests: a Docker engine, polar's images, and polar listening transparently
on a session network (the real proxy in front of the scripted vLLM double)."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def docker_client():
    from polar.sandboxes.base import RuntimeUnavailable
    from polar.sandboxes.docker_runtime import connect

    try:
        return connect()
    except RuntimeUnavailable as err:
        if os.environ.get("POLAR_REQUIRE_DOCKER") == "1":
            pytest.fail(f"POLAR_REQUIRE_DOCKER=1 but {err}")
        pytest.skip(str(err))


@pytest.fixture(scope="session")
def node_image(docker_client) -> str:
    """polar's node image: built once per machine (debootstrap ~1 min), then reused by tag."""
    from polar.sandboxes.images import node_image as build

    return build(docker_client)


@dataclass
class Transparent:
    """The shared in-process polar (tests/conftest.py `stack`) also listening on a session network."""

    runtime: object
    stack: object
    ca_cert: Path
    confdir: Path

    def rows(self, session: str) -> list[dict]:
        return list(self.stack.store().calls(session=session, with_tokens=False))


@pytest.fixture(scope="session")
def transparent(docker_client, stack):
    """One proxy per process (mitmproxy's context is global), so the session's proxy gains listeners
    on the runtime's gateway IP rather than a second proxy starting."""
    from polar.mitm.transparent import add_listeners, ca_cert_path, remove_listeners, transparent_modes
    from polar.sandboxes.docker_runtime import DockerRuntime

    runtime = DockerRuntime(client=docker_client, addresses=stack.proxy.addon.gateway.registry)
    modes = transparent_modes(runtime.gateway_ip)
    try:
        add_listeners(modes)
        ca_cert = ca_cert_path(stack.proxy.config.confdir)  # mitmproxy wrote it on start
        yield Transparent(runtime, stack, ca_cert, ca_cert.parent)
    finally:
        runtime.close()
        remove_listeners(modes)
