"""Trajectories on disk: JSONL (one trajectory a line) and Parquet (typed columns, one row each).

Parquet keeps the token arrays compact and typed (`token_ids` list<int32>, `loss_mask` list<int8>,
`logprobs` list<float32>), turns and lineage as structs, so a trainer reads it with pyarrow (or
anything on top of it) without polar installed. Logprobs are captured as float32, so float32
columns lose nothing. `metadata` is free-form, so it travels as JSON text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from polar.trajectories.model import Trajectory

_TURN = pa.struct([
    ("row_id", pa.int64()),
    ("call_id", pa.string()),
    ("prompt_start", pa.int64()),
    ("completion_start", pa.int64()),
    ("completion_end", pa.int64()),
    ("finish_reason", pa.string()),
    ("prompt_mode", pa.string()),
    ("policy_version", pa.int64()),
    ("has_logprobs", pa.bool_()),
])
_LINEAGE = pa.struct([("parent_id", pa.string()), ("parent_row_id", pa.int64()), ("fork_position", pa.int64())])
_BREAK = pa.struct([
    ("earlier_row_id", pa.int64()),
    ("earlier_trajectory_id", pa.string()),
    ("position", pa.int64()),
    ("expected_id", pa.int64()),
    ("actual_id", pa.int64()),
    ("evidence", pa.string()),
])
SCHEMA = pa.schema([
    ("id", pa.string()),
    ("builder", pa.string()),
    ("session_id", pa.string()),
    ("task", pa.string()),
    ("metadata", pa.string()),  # JSON text
    ("lineage", _LINEAGE),
    ("token_ids", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("logprobs", pa.list_(pa.float32())),
    ("turns", pa.list_(_TURN)),
    ("reward", pa.float64()),
    ("step_rewards", pa.list_(pa.float64())),
    ("policy_version", pa.int64()),
    ("truncated", pa.bool_()),
    ("broken_prefix", pa.bool_()),
    ("prefix_break", _BREAK),
    ("partial", pa.bool_()),
    ("failed_row_ids", pa.list_(pa.int64())),
])


def write_jsonl(trajectories: Iterable[Trajectory], path: str | Path) -> int:
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for traj in trajectories:
            f.write(traj.model_dump_json() + "\n")
            count += 1
    return count


def read_jsonl(path: str | Path) -> Iterator[Trajectory]:
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield Trajectory.model_validate_json(line)


def to_table(trajectories: Iterable[Trajectory]) -> pa.Table:
    rows = []
    for traj in trajectories:
        row = traj.model_dump()
        row["metadata"] = json.dumps(row["metadata"], ensure_ascii=False)
        rows.append(row)
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def write_parquet(trajectories: Iterable[Trajectory], path: str | Path) -> int:
    table = to_table(trajectories)
    pq.write_table(table, path, compression="zstd")
    return table.num_rows


def read_parquet(path: str | Path) -> Iterator[Trajectory]:
    try:
        table = pq.read_table(path, schema=SCHEMA)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        # A file in an older layout (policy versions as text): its own columns, read through the model
        # (a version's digits become the step, vLLM's label none).
        table = pq.read_table(path)
    for row in table.to_pylist():
        row["metadata"] = json.loads(row["metadata"]) if row["metadata"] else {}
        yield Trajectory.model_validate(row)


def write(trajectories: list[Trajectory], path: str | Path) -> int:
    """Write by suffix: `.jsonl` or `.parquet`."""
    suffix = Path(path).suffix
    if suffix == ".jsonl":
        return write_jsonl(trajectories, path)
    if suffix == ".parquet":
        return write_parquet(trajectories, path)
    raise ValueError(f"unknown trajectory file type {suffix!r}: use .jsonl or .parquet")


def read(path: str | Path) -> Iterator[Trajectory]:
    suffix = Path(path).suffix
    if suffix == ".jsonl":
        return read_jsonl(path)
    if suffix == ".parquet":
        return read_parquet(path)
    raise ValueError(f"unknown trajectory file type {suffix!r}: use .jsonl or .parquet")
