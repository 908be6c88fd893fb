"""Building and caching the Docker images sandboxes run, with no container registry.

    base  debootstrap (minbase + runtimes/docker/base/packages) → tarball → `docker import`
    node  FROM base + the host's own Node binary and npm       (runtimes/docker/node/)
    …     further layers (the harness CLIs) through `build_layer`
    ca    FROM any of these + polar's CA certificate, trusted   (runtimes/docker/ca/)

Every tag carries a hash of what went into it (recipe files, parent tag, host Node version), so
an image is rebuilt exactly when its recipe changes and reused otherwise. The base tarball is kept
under ${POLAR_CACHE:-~/.cache/polar}/images, so even a wiped Docker engine re-imports it in seconds
instead of running debootstrap again. Builds take a file lock: parallel test processes build once.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import docker
import docker.errors

log = logging.getLogger("polar.sandboxes.images")

RECIPES = Path(__file__).resolve().parents[2] / "runtimes" / "docker"
SUITE = "bookworm"
_APT_SOURCES = Path("/etc/apt")


def cache_dir() -> Path:
    root = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "polar"))
    path = root / "images"
    path.mkdir(parents=True, exist_ok=True)
    return path


def debian_mirror(suite: str = SUITE, apt_dir: Path = _APT_SOURCES) -> str:
    """The Debian mirror this host's apt already uses for `suite` (one-line or deb822 sources)."""
    files = [apt_dir / "sources.list", *sorted((apt_dir / "sources.list.d").glob("*"))]
    for path in files:
        if not path.is_file():
            continue
        text = path.read_text(errors="replace")
        for uri, suites in _deb_sources(text, deb822=path.suffix == ".sources"):
            if suite in suites:
                return uri
    raise RuntimeError(f"no Debian mirror for '{suite}' in {apt_dir}/sources.list*; debootstrap needs one")


def _deb_sources(text: str, deb822: bool) -> Iterator[tuple[str, list[str]]]:
    if deb822:
        for stanza in re.split(r"\n\s*\n", text):
            fields = _deb822_fields(stanza)
            if "deb" in fields.get("types", "").split():
                for uri in fields.get("uris", "").split():
                    yield uri, fields.get("suites", "").split()
        return
    for line in text.splitlines():
        parts = re.sub(r"\[[^]]*]", " ", line.split("#", 1)[0]).split()  # drop [arch=…] options
        if len(parts) >= 3 and parts[0] == "deb":
            yield parts[1], [parts[2]]


def _deb822_fields(stanza: str) -> dict[str, str]:
    fields: dict[str, str] = {}
    for line in stanza.splitlines():
        if line.startswith("#") or ":" not in line or line[:1].isspace():
            continue
        key, _, value = line.partition(":")
        fields[key.strip().lower()] = value.strip()
    return fields


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else part.encode())
        h.update(b"\0")
    return h.hexdigest()[:12]


def _recipe_digest(recipe: Path, *extra: str) -> str:
    files = sorted(p for p in recipe.rglob("*") if p.is_file())
    return _digest(*extra, *(f"{p.relative_to(recipe)}:" for p in files), *(p.read_bytes() for p in files))


@contextmanager
def _build_lock() -> Iterator[None]:
    with open(cache_dir() / ".lock", "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _have(client: docker.DockerClient, tag: str) -> bool:
    try:
        client.images.get(tag)
        return True
    except docker.errors.ImageNotFound:
        return False


def base_image(client: docker.DockerClient, suite: str = SUITE) -> str:
    """polar/base:<hash> — Debian minbase with CA tooling, built by debootstrap, imported."""
    recipe = RECIPES / "base"
    tag = f"polar/base:{suite}-{_recipe_digest(recipe, suite)}"
    with _build_lock():
        if _have(client, tag):
            return tag
        tarball = cache_dir() / f"{tag.split(':', 1)[1]}.tar"
        if not tarball.exists():
            if shutil.which("debootstrap") is None:
                raise RuntimeError("debootstrap is missing: run scripts/setup_docker.sh (installs it)")
            log.info("building %s with debootstrap (one to two minutes)", tag)
            cmd = ["bash", str(recipe / "build.sh"), suite, debian_mirror(suite), str(tarball)]
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"building {tag} failed ({done.returncode}):\n{(done.stdout + done.stderr)[-4000:]}")
        log.info("importing %s", tarball)
        repository, version = tag.split(":", 1)
        client.api.import_image_from_file(
            str(tarball),
            repository=repository,
            tag=version,
            changes=['ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin', "ENV LANG=C.UTF-8", 'CMD ["bash"]'],
        )
    return tag


