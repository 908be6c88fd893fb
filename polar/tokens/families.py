"""Which model family a chat template belongs to, read from the template's own text.

A family is how a model writes its answer: its tool-call syntax, its reasoning markers, and the
names vLLM gives the parsers for them (`--tool-call-parser`, `--reasoning-parser`). polar recognises
a family by what only its template writes (the tool-call markup it teaches the model, its role
markers); the order of `FAMILIES` matters where one family's signs contain another's (Nemotron's
template teaches Qwen3-Coder's tool calls, inside its own history rules).

Token-faithful mode parses the sampled ids itself, so it needs to know the family: a template
polar cannot classify, or a family whose output polar cannot parse yet, makes it refuse to start
(`UnknownTemplate`) rather than hand the harness tool calls as text. Chat mode (vLLM renders and
parses) runs with any template.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Family:
    name: str  # polar's name for it (`polar templates`)
    parser: str  # the key of polar's output parser (parsers.PARSERS); "" = none yet
    models: str  # whose real templates teach it
    tool_parser: str  # vLLM's --tool-call-parser for it
    reasoning_parser: str  # vLLM's --reasoning-parser ("" = none)
    signs: tuple[str, ...]  # all appear in the template text
    calls: str  # what a tool call looks like, for people
    absent: tuple[str, ...] = ()  # none appears (what a look-alike family's template writes)
    no_continuation: str = ""  # why polar parses the family's output but cannot continue it token-faithfully

    def matches(self, template_text: str) -> bool:
        return all(s in template_text for s in self.signs) and not any(s in template_text for s in self.absent)


FAMILIES: tuple[Family, ...] = (
    Family("gpt-oss", "harmony", "gpt-oss (harmony)", "openai", "openai_gptoss", ("<|channel|>", "<|call|>", "<|start|>"),
           "<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>"),
    Family("deepseek-v3.2", "deepseek_dsml", "DeepSeek-V3.2", "deepseek_v32", "deepseek_v3", ("'｜DSML｜'", "function_calls"),
           "<｜DSML｜function_calls><｜DSML｜invoke name=NAME><｜DSML｜parameter name=K string=…>V…"),
    Family("deepseek-v4", "deepseek_v4", "DeepSeek-V4", "deepseek_v4", "deepseek_v4", ("'｜DSML｜'", "tool_calls"),
           "<｜DSML｜tool_calls><｜DSML｜invoke name=NAME><｜DSML｜parameter name=K string=…>V…"),
    # R1's templates write `function<｜tool▁sep｜>NAME` and a ```json fence (vLLM's deepseek_v3): not this family.
    Family("deepseek-v3.1", "deepseek_v31", "DeepSeek-V3.1", "deepseek_v31", "deepseek_v3", ("<｜tool▁calls▁begin｜>",),
           "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{json}<｜tool▁call▁end｜>…", ("```json",)),
    Family("kimi-k2", "kimi_k2", "Kimi-K2 (Instruct, Thinking)", "kimi_k2", "kimi_k2", ("<|tool_calls_section_begin|>",),
           "<|tool_calls_section_begin|><|tool_call_begin|>functions.NAME:IDX<|tool_call_argument_begin|>{json}…"),
    Family("minimax-m2", "minimax_m2", "MiniMax-M2", "minimax_m2", "minimax_m2_append_think", ("<minimax:tool_call>",),
           '<minimax:tool_call><invoke name="NAME"><parameter name="K">V</parameter></invoke></minimax:tool_call>'),
    Family("glm-4.7", "glm45", "GLM-4.7", "glm47", "glm45", ("<arg_key>", "{function-name}<arg_key>"),
           "<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>"),
    Family("glm-4.5", "glm45", "GLM-4.5, GLM-4.6", "glm45", "glm45", ("<arg_key>", "<|observation|>"),
           "<tool_call>NAME\\n<arg_key>K</arg_key>\\n<arg_value>V</arg_value>\\n</tool_call>"),
    Family("nemotron-3", "qwen3_xml", "Nemotron-3-Nano", "qwen3_coder", "nemotron_v3",
           ("<function=", "<tool_call>", "truncate_history_thinking"),
           "<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>"),
    Family("qwen3-xml", "qwen3_xml", "Qwen3-Coder, Qwen3.5", "qwen3_coder", "qwen3", ("<function=", "<tool_call>"),
           "<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>"),
    Family("qwen3", "qwen3", "Qwen2.5, Qwen3 (hybrid), QwQ, Hermes-style", "hermes", "qwen3", ("<tool_call>", "<|im_start|>"),
           '<tool_call>\\n{"name": NAME, "arguments": {...}}\\n</tool_call>'),
    # functionary's Llama-based templates write their own calls (`<function=NAME>`, `>>>NAME`).
    Family("llama3-json", "llama3_json", "Llama-3.1, 3.2, 3.3", "llama3_json", "", ("<|start_header_id|>", "<|eot_id|>", "parameters"),
           '{"name": NAME, "parameters": {...}} (or after <|python_tag|>)', ("<function=", ">>>")),
    Family("mistral", "mistral", "Mistral-Small, Devstral", "mistral", "mistral", ("[TOOL_CALLS]", "[INST]"),
           "[TOOL_CALLS]NAME[ARGS]{json} (older: [TOOL_CALLS][{...}])"),
)  # fmt: skip


class UnknownTemplate(ValueError):
    """Token-faithful mode cannot run with this template; the message says why and what polar knows."""


def detect(template_text: str) -> Family | None:
    """The family whose signs the template shows, or None when polar cannot classify it."""
    return next((family for family in FAMILIES if family.matches(template_text)), None)


def token_faithful_problem(template_text: str, label: str = "the chat template") -> str | None:
    """Why token-faithful mode cannot run with this template (None: it can)."""
    family = detect(template_text)
    if family is None:
        return (f"{label} is not one polar can classify, so polar could not read the model's tool calls and "
                f"reasoning out of the sampled tokens; polar knows: {known_families()}. Run chat mode (no "
                f"tokenizer: vLLM renders and parses, prompt_mode 'chat-template' in every capture) or use one "
                f"of these families' templates")
    if not family.parser:
        return (f"{label} is {family.name} ({family.models}), whose output polar cannot parse yet; token-faithful "
                f"mode parses: {', '.join(f.name for f in FAMILIES if f.parser)}. Run chat mode (no tokenizer: "
                f"vLLM's `{family.tool_parser}` parser reads it)")
    if family.no_continuation:
        return (f"{label} is {family.name} ({family.models}): polar parses its output but cannot continue it "
                f"token-faithfully: {family.no_continuation}. Run chat mode (no tokenizer: vLLM renders and parses)")
    error = render_error(template_text)
    if error:
        return (f"{label} is {family.name} ({family.models}), but polar cannot render a tool-using exchange with it "
                f"(in transformers' renderer, vLLM's, nor in jinja2's sandbox that lets a template change its own "
                f"lists): {error}")
    return None


_CHECK_TOOL = {"type": "function", "function": {"name": "check", "description": "polar check",
                                                "parameters": {"type": "object", "properties": {"x": {"type": "string"}}}}}
_CHECK_CALL = {"id": "polarchk1", "type": "function", "function": {"name": "check", "arguments": {"x": "y"}}}
_CHECK_MESSAGES = [
    {"role": "user", "content": "polar check"},
    {"role": "assistant", "content": "", "tool_calls": [_CHECK_CALL]},
    {"role": "tool", "tool_call_id": "polarchk1", "content": "polar result"},
    {"role": "assistant", "content": "polar answer"},
]  # fmt: skip
_CHECK_TOKENS = {"bos_token": "<s>", "eos_token": "</s>"}


def render_error(template_text: str) -> str | None:
    """What polar's renderer raises on a tool-using exchange (None: it renders): transformers' (vLLM's), or where
    that one raises its sandbox's error, jinja2's sandbox that lets the template change its own lists (sandbox.py)."""
    from polar.tokens.sandbox import SecurityError, render_with_own_data

    refusal = vllm_refusal(template_text)
    if refusal is None or not isinstance(refusal, SecurityError):
        return None if refusal is None else f"{type(refusal).__name__}: {refusal}"
    try:
        render_with_own_data(template_text, _CHECK_MESSAGES, [_CHECK_TOOL], _CHECK_TOKENS, add_generation_prompt=False)
    except Exception as exc:  # noqa: BLE001 - as above
        return f"{type(exc).__name__}: {exc}"
    return None


def vllm_refusal(template_text: str) -> Exception | None:
    """What transformers' renderer, the one vLLM's chat endpoint renders with, raises on a tool-using exchange."""
    from polar.tokens.sandbox import vllm_render_error

    # vLLM renders with the tokenizer's special tokens defined (Mistral-Small-3.2's template writes eos_token)
    return vllm_render_error(template_text, _CHECK_MESSAGES, [_CHECK_TOOL], add_generation_prompt=False,
                             **_CHECK_TOKENS)


def require_token_faithful(template_text: str, label: str = "the chat template") -> Family:
    """The template's family; raises UnknownTemplate when token-faithful mode cannot run with it."""
    problem = token_faithful_problem(template_text, label)
    if problem:
        raise UnknownTemplate(problem)
    family = detect(template_text)
    assert family is not None
    return family


def known_families() -> str:
    return ", ".join(f"{f.name} ({f.models})" for f in FAMILIES)
