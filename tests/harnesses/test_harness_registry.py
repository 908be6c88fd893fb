"""The harness shortcuts' static promises, checked without Docker: pinned packages, headless argv
carrying the task, per-session keys, parseable config files, and nothing that redirects a CLI."""

from __future__ import annotations

import json
import tomllib

import pytest

from polar.harnesses import CLIS, HARNESSES, Shell, get
from polar.providers import BY_NAME

TASK = "fix it; don't 'break' $HOME"
REDIRECTS = ("BASE_URL", "PROXY", "API_BASE", "ENDPOINT", "baseURL", "baseUrl", "base_url", "openai_base_url", "proxy")


@pytest.mark.parametrize("harness", CLIS, ids=lambda h: h.name)
def test_cli_shortcut_is_pinned_and_headless(harness):
    assert harness.package and harness.version.count(".") == 2 and harness.version[0].isdigit()
    assert harness.provider in BY_NAME
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
    assert set(HARNESSES) == {"claude_code", "codex", "gemini_cli", "qwen_code", "opencode", "pi", "shell"}
