"""A model's chat template and tokenizer, as vLLM would apply them, plus token-faithful continuations.

`render` goes through `tokenizer.apply_chat_template` (transformers' own sandboxed Jinja), after
the one rewrite vLLM applies to OpenAI messages first: tool-call `arguments` JSON text becomes an
object. So `prompt_ids` is what vLLM's chat endpoint would feed the model. Where that renderer
refuses a template for changing its own lists (Kimi-K2-Instruct's tool-call queue), polar renders
it in jinja2's sandbox that allows it (sandbox.py), and `vllm_refusal` says so.

`continuation` is the token-faithful part: the ids that follow an assistant turn the model sampled,
built from the template's rendering of only the new messages. It renders a fixed two-message probe
(a user line, then an assistant turn holding a sentinel) followed by the new messages, and keeps
what comes after the probe's end-of-turn marker. The probe's size is fixed, so the cost follows the
new messages (and the tool list, which the system prompt carries) and never the conversation.
This relies on what ChatML-style templates do: a message renders from itself and its neighbours'
roles, not from the text of earlier turns. Checks on the probe catch templates that misbehave.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from polar.canonical import Message, Tool
from polar.errors import GatewayError
from polar.tokens import harmony_turns
from polar.tokens.encoder import IdsEncoder, ids_encoder
from polar.tokens.families import require_token_faithful
from polar.tokens.messages import to_openai_messages
from polar.tokens.parsers import THINK_END, THINK_START, ParsedTurn, family_for_template, parse_turn
from polar.tokens.sandbox import SecurityError, render_with_own_data
from polar.tokens.segments import SegmentIds
from polar.tokens.shaping import TemplateTraits
from polar.tokens.tool_json import install, openai_tool

PROBE_USER = "polar probe: a user line"
_TAIL_IDS = 64  # a prompt's last ids, decoded, hold its generation prompt (or what the template wrote instead)
PROBE_SENTINEL = "polar-probe-7c1e9a-assistant-turn"


@dataclass(frozen=True)
class Continuation:
    """What to append to `previous prompt ids + previous sampled ids`, and how it was made.

    When `failure` is set the template cannot render the new messages on their own: `ids` is
    empty and the caller must re-render the whole conversation (and record `failure` as why).
    """

    ids: list[int]
    text: str  # what `ids` encode: [end-of-turn marker if closing] + bridge + new messages + generation prompt
    bridge: str  # template text between an end-of-turn marker and the next message ("\n" for ChatML)
    closed_truncated_turn: bool  # the previous turn lacked the end-of-turn token; `ids` start with it
    think_open: bool  # the generation prompt leaves a reasoning block open (the sample starts inside it)
    rendered_messages: int  # how many messages were rendered to build it (probe + new)
    rendered_chars: int  # how much text was rendered to build it
    failure: str | None = None
    history_rule: bool = False  # the ids before it take the template's history rule first (harmony_turns.py)

    @classmethod
    def failed(cls, reason: str) -> Continuation:
        return cls([], "", "", False, False, 0, 0, failure=reason)


class _NoContinuation(Exception):
    """Internal: why the template cannot continue; surfaces as `Continuation.failure`."""


@dataclass(frozen=True)
class _Probe:
    end_of_turn: str  # the marker the template writes right after assistant content
    bridge: str  # what the template writes after it when the conversation ends there
    tail: str  # sentinel + calls + end_of_turn + bridge: how the probe's assistant turn must end in every render
    calls: str = ""  # the probe's tool-call markup between its content and end_of_turn (a call probe only)


class ChatTemplate:
    def __init__(
        self,
        tokenizer: Any,
        template_text: str | None = None,
        *,
        eos_token_ids: Sequence[int] | None = None,
        name: str | None = None,
    ):
        text = template_text if template_text is not None else tokenizer.chat_template
        if not isinstance(text, str) or not text.strip():
            raise ValueError("no chat template: the tokenizer has none (or several) and none was given")
        self.tokenizer = tokenizer
        self._encode = ids_encoder(tokenizer)
        self.template_text = text
        install(text)  # tools prepared once per tool (tool_json.py)
        self.name = name  # how rewrite notes and errors name the template (its file, or the model dir)
        self.family = family_for_template(text)
        ids = [tokenizer.eos_token_id, *(eos_token_ids or [])]
        self.eos_token_ids: tuple[int, ...] = tuple(dict.fromkeys(i for i in ids if isinstance(i, int)))
        self._probes: dict[tuple[bool | None, int], _Probe] = {}
        self._generation_prompts: dict[bool | None, str] = {}
        self._whole: Callable[[str], list[int]] | None = None  # whole prompts' encoder (turn pieces reused)
        # Why vLLM's chat endpoint cannot render what this template was asked to render (None: nothing yet);
        # polar renders it in jinja2's sandbox that lets the template change its own lists (sandbox.py).
        self.vllm_refusal: str | None = None
        self._counts_calls = False  # it names tool results by counting the conversation's calls (`continuation`)

    @classmethod
    def from_dir(cls, path: str | Path, template_path: str | Path | None = None) -> ChatTemplate:
        """A Hugging Face tokenizer directory; its generation_config.json adds stop ids, as in vLLM.

        Raises UnknownTemplate (a ValueError) when polar cannot read the family's output out of sampled tokens."""
        from transformers import AutoTokenizer

        path = Path(path)
        tokenizer = AutoTokenizer.from_pretrained(str(path))
        text = Path(template_path).read_text() if template_path else None
        name = Path(template_path).stem if template_path else path.name
        template = cls(tokenizer, text, eos_token_ids=generation_eos_ids(path), name=name)
        require_token_faithful(template.template_text, f"the chat template {name!r}")  # never silent (families.py)
        return template

    def traits(self) -> TemplateTraits:
        """What this template accepts (probed once per template text); `shape` uses them."""
        return TemplateTraits.of(self.template_text, self.name)

    # -- rendering ---------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Message | dict[str, Any]],
        tools: Sequence[Tool | dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool | None = None,
    ) -> str:
        """The template's text for these messages; template errors are the client's (as in vLLM)."""
        kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
        rendered = openai_messages(messages)
        if self.family == "harmony":
            rendered = harmony_turns.template_messages(rendered)
        try:
            return self._render(rendered, openai_tools(tools) or None, add_generation_prompt=add_generation_prompt,
                                **kwargs)
        except GatewayError:
            raise
        except Exception as exc:  # jinja's TemplateError, raise_exception(), TypeError on odd shapes
            raise GatewayError("invalid_request", f"the chat template cannot render these messages: {exc}") from None

    def _render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kwargs: Any) -> str:
        """vLLM's renderer; where it raises its sandbox's error and jinja2's sandbox renders, that one from then
        on (sandbox.py: the same text wherever both render)."""
        if self.vllm_refusal is None:
            try:
                return self.tokenizer.apply_chat_template(messages, tools=tools, chat_template=self.template_text,
                                                          tokenize=False, **kwargs)
            except SecurityError as exc:
                text = self._render_own(messages, tools, **kwargs)  # raises if this sandbox refuses it too
                self.vllm_refusal = f"{type(exc).__name__}: {exc}"
                return text
        return self._render_own(messages, tools, **kwargs)

    def _render_own(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None, **kwargs: Any) -> str:
        return render_with_own_data(self.template_text, messages, tools, self.tokenizer.special_tokens_map, **kwargs)

    def encode(self, text: str) -> list[int]:
        """Token ids for template text: no BOS/EOS added; special tokens written in the text map to their ids."""
        return self._encode(text)

    def prepare_long_text(self) -> None:
        """Start building the fast path for long text (encoder.py: ~3 s of CPU in a thread), so that a proxy
        pays for it as it starts rather than during its first agent-sized calls."""
        if isinstance(self._encode, IdsEncoder):
            self._encode.start_building()

    def decode(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=False)

    def prompt_ids(
        self,
        messages: Sequence[Message | dict[str, Any]],
        tools: Sequence[Tool | dict[str, Any]] | None = None,
        enable_thinking: bool | None = None,
    ) -> list[int]:
        """The whole conversation rendered with the generation prompt, as ids (the re-render path)."""
        return self.whole_encoder()(self.render(messages, tools, True, enable_thinking))

    def whole_encoder(self) -> Callable[[str], list[int]]:
        """`encode` for whole prompts: the ids of turns seen before are reused (segments.py), when that is exact."""
        if self._whole is None:
            marker = self.turn_marker()
            reuse = SegmentIds.for_tokenizer(self.tokenizer, self._encode, marker) if marker else None
            self._whole = reuse or self._encode
        return self._whole

    def turn_marker(self) -> str | None:
        """The added token a turn starts with: the first one the generation prompt writes (ChatML's <|im_start|>)."""
        try:
            prompt = self.generation_prompt(None)
        except (ValueError, GatewayError):
            return None
        added = getattr(self.tokenizer, "get_added_vocab", dict)()
        found = [(prompt.find(token), -len(token), token) for token in added if token and token in prompt]
        return min(found)[2] if found else None  # leftmost, then longest: as the tokenizer matches

    # -- token-faithful continuation -----------------------------------------------------------

    @property
    def end_of_turn(self) -> str | None:
        """The stop token the template writes right after assistant content (None: it writes none)."""
        try:
            return self._probe(None, 0).end_of_turn or None
        except _NoContinuation:
            return None

    @property
    def stops_on_next_role(self) -> bool:
        """The template writes nothing after assistant content: the model stops on the next turn's role token
        (GLM's `<|observation|>` / `<|user|>`), which a continuation does not write twice."""
        try:
            return self._probe(None, 0).end_of_turn == ""
        except _NoContinuation:
            return False

    def _stop_markers(self) -> list[str]:
        return [m for m in self.tokenizer.convert_ids_to_tokens(list(self.eos_token_ids)) if isinstance(m, str)]

    @property
    def end_of_turn_id(self) -> int | None:
        marker = self.end_of_turn
        return None if marker is None else self.tokenizer.convert_tokens_to_ids(marker)

    def continuation(
        self,
        new_messages: Sequence[Message | dict[str, Any]],
        tools: Sequence[Tool | dict[str, Any]] | None = None,
        enable_thinking: bool | None = None,
        *,
        previous_ended_with_eos: bool,
        last_id: int | None = None,
        previous_calls: Sequence[str] = (),
        calls_before: int = 0,
    ) -> Continuation:
        """Ids to append after a sampled assistant turn so the model sees the new messages next.

        `previous_ended_with_eos`: the sampled ids end with `end_of_turn_id`. When they do not
        (length limit, a stop string, another stop id such as <|endoftext|>), the turn is closed
        first with the template's end-of-turn marker. A template that writes no end-of-turn marker
        (GLM: the model stops on the next turn's role token, `<|observation|>` or `<|user|>`) is
        joined by `last_id`, the last sampled id: when it is the role token the new messages start
        with, that token is the model's own and is not written again. When the template cannot render
        the new messages on their own, the result has `failure` set and no ids. `previous_calls`: the
        names of the sampled turn's tool calls (gpt-oss's template names a tool result after them);
        `calls_before`: how many tool calls the conversation made before it (Kimi-K2-Instruct's counts them).
        """
        new = openai_messages(new_messages)
        if self.family == "harmony":
            return self._harmony_continuation(new, tools, enable_thinking, list(previous_calls), last_id)
        # Tool results follow a turn that called those tools: some templates render them from it (MiniMax-M2
        # refuses them without one, DeepSeek-V3.2 writes one results block for all of its calls), so the probe
        # turn makes as many calls as tool results lead the new messages.
        calls = next((i for i, m in enumerate(new) if m.get("role") != "tool"), len(new))
        try:
            counted = self._counts_calls and calls > 0 and bool(previous_calls)
            if not counted:
                probe = self._probe(enable_thinking, calls)
                messages = [*_probe_messages(calls), *new]
                rendered = self.render(messages, tools, True, enable_thinking)
                text = self._after_probe(rendered, probe)
                counted = _leaks_probe(text, new) and bool(previous_calls)
            if counted:
                # The template names a tool result after its call, counting the conversation's calls (Kimi-K2-
                # Instruct, -Thinking: `functions.NAME:IDX`): the probe turn makes the sampled turn's own calls,
                # after as many calls as the conversation made before it. Remembered: its next tool results go
                # straight here.
                messages = _counted_probe(list(previous_calls), calls_before)
                probe = self._measure_probe(enable_thinking, len(previous_calls), messages)
                messages += new
                rendered = self.render(messages, tools, True, enable_thinking)
                text = self._after_probe(rendered, probe)
                self._counts_calls = not _leaks_probe(text, new)
        except _NoContinuation as exc:
            return Continuation.failed(str(exc))
        except GatewayError as exc:
            return Continuation.failed(f"the template cannot render the new messages on their own: {exc.message}")
        if _leaks_probe(text, new):
            return Continuation.failed("the template renders the new messages from the sampled turn's own text")
        if not probe.end_of_turn:  # the next turn's role token is the stop token
            role = next((m for m in self._stop_markers() if text.startswith(m)), None)
            if role is None:
                return Continuation.failed(f"the template writes no end-of-turn token, and the new messages start with "
                                           f"{text[:30]!r}, which is no stop token: the model could not end its turn there")
            sampled_it = last_id is not None and last_id == self.tokenizer.convert_tokens_to_ids(role)
            previous_ended_with_eos = sampled_it
            text = text[len(role) :] if sampled_it else text
        elif not previous_ended_with_eos:
            text = probe.end_of_turn + text
        return Continuation(
            ids=self.encode(text),
            text=text,
            bridge=probe.bridge,
            closed_truncated_turn=not previous_ended_with_eos,
            think_open=self.generation_prompt_opens_think(enable_thinking),
            rendered_messages=len(messages),
            rendered_chars=len(rendered),
        )

    @staticmethod
    def _after_probe(rendered: str, probe: _Probe) -> str:
        """What the template rendered after the probe turn's end-of-turn marker."""
        # the last one: each probe call is named by the sentinel, and the tail may end the same way after every call
        at = rendered.rfind(probe.tail, max(rendered.find(PROBE_USER), 0))
        if at < 0:
            raise _NoContinuation("the template ends an assistant turn differently when messages follow it, so the "
                                  "sampled end-of-turn tokens are not what a re-render would show")
        return rendered[at + len(PROBE_SENTINEL) + len(probe.calls) + len(probe.end_of_turn) :]

    def _harmony_continuation(self, new: list[dict[str, Any]], tools, enable_thinking: bool | None,
                              calls: list[str], last_id: int | None) -> Continuation:
        """After a call (stopped by `<|call|>`) the new messages extend the prompt as they are; after a final answer
        (stopped by `<|return|>`) the ids before them take the template's history rule (harmony_turns.py)."""
        probe = _probe_messages(0)
        if calls:
            probe[1]["tool_calls"] = [_probe_call(i, n) for i, n in enumerate(calls, 1)]
        try:
            rendered = self.render([*probe, *new], tools, True, enable_thinking)
        except GatewayError as exc:
            return Continuation.failed(f"the template cannot render the new messages on their own: {exc.message}")
        text = harmony_turns.new_messages_text(rendered, PROBE_SENTINEL, calls)
        if text is None:
            return Continuation.failed("the template does not end the sampled turn as the model did")
        stop = harmony_turns.CALL if calls else harmony_turns.RETURN
        ended = last_id is not None and last_id == self.tokenizer.convert_tokens_to_ids(stop)
        if not ended:  # cut by max_tokens (or another stop): closed as the template closes a message in history
            text = (harmony_turns.CALL if calls else harmony_turns.END) + text
        return Continuation(ids=self.encode(text), text=text, bridge="", closed_truncated_turn=not ended,
                            think_open=False, rendered_messages=len(probe) + len(new), rendered_chars=len(rendered),
                            history_rule=ended and not calls)

    def generation_prompt(self, enable_thinking: bool | None = None) -> str:
        """The text the template appends to make the model answer (e.g. "<|im_start|>assistant\\n<think>\\n")."""
        if enable_thinking not in self._generation_prompts:
            user = [{"role": "user", "content": PROBE_USER}]
            bare = self.render(user, None, False, enable_thinking)
            full = self.render(user, None, True, enable_thinking)
            if not full.startswith(bare):
                raise ValueError("the template's generation prompt rewrites the conversation before it")
            self._generation_prompts[enable_thinking] = full[len(bare) :]
        return self._generation_prompts[enable_thinking]

    def generation_prompt_opens_think(self, enable_thinking: bool | None = None) -> bool:
        """Does the generation prompt end inside an open reasoning block (the sample starts with reasoning)?"""
        prompt = self.generation_prompt(enable_thinking)
        return prompt.rfind(THINK_START) > prompt.rfind(THINK_END)

    def prompt_opens_think(self, prompt_ids: Sequence[int], enable_thinking: bool | None = None) -> bool:
        """Does the sample after these prompt ids start inside a reasoning block? Read off the prompt's own end:
        a template may close a turn otherwise than with its generation prompt (DeepSeek-V3.1 opens no reasoning
        after tool output, and the model answers at once)."""
        prompt = self.generation_prompt(enable_thinking)
        tail = self.decode(prompt_ids[-_TAIL_IDS:])
        if len(prompt_ids) == 0 or tail.endswith(prompt):
            return self.generation_prompt_opens_think(enable_thinking)
        return tail.rstrip().endswith(THINK_START)  # only the very end counts: earlier text may quote the tag

    def parse(self, text: str, *, enable_thinking: bool | None, finish_reason: str, tools: list[Any],
              prompt_ids: Sequence[int] = ()) -> ParsedTurn:
        """Parse a turn sampled after `prompt_ids` (by default: after this template's generation prompt)."""
        return parse_turn(
            text,
            self.family,
            think_open=self.prompt_opens_think(prompt_ids, enable_thinking),
            finish_reason=finish_reason,
            tools=tools,
        )

    def _probe(self, enable_thinking: bool | None, calls: int = 0) -> _Probe:
        key = (enable_thinking, calls)
        if key not in self._probes:
            self._probes[key] = self._measure_probe(enable_thinking, calls)
        return self._probes[key]

    def _measure_probe(self, enable_thinking: bool | None, calls: int, messages: list | None = None) -> _Probe:
        try:
            rendered = self.render(messages or _probe_messages(calls), None, False, enable_thinking)
        except GatewayError as exc:
            raise _NoContinuation(f"the template cannot render a user/assistant exchange: {exc.message}") from None
        at = rendered.rfind(PROBE_SENTINEL)
        after = rendered[at + len(PROBE_SENTINEL) :] if at >= 0 else ""
        markers = self._stop_markers()
        markup = ""
        if calls:  # the calls' markup comes first: the turn ends at the first stop token after it
            found = [i for m in markers if isinstance(m, str) and (i := after.find(m)) >= 0]
            markup = after[: min(found)] if found else after
        end_of_turn = next((m for m in markers if after.startswith(m, len(markup))), None)
        if end_of_turn is None and at >= 0 and after == markup:
            return _Probe("", "", PROBE_SENTINEL + after, markup)  # no end-of-turn token: the next role token stops
        if end_of_turn is None:
            raise _NoContinuation(
                f"the template does not end an assistant turn with a stop token right after its content "
                f"(it writes {after[:40]!r}; stop tokens: {markers})"
            )
        bridge = after[len(markup) + len(end_of_turn) :]
        if any(m in bridge for m in markers):
            raise _NoContinuation(f"the template writes more than one stop token after an assistant turn: {after!r}")
        return _Probe(end_of_turn, bridge, PROBE_SENTINEL + after, markup)


