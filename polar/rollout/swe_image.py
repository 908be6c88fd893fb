"""The `swe` image layer: git, python3 and pytest on top of any Debian bookworm image polar built.

Sessions need git (the diff the evaluators see is taken against a commit of the repository as
given) and the SWE evaluator runs pytest. polar's base image has neither, and image builds have no
network, so the host's apt downloads the packages — and those of their dependencies the parent
image lacks — into ${POLAR_CACHE:-~/.cache/polar}/debs, and the layer installs them with dpkg.
The base image is left alone: the CLI layers built on it stay cached.
"""

from __future__ import annotations

from typing import Any

from polar.sandboxes.debs import download, missing
from polar.sandboxes.images import RECIPES, build_layer

PACKAGES = RECIPES / "swe" / "packages"


def wanted() -> list[str]:
    lines = (line.strip() for line in PACKAGES.read_text().splitlines())
    return [line for line in lines if line and not line.startswith("#")]


def swe_image(client: Any, parent: str) -> str:
    """polar/swe:<hash> — `parent` plus git, python3 and pytest (built once, then cached by tag)."""
    needed = missing(client, parent, wanted())
    if not needed:
        return parent
    debs = download(needed)
    return build_layer(client, "swe", parent, files={"debs": debs}, key=tuple(sorted(p.name for p in debs.glob("*.deb"))))
