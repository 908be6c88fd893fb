"""Token-format rows: exactly the ids the policy saw and sampled, ready for a trainer's collator.

One row per trajectory. `input_ids` is the trajectory's token sequence as captured (prompt ids and
sampled ids of every turn, never re-tokenised); `labels` repeats it with -100 wherever nothing is
trained (the convention of Hugging Face's loss functions); `loss_mask` is 1 on sampled tokens;
`logprobs` holds the sampling logprob there and 0.0 elsewhere. All four have the same length.
A turn whose upstream gave no logprobs has null on its sampled span, never 0.0 (which would read
as probability 1); `has_logprobs` is false on such a row and on the turn.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from polar.datasets.select import IDENTITY_COLUMNS, VERIFY_COLUMNS, Candidate

IGNORE_INDEX = -100  # labels value for positions the loss skips

_TURN = pa.struct([
    ("call_id", pa.string()),
    ("prompt_start", pa.int32()),
    ("completion_start", pa.int32()),
    ("completion_end", pa.int32()),
    ("finish_reason", pa.string()),
    ("policy_version", pa.int64()),
    ("has_logprobs", pa.bool_()),
])
SCHEMA = pa.schema([
    *IDENTITY_COLUMNS,
    ("policy_version", pa.int64()),  # the trainer's step every turn was sampled under (null when they differ)
    ("trainer_policy_version", pa.int64()),  # the trainer's version when the session started
    ("input_ids", pa.list_(pa.int32())),
    ("labels", pa.list_(pa.int32())),
    ("loss_mask", pa.list_(pa.int8())),
    ("logprobs", pa.list_(pa.float32())),  # null on sampled tokens whose logprob was not captured
    ("has_logprobs", pa.bool_()),  # every turn's logprobs were captured
    ("num_tokens", pa.int32()),
    ("num_trainable", pa.int32()),
    ("num_turns", pa.int32()),
    ("turns", pa.list_(_TURN)),
    ("truncated", pa.bool_()),
    ("broken_prefix", pa.bool_()),
    ("parent_trajectory_id", pa.string()),  # forks: the trajectory whose first tokens this one repeats (masked)
    *VERIFY_COLUMNS,
])


def token_row(c: Candidate) -> dict[str, Any]:
    t, r = c.trajectory, c.result
    return {
        **c.identity(),
        "policy_version": t.policy_version,
        "trainer_policy_version": r.policy_version,
        "input_ids": list(t.token_ids),
        "labels": [tok if m else IGNORE_INDEX for tok, m in zip(t.token_ids, t.loss_mask)],
        "loss_mask": list(t.loss_mask),
        "logprobs": list(t.logprobs),
        "has_logprobs": t.has_logprobs,
        "num_tokens": len(t.token_ids),
        "num_trainable": t.trainable_tokens,
        "num_turns": len(t.turns),
        "turns": [{"call_id": u.call_id, "prompt_start": u.prompt_start, "completion_start": u.completion_start,
                   "completion_end": u.completion_end, "finish_reason": u.finish_reason,
                   "policy_version": u.policy_version, "has_logprobs": u.has_logprobs} for u in t.turns],
        "truncated": t.truncated,
        "broken_prefix": t.broken_prefix,
        "parent_trajectory_id": t.lineage.parent_id if t.lineage else None,
        "verification": c.verification,
        "verify_max_abs_diff": c.verify_max_abs_diff,
    }


def features():
    """The token rows' `datasets.Features` (for `load_dataset("json", ..., features=features())`:
    JSON carries no types, so a column null in every row of a file would otherwise load as null)."""
    from datasets import Features

    return Features.from_arrow_schema(SCHEMA)
