"""Gemini tools, tool config and generation config → canonical tools, choice, sampling, thinking."""

from __future__ import annotations

import re
from typing import Any

from polar.canonical import Sampling, Thinking, Tool, ToolChoice
from polar.providers.fields import (
    expect,
    integer,
    invalid,
    number,
    optional,
    require,
    strings,
)
from polar.providers.fields import proto_names as k

# OpenAPI-subset Schema fields that are int64, which protobuf JSON may send as strings ("1").
_INT64_SCHEMA_KEYS = {"minItems", "maxItems", "minLength", "maxLength", "minProperties", "maxProperties"}


def tools(payload: dict, where: str) -> tuple[tuple[Tool, ...], tuple[str, ...]]:
    """Function declarations for the model, and the built-in tools left out (googleSearch,
    codeExecution, urlContext, ... have no local meaning)."""
    out: list[Tool] = []
    builtin: list[str] = []
    for i, tool in enumerate(optional(payload, k("tools"), list, where) or []):
        tw = f"{where}tools[{i}]"
        tool = expect(tool, dict, tw)
        builtin += [name for name in tool if name not in ("functionDeclarations", "function_declarations")]
        for j, decl in enumerate(optional(tool, k("functionDeclarations"), list, tw + ".") or []):
            dw = f"{tw}.functionDeclarations[{j}]"
            out.append(_declaration(expect(decl, dict, dw), dw + "."))
    return tuple(out), tuple(builtin)


def _declaration(decl: dict, where: str) -> Tool:
    json_schema = optional(decl, k("parametersJsonSchema"), dict, where)
    schema = optional(decl, k("parameters"), dict, where)
    if json_schema is not None:
        parameters = json_schema
    elif schema is not None:
        parameters = _json_schema(schema, where + "parameters")
    else:
        parameters = {"type": "object", "properties": {}}
    name = require(decl, k("name"), str, where)
    return Tool(name=name, description=optional(decl, k("description"), str, where), parameters=parameters)


def _json_schema(schema: Any, where: str) -> dict[str, Any]:
    """Gemini's OpenAPI-subset Schema ("type": "OBJECT", "nullable": true, ...) → JSON Schema."""
    if not isinstance(schema, dict):
        raise invalid(f"field '{where}' must be an object", where)
    out: dict[str, Any] = {}
    for raw_key, value in schema.items():
        key = re.sub(r"_([a-z])", lambda m: m[1].upper(), raw_key)
        if key == "type":
            if not isinstance(value, str):
                raise invalid(f"field '{where}.type' must be a string", f"{where}.type")
            if value.upper() != "TYPE_UNSPECIFIED":
                out["type"] = value.lower()
        elif key == "properties":
            if not isinstance(value, dict):
                raise invalid(f"field '{where}.properties' must be an object", f"{where}.properties")
            out[key] = {name: _json_schema(sub, f"{where}.properties.{name}") for name, sub in value.items()}
        elif key == "items":
            out[key] = _json_schema(value, f"{where}.items")
        elif key == "anyOf":
            if not isinstance(value, list):
                raise invalid(f"field '{where}.anyOf' must be an array", f"{where}.anyOf")
            out[key] = [_json_schema(sub, f"{where}.anyOf[{n}]") for n, sub in enumerate(value)]
        elif key in _INT64_SCHEMA_KEYS and isinstance(value, str) and value.isdigit():
            out[key] = int(value)
        elif key not in ("nullable", "propertyOrdering"):  # ordering is a Gemini decoding hint
            out[key] = value
    if schema.get("nullable") is True and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    return out


def tool_choice(payload: dict, where: str) -> ToolChoice:
    config = optional(payload, k("toolConfig"), dict, where) or {}
    calling = optional(config, k("functionCallingConfig"), dict, f"{where}toolConfig.") or {}
    where = f"{where}toolConfig.functionCallingConfig."
    mode = (optional(calling, k("mode"), str, where) or "AUTO").upper()
    allowed = optional(calling, k("allowedFunctionNames"), list, where) or []
    if mode in ("AUTO", "VALIDATED", "MODE_UNSPECIFIED"):
        return ToolChoice(mode="auto")
    if mode == "NONE":
        return ToolChoice(mode="none")
    if mode == "ANY":
        if len(allowed) == 1 and isinstance(allowed[0], str):
            return ToolChoice(mode="tool", name=allowed[0])
        return ToolChoice(mode="required")
    raise invalid(f"field '{where}mode' must be AUTO, ANY, NONE or VALIDATED, got '{mode}'", f"{where}mode")


def sampling(gen: dict, where: str) -> Sampling:
    candidates = integer(gen, k("candidateCount"), where)
    if candidates is not None and candidates > 1:
        message = f"field '{where}candidateCount': only 1 candidate is supported, got {candidates}"
        raise invalid(message, f"{where}candidateCount")
    stop = strings(optional(gen, k("stopSequences"), list, where) or [], f"{where}stopSequences")
    return Sampling(
        max_tokens=integer(gen, k("maxOutputTokens"), where),
        temperature=number(gen, k("temperature"), where),
        top_p=number(gen, k("topP"), where),
        top_k=integer(gen, k("topK"), where),
        stop=stop,
        seed=integer(gen, k("seed"), where),
        presence_penalty=number(gen, k("presencePenalty"), where),
        frequency_penalty=number(gen, k("frequencyPenalty"), where),
    )


def thinking(gen: dict, where: str) -> tuple[Thinking, bool]:
    """(canonical thinking request, whether thought parts go back to the client).

    Gemini thinks by default and only *shows* thoughts with includeThoughts; a budget of 0
    turns thinking off, -1 means "dynamic" (no fixed budget).
    """
    config = optional(gen, k("thinkingConfig"), dict, where)
    if config is None:
        return Thinking(), False
    where = f"{where}thinkingConfig."
    include = bool(optional(config, k("includeThoughts"), bool, where))
    budget = integer(config, k("thinkingBudget"), where)
    level = optional(config, k("thinkingLevel"), str, where)
    effort = level.lower() if level and level.upper() != "THINKING_LEVEL_UNSPECIFIED" else None
    if budget == 0:
        return Thinking(enabled=False), include
    enabled = True if (include or budget is not None or effort) else None
    return Thinking(enabled=enabled, budget_tokens=budget if budget and budget > 0 else None, effort=effort), include


def response_schema(gen: dict, where: str) -> dict[str, Any] | None:
    json_schema = optional(gen, k("responseJsonSchema"), dict, where)
    if json_schema is not None:
        return json_schema
    schema = optional(gen, k("responseSchema"), dict, where)
    return None if schema is None else _json_schema(schema, where + "responseSchema")
