"""The drift report: reappearing sampled tokens, and where and why a prefix broke."""

from __future__ import annotations

import io
import json
import uuid

import pytest
from rich.console import Console

from polar.trajectories import drift_report, per_request, prefix_merge
from polar.trajectories.drift import print_drift
from tests.trajectories.crafted import conversation, run_openai_session

SYSTEM = list(range(100, 140))


def test_token_faithful_session_carries_every_sample(recorder):
    prompt = SYSTEM + [1]
    for k in range(4):
        completion = [10 + k, 11 + k, 2]
        recorder.call("s", prompt, completion, conversation("t", k))
        prompt = prompt + completion + [5]
    (report,) = drift_report(recorder.rows())
    assert (report.calls, report.samples, report.trajectories, report.sampled_tokens) == (4, 4, 1, 12)
    # the last answer is never fed back, so 3 of 4 calls are carried
    assert (report.carried_tokens, report.reappeared_tokens, report.reappeared_fraction) == (9, 9, 1.0)
    assert report.breaks == []


def test_break_names_calls_position_region_and_mode(recorder):
    p1 = SYSTEM + [1, 2]
    r1 = recorder.call("s", p1, [11, 12, 13, 2], conversation("t", 0), mode="chat-template")
    p2 = p1 + [11, 99, 13, 2, 5]  # the sample came back re-tokenized
    r2 = recorder.call("s", p2, [21, 2], conversation("t", 1), mode="chat-template")
    recorder.call("s", p2 + [21, 2, 6], [31, 2], conversation("t", 2), mode="chat-template")
    (report,) = drift_report(recorder.rows(), window=3)
    (brk,) = report.breaks
    assert (brk.row_id, brk.earlier_row_id, brk.call_id, brk.earlier_call_id) == (r2, r1, f"c{r2:04d}", f"c{r1:04d}")
    assert (brk.position, brk.region, brk.region_row_id) == (len(p1) + 1, "sampled", r1)
    assert (brk.expected_ids, brk.actual_ids) == ([12, 13, 2], [99, 13, 2])
    assert brk.prompt_mode == "chat-template" and brk.evidence == "conversation"
    assert brk.before_text is None  # no tokenizer given
    # r1's 4 sampled tokens: only the first came back; r2's 2 came back whole
    assert (report.carried_tokens, report.reappeared_tokens, report.reappeared_fraction) == (6, 3, 0.5)
    assert report.trajectories == 2


def test_dropped_history_breaks_at_the_end_of_the_prompt(recorder):
    p1 = SYSTEM + [1, 2, 3]
    r1 = recorder.call("s", p1, [11, 2], conversation("t", 0))
    r2 = recorder.call("s", SYSTEM + [1], [21, 2], conversation("t", 1))  # the harness cut history
    (report,) = drift_report(recorder.rows())
    (brk,) = report.breaks
    assert (brk.row_id, brk.earlier_row_id, brk.position) == (r2, r1, len(SYSTEM) + 1)
    assert brk.region == "end-of-prompt" and brk.actual_ids == [] and brk.expected_ids[:2] == [2, 3]


def test_break_inside_an_inherited_prefix_points_at_the_parent_call(recorder):
    p1 = SYSTEM + [1]
    r1 = recorder.call("s", p1, [11, 2], conversation("t", 0))
    recorder.call("s", p1 + [11, 2, 5], [12, 2], conversation("t", 1))
    fork = recorder.call("s", p1 + [11, 2, 6], [13, 2], conversation("t", 1))  # branches after r1
    recorder.call("s", p1 + [11, 77, 6, 13, 2, 7], [14, 2], conversation("t", 2))  # re-rendered r1's sample
    (report,) = drift_report(recorder.rows())
    (brk,) = report.breaks
    assert brk.earlier_row_id == fork and brk.region == "sampled" and brk.region_row_id == r1


