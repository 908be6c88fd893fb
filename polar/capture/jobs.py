"""The capture writer's jobs, as named records: what the caller's thread writes at once or hands to the writer
thread (an arrival, a completion), and what only the writer thread answers (a sync, a flush, the stop)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Future
from dataclasses import dataclass
from typing import NamedTuple

from polar.capture.records import CallEnd, CallStart


@dataclass(eq=False)  # one per call, compared by identity (the writer holds the ones in flight)
class Arrival:
    """A call as `start` recorded it. `row_id` is its pending row once written, and None while it is not
    (handed to the writer thread and not yet written, or not written at all: the completion then inserts
    the row whole). Whoever holds the connection reads or sets it, the arrival always before its completion."""

    call: CallStart
    row_id: int | None = None


@dataclass(frozen=True, slots=True)
class Arrive:
    """Write an arriving call's pending row."""

    arrival: Arrival


@dataclass(frozen=True, slots=True)
class Complete:
    """Write a call's completion: its row updated (or inserted whole)."""

    arrival: Arrival
    end: CallEnd


@dataclass(frozen=True, slots=True)
class Sync:
    """A completion committed on the caller's thread, waiting for the writer thread's next fdatasync."""

    row_id: int


class Flush:
    """Answered once everything queued before it is durable (or has failed)."""


class Stop:
    """The writer thread's last job."""


class Job(NamedTuple):
    op: Arrive | Complete | Sync | Flush | Stop
    waiter: Future | asyncio.Future | None  # None for an arrival: nobody waits for it
