#!/usr/bin/env python3
"""Measure what `polar verify` should tolerate: |Δ logprob| between what vLLM served and a recompute.

Runs token-faithful multi-turn sessions through polar in front of a running vLLM, then recomputes every
sampled token's logprob with the served weights (`polar.verify`, tolerance off) in each dtype asked for,
and prints the |Δ| distribution over all tokens, per sampling temperature. The figures in docs/verify.md
come from this script; on a GPU node, point it at your vLLM and your model to calibrate `--tolerance`.

    scripts/serve_vllm_cpu.sh 8000                      # or any vLLM serving MODEL_DIR (--enable-scale-out helps)
    scripts/measure_verify_tolerance.py --upstream http://127.0.0.1:8000 --model ~/.cache/polar/models/qwen35-tiny \
        --python ~/.cache/polar/vllm-venv/bin/python [--chat-template T.jinja] [--dtypes float32,bfloat16]

The chat template must be the one vLLM was started with (its default: the model's own). Sessions go
through the OpenAI Chat API; each takes --turns user turns at one temperature (0, 0.7 and 1.0 cycle).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

TEMPERATURES = (0.0, 0.7, 1.0)
PROMPTS = ["Hello! What can you do in this repository?", "Read the README and tell me what it is about.",
           "Shorter, please.", 'Now say {"ok": true} and nothing else.', "Continue.",
           "Summarise our conversation in one line.", "Why?", "List three files you would open first."]


def run_sessions(url: str, model: str, sessions: int, turns: int, max_tokens: int, thinking: bool) -> dict[str, float]:
    import openai

    temperature_of = {}
    for n in range(sessions):
        session = f"measure-{n}-{uuid.uuid4().hex[:6]}"
        temperature = TEMPERATURES[n % len(TEMPERATURES)]
        temperature_of[session] = temperature
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-measure", max_retries=0,
                               default_headers={"x-polar-session": session})
        messages: list[dict] = []
        for turn in range(turns):
            messages.append({"role": "user", "content": PROMPTS[(n + turn) % len(PROMPTS)]})
            done = client.chat.completions.create(
                model=model, messages=messages, max_tokens=max_tokens, temperature=temperature, seed=n,
                extra_body={"chat_template_kwargs": {"enable_thinking": thinking and n % 2 == 0}})
            messages.append(done.choices[0].message.model_dump(exclude_none=True))
    return temperature_of


def figures(checks, temperature_of: dict[str, float]) -> dict:
    def spread(diffs: np.ndarray) -> dict:
        if not len(diffs):
            return {"tokens": 0}
        q = {f"p{p:g}": float(np.quantile(diffs, p / 100)) for p in (50, 90, 99, 99.9)}
        return {"tokens": int(len(diffs)), "mean": float(diffs.mean()), **q, "max": float(diffs.max())}

    out = {"all": spread(np.concatenate([c.abs_diffs for c in checks]))}
    for temperature in sorted(set(temperature_of.values())):
        chosen = [c.abs_diffs for c in checks if temperature_of.get(c.session) == temperature]
        out[f"temperature {temperature:g}"] = spread(np.concatenate(chosen) if chosen else np.zeros(0))
    out["trajectory max |Δ|"] = spread(np.array([c.max_abs_diff for c in checks if c.max_abs_diff is not None]))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upstream", required=True, help="a running vLLM serving --model")
    parser.add_argument("--model", required=True, help="the directory vLLM serves")
    parser.add_argument("--served-name", default="polar-tiny", help="vLLM's --served-model-name")
    parser.add_argument("--chat-template", help="the template vLLM was started with (default: the model's own)")
    parser.add_argument("--python", help="a Python with torch + transformers for the recompute")
    parser.add_argument("--dtypes", default="float32,bfloat16", help="recompute dtypes, comma-separated")
    parser.add_argument("--sessions", type=int, default=9)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--no-thinking", action="store_true")
    parser.add_argument("--db", help="keep the captures here (default: a temporary file)")
    args = parser.parse_args()

    from polar.mitm.proxy import ProxyConfig, SubprocessProxy, free_port
    from polar.verify import Tolerance, verify

    db = Path(args.db) if args.db else Path(tempfile.mkdtemp(prefix="polar-measure-")) / "captures.db"
    extra = {"polar_chat_template": args.chat_template} if args.chat_template else {}
    proxy = SubprocessProxy(ProxyConfig(upstream=args.upstream, db=str(db), port=free_port(), tokenizer=args.model,
                                        upstream_model=args.served_name, extra=extra))
    proxy.start()
    started = time.monotonic()
    try:
        temperature_of = run_sessions(proxy.url, args.served_name, args.sessions, args.turns, args.max_tokens,
                                      not args.no_thinking)
    finally:
        proxy.stop()
    print(f"{args.sessions} sessions × {args.turns} turns in {time.monotonic() - started:.0f}s; captures: {db}")
    report = {}
    for dtype in args.dtypes.split(","):
        run = verify(db, args.model, python=args.python, dtype=dtype, tolerance=Tolerance(math.inf))
        report[dtype] = figures(run.checks, temperature_of) | {"worker": run.worker}
    print(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
