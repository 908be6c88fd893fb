"""The runtime tests' fixtures (Docker engine, node image, polar listening transparently), reused."""

from tests.sandboxes.conftest import docker_client, node_image, transparent  # noqa: F401
