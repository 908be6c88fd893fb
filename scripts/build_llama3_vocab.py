"""Llama-3's real vocabulary (Llama-3.1/3.2/3.3 share it) as a Hugging Face tokenizer directory, from Meta's
`llama-models` package.

`llama-models` (Meta's own package, under the Llama 3 Community License) ships `llama_models/llama3/tokenizer.model`:
128,000 BPE ranks in tiktoken's format, with the tokenizer that reads it (`llama_models.llama3.tokenizer.Tokenizer`:
the split pattern and 256 special tokens from id 128,000). This writes them as tokenizer.json (transformers'
TikTokenConverter) with Llama-3.3-Instruct's bos/eos, the bos post-processor Meta's tokenizer.json has, and a
generation_config.json naming its stop ids, then checks the result: the special ids the template and vLLM's
`llama3_json` parser use, ordinary text against ids published independently of the package (llama.cpp's tokenizer
test for Meta-Llama-3's vocabulary, `models/ggml-vocab-llama-bpe.gguf.inp/.out`, in the llama-cpp-python sdist),
and mixed text against the package's own encoder, ids for ids. Built into the cache, never committed.

    .venv/bin/python scripts/build_llama3_vocab.py [--out DIR]
"""

from __future__ import annotations

import json
from pathlib import Path

from tiktoken_vocab import converted, differences, main

# Llama-3.3-70B-Instruct's generation_config.json: <|end_of_text|>, <|eom_id|>, <|eot_id|>
STOP_IDS = [128001, 128008, 128009]
SPECIAL_IDS = {"<|begin_of_text|>": 128000, "<|end_of_text|>": 128001, "<|start_header_id|>": 128006,
               "<|end_header_id|>": 128007, "<|eom_id|>": 128008, "<|eot_id|>": 128009, "<|python_tag|>": 128010}
# Pairs from llama.cpp's test of Meta-Llama-3's vocabulary (ggml-vocab-llama-bpe.gguf.inp / .out).
PUBLISHED = [
    ("ied 4 ½ months", [1142, 220, 19, 220, 27154, 4038]),
    ("Äpfel", [88075, 16276, 301]),
    ("\n\n\n", [1432]),
    (" Hello, world!", [22691, 11, 1917, 0]),
    (" this is 🦙.cpp", [420, 374, 11410, 99, 247, 13, 11055]),
    ("w048 7tuijk dsdfhu", [86, 23904, 220, 22, 83, 2005, 42908, 11729, 3013, 17156]),
    ("нещо на Български", [79862, 102118, 13373, 64571, 34694, 3114, 112203, 80112]),
    ("    Hello\n    Hello", [262, 22691, 198, 262, 22691]),
    ("!!!!!!", [17523, 3001]),
    ("333333", [8765, 8765]),
]
CHECKS = [
    "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nEnvironment: ipython\nCutting Knowledge Date: "
    "December 2023\n\n<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nLis «données/日本.txt» — naïve café ☕"
    "<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    '<|python_tag|>{"name": "read_file", "parameters": {"path": "données/日本.txt"}}<|eom_id|>'
    '<|start_header_id|>ipython<|end_header_id|>\n\n"内容: ünïcödé ✓"<|eot_id|>',
    "def f(x):\n    return x ** 2  # square\n\n\tTabs and  double  spaces, I'm sure it's fine.\r\nÉcole 123456789",
]


def build(out: Path) -> None:
    from llama_models.llama3 import tokenizer as meta_tokenizer
    from tokenizers import processors
    from transformers import PreTrainedTokenizerFast

    meta = meta_tokenizer.Tokenizer.get_instance()
    ranks = Path(meta_tokenizer.__file__).parent / "tokenizer.model"
    tok = converted(ranks, meta.pat_str, [(i, t) for t, i in meta.special_tokens.items()])
    bos = "<|begin_of_text|>"
    tok.post_processor = processors.TemplateProcessing(single=f"{bos} $A", pair=f"{bos} $A {bos} $B",
                                                       special_tokens=[(bos, meta.bos_id)])
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=bos, eos_token="<|eot_id|>",
                                 clean_up_tokenization_spaces=False)
    out.mkdir(parents=True, exist_ok=True)
    hf.save_pretrained(str(out))
    (out / "generation_config.json").write_text(json.dumps({"bos_token_id": meta.bos_id, "eos_token_id": STOP_IDS}) + "\n")
    check(out, meta)


def check(out: Path, meta) -> None:
    """The built directory against the known ids and the package's own encoder; raises SystemExit on a difference."""
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))
    problems = [f"{t} is {hf.convert_tokens_to_ids(t)}, not {i}" for t, i in SPECIAL_IDS.items()
                if hf.convert_tokens_to_ids(t) != i]
    problems += [f"{text!r} is not {ids}" for text, ids in PUBLISHED if hf.encode(text, add_special_tokens=False) != ids]
    problems += differences(hf, lambda text: meta.encode(text, bos=False, eos=False, allowed_special="all"),
                            [t for t, _ in PUBLISHED] + CHECKS)
    if hf.encode("hi") != [meta.bos_id] + meta.encode("hi", bos=False, eos=False):
        problems.append("encode() with special tokens does not start with <|begin_of_text|>")
    if problems:
        raise SystemExit("Llama-3 vocabulary check failed:\n  " + "\n  ".join(problems))
    print(f"{out}: {len(hf)} ids, equal to llama-models' encoder and llama.cpp's published ids")


if __name__ == "__main__":
    main(__doc__, "llama3-vocab", build)
