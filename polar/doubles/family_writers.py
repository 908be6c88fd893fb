"""How the non-Qwen families polar parses write a turn, for the scripted double (model_format.py holds Qwen's).

Each writer produces exactly what the family's real template renders for that assistant turn (the tests render the
double's samples back with the real templates: tests/tokens/test_double_format.py), so a token-faithful test on such
a template measures polar, not the double:

- Llama-3.x (`llama3_json`): no reasoning; an answer is text, or the calls alone as
  `{"name": N, "parameters": {...}}` (several joined by "; ", which the template itself refuses to render).
- DeepSeek-V3.1 (`deepseek_v31`): after an open `<think>` the reasoning, then `</think>`; text; then
  `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>N<｜tool▁sep｜>{json}<｜tool▁call▁end｜>…<｜tool▁calls▁end｜>`.
- DeepSeek-V3.2 (`deepseek_dsml`) and V4 (`deepseek_v4`): after an open `<think>` the reasoning, then `</think>`;
  text; then `\\n\\n<｜DSML｜function_calls>\\n` (V4: `tool_calls`) with `<｜DSML｜invoke name="N">\\n` +
  `<｜DSML｜parameter name="K" string="true">V</｜DSML｜parameter>\\n` per argument (`string="false"` and JSON for a
  value that is no string; V4 writes `\\n` for no arguments) + `</｜DSML｜invoke>\\n` per call, and the closing tag.
- Kimi-K2 (`kimi_k2`, `moonshotai-Kimi-K2`'s template): text, then `<|tool_calls_section_begin|>` with
  `<|tool_call_begin|>functions.N:I<|tool_call_argument_begin|>{json}<|tool_call_end|>` per call (I: its index in the
  turn). Kimi-K2-Instruct (`kimi_k2_instruct`) numbers the calls across the conversation (I: the calls its template
  already wrote, counted in the prompt, then on); Kimi-K2-Thinking (`kimi_k2_thinking`) too, after its reasoning,
  which the model opens itself: `<think>R</think>` (`<think></think>` with none; its template has no switch).
- MiniMax-M2 (`minimax_m2`): after an open `<think>\\n` the reasoning, `\\n</think>\\n\\n`; text; then
  `\\n<minimax:tool_call>\\n<invoke name="N">\\n<parameter name="K">V</parameter>\\n…</invoke>\\n</minimax:tool_call>`.
- GLM-4.6 (`glm-4.5`): after a bare `<|assistant|>` the model writes `\\n<think>R</think>` itself (`\\n<think></think>`
  with no reasoning; nothing when thinking is off: the prompt closed it), then `\\n` + text, then per call
  `\\n<tool_call>N\\n` + `<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n` per argument + `</tool_call>`. GLM-4.7
  (`glm-4.7`): after an open `<think>`, `R</think>`; text and calls with no newlines. There is no end-of-turn token:
  the model stops on the next turn's role token, `<|observation|>` after calls, `<|user|>` after an answer.
- gpt-oss (`harmony`): after the generation prompt's `<|start|>assistant`, messages: `<|channel|>analysis<|message|>R
  <|end|>`, a preamble `<|channel|>commentary<|message|>TEXT<|end|>` beside a call, then the call as the template
  writes it, ` to=functions.N<|channel|>commentary json<|message|>{json}`, stopped by `<|call|>`; or the answer
  `<|channel|>final<|message|>TEXT`, stopped by `<|return|>`. Each later message opens with `<|start|>assistant`. A
  turn holds one call: the model stops at its `<|call|>`, so parallel calls are consecutive turns.
- Mistral (`mistral`), no reasoning, no generation prompt (the turn follows `[/INST]` or `[/TOOL_RESULTS]`), ended by
  `</s>`: Devstral-Small-2507, text then `[TOOL_CALLS]N[ARGS]{json}` per call; Mistral-Small-3.2 (`mistral-call-id`,
  its template writes `[CALL_ID]`), text or calls (its template drops text beside calls), `[TOOL_CALLS]N[CALL_ID]ID
  [ARGS]{json}` per call, ID 9 alphanumerics (the template refuses others) the model makes up: from the prompt and the
  call's place, so each turn's differ.

The double's chat endpoint reads these answers back with polar's own family parser (polar/tokens/formats/), standing
in for vLLM's (tests/tokens/test_vllm_parser_agreement.py holds the two to the same answers).
"""

