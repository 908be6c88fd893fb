"""Run vLLM's own chat parsers over sampled token ids, token by token, as its streaming server does.

Executed by the vLLM venv's Python (not polar's): reads a JSON list of cases on stdin, writes one JSON
list of results on stdout. A case: {"model_dir", "tool_parser", "tools", "kwargs" (chat template
kwargs), "prompt_ids", "output_ids", "eos_ids"}. A result: {"deltas": [DeltaMessage as vLLM
serialises it, or null, per token], "text", "reasoning", "content", "calls" (the plain answer's parse),
"reasoning_tokens": [per token, as the stream counts them], "reasoning_tokens_whole" (as the plain answer
counts them)}. The detokenizer is vLLM's (tokenizers' DecodeStream primed with the prompt), and a final stop
token is not detokenized, as in vLLM's engine.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")


def run(case: dict, tokenizers_cache: dict) -> dict:
    import tokenizers
    from transformers import AutoTokenizer
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.parser.parser_manager import ParserManager

    tok = tokenizers_cache.get(case["model_dir"])
    if tok is None:
        tok = tokenizers_cache[case["model_dir"]] = AutoTokenizer.from_pretrained(case["model_dir"])
        vocab = tok.get_vocab()
        tok.get_vocab = lambda: vocab  # each parser reads the whole vocabulary: once is enough here
    cls = ParserManager.get_parser(tool_parser_name=case["tool_parser"], reasoning_parser_name="qwen3",
                                   enable_auto_tools=True)
    kwargs = case.get("kwargs") or {}
    request = ChatCompletionRequest(model="m", messages=[{"role": "user", "content": "x"}], stream=True,
                                    tools=case.get("tools") or None, chat_template_kwargs=kwargs or None)
    parser = cls(tok, request.tools, chat_template_kwargs=kwargs)
    request = parser.adjust_request(request)
    stream = tokenizers.decoders.DecodeStream(ids=case["prompt_ids"], skip_special_tokens=request.skip_special_tokens)
    ids, text, deltas, counts = case["output_ids"], "", [], []
    for k, token in enumerate(ids):
        last = k == len(ids) - 1
        piece = "" if last and token in case.get("eos_ids", []) else (stream.step(tok._tokenizer, token) or "")
        text += piece
        delta = parser.parse_delta(piece, [token], request, prompt_token_ids=case["prompt_ids"], finished=last)
        deltas.append(None if delta is None else json.loads(delta.model_dump_json(exclude_unset=True)))
        counts.append(parser.count_reasoning_tokens(tuple(ids[: k + 1])))
    whole = cls(tok, request.tools, chat_template_kwargs=kwargs)
    reasoning, content, calls = whole.parse(text, request, enable_auto_tools=True, model_output_token_ids=ids)
    return {"deltas": deltas, "text": text, "reasoning": reasoning, "content": content,
            "calls": [json.loads(c.model_dump_json()) for c in calls or []], "reasoning_tokens": counts,
            "reasoning_tokens_whole": whole.count_reasoning_tokens(ids)}


def main() -> None:
    cache: dict = {}
    cases = json.load(sys.stdin)
    print(json.dumps([run(case, cache) for case in cases], ensure_ascii=False))


if __name__ == "__main__":
    main()
