"""SWE-bench-schema rows (SWE-bench Verified/Lite, SWE-Gym, SWE-smith, R2E-Gym...) as polar tasks.

Rows come from JSONL, a JSON array or Parquet, as the `datasets` library writes them (FAIL_TO_PASS /
PASS_TO_PASS as JSON strings or lists). Each becomes a task graded by the `swebench` evaluator, the
problem statement as its instruction, the repository at /testbed:

- docker: the instance's image by its conventional name (IMAGE_TEMPLATE, swebench's own
  `instance_image_key` convention) when the local Docker has it; otherwise built from a local mirror
  (`repos/<owner>/<name>`, a git clone holding base_commit) on polar's swe layer over its node image (runtimes/docker/swebench), as sessions without an image use.
  A row's `setup` (a shell script) runs in that build, with no network: what needs packages from an
  index must already be in the parent image or the mirror.
- local: a checkout of the mirror at base_commit, copied into each session (the host's Python runs the tests).

A row that cannot be imported (no image and no mirror, base_commit missing from the mirror, a field
missing) is reported on its own; the others still import.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.rollout.swebench_eval import normalise
from polar.rollout.tasks import Named, TaskSpec

# swebench's convention (TestSpec.instance_image_key with a namespace): lower-case id, `__` → `_1776_`.
IMAGE_TEMPLATE = "swebench/sweb.eval.x86_64.{instance_key}:latest"
WORKDIR = "/testbed"


@dataclass
class Imported:
    instance_id: str
    task: TaskSpec | None = None
    error: str | None = None
    image_origin: str | None = None  # "existing" (the user's Docker had it), "built", or None (local runtime)


def read_rows(path: Path) -> Iterator[dict[str, Any]]:
    """Rows of a JSONL / JSON / Parquet file, as dicts."""
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        yield from pq.read_table(path).to_pylist()
        return
    text = path.read_text()
    if text.lstrip().startswith("["):
        yield from json.loads(text)
        return
    for n, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                yield json.loads(line)
            except ValueError as exc:
                raise ValueError(f"{path}:{n}: not JSON: {exc}") from None


def image_name(template: str, row: dict[str, Any]) -> str:
    """The instance's image by `template`: {instance_id}, {instance_key} (swebench's docker form), {repo}, {version}."""
    iid = row["instance_id"]
    return template.format(instance_id=iid, instance_key=iid.lower().replace("__", "_1776_"), repo=row["repo"],
                           version=row.get("version", ""))


def _git(cwd: Path, *args: str) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"git {' '.join(args[:2])} in {cwd}: {done.stderr.strip()[-500:]}")
    return done.stdout


def checkout(repos: Path | None, row: dict[str, Any], dest: Path) -> Path:
    """The mirror `repos/<owner>/<name>` cloned to `dest` at base_commit (history kept, as swebench's images do)."""
    if repos is None:
        raise LookupError("no image for it and no --repos mirror to build one from")
    mirror = repos / row["repo"]
    if not (mirror / ".git").exists() and not (mirror / "HEAD").is_file():
        raise LookupError(f"no clone of {row['repo']} under {repos} (expected {mirror})")
    try:
        _git(mirror, "cat-file", "-e", f"{row['base_commit']}^{{commit}}")
    except RuntimeError:
        raise LookupError(f"the clone {mirror} does not hold base_commit {row['base_commit']}") from None
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    _git(dest.parent, "clone", "-q", "--no-checkout", str(mirror.resolve()), dest.name)
    _git(dest, "-c", "advice.detachedHead=false", "checkout", "-q", row["base_commit"])
    return dest


def build_image(client: Any, repos: Path | None, row: dict[str, Any]) -> str:
    """polar/swebench:<hash> — the repository at base_commit in /testbed on polar's swe layer."""
    from polar.rollout.swe_image import swe_image
    from polar.sandboxes.images import build_layer, node_image

    setup = row.get("setup") or ": no set-up given\n"
    with tempfile.TemporaryDirectory(prefix="polar-swebench-") as tmp:
        repo = checkout(repos, row, Path(tmp) / "repo")
        (Path(tmp) / "setup.sh").write_text(setup)
        key = (row["repo"], row["base_commit"], hashlib.sha256(setup.encode()).hexdigest()[:16])
        return build_layer(client, "swebench", swe_image(client, node_image(client)),
                           files={"repo": repo, "setup.sh": Path(tmp) / "setup.sh"}, key=key)


def to_task(row: dict[str, Any], instance: dict[str, Any], harness: Named, runtime: str, **where: Any) -> TaskSpec:
    metadata = {"source": "swebench", "instance_id": instance["instance_id"], "repo": instance["repo"],
                "version": instance["version"], "base_commit": instance["base_commit"]}
    return TaskSpec(id=instance["instance_id"], instruction=row.get("problem_statement") or "", runtime=runtime,
                    workdir=WORKDIR, harness=harness, metadata=metadata,
                    evaluator=Named(name="swebench", options={"instance": instance}), **where)


def import_rows(rows: list[dict[str, Any]], *, runtime: str = "docker", repos: Path | None = None,
                template: str = IMAGE_TEMPLATE, harness: Named | None = None, client: Any = None,
                checkouts: Path | None = None, out_dir: Path | None = None) -> Iterator[Imported]:
    """Each row as a task, or the reason it is not one. `checkouts` (local runtime): where the repository
    copies go; task.repo is relative to `out_dir` (where the tasks file is) when it is inside it."""
    harness = harness or Named(name="python-agent")
    for n, row in enumerate(rows, 1):
        iid = str(row.get("instance_id") or f"row {n}")
        try:
            instance = normalise(row)
            if runtime == "local":
                if checkouts is None:
                    raise ValueError("the local runtime needs a directory for the repository checkouts")
                repo = checkout(repos, row, checkouts / iid)
                where = str(repo.relative_to(out_dir)) if out_dir and repo.is_relative_to(out_dir) else str(repo)
                yield Imported(iid, to_task(row, instance, harness, runtime, repo=where))
                continue
            image, origin = image_name(template, row), "existing"
            if not _have_image(client, image):
                image, origin = build_image(client, repos, row), "built"
            yield Imported(iid, to_task(row, instance, harness, runtime, image=image), image_origin=origin)
        except (LookupError, ValueError, RuntimeError, KeyError) as exc:
            yield Imported(iid, error=f"{type(exc).__name__}: {exc}" if isinstance(exc, KeyError) else str(exc))


def _have_image(client: Any, name: str) -> bool:
    import docker.errors

    try:
        client.images.get(name)
        return True
    except docker.errors.ImageNotFound:
        return False
