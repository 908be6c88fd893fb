"""Reading captures: read-only connections (`mode=ro`), never a schema change, safe beside a live writer.

Rows come back as the caller sees them: JSON decoded, body rebuilt (bodies.py), canonical messages and
large parts (the tools) resolved from the content-addressed `messages` table, and (optionally) token columns decoded into lists, each
prompt rebuilt by following its lineage of parent rows.
"""

from __future__ import annotations

import json
import sqlite3
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from polar.capture.bodies import read_body, read_stored, unpack, unpack_json
from polar.capture.dictionaries import Dictionaries
from polar.capture.schema import policy_step
from polar.capture.tokens import unpack_ids, unpack_logprobs
from polar.sqlite_files import open_readonly

_EMPTY = np.zeros(0, dtype="<u4")


_LINEAGE = "SELECT prompt_parent, prompt_prefix_len, prompt_suffix, {}, completion_ids, {} FROM calls WHERE id=?"
# The lineage query as each schema answers it: this one, one from before completion_encoding, one from
# before prompt_encoding too (their blobs are stored as they are).
_LINEAGE_BY_SCHEMA = [_LINEAGE.format(*columns) for columns in
                      (("prompt_encoding", "completion_encoding"), ("prompt_encoding", "NULL"), ("NULL", "NULL"))]


class CaptureReader:
    """A capture database opened for reading. Each method opens its own short-lived connection, so one
    reader may be shared across threads."""

    def __init__(self, path: str | Path):
        self.path = str(path)
        open_readonly(self.path, "capture").close()  # a missing or foreign file is a clear error now

    def connect(self) -> sqlite3.Connection:
        conn = open_readonly(self.path, "capture")
        conn.row_factory = sqlite3.Row
        return conn

    def prompt_ids(self, row_id: int, conn: sqlite3.Connection | None = None, memo: dict | None = None) -> list[int]:
        """A call's full prompt, following its parent references. `memo` maps row id → that row's
        prompt+completion, so reading a whole session resolves each row once."""
        if conn is None:
            with closing(self.connect()) as own:
                return self.prompt_ids(row_id, own, memo)
        seq = self._sequence(conn, row_id, {} if memo is None else memo)
        (completion,) = conn.execute("SELECT completion_len FROM calls WHERE id=?", (row_id,)).fetchone()
        return seq[: len(seq) - (completion or 0)].tolist()

    @staticmethod
    def _sequence(conn: sqlite3.Connection, row_id: int, memo: dict) -> np.ndarray:
        chain: list[tuple[int, int, bytes, bytes]] = []
        cur: int | None = row_id
        while cur is not None and cur not in memo:
            found = _lineage_row(conn, cur)
            if found is None:
                raise LookupError(f"capture row {cur} (in the prompt lineage of row {row_id}) is missing")
            parent, prefix_len, suffix, encoding, completion, completion_encoding = found
            suffix = unpack(suffix, encoding, f"capture row {cur}'s prompt ids")
            completion = unpack(completion, completion_encoding, f"capture row {cur}'s completion ids")
            chain.append((cur, prefix_len or 0, suffix or b"", completion or b""))
            cur = parent if prefix_len else None
        for rid, prefix_len, suffix, completion in reversed(chain):
            head = memo[cur][:prefix_len] if cur is not None else _EMPTY
            memo[rid] = np.concatenate([head, np.frombuffer(suffix, "<u4"), np.frombuffer(completion, "<u4")])
            cur = rid
        return memo[row_id]

    def find_call(self, call_id: str, session: str) -> dict[str, Any] | None:
        """A finished call by its public id, only within the asking session."""
        with closing(self.connect()) as conn:
            row = conn.execute(
                "SELECT * FROM calls WHERE call_id=? AND session_id=? AND status='ok'", (call_id, session)
            ).fetchone()
            return decode_row(conn, row, RowCache()) if row else None

    def recent_calls(self, session: str, limit: int) -> list[dict[str, Any]]:
        """A session's last `limit` completed calls with tokens, oldest first, token columns decoded."""
        with closing(self.connect()) as conn:
            rows = conn.execute(
                "SELECT * FROM calls WHERE session_id=? AND status='ok' AND completion_ids IS NOT NULL "
                "ORDER BY id DESC LIMIT ?", (session, limit),
            ).fetchall()
            cache = RowCache()
            return [self._with_tokens(conn, row, cache, {}) for row in reversed(rows)]

    def calls(self, session: str | None = None, with_tokens: bool = True) -> Iterator[dict[str, Any]]:
        """Rows as dicts, oldest first."""
        with closing(self.connect()) as conn:
            sql = "SELECT * FROM calls" + (" WHERE session_id=?" if session else "") + " ORDER BY id"
            cache = RowCache()
            memo: dict[int, np.ndarray] = {}
            for row in conn.execute(sql, (session,) if session else ()).fetchall():
                yield self._with_tokens(conn, row, cache, memo) if with_tokens else decode_row(conn, row, cache)

    def _with_tokens(self, conn, row: sqlite3.Row, cache: RowCache, memo: dict) -> dict[str, Any]:
        out = decode_row(conn, row, cache)
        encoding, where = out.get("completion_encoding"), f"capture row {row['id']}'s completion"
        out["completion_ids"] = unpack_ids(unpack(row["completion_ids"], encoding, where))
        out["completion_logprobs"] = unpack_logprobs(unpack(row["completion_logprobs"], encoding, where))
        out["prompt_ids"] = self.prompt_ids(row["id"], conn, memo) if row["prompt_len"] is not None else []
        return out


