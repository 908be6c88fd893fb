"""The forward pass of `polar verify`, as a standalone worker: no polar import, Python ≥ 3.9, torch + transformers.

polar runs this file with a Python that has torch (its own, or another venv's: `--python`), so the check
works where polar's environment has no torch — a CPU box whose torch lives in the vLLM venv, or a GPU node.

    python worker.py --model DIR [--dtype float32|bfloat16|float16|auto] [--device auto|cpu|cuda[:N]] [--chunk N]

Protocol, one JSON object per line. On start it answers {"ready": true, "vocab_size": …, …} (or {"error": …}
and exits 3). Then per request {"ids": [...], "positions": [...]} it answers {"logprobs": [...]}: for each
position p, log softmax(logits at p − 1)[ids[p]], the logprob of token p given the tokens before it (null for
p = 0, which has no context). A bad request gets {"error": …} and the worker goes on. EOF ends it.

The logits are the model's own (its forward, so a model's soft-capping or logit scaling applies), taken
raw — before temperature, penalties or top-k/p — as vLLM's default `--logprobs-mode raw_logprobs` does, and
turned into logprobs in float32. The sequence goes through in chunks that reuse the KV cache, asking the
model for the logits of the wanted positions only, so memory stays bounded by the chunk, not the length.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import sys

DTYPES = ("float32", "bfloat16", "float16", "auto")


def _protocol_out():
    """The real stdout for the protocol; fd 1 then points at stderr, so a library's print cannot corrupt it."""
    out = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def _send(out, message) -> None:
    # allow_nan: a token the model gives probability 0 is -Infinity, which Python's json reads back.
    out.write(json.dumps(message) + "\n")
    out.flush()


def _version(text: str) -> tuple:
    parts = []
    for piece in text.split(".")[:2]:
        digits = "".join(c for c in piece if c.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts)


class Model:
    def __init__(self, model_dir: str, dtype: str, device: str, chunk: int):
        import torch
        import transformers
        from transformers import AutoModelForCausalLM

        self.torch = torch
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        self.device = torch.device(device)
        chosen = "auto" if dtype == "auto" else getattr(torch, dtype)
        # transformers 4.56 renamed torch_dtype to dtype; older ones would ignore the new name
        kwarg = "dtype" if _version(transformers.__version__) >= (4, 56) else "torch_dtype"
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True, **{kwarg: chosen})
        self.model.to(self.device).eval()
        self.chunk = chunk
        # Older or remote-code models compute every position's logits: the chunk bounds that memory too.
        self.keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self.vocab_size = int(self.model.get_input_embeddings().num_embeddings)

    def _forward(self, chunk, cache, local: list):
        """The logits at `local` (indices into the chunk), and the cache grown by the chunk."""
        index = self.torch.tensor(local, dtype=self.torch.long, device=self.device)
        if self.keeps_logits:
            out = self.model(input_ids=chunk, past_key_values=cache, use_cache=True, logits_to_keep=index)
            return out.logits[0], out.past_key_values
        out = self.model(input_ids=chunk, past_key_values=cache, use_cache=True)  # every logit of the chunk
        return out.logits[0, index], out.past_key_values

    def describe(self) -> dict:
        import transformers

        config = self.model.config
        return {"ready": True, "vocab_size": self.vocab_size, "dtype": str(self.model.dtype).replace("torch.", ""),
                "device": str(self.device), "model_type": getattr(config, "model_type", None),
                "architectures": getattr(config, "architectures", None), "torch": self.torch.__version__,
                "transformers": transformers.__version__, "python": sys.version.split()[0]}

    def logprobs(self, ids: list, positions: list) -> list:
        torch = self.torch
        n = len(ids)
        bad = next((i for i, t in enumerate(ids) if not isinstance(t, int) or not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise ValueError(f"token id {ids[bad]!r} at position {bad} is outside the model's vocabulary "
                             f"of {self.vocab_size} ids")
        if any(not isinstance(p, int) or not 0 <= p < n for p in positions):
            raise ValueError(f"positions must be indices into the {n} ids")
        # logits at q predict token q + 1: position p needs the logits at p - 1.
        wanted = sorted({p - 1 for p in positions if p > 0})
        found: dict = {}
        tokens = torch.tensor([ids], dtype=torch.long, device=self.device)
        cache = None
        last = wanted[-1] if wanted else -1  # the sequence is read only as far as the last wanted logits
        with torch.inference_mode():
            for start in range(0, last + 1, self.chunk):
                stop = min(start + self.chunk, last + 1)
                keep = [q for q in wanted if start <= q < stop]
                logits, cache = self._forward(tokens[:, start:stop], cache, [q - start for q in keep] or [0])
                if keep:
                    logprobs = logits.float().log_softmax(dim=-1)
                    targets = torch.tensor([ids[q + 1] for q in keep], dtype=torch.long, device=self.device)
                    found.update(zip(keep, logprobs.gather(1, targets[:, None])[:, 0].tolist()))
        return [found[p - 1] if p > 0 else None for p in positions]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--dtype", default="float32", choices=DTYPES)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--chunk", type=int, default=1024)
    args = parser.parse_args(argv)
    out = _protocol_out()
    try:
        model = Model(args.model, args.dtype, args.device, max(1, args.chunk))
    except Exception as exc:  # reported to polar, which shows it: no torch, no weights, unknown architecture
        _send(out, {"error": f"{type(exc).__name__}: {exc}"})
        return 3
    _send(out, model.describe())
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            request = json.loads(line)
            _send(out, {"logprobs": model.logprobs(request["ids"], request["positions"])})
        except Exception as exc:  # one bad request is answered, not fatal
            _send(out, {"error": f"{type(exc).__name__}: {exc}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
