"""polar as a NeMo Gym agent: `POST /run` → a polar rollout task → its scored trajectory, token for token.

NeMo Gym (and NeMo RL through it) collects a rollout by posting a dataset row to an agent's `/run`
and reads back a `BaseVerifyResponse`: the `response` whose output items carry `prompt_token_ids`,
`generation_token_ids` and `generation_log_probs`, and the `reward`. `PolarAgent` answers `/run`
by submitting the row as a polar task (`TaskSpec`) to a rollout service (`polar rollout serve`),
waiting for that session's result, and returning:

- one assistant output item per model call of the session's main trajectory, in call order: the
  call's prompt ids exactly as polar sent them, its sampled ids and their logprobs, as captured.
  Each prompt extends the previous item's prompt + generation (NeMo RL's contiguity requirement),
  because a prefix-merge trajectory is one token sequence;
- `reward`: the polar evaluator's reward, or null with a `_ng_failure_class` when the session has
  none (it failed, or was stale or cancelled), never a made-up 0.0; the session's outcome, ids and
  the trajectories not shown as items (sub-agents, forks, a broken prefix) ride along as `polar_*`
  fields.

A row names its task in `polar_task` (any `TaskSpec` field; `python -m polar.adapters.nemo_gym rows
tasks.jsonl` converts a polar tasks file), on top of the agent config's `task_defaults`; without an
`instruction` the last user message of `responses_create_params.input` is the instruction. Rows that
are the same prompt sampled again (a GRPO group: NeMo Gym's `num_repeats`, NeMo RL's generations per
prompt) share one polar task of `group_size` samples.

This module imports nemo_gym: it runs in the NeMo Gym venv (scripts/setup_nemo_gym.sh); the server
starts from NeMo Gym's launcher (`data/nemo_gym/responses_api_agents/polar_agent`) or
`python -m polar.adapters.nemo_gym serve` with NeMo Gym's config environment.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click
from fastapi import Body, HTTPException
from nemo_gym.base_resources_server import BaseRunRequest, BaseVerifyResponse
from nemo_gym.base_responses_api_agent import BaseResponsesAPIAgentConfig, SimpleResponsesAPIAgent
from nemo_gym.openai_utils import (
    NeMoGymResponse,
    NeMoGymResponseCreateParamsNonStreaming,
    NeMoGymResponseInputTokensDetails,
    NeMoGymResponseOutputMessage,
    NeMoGymResponseOutputMessageForTraining,
    NeMoGymResponseOutputText,
    NeMoGymResponseOutputTokensDetails,
    NeMoGymResponseUsage,
)
from pydantic import ConfigDict, Field, PrivateAttr, ValidationError

from polar.adapters.rollout_link import RolloutLink, RolloutServiceError
from polar.rollout.tasks import SessionResult, TaskSpec, load_tasks
from polar.trajectories.model import Trajectory

# Row fields that differ between the samples of one GRPO group (NeMo Gym's rollout index, NeMo RL's
# row index): left out of the group key.
PER_SAMPLE_FIELDS = ("_ng_rollout_index", "_rowidx")

# NeMo Gym's rollout collection routes a result carrying these to its failures file, not the rollouts.
FAILURE_CLASS = {"error": "transient", "stale": "skipped", "cancelled": "skipped"}
# A session that ended without a reward: a failure too, never a real 0.0 (it would bias the group's
# advantages and the reward means).
NO_REWARD_CLASS = "transient"
# A trajectory some of whose calls came back without logprobs: NeMo RL needs generation_log_probs for
# every sampled token, and polar never invents them, so the rollout is a failure with the reason.
NO_LOGPROBS_CLASS = "transient"


def no_logprobs_error(trajectory: Trajectory | None) -> str | None:
    if trajectory is None or trajectory.has_logprobs:
        return None
    return (f"the upstream returned no logprobs for {trajectory.turns_without_logprobs} of the trajectory's "
            f"{len(trajectory.turns)} calls: nothing to train on (polar never invents them)")


class PolarAgentConfig(BaseResponsesAPIAgentConfig):
    rollout_url: str = "http://127.0.0.1:8090"  # `polar rollout serve`
    rollout_token: str | None = None  # its bearer token, when bound beyond loopback
    # TaskSpec fields every task starts from (harness, runtime, evaluator, timeout, model, ...).
    task_defaults: dict[str, Any] = Field(default_factory=dict)
    group_size: int = Field(default=1, ge=1, le=1024)  # set to num_repeats / generations per prompt
    result_timeout: float = Field(default=3600.0, gt=0)  # seconds a /run waits for its session
    tokenizer: str | None = None  # tokenizer dir of the served model: items then carry the decoded text
    ack: bool = True  # mark delivered results drained on the rollout service


class PolarRunRequest(BaseRunRequest):
    model_config = ConfigDict(extra="allow")

    polar_task: dict[str, Any] = Field(default_factory=dict)  # TaskSpec fields for this row


class PolarVerifyResponse(BaseVerifyResponse):
    model_config = ConfigDict(extra="allow")

    reward: float | None  # None: no reward was given; the response then carries `_ng_failure_class`
    polar_session_id: str
    polar_task_id: str
    polar_outcome: str
    polar_error: str | None = None
    polar_trajectory_id: str | None = None  # the trajectory shown as output items
    polar_other_trajectories: list[str] = Field(default_factory=list)  # in the rollout state, not shown


# -- rows → tasks ------------------------------------------------------------------------------


def instruction_of(params: NeMoGymResponseCreateParamsNonStreaming) -> str | None:
    """The text of the last user message of a Responses API input."""
    if isinstance(params.input, str):
        return params.input
    for item in reversed(params.input):
        if getattr(item, "role", None) != "user":
            continue
        content = item.content
        if isinstance(content, str):
            return content
        return "".join(part.get("text", "") if isinstance(part, dict) else getattr(part, "text", "")
                       for part in content)
    return None


def task_for(row: PolarRunRequest, defaults: dict[str, Any], samples: int) -> TaskSpec:
    """The polar task a row asks for: defaults, then the row's `polar_task`, under a fresh id."""
    fields = {**defaults, **row.polar_task}
    fields.setdefault("instruction", instruction_of(row.responses_create_params))
    if not fields["instruction"]:
        raise ValueError("the row names no instruction: give polar_task.instruction or a user message")
    # Task ids are unique per service: keep the row's name for reading, make each submission distinct.
    fields["id"] = f"{fields.get('id') or 'nemo-gym'}-{secrets.token_hex(6)}"
    fields["samples"] = samples
    return TaskSpec.model_validate(fields)


