"""`polar tasks import --format swebench`: rows as `datasets` writes them (JSONL with JSON-string lists,
Parquet with lists) into tasks that `polar evaluate` and the rollout grade; a bad row is an error line."""

from __future__ import annotations

import json
import os

import pytest
from click.testing import CliRunner

from polar.cli import main
from polar.rollout.swebench_eval import normalise, swebench_spec
from polar.rollout.swebench_import import IMAGE_TEMPLATE, image_name
from polar.rollout.tasks import Named, load_tasks
from tests.rollout.conftest import run_sessions
from tests.rollout.swebench_repos import build
from tests.rollout.test_docker import docker_env  # noqa: F401  (the fixture)

KINDS = ("django", "pytest", "custom")


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    root = tmp_path_factory.mktemp("mirror")
    return root, {kind: build(root, kind) for kind in KINDS}


def bad_rows(instances) -> list[dict]:
    good = instances["pytest"].row
    return [{**good, "instance_id": "nomirror__x-1", "repo": "nomirror/x"},  # no clone of it
            {**good, "instance_id": "pytest-dev__pytest-90009", "base_commit": "0" * 40},  # not in the clone
            {k: v for k, v in {**good, "instance_id": "broken__row-2"}.items() if k != "test_patch"}]


def test_default_image_name_is_swebenchs_own_convention(mirror):
    _, instances = mirror
    for inst in instances.values():
        spec = swebench_spec(normalise(inst.row))
        spec.namespace = "swebench"
        assert image_name(IMAGE_TEMPLATE, inst.row) == spec.instance_image_key
    assert image_name(IMAGE_TEMPLATE, {"instance_id": "django__django-11099", "repo": "django/django"}) == \
        "swebench/sweb.eval.x86_64.django_1776_django-11099:latest"


def test_parquet_and_jsonl_rows_import_and_grade(mirror, tmp_path):
    import datasets

    root, instances = mirror
    rows = [inst.row for inst in instances.values()] + bad_rows(instances)
    parquet = tmp_path / "rows.parquet"  # lists as lists, the way datasets writes a loaded split
    columns = {k: None for r in rows for k in r}  # every row with every column, the others' as nulls
    datasets.Dataset.from_list([{**columns, **r, "FAIL_TO_PASS": json.loads(r["FAIL_TO_PASS"]),
                                 "PASS_TO_PASS": json.loads(r["PASS_TO_PASS"])} for r in rows[:3]]).to_parquet(parquet)
    jsonl = tmp_path / "rows.jsonl"  # lists as JSON strings, as in SWE-bench's own files
    jsonl.write_text("".join(json.dumps(r) + "\n" for r in rows))
    runner = CliRunner()
    done = runner.invoke(main, ["tasks", "import", "--format", "swebench", str(parquet), "--out",
                                str(tmp_path / "a" / "tasks.jsonl"), "--runtime", "local", "--repos", str(root)])
    assert done.exit_code == 0 and "imported 3 of 3 into" in done.output, done.output
    done = runner.invoke(main, ["tasks", "import", "--format", "swebench", str(jsonl), "--out",
                                str(tmp_path / "b" / "tasks.jsonl"), "--runtime", "local", "--repos", str(root)])
    assert done.exit_code == 1 and "imported 3 of 6 into" in done.output and "3 failed" in done.output, done.output
    errors = [line for line in done.output.splitlines() if ": error: " in line]
    assert errors == [
        f"nomirror__x-1: error: no clone of nomirror/x under {root} (expected {root / 'nomirror/x'})",
        f"pytest-dev__pytest-90009: error: the clone {root / 'pytest-dev/pytest'} does not hold base_commit {'0' * 40}",
        "broken__row-2: error: SWE-bench row broken__row-2: missing test_patch"], done.output
    for sub in ("a", "b"):
        tasks = {t.id: t for t in load_tasks(tmp_path / sub / "tasks.jsonl")}
        assert set(tasks) == {inst.row["instance_id"] for inst in instances.values()}
        for kind, inst in instances.items():
            task = tasks[inst.row["instance_id"]]
            assert (task.instruction, task.workdir, task.evaluator.name) == (
                inst.row["problem_statement"], "/testbed", "swebench")
            instance = task.evaluator.options["instance"]
            assert instance == normalise(inst.row) and "patch" not in instance
            assert os.path.isdir(task.repo) and not os.path.isabs(
                json.loads((tmp_path / sub / "tasks.jsonl").read_text().splitlines()[0])["repo"])
    (tmp_path / "gold.diff").write_text(instances["django"].gold)
    done = runner.invoke(main, ["evaluate", "--task", str(tmp_path / "b" / "tasks.jsonl"), "--id",
                                "django__django-90001", "--patch", str(tmp_path / "gold.diff"), "--json"])
    assert done.exit_code == 0 and json.loads(done.output)["status"] == "RESOLVED_FULL", done.output