from __future__ import annotations

import hashlib
import json
import string
from dataclasses import dataclass, replace
from typing import Any, Callable

from polar.doubles.script import Step


def _json(args: Any) -> str:
    """Arguments as the templates' `tojson` writes them (", " and ": "); a string is the model's own text."""
    if isinstance(args, str):
        return args if args.strip() else "{}"
    return json.dumps(args or {}, ensure_ascii=False)


def _llama(step: Step) -> str:
    if step.tool_calls and step.content:
        raise ValueError("a Llama-3 answer is text or tool calls, never both (its template drops the text)")
    return step.content or "; ".join(
        '{"name": "' + c["name"] + '", "parameters": ' + _json(c.get("arguments")) + "}" for c in step.tool_calls)


def _deepseek_v31(step: Step) -> str:
    if not step.tool_calls:
        return step.content
    calls = "".join(f"<｜tool▁call▁begin｜>{c['name']}<｜tool▁sep｜>{_json(c.get('arguments'))}<｜tool▁call▁end｜>"
                    for c in step.tool_calls)
    return f"{step.content}<｜tool▁calls▁begin｜>{calls}<｜tool▁calls▁end｜>"


def _dsml(wrapper: str, empty: str) -> Callable[[Step], str]:
    """DeepSeek's DSML calls as V3.2's (`function_calls`) or V4's (`tool_calls`, `empty` for no arguments) template
    writes them."""
    dsml = "｜DSML｜"

    def body(step: Step) -> str:
        if not step.tool_calls:
            return step.content
        out = f"{step.content}\n\n<{dsml}{wrapper}>\n"
        for call in step.tool_calls:
            typed = {key: isinstance(v, str) for key, v in _arguments(call).items()}
            params = "".join(f'<{dsml}parameter name="{key}" string="{str(typed[key]).lower()}">{text}</{dsml}parameter>\n'
                             for key, text in _arg_texts(call))
            out += f'<{dsml}invoke name="{call["name"]}">\n{params or empty}</{dsml}invoke>\n'
        return out + f"</{dsml}{wrapper}>"

    return body


def _kimi_k2(step: Step, first: int = 0) -> str:
    if not step.tool_calls:
        return step.content
    calls = "".join(f"<|tool_call_begin|>functions.{c['name']}:{i}<|tool_call_argument_begin|>"
                    f"{_json(c.get('arguments'))}<|tool_call_end|>" for i, c in enumerate(step.tool_calls, first))
    return f"{step.content}<|tool_calls_section_begin|>{calls}<|tool_calls_section_end|>"


def _arg_texts(call: dict[str, Any]) -> list[tuple[str, str]]:
    """Each argument as the markup templates write it: a string as is, any other value as JSON."""
    return [(k, v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)) for k, v in _arguments(call).items()]


def _arguments(call: dict[str, Any]) -> dict[str, Any]:
    args = call.get("arguments") or {}
    return json.loads(args) if isinstance(args, str) and args.strip() else args or {}


def _minimax_m2(step: Step) -> str:
    if not step.tool_calls:
        return step.content
    out = step.content + "\n<minimax:tool_call>\n"
    for call in step.tool_calls:
        params = "".join(f'<parameter name="{key}">{text}</parameter>\n' for key, text in _arg_texts(call))
        out += f'<invoke name="{call["name"]}">\n{params}</invoke>\n'
    return out + "</minimax:tool_call>"


