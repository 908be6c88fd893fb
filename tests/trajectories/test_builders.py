"""per_request and prefix_merge on crafted capture stores, and one real session through polar."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from polar.trajectories import drift_report, per_request, prefix_merge, summary
from tests.trajectories.crafted import STEPS, conversation, run_openai_session

SYSTEM = list(range(100, 140))  # a shared system prompt + tool list, 40 tokens


def _seq(prompt: list[int], completion: list[int]) -> list[int]:
    return prompt + completion


def _linear(recorder, session: str = "s", turns: int = 4, task: str = "fix the bug", base: int = 1000) -> list[int]:
    """A token-faithful tool loop: each prompt = previous prompt + sample + a tool result."""
    prompt, rows = SYSTEM + [base, base + 1], []
    for k in range(turns):
        completion = [base + 100 + 10 * k + i for i in range(3)] + [2]
        rows.append(recorder.call(session, prompt, completion, conversation(task, k)))
        prompt = _seq(prompt, completion) + [base + 50 + k] * 2
    return rows


def _assert_every_sample_once(rows, trajectories):
    samples = [r["id"] for r in rows if r["status"] == "ok" and r["prompt_len"] is not None]
    placed = [t.row_id for traj in trajectories for t in traj.turns]
    assert sorted(placed) == sorted(samples)


def _assert_aligned(traj, rows_by_id):
    """Sampled spans hold exactly the captured ids and logprobs (None where none were captured);
    everything else is masked at 0.0."""
    mask = [0] * len(traj.token_ids)
    for turn in traj.turns:
        row = rows_by_id[turn.row_id]
        assert traj.token_ids[: turn.completion_start] == row["prompt_ids"]
        assert traj.token_ids[turn.completion_start : turn.completion_end] == row["completion_ids"]
        n = turn.completion_end - turn.completion_start
        assert traj.logprobs[turn.completion_start : turn.completion_end] == (row["completion_logprobs"] or [None] * n)
        assert turn.has_logprobs == (row["completion_logprobs"] is not None)
        mask[turn.completion_start : turn.completion_end] = [1] * (turn.completion_end - turn.completion_start)
    assert traj.loss_mask == mask
    assert all(lp == 0.0 for lp, m in zip(traj.logprobs, traj.loss_mask) if not m)


def test_linear_session_is_one_trajectory(recorder):
    ids = _linear(recorder, turns=5)
    rows = recorder.rows()
    (traj,) = prefix_merge(rows)
    assert [t.row_id for t in traj.turns] == ids
    assert traj.id == f"s#{ids[0]}" and traj.builder == "prefix-merge" and traj.lineage is None
    assert not (traj.broken_prefix or traj.truncated or traj.partial)
    by_id = {r["id"]: r for r in rows}
    _assert_aligned(traj, by_id)
    assert traj.sampled_ids() == [t for r in rows for t in r["completion_ids"]]
    # each later turn's prompt span is just the tool result the trajectory added
    assert [t.completion_start - t.prompt_start for t in traj.turns] == [42, 2, 2, 2, 2]
    assert traj.trainable_tokens == 5 * 4 and traj.metadata["model"] == "test-model"


def test_per_request_gives_one_row_per_sample(recorder):
    _linear(recorder, turns=3)
    recorder.count_tokens("s")
    recorder.fail("s", conversation("fix the bug", 3))
    rows = recorder.rows()
    per_call = per_request(rows)
    assert len(per_call) == 3 and len(prefix_merge(rows)) == 1
    by_id = {r["id"]: r for r in rows}
    for traj in per_call:
        (turn,) = traj.turns
        assert traj.builder == "per-request" and turn.prompt_start == 0
        assert traj.token_ids == by_id[turn.row_id]["prompt_ids"] + by_id[turn.row_id]["completion_ids"]
        _assert_aligned(traj, by_id)
    counts = summary(rows, per_call)
    assert counts == {"sessions": 1, "calls": 5, "samples": 3, "failed": 1, "trajectories": 3, "trainable_tokens": 12,
                      "turns_without_logprobs": 0}


def test_interleaved_sub_agent_becomes_its_own_lineage(recorder):
    """A sub-agent shares the system prompt but opens differently: a second root, not a break."""
    main, sub, main_ids, sub_ids = SYSTEM + [1, 2], SYSTEM + [7, 7, 7], [], []
    for k in range(3):
        c_main, c_sub = [10 + k, 2], [70 + k, 2]
        main_ids.append(recorder.call("s", main, c_main, conversation("main task", k)))
        sub_ids.append(recorder.call("s", sub, c_sub, conversation("sub task", k)))
        main, sub = main + c_main + [3], sub + c_sub + [8]
    rows = recorder.rows()
    a, b = prefix_merge(rows)
    assert [t.row_id for t in a.turns] == main_ids and [t.row_id for t in b.turns] == sub_ids
    assert not a.broken_prefix and not b.broken_prefix and a.lineage is None and b.lineage is None
    _assert_every_sample_once(rows, [a, b])


def test_fork_records_parent_and_fork_point(recorder):
    """Calls that extend an earlier, non-last call branch off: a tree, each sample trained once."""
    p1 = SYSTEM + [1]
    r1 = recorder.call("s", p1, [11, 2], conversation("t", 0))
    p2 = p1 + [11, 2, 5]
    r2 = recorder.call("s", p2, [12, 2], conversation("t", 1))
    r3 = recorder.call("s", p2 + [12, 2, 6], [13, 2], conversation("t", 2))
    r4 = recorder.call("s", p2 + [12, 2, 7], [14, 2], conversation("t", 2))  # another tool output after r2
    r5 = recorder.call("s", p1 + [11, 2, 8], [15, 2], conversation("t", 1))  # and after r1
    rows = recorder.rows()
    main, fork, fork2 = prefix_merge(rows)
    assert [t.row_id for t in main.turns] == [r1, r2, r3]
    assert [t.row_id for t in fork.turns] == [r4] and [t.row_id for t in fork2.turns] == [r5]
    at = len(p2) + 2
    assert (fork.lineage.parent_id, fork.lineage.parent_row_id, fork.lineage.fork_position) == (main.id, r2, at)
    assert (fork2.lineage.parent_row_id, fork2.lineage.fork_position) == (r1, len(p1) + 2)
    assert fork.token_ids[:at] == main.token_ids[:at] and fork.turns[0].prompt_start == at
    assert fork.sampled_ids() == [14, 2]  # the inherited samples are context here
    assert not fork.broken_prefix and not fork2.broken_prefix
    _assert_aligned(fork, {r["id"]: r for r in rows})
    _assert_every_sample_once(rows, [main, fork, fork2])


def test_join_prefers_the_deepest_tip(recorder):
    """After a fork, a call extending the fork's tip joins the fork, not the main line."""
    p1 = SYSTEM + [1]
    recorder.call("s", p1, [11, 2], conversation("t", 0))
    recorder.call("s", p1 + [11, 2, 5], [12, 2], conversation("t", 1))
    fork_row = recorder.call("s", p1 + [11, 2, 6], [13, 2], conversation("t", 1))
    later = recorder.call("s", p1 + [11, 2, 6, 13, 2, 7], [14, 2], conversation("t", 2))
    main, fork = prefix_merge(recorder.rows())
    assert [t.row_id for t in fork.turns] == [fork_row, later] and len(main.turns) == 2


