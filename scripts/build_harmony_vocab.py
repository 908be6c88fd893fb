"""gpt-oss's real vocabulary (o200k_harmony) as a Hugging Face tokenizer directory, from the `openai-harmony` package.

`openai-harmony` embeds the encoding gpt-oss serves with (vLLM loads it the same way, no download): its 199,998 BPE
ranks (each id's bytes, `decode_bytes`) and 1,091 special tokens from id 199,998 (`<|start|>` 200006, `<|channel|>`
200005, `<|message|>` 200008, `<|end|>` 200007, `<|call|>` 200012, `<|return|>` 200002). This writes them as
tokenizer.json (transformers' TikTokenConverter, o200k's split pattern from the `tiktoken` package's own recipe)
with a generation_config.json naming gpt-oss's stop ids, and checks the result against the package's encoder on a
harmony conversation and mixed-script text, ids for ids. Run it with a Python that has openai-harmony, tiktoken
and transformers (the suite's vLLM venv: `$POLAR_CACHE/vllm-venv/bin/python scripts/build_harmony_vocab.py`).
Built into the cache, never committed.
"""

from __future__ import annotations

import base64
import json
import tempfile
from pathlib import Path

from tiktoken_vocab import converted, differences, main

# gpt-oss's generation_config.json: <|return|>, <|endoftext|>, <|call|>
STOP_IDS = [200002, 199999, 200012]
# A known sequence: the final-channel message of gpt-oss's own harmony format.
KNOWN = ("<|start|>assistant<|channel|>final<|message|>hi<|return|>", [200006, 173781, 200005, 17196, 200008, 3686, 200002])
CHECKS = [
    KNOWN[0],
    "<|start|>system<|message|>Reasoning: medium\n\n# Valid channels: analysis, commentary, final.<|end|>"
    "<|start|>user<|message|>Lis «données/日本.txt» — naïve café ☕<|end|><|start|>assistant<|channel|>analysis"
    "<|message|>Need to read.<|end|><|start|>assistant to=functions.read_file<|channel|>commentary json<|message|>"
    '{"path": "données/日本.txt"}<|call|><|start|>functions.read_file to=assistant<|channel|>commentary<|message|>'
    '"内容: ünïcödé ✓"<|end|><|start|>assistant',
    "def f(x):\n    return x ** 2  # square\n\n\tTabs and  double  spaces, I'm sure it's fine.\r\nÉcole 123456789",
]


def o200k_pattern() -> str:
    """o200k's split pattern, from tiktoken's own recipe (its ranks file is not fetched)."""
    import tiktoken_ext.openai_public as public

    public.load_tiktoken_bpe = lambda *args, **kwargs: {}
    return public.o200k_base()["pat_str"]


def build(out: Path) -> None:
    from openai_harmony import HarmonyEncodingName, load_harmony_encoding
    from transformers import PreTrainedTokenizerFast

    enc = load_harmony_encoding(HarmonyEncodingName.HARMONY_GPT_OSS)
    specials = sorted((enc.encode(t, allowed_special="all")[0], t) for t in enc._inner.special_tokens())
    first = specials[0][0]
    with tempfile.TemporaryDirectory() as tmp:
        ranks = Path(tmp) / "o200k_harmony.tiktoken"
        ranks.write_text("".join(f"{base64.b64encode(enc._inner.decode_bytes([i])).decode()} {i}\n" for i in range(first)))
        tok = converted(ranks, o200k_pattern(), specials)
    out.mkdir(parents=True, exist_ok=True)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|return|>", pad_token="<|endoftext|>",
                                 clean_up_tokenization_spaces=False)
    hf.save_pretrained(str(out))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": STOP_IDS}) + "\n")
    check(out, enc)


def check(out: Path, enc) -> None:
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))
    problems = [] if hf.encode(KNOWN[0], add_special_tokens=False) == KNOWN[1] else [f"{KNOWN[0]!r} is not {KNOWN[1]}"]
    problems += differences(hf, lambda text: enc.encode(text, allowed_special="all"), CHECKS)
    if problems:
        raise SystemExit("o200k_harmony check failed:\n  " + "\n  ".join(problems))
    print(f"{out}: {len(hf)} ids, equal to openai-harmony's encoder on {len(CHECKS)} texts")


if __name__ == "__main__":
    main(__doc__, "gpt-oss-vocab", build)
