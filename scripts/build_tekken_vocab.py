"""Mistral's real vocabulary (tekken, from the `mistral-common` package) as a Hugging Face tokenizer directory, with
the two control tokens its file lacks for Devstral's and Mistral-Small-3.2's templates as stand-ins.

mistral-common ships `tekken_240911.json` (a v3 tekken file: 130,072 byte-level BPE ranks after 1,000 control-token
slots; the slots it names are `<unk>` `<s>` `</s>` `[INST]` `[/INST]` `[AVAILABLE_TOOLS]` … `[SYSTEM_PROMPT]`
`[/SYSTEM_PROMPT]` `[TOOL_CONTENT]`, ids 0-19, the rest `<SPECIAL_n>`). Devstral-Small-2507's and Mistral-Small-3.2's
templates also write `[ARGS]` and `[CALL_ID]`, which only v11+ tekken files name, and no registry package ships one:
they take two free slots here (32 and 33, named stand-ins). Every other id is the file's own. The result is checked id
for id against mistral-common's own encoder (`Tekkenizer`) on the same modified file: mixed-script text and code, each
control token's id, and decode(encode(x)) == x. Run it with a Python that has mistral-common and transformers (the
suite's vLLM venv: `$POLAR_CACHE/vllm-venv/bin/python scripts/build_tekken_vocab.py`). Built into the cache, never
committed.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from pathlib import Path

SOURCE = "tekken_240911.json"
STAND_INS = {32: "[ARGS]", 33: "[CALL_ID]"}
CHECKS = [
    "Lis «données/日本.txt» — naïve café ☕, then run `pytest -q` (3 passed in 0.01s ✓)",
    "def f(x):\n    return x ** 2  # square\n\n\tTabs and  double  spaces, I'm sure it's fine.\r\nÉcole 123456789",
    '{"path": "src/app.py", "old": "a-b", "new": "a+b"} Je corrige le bogue — 修复中 ✓',
]


def default_out() -> Path:
    return Path(os.environ.get("POLAR_CACHE") or Path.home() / ".cache" / "polar") / "models" / "mistral-tekken-vocab"


def tekken_file(folder: Path) -> Path:
    """mistral-common's tekken file with its control tokens listed, the two stand-ins in their slots."""
    import mistral_common
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    raw = json.loads((Path(mistral_common.__file__).parent / "data" / SOURCE).read_text())
    named = {int(t["rank"]): str(getattr(t["token_str"], "value", t["token_str"])) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS}
    last = max(STAND_INS)
    raw["special_tokens"] = [{"rank": i, "token_str": named.get(i) or STAND_INS.get(i) or f"<SPECIAL_{i}>",
                              "is_control": True} for i in range(last + 1)]
    path = folder / "tekken.json"
    path.write_text(json.dumps(raw))
    return path


def build(out: Path) -> None:
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.mistral.tokenizer import MistralConverter

    with tempfile.TemporaryDirectory() as tmp:
        source = tekken_file(Path(tmp))
        hf = PreTrainedTokenizerFast(tokenizer_object=MistralConverter(vocab_file=str(source)).converted(),
                                     bos_token="<s>", eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                                     clean_up_tokenization_spaces=False)
        out.mkdir(parents=True, exist_ok=True)
        hf.save_pretrained(str(out))
        (out / "generation_config.json").write_text(json.dumps({"bos_token_id": 1, "eos_token_id": 2}) + "\n")
        check(out, source)


def check(out: Path, source: Path) -> None:
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer
    from transformers import AutoTokenizer

    hf, own = AutoTokenizer.from_pretrained(str(out)), Tekkenizer.from_file(str(source))
    problems = []
    for text in CHECKS:
        ids = hf.encode(text, add_special_tokens=False)
        if ids != own.encode(text, bos=False, eos=False):
            problems.append(f"ids differ from mistral-common's for {text[:40]!r}")
        if hf.decode(ids) != text:
            problems.append(f"decode(encode(x)) != x for {text[:40]!r}")
    for token in ["<s>", "</s>", "[INST]", "[/INST]", "[AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[TOOL_CALLS]",
                  "[SYSTEM_PROMPT]", "[TOOL_CONTENT]", *STAND_INS.values()]:
        ids = hf.encode(f"x{token}y", add_special_tokens=False)
        if own.get_special_token(token) not in ids or hf.convert_tokens_to_ids(token) != own.get_special_token(token):
            problems.append(f"{token} is not mistral-common's id {own.get_special_token(token)} ({ids})")
    if problems:
        raise SystemExit("tekken check failed:\n  " + "\n  ".join(problems))
    print(f"{out}: {len(hf)} ids, equal to mistral-common's encoder on {len(CHECKS)} texts and the control tokens")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default_out())
    build(parser.parse_args().out)
