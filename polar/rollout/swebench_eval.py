"""SWE-bench instances graded as the official harness grades them, with the `swebench` package's own code.

The eval script comes from swebench's `make_eval_script_list` (reset the test files to the base
commit, apply the instance's `test_patch`, run the repo/version's `test_cmd` on the test files the
patch touches, between swebench's output markers), the model patch is applied with the harness's
own `GIT_APPLY_CMDS`, and the verdict is `get_eval_report` on the test log: swebench's log parser
for the repo (`MAP_REPO_TO_PARSER`) and its FAIL_TO_PASS / PASS_TO_PASS resolution rules.

In an official instance image (conda at /opt/miniconda3, the repo at /testbed) the script runs
verbatim. Elsewhere (polar's own images, the local runtime) the environment is the image's job: the
script leaves out the conda activation and the spec's `install` and `eval_commands`, and runs in the
sandbox's workdir; the test command, its test files and the markers are swebench's, unchanged.

A repository swebench does not know (SWE-Gym, SWE-smith and other sets) is graded with the
instance's `test_cmd` and `log_parser` (the name of one of swebench's parsers, e.g.
`parse_log_pytest`); they are registered in swebench's tables for that repo only, never over a repo
swebench knows.
"""

from __future__ import annotations

import json
import os
import shlex
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from polar.harnesses import SUPPORT_DIR, SessionContext
from polar.rollout.evaluators import EvalContext, Evaluation, Evaluator
from polar.rollout.tasks import TaskSpec
from polar.sandboxes.base import Runtime, Sandbox, SandboxSpec
from polar.sandboxes.local import LocalSandbox

# The fields of a SWE-bench row that grading reads (the rest — problem statement, gold patch — stay out of the task).
GRADING_FIELDS = ("instance_id", "repo", "version", "base_commit", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS",
                  "environment_setup_commit", "test_cmd", "log_parser")
_GIT = ["git", "-c", "user.email=eval@polar.invalid", "-c", "user.name=polar", "-c", "commit.gpgsign=false"]
_PATCH = f"{SUPPORT_DIR}/model.patch"
_SCRIPT = f"{SUPPORT_DIR}/eval.sh"
_OFFICIAL_ROOT = "/testbed"


@dataclass
class Graded:
    """One graded patch: the verdict and everything it was decided on."""

    resolved: bool
    status: str  # swebench's ResolvedStatus value: RESOLVED_FULL / RESOLVED_PARTIAL / RESOLVED_NO
    patch_applies: bool
    timed_out: bool = False
    report: dict[str, Any] = field(default_factory=dict)  # get_eval_report's tests_status (success/failure lists)
    outcomes: dict[str, str] = field(default_factory=dict)  # FAIL_TO_PASS/PASS_TO_PASS test → parsed status
    log: str = ""  # the test log the verdict was read from (swebench's test_output.txt)
    apply_output: str = ""

    @property
    def reward(self) -> float:
        return 1.0 if self.resolved else 0.0

    def as_dict(self, log_tail: int | None = 4000) -> dict[str, Any]:
        return {"reward": self.reward, "resolved": self.resolved, "status": self.status,
                "patch_applies": self.patch_applies, "timed_out": self.timed_out, "outcomes": self.outcomes,
                "tests_status": self.report, "apply_output": self.apply_output[-2000:],
                "log": self.log if log_tail is None else self.log[-log_tail:]}


def json_list(value: Any) -> list[str]:
    """FAIL_TO_PASS / PASS_TO_PASS as `datasets` writes them: a JSON string or a list."""
    if value is None:
        return []
    out = json.loads(value) if isinstance(value, str) else value
    if not isinstance(out, list) or not all(isinstance(t, str) for t in out):
        raise ValueError(f"expected a list of test ids, got {type(out).__name__}")
    return list(out)


def normalise(row: dict[str, Any]) -> dict[str, Any]:
    """A SWE-bench row cut to what grading reads, lists as lists; a missing required field is a ValueError."""
    missing = [k for k in ("instance_id", "repo", "version", "base_commit", "test_patch", "FAIL_TO_PASS")
               if row.get(k) in (None, "")]
    if missing:
        raise ValueError(f"SWE-bench row {row.get('instance_id', '?')}: missing {', '.join(missing)}")
    instance = {k: row[k] for k in GRADING_FIELDS if row.get(k) not in (None, "")}
    instance["version"] = str(instance["version"])
    instance["FAIL_TO_PASS"] = json_list(row["FAIL_TO_PASS"])
    instance["PASS_TO_PASS"] = json_list(row.get("PASS_TO_PASS"))
    return instance


