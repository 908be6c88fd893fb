"""The main job on embedded defaults, end to end on one machine without a GPU.

`polar demo` runs the rollout service in-process on the shipped SWE-style tasks
(data/tasks/tasks.jsonl) with a real coding CLI in Docker (default: Claude Code), against the
scripted vLLM double (real Qwen3.5 tokenizer) whose rules make the CLI fix each task with its own
shell tool: the rule matches a marker in the task's instruction (`metadata.scripted`), and the
scripted model calls the harness's shell tool with the fix, then answers. Each task runs as a
small GRPO group; the SWE evaluator scores every session's diff against the hidden tests; the
scored trajectories land in the rollout state (SQLite) and a summary table is printed.
`--runtime local` runs the python-agent as host processes instead (no Docker).

`polar demo --sdk-tour` keeps the gateway's own demonstration: the four provider APIs driven by
their official SDKs through one streamed tool-calling round each, and the capture table.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from polar.capture.reader import CaptureReader
from polar.doubles.scripted_vllm import BackgroundServer, Script, ScriptedVLLM
from polar.harnesses import HARNESSES, Harness, get
from polar.mitm.proxy import BackgroundProxy, ProxyConfig, free_port
from polar.reporting.table import captures_table
from polar.rollout.tasks import Named, SessionResult, TaskSpec, load_tasks
from polar.sessions.identity import SESSION_HEADER
from polar.trajectories.builders import prefix_merge

TASKS = Path(__file__).resolve().parents[2] / "data" / "tasks" / "tasks.jsonl"
WORKDIR = "/work"  # where sessions find the repository (polar.rollout.lifecycle.WORKDIR)
REASONING = "The failing behaviour comes from one line; a single edit fixes it."
DONE_REASONING = "The edit is in place; nothing else to change."


@dataclass
class MainJob:
    """What the main job produced: every session's result and how many model calls each left."""

    results: list[SessionResult]
    calls: dict[str, int]  # session id → captured model calls
    state: Path
    captures: Path
    seconds: float


def scripted_rule(task: TaskSpec, harness: Harness) -> dict[str, Any]:
    """The double's rule for one task: (read the file if the harness insists,) run the fix with the
    harness's shell tool, then say it is done. Reasoning on tool turns travels back in the history.
    Every turn reasons: after the generation prompt's `<think>` line an empty reasoning samples a
    lone newline token, which a whole-conversation rendering merges with the prompt's newline into
    one token, so that turn's chat row could not re-render to its captured tokens (docs/datasets.md)."""
    scripted = task.metadata["scripted"]
    read = harness.read_tool(f"{WORKDIR}/{scripted['file']}")
    calls = ([read] if read else []) + [harness.shell_tool(scripted["fix"])]
    steps = [{"reasoning": REASONING, "content": "", "tool_calls": [call]} for call in calls]
    done = {"reasoning": DONE_REASONING, "content": "Fixed.", "tool_calls": [end] if (end := harness.end_tool()) else []}
    return {"match": scripted["marker"], "steps": [*steps, done]}


def demo_tasks(path: Path, harness: str, runtime: str, samples: int) -> list[TaskSpec]:
    return [t.model_copy(update={"harness": Named(name=harness), "runtime": runtime, "samples": samples})
            for t in load_tasks(path)]