# -- OpenAI-shaped inputs, as vLLM hands them to templates ---------------------------------------


def openai_messages(messages: Sequence[Message | dict[str, Any]]) -> list[dict[str, Any]]:
    """Canonical messages or OpenAI chat dicts → what the template sees (tool-call arguments as objects)."""
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        if isinstance(msg, Message):
            out.extend(_with_argument_objects(m, i) for m in to_openai_messages(msg))
        elif isinstance(msg, dict):
            out.append(_with_argument_objects(msg, i))
        else:
            raise GatewayError("invalid_request", f"messages[{i}] must be an object, got {type(msg).__name__}")
    return out


def openai_tools(tools: Sequence[Tool | dict[str, Any]] | None) -> list[dict[str, Any]]:
    """Canonical tools or OpenAI tool dicts → the dicts vLLM passes to templates (same shape as its chat body)."""
    return [openai_tool(tool) for tool in tools or []]


def _with_argument_objects(message: dict[str, Any], index: int) -> dict[str, Any]:
    """vLLM parses each tool call's `arguments` JSON text into an object before templating."""
    calls = message.get("tool_calls")
    if message.get("role") != "assistant" or not isinstance(calls, list):
        return message
    if not calls:
        return {k: v for k, v in message.items() if k != "tool_calls"}
    parsed = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict):
            raise GatewayError("invalid_request", f"messages[{index}].tool_calls[{j}] has no function object")
        args = fn.get("arguments")
        if isinstance(args, str) and args.strip():
            try:
                args = json.loads(args)
            except json.JSONDecodeError as exc:
                raise GatewayError(
                    "invalid_request",
                    f"messages[{index}].tool_calls[{j}].function.arguments is not JSON: {exc}",
                    param=f"messages[{index}].tool_calls[{j}].function.arguments",
                ) from None
        elif not isinstance(args, (dict, list)):
            args = {}
        parsed.append({**call, "function": {**fn, "arguments": args}})
    return {**message, "tool_calls": parsed}


