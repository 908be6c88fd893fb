"""A real full disk for capture faults: a small tmpfs of its own (root mounts it), filled to the last byte."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def small_tmpfs(where: Path, size: str = "24m") -> Iterator[Path]:
    """A `size` tmpfs mounted at `where`: a real ENOSPC once full, not a simulated one."""
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(disk: Path, name: str = "filler") -> Path:
    """Fill what is left of `disk` with one file (delete it to free the space)."""
    filler = disk / name
    with open(filler, "wb") as f:
        try:
            while True:
                f.write(b"\0" * (1 << 20))
                f.flush()
        except OSError:
            pass
    return filler
