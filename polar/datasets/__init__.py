"""Datasets from rollout runs: chat rows for SFT, token rows, RL batch rows (docs/datasets.md).

    select.py   which trajectories are accepted; deterministic train/validation split
    chat.py     messages + tools rows, rebuilt from the captured calls; parse them back
    tokens.py   input_ids / labels / loss_mask / logprobs rows
    rl.py       GRPO groups with advantages; pulled live from the rollout service
    stats.py    what was selected and why not the rest
    export.py   the batch export (`polar export`)
"""

from polar.datasets.chat import ChatRowError, chat_row, load_chat, parse_chat_batch, parse_chat_row, rerender_mismatch
from polar.datasets.export import ExportConfig, ExportResult, export_dataset
from polar.datasets.rl import RLGroup, group_sizes, rl_group, rl_groups, stream_rl_groups
from polar.datasets.select import Candidate, Selection, assign_splits, select, split
from polar.datasets.source import CaptureSource, ExportError, RolloutSource, SourceError
from polar.datasets.tokens import IGNORE_INDEX, token_row

__all__ = [
    "IGNORE_INDEX",
    "Candidate",
    "CaptureSource",
    "ChatRowError",
    "ExportConfig",
    "ExportError",
    "ExportResult",
    "RLGroup",
    "RolloutSource",
    "Selection",
    "SourceError",
    "assign_splits",
    "chat_row",
    "export_dataset",
    "group_sizes",
    "load_chat",
    "parse_chat_batch",
    "parse_chat_row",
    "rerender_mismatch",
    "rl_group",
    "rl_groups",
    "select",
    "split",
    "stream_rl_groups",
    "token_row",
]
