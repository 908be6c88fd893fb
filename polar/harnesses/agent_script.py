"""A minimal coding agent, copied into a sandbox and run there by the `python-agent` harness.

Standalone on purpose (the `openai` package and the standard library only): it must run in any
sandbox image with Python and the SDK, where polar itself is not installed. It reads its task and
the polar endpoint from the environment, and works in its current directory.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import openai

TOOLS = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": {p: {"type": "string"} for p in params}, "required": list(params)}}}
    for name, desc, params in [
        ("run", "Run a shell command in the repository and return its output.", ["command"]),
        ("read_file", "Read a file of the repository.", ["path"]),
        ("write_file", "Create or overwrite a file of the repository.", ["path", "content"]),
        ("edit_file", "Replace the exact text `old` by `new` in a file.", ["path", "old", "new"]),
    ]
]


def inside(path: str) -> Path:
    target = (Path.cwd() / path).resolve()
    if Path.cwd().resolve() not in [target, *target.parents]:
        raise ValueError(f"{path} is outside the repository")
    return target


def call_tool(name: str, args: dict) -> str:
    if name == "run":
        done = subprocess.run(args["command"], shell=True, capture_output=True, text=True, timeout=120,
                              check=False)
        return f"exit code {done.returncode}\n{done.stdout[-4000:]}{done.stderr[-4000:]}"
    if name == "read_file":
        return inside(args["path"]).read_text()
    if name == "write_file":
        inside(args["path"]).parent.mkdir(parents=True, exist_ok=True)
        inside(args["path"]).write_text(args["content"])
        return "written"
    if name == "edit_file":
        path = inside(args["path"])
        text = path.read_text()
        if args["old"] not in text:
            return "error: `old` does not occur in the file"
        path.write_text(text.replace(args["old"], args["new"], 1))
        return "edited"
    return f"error: unknown tool {name}"


def main() -> int:
    client = openai.OpenAI(max_retries=0, timeout=600)
    messages = [
        {"role": "system", "content": "You are a coding agent. Use the tools to complete the task in this repository."},
        {"role": "user", "content": os.environ["POLAR_INSTRUCTION"]},
    ]
    for _ in range(int(os.environ.get("POLAR_MAX_STEPS", "20"))):
        reply = client.chat.completions.create(model=os.environ.get("POLAR_MODEL", "polar-policy"), messages=messages,
                                               tools=TOOLS)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            print(message.content or "")
            return 0
        for call in message.tool_calls:
            try:
                output = call_tool(call.function.name, json.loads(call.function.arguments or "{}"))
            except Exception as exc:  # a bad tool call is the model's problem: tell it, keep going
                output = f"error: {exc}"
            messages.append({"role": "tool", "tool_call_id": call.id, "content": output})
    print("step limit reached", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
