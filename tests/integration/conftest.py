"""Real vLLM servers for the integration run, one at a time (a cold start takes about 90 s on 2 cores):
one on the tiny model's own template, and one per real chat template (`template_vllm`, session-scoped and
parametrized, so pytest groups each template's tests and pays one cold start per template). And polar
proxies to put in front of them."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.real_vllm import (
    REAL_TEMPLATES,
    OneServer,
    ensure_tiny_model,
    real_template,
)

HERE = Path(__file__).parent


@pytest.fixture(scope="session")
def vllm_servers() -> Iterator[OneServer]:
    servers = OneServer()
    yield servers
    servers.close()


@pytest.fixture(scope="session")
def vllm_url(vllm_servers) -> str:
    """The shared server's base URL (the tiny model's own template). POLAR_VLLM_URL reuses one you already
    run instead (while iterating on tests): it must serve the tiny model as scripts/serve_vllm_cpu.sh does."""
    return vllm_servers.url()


@dataclass
class TemplateServer:
    """vLLM started with `--chat-template path`: polar must be told the same template."""

    name: str
    template: Path
    url: str


@pytest.fixture(scope="session", params=list(REAL_TEMPLATES))
def template_vllm(request, vllm_servers) -> TemplateServer:
    template = real_template(request.param)
    return TemplateServer(request.param, template, vllm_servers.url(template))


@pytest.fixture(scope="session")
def model_dir() -> Path:
    """The directory vLLM serves: its tokenizer (and own chat template) are the ones polar must match."""
    return ensure_tiny_model()


@dataclass
class Polar:
    """A running polar proxy (a subprocess) and its capture database."""

    url: str
    db: Path
    mode: str  # "chat-template" | "token-faithful"

    def rows(self, session: str) -> list[dict]:
        from polar.capture.reader import CaptureReader

        return list(CaptureReader(self.db).calls(session=session))


@pytest.fixture(scope="module")
def start_polar(tmp_path_factory, model_dir) -> Iterator[Callable[[str, str], Polar]]:
    """Start polar in front of an upstream, in either prompt mode; every proxy stops with the module.
    `template` is the chat template vLLM was started with; `endpoint` the token-in endpoint (auto probes).

    Subprocesses, because mitmproxy allows one in-process proxy per Python process.
    """
    from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port

    started: list[SubprocessProxy] = []

    def start(upstream: str, mode: str, template: Path | None = None, endpoint: str = "auto") -> Polar:
        db = tmp_path_factory.mktemp(f"captures-{mode}") / "captures.db"
        tokenizer = str(model_dir) if mode == "token-faithful" else ""  # a tokenizer turns token-faithful prompts on
        extra = {"polar_token_endpoint": endpoint} | ({"polar_chat_template": str(template)} if template else {})
        proxy = SubprocessProxy(ProxyConfig(upstream=upstream, db=str(db), port=free_port(), tokenizer=tokenizer,
                                            extra=extra))
        proxy.start()
        started.append(proxy)
        return Polar(proxy.url, db, mode)

    yield start
    for proxy in started:
        proxy.stop()


def _template(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get("template_vllm", "") if callspec else ""


@pytest.hookimpl(trylast=True)  # after pytest's own grouping by fixture parameters
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Group integration tests by the template their vLLM serves, real templates first: one server runs at a
    time (a new template stops the last one), so each template pays one cold start and the shared server,
    once started, keeps running to the end. Other items keep their places."""
    order = {name: n for n, name in enumerate(REAL_TEMPLATES)}
    slots = [n for n, item in enumerate(items) if HERE in Path(str(item.path)).parents]
    ordered = sorted((items[n] for n in slots), key=lambda item: order.get(_template(item), len(order)))
    for n, item in zip(slots, ordered, strict=True):
        items[n] = item


# -- the official SDKs as clients: one conversation of user turns ---------------------------------

# Offered on every call (a harness always sends its tools); the tiny model's noise never calls them.
TOOLS = [
    {"name": "read_file", "description": "Read a file from the workspace",
     "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}},
    {"name": "run", "description": "Run a shell command",
     "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}, "timeout": {"type": "integer"}},
                    "required": ["cmd"]}},
]
SEED = 7  # sent where the API has a seed; temperature 0 everywhere makes the runs greedy anyway