def host_node() -> tuple[Path, Path, str]:
    """The host's Node binary, its npm package directory and its version."""
    found = shutil.which("node")
    if found is None:
        raise RuntimeError("no `node` on PATH: the node layer copies the host's Node")
    node = Path(found).resolve()
    npm = node.parent.parent / "lib" / "node_modules" / "npm"
    if not (npm / "package.json").exists():
        raise RuntimeError(f"npm not found beside {node} (looked in {npm})")
    version = subprocess.run([str(node), "--version"], capture_output=True, text=True, check=True).stdout.strip()
    return node, npm, version


def node_image(client: docker.DockerClient) -> str:
    """polar/node:<hash> — the base image plus the host's Node and npm (no registry involved)."""
    node, npm, version = host_node()
    npm_version = (npm / "package.json").read_bytes()
    return build_layer(
        client,
        "node",
        base_image(client),
        files={"node": node, "npm": npm},
        key=(version, str(node.stat().st_size), _digest(npm_version)),
    )


def trusting(client: docker.DockerClient, image: str, ca_cert: Path) -> str:
    """`image` with polar's CA certificate in its system trust store (update-ca-certificates).

    Done once per (image, CA) at build time rather than in every container at start: the
    certificate is the same for every sandbox of a polar run, and starts stay well under a second.
    The layer leaves the image running as root; set `SandboxSpec.user` for a harness user.
    """
    cert = Path(ca_cert).read_bytes()
    if b"PRIVATE KEY" in cert:
        raise ValueError(f"{ca_cert} holds a private key; pass the CA certificate only (mitmproxy-ca-cert.pem)")
    parent_id = client.images.get(image).id  # a re-pulled or rebuilt parent gets a new layer
    return build_layer(client, "ca", image, files={"polar-ca.crt": Path(ca_cert)}, key=(parent_id, _digest(cert)))


def build_layer(
    client: docker.DockerClient,
    name: str,
    parent: str,
    files: Mapping[str, Path] | None = None,
    key: tuple[str, ...] = (),
    args: Mapping[str, str] | None = None,
) -> str:
    """Build polar/<name>:<hash> from runtimes/docker/<name>/ on top of `parent` (`args`: more build arguments).

    The recipe directory holds a Dockerfile starting `ARG PARENT` / `FROM ${PARENT}`, plus any
    files it COPYs; `files` adds host files or directories to the build context under the given
    names. `key` names whatever else the layer depends on (e.g. a version), so that a change
    rebuilds it. This is how later layers — the harness CLIs installed from npm — are added:
    a recipe directory and one call with the node image as `parent`.
    """
    recipe = RECIPES / name
    files = dict(files or {})
    args = dict(args or {})
    tag = f"polar/{name}:{_recipe_digest(recipe, parent, *key, *sorted(files), *(f'{k}={v}' for k, v in sorted(args.items())))}"
    with _build_lock():
        if _have(client, tag):
            return tag
        with tempfile.TemporaryDirectory(prefix=f"polar-{name}-") as ctx:
            shutil.copytree(recipe, ctx, dirs_exist_ok=True)
            for dest, src in files.items():
                _stage(Path(src), Path(ctx) / dest)
            log.info("building %s", tag)
            try:
                client.images.build(path=ctx, tag=tag, buildargs={**args, "PARENT": parent}, rm=True, forcerm=True, network_mode="none")
            except docker.errors.BuildError as err:
                logs = "".join(chunk.get("stream", "") for chunk in err.build_log if isinstance(chunk, dict))
                raise RuntimeError(f"building {tag} failed: {err}\n{logs[-4000:]}") from err
    return tag


def _stage(src: Path, dest: Path) -> None:
    """Put a host file or tree into a build context, by hard link where possible (Node is ~100 MB)."""
    if src.is_dir():
        shutil.copytree(src, dest, symlinks=True, copy_function=_link_or_copy)
    else:
        _link_or_copy(str(src), str(dest))


def _link_or_copy(src: str, dest: str) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copy2(src, dest)
