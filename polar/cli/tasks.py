"""`polar evaluate` grades a patch offline as the task's evaluator would; `polar tasks import` turns other
formats' task sets into polar tasks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from polar.rollout.tasks import TaskSpec, load_tasks


def read_task(path: Path, task_id: str | None, repos: Path | None = None, scratch: Path | None = None) -> TaskSpec:
    """One task from a JSON file (a polar task, or a SWE-bench row) or a JSONL file of either (`task_id` picks
    one when there are several). A SWE-bench row is imported as `polar tasks import` would: with `repos`, a
    checkout at base_commit under `scratch` (local runtime); else its conventional image (Docker)."""
    text = path.read_text()
    try:
        whole = json.loads(text)
    except ValueError:
        whole = None
    objects = [whole] if isinstance(whole, dict) else whole if isinstance(whole, list) else []
    if whole is None:  # JSON lines
        try:
            objects = [json.loads(line) for line in text.splitlines() if line.strip() and not line.startswith("#")]
        except ValueError as exc:
            raise click.BadParameter(f"{path}: neither JSON nor JSON lines: {exc}", param_hint="--task") from None
    if objects and all(isinstance(o, dict) and "test_patch" in o and "instruction" not in o for o in objects):
        return _row_task(path, objects, task_id, repos, scratch)
    if isinstance(whole, dict):
        try:
            task = TaskSpec.model_validate(whole)
        except ValueError as exc:
            raise click.BadParameter(f"{path}: {exc}", param_hint="--task") from None
        if task.repo:
            task.repo = str(path.resolve().parent / task.repo)
        tasks = [task]
    else:
        try:
            tasks = load_tasks(path)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="--task") from None
    return _one(path, [t for t in tasks if task_id is None or t.id == task_id], task_id)


def _one(path: Path, found: list, task_id: str | None):
    if len(found) != 1:
        what = "no task" if not found else f"{len(found)} tasks"
        raise click.BadParameter(f"{path} holds {what}{f' with id {task_id!r}' if task_id else ''}: "
                                 "give one task (--id picks one from a file of several)", param_hint="--task")
    return found[0]


def _row_task(path: Path, rows: list[dict], task_id: str | None, repos: Path | None, scratch: Path | None) -> TaskSpec:
    from polar.rollout.swebench_import import import_rows

    row = _one(path, [r for r in rows if task_id is None or r.get("instance_id") == task_id], task_id)
    if repos is not None:
        (item,) = import_rows([row], runtime="local", repos=repos, checkouts=scratch)
    else:
        from polar.sandboxes.base import RuntimeUnavailable
        from polar.sandboxes.docker_runtime import connect

        try:
            client = connect()
        except RuntimeUnavailable as exc:
            raise click.ClickException(f"{exc} (or give --repos: a mirror to check the repository out from)") from None
        (item,) = import_rows([row], runtime="docker", client=client)
    if item.task is None:
        raise click.ClickException(f"{item.instance_id}: {item.error}")
    return item.task


def _runtime(task: TaskSpec):
    """The task's runtime, offline: nothing it runs can reach a model (none is needed to grade)."""
    if task.runtime == "local":
        from polar.sandboxes.local import LocalRuntime

        return LocalRuntime("http://127.0.0.1:9", os.devnull)
    if task.runtime == "docker":
        from polar.sandboxes.docker_runtime import DockerRuntime

        return DockerRuntime()
    raise click.ClickException(f"runtime {task.runtime!r}: polar evaluate runs local or docker tasks")


@click.command("evaluate")
@click.option("--task", "task_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The task: a JSON file holding one polar task or one SWE-bench row, or a JSONL file of either "
                   "(with --id).")
@click.option("--id", "task_id", help="Which task (or instance_id) of a file of several.")
@click.option("--repos", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="For a SWE-bench row: a mirror of <owner>/<name> clones; grades a checkout at base_commit on this "
                   "machine (else the instance's image on Docker).")