def test_broken_prefix_starts_a_new_trajectory_and_says_where(recorder):
    p1 = SYSTEM + [1, 2]
    r1 = recorder.call("s", p1, [11, 12, 13, 2], conversation("t", 0), mode="chat-template")
    # The harness re-rendered the sample: token 12 came back as 99 (a different BPE split, say).
    p2 = p1 + [11, 99, 13, 2, 5]
    r2 = recorder.call("s", p2, [21, 2], conversation("t", 1), mode="chat-template")
    r3 = recorder.call("s", p2 + [21, 2, 6], [31, 2], conversation("t", 2), mode="chat-template")
    rows = recorder.rows()
    first, second = prefix_merge(rows)
    assert [t.row_id for t in first.turns] == [r1] and [t.row_id for t in second.turns] == [r2, r3]
    assert second.broken_prefix and not first.broken_prefix
    brk = second.prefix_break
    assert (brk.earlier_row_id, brk.earlier_trajectory_id, brk.evidence) == (r1, first.id, "conversation")
    assert (brk.position, brk.expected_id, brk.actual_id) == (len(p1) + 1, 12, 99)
    assert second.sampled_ids() == [21, 2, 31, 2]  # the re-rendered 99 is context, never trained
    _assert_every_sample_once(rows, [first, second])


