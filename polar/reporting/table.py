"""Human-readable views of the capture store (rich tables for the terminal)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.console import Console
from rich.table import Table


def captures_table(rows: Iterable[dict[str, Any]], console: Console | None = None, title: str = "captured model calls") -> int:
    table = Table(title=title)
    for col in ("id", "session", "provider", "endpoint", "model", "stream", "status", "prompt", "sampled", "finish",
                "prompt mode", "ms"):
        table.add_column(col, justify="right" if col in ("id", "prompt", "sampled", "ms") else "left")
    count = 0
    for r in rows:
        count += 1
        ms = "" if r.get("t_end") is None else f"{(r['t_end'] - r['t_start']) * 1000:.0f}"
        status = r["status"] if r["status"] == "ok" else f"{r['status']} {r.get('http_status') or ''} {r.get('error_kind') or ''}"
        table.add_row(
            str(r["id"]), r["session_id"], r["provider"], r.get("endpoint") or "", r.get("model") or "",
            "yes" if r.get("stream") else "", status.strip(), str(r.get("prompt_len") or ""),
            str(r.get("completion_len") or ""), r.get("finish_reason") or "",
            (r.get("prompt_mode") or "").split(":")[0], ms,
        )
    (console or Console()).print(table)
    return count