def swebench_spec(instance: dict[str, Any], base_commit: str | None = None, repo_dir: str = _OFFICIAL_ROOT,
                  official: bool = True):
    """swebench's TestSpec for the instance: its eval script (see `eval_script_lines`) and what grading reads.
    Built field by field: `make_test_spec` would also fetch the repo's requirements for the image build."""
    require_swebench()
    from swebench.harness.constants import MAP_REPO_TO_EXT
    from swebench.harness.test_spec.test_spec import TestSpec

    _known_or_registered(instance)
    return TestSpec(instance_id=instance["instance_id"], repo=instance["repo"], version=instance["version"],
                    repo_script_list=[], env_script_list=[], arch="x86_64",
                    eval_script_list=eval_script_lines(instance, base_commit or instance["base_commit"], official,
                                                       repo_dir),
                    FAIL_TO_PASS=instance["FAIL_TO_PASS"], PASS_TO_PASS=instance["PASS_TO_PASS"],
                    language=MAP_REPO_TO_EXT[instance["repo"]], docker_specs={}, namespace=None)


def require_swebench() -> None:
    try:
        import swebench.harness.grading  # noqa: F401
    except ImportError as exc:
        raise RuntimeError(f"SWE-bench grading needs the swebench package: pip install 'polar[swebench]' ({exc})") \
            from None


def _known_or_registered(instance: dict[str, Any]) -> None:
    from swebench.harness.constants import MAP_REPO_TO_EXT, MAP_REPO_VERSION_TO_SPECS

    repo, version = instance["repo"], instance["version"]
    if version in MAP_REPO_VERSION_TO_SPECS.get(repo, {}):
        return
    if "test_cmd" not in instance or "log_parser" not in instance:
        known = sorted(MAP_REPO_VERSION_TO_SPECS.get(repo, {}))
        raise ValueError(f"{instance['instance_id']}: swebench has no test command for {repo} {version}"
                         + (f" (its versions: {', '.join(known)})" if known else "")
                         + ": the row needs test_cmd and log_parser (one of swebench's parse_log_* functions)")
    _register(repo, version, instance["test_cmd"], instance["log_parser"])
    MAP_REPO_TO_EXT.setdefault(repo, "py")


def _register(repo: str, version: str, test_cmd: str, parser_name: str) -> None:
    from swebench.harness import log_parsers
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.log_parsers import MAP_REPO_TO_PARSER

    parsers = {f.__name__: f for f in MAP_REPO_TO_PARSER.values()}
    for module in (log_parsers.python, log_parsers.javascript):
        parsers.update({n: getattr(module, n) for n in dir(module) if n.startswith("parse_log_")})
    if parser_name not in parsers:
        raise ValueError(f"unknown log_parser {parser_name!r}: one of {', '.join(sorted(parsers))}")
    if MAP_REPO_TO_PARSER.get(repo, parsers[parser_name]) is not parsers[parser_name]:
        raise ValueError(f"{repo} is graded with swebench's {MAP_REPO_TO_PARSER[repo].__name__}, not {parser_name}")
    MAP_REPO_TO_PARSER[repo] = parsers[parser_name]
    MAP_REPO_VERSION_TO_SPECS.setdefault(repo, {})[version] = {"test_cmd": test_cmd}


def eval_script_lines(instance: dict[str, Any], base_commit: str, official: bool, repo_dir: str) -> list[str]:
    """swebench's eval script; outside an official image, without the steps that set up its environment."""
    from swebench.harness.constants import MAP_REPO_VERSION_TO_SPECS
    from swebench.harness.test_spec.create_scripts import make_eval_script_list

    specs = MAP_REPO_VERSION_TO_SPECS[instance["repo"]][instance["version"]]
    if not official:
        specs = {k: v for k, v in specs.items() if k not in ("install", "eval_commands")}
    lines = make_eval_script_list(instance, specs, "testbed", repo_dir, base_commit, instance["test_patch"])
    env_lines = ("source /opt/miniconda3/bin/activate", "conda activate ", "git config --global ")
    return lines if official else [line for line in lines if not line.startswith(env_lines)]


