"""What an export selected and wrote, as data (stats.json) and as rich tables."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rich.table import Table

from polar.datasets.select import Candidate, Selected


def _bucket() -> dict[str, Any]:
    return {"attempted": 0, "accepted": 0, "tokens": 0, "trainable_tokens": 0, "turns": 0,
            "trajectories_without_logprobs": 0, "turns_without_logprobs": 0, "_rewards": []}


def _add(b: dict[str, Any], c: Candidate, accepted: bool) -> None:
    b["attempted"] += 1
    if accepted:
        t = c.trajectory
        b["accepted"] += 1
        b["tokens"] += len(t.token_ids)
        b["trainable_tokens"] += t.trainable_tokens
        b["turns"] += len(t.turns)
        b["trajectories_without_logprobs"] += not t.has_logprobs
        b["turns_without_logprobs"] += t.turns_without_logprobs
        if c.reward is not None:
            b["_rewards"].append(c.reward)


def _close(b: dict[str, Any]) -> dict[str, Any]:
    rewards = b.pop("_rewards")
    b["mean_reward"] = sum(rewards) / len(rewards) if rewards else None
    return b


def selection_stats(candidates: list[Candidate], selected: Selected,
                    splits: dict[str, list[Candidate]]) -> dict[str, Any]:
    """Counts over every trajectory looked at; tokens, turns and rewards over the accepted ones."""
    accepted_ids = {id(c) for c in selected.accepted}

    def grouped(key: Callable[[Candidate], str]) -> dict[str, dict[str, Any]]:
        out: dict[str, dict[str, Any]] = {}
        for c in candidates:
            _add(out.setdefault(key(c), _bucket()), c, id(c) in accepted_ids)
        return {k: _close(v) for k, v in sorted(out.items())}

    total = _bucket()
    for c in candidates:
        _add(total, c, id(c) in accepted_ids)
    split_stats = {}
    for name, rows in splits.items():
        b = _bucket()
        for c in rows:
            _add(b, c, True)
        split_stats[name] = {**_close(b), "tasks": len({c.task for c in rows})}
        del split_stats[name]["attempted"]
    return {
        "sessions": selected.sessions,
        "total": _close(total),
        "rejected": dict(selected.rejected.most_common()),
        "splits": split_stats,
        "by_harness": grouped(lambda c: c.harness or "unknown"),
        "by_task": grouped(lambda c: c.task),
    }


def _table(title: str, first: str, groups: dict[str, dict[str, Any]], total: dict[str, Any] | None = None,
           count: str = "accepted/attempted") -> Table:
    table = Table(title=title)
    for name in (first, count, "tokens", "trainable", "turns", "mean reward"):
        table.add_column(name, justify="left" if name == first else "right")

    def row(name: str, b: dict[str, Any], **style: Any) -> None:
        attempted = f"/{b['attempted']}" if "attempted" in b else ""
        reward = "-" if b["mean_reward"] is None else f"{b['mean_reward']:.3f}"
        table.add_row(name, f"{b['accepted']}{attempted}", str(b["tokens"]), str(b["trainable_tokens"]),
                      str(b["turns"]), reward, **style)

    for name, b in groups.items():
        row(name, b)
    if total is not None:
        table.add_section()
        row("total", total, style="bold")
    return table


def stats_tables(stats: dict[str, Any]) -> list[Table]:
    """By harness, by task (with the total), and per split."""
    return [
        _table("export: by harness", "harness", stats["by_harness"]),
        _table("export: by task", "task", stats["by_task"], stats["total"]),
        _table("export: splits", "split", stats["splits"], count="trajectories"),
    ]


def summary_lines(stats: dict[str, Any]) -> list[str]:
    total = stats["total"]
    lines = [f"{total['accepted']}/{total['attempted']} trajectories accepted from {stats['sessions']} sessions; "
             f"{total['tokens']} tokens, {total['trainable_tokens']} trainable, {total['turns']} turns"]
    if total["turns_without_logprobs"]:
        lines.append(f"no logprobs: {total['turns_without_logprobs']} turns in {total['trajectories_without_logprobs']} "
                     "trajectories (null in `logprobs`, `has_logprobs` false)")
    if stats["rejected"]:
        lines.append("left out: " + ", ".join(f"{n} {reason}" for reason, n in stats["rejected"].items()))
    check = stats.get("verification")
    if check:
        worst = "" if check["max_abs_diff"] is None else f"; largest |Δ logprob| {check['max_abs_diff']:.3g}"
        lines.append(f"verification: {check['verified']} verified, {check['failed']} failed, "
                     f"{check['stale']} stale, {check['not_verified']} not verified of {check['trajectories']}{worst}")
    chat = stats.get("chat")
    if chat:
        line = f"chat rows: {chat['rows']}"
        if chat["skipped"]:
            line += " (no chat row: " + ", ".join(f"{n} {reason}" for reason, n in chat["skipped"].items()) + ")"
        check = chat.get("rerender")
        if check:
            line += f"; re-rendered to their exact tokens: {check['exact']}/{check['checked']}"
        lines.append(line)
    return lines