def run_main_job(workdir: Path, tokenizer_dir: Path, harness: str = "claude_code", runtime: str = "docker",
                 samples: int = 2, tasks_path: Path = TASKS, console: Console | None = None) -> MainJob:
    """Submit the shipped tasks to an in-process rollout service and wait for every session."""
    from polar.rollout.lifecycle import embedded_gateway

    console = console or Console(width=max(Console().width, 120))
    workdir.mkdir(parents=True, exist_ok=True)
    captures, state = workdir / "captures.db", workdir / "rollout.db"
    for db in (captures, state):  # a fresh run: the shipped task ids are submitted again
        for suffix in ("", "-wal", "-shm"):
            db.with_name(db.name + suffix).unlink(missing_ok=True)
    tasks = demo_tasks(tasks_path, harness, runtime, samples)
    script = Script.from_json({"rules": [scripted_rule(t, get(harness)) for t in tasks]})
    # A window as wide as real Qwen3.5 deployments serve: Hermes Agent refuses one under 64K tokens.
    upstream = BackgroundServer(ScriptedVLLM(tokenizer_dir, "polar-tiny", script=script, max_model_len=131072).app)
    upstream_url = upstream.start()
    proxy, env = embedded_gateway(upstream_url, str(captures), 0, tokenizer=str(tokenizer_dir),
                                  docker=runtime == "docker")
    console.print(f"[bold]polar[/] {proxy.url} → scripted vLLM double {upstream_url}; "
                  f"{len(tasks)} tasks × {samples} samples, harness [bold]{harness}[/] on {runtime}")
    started = time.monotonic()
    try:
        results = asyncio.run(_rollout(env, tasks, state, console))
    finally:
        for rt in env.runtimes.values():
            rt.close()
        proxy.stop()
        upstream.stop()
    job = MainJob(results, _calls(captures, results), state, captures, time.monotonic() - started)
    console.print(summary_table(job))
    console.print(f"{len(results)} sessions in {job.seconds:.0f}s; scored trajectories in {state}, captures in "
                  f"{captures}.\nNext: `polar export --state {state} --captures {captures} --out dataset/` (SFT and "
                  f"RL rows), `polar report --state {state} --db {captures} --out report.html`")
    return job


async def _rollout(env, tasks: list[TaskSpec], state_path: Path, console: Console) -> list[SessionResult]:
    from polar.rollout.lifecycle import SessionPhases
    from polar.rollout.node import GatewayNode, NodeConfig
    from polar.rollout.service import LocalNode, RolloutService
    from polar.rollout.state import RolloutState

    config = NodeConfig(init_workers=2, ready_size=2, running_slots=2, postrun_workers=2)
    service = RolloutService(RolloutState(state_path), [LocalNode(GatewayNode(SessionPhases(env, config), config),
                                                                  env.capture_db)])
    await service.start()
    results: list[SessionResult] = []
    try:
        accepted = await service.submit(tasks)
        pending = {s for a in accepted for s in a["sessions"]}
        async for item in service.results(follow=True):
            if item is None or item[1].session_id not in pending:
                continue
            result = item[1]
            pending.discard(result.session_id)
            results.append(result)
            console.print(f"  {result.session_id}: {result.outcome}, reward {result.reward}"
                          + (f" — {result.error}" if result.error else ""))
            if not pending:
                break
    finally:
        await service.close()
    return results


def _calls(captures: Path, results: list[SessionResult]) -> dict[str, int]:
    """Captured model calls per session (the session's capture id is its session id: no restarts here)."""
    store = CaptureReader(captures)
    return {r.session_id: sum(row["endpoint"] not in ("unknown", "count_tokens", "models")
                              for row in store.calls(session=r.session_id, with_tokens=False))
            for r in results}


def summary_table(job: MainJob) -> Table:
    by_task: dict[str, list[SessionResult]] = defaultdict(list)
    for r in job.results:
        by_task[r.task_id].append(r)
    table = Table(title="main job: scored trajectories")
    for name in ("task", "sessions", "solved", "mean reward", "calls captured", "trajectories", "trainable tokens"):
        table.add_column(name, justify="left" if name == "task" else "right")
    for task_id, rs in sorted(by_task.items()):
        rewards = [r.reward for r in rs if r.reward is not None]
        table.add_row(task_id, str(len(rs)), str(sum(x >= 1.0 for x in rewards)),
                      f"{sum(rewards) / len(rewards):.2f}" if rewards else "-",
                      str(sum(job.calls.get(r.session_id, 0) for r in rs)),
                      str(sum(len(r.trajectories) for r in rs)),
                      str(sum(t.trainable_tokens for r in rs for t in r.trajectories)))
    return table


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


