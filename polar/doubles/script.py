"""What the scripted double answers: rules matched against the rendered prompt, one step per turn.

A script is a list of rules `{"match": "substring" | null, "steps": [step, ...]}`. The first rule
whose `match` occurs in the rendered prompt applies; the step is chosen by how many assistant turns
the prompt already holds (turn 0 → steps[0]; past the end → the last step). A step is
`{"reasoning": str?, "content": str?, "tool_calls": [{"name": str, "arguments": obj|str}]?}`.
Without a matching rule the double answers with a short text that quotes the last user line.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# Every Qwen template opens an assistant turn this way; the generation prompt is one of them.
ASSISTANT_OPEN = "<|im_start|>assistant\n"


@dataclass
class Step:
    reasoning: str | None = None
    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)

    @classmethod
    def of(cls, raw: dict[str, Any]) -> Step:
        return cls(raw.get("reasoning"), raw.get("content") or "", list(raw.get("tool_calls") or []))


class Script:
    def __init__(self, rules: list[dict[str, Any]] | None = None):
        self.rules = rules or []

    @classmethod
    def from_json(cls, data: Any) -> Script:
        if isinstance(data, dict) and "steps" in data and "rules" not in data:
            data = {"rules": [{"match": data.get("match"), "steps": data["steps"]}]}
        rules = data.get("rules", []) if isinstance(data, dict) else data
        for rule in rules:
            if not isinstance(rule, dict) or not isinstance(rule.get("steps"), list) or not rule["steps"]:
                raise ValueError("each script rule needs a non-empty 'steps' list")
        return cls(rules)

    def step_for(self, prompt_text: str, turn: int | None = None) -> Step:
        """`turn`: the assistant turns the prompt holds, as its model family counts them (default: Qwen's)."""
        if turn is None:
            turn = max(prompt_text.count(ASSISTANT_OPEN) - 1, 0)
        for rule in self.rules:
            if not rule.get("match") or rule["match"] in prompt_text:
                steps = rule["steps"]
                return Step.of(steps[min(turn, len(steps) - 1)])
        return Step(content=f"Scripted answer to: {_last_user_line(prompt_text)}")


def _last_user_line(prompt_text: str) -> str:
    users = prompt_text.split("<|im_start|>user\n")
    last = users[-1].split("<|im_end|>")[0].strip() if len(users) > 1 else ""
    return (last.splitlines() or [""])[-1][:200]