def test_fork_that_breaks_is_reported(recorder):
    p1 = SYSTEM + [1]
    recorder.call("s", p1, [11, 2], conversation("t", 0))
    r2 = recorder.call("s", p1 + [11, 2, 5], [50, 12, 2], conversation("t", 1))
    r3 = recorder.call("s", p1 + [11, 2, 5, 12, 2, 6], [13, 2], conversation("t", 2))
    (report,) = drift_report(recorder.rows())
    (brk,) = report.breaks
    assert (brk.row_id, brk.earlier_row_id, brk.region, brk.region_row_id) == (r3, r2, "sampled", r2)
    # r1's sample came back whole (r2 joined it, r3 kept it); r2's came back not at all
    assert (report.carried_tokens, report.reappeared_tokens) == (5, 2)


def test_failed_and_unsampled_calls_are_counted(recorder):
    recorder.call("s", SYSTEM, [11, 2], conversation("t", 0))
    recorder.count_tokens("s")
    recorder.fail("s", conversation("t", 1))
    recorder.fail("s", None, status="interrupted")
    recorder.fail("other", None)
    reports = {r.session_id: r for r in drift_report(recorder.rows())}
    assert (reports["s"].calls, reports["s"].samples, reports["s"].not_ok) == (4, 1, {"error": 1, "interrupted": 1})
    assert (reports["other"].calls, reports["other"].samples, reports["other"].trajectories) == (1, 0, 0)


def test_report_reuses_prefix_merge_trajectories_only(recorder):
    recorder.call("s", SYSTEM, [11, 2], conversation("t", 0))
    rows = recorder.rows()
    assert drift_report(rows, trajectories=prefix_merge(rows))[0].samples == 1
    with pytest.raises(ValueError, match="prefix-merge"):
        drift_report(rows, trajectories=per_request(rows))


def test_real_template_rerender_drift_is_decoded(recorder, tokenizer_dir):
    """Qwen3.5 behaviour (preserve_thinking off): a user message makes the template drop earlier reasoning."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    end = tok.convert_tokens_to_ids("<|im_end|>")

    def render(messages):
        text = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False, preserve_thinking=False)
        return tok.encode(text, add_special_tokens=False)

    def canonical(messages):
        return [{"role": m["role"], "content": [{"text": m["content"]}]} for m in messages]

    messages = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi — ça va?"}]
    answers = [("The user greets me.", "Bonjour ✓"), ("Again.", "Still here.")]
    rows = []
    for reasoning, content in answers:
        prompt = render(messages)
        completion = tok.encode(f"{reasoning}\n</think>\n\n{content}", add_special_tokens=False) + [end]
        rows.append(recorder.call("s", prompt, completion, canonical(messages), mode="chat-template"))
        messages += [{"role": "assistant", "content": content, "reasoning_content": reasoning},
                     {"role": "user", "content": "And now?"}]
    (report,) = drift_report(recorder.rows(), tokenizer=tok, window=4)
    (brk,) = report.breaks
    assert (brk.row_id, brk.earlier_row_id, brk.region, brk.region_row_id) == (rows[1], rows[0], "context", rows[0])
    assert brk.expected_text.startswith("<think>") and brk.actual_text.startswith("Bonjour")
    assert brk.before_text.endswith("<|im_start|>assistant\n")
    assert report.reappeared_tokens == 0 and report.carried_tokens > 0

    console = Console(file=io.StringIO(), width=200)
    print_drift([report], console)
    shown = console.file.getvalue()
    assert "prefix breaks" in shown and "context of row" in shown and "chat-template" in shown
    dumped = json.loads(json.dumps(report.to_json()))
    assert dumped["reappeared_fraction"] == 0.0 and dumped["breaks"][0]["position"] == brk.position


def test_real_openai_session_has_no_drift(stack):
    rows = run_openai_session(stack, f"drift-{uuid.uuid4().hex[:8]}")
    (report,) = drift_report(rows, tokenizer=stack.double.tokenizer)
    assert report.breaks == [] and report.trajectories == 1
    assert report.reappeared_fraction == 1.0 and report.carried_tokens == report.sampled_tokens - len(rows[-1]["completion_ids"])