def _glm_calls(step: Step, glue: str) -> str:
    return "".join(f"{glue}<tool_call>{call['name']}{glue}" + "".join(
        f"<arg_key>{key}</arg_key>{glue}<arg_value>{text}</arg_value>{glue}" for key, text in _arg_texts(call))
        + "</tool_call>" for call in step.tool_calls)


def _glm46(step: Step) -> str:
    return (f"\n{step.content.strip()}" if step.content.strip() else "") + _glm_calls(step, "\n")


def _glm47(step: Step) -> str:
    return step.content.strip() + _glm_calls(step, "")


def _harmony(step: Step) -> str:
    """Messages after an analysis one (ModelFormat writes it); `<|start|>assistant` opens all but the turn's first."""
    if not step.tool_calls:
        return "<|channel|>final<|message|>" + step.content
    call = step.tool_calls[0]  # the model stops at the first call's <|call|>
    preamble = f"<|channel|>commentary<|message|>{step.content}<|end|><|start|>assistant" if step.content else ""
    return f"{preamble} to=functions.{call['name']}<|channel|>commentary json<|message|>{_json(call.get('arguments'))}"


def _mistral(step: Step) -> str:
    return step.content + "".join(f"[TOOL_CALLS]{c['name']}[ARGS]{_json(c.get('arguments'))}" for c in step.tool_calls)


def _mistral_call_id(step: Step) -> str:
    if step.tool_calls and step.content:
        raise ValueError("a Mistral-Small-3.2 answer is text or tool calls, never both (its template drops the text)")
    return step.content or "".join(f"[TOOL_CALLS]{c['name']}[CALL_ID]{c['id']}[ARGS]{_json(c.get('arguments'))}"
                                   for c in step.tool_calls)


_ALNUM = string.ascii_letters + string.digits


def with_call_ids(step: Step, prompt_text: str) -> Step:
    """Each call an id of 9 alphanumerics, as Mistral-Small-3.2 writes them: one the script gives, else made from the
    prompt and the call's place (unique per turn, the same for the same prompt)."""
    calls = []
    for i, call in enumerate(step.tool_calls):
        digest = hashlib.sha256(f"{i}:{prompt_text}".encode()).digest()
        calls.append({**call, "id": call.get("id") or "".join(_ALNUM[b % len(_ALNUM)] for b in digest[:9])})
    return replace(step, tool_calls=calls)


@dataclass(frozen=True)
class Writer:
    body: Callable[..., str]  # the text and the calls, after any reasoning (and the first call's number, `counts`)
    end_of_turn: str  # the stop token the model samples at the end of its turn
    turn_open: str  # what opens each assistant turn in a prompt ("" : `turn_close` counts the turns)
    think_open: str = ""  # a prompt ending so opened the reasoning block ("": the family writes none)
    think_close: str = ""  # what the model writes after its reasoning
    turn_close: tuple[str, ...] = ()  # counted when the template writes no `turn_open` after a tool result
    parser: str = ""  # polar's parser for the family, when the writer's name is not it (GLM-4.6 and 4.7 share one)
    call_end: str = ""  # the stop token after a turn that calls tools ("": `end_of_turn`)
    think_own: tuple[str, str] = ("", "")  # what the model writes around its reasoning after a prompt that opens none
    think_off: str = ""  # a prompt ending so switched reasoning off (the model writes none)
    think_message: tuple[str, str] = ("", "")  # reasoning as a message of its own (harmony), and what opens the next
    sign: str = ""  # what the template writes that picks this writer over its family's first one ("": none)
    call_ids: bool = False  # the model writes each call's id (`with_call_ids` gives the step's calls theirs)
    counts: str = ""  # a call's mark in the prompt: the turn's calls are numbered on from those the prompt holds

    def write(self, step: Step, prompt_text: str) -> str:
        """The text and the calls, after any reasoning."""
        return self.body(step, prompt_text.count(self.counts)) if self.counts else self.body(step)

    def stop(self, step: Step) -> str:
        return self.call_end if step.tool_calls and self.call_end else self.end_of_turn

    def reasoning(self, step: Step, prompt_text: str) -> str:
        """The reasoning the model writes itself (not after a prompt that opened it)."""
        text = (step.reasoning or "").strip("\n")
        if self.think_message[0]:
            return f"{self.think_message[0]}{text}{self.think_message[1]}" if text else ""
        if self.think_own[0] and not (self.think_off and prompt_text.endswith(self.think_off)):
            return f"{self.think_own[0]}{text}{self.think_own[1]}"
        return ""