def group_key(row: PolarRunRequest) -> str:
    """Equal for the samples of one prompt, whatever per-sample bookkeeping NeMo Gym or NeMo RL adds."""
    fields = {k: v for k, v in row.model_dump(mode="json").items() if k not in PER_SAMPLE_FIELDS}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


# -- results → NeMo Gym responses --------------------------------------------------------------


def main_trajectory(result: SessionResult) -> Trajectory | None:
    """The session's main conversation: the trajectory with the most turns (then sampled tokens).
    Sub-agents, title generators and forks are separate, usually shorter, trajectories."""
    if not result.trajectories:
        return None
    return max(result.trajectories, key=lambda t: (len(t.turns), t.trainable_tokens))


Decode = Callable[[list[int]], str]


def training_items(trajectory: Trajectory, decode: Decode) -> list[NeMoGymResponseOutputMessageForTraining]:
    """One assistant item per call: everything the call saw as its prompt, what it sampled, logprobs."""
    items = []
    for turn in trajectory.turns:
        sampled = trajectory.token_ids[turn.completion_start:turn.completion_end]
        items.append(NeMoGymResponseOutputMessageForTraining(
            id=f"msg_{turn.call_id}",
            content=[NeMoGymResponseOutputText(text=decode(sampled), annotations=[])],
            status="incomplete" if turn.truncated else "completed",
            prompt_token_ids=trajectory.token_ids[:turn.completion_start],
            generation_token_ids=sampled,
            generation_log_probs=trajectory.logprobs[turn.completion_start:turn.completion_end],
        ))
    return items


def to_response(result: SessionResult, params: NeMoGymResponseCreateParamsNonStreaming,
                decode: Decode) -> NeMoGymResponse:
    trajectory = main_trajectory(result)
    missing = no_logprobs_error(trajectory)
    items: list[Any] = training_items(trajectory, decode) if trajectory and not missing else []
    if not items:  # nothing to train on (the harness failed first, or no logprobs): say why
        note = f"polar session {result.session_id} ended '{result.outcome}' without a model call"
        note += f": {result.error}" if result.error else ""
        if missing:
            note = f"polar session {result.session_id}: {missing}"
        items = [NeMoGymResponseOutputMessage(id=f"msg_{result.session_id}",
                                              content=[NeMoGymResponseOutputText(text=note, annotations=[])])]
    prompt_tokens = sum(len(i.prompt_token_ids) for i in items if hasattr(i, "prompt_token_ids"))
    sampled_tokens = sum(len(i.generation_token_ids) for i in items if hasattr(i, "generation_token_ids"))
    return NeMoGymResponse(
        id=f"resp_{result.session_id}",
        created_at=int(time.time()),
        model=params.model or "polar-policy",
        object="response",
        output=items,
        tool_choice=params.tool_choice,
        tools=params.tools,
        parallel_tool_calls=params.parallel_tool_calls,
        incomplete_details={"reason": "max_output_tokens"} if trajectory and trajectory.truncated else None,
        usage=NeMoGymResponseUsage(
            input_tokens=prompt_tokens,
            input_tokens_details=NeMoGymResponseInputTokensDetails(cached_tokens=0),
            output_tokens=sampled_tokens,
            output_tokens_details=NeMoGymResponseOutputTokensDetails(reasoning_tokens=0),
            total_tokens=prompt_tokens + sampled_tokens,
        ),
    )


