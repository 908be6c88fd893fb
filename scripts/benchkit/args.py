"""The command-line flags the benchmarks share, declared once."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

from benchkit.targets import DEFAULT_LITELLM, DEFAULT_TOKENIZER


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's parser, its module docstring as the help."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def tokenizer_arg(ap: argparse.ArgumentParser, help: str = "tokenizer dir for the scripted double") -> None:
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help=help)


def markdown_arg(ap: argparse.ArgumentParser, what: str = "table") -> None:
    ap.add_argument("--markdown", action="store_true", help=f"draw the {what} as Markdown (for docs/benchmarks.md)")


def load_args(ap: argparse.ArgumentParser, requests: int = 300, concurrency: Sequence[int] = (1, 16, 64, 256),
              what: str = "requests") -> None:
    """How many timed calls a cell gets (load.cell_requests), from how many concurrent clients."""
    ap.add_argument("--requests", type=int, default=requests,
                    help=f"timed {what} per target and concurrency (at least 4 per client are always sent)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=list(concurrency), help="concurrent clients")


def sync_arg(ap: argparse.ArgumentParser, default: str | Sequence[str] = ("FULL",)) -> None:
    """polar's capture commit mode: one (`default` a str) or several, side by side (a sequence)."""
    many = not isinstance(default, str)
    ap.add_argument("--sync", choices=["FULL", "NORMAL"], nargs="+" if many else None,
                    default=list(default) if many else default,
                    help=f"polar's capture commit mode{'(s), side by side' if many else ''} (polar_db_sync; FULL, "
                         "polar's default: an fsync per call; NORMAL survives a crash of polar but not of the machine)")


def common_args(ap: argparse.ArgumentParser) -> None:
    load_args(ap)
    ap.add_argument("--stream", choices=["no", "yes", "both"], default="both",
                    help="non-streamed and/or streamed calls")
    sync_arg(ap)
    tokenizer_arg(ap)
    markdown_arg(ap)


def litellm_args(ap: argparse.ArgumentParser) -> argparse._MutuallyExclusiveGroup:
    """The LiteLLM proxy to measure beside polar, or --no-litellm (in a group: other ways of leaving it out or
    adding another join it)."""
    ap.add_argument("--litellm", default=str(DEFAULT_LITELLM), help="the LiteLLM proxy's `litellm` executable")
    which = ap.add_mutually_exclusive_group()
    which.add_argument("--no-litellm", action="store_true", help="leave LiteLLM out")
    return which


def check_litellm(ap: argparse.ArgumentParser, args: argparse.Namespace, wanted: bool | None = None) -> None:
    """LiteLLM is there if the run wants it (`wanted`; by default: unless --no-litellm)."""
    if (not args.no_litellm if wanted is None else wanted) and not os.access(args.litellm, os.X_OK):
        ap.error(f"no LiteLLM proxy at {args.litellm}: run scripts/setup_litellm.sh (or pass --no-litellm)")


def rounds_arg(ap: argparse.ArgumentParser) -> None:
    """How run_matrix interleaves the targets."""
    ap.add_argument("--rounds", type=int, default=5,
                    help="each cell's requests in this many parts, the targets taking turns part by part")


def reference_args(ap: argparse.ArgumentParser) -> None:
    """The floors measured beside polar (`targets.reference_targets`)."""
    ap.add_argument("--mitmdump", action="store_true",
                    help="also plain `mitmdump` reverse-proxying direct's request (its default addons, no script)")
    ap.add_argument("--floor", action="store_true",
                    help="also polar's floors: its mitmproxy with a one-job addon answering from memory "
                         "('mitm answers') and relaying to the upstream over polar's upstream client ('mitm relay')")


DEFAULT_SIZES = ["1k", "4k", "16k", "64k", "128k"]


def parse_size(text: str) -> int:
    """A session size in tokens: 4096, or 4k (1k = 1024)."""
    text = text.strip().lower()
    try:
        return int(float(text[:-1]) * 1024) if text.endswith("k") else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 4k or 4096)") from None


def size_label(size: int) -> str:
    return f"{size // 1024}k" if size % 1024 == 0 else str(size)


def session_args(ap: argparse.ArgumentParser, sizes_help: str, nargs: str = "+") -> None:
    """Synthetic agent sessions (scripts/bench_tokens.py's SessionSynth): their sizes, calls and seed."""
    ap.add_argument("--sizes", type=parse_size, nargs=nargs, default=[parse_size(s) for s in DEFAULT_SIZES],
                    help=sizes_help)
    ap.add_argument("--turns", type=int, help="calls per session (default: 6 to 60, growing with the size)")
    ap.add_argument("--seed", type=int, default=7)


def check_sessions(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.turns is not None and args.turns < 2:
        ap.error("--turns must be at least 2 (the first call has no earlier turn to continue)")
    check_tokenizer(ap, args.tokenizer)


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.requests < 1 or min(args.concurrency) < 1 or getattr(args, "rounds", 1) < 1:
        ap.error("--requests, --concurrency and --rounds must be at least 1")
    check_tokenizer(ap, args.tokenizer)


def check_tokenizer(ap: argparse.ArgumentParser, tokenizer: str | Path) -> None:
    if not (Path(tokenizer) / "tokenizer.json").exists():
        ap.error(f"no tokenizer at {tokenizer} (build one: scripts/build_tiny_model.py --tokenizer-only)")


def polar_name(sync: str, syncs: list[str]) -> str:
    return "polar" if len(syncs) == 1 else f"polar {sync}"
