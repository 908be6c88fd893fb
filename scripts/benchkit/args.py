"""The command-line flags the benchmarks share, declared once."""

from __future__ import annotations

import argparse
from pathlib import Path

from benchkit.targets import DEFAULT_TOKENIZER


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark's parser, its module docstring as the help."""
    return argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)


def tokenizer_arg(ap: argparse.ArgumentParser, help: str = "tokenizer dir for the scripted double") -> None:
    ap.add_argument("--tokenizer", default=str(DEFAULT_TOKENIZER), help=help)


def markdown_arg(ap: argparse.ArgumentParser, what: str = "table") -> None:
    ap.add_argument("--markdown", action="store_true", help=f"draw the {what} as Markdown (for docs/benchmarks.md)")


def common_args(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--requests", type=int, default=300,
                    help="timed requests per cell (at least 4 per client are always sent)")
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64, 256], help="concurrent clients")
    ap.add_argument("--stream", choices=["no", "yes", "both"], default="both",
                    help="non-streamed and/or streamed calls")
    ap.add_argument("--sync", choices=["FULL", "NORMAL"], nargs="+", default=["FULL"],
                    help="polar's capture commit mode(s), one polar column each (polar_db_sync; FULL is the "
                         "default: an fsync per call; NORMAL survives a crash of polar but not of the machine)")
    tokenizer_arg(ap)
    markdown_arg(ap)


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


def check_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.requests < 1 or min(args.concurrency) < 1 or getattr(args, "rounds", 1) < 1:
        ap.error("--requests, --concurrency and --rounds must be at least 1")
    check_tokenizer(ap, args.tokenizer)


def check_tokenizer(ap: argparse.ArgumentParser, tokenizer: str | Path) -> None:
    if not (Path(tokenizer) / "tokenizer.json").exists():
        ap.error(f"no tokenizer at {tokenizer} (build one: scripts/build_tiny_model.py --tokenizer-only)")


def polar_name(sync: str, syncs: list[str]) -> str:
    return "polar" if len(syncs) == 1 else f"polar {sync}"
