"""The main job on embedded defaults, end to end on one machine without a GPU.

Starts the scripted vLLM double (real Qwen3.5 tokenizer) and the polar proxy in-process, then
drives each of the four provider APIs with its official SDK through one tool-calling round
(the model calls a tool, the client returns the result, the model answers), streamed, and
prints what landed in the capture store.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from polar.capture.store import CaptureStore
from polar.doubles.scripted_vllm import BackgroundServer, Script, ScriptedVLLM
from polar.proxy import BackgroundProxy, ProxyConfig, free_port
from polar.report import captures_table
from polar.trajectories.builders import prefix_merge

WEATHER = {
    "name": "get_weather",
    "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
}
SCRIPT = Script.from_json(
    {
        "steps": [
            {"reasoning": "I should look the weather up.", "content": "",
             "tool_calls": [{"name": "get_weather", "arguments": {"city": "Paris"}}]},
            {"reasoning": "The tool answered.", "content": "It is sunny in Paris, 21 °C."},
        ]
    }
)
QUESTION = "What is the weather in Paris?"
TOOL_RESULT = "sunny, 21 °C"


def run_demo(workdir: Path, tokenizer_dir: Path) -> None:
    console = Console(width=max(Console().width, 140))
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "captures.db"
    for suffix in ("", "-wal", "-shm"):
        (workdir / f"captures.db{suffix}").unlink(missing_ok=True)
    upstream = BackgroundServer(ScriptedVLLM(tokenizer_dir, "polar-tiny", script=SCRIPT).app)
    upstream_url = upstream.start()
    # With the served model's tokenizer, polar builds token-faithful prompts (its default then).
    proxy = BackgroundProxy(ProxyConfig(upstream=upstream_url, db=str(db), port=free_port(), tokenizer=str(tokenizer_dir)))
    proxy.start()
    console.print(f"[bold]polar[/] reverse proxy {proxy.url} → scripted vLLM double {upstream_url}")
    try:
        for name, run in (("anthropic", _anthropic), ("openai chat", _chat), ("openai responses", _responses),
                          ("gemini", _gemini)):
            answer = run(proxy.url, f"demo-{name.replace(' ', '-')}")
            console.print(f"  {name:17} → {answer}")
    finally:
        proxy.stop()
        upstream.stop()
    store = CaptureStore(db, readonly=True)
    rows = list(store.calls())
    captures_table(rows, console, title=f"captures in {db}")
    tokens = sum(r["prompt_len"] + r["completion_len"] for r in rows if r["status"] == "ok")
    faithful = sum(r["prompt_mode"].startswith("token-faithful") for r in rows if r["prompt_mode"])
    trajectories = prefix_merge(rows)
    console.print(f"{len(rows)} calls captured ({faithful} with token-faithful prompts), {tokens} prompt+sampled "
                  f"token ids; prefix-merge → {len(trajectories)} trajectories (one per session)")
    store.close()


def _anthropic(url: str, session: str) -> str:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="sk-demo", default_headers={"x-polar-session": session})
    messages = [{"role": "user", "content": QUESTION}]
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    kwargs = dict(model="claude-sonnet-4-5", max_tokens=2048, tools=tools, thinking={"type": "enabled", "budget_tokens": 1024})
    with client.messages.stream(messages=messages, **kwargs) as s:
        first = s.get_final_message()
    call = next(b for b in first.content if b.type == "tool_use")
    messages += [
        {"role": "assistant", "content": [b.model_dump(exclude_none=True) for b in first.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": call.id, "content": TOOL_RESULT}]},
    ]
    with client.messages.stream(messages=messages, **kwargs) as s:
        final = s.get_final_message()
    return next(b.text for b in final.content if b.type == "text")


def _chat(url: str, session: str) -> str:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-demo", default_headers={"x-polar-session": session})
    messages: list[dict] = [{"role": "user", "content": QUESTION}]
    tools = [{"type": "function", "function": WEATHER}]
    first = client.chat.completions.create(model="gpt-5", messages=messages, tools=tools).choices[0].message
    call = first.tool_calls[0]
    messages += [first.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": TOOL_RESULT}]
    text = ""
    for chunk in client.chat.completions.create(model="gpt-5", messages=messages, tools=tools, stream=True):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
    return text


def _responses(url: str, session: str) -> str:
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-demo", default_headers={"x-polar-session": session})
    tools = [{"type": "function", "strict": False, **WEATHER}]
    items: list = [{"role": "user", "content": QUESTION}]
    kwargs = dict(model="gpt-5-codex", tools=tools, store=False, include=["reasoning.encrypted_content"],
                  reasoning={"effort": "medium", "summary": "auto"})
    with client.responses.stream(input=items, **kwargs) as s:
        first = s.get_final_response()
    call = next(i for i in first.output if i.type == "function_call")
    items += [i.model_dump(exclude_none=True) for i in first.output]
    items.append({"type": "function_call_output", "call_id": call.call_id, "output": TOOL_RESULT})
    with client.responses.stream(input=items, **kwargs) as s:
        return s.get_final_response().output_text


def _gemini(url: str, session: str) -> str:
    from google import genai
    from google.genai import types

    client = genai.Client(api_key="gm-demo", http_options=types.HttpOptions(base_url=url, headers={"x-polar-session": session}))
    config = types.GenerateContentConfig(
        tools=[types.Tool(function_declarations=[types.FunctionDeclaration(**WEATHER)])],
        thinking_config=types.ThinkingConfig(include_thoughts=True),
    )
    contents: list = [types.Content(role="user", parts=[types.Part(text=QUESTION)])]
    first = client.models.generate_content(model="gemini-2.5-pro", contents=contents, config=config)
    call = next(p.function_call for p in first.candidates[0].content.parts if p.function_call)
    contents += [
        first.candidates[0].content,
        types.Content(role="user", parts=[types.Part(function_response=types.FunctionResponse(
            name=call.name, id=call.id, response={"output": TOOL_RESULT}))]),
    ]
    text = ""
    for chunk in client.models.generate_content_stream(model="gemini-2.5-pro", contents=contents, config=config):
        for part in chunk.candidates[0].content.parts or []:
            if part.text and not part.thought:
                text += part.text
    return text