@pytest.mark.docker
def test_docker_import_builds_the_instance_image_and_grades_in_it(mirror, tmp_path, docker_ready):
    """No image by the conventional name: one is built from the mirror on polar's swe layer; once an image
    carries that name, the import takes it as it is. Grading runs in a container of the image."""
    import docker

    root, instances = mirror
    inst = instances["django"]
    rows = tmp_path / "rows.jsonl"
    rows.write_text(json.dumps(inst.row) + "\n")
    template = "polar-test/sweb.eval.{instance_key}:latest"
    client = docker.from_env()
    try:
        client.images.remove(image_name(template, inst.row))
    except docker.errors.ImageNotFound:
        pass
    runner = CliRunner()
    args = ["tasks", "import", "--format", "swebench", str(rows), "--repos", str(root), "--image-template", template]
    done = runner.invoke(main, [*args, "--out", str(tmp_path / "tasks.jsonl")])
    assert done.exit_code == 0 and "(built)" in done.output, done.output
    (task,) = load_tasks(tmp_path / "tasks.jsonl")
    assert task.image.startswith("polar/swebench:") and task.runtime == "docker" and task.repo is None
    for name, patch, status in (("gold", inst.gold, "RESOLVED_FULL"), ("partial", inst.partial, "RESOLVED_PARTIAL")):
        (tmp_path / name).write_text(patch)
        done = runner.invoke(main, ["evaluate", "--task", str(tmp_path / "tasks.jsonl"), "--patch",
                                    str(tmp_path / name), "--json"])
        assert json.loads(done.output)["status"] == status, done.output
    repository, tag = image_name(template, inst.row).rsplit(":", 1)
    client.images.get(task.image).tag(repository, tag)
    try:
        done = runner.invoke(main, [*args, "--out", str(tmp_path / "again.jsonl")])
        assert done.exit_code == 0 and "(existing)" in done.output, done.output
        assert load_tasks(tmp_path / "again.jsonl")[0].image == image_name(template, inst.row)
    finally:
        client.images.remove(image_name(template, inst.row))


@pytest.mark.docker
def test_an_imported_instance_runs_as_a_docker_session_and_is_graded(mirror, docker_env, tmp_path):  # noqa: F811
    """The imported task end to end on Docker: the harness works in /testbed of the built image, its diff is
    graded in a clean container of the same image by swebench's code. The gold fix resolves, doing nothing not."""
    root, instances = mirror
    inst = instances["pytest"]
    (tmp_path / "rows.jsonl").write_text(json.dumps(inst.row) + "\n")
    done = CliRunner().invoke(main, ["tasks", "import", "--format", "swebench", str(tmp_path / "rows.jsonl"),
                                     "--repos", str(root), "--out", str(tmp_path / "tasks.jsonl"),
                                     "--image-template", "polar-test/none.{instance_key}:latest"])
    assert done.exit_code == 0, done.output
    (task,) = load_tasks(tmp_path / "tasks.jsonl")
    env, _ = docker_env
    fix = Named(name="shell", options={"script": f"git apply <<'EOF'\n{inst.gold}EOF\n"})
    gold = task.model_copy(update={"id": "gold-fix", "harness": fix, "timeout": 120})
    idle = task.model_copy(update={"id": "no-fix", "harness": Named(name="shell", options={"script": "true"}),
                                   "timeout": 120})
    fixed, untouched = run_sessions(env, [gold, idle], timeout=300, running_slots=2)
    assert (fixed.outcome, fixed.reward, fixed.evaluation["status"]) == ("ok", 1.0, "RESOLVED_FULL"), fixed
    assert (untouched.outcome, untouched.reward, untouched.evaluation["status"]) == ("ok", 0.0, "RESOLVED_NO")