def _lineage_row(conn: sqlite3.Connection, row_id: int) -> tuple | None:
    *newer, oldest = _LINEAGE_BY_SCHEMA
    for sql in newer:
        try:
            return conn.execute(sql, (row_id,)).fetchone()
        except sqlite3.OperationalError:  # an older database: a column this query names is not there
            pass
    return conn.execute(oldest, (row_id,)).fetchone()


MEMO_REFS = 4_000_000  # message references a reader keeps (row id → its list), all rows together: ~32 MB


@dataclass
class RowCache:
    """What decoding one row learns that the next rows reuse: content-addressed values, decoded bodies,
    each row's full list of message references (a row stores its list against its parent's)."""

    values: dict[str, Any] = field(default_factory=dict)  # hash → decoded JSON (messages, parts)
    bodies: dict[int, bytes | None] = field(default_factory=dict)  # row id → request body (bounded)
    refs: OrderedDict[int, list[str]] = field(default_factory=OrderedDict)  # bounded by MEMO_REFS entries
    _refs_held: int = 0
    _dictionaries: Dictionaries | None = None

    def dictionaries(self, conn: sqlite3.Connection) -> Dictionaries:
        """The database's zstd dictionaries (one database per cache), loaded as its values name them."""
        if self._dictionaries is None:
            self._dictionaries = Dictionaries(conn)
        return self._dictionaries

    def message_refs(self, conn: sqlite3.Connection, row_id: int, stored: dict[str, Any]) -> list[str]:
        """Row `row_id`'s message references from its stored canonical (`message_refs`, after
        `message_base`'s parent prefix when it has one), following parents as far as needed."""
        chain: list[tuple[int, dict[str, Any]]] = [(row_id, stored)]
        while (base := chain[-1][1].get("message_base")) and base[0] not in self.refs:
            parent = conn.execute("SELECT canonical FROM calls WHERE id=?", (base[0],)).fetchone()
            if parent is None or parent[0] is None or base[0] >= chain[-1][0]:
                raise LookupError(f"capture row {base[0]} (whose messages row {row_id} continues) is missing")
            chain.append((base[0], json.loads(unpack_json(parent[0], self.dictionaries(conn)))))
        for rid, canonical in reversed(chain):
            refs = canonical["message_refs"]
            if base := canonical.get("message_base"):
                head = self.refs[base[0]]
                if base[1] > len(head):
                    raise LookupError(f"capture row {rid} continues {base[1]} messages of row {base[0]}, "
                                      f"which has {len(head)}")
                refs = head[: base[1]] + refs
            self._keep(rid, refs)
        return self.refs[row_id]

    def _keep(self, row_id: int, refs: list[str]) -> None:
        if row_id in self.refs:
            self.refs.move_to_end(row_id)
            return
        self.refs[row_id] = refs
        self._refs_held += len(refs)
        while self._refs_held > MEMO_REFS and len(self.refs) > 1:
            self._refs_held -= len(self.refs.popitem(last=False)[1])

    def resolve(self, conn: sqlite3.Connection, refs: list[str]) -> None:
        missing = [h for h in set(refs) if h not in self.values]
        for start in range(0, len(missing), 500):
            chunk = missing[start : start + 500]
            marks = ",".join("?" * len(chunk))
            for digest, body in conn.execute(f"SELECT hash, body FROM messages WHERE hash IN ({marks})", chunk):
                self.values[digest] = json.loads(unpack_json(body, self.dictionaries(conn)))


def decode_row(conn: sqlite3.Connection, row: sqlite3.Row, cache: RowCache) -> dict[str, Any]:
    """A stored row as the caller sees it: JSON decoded, body rebuilt, messages and parts resolved."""
    out = dict(row)
    dictionaries = cache.dictionaries(conn)
    for key in ("request_headers", "canonical", "result", "rewrites"):
        if out.get(key):
            out[key] = json.loads(unpack_json(out[key], dictionaries))  # large canonical and result are compressed
    _versions(out)
    out["request_body"] = read_body(conn, out, cache.bodies)
    if out.get("response_body_id") is not None:  # a large one, in `bodies` (rows before this column have none)
        out["response_body"] = read_stored(conn, out["response_body_id"], f"capture row {out['id']}", cache.bodies)
    else:
        out["response_body"] = unpack(out.get("response_body"), out.get("response_encoding"),
                                      f"capture row {out['id']}", dictionaries)
    canonical = out.get("canonical")
    if isinstance(canonical, dict) and "message_refs" in canonical:
        refs = cache.message_refs(conn, out["id"], canonical)
        del canonical["message_refs"]
        canonical.pop("message_base", None)
        parts = canonical.pop("part_refs", [])  # rows written before parts were stored apart have none
        cache.resolve(conn, [*refs, *(canonical[key] for key in parts)])
        for key in parts:  # in place: the request's keys keep their order
            canonical[key] = cache.values[canonical[key]]
        canonical["messages"] = [cache.values[h] for h in refs]
    return out


def _versions(row: dict[str, Any]) -> None:
    """A row as the current schema has it: a database the writer has not migrated yet holds `policy_version` as
    TEXT (the trainer's step, or the upstream's label: schema.policy_step), and a result from before the upstream's
    label had its own name calls it `policy_version`."""
    stored = row.get("policy_version")
    if isinstance(stored, str):
        row["policy_version"] = policy_step(stored)
        if row["policy_version"] is None and row.get("weight_version") is None:
            row["weight_version"] = stored
    row.setdefault("weight_version", None)
    result = row.get("result")
    if isinstance(result, dict) and "policy_version" in result:
        label = result.pop("policy_version")
        result["weight_version"] = None if label is None else str(label)
