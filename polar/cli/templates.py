"""`polar templates` — the model families polar knows, and whether token-faithful mode runs on a chat template.

Exit status of `check`: 0 token-faithful mode runs with the template; 1 it does not (the reason is printed);
2 the file cannot be read.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import click


@click.group(invoke_without_command=True)
@click.pass_context
def templates(ctx: click.Context) -> None:
    """The model families polar recognises in a chat template (and checks one: `polar templates check FILE`)."""
    if ctx.invoked_subcommand is not None:
        return
    from polar.tokens.families import FAMILIES

    click.echo(f"{'family':14} {'polar parses':13} {'vLLM parsers (tool / reasoning)':36} models")
    for f in FAMILIES:
        parsers = f"{f.tool_parser} / {f.reasoning_parser or '-'}"
        click.echo(f"{f.name:14} {'yes' if f.parser else 'not yet':13} {parsers:36} {f.models}")


class _Unreadable(click.ClickException):
    exit_code = 2


@templates.command()
@click.argument("file", type=click.Path(dir_okay=False))
@click.option("--tokenizer", "tokenizer_dir", type=click.Path(exists=True, file_okay=False),
              help="The served model's tokenizer dir: also check the token-faithful continuation with it.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of lines.")
def check(file: str, tokenizer_dir: str | None, as_json: bool) -> None:
    """Print FILE's family, what it accepts, and whether token-faithful mode runs with it (exit 0) or not (1)."""
    from polar.tokens.families import detect, token_faithful_problem
    from polar.tokens.shaping import TemplateTraits

    try:
        text = Path(file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _Unreadable(f"cannot read {file}: {exc}") from None
    label = f"the chat template {Path(file).stem!r}"
    family = detect(text)
    problem = token_faithful_problem(text, label)
    traits = {k: v for k, v in asdict(TemplateTraits.of(text, label)).items() if k != "label"}
    refusal = traits["vllm_tool_call_error"]  # only jinja2's sandbox that lets it change its own lists renders it
    vllm_note = (f"vLLM's chat endpoint cannot render a conversation holding a tool call with it ({refusal}): chat "
                 f"mode refuses one" + ("; token-faithful mode renders it (polar renders, vLLM only samples ids)"
                                        if problem is None else "")) if refusal else None
    if problem is None and tokenizer_dir:
        problem = _continuation_problem(tokenizer_dir, text, label)
    report = {
        "file": file, "family": family.name if family else None, "models": family.models if family else None,
        "vllm_tool_parser": family.tool_parser if family else None,
        "vllm_reasoning_parser": family.reasoning_parser if family else None,
        "traits": traits, "vllm_chat": vllm_note, "token_faithful": problem is None, "why_not": problem,
    }  # fmt: skip
    if as_json:
        click.echo(json.dumps(report, ensure_ascii=False))
    else:
        click.echo(f"family: {report['family'] or 'unknown'}" + (f" ({family.models})" if family else ""))
        if family:
            click.echo(f"vLLM parsers: --tool-call-parser {family.tool_parser}"
                       + (f" --reasoning-parser {family.reasoning_parser}" if family.reasoning_parser else ""))
        click.echo("traits: " + ", ".join(f"{k}={v}" for k, v in traits.items() if v is not None))
        if vllm_note:
            click.echo(f"vLLM chat: {vllm_note}")
        click.echo("token-faithful: " + ("yes" if problem is None else f"no: {problem}"))
    raise SystemExit(0 if problem is None else 1)


def _continuation_problem(tokenizer_dir: str, text: str, label: str) -> str | None:
    """Why the template cannot continue a sampled turn with this tokenizer (None: a tool result continues)."""
    from transformers import AutoTokenizer

    from polar.tokens.template import ChatTemplate, generation_eos_ids

    template = ChatTemplate(AutoTokenizer.from_pretrained(tokenizer_dir), text, name=label,
                            eos_token_ids=generation_eos_ids(Path(tokenizer_dir)))  # GLM's role stop tokens
    tool = {"role": "tool", "tool_call_id": "check-1", "content": "polar check: a tool result"}
    cont = template.continuation([tool], None, None, previous_ended_with_eos=True, previous_calls=["check"])
    return f"{label} cannot continue a sampled turn: {cont.failure}" if cont.failure else None
