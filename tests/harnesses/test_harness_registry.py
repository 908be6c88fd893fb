"""The harness shortcuts' static promises, checked without Docker: pinned packages, headless argv
carrying the task, per-session keys, parseable config files, and nothing that redirects a CLI."""

from __future__ import annotations

import json
import tomllib

import pytest

from polar.harnesses import CLIS, HARNESSES, SessionContext, Shell, get, make_harness
from polar.providers import NAMES

TASK = "fix it; don't 'break' $HOME"
REDIRECTS = ("BASE_URL", "PROXY", "API_BASE", "ENDPOINT", "baseURL", "baseUrl", "base_url", "openai_base_url", "proxy")


@pytest.mark.parametrize("harness", CLIS, ids=lambda h: h.name)
def test_cli_shortcut_is_pinned_and_headless(harness):
    assert harness.package and harness.version.count(".") == 2 and harness.version[0].isdigit()
    assert harness.provider in NAMES
    argv = harness.command(TASK)
    assert argv.count(TASK) == 1  # one argument, never re-split by a shell
    assert harness.model in argv


@pytest.mark.parametrize("harness", CLIS, ids=lambda h: h.name)
def test_nothing_points_a_cli_elsewhere(harness):
    env = harness.env("s-1")
    assert not [name for name in env if any(word.upper() in name.upper() for word in REDIRECTS)]
    files = harness.files()
    for path, text in files.items():
        assert path.startswith("/")
        parsed = tomllib.loads(text) if path.endswith(".toml") else json.loads(text)
        assert not [word for word in REDIRECTS if word in json.dumps(parsed)], path


def test_keys_name_their_session():
    for harness in CLIS:
        keys = [value for name, value in harness.env("s-1").items() if name.endswith("API_KEY")]
        assert keys and all("s-1" in key for key in keys), harness.name
        assert harness.env("s-1") != harness.env("s-2")


@pytest.mark.parametrize("harness", CLIS, ids=lambda h: h.name)
def test_shell_tool_carries_the_command(harness):
    call = harness.shell_tool("sed -i 's/a/b/' x.py")
    assert isinstance(call["name"], str) and call["name"]
    assert "sed -i 's/a/b/' x.py" in call["arguments"].values()


def test_install_prefix_is_per_version(tmp_path, monkeypatch):
    monkeypatch.setenv("POLAR_CACHE", str(tmp_path))
    for harness in CLIS:
        prefix = harness.prefix()
        assert prefix.parent == tmp_path / "npm" and prefix.name.endswith(f"-{harness.version}")
    assert len({h.prefix() for h in CLIS}) == len(CLIS)


def test_generic_shell_passes_the_task_as_an_argument():
    shell = Shell(name="mine", package="", version="", provider="", model="", script='my-agent --task "$1"',
                  variables={"OPENAI_API_KEY": "k"}, tool=("run", "cmd"))
    assert shell.command(TASK) == ["sh", "-c", 'my-agent --task "$1"', "sh", TASK]
    assert shell.env("s") == {"OPENAI_API_KEY": "k"}
    assert shell.shell_tool("ls") == {"name": "run", "arguments": {"cmd": "ls"}}
    with pytest.raises(ValueError, match="declares no shell tool"):
        get("shell").shell_tool("ls")


def test_unknown_harness_names_the_known_ones():
    with pytest.raises(KeyError, match="claude_code"):
        get("nope")
    assert set(HARNESSES) == {"claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi", "shell",
                              "python-agent", "hermes", "mini_swe_agent", "openclaw", "openhands"}
    with pytest.raises(ValueError, match="unknown harness 'nope'"):
        make_harness("nope")


CTX = SessionContext(session_id="s-1", api_key="sk-polar-x", base_url="http://polar:8080", workdir="/work",
                     model="polar-policy", python="/usr/bin/python3")


@pytest.mark.parametrize("harness", CLIS, ids=lambda h: h.name)
def test_a_cli_is_launched_as_a_user_would_run_it(harness):
    argv, env = harness.launch(TASK, CTX)
    assert argv == harness.command(TASK) and env == harness.env("s-1")
    assert harness.needs_container and not harness.host_files(CTX)


def test_base_url_harnesses_get_polar_and_the_session_key():
    argv, env = get("python-agent").launch(TASK, CTX)
    assert argv == ["/usr/bin/python3", "../polar/agent.py"]
    assert (env["OPENAI_BASE_URL"], env["OPENAI_API_KEY"], env["POLAR_INSTRUCTION"]) == (
        "http://polar:8080/v1", "sk-polar-x", TASK)
    assert get("python-agent").host_files(CTX)["/polar/agent.py"].is_file()
    argv, env = make_harness("shell", {"script": "{python} agent.py \"$1\""}).launch(TASK, CTX)
    assert argv == ["sh", "-c", "/usr/bin/python3 agent.py \"$1\"", "sh", TASK]
    assert env["ANTHROPIC_BASE_URL"] == "http://polar:8080"


def test_options_replace_fields_and_unknown_ones_are_named():
    assert make_harness("python-agent", {"max_steps": 3}).env("s")["POLAR_MAX_STEPS"] == "3"
    assert "claude-opus-4-1" in make_harness("claude_code", {"model": "claude-opus-4-1"}).command("t")
    with pytest.raises(ValueError, match="no option bogus"):
        make_harness("codex", {"bogus": 1})