def test_rerendering_only_the_last_sample_is_a_fork_that_breaks(recorder):
    """The Qwen3-hybrid pattern: only the latest assistant turn comes back changed, so the prompt
    still extends the call before it (the fork point) but breaks against the call it continued."""
    p1 = SYSTEM + [1]
    r1 = recorder.call("s", p1, [11, 2], conversation("t", 0))
    p2 = p1 + [11, 2, 5]
    r2 = recorder.call("s", p2, [50, 51, 12, 2], conversation("t", 1))  # 50 51: an empty think block
    r3 = recorder.call("s", p2 + [12, 2, 6], [13, 2], conversation("t", 2))  # …that the re-render dropped
    main, fork = prefix_merge(recorder.rows())
    assert [t.row_id for t in main.turns] == [r1, r2] and [t.row_id for t in fork.turns] == [r3]
    assert fork.lineage.parent_row_id == r1 and fork.lineage.fork_position == len(p1) + 2
    brk = fork.prefix_break
    assert fork.broken_prefix and (brk.earlier_row_id, brk.position, brk.expected_id, brk.actual_id) == (r2, len(p2), 50, 12)
    assert fork.sampled_ids() == [13, 2]


def test_break_evidence_without_canonical_needs_a_long_shared_prefix(recorder):
    p1 = SYSTEM + [1]
    r1 = recorder.call("s", p1, [11, 2])
    recorder.call("s", SYSTEM[:10] + [5, 5], [21, 2])  # shares 10 tokens: just another conversation
    r3 = recorder.call("s", p1 + [12, 2, 3], [31, 2])  # shares 41: meant to continue r1
    _, b, c = prefix_merge(recorder.rows())
    assert not b.broken_prefix
    assert c.prefix_break.evidence == "tokens" and c.prefix_break.earlier_row_id == r1
    assert c.prefix_break.position == len(p1) and c.turns[0].row_id == r3


@pytest.mark.parametrize("stored_as", ["continues", "metadata"])  # metadata: captures made before `continues`
def test_previous_response_id_is_evidence_of_continuation(recorder, stored_as):
    r1 = recorder.call("s", SYSTEM + [1], [11, 2], conversation("t", 0))
    # Only the new messages travel with previous_response_id; the prompt was rebuilt differently.
    previous = f"resp_c{r1:04d}"
    where = {"continues": previous} if stored_as == "continues" else {"metadata": {"previous_response_id": previous}}
    r2 = recorder.call("s", SYSTEM + [1, 3], [21, 2], [{"role": "tool", "content": [{"text": "out"}]}], **where)
    _, second = prefix_merge(recorder.rows())
    assert second.prefix_break.evidence == "previous_response_id" and second.prefix_break.earlier_row_id == r1
    assert second.prefix_break.position == len(SYSTEM) + 1 and second.turns[0].row_id == r2


def test_a_resample_of_the_same_prompt_is_a_sibling_not_a_break(recorder):
    prompt = SYSTEM + [1]
    recorder.call("s", prompt, [11, 2], conversation("t", 0))
    recorder.call("s", prompt, [12, 2], conversation("t", 0))
    _, b = prefix_merge(recorder.rows())
    assert b.lineage is None and not b.broken_prefix


