"""The Python agents' shortcuts without Docker: pinned PyPI packages installed for the sandbox's Python,
headless argv carrying the task once, polar's base URL and the session's key in a rollout session."""

from __future__ import annotations

from pathlib import Path

import pytest

from polar.harnesses import HARNESSES, PYTHON_AGENTS, SessionContext, make_harness
from polar.harnesses.pip_harness import TARGET, VENV
from polar.providers import NAMES

TASK = "fix it; don't 'break' $HOME"
CTX = SessionContext(session_id="s-1", api_key="sk-polar-abc", base_url="http://172.26.0.1", workdir="/work/repo",
                     model="polar-policy", python="python3")


@pytest.mark.parametrize("harness", PYTHON_AGENTS, ids=lambda h: h.name)
def test_shortcut_is_pinned_headless_and_pointed_at_polar(harness):
    assert HARNESSES[harness.name] is harness and harness.needs_container
    assert harness.version.count(".") == 2 and harness.provider in NAMES
    assert all(req.endswith(f"=={harness.version}") for req in harness.requirements())
    argv, env = harness.launch(TASK, CTX)
    assert argv.count(TASK) == 1 and argv[0].startswith(f"{VENV}/bin/")
    assert env["OPENAI_API_KEY"] == CTX.api_key  # the registered key: calls are attributed to the session
    assert any(v.startswith(CTX.base_url) for v in env.values())
    assert "s-1" in harness.env("s-1")["OPENAI_API_KEY"] and harness.env("s-1") != harness.env("s-2")


def test_wheels_are_chosen_for_the_sandbox_python(tmp_path, monkeypatch):
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))
    assert TARGET[TARGET.index("--python-version") + 1] == "3.11" and "--only-binary=:all:" in TARGET
    assert "manylinux_2_17_x86_64" in TARGET and "manylinux_2_36_x86_64" in TARGET
    assert all(h.prefix().parent == tmp_path / "pip" for h in PYTHON_AGENTS)


def test_mini_swe_agent_modes():
    tools, text = make_harness("mini_swe_agent"), make_harness("mini_swe_agent", {"text_based": True})
    assert tools.end_tool() == {"name": "bash", "arguments": {"command": "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"}}
    assert text.end_tool() is None and "--model-class" in text.command(TASK) and "mini_textbased.yaml" in text.command(TASK)
    assert text.text_action("ls").endswith("```mswea_bash_command\nls\n```")
    limited = make_harness("mini_swe_agent", {"step_limit": 3}).command(TASK)
    assert limited[limited.index("mini.yaml") + 1:][:2] == ["-c", "agent.step_limit=3"]
    assert "agent.step_limit" not in " ".join(tools.command(TASK))  # none by default: it ends by submitting


def test_hermes_configures_no_context_length():
    """Left unset on purpose: Hermes then asks the endpoint (polar answers its probes)."""
    argv, env = make_harness("hermes").launch(TASK, CTX)
    assert env["CUSTOM_BASE_URL"] == "http://172.26.0.1/v1" and "--provider" in argv
    assert not any("context" in a.lower() for a in [*argv, *env])


def test_openclaw_is_configured_with_polar_at_launch():
    import json

    harness = make_harness("openclaw")
    argv, env = harness.launch(TASK, CTX)
    assert argv[-1] == TASK and argv.count(TASK) == 1 and harness.needs_container
    config = json.loads(env["POLAR_OPENCLAW_CONFIG"])
    provider = config["models"]["providers"]["polar"]
    assert (provider["baseUrl"], provider["apiKey"], provider["api"]) == ("http://172.26.0.1/v1", CTX.api_key,
                                                                         "openai-completions")
    assert config["agents"]["defaults"]["model"]["primary"] == "polar/polar-policy"
    assert config["update"]["checkOnStart"] is False and env["OPENCLAW_NO_AUTO_UPDATE"] == "1"
    messages = make_harness("openclaw", {"api": "anthropic-messages"}).config("http://p", "k")
    assert messages["models"]["providers"]["polar"]["baseUrl"] == "http://p"


def test_openhands_runs_its_sdk_driver_on_the_hosts_python_312():
    """OpenHands needs Python >= 3.12: the host's own 3.12 (a tree of its own, never /usr) installs it natively
    and goes into its image with tmux; each api option captures under its provider."""
    from polar.harnesses.openhands import DRIVER
    from polar.harnesses.pip_harness import host_python, python_home

    harness = make_harness("openhands")
    python = host_python(harness.python)
    assert python.name == "python3.12" and python_home(python) not in (Path("/usr"), Path("/usr/local"))
    assert harness.debs == ("tmux",) and harness.prefix().name.endswith("-py3.12")
    argv, env = harness.launch(TASK, CTX)
    assert argv[1] == "../../polar/run_openhands.py" and argv[2] == TASK
    assert harness.host_files(CTX) == {"/polar/run_openhands.py": DRIVER} and "get_default_agent" in DRIVER.read_text()
    assert (env["OPENAI_BASE_URL"], env["ANTHROPIC_API_KEY"], env["POLAR_OPENHANDS_API"]) == (
        "http://172.26.0.1/v1", CTX.api_key, "chat")
    assert env["LITELLM_LOCAL_MODEL_COST_MAP"] == "True"  # no price-map fetch
    assert [make_harness("openhands", {"api": a}).provider for a in ("chat", "responses", "messages")] == [
        "openai_chat", "openai_responses", "anthropic"]
    with pytest.raises(ValueError, match="api"):
        make_harness("openhands", {"api": "gemini"}).launch(TASK, CTX)
