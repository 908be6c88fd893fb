"""Rows on disk: JSONL (one JSON object a line) and Parquet (a typed schema, zstd)."""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

FORMATS = ("jsonl", "parquet")


def write_jsonl(rows: Iterable[dict[str, Any]], path: Path) -> int:
    count = 0
    with open(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False, separators=(",", ":")) + "\n")
            count += 1
    return count


def write_parquet(rows: list[dict[str, Any]], schema: pa.Schema, path: Path) -> int:
    table = pa.Table.from_pylist(rows, schema=schema)
    pq.write_table(table, path, compression="zstd")
    return table.num_rows


def write_rows(rows: list[dict[str, Any]], path_stem: Path, formats: Iterable[str],
               schema: pa.Schema | None = None) -> list[Path]:
    """`path_stem`.jsonl and/or .parquet; returns the paths written."""
    written = []
    for fmt in formats:
        path = path_stem.with_suffix(f".{fmt}")
        if fmt == "jsonl":
            write_jsonl(rows, path)
        elif fmt == "parquet":
            if schema is None:
                raise ValueError(f"{path_stem.name} rows have no Parquet schema")
            write_parquet(rows, schema, path)
        else:
            raise ValueError(f"unknown format {fmt!r} (use {', '.join(FORMATS)})")
        written.append(path)
    return written