def verify_response(row: PolarRunRequest, result: SessionResult, decode: Decode) -> dict[str, Any]:
    """The /run answer: the row, the response, the reward and polar's bookkeeping."""
    trajectory = main_trajectory(result)
    failure = FAILURE_CLASS.get(result.outcome) or (NO_REWARD_CLASS if result.reward is None else None)
    error = result.error
    if result.reward is None and error is None:
        error = f"polar session ended '{result.outcome}' without a reward"
    if (missing := no_logprobs_error(trajectory)) is not None:
        failure, error = failure or NO_LOGPROBS_CLASS, error or missing
    payload = PolarVerifyResponse.model_validate({
        **row.model_dump(mode="json"),
        "response": to_response(result, row.responses_create_params, decode).model_dump(mode="json"),
        "reward": result.reward,
        "polar_session_id": result.session_id,
        "polar_task_id": result.task_id,
        "polar_outcome": result.outcome,
        "polar_error": error,
        "polar_trajectory_id": trajectory.id if trajectory else None,
        "polar_other_trajectories": [t.id for t in result.trajectories if t is not trajectory],
    }).model_dump(mode="json")
    if failure is not None:
        payload["_ng_failure_class"] = failure
    return payload


def load_decoder(tokenizer_dir: str | None) -> Decode:
    """Sampled ids → text with the served model's tokenizer; without one, items carry no text."""
    if not tokenizer_dir:
        return lambda ids: ""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(Path(tokenizer_dir) / "tokenizer.json"))
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=False)


# -- the agent server --------------------------------------------------------------------------


class PolarAgent(SimpleResponsesAPIAgent):
    config: PolarAgentConfig
    _link: RolloutLink | None = PrivateAttr(default=None)
    _decoder: Decode | None = PrivateAttr(default=None)

    @property
    def link(self) -> RolloutLink:
        # Made on first use: its HTTP client and result follower belong to the server's event loop.
        if self._link is None:
            self._link = RolloutLink(self.config.rollout_url, self.config.rollout_token, ack=self.config.ack)
        return self._link

    def decode(self, ids: list[int]) -> str:
        if self._decoder is None:
            self._decoder = load_decoder(self.config.tokenizer)
        return self._decoder(ids)

    async def run(self, body: PolarRunRequest = Body()) -> PolarVerifyResponse:
        result = await self._rollout(body, group_key(body), self.config.group_size)
        return verify_response(body, result, self.decode)

    async def responses(self, body: NeMoGymResponseCreateParamsNonStreaming = Body()) -> NeMoGymResponse:
        """The response alone (no reward): a one-off rollout of the input's last user message."""
        row = PolarRunRequest(responses_create_params=body)
        result = await self._rollout(row, secrets.token_hex(8), 1)
        return to_response(result, body, self.decode)

    async def _rollout(self, row: PolarRunRequest, key: str, samples: int) -> SessionResult:
        try:
            task = task_for(row, self.config.task_defaults, samples)
        except (ValueError, ValidationError) as exc:
            raise HTTPException(status_code=400, detail=f"not a polar task: {exc}") from exc
        try:
            session_id = await self.link.claim_session(key, task)
        except RolloutServiceError as exc:
            raise HTTPException(status_code=502, detail=str(exc)) from exc
        try:
            return await asyncio.wait_for(self.link.result(session_id), self.config.result_timeout)
        except TimeoutError as exc:
            detail = f"polar session {session_id} gave no result within {self.config.result_timeout:.0f}s"
            raise HTTPException(status_code=504, detail=detail) from exc


# -- command line ------------------------------------------------------------------------------


@click.group()
def cli() -> None:
    """polar's NeMo Gym agent."""


@cli.command()
def serve() -> None:
    """Run the agent server from NeMo Gym's config environment (as NeMo Gym's launcher does)."""
    PolarAgent.run_webserver()


@cli.command()
@click.argument("tasks_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--agent", default="polar_agent", show_default=True, help="agent_ref name stamped on each row.")
def rows(tasks_file: str, agent: str) -> None:
    """Convert a polar tasks file (JSONL) into NeMo Gym dataset rows on stdout.

    Paths become absolute (the rollout service reads them) and `samples` is left to NeMo Gym:
    sample each row with num_repeats = the agent's group_size."""
    for task in load_tasks(tasks_file):
        fields = task.model_dump(mode="json", exclude={"samples"})
        row = {"responses_create_params": {"input": [{"role": "user", "content": task.instruction}]},
               "polar_task": fields, "agent_ref": {"type": "responses_api_agents", "name": agent}}
        sys.stdout.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    cli()