@dataclass
class Answer:
    """One model answer as the client's SDK parsed it, in canonical terms."""

    text: str
    reasoning: str  # the thinking text the client was shown ("" when none)
    finish: str  # stop | length | tool_calls | stop_sequence
    input_tokens: int
    output_tokens: int


def _anthropic(url: str, session: str, turns: list[tuple[str, int]], stream: bool, thinking: bool) -> list[Answer]:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="sk-ant-test", max_retries=0,
                                 default_headers={"x-polar-session": session})
    tools = [{"name": t["name"], "description": t["description"], "input_schema": t["parameters"]} for t in TOOLS]
    messages: list[dict] = []
    answers = []
    for text, max_tokens in turns:
        messages.append({"role": "user", "content": text})
        # This SDK no longer takes `temperature` as an argument; the API still reads it from the body.
        kwargs = dict(model="claude-sonnet-4-5", max_tokens=max_tokens, messages=messages, tools=tools,
                      thinking={"type": "adaptive"} if thinking else {"type": "disabled"}, extra_body={"temperature": 0})
        if stream:
            with client.messages.stream(**kwargs) as s:
                msg = s.get_final_message()
        else:
            msg = client.messages.create(**kwargs)
        messages.append({"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in msg.content]})
        finishes = {"end_turn": "stop", "max_tokens": "length", "tool_use": "tool_calls"}
        finish = finishes.get(msg.stop_reason, msg.stop_reason)
        answers.append(Answer(
            text="".join(b.text for b in msg.content if b.type == "text"),
            reasoning="".join(b.thinking for b in msg.content if b.type == "thinking"),
            finish=finish,
            input_tokens=msg.usage.input_tokens + (msg.usage.cache_read_input_tokens or 0),
            output_tokens=msg.usage.output_tokens,
        ))
    return answers


def _chat(url: str, session: str, turns: list[tuple[str, int]], stream: bool, thinking: bool) -> list[Answer]:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0,
                           default_headers={"x-polar-session": session})
    messages: list[dict] = []
    answers = []
    for text, max_tokens in turns:
        messages.append({"role": "user", "content": text})
        kwargs = dict(model="gpt-5", messages=messages, tools=[{"type": "function", "function": t} for t in TOOLS],
                      max_tokens=max_tokens, temperature=0, seed=SEED,
                      extra_body={"chat_template_kwargs": {"enable_thinking": thinking}})
        if stream:
            content, reasoning, finish, usage = "", "", None, None
            for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
                usage = chunk.usage or usage
                for choice in chunk.choices:
                    content += choice.delta.content or ""
                    extra = choice.delta.model_extra or {}
                    reasoning += extra.get("reasoning") or extra.get("reasoning_content") or ""
                    finish = choice.finish_reason or finish
            # A harness echoes the reasoning it streamed, as polar sent it.
            messages.append({"role": "assistant", "content": content} | ({"reasoning": reasoning} if reasoning else {}))
        else:
            completion = client.chat.completions.create(**kwargs)
            message, finish, usage = completion.choices[0].message, completion.choices[0].finish_reason, completion.usage
            content = message.content or ""
            extra = message.model_extra or {}
            reasoning = extra.get("reasoning") or extra.get("reasoning_content") or ""
            messages.append(message.model_dump(exclude_none=True))
        answers.append(Answer(content, reasoning, finish, usage.prompt_tokens, usage.completion_tokens))
    return answers


def _responses(url: str, session: str, turns: list[tuple[str, int]], stream: bool, thinking: bool) -> list[Answer]:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0,
                           default_headers={"x-polar-session": session})
    tools = [{"type": "function", "strict": False, **t} for t in TOOLS]
    items: list = []
    answers = []
    for text, max_tokens in turns:
        items.append({"role": "user", "content": text})
        kwargs: dict = dict(model="gpt-5-codex", input=items, tools=tools, store=False, max_output_tokens=max_tokens,
                            temperature=0)
        if thinking:  # Codex-style: stateless, the reasoning comes back as encrypted_content
            kwargs.update(include=["reasoning.encrypted_content"], reasoning={"effort": "low", "summary": "auto"})
        else:
            kwargs.update(reasoning={"effort": "none"})
        if stream:
            with client.responses.stream(**kwargs) as s:
                response = s.get_final_response()
        else:
            response = client.responses.create(**kwargs)
        items += [item.model_dump(exclude_none=True) for item in response.output]
        reasoning = [item for item in response.output if item.type == "reasoning"]
        calls = [item for item in response.output if item.type == "function_call"]
        if response.status == "incomplete":
            finish = "length" if response.incomplete_details.reason == "max_output_tokens" else response.status
        else:
            finish = "tool_calls" if calls else "stop"
        answers.append(Answer(
            text=response.output_text,
            # The raw reasoning text when the item carries it, else its summary (polar may send both).
            reasoning="".join("".join(c.text for c in r.content or []) or "".join(s.text for s in r.summary)
                              for r in reasoning),
            finish=finish,
            input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens,
        ))
    return answers


