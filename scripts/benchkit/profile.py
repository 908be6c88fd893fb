"""Where a benchmark's proxy CPU goes, bucket by bucket: py-spy attached to the proxy for each turn bucket.

`Profiler` samples a process's GIL holder with `py-spy record --gil --format raw` between a bucket's ends;
`Profile` reads the collapsed stacks back. What the benchmarks ask of it:
  - the time per call inside named parts of the path (inclusive: any frame of the stack in the part), e.g.
    decoding the request's JSON, which issue 15's "turn 100 costs <= 1.5x turn 1" leaves out;
  - the functions whose own time per call grew most from the first bucket to the last (self time: the
    stack's innermost Python frame, which a C call such as orjson.loads is counted in).
Sampled milliseconds are samples / rate; at 200 Hz over a few seconds a bucket's figure is good to a few
per cent of the proxy's CPU. py-spy is a dev dependency (pip); it needs ptrace (root, or the same user with
ptrace_scope 0).
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

RATE = 200  # samples a second per thread

# Named parts of a call: a sample belongs to a part when any frame of its stack matches (file suffix, function).
PARTS: dict[str, tuple[str, str]] = {
    "request JSON decode": ("polar/gateway/body.py", "decode"),
}

_FRAME = re.compile(r"^(?P<func>.*) \((?P<file>[^()]*?)(?::\d+)?\)$")


def py_spy() -> str:
    exe = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(exe).exists():
        raise SystemExit("--profile needs py-spy (pip install py-spy, a dev dependency)")
    return exe


class Profiler:
    """py-spy recording one process until `stop`."""

    def __init__(self, pid: int, out: Path, rate: int = RATE):
        self.out = out
        out.parent.mkdir(parents=True, exist_ok=True)
        # --gil: only the thread holding the GIL, so waits (the event loop's select, a commit's fsync) are not
        # counted as work; C code that releases the GIL (zstd, some tokenizer calls) is missed. --nonblocking:
        # the proxy is never paused to be sampled (its timings stay its own).
        self.proc = subprocess.Popen(
            [py_spy(), "record", "--pid", str(pid), "--rate", str(rate), "--format", "raw", "--gil", "--nonblocking",
             "--full-filenames", "--output", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.rate = rate

    def stop(self) -> Profile:
        self.proc.send_signal(signal.SIGINT)  # py-spy writes what it sampled and exits
        _, err = self.proc.communicate(timeout=60)
        if not self.out.exists():
            raise RuntimeError(f"py-spy wrote no profile: {err.decode(errors='replace')[-500:]}")
        return Profile.read(self.out, self.rate)


@dataclass
class Profile:
    rate: int
    stacks: Counter = field(default_factory=Counter)  # tuple of (file, function) frames, root first → samples

    @classmethod
    def read(cls, path: Path, rate: int) -> Profile:
        profile = cls(rate)
        for line in path.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            frames = []
            for frame in stack.split(";"):
                m = _FRAME.match(frame)
                frames.append((m["file"], m["func"]) if m else ("", frame))
            profile.stacks[tuple(frames)] += int(count)
        return profile

    def ms(self, samples: int) -> float:
        return samples * 1000 / self.rate

    def total_ms(self) -> float:
        return self.ms(sum(self.stacks.values()))

    def part_ms(self, file_suffix: str, func: str) -> float:
        """Milliseconds with a frame of `func` in a file ending `file_suffix` anywhere on the stack."""
        return self.ms(sum(n for frames, n in self.stacks.items()
                           if any(f.endswith(file_suffix) and fn == func for f, fn in frames)))

    def self_ms(self) -> Counter:
        """Milliseconds by innermost frame ("function (file)")."""
        out: Counter = Counter()
        for frames, n in self.stacks.items():
            file, func = frames[-1] if frames else ("", "?")
            out[f"{func} ({_short(file)})"] += self.ms(n)
        return out


def _short(file: str) -> str:
    for marker in ("site-packages/", "/polar/", "/scripts/"):
        if marker in file:
            head = "polar/" if marker == "/polar/" else "scripts/" if marker == "/scripts/" else ""
            return head + file.split(marker, 1)[1]
    return file.rsplit("/", 1)[-1]


def growth(first: Profile, first_calls: int, last: Profile, last_calls: int, top: int = 8) -> list[tuple[str, float, float]]:
    """The functions whose own time per call grew most between two buckets: (function, ms/call first, last)."""
    a, b = first.self_ms(), last.self_ms()
    rows = [(name, a.get(name, 0.0) / first_calls, b.get(name, 0.0) / last_calls) for name in set(a) | set(b)]
    return sorted(rows, key=lambda r: r[2] - r[1], reverse=True)[:top]