WRITERS: dict[str, Writer] = {
    "llama3_json": Writer(_llama, "<|eot_id|>", "<|start_header_id|>assistant<|end_header_id|>"),
    "deepseek_v31": Writer(_deepseek_v31, "<｜end▁of▁sentence｜>", "", "<think>", "</think>",
                           turn_close=("<｜end▁of▁sentence｜>",)),
    # V3.2 writes no assistant marker after tool results: an end of sentence closes each turn
    "deepseek_dsml": Writer(_dsml("function_calls", ""), "<｜end▁of▁sentence｜>", "", "<think>", "</think>",
                            turn_close=("<｜end▁of▁sentence｜>",)),
    "deepseek_v4": Writer(_dsml("tool_calls", "\n"), "<｜end▁of▁sentence｜>", "", "<think>", "</think>",
                          turn_close=("<｜end▁of▁sentence｜>",)),
    "kimi_k2": Writer(_kimi_k2, "<|im_end|>", "<|im_assistant|>assistant<|im_middle|>"),
    # Kimi-K2-Thinking and -Instruct (in this order: Thinking's template has both signs): the template's
    # `tool_call_counter` numbers every call of the conversation
    "kimi_k2_thinking": Writer(_kimi_k2, "<|im_end|>", "<|im_assistant|>assistant<|im_middle|>", parser="kimi_k2",
                               counts="<|tool_call_begin|>", sign="<think>{{rc}}</think>",
                               think_own=("<think>", "</think>")),
    "kimi_k2_instruct": Writer(_kimi_k2, "<|im_end|>", "<|im_assistant|>assistant<|im_middle|>", parser="kimi_k2",
                               counts="<|tool_call_begin|>", sign="tool_call_counter"),
    "minimax_m2": Writer(_minimax_m2, "[e~[", "]~b]ai\n", "<think>\n", "\n</think>\n\n"),
    "glm-4.5": Writer(_glm46, "<|user|>", "<|assistant|>", parser="glm45", call_end="<|observation|>",
                      think_own=("\n<think>", "</think>"), think_off="<think></think>"),
    "glm-4.7": Writer(_glm47, "<|user|>", "<|assistant|>", "<think>", "</think>", parser="glm45",
                      call_end="<|observation|>"),
    "gpt-oss": Writer(_harmony, "<|return|>", "", parser="harmony", call_end="<|call|>",
                      turn_close=("<|call|>", "<|channel|>final<|message|>"),
                      think_message=("<|channel|>analysis<|message|>", "<|end|><|start|>assistant")),
    "mistral": Writer(_mistral, "</s>", "", turn_close=("</s>",)),
    "mistral-call-id": Writer(_mistral_call_id, "</s>", "", turn_close=("</s>",), parser="mistral", sign="[CALL_ID]",
                              call_ids=True),
}


def writer_for(family: str, template_text: str) -> str:
    """The writer of this template's family: the first whose `sign` the template writes, else the family's own."""
    return next((name for name, w in WRITERS.items() if w.sign and (w.parser or name) == family
                 and w.sign in template_text), family)


def turns_sampled(writer: Writer, prompt_text: str) -> int:
    """How many assistant turns the prompt already holds (the script's step index)."""
    if writer.turn_open:
        return max(prompt_text.count(writer.turn_open) - 1, 0)
    return sum(prompt_text.count(close) for close in writer.turn_close)