def test_truncated_turn_is_flagged_and_the_session_goes_on(recorder):
    p1 = SYSTEM + [1]
    r1 = recorder.call("s", p1, [11, 12, 13], conversation("t", 0), finish="length")
    r2 = recorder.call("s", p1 + [11, 12, 13, 4], [21, 2], conversation("t", 1))
    (traj,) = prefix_merge(recorder.rows())
    assert traj.truncated and [t.truncated for t in traj.turns] == [True, False]
    assert [t.row_id for t in traj.turns] == [r1, r2] and traj.sampled_ids() == [11, 12, 13, 21, 2]


def test_failed_continuation_marks_partial_but_a_retry_heals_it(recorder):
    p1 = SYSTEM + [1]
    first = recorder.call("healed", p1, [11, 2], conversation("t", 0))
    recorder.fail("healed", conversation("t", 1))  # the second call failed once…
    retry = recorder.call("healed", p1 + [11, 2, 5], [12, 2], conversation("t", 1))  # …and was retried
    recorder.call("cut", p1, [11, 2], conversation("t", 0))
    failed = recorder.fail("cut", conversation("t", 1))  # nothing came after this failure
    recorder.fail("cut", None, status="interrupted")  # unparsed: counted, belongs to no trajectory
    rows = recorder.rows()
    healed, cut = prefix_merge(rows)
    assert not healed.partial and [t.row_id for t in healed.turns] == [first, retry]
    assert cut.partial and cut.failed_row_ids == [failed]
    assert summary(rows, [healed, cut])["failed"] == 3


def test_missing_logprobs_are_none_on_exactly_that_span(recorder):
    """One call among normal ones came back without logprobs (NULL in the store): its sampled span
    holds None, never 0.0; the other turns keep theirs, the prompt positions stay 0.0."""
    p1 = SYSTEM + [1]
    recorder.call("s", p1, [11, 2], conversation("t", 0))
    recorder.call("s", p1 + [11, 2, 3], [12, 13, 2], conversation("t", 1), no_logprobs=True)
    recorder.call("s", p1 + [11, 2, 3, 12, 13, 2, 4], [14, 2], conversation("t", 2))
    recorder.call("ok", p1, [11, 2], conversation("t", 0))
    rows = recorder.rows()
    assert [r["completion_logprobs"] is None for r in rows] == [False, True, False, False]
    traj, fine = prefix_merge(rows)
    assert [t.has_logprobs for t in traj.turns] == [True, False, True] and not traj.has_logprobs
    assert traj.turns_without_logprobs == 1 and fine.has_logprobs and fine.turns_without_logprobs == 0
    missing = traj.turns[1]
    assert [i for i, lp in enumerate(traj.logprobs) if lp is None] == list(range(missing.completion_start,
                                                                                 missing.completion_end))
    assert traj.loss_mask[missing.completion_start:missing.completion_end] == [1, 1, 1]
    _assert_aligned(traj, {r["id"]: r for r in rows})
    assert traj.sampled_logprobs() == rows[0]["completion_logprobs"] + rows[2]["completion_logprobs"]
    assert summary(rows, [traj, fine])["turns_without_logprobs"] == 1
    (lone,) = [t for t in per_request(rows) if not t.has_logprobs]
    assert lone.turns[0].row_id == rows[1]["id"] and lone.logprobs[-3:] == [None] * 3


def test_a_partial_logprob_list_counts_as_missing(recorder):
    recorder.call("s", SYSTEM, [11, 2], conversation("t", 0), logprobs=[])
    (traj,) = prefix_merge(recorder.rows())
    assert not traj.turns[0].has_logprobs and traj.logprobs[-2:] == [None, None] and traj.loss_mask[-2:] == [1, 1]


