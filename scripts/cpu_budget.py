"""A CPU budget per process, through a cgroup's CPU quota: each process gets `cores` of CPU time a period.

Why: on a machine with few cores the load generator, the upstream and the proxies share them, so "N
workers vs one" measures the machine, not the workers. Giving every gateway process the same quota
(a core's worth on a node, less here) makes that process's CPU the bound for one worker and for each
of N, with the rest left to everything else — the shape of a GPU node whose gateway workers each have
a core. Root only; cgroup v2 (cpu.max) or v1 (cpu.cfs_quota_us), whichever the machine mounts.
"""

from __future__ import annotations

import os
from pathlib import Path

PERIOD_US = 100_000
_V2 = Path("/sys/fs/cgroup")
_V1 = Path("/sys/fs/cgroup/cpu")


def _root() -> tuple[Path, bool]:
    """(where groups are made, whether it is cgroup v2)."""
    if (_V2 / "cgroup.controllers").exists():
        if "cpu" not in (_V2 / "cgroup.subtree_control").read_text().split():
            (_V2 / "cgroup.subtree_control").write_text("+cpu")
        return _V2, True
    if (_V1 / "cpu.cfs_quota_us").exists():
        return _V1, False
    raise RuntimeError("no cgroup CPU controller mounted (cgroup v2 cpu.max or v1 cpu.cfs_quota_us)")


def _remove_orphans(root: Path, prefix: str) -> None:
    """Empty groups left by a run killed before its close (kill -9): their owner's pid is in the name."""
    for group in root.glob(f"{prefix}-*-*"):
        owner = group.name[len(prefix) + 1:].split("-", 1)[0]
        if owner.isdigit() and not Path(f"/proc/{owner}").exists():
            try:
                group.rmdir()  # refused while a process is still in it: left alone
            except OSError:
                continue


class CpuBudgets:
    """Groups made by this run, each capped at `cores`; removed (processes back to the root) on close."""

    def __init__(self, prefix: str = "polar-bench"):
        if os.geteuid() != 0:
            raise RuntimeError("a CPU budget needs root (it writes cgroup files)")
        self.root, self.v2 = _root()
        self.prefix, self.groups = f"{prefix}-{os.getpid()}", []
        _remove_orphans(self.root, prefix)

    def limit(self, name: str, pids: list[int], cores: float) -> Path:
        group = self.root / f"{self.prefix}-{name}"
        group.mkdir(exist_ok=True)
        self.groups.append(group)
        quota = max(1000, int(cores * PERIOD_US))
        if self.v2:
            (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
            (group / "cpu.cfs_quota_us").write_text(str(quota))
        for pid in pids:  # a process, with all its threads; children started later inherit the group
            try:
                (group / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:
                continue
        return group

    def close(self) -> None:
        for group in reversed(self.groups):
            for pid in (group / "cgroup.procs").read_text().split():
                try:
                    (self.root / "cgroup.procs").write_text(pid)
                except OSError:  # gone meanwhile
                    continue
            group.rmdir()
        self.groups.clear()

    def __enter__(self) -> CpuBudgets:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
