"""Writer leases: which gateway process owns a pending capture row, so a restart interrupts only the dead ones'.

Several gateways may write one database (an option change, N processes per node). Each writer holds an
flock on `<db>.writers/<token>` for as long as it lives and tags the rows it opens with its token; the
kernel drops the lock when the process dies, however it dies. On start-up a writer marks interrupted the
pending rows of every token whose lease nobody holds any more, never a live gateway's.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
import sqlite3
from pathlib import Path

log = logging.getLogger("polar.capture")


def lease_dir(path: str) -> str:
    return path + ".writers"


def take(path: str) -> tuple[str, int]:
    """A new writer's token and the descriptor holding its lease (held until `drop` or the process ends)."""
    token = f"{os.getpid()}-{secrets.token_hex(6)}"
    os.makedirs(lease_dir(path), exist_ok=True)
    fd = os.open(os.path.join(lease_dir(path), token), os.O_CREAT | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, json.dumps({"pid": os.getpid()}).encode())
    return token, fd


def held(path: str, token: str | None) -> bool:
    """Whether a live process still holds `token`'s lease."""
    if not token:
        return False  # rows from before leases existed: their writer is long gone
    try:
        fd = os.open(os.path.join(lease_dir(path), token), os.O_RDWR)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing drops a lock we may just have taken
    return False


def drop(path: str, token: str, fd: int) -> None:
    Path(lease_dir(path), token).unlink(missing_ok=True)
    os.close(fd)


def reap_dead_writers(conn: sqlite3.Connection, path: str, own: str) -> int:
    """Mark interrupted the pending rows of writers that no longer hold their lease: how many."""
    pending = [w for (w,) in conn.execute("SELECT DISTINCT writer FROM calls WHERE status='pending'")]
    dead = [w for w in pending if w != own and not held(path, w)]
    count = 0
    for writer in dead:
        cur = conn.execute(
            "UPDATE calls SET status='interrupted', error_kind='interrupted', "
            "error='the proxy stopped before this call finished' WHERE status='pending' AND writer IS ?",
            (writer,),
        )
        count += cur.rowcount
        if writer:
            Path(lease_dir(path), writer).unlink(missing_ok=True)
    if count:
        log.warning("marked %d calls from an earlier run as interrupted", count)
    return count