def test_polar_evaluate_takes_swebench_rows_directly(mirror, tmp_path):
    """A row as the dataset gives it (one JSON object, or a JSONL file picked by --id), its repository checked
    out from the mirror at base_commit: gold resolves, a partial fix does not; a row with no clone is one clear error."""
    root, instances = mirror
    rows = [inst.row for inst in instances.values()]
    (tmp_path / "row.json").write_text(json.dumps(instances["custom"].row))
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    for kind in ("gold", "partial"):
        (tmp_path / f"{kind}.diff").write_text(getattr(instances["django"], kind))
    (tmp_path / "custom.diff").write_text(instances["custom"].gold)
    runner = CliRunner()
    done = runner.invoke(main, ["evaluate", "--task", str(tmp_path / "row.json"), "--repos", str(root),
                                "--patch", str(tmp_path / "custom.diff")])
    assert done.exit_code == 0 and "acme__textkit-7: reward 1.0, RESOLVED_FULL" in done.output, done.output
    done = runner.invoke(main, ["evaluate", "--task", str(tmp_path / "rows.jsonl"), "--id", "django__django-90001",
                                "--repos", str(root), "--patch", str(tmp_path / "partial.diff"), "--json"])
    assert done.exit_code == 1 and json.loads(done.output)["status"] == "RESOLVED_PARTIAL", done.output
    done = runner.invoke(main, ["evaluate", "--task", str(tmp_path / "rows.jsonl"), "--repos", str(root),
                                "--patch", str(tmp_path / "gold.diff")])
    assert done.exit_code == 2 and "holds 3 tasks" in done.output
    (tmp_path / "other.json").write_text(json.dumps({**rows[0], "repo": "elsewhere/x", "instance_id": "elsewhere__x-1"}))
    done = runner.invoke(main, ["evaluate", "--task", str(tmp_path / "other.json"), "--repos", str(root),
                                "--patch", str(tmp_path / "gold.diff")])
    assert done.exit_code == 1 and "elsewhere__x-1: no clone of elsewhere/x under" in done.output, done.output


@pytest.mark.docker
def test_an_official_layout_image_runs_swebenchs_eval_script_verbatim(mirror, tmp_path, docker_ready):
    """No official SWE-bench image can be pulled here, so one of their layout stands in: the built instance
    image plus a conda whose `activate` only defines a no-op `conda` (the official images' env is real conda).
    In it the evaluator runs swebench's eval script as the harness does, conda activation and install included."""
    import io

    import docker

    root, instances = mirror
    inst = instances["pytest"]
    (tmp_path / "rows.jsonl").write_text(json.dumps(inst.row) + "\n")
    done = CliRunner().invoke(main, ["tasks", "import", "--format", "swebench", str(tmp_path / "rows.jsonl"),
                                     "--repos", str(root), "--out", str(tmp_path / "tasks.jsonl"),
                                     "--image-template", "polar-test/none.{instance_key}:latest"])
    assert done.exit_code == 0, done.output
    (task,) = load_tasks(tmp_path / "tasks.jsonl")
    dockerfile = (f"FROM {task.image}\nRUN mkdir -p /opt/miniconda3/bin "
                  "&& printf 'conda() { :; }\\n' > /opt/miniconda3/bin/activate\n")
    client = docker.from_env()
    image, _ = client.images.build(fileobj=io.BytesIO(dockerfile.encode()), tag="polar-test/official-layout:latest",
                                   rm=True, network_mode="none")
    try:
        (tmp_path / "task.json").write_text(task.model_copy(update={"image": image.tags[0]}).model_dump_json())
        for name, patch, status in (("gold", inst.gold, "RESOLVED_FULL"), ("none", "", "RESOLVED_NO")):
            (tmp_path / name).write_text(patch)
            done = CliRunner().invoke(main, ["evaluate", "--task", str(tmp_path / "task.json"), "--patch",
                                             str(tmp_path / name), "--json"])
            out = json.loads(done.output)
            assert out["status"] == status, done.output
            assert "+ source /opt/miniconda3/bin/activate" in out["log"] and "+ python -m pip install -e ." in out["log"]
    finally:
        client.images.remove("polar-test/official-layout:latest")
