"""`polar evaluate` grades a patch offline as the task's evaluator would; `polar tasks import` turns other
formats' task sets into polar tasks."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import click

from polar.rollout.tasks import TaskSpec, load_tasks


def read_task(path: Path, task_id: str | None) -> TaskSpec:
    """One task from a JSON file (one TaskSpec) or a tasks JSONL file (`task_id` picks it when there are several)."""
    try:
        data = json.loads(path.read_text())
    except ValueError:
        data = None
    if isinstance(data, dict):
        try:
            task = TaskSpec.model_validate(data)
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
    if task_id is not None:
        tasks = [t for t in tasks if t.id == task_id]
    if len(tasks) != 1:
        found = "no task" if not tasks else f"{len(tasks)} tasks"
        raise click.BadParameter(f"{path} holds {found}{f' with id {task_id!r}' if task_id else ''}: "
                                 "give one task (--id picks one from a tasks file)", param_hint="--task")
    return tasks[0]


def _runtime(task: TaskSpec):
    """The task's runtime, offline: nothing it runs can reach a model (none is needed to grade)."""
    if task.runtime == "local":
        from polar.runtime.local import LocalRuntime

        return LocalRuntime("http://127.0.0.1:9", os.devnull)
    if task.runtime == "docker":
        from polar.runtime.docker_runtime import DockerRuntime

        return DockerRuntime()
    raise click.ClickException(f"runtime {task.runtime!r}: polar evaluate runs local or docker tasks")


@click.command("evaluate")
@click.option("--task", "task_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The task: a JSON file holding one polar task, or a tasks JSONL file (with --id).")
@click.option("--id", "task_id", help="Which task of a tasks file.")
@click.option("--patch", "patch_path", required=True, type=click.Path(exists=True, dir_okay=False, path_type=Path),
              help="The patch to grade (a unified diff, as `git diff` writes it; an empty file grades the repo as is).")
@click.option("--json", "as_json", is_flag=True, help="Print the whole grading as JSON (the test log included).")
@click.option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path), help="Write the test log here.")
@click.option("--timeout", type=float, help="Seconds the tests may run (default: the task's evaluator option).")
def evaluate(task_path: Path, task_id: str | None, patch_path: Path, as_json: bool, log_path: Path | None,
             timeout: float | None) -> None:
    """Grade a patch for a SWE-bench task as the official harness grades it: reward, resolved, per-test outcomes.
    Exit status 0 when resolved, 1 when not."""
    from polar.rollout.swebench_eval import SWEBench, clean_sandbox, env_for_tests, grade

    task = read_task(task_path, task_id)
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
        except ValueError as exc:
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
