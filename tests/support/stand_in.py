"""Stand-in vocabularies: the real Qwen3.5 vocabulary plus one family's real special tokens and end-of-turn tokens as
added tokens, for the families no registry package ships a vocabulary for (GLM, Kimi, MiniMax, DeepSeek-V3.x, and
Llama's gated one). The templates they serve with are the real ones; only the ids are not the model's."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tokens.parser_corpus import SPECIAL_TOKENS

# The stop tokens each family's generation config names (what ends a sampled turn).
END_TOKENS = {"glm45": ["<|user|>", "<|observation|>", "<|endoftext|>"], "minimax_m2": ["[e~["],
              "deepseek_v31": ["<｜end▁of▁sentence｜>"], "deepseek_dsml": ["<｜end▁of▁sentence｜>"],
              "deepseek_v4": ["<｜end▁of▁sentence｜>"], "kimi_k2": ["<|im_end|>"], "qwen3_xml": ["<|im_end|>"],
              "llama3_json": ["<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"], "mistral": ["</s>"],
              "harmony": ["<|return|>", "<|call|>", "<|endoftext|>"]}


def stand_in_tokenizer(tokenizer_dir: Path, *families: str):
    """The Qwen3.5 tokenizer carrying these families' (polar's parser names) special and end-of-turn tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    for family in families:
        tok.add_tokens(SPECIAL_TOKENS.get(family, []) + END_TOKENS[family], special_tokens=True)
    return tok


def stand_in_dir(tokenizer_dir: Path, out: Path, *families: str) -> Path:
    """That tokenizer saved as a directory `out` (for a double and a gateway, which load one), its
    generation_config.json naming every family's end-of-turn tokens as stop ids, as a model's own does."""
    tok = stand_in_tokenizer(tokenizer_dir, *families)
    tok.save_pretrained(str(out))
    ends = [tok.convert_tokens_to_ids(t) for family in families for t in END_TOKENS[family]]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": ends}))
    return out
