"""Where harnesses run: sandboxes (Docker, Apptainer, or local processes) whose model calls reach polar.

`Runtime.start(SandboxSpec)` gives a `Sandbox` for one session; see `base` for the interface,
`docker_runtime` for transparent capture in containers, `images` for building their images. The files
those images and networks are built from live in the repository's `runtimes/` (Dockerfiles, CNI config).
"""

from polar.sandboxes.base import (
    AddressBook,
    ExecResult,
    Mount,
    Resources,
    Runtime,
    RuntimeUnavailable,
    Sandbox,
    SandboxSpec,
    ca_env,
)

__all__ = [
    "AddressBook",
    "ExecResult",
    "Mount",
    "Resources",
    "Runtime",
    "RuntimeUnavailable",
    "Sandbox",
    "SandboxSpec",
    "ca_env",
]