def test_policy_version_when_turns_agree(recorder):
    p1 = SYSTEM + [1]
    recorder.call("s", p1, [11, 2], conversation("t", 0), policy=7)
    recorder.call("s", p1 + [11, 2, 3], [12, 2], conversation("t", 1), policy=7)
    recorder.call("other", p1, [11, 2], conversation("t", 0), policy=7)
    recorder.call("other", p1 + [11, 2, 3], [12, 2], conversation("t", 1), policy=8)
    same, mixed = prefix_merge(recorder.rows())
    assert same.policy_version == 7
    assert mixed.policy_version is None and [t.policy_version for t in mixed.turns] == [7, 8]


def test_sessions_never_mix(recorder):
    _linear(recorder, "a", turns=2)
    _linear(recorder, "b", turns=2)  # identical tokens, another session
    trajs = prefix_merge(recorder.rows())
    assert [(t.session_id, len(t.turns)) for t in trajs] == [("a", 2), ("b", 2)]


@settings(max_examples=40, deadline=None)
@given(st.data())
def test_any_session_places_every_sample_once_with_exact_spans(data):
    """Random trees of calls over a tiny vocabulary (so prefixes collide by accident too)."""
    tokens = st.lists(st.integers(0, 3), max_size=5)
    rows: list[dict] = []
    for row_id in range(1, data.draw(st.integers(1, 12)) + 1):
        prompt = data.draw(tokens)
        if rows and data.draw(st.booleans()):  # continue (or break) some earlier call
            base = data.draw(st.sampled_from(rows))
            seq = base["prompt_ids"] + base["completion_ids"]
            prompt = seq[: data.draw(st.integers(0, len(seq)))] + prompt
        completion = data.draw(tokens)
        rows.append({"id": row_id, "call_id": f"c{row_id}", "session_id": "s", "status": "ok",
                     "prompt_len": len(prompt), "prompt_ids": prompt, "completion_ids": completion,
                     "completion_logprobs": [-1.0 - i for i in range(len(completion))], "canonical": None})
    trajectories = prefix_merge(rows, min_shared=2)
    _assert_every_sample_once(rows, trajectories)
    by_id, by_traj = {r["id"]: r for r in rows}, {t.id: t for t in trajectories}
    for traj in trajectories:
        _assert_aligned(traj, by_id)
        if traj.lineage is not None:
            at = traj.lineage.fork_position
            assert traj.token_ids[:at] == by_traj[traj.lineage.parent_id].token_ids[:at] and not any(traj.loss_mask[:at])
    assert sum(t.trainable_tokens for t in trajectories) == sum(len(r["completion_ids"]) for r in rows)
    (report,) = drift_report(rows, trajectories=trajectories)
    assert report.reappeared_tokens <= report.carried_tokens <= report.sampled_tokens
    assert len(report.breaks) == sum(t.broken_prefix for t in trajectories)


# -- a real session: the official openai SDK → polar → the scripted vLLM double ------------------

def test_real_openai_tool_session_is_one_trajectory(stack):
    rows = run_openai_session(stack, f"traj-{uuid.uuid4().hex[:8]}")
    assert len(rows) == len(STEPS) and all(r["status"] == "ok" for r in rows)
    (traj,) = prefix_merge(rows)
    assert [t.row_id for t in traj.turns] == [r["id"] for r in rows]
    assert traj.sampled_ids() == [t for r in rows for t in r["completion_ids"]]
    _assert_aligned(traj, {r["id"]: r for r in rows})
    assert traj.token_ids == rows[-1]["prompt_ids"] + rows[-1]["completion_ids"]
    assert traj.metadata == {"provider": "openai_chat", "model": "gpt-5"}
    assert len(per_request(rows)) == len(STEPS)


@pytest.mark.parametrize("turns", [1, 3])
def test_per_request_and_prefix_merge_agree_on_samples(recorder, turns):
    _linear(recorder, turns=turns)
    rows = recorder.rows()
    merged, single = prefix_merge(rows), per_request(rows)
    assert sum(t.trainable_tokens for t in merged) == sum(t.trainable_tokens for t in single)
    assert sorted(x for t in merged for x in t.sampled_ids()) == sorted(x for t in single for x in t.sampled_ids())