def sdk_tour_run(workdir: Path, tokenizer_dir: Path) -> None:
    """The four provider APIs through polar with their official SDKs, one tool-calling round each."""
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
    store = CaptureReader(db)
    rows = list(store.calls())
    captures_table(rows, console, title=f"captures in {db}")
    tokens = sum(r["prompt_len"] + r["completion_len"] for r in rows if r["status"] == "ok")
    faithful = sum(r["prompt_mode"].startswith("token-faithful") for r in rows if r["prompt_mode"])
    trajectories = prefix_merge(rows)
    console.print(f"{len(rows)} calls captured ({faithful} with token-faithful prompts), {tokens} prompt+sampled "
                  f"token ids; prefix-merge → {len(trajectories)} trajectories (one per session)")


def _anthropic(url: str, session: str) -> str:
    import anthropic

    client = anthropic.Anthropic(base_url=url, api_key="sk-demo", default_headers={SESSION_HEADER: session})
    messages = [{"role": "user", "content": QUESTION}]
    tools = [{"name": WEATHER["name"], "description": WEATHER["description"], "input_schema": WEATHER["parameters"]}]
    kwargs = {"model": "claude-sonnet-4-5", "max_tokens": 2048, "tools": tools,
              "thinking": {"type": "enabled", "budget_tokens": 1024}}
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

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-demo", default_headers={SESSION_HEADER: session})
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

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-demo", default_headers={SESSION_HEADER: session})
    tools = [{"type": "function", "strict": False, **WEATHER}]
    items: list = [{"role": "user", "content": QUESTION}]
    kwargs = {"model": "gpt-5-codex", "tools": tools, "store": False, "include": ["reasoning.encrypted_content"],
              "reasoning": {"effort": "medium", "summary": "auto"}}
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

    client = genai.Client(api_key="gm-demo", http_options=types.HttpOptions(base_url=url, headers={SESSION_HEADER: session}))
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



@click.command("demo")
@click.option("--workdir", default=None, type=click.Path(file_okay=False),
              help="Where the databases go (default: ${POLAR_CACHE:-~/.cache/polar}/demo).")
@click.option("--tokenizer", "tokenizer_dir", default=None, type=click.Path(file_okay=False),
              help="The scripted double's tokenizer (default: the Qwen3.5 one scripts/demo builds).")
@click.option("--harness", default=None, type=click.Choice(sorted(HARNESSES)),
              help="Default: claude_code on docker, python-agent on local.")
@click.option("--runtime", default="docker", show_default=True, type=click.Choice(["docker", "local"]),
              help="local: host processes, no Docker (use --harness python-agent).")
@click.option("--samples", default=2, show_default=True, type=int, help="Sessions per task (a GRPO group).")
@click.option("--tasks", "tasks_path", default=str(TASKS), show_default=True, type=click.Path(dir_okay=False))
@click.option("--sdk-tour", is_flag=True, help="Instead: the four provider APIs through polar with their SDKs.")
def demo(workdir, tokenizer_dir, harness, runtime, samples, tasks_path, sdk_tour) -> None:
    """The main job: shipped tasks → rollout service → a real CLI in Docker → scored trajectories."""
    from polar.cli.paths import DEFAULT_CACHE, DEFAULT_TOKENIZER

    workdir = Path(workdir or DEFAULT_CACHE / "demo")
    tokenizer_dir = Path(tokenizer_dir or DEFAULT_TOKENIZER)
    if sdk_tour:
        return sdk_tour_run(workdir, tokenizer_dir)
    harness = harness or ("claude_code" if runtime == "docker" else "python-agent")
    if runtime == "local" and get(harness).needs_container:
        raise click.UsageError(f"{harness} runs in a container: use --runtime docker")
    job = run_main_job(workdir, tokenizer_dir, harness, runtime, samples, Path(tasks_path))
    unsolved = [r.session_id for r in job.results if r.reward != 1.0]
    if unsolved:
        raise click.ClickException(f"{len(unsolved)} sessions not solved: {', '.join(unsolved)}")
