"""A stand-in for polar/verify/worker.py that needs no torch: the same protocol over a made-up "model"
whose logprob of token t is -(t % 7) in any context (`fake_logprob`), with a vocabulary of
VOCAB ids. `--model DIR` must hold config.json; a model dir named "broken" fails to load."""

from __future__ import annotations

import json
import sys
from pathlib import Path

VOCAB = 1000


def fake_logprob(token: int) -> float:
    return -float(token % 7)


def main() -> int:
    args = dict(zip(sys.argv[1::2], sys.argv[2::2]))
    model = Path(args["--model"])
    if model.name == "broken":
        print(json.dumps({"error": "OSError: no weights in " + str(model)}), flush=True)
        return 3
    print("a stray line on stderr", file=sys.stderr)
    print(json.dumps({"ready": True, "vocab_size": VOCAB, "dtype": args["--dtype"], "device": "cpu"}), flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        ids = request["ids"]
        if any(not 0 <= t < VOCAB for t in ids):
            print(json.dumps({"error": "ValueError: token id outside the vocabulary"}), flush=True)
            continue
        if request.get("ids") == [666, 666]:
            return 9  # dies mid-run
        print(json.dumps({"logprobs": [fake_logprob(ids[p]) if p else None for p in request["positions"]]}),
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
