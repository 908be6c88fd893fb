"""`polar verify` on what the real vLLM sampled: faithful captures pass, altered ones are flagged where altered.

Token-faithful multi-turn sessions go through polar in front of vLLM (bf16, CPU) on a real chat template:
two greedy sessions through official SDKs (Anthropic streamed with thinking, OpenAI Chat without) and one
sampled at temperature 1. `polar verify` (the CLI, its worker under the vLLM venv's Python: fp32 recompute)
must pass every trajectory with the default tolerance. Then, on copies of the capture DB:
- sampled ids altered: that trajectory fails. Altered at the end of a turn (template glue follows), the spikes
  are exactly the altered positions; altered inside a turn, the ids after it were sampled in another context
  and may spike too (on this model: the next id, now and then a later one), never an id before it;
- one turn re-tokenized from its decoded text (what a text-based pipeline trains on), keeping the captured
  logprobs position by position: that trajectory fails, the first spike where the ids first differ.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.support.captures import rewrite_completion
from tests.support.real_vllm import REPO, template_subset, vllm_python

pytestmark = pytest.mark.vllm

GREEDY_TURNS = [("Hello! What can you do in this repository?", 40), ("Read the README and tell me about it.", 64),
                ("Shorter, please.", 8), ("Continue.", 48)]
SAMPLED_TURNS = ["Write a haiku about tokens.", "Another one, about logprobs.", "Now one about trainers."]


@pytest.fixture(scope="module")
def polar(template_vllm, start_polar):
    return start_polar(template_vllm.url, "token-faithful", template=template_vllm.template)


def sampled_session(url: str, session: str) -> None:
    """Temperature 1: sampled tokens below the top of the distribution, where bf16 rounding shows most."""
    import openai

    client = openai.OpenAI(base_url=f"{url}/v1", api_key="sk-test", max_retries=0,
                           default_headers={"x-polar-session": session})
    messages: list[dict] = []
    for n, text in enumerate(SAMPLED_TURNS):
        messages.append({"role": "user", "content": text})
        done = client.chat.completions.create(model="gpt-5", messages=messages, max_tokens=96, temperature=1.0,
                                              seed=n, extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        messages.append(done.choices[0].message.model_dump(exclude_none=True))


@pytest.fixture(scope="module")
def recorded(template_vllm, polar, converse) -> dict[str, str]:
    tag = f"{template_vllm.name}-{uuid.uuid4().hex[:6]}"
    sessions = {"anthropic": f"verify-a-{tag}", "chat": f"verify-c-{tag}", "sampled": f"verify-s-{tag}"}
    converse("anthropic", polar.url, sessions["anthropic"], GREEDY_TURNS, stream=True, thinking=True)
    converse("openai_chat", polar.url, sessions["chat"], GREEDY_TURNS, stream=False, thinking=False)
    sampled_session(polar.url, sessions["sampled"])
    for session in sessions.values():
        rows = polar.rows(session)
        assert rows and all(r["status"] == "ok" and r["completion_logprobs"] for r in rows), session
    return sessions


def polar_verify(db: Path, model_dir: Path, *extra: str) -> tuple[int, list[dict], str]:
    """The CLI in a subprocess (as a user runs it): exit status, its JSON lines, its summary (stderr)."""
    env = os.environ | {"PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "polar.cli", "verify", "--db", str(db), "--model", str(model_dir),
                           "--python", str(vllm_python()), "--json", *extra],
                          capture_output=True, text=True, env=env, timeout=600, check=False)
    assert done.returncode in (0, 1), done.stderr
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()], done.stderr


def copy_db(db: Path, dest: Path) -> Path:
    """A consistent copy while polar may still write (SQLite's backup, not a file copy of a WAL database)."""
    src, dst = sqlite3.connect(f"file:{db}?mode=ro", uri=True), sqlite3.connect(dest)
    with dst:
        src.backup(dst)
    src.close()
    dst.close()
    return dest


def by_session(lines: list[dict]) -> dict[str, dict]:
    assert len({x["session"] for x in lines}) == len(lines)  # each of these sessions is one trajectory
    return {x["session"]: x for x in lines}


@template_subset(lambda p: False)  # the real templates other than qwen3.5-4b: not collected (a cold start each)
def test_faithful_sessions_verify_within_tolerance(template_vllm, polar, recorded, model_dir):
    code, lines, summary = polar_verify(polar.db, model_dir)
    print(f"\n{template_vllm.name}: {summary.strip()}")
    mine = {s: x for s, x in by_session(lines).items() if s in recorded.values()}
    assert set(mine) == set(recorded.values())
    for session, line in mine.items():
        rows = polar.rows(session)
        assert line["ok"] and line["status"] == "ok" and line["spikes"] == 0, line
        assert line["tokens"] == sum(r["completion_len"] for r in rows) and line["missing"] == 0
        assert line["turns"] == len(rows)
        assert 0 <= line["mean_abs_diff"] <= line["max_abs_diff"] <= line["tolerance"]
    assert code == 0, summary


def alter(db: Path, row_id: int, at: list[int]) -> list[int]:
    """Replace the sampled ids at these indices of a row's completion with other ordinary tokens (later calls'
    prompts extend this row, so they see the altered ids too, as a trainer given these tokens would)."""
    def shifted(ids, logprobs):
        ids[at] = (ids[at] + 1000) % 240_000
        return ids, logprobs

    ids = rewrite_completion(db, row_id, shifted)
    return [ids[i] for i in at]


@template_subset(lambda p: False)
def test_altered_sampled_ids_are_flagged_where_altered(polar, recorded, model_dir, tmp_path):
    copy = copy_db(polar.db, tmp_path / "altered.db")
    # The last sampled id of each of the first two turns: what follows it is template glue, not sampled.
    ends = polar.rows(recorded["anthropic"])[:2]
    exact = [r["prompt_len"] + r["completion_len"] - 1 for r in ends]
    new_ids = [alter(copy, r["id"], [r["completion_len"] - 1])[0] for r in ends]
    # Two ids inside a turn: every id after an altered one was sampled in another context, so some may show
    # a spike of their own (on this model: the next id, and now and then one in a later turn).
    inner = polar.rows(recorded["chat"])[1]
    assert inner["completion_len"] >= 8
    at = [1, inner["completion_len"] // 2]
    alter(copy, inner["id"], at)

    code, lines, summary = polar_verify(copy, model_dir)
    assert code == 1, summary
    lines = by_session(lines)
    print(f"\naltered: {summary.strip()}")
    bad = lines[recorded["anthropic"]]
    assert not bad["ok"] and bad["status"] == "mismatch"
    assert bad["spike_positions"] == exact, bad["spike_details"]  # exactly the altered positions
    assert [d["token_id"] for d in bad["spike_details"]] == new_ids
    assert all(abs(d["diff"]) > 3 * bad["tolerance"] for d in bad["spike_details"] if d["diff"] is not None)

    inside = lines[recorded["chat"]]
    altered = [inner["prompt_len"] + i for i in at]
    assert not inside["ok"] and set(altered) <= set(inside["spike_positions"])
    assert inside["spike_positions"][0] == altered[0]  # nothing before the first altered id
    print(f"altered inside a turn at {altered}: spikes at {inside['spike_positions']}")
    assert lines[recorded["sampled"]]["ok"]


@template_subset(lambda p: False)
def test_a_turn_retokenized_from_its_text_is_flagged(polar, recorded, model_dir, tmp_path):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    copy = copy_db(polar.db, tmp_path / "retokenized.db")
    # The last turn of a session (no later call extends it, so its ids can change alone) whose text does not
    # encode back to the ids sampled: most of the tiny model's noise does not.
    for session in (recorded["sampled"], recorded["chat"], recorded["anthropic"]):
        last = polar.rows(session)[-1]
        old = last["completion_ids"]
        new = tokenizer.encode(tokenizer.decode(old), add_special_tokens=False)[: len(old)]
        first = next((i for i, (a, b) in enumerate(zip(old, new)) if a != b), None)
        if first is not None:
            break
    else:
        pytest.fail("every session's last turn re-tokenizes to its own ids: nothing to show")
    # the captured logprobs, paired by position with the new ids
    rewrite_completion(copy, last["id"], lambda ids, logprobs: (new, logprobs[: len(new)]))
    code, lines, summary = polar_verify(copy, model_dir)
    assert code == 1, summary
    lines = by_session(lines)
    bad = lines[session]
    assert not bad["ok"] and bad["spike_positions"], bad
    assert bad["spike_positions"][0] == last["prompt_len"] + first  # nothing before the first changed id
    print(f"\nre-tokenized from position {last['prompt_len'] + first}: {bad['spikes']} spikes of {bad['tokens']} "
          f"tokens, max |Δ| {bad['max_abs_diff']:.3g}")
    assert all(lines[s]["ok"] for s in recorded.values() if s != session)