def _put(sandbox: Sandbox, text: str, target: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "file"
        path.write_text(text)
        sandbox.copy_in(path, target)


def _rel(sandbox: Sandbox, path: str) -> str:
    """A sandbox path as a command names it: relative to the workdir (the local runtime runs on the host)."""
    return os.path.relpath(path, sandbox.spec.workdir)


def _base_commit(sandbox: Sandbox, wanted: str) -> str:
    """The instance's base commit when the copy has it; else the copy as given, committed now."""
    if sandbox.exec(["git", "cat-file", "-e", f"{wanted}^{{commit}}"], timeout=60).ok:
        return wanted
    done = sandbox.exec(["sh", "-c", "git init -q . && git add -A && \"$@\" commit -q --allow-empty -m base "
                         "&& git rev-parse HEAD", "sh", *_GIT], timeout=120)
    if not done.ok:
        raise RuntimeError(f"could not snapshot the repository to grade it: {done.stderr.strip()[-500:]}")
    return done.stdout.strip().splitlines()[-1]


def is_official(sandbox: Sandbox) -> bool:
    if isinstance(sandbox, LocalSandbox) or sandbox.spec.workdir != _OFFICIAL_ROOT:
        return False
    return sandbox.exec(["test", "-f", "/opt/miniconda3/bin/activate"], timeout=60).ok


def grade(sandbox: Sandbox, instance: dict[str, Any], patch: str, timeout: float = 1800.0,
          env: dict[str, str] | None = None) -> Graded:
    """Apply `patch` to the clean repository in `sandbox` (its workdir), run the instance's eval script
    and grade the log with swebench. `env`: extra variables for the tests (e.g. PATH for the local runtime)."""
    require_swebench()
    from swebench.harness.constants import APPLY_PATCH_FAIL, KEY_INSTANCE_ID, KEY_MODEL, KEY_PREDICTION
    from swebench.harness.grading import get_eval_report, get_logs_eval, get_resolution_status
    from swebench.harness.run_evaluation import GIT_APPLY_CMDS

    official = is_official(sandbox)
    base = _base_commit(sandbox, instance["base_commit"])
    repo_dir = _OFFICIAL_ROOT if official else "." if isinstance(sandbox, LocalSandbox) else sandbox.spec.workdir
    spec = swebench_spec(instance, base, repo_dir, official)
    applied = ""
    if patch.strip():  # an empty patch leaves the repository as it is: its tests say what that is worth
        _put(sandbox, patch, _PATCH)
        for command in GIT_APPLY_CMDS:
            done = sandbox.exec(f"{command} {shlex.quote(_rel(sandbox, _PATCH))}", timeout=300)
            applied = done.stdout + done.stderr
            if done.ok:
                break
        else:
            log = f"{APPLY_PATCH_FAIL}:\n{applied}"
            return Graded(False, "RESOLVED_NO", False, log=log, apply_output=applied)
    _put(sandbox, spec.eval_script, _SCRIPT)
    done = sandbox.exec(f"bash {shlex.quote(_rel(sandbox, _SCRIPT))} 2>&1", env=env, timeout=timeout)
    log = done.stdout + done.stderr
    with tempfile.TemporaryDirectory() as tmp:
        log_path = Path(tmp) / "test_output.txt"
        log_path.write_text(log + (f"\n\nTimeout error: {timeout} seconds exceeded." if done.timed_out else ""))
        prediction = {KEY_INSTANCE_ID: spec.instance_id, KEY_MODEL: "polar", KEY_PREDICTION: patch}
        report = get_eval_report(spec, prediction, str(log_path), include_tests_status=True)[spec.instance_id]
        status_map, _ = get_logs_eval(spec, str(log_path))
    tests = report.get("tests_status", {})
    resolved = bool(report["resolved"]) and not done.timed_out  # the official harness grades no timed-out run
    status = get_resolution_status(tests) if tests and not done.timed_out else "RESOLVED_NO"
    outcomes = {t: status_map.get(t, "MISSING") for t in spec.FAIL_TO_PASS + spec.PASS_TO_PASS}
    return Graded(resolved, status, True, done.timed_out, tests, outcomes, log, applied)


class SWEBench(Evaluator):
    """options: instance (the SWE-bench row's grading fields, see GRADING_FIELDS), timeout (seconds)."""

    name = "swebench"

    def instance(self) -> dict[str, Any]:
        if not isinstance(self.options.get("instance"), dict):
            raise ValueError("swebench needs options.instance (the SWE-bench row)")
        return normalise(self.options["instance"])

    def prepare(self, task: TaskSpec, runtime: Runtime, session: SessionContext) -> Any:
        return clean_sandbox(task, runtime, f"{session.session_id}-eval", session.workdir)

    def evaluate(self, ctx: EvalContext) -> Evaluation:
        if ctx.diff is None:
            raise RuntimeError("the session's image has no git, so its changes cannot be taken as a diff")
        graded = grade(ctx.prepared, self.instance(), ctx.diff, float(self.options.get("timeout", 1800)),
                       env=env_for_tests(ctx.prepared, ctx.session.python))
        return Evaluation(graded.reward, details=graded.as_dict())

    def cleanup(self, prepared: Any) -> None:
        if prepared is not None:
            prepared.stop()


def clean_sandbox(task: TaskSpec, runtime: Runtime, name: str, workdir: str) -> Sandbox:
    """A fresh sandbox of the task's image with the repository as the task gives it (the tests' own copy)."""
    sandbox = runtime.start(SandboxSpec(image=task.image or "", session=name, workdir=workdir))
    try:
        if task.repo:
            sandbox.copy_in(task.repo, workdir)
    except Exception:
        sandbox.stop()
        raise
    return sandbox


def env_for_tests(sandbox: Sandbox, python: str) -> dict[str, str] | None:
    """On the local runtime: the session's Python first on PATH (test commands name `python` and `pytest`),
    and the host environment's pytest plugins left out of the repository's tests."""
    if not isinstance(sandbox, LocalSandbox):
        return None
    bin_dir = str(Path(python).parent) if "/" in python else ""
    path = f"{bin_dir}:{sandbox.env.get('PATH', '')}" if bin_dir else sandbox.env.get("PATH", "")
    return {"PATH": path, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