def _probe_messages(calls: int = 0) -> list[dict[str, Any]]:
    assistant: dict[str, Any] = {"role": "assistant", "content": PROBE_SENTINEL}
    if calls:
        # the calls are named by the sentinel too: a template that writes no content beside calls (Llama) still shows
        # where the probe's turn is; the turn's end is measured after the last one.
        assistant["tool_calls"] = [_probe_call(i, PROBE_SENTINEL) for i in range(1, calls + 1)]
    return [{"role": "user", "content": PROBE_USER}, assistant]


def _probe_call(i: int, name: str) -> dict[str, Any]:
    return {"id": f"polarprb{i}", "type": "function", "function": {"name": name, "arguments": {}}}


def _leaks_probe(text: str, new: list[dict[str, Any]]) -> bool:
    """The new messages' rendering writes the probe turn's own text (more sentinels than the messages carry)."""
    return PROBE_SENTINEL in text and (  # the messages are only read when it shows (a harness quoting it)
        text.count(PROBE_SENTINEL) > json.dumps(new, ensure_ascii=False, default=str).count(PROBE_SENTINEL))


def _counted_probe(names: list[str], calls_before: int) -> list[dict[str, Any]]:
    """The probe, its turn calling `names`, after `calls_before` calls and their results."""
    earlier = [_probe_call(i, "polar_probe_earlier") for i in range(calls_before)]
    lead = [{"role": "user", "content": "polar probe: earlier calls"}, {"role": "assistant", "content": "",
                                                                         "tool_calls": earlier},
            *({"role": "tool", "tool_call_id": c["id"], "content": "polar probe"} for c in earlier)] if earlier else []
    user, turn = _probe_messages(0)
    return [*lead, user, {**turn, "tool_calls": [_probe_call(calls_before + i, n) for i, n in enumerate(names)]}]


def generation_eos_ids(path: Path) -> list[int]:
    config = path / "generation_config.json"
    if not config.is_file():
        return []
    value = json.loads(config.read_text()).get("eos_token_id")
    return [value] if isinstance(value, int) else [i for i in value or [] if isinstance(i, int)]

