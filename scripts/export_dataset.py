#!/usr/bin/env python3
"""Batch export of a rollout run's accepted trajectories (the same command as `polar export`).

    python scripts/export_dataset.py --state rollout.db --captures captures.db --out dataset \
        --min-reward 1.0 --val-fraction 0.1 --tokenizer ~/.cache/polar/models/qwen35-tiny

Writes OUT/chat/{train,validation}.jsonl, OUT/tokens/{train,validation}.{jsonl,parquet} and
OUT/stats.json; `--help` lists every option, docs/datasets.md the row formats.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from polar.cli.export import export  # noqa: E402

if __name__ == "__main__":
    export(prog_name="export_dataset.py")
