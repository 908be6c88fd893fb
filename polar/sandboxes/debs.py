"""Debian packages for an image layer, downloaded on the host: image builds have no network.

The host's apt resolves the packages and their dependencies (no recommends) at the versions it would pick, and
`apt-get download` fetches those the parent image lacks, or has at another version, into
${POLAR_CACHE:-~/.cache/polar}/debs; the layer's recipe installs them with apt from the local files.
"""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

from polar.sandboxes.images import cache_dir


def installed(client: Any, image: str) -> dict[str, str]:
    """The Debian packages already in `image`, with their versions (a throwaway container, no network)."""
    out = client.containers.run(image, ["dpkg-query", "-W", "-f", "${Package} ${Version}\\n"], remove=True,
                                network_mode="none")
    return dict(line.split(" ", 1) for line in out.decode().splitlines() if " " in line)


def closure(packages: list[str]) -> dict[str, str]:
    """`packages` and everything they depend on (no recommends), with the versions the host's apt would pick."""
    done = _apt(["apt-cache", "depends", "--recurse", "--no-recommends", "--no-suggests", "--no-conflicts",
                 "--no-breaks", "--no-replaces", "--no-enhances", *packages])
    # Top-level lines are package names; indented ones are relations, `<name>` virtual packages.
    names = {line.strip() for line in done.splitlines() if line and not line[0].isspace() and not line.startswith("<")}
    versions: dict[str, str] = {}
    for stanza in _apt(["apt-cache", "show", "--no-all-versions", *sorted(names)]).split("\n\n"):
        fields = dict(line.split(": ", 1) for line in stanza.splitlines() if ": " in line and not line[0].isspace())
        if "Package" in fields:
            versions[fields["Package"]] = fields["Version"]
    return versions


def download(packages: dict[str, str]) -> Path:
    """The .deb files of these exact package versions, downloaded once (none: an empty directory)."""
    specs = sorted(f"{name}={version}" for name, version in packages.items())
    target = cache_dir().parent / "debs" / hashlib.sha256(" ".join(specs).encode()).hexdigest()[:12]
    if not (target / ".done").exists():
        target.mkdir(parents=True, exist_ok=True)
        if specs:
            _apt(["apt-get", "download", *specs], cwd=target)
        (target / ".done").touch()
    return target


def missing(client: Any, parent: str, packages: list[str]) -> dict[str, str]:
    """What `packages` need that `parent` lacks. An installed package at another version is replaced too: the new
    ones may pin it exactly (perl needs its own perl-base), and the parent may predate a point release."""
    have = installed(client, parent)
    return {name: version for name, version in closure(packages).items() if have.get(name) != version}


def _apt(argv: list[str], cwd: Path | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:3])} … failed (run `apt-get update` first?):\n{done.stderr[-2000:]}")
    return done.stdout
