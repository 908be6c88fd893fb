"""The trajectory format: what a trainer reads, one row per trajectory, with no further lookups.

A trajectory is one token sequence with a loss mask. Every position is either *sampled* (the
policy produced it: `loss_mask` 1, `logprobs` the sampling logprob) or *context* (system prompt,
user and tool messages, template glue, or a prefix inherited from a parent trajectory:
`loss_mask` 0, `logprobs` 0.0). Masked positions hold 0.0 rather than null so the three arrays
load as dense tensors of one length. A call whose upstream gave no logprobs holds None on its
sampled span (its turn says `has_logprobs=False`): an invented 0.0 would read as probability 1 to
an importance-sampling trainer, so such spans stay visibly missing.

`turns` cut the sequence into the calls that built it. Call i saw `token_ids[:turns[i].completion_start]`
as its prompt; of that, `[prompt_start, completion_start)` is what the trajectory added before it
(the whole prompt for a root's first turn, tool results and glue later, everything after the fork
point for a fork's first turn), and `[completion_start, completion_end)` is what it sampled.

Lineage makes a session a tree: a fork repeats its parent's tokens up to `fork_position` (masked,
so each sampled token is trainable in exactly one trajectory) and continues from there.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from polar.capture.schema import policy_step

Builder = Literal["per-request", "prefix-merge"]
# The trainer's step a call was sampled under. Trajectories stored before it was an int (a rollout state's results)
# held there, when the trainer had given none, the upstream's label for its weights: that reads as no step.
PolicyVersion = Annotated[int | None, BeforeValidator(lambda v: policy_step(v) if isinstance(v, str) else v)]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Turn(_Model):
    """One captured call inside a trajectory (offsets index `Trajectory.token_ids`)."""

    row_id: int  # capture row (`calls.id`)
    call_id: str  # public call id the client saw in its response ids
    prompt_start: int
    completion_start: int
    completion_end: int
    finish_reason: str | None = None
    prompt_mode: str | None = None  # how the gateway built this call's prompt
    policy_version: PolicyVersion = None
    has_logprobs: bool = True  # False: the upstream gave no logprobs; the span holds None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


class Lineage(_Model):
    """Where a fork attaches: it continues `parent_id` after `parent_row_id`, at `fork_position`."""

    parent_id: str
    parent_row_id: int
    fork_position: int  # tokens [0, fork_position) are the parent's, masked here


class PrefixBreak(_Model):
    """The first call of this trajectory meant to continue `earlier_row_id`, but its prompt does not
    repeat that call's prompt + completion.

    `position` is the first index where they differ; `actual_id` is None when the prompt simply
    ended before it (history was dropped). A fork can carry a break: its prompt kept the tokens up
    to the fork point and left the call it continued after it.
    """

    earlier_row_id: int
    earlier_trajectory_id: str
    position: int
    expected_id: int
    actual_id: int | None
    evidence: Literal["conversation", "previous_response_id", "tokens"]  # why it counts as a continuation


class Trajectory(_Model):
    id: str
    builder: Builder
    session_id: str
    task: str | None = None  # filled by whoever knows which task the session ran
    metadata: dict[str, Any] = Field(default_factory=dict)
    lineage: Lineage | None = None
    token_ids: list[int]
    loss_mask: list[int]  # 1 on sampled tokens, 0 elsewhere
    logprobs: list[float | None]  # sampling logprob on sampled tokens (None: not captured), 0.0 elsewhere
    turns: list[Turn]
    reward: float | None = None  # set by an evaluator
    step_rewards: list[float | None] | None = None  # optional, one per turn
    policy_version: PolicyVersion = None  # when every turn agrees on one; else see the turns
    truncated: bool = False  # some turn stopped at the token limit
    broken_prefix: bool = False  # see `prefix_break`
    prefix_break: PrefixBreak | None = None
    partial: bool = False  # the conversation went on in calls that failed (`failed_row_ids`)
    failed_row_ids: list[int] = Field(default_factory=list)

    @model_validator(mode="after")
    def _aligned(self) -> Trajectory:
        n = len(self.token_ids)
        if len(self.loss_mask) != n or len(self.logprobs) != n:
            lengths = f"{n}, {len(self.loss_mask)}, {len(self.logprobs)}"
            raise ValueError(f"token_ids, loss_mask and logprobs differ in length ({lengths})")
        if self.step_rewards is not None and len(self.step_rewards) != len(self.turns):
            raise ValueError(f"step_rewards has {len(self.step_rewards)} entries for {len(self.turns)} turns")
        return self

    @property
    def trainable_tokens(self) -> int:
        return sum(self.loss_mask)

    @property
    def has_logprobs(self) -> bool:
        """Every sampled turn carries its logprobs."""
        return all(t.has_logprobs for t in self.turns)

    @property
    def turns_without_logprobs(self) -> int:
        return sum(not t.has_logprobs for t in self.turns)

    def sampled_logprobs(self) -> list[float]:
        """The captured logprobs of sampled tokens, in order; tokens without one are left out."""
        return [lp for lp, m in zip(self.logprobs, self.loss_mask) if m and lp is not None]

    def sampled_ids(self) -> list[int]:
        """The sampled tokens in order (what the loss is computed on)."""
        return [t for t, m in zip(self.token_ids, self.loss_mask) if m]