@click.option("--patch", "patch_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The patch to grade (a unified diff, as `git diff` writes it; an empty file grades the repo as is).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole grading as JSON (the test log included).")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the test log here.")
@click.option("--timeout", type=float, help="Seconds the tests may run (default: the task's evaluator option).")
def evaluate(task_path: Path, task_id: str | None, repos: Path | None, patch_path: Path, as_json: bool,
             log_path: Path | None, timeout: float | None) -> None:
    """Grade a patch for a SWE-bench task as the official harness grades it: reward, resolved, per-test outcomes.
    Exit status 0 when resolved, 1 when not."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="polar-evaluate-") as scratch:
        _evaluate(read_task(task_path, task_id, repos, Path(scratch)), patch_path, as_json, log_path, timeout)


def _evaluate(task: TaskSpec, patch_path: Path, as_json: bool, log_path: Path | None, timeout: float | None) -> None:
    from polar.rollout.swebench_eval import SWEBench, clean_sandbox, env_for_tests, grade

    if task.evaluator.name != SWEBench.name:
        raise click.ClickException(f"task {task.id} is graded by {task.evaluator.name!r}: polar evaluate grades "
                                   f"{SWEBench.name!r} tasks (polar tasks import --format swebench makes them)")
    try:
        instance = SWEBench(**task.evaluator.options).instance()
    except ValueError as exc:
        raise click.ClickException(f"task {task.id}: {exc}") from None
    runtime = _runtime(task)
    try:
        sandbox = clean_sandbox(task, runtime, f"evaluate-{task.id}", task.workdir)
        try:
            graded = grade(sandbox, instance, patch_path.read_text(), timeout or float(
                task.evaluator.options.get("timeout", 1800)), env=env_for_tests(sandbox, sys.executable))
        except (ValueError, RuntimeError) as exc:
            raise click.ClickException(f"task {task.id}: {exc}") from None
        finally:
            sandbox.stop()
    finally:
        close = getattr(runtime, "close", None)
        if close:
            close()
    if log_path:
        log_path.write_text(graded.log)
    if as_json:
        click.echo(json.dumps({"task": task.id, **graded.as_dict(log_tail=None)}, indent=2))
    else:
        click.echo(f"{task.id}: reward {graded.reward:.1f}, {graded.status}"
                   f"{'' if graded.patch_applies else ' (the patch does not apply)'}"
                   f"{' (the tests timed out)' if graded.timed_out else ''}")
        for test, outcome in graded.outcomes.items():
            kind = "FAIL_TO_PASS" if test in instance["FAIL_TO_PASS"] else "PASS_TO_PASS"
            click.echo(f"  {kind:12} {outcome:8} {test}")
    sys.exit(0 if graded.resolved else 1)


@click.group("tasks")
def tasks() -> None:
    """Task sets in other formats, as polar tasks."""


@tasks.command("import")
@click.argument("sources", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@click.option("--format", "fmt", type=click.Choice(["swebench", "harbor"]), required=True,
              help="swebench: a file of rows in the SWE-bench schema (JSONL, JSON or Parquet as `datasets` writes "
                   "them). harbor: Harbor task directories (or directories of them).")
@click.option("--out", required=True, type=click.Path(dir_okay=False, path_type=Path), help="The tasks JSONL written.")
@click.option("--repos", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="swebench: local mirror holding <owner>/<name> git clones; instances without an image are built "
                   "from it.")
@click.option("--image-template", default=None,
              help="swebench: the instance image's name: {instance_id}, {instance_key} (lower-case, `__` as "
                   "`_1776_`), {repo}, {version}. Default: swebench's own, "
                   "swebench/sweb.eval.x86_64.{instance_key}:latest.")
@click.option("--runtime", type=click.Choice(["docker", "local"]), default="docker", show_default=True,
              help="swebench: local makes each task copy a checkout at base_commit (under --checkouts).")
@click.option("--checkouts", type=click.Path(file_okay=False, path_type=Path),
              help="Where --runtime local puts the checkouts (default: <out>.repos/ beside the tasks file).")
@click.option("--build-network", default="none", show_default=True,
              help="harbor: the network of the environment builds (`default` lets a Dockerfile fetch packages).")
@click.option("--harness", default="python-agent", show_default=True, help="The harness the tasks run.")
@click.option("--samples", default=1, show_default=True, type=click.IntRange(1, 1024), help="Sessions per task.")
def import_tasks(sources: tuple[Path, ...], fmt: str, out: Path, repos: Path | None, image_template: str | None,
                 runtime: str, checkouts: Path | None, build_network: str, harness: str, samples: int) -> None:
    """Write SOURCES as polar tasks. A row or directory that cannot be imported gets an error line on stderr and
    the others still import; the exit status is 1 when any failed."""
    from polar.rollout.tasks import Named

    if fmt == "harbor":
        items = _harbor_items(sources, Named(name=harness), build_network)
        return _write(out, items, samples)
    if len(sources) != 1 or not sources[0].is_file():
        raise click.BadParameter("--format swebench reads one file of rows", param_hint="SOURCES")
    source = sources[0]
    from polar.rollout.swebench_import import IMAGE_TEMPLATE, import_rows, read_rows

    try:
        rows = list(read_rows(source))
    except (ValueError, OSError) as exc:
        raise click.ClickException(f"{source}: {exc}") from None
    client = None
    if runtime == "docker":
        from polar.sandboxes.base import RuntimeUnavailable
        from polar.sandboxes.docker_runtime import connect

        try:
            client = connect()
        except RuntimeUnavailable as exc:
            raise click.ClickException(f"{exc} (or import with --runtime local)") from None
    out_dir = out.resolve().parent
    checkouts = (checkouts or out.with_name(out.name + ".repos")).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    items = import_rows(rows, runtime=runtime, repos=repos, template=image_template or IMAGE_TEMPLATE,
                        harness=Named(name=harness), client=client, checkouts=checkouts, out_dir=out_dir)
    _write(out, items, samples, len(rows))


def _write(out: Path, items, samples: int, total: int | None = None) -> None:
    """Write the imported tasks; one line on stderr per item (its image, or why it failed)."""
    written = failed = 0
    out.resolve().parent.mkdir(parents=True, exist_ok=True)
    with out.open("w") as f:
        for item in items:
            if item.task is None:
                failed += 1
                click.echo(f"{item.instance_id}: error: {item.error}", err=True)
                continue
            task = item.task.model_copy(update={"samples": samples})
            f.write(task.model_dump_json(exclude_defaults=False) + "\n")
            written += 1
            click.echo(f"{item.instance_id}: {task.image or task.repo}"
                       f"{f' ({item.image_origin})' if item.image_origin else ''}", err=True)
    click.echo(f"imported {written} of {written + failed if total is None else total} into {out}"
               + (f"; {failed} failed" if failed else ""))
    sys.exit(1 if failed else 0)


def _harbor_items(sources: tuple[Path, ...], harness, network: str):
    """Each Harbor task directory under SOURCES (a task, or a directory of tasks) as an import item."""
    from polar.rollout.harbor_tasks import build_image, image_workdir, read_task_dir, to_task
    from polar.rollout.swebench_import import Imported
    from polar.sandboxes.base import RuntimeUnavailable
    from polar.sandboxes.docker_runtime import connect

    try:
        client = connect()
    except RuntimeUnavailable as exc:
        raise click.ClickException(f"{exc} (Harbor tasks run in their own image)") from None
    dirs = [d for s in sources for d in ([s] if (s / "task.toml").is_file() or not s.is_dir() else
                                         sorted(p.parent for p in s.glob("*/task.toml")) or [s])]
    for d in dirs:
        try:
            task = read_task_dir(d)
            image = build_image(client, task, network)
            # No workdir named: terminal-bench's /app (never /: the session snapshots its workdir with git).
            workdir = task.workdir or image_workdir(client, image) or "/app"
            yield Imported(d.name, to_task(task, image, workdir, harness), image_origin="built" if task.dockerfile
                           else "existing")
        except Exception as exc:  # one bad directory is its own error line; the others still import
            yield Imported(d.name, error=f"{type(exc).__name__}: {exc}")