def _gemini(url: str, session: str, turns: list[tuple[str, int]], stream: bool, thinking: bool) -> list[Answer]:
    from google import genai
    from google.genai import types

    options = types.HttpOptions(base_url=url, headers={"x-polar-session": session})
    client = genai.Client(api_key="gm-test", http_options=options)
    contents: list = []
    answers = []
    for text, max_tokens in turns:
        contents.append(types.Content(role="user", parts=[types.Part(text=text)]))
        config = types.GenerateContentConfig(
            tools=[types.Tool(function_declarations=[types.FunctionDeclaration(**t) for t in TOOLS])],
            thinking_config=types.ThinkingConfig(include_thoughts=True) if thinking
            else types.ThinkingConfig(thinking_budget=0),
            max_output_tokens=max_tokens, temperature=0, seed=SEED,
        )
        if stream:
            chunks = list(client.models.generate_content_stream(model="gemini-2.5-pro", contents=contents, config=config))
            parts = [p for c in chunks for cand in c.candidates or [] for p in (cand.content.parts or [])]
            last = chunks[-1]
        else:
            last = client.models.generate_content(model="gemini-2.5-pro", contents=contents, config=config)
            parts = list(last.candidates[0].content.parts or [])
        contents.append(types.Content(role="model", parts=parts))
        reason = last.candidates[0].finish_reason
        calls = [p for p in parts if p.function_call]
        finish = {"STOP": "tool_calls" if calls else "stop", "MAX_TOKENS": "length"}.get(reason.name, reason.name)
        usage = last.usage_metadata
        answers.append(Answer(
            text="".join(p.text for p in parts if p.text and not p.thought),
            reasoning="".join(p.text for p in parts if p.text and p.thought),
            finish=finish,
            input_tokens=usage.prompt_token_count,
            output_tokens=usage.total_token_count - usage.prompt_token_count,
        ))
    return answers


CONVERSE = {"anthropic": _anthropic, "openai_chat": _chat, "openai_responses": _responses, "gemini": _gemini}


@pytest.fixture(scope="session")
def converse() -> Callable[..., list[Answer]]:
    """converse(provider, polar_url, session, [(user text, max tokens), ...], stream=, thinking=) → answers.

    Plays a harness through the provider's official SDK: sends each user turn, and keeps the
    assistant message exactly as the SDK returned it in the history of the next call.
    """

    def run(provider: str, url: str, session: str, turns: list[tuple[str, int]], *, stream: bool,
            thinking: bool) -> list[Answer]:
        return CONVERSE[provider](url, session, turns, stream, thinking)

    return run


@pytest.fixture(scope="module")
def tap(vllm_url):
    """A recording relay in front of the shared vLLM: what polar sent and what vLLM answered."""
    from tests.support.tap import running_tap

    with running_tap(vllm_url) as tap:
        yield tap


@pytest.fixture(scope="module")
def template_tap(template_vllm):
    """A recording relay in front of the vLLM serving a real template."""
    from tests.support.tap import running_tap

    with running_tap(template_vllm.url) as tap:
        yield tap
